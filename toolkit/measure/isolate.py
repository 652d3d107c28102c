"""`run(scenario, isolate=True)`: the step in a subprocess, so a segfault, abort or hang comes back as a `crashed` / `timeout` Report."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable

from .environment import environment
from .report import ErrorInfo, Report, ScenarioRecord, Timing
from .scenario import Scenario


def run_isolated(scenario: Scenario, timeout_s: float | None, on_stage: Callable[[str], None] | None = None,
                 threads: int | None = None) -> Report:
    record = ScenarioRecord.of(scenario)
    with tempfile.TemporaryDirectory(prefix="toolkit-run-") as tmp:
        spec, out, stage_file = (os.path.join(tmp, n) for n in ("scenario.json", "report.json", "stage"))
        with open(spec, "w") as f:
            f.write(scenario.to_json())
        cmd = [sys.executable, "-m", "toolkit.measure.worker", spec, out, stage_file]
        t0 = time.perf_counter()
        env = dict(os.environ)
        if threads:
            env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), TOOLKIT_THREADS=str(threads),
                       TORCHINDUCTOR_COMPILE_THREADS=str(threads))
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True, env=env)
        try:
            _, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return Report(outcome="timeout", scenario=record, environment=environment(),
                          error=ErrorInfo("Timeout", f"no result after {timeout_s:g} s", _read(stage_file)),
                          timing=Timing(first_step_s=round(time.perf_counter() - t0, 2)))
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the caller was interrupted: the worker goes with it
            proc.communicate()
            raise
        if proc.returncode == 0 and os.path.exists(out):
            with open(out) as f:
                return Report.from_json(f.read())
        rc = proc.returncode
        why = f"killed by {signal.Signals(-rc).name} ({rc})" if rc < 0 else f"exited with status {rc}"
        tail = (stderr or b"").decode(errors="replace").strip().splitlines()[-5:]
        return Report(outcome="crashed", scenario=record, environment=environment(),
                      error=ErrorInfo("Crash", why + ("; stderr: " + " | ".join(tail) if tail else ""), _read(stage_file)))


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip() or "build"
    except OSError:
        return "build"
