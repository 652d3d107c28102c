"""`run_distributed(scenario, nproc=2)`: one scenario on N ranks under torchrun (gloo, 127.0.0.1).

`run_distributed(scenario, nproc=2)`: one scenario on N ranks under torchrun (gloo, 127.0.0.1 only), one Report per rank
merged into one view.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from .. import _files
from .._config import MAX_RANKS, check_int, check_seconds
from ..instrument.records import fmt_bytes, fmt_measured_bytes
from ..measurement.report import Report
from ..measurement.scenario import Scenario
from . import channel


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class DistributedReport:
    """One scenario measured on every rank (plain data; JSON round-trip; `str()` is the side-by-side twin)."""

    ranks: tuple[Report, ...]
    stderr_tail: str = ""
    """The launcher's last stderr lines when a rank failed."""

    @property
    def ok(self) -> bool:
        return bool(self.ranks) and all(r.ok for r in self.ranks)

    def to_dict(self) -> dict[str, Any]:
        return {"ranks": [r.to_dict() for r in self.ranks], "stderr_tail": self.stderr_tail}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_json(cls, text: str) -> "DistributedReport":
        data = _files.loads(text, "DistributedReport", "", name="the report")
        return cls(tuple(Report.from_dict(r) for r in data["ranks"]), data.get("stderr_tail", ""))

    def __str__(self) -> str:
        if not self.ranks:
            return f"no rank reported{': ' + self.stderr_tail if self.stderr_tail else ''}"
        first = self.ranks[0]
        lines = [
            f"{first.scenario.name}: {len(self.ranks)} ranks, "
            f"{'ok' if self.ok else ', '.join(sorted({r.outcome for r in self.ranks}))}",
            f"  {'rank':<6}{'outcome':>9}{'saved':>12}{'held':>12}{'peak':>12}{'graphs':>8}  collectives",
        ]
        for r in self.ranks:
            d = r.distributed
            calls = ", ".join(f"{k} x{v}" for k, v in d.collectives.items()) or "-"
            lines.append(
                f"  {d.rank:<6}{r.outcome:>9}{fmt_bytes(r.saved.total_bytes):>12}"
                f"{fmt_measured_bytes(r.memory.held_after_forward_bytes):>12}"
                f"{fmt_measured_bytes(r.memory.peak_bytes):>12}{r.compile.graphs:>8}  {calls}"
            )
            if r.error is not None:
                lines.append(f"        error at {r.error.stage}: {r.error.message.splitlines()[0][:160]}")
        return "\n".join(lines)


_PREFIX = "toolkit-ranks-"


def _kill(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


def remove_orphaned_folders(root: str | os.PathLike | None = None) -> None:
    """The rank folders (in `root`, the temporary folder by default) of runs whose process is gone: killed with -9,
    before it could remove its own."""
    for path in pathlib.Path(root or tempfile.gettempdir()).glob(f"{_PREFIX}*-*"):
        pid = path.name[len(_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: not ours to judge
    return True


def run_distributed(scenario: Scenario, *, nproc: int = 2, timeout_s: float = 900) -> DistributedReport:
    """Run `scenario` on `nproc` ranks of one machine under torchrun: gloo on 127.0.0.1 (`GLOO_SOCKET_IFNAME=lo`),
    each rank measuring its own step (FSDP2 shards across them), every Report collected. A rank that dies is
    reported with the launcher's stderr."""
    if not isinstance(scenario, Scenario):
        raise TypeError(f"run_distributed() needs a Scenario, got {type(scenario).__name__}")
    check_int("run_distributed", "nproc", nproc, 1, MAX_RANKS, "ranks on one machine")
    check_seconds("run_distributed", "timeout_s", timeout_s)
    remove_orphaned_folders()
    with tempfile.TemporaryDirectory(prefix=f"{_PREFIX}{os.getpid()}-") as tmp:
        spec = pathlib.Path(tmp, "scenario.json")
        _files.write_text(spec, scenario.to_json())
        cmd = [
            sys.executable,
            "-m",
            "toolkit.execution.rank_worker",
            "--launch",
            "--nproc_per_node",
            str(nproc),
            "--nnodes",
            "1",
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(_free_port()),
            "-m",
            "toolkit.execution.rank_worker",
            str(spec),
            tmp,
        ]
        env = {
            **os.environ,
            "GLOO_SOCKET_IFNAME": "lo",
            "MASTER_ADDR": "127.0.0.1",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc))),
            channel.PARENT_ENV: str(os.getpid()),
        }
        # Its own session, so that a timeout or an interrupt kills the launcher's whole group; its ranks (sessions
        # of their own) exit within half a second of it (`channel.watch_parent`), and it within half a second of
        # this process, however this process ends.
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        try:
            _, err = proc.communicate(timeout=timeout_s)
            tail = "" if proc.returncode == 0 else " | ".join(err.strip().splitlines()[-8:])
        except subprocess.TimeoutExpired:
            _kill(proc)
            tail = f"no result after {timeout_s:g} s"
        except BaseException:
            _kill(proc)  # interrupted: the launcher and its ranks go with it
            raise
        reports = []
        for rank in range(nproc):
            path = pathlib.Path(tmp, f"rank{rank}.json")
            if path.exists():
                text = _files.read_capped(path, "Report", "", _files.RECORD_CAP, name=path.name)
                reports.append(Report.from_json(text))
        return DistributedReport(tuple(reports), tail)
