"""Subprocess side of `run(isolate=True)`: read a Scenario, measure it, send its Report back; a crash here cannot reach the caller.

The channel is a pipe or socket (no files: nothing is left on disk if either side is killed) carrying lines:
`stage NAME` as the step goes, then `report JSON`. The process dies with its parent (`die_with_parent`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from typing import IO

PARENT_ENV = "TOOLKIT_PARENT_PID"


def die_with_parent(parent: int | None = None) -> None:
    """Be killed when the parent dies, even by `kill -9`: PR_SET_PDEATHSIG on Linux, a watchdog thread elsewhere.
    `parent` is the pid this process must still be the child of (a parent gone before the call means exit now)."""
    parent = parent if parent is not None else int(os.environ.get(PARENT_ENV, "0") or 0)
    if not parent:
        return
    if sys.platform.startswith("linux"):
        # The signal is sent when the parent *thread* that forked us exits: callers spawn from long-lived threads.
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    else:
        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(0.5)
            os._exit(1)

        threading.Thread(target=watch, daemon=True, name="toolkit-lifeline").start()
    if os.getppid() != parent:
        os._exit(1)


def measure(scenario_json: str, chan: IO[str]) -> None:
    """Run one Scenario (already in the isolated process) and write its stage lines and Report to `chan`."""
    from .runner import run
    from .scenario import Scenario

    # Fault injection for tests of the isolation itself: TOOLKIT_WORKER_FAULT=abort|segv|hang[@stage].
    fault, _, fault_stage = os.environ.get("TOOLKIT_WORKER_FAULT", "").partition("@")

    def on_stage(name: str) -> None:
        chan.write(f"stage {name}\n")
        chan.flush()
        if fault and name == (fault_stage or "forward"):
            if fault == "abort":
                os.abort()
            if fault == "segv":
                os.kill(os.getpid(), signal.SIGSEGV)
            if fault == "hang":
                time.sleep(3600)

    if os.environ.get("TOOLKIT_THREADS"):
        import torch

        torch.set_num_threads(int(os.environ["TOOLKIT_THREADS"]))
    report = run(Scenario.from_json(scenario_json), on_stage=on_stage)
    chan.write("report " + report.to_json().replace("\n", " ") + "\n")
    chan.flush()


def main() -> int:
    die_with_parent()
    # stdout is the channel; anything torch or a library prints goes to /dev/null instead of into it.
    chan = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    measure(sys.stdin.read(), chan)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
