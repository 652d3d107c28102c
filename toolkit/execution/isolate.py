"""`run(scenario, isolate=True)`: the step in a subprocess; a crash or hang comes back as a Report.

`run(scenario, isolate=True)`: the step in a subprocess, so a segfault, abort or hang comes back as a `crashed` /
`timeout` Report.

The subprocess gets its Scenario on stdin and sends its Report back on stdout (`worker.py`, over `channel.py`):
nothing is written to disk, so a `kill -9` of either side leaves no temp folder behind, and the worker dies with
its parent. `crashed_report`, `timeout_report` and `parse_result` also serve the warm pool's children.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Callable

from ..measurement.report import ErrorInfo, Report, ScenarioRecord, Timing
from ..measurement.scenario import Scenario
from . import channel
from .machine import environment

_live: set[subprocess.Popen] = set()
_live_lock = threading.Lock()


def kill_live() -> None:
    """Kill every isolated run still in flight (a sweep interrupted while cells run on other threads)."""
    with _live_lock:
        procs = list(_live)
    for proc in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def run_isolated(
    scenario: Scenario,
    timeout_s: float | None,
    on_stage: Callable[[str], None] | None = None,
    threads: int | None = None,
) -> Report:
    """A fresh Python per call (torch imported each time); `toolkit.execution.forkserver` is the warm variant."""
    cmd = [sys.executable, "-m", "toolkit.execution.worker"]
    t0 = time.perf_counter()
    # Its own session, so a timeout kills the worker's own children too (Inductor's compile workers); it still
    # dies with this process (PR_SET_PDEATHSIG, set by the worker), so it is never left running on its own.
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=channel.child_env(dict(os.environ), threads),
    )
    with _live_lock:
        _live.add(proc)
    try:
        out, err = proc.communicate(scenario.to_json().encode(), timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return timeout_report(scenario, timeout_s, out, time.perf_counter() - t0)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the caller was interrupted: the worker goes with it
        proc.communicate()
        raise
    finally:
        with _live_lock:
            _live.discard(proc)
    return parse_result(scenario, out, err, proc.returncode, on_stage)


def parse_result(
    scenario: Scenario, out: bytes, err: bytes, returncode: int, on_stage: Callable[[str], None] | None = None
) -> Report:
    """The Report a worker sent on its channel, or a `crashed` Report naming how it died."""
    stages, report = channel.read(out)
    if on_stage:
        for s in stages:
            on_stage(s)
    if returncode == 0 and report is not None:
        return Report.from_json(report)
    why = (
        f"killed by {signal.Signals(-returncode).name} ({returncode})"
        if returncode < 0
        else f"exited with status {returncode}" + ("" if returncode else " without sending a report")
    )
    tail = (err or b"").decode(errors="replace").strip().splitlines()[-5:]
    return crashed_report(
        scenario, why + ("; stderr: " + " | ".join(tail) if tail else ""), stages[-1] if stages else "build"
    )


def timeout_report(scenario: Scenario, timeout_s: float | None, out: bytes, seconds: float) -> Report:
    stages, _ = channel.read(out)
    return Report(
        outcome="timeout",
        scenario=ScenarioRecord.of(scenario),
        environment=environment(),
        error=ErrorInfo("Timeout", f"no result after {timeout_s:g} s", stages[-1] if stages else "build"),
        timing=Timing(first_step_s=round(seconds, 2)),
    )


def crashed_report(scenario: Scenario, why: str, stage: str = "build") -> Report:
    return Report(
        outcome="crashed",
        scenario=ScenarioRecord.of(scenario),
        environment=environment(),
        error=ErrorInfo("Crash", why, stage),
    )
