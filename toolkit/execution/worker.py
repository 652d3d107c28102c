"""Subprocess side of `run(isolate=True)`: read a Scenario, measure it, send its Report back.

Subprocess side of `run(isolate=True)`: read a Scenario, measure it, send its Report back; a crash here cannot reach the
caller.

The channel (`channel.py`) is a pipe or socket — no files, so nothing is left on disk if either side is killed —
carrying `stage NAME` lines as the step goes, then `report JSON`. The process dies with its parent.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import IO

from . import channel


def measure(scenario_json: str, chan: IO[str]) -> None:
    """Run one Scenario (already in the isolated process) and write its stage lines and Report to `chan`."""
    from ..measurement.scenario import Scenario
    from .local import run_here

    # Fault injection for tests of the isolation itself: TOOLKIT_WORKER_FAULT=abort|segv|hang[@stage].
    fault, _, fault_stage = os.environ.get("TOOLKIT_WORKER_FAULT", "").partition("@")

    def on_stage(name: str) -> None:
        channel.send_stage(chan, name)
        if fault and name == (fault_stage or "forward"):
            if fault == "abort":
                os.abort()
            if fault == "segv":
                os.kill(os.getpid(), signal.SIGSEGV)
            if fault == "hang":
                time.sleep(3600)

    channel.apply_threads()
    report = run_here(Scenario.from_json(scenario_json), on_stage=on_stage)
    channel.send_report(chan, report.to_json())


def main() -> int:
    channel.die_with_parent()
    # stdout is the channel; anything torch or a library prints goes to /dev/null instead of into it.
    chan = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    measure(sys.stdin.read(), chan)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
