"""The parent/child channel of an isolated run: its parent, its threads, and the lines it sends back.

The parent/child channel of an isolated run, in one place: who the parent is, the threads a child may use, and the lines
a child sends back (`stage NAME` as the step goes, then `report JSON`).

Used by both ways of isolating a run — a fresh Python per run (`isolate`, `worker`) and a child forked from the warm
server (`forkserver`) — so the two cannot drift apart. Nothing here imports torch.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from typing import IO, Callable

PARENT_ENV = "TOOLKIT_PARENT_PID"
"""The pid a child must stay the child of (it exits when that process is gone)."""
THREADS_ENV = "TOOLKIT_THREADS"
"""The intra-op threads a child sets before it runs (several isolated runs side by side share the cores)."""


def thread_env(threads: int | None) -> dict[str, str]:
    """The variables that cap a child's threads: OpenMP and MKL pools, torch's intra-op threads, Inductor's
    compile workers. Empty when `threads` is None (the child takes what it finds)."""
    if not threads:
        return {}
    n = str(threads)
    return {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, THREADS_ENV: n, "TORCHINDUCTOR_COMPILE_THREADS": n}


def child_env(base: dict[str, str], threads: int | None) -> dict[str, str]:
    """`base` (the caller's environment, or the toolkit's variables of it) for one child: the thread cap asked for
    now replaces any the caller had, and the child knows its parent (this process)."""
    env = {k: v for k, v in base.items() if k not in (PARENT_ENV, THREADS_ENV)}
    env.update(thread_env(threads))
    env[PARENT_ENV] = str(os.getpid())
    return env


def apply_threads() -> None:
    """In the child: take the intra-op thread cap the parent set, if any."""
    if os.environ.get(THREADS_ENV):
        import torch

        torch.set_num_threads(int(os.environ[THREADS_ENV]))


def die_with_parent(parent: int | None = None) -> None:
    """Be killed when the parent dies, even by `kill -9`: PR_SET_PDEATHSIG on Linux, a watchdog thread elsewhere.
    `parent` is the pid this process must still be the child of (a parent gone before the call means exit now);
    by default the one in PARENT_ENV."""
    parent = parent if parent is not None else int(os.environ.get(PARENT_ENV, "0") or 0)
    if not parent:
        return
    if sys.platform.startswith("linux"):
        # The signal is sent when the parent *thread* that forked us exits: callers spawn from long-lived threads.
        _death_signal(signal.SIGKILL)
    else:

        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(0.5)
            os._exit(1)

        threading.Thread(target=watch, daemon=True, name="toolkit-lifeline").start()
    if os.getppid() != parent:
        os._exit(1)


def ends_with_this_process(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A `preexec_fn` for a program this process starts and does not control (JupyterLab): it gets `sig` when this
    process dies, `kill -9` included (PR_SET_PDEATHSIG, set in the child before it runs the program), and does not
    start at all when this process is already gone. SIGTERM by default, so that a server shuts down what it started
    (its kernels). On other systems: nothing (the program outlives a killed parent there)."""
    parent = os.getpid()

    def preexec() -> None:
        if sys.platform.startswith("linux"):
            _death_signal(sig)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def _death_signal(sig: int) -> None:
    """Linux: this process gets `sig` when its parent dies (PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, sig)  # 1 = PR_SET_PDEATHSIG


def watch_parent(parent: int) -> None:
    """Exit at once (within half a second) when this process stops being `parent`'s child, whatever killed the
    parent (kill -9 included) and whichever thread of it started this process: a watchdog thread, for children of a
    launcher this process does not control (torchrun's ranks)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    if os.getppid() != parent:
        os._exit(1)
    threading.Thread(target=watch, daemon=True, name="toolkit-lifeline").start()


def send_stage(chan: IO[str], name: str) -> None:
    chan.write(f"stage {name}\n")
    chan.flush()


def send_report(chan: IO[str], report_json: str) -> None:
    """The last line: the Report as one line of JSON (a reader never takes a line without its newline)."""
    chan.write("report " + report_json.replace("\n", " ") + "\n")
    chan.flush()


def read(out: bytes) -> tuple[list[str], str | None]:
    """`(stages, report JSON or None)` from what a child sent. A torn last line (the child killed mid-write) has no
    newline and is not a report."""
    stages, report = [], None
    for line in (out or b"").decode(errors="replace").split("\n"):
        if line.startswith("stage "):
            stages.append(line[6:].strip())
        elif line.startswith("report "):
            report = line[7:]
    if report is not None and not (out or b"").endswith(b"\n"):
        report = None
    return stages, report


__all__ = [
    "PARENT_ENV",
    "THREADS_ENV",
    "thread_env",
    "child_env",
    "apply_threads",
    "die_with_parent",
    "send_stage",
    "send_report",
    "read",
]
