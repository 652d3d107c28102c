"""`run_distributed(scenario, nproc=2)`: one scenario on N ranks under torchrun (gloo, 127.0.0.1).

`run_distributed(scenario, nproc=2)`: one scenario on N ranks under torchrun (gloo, 127.0.0.1 only), one Report per rank
merged into one view.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from .._config import check_int, check_seconds
from .report import Report, fmt_bytes, fmt_measured_bytes
from .scenario import Scenario


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
        data = json.loads(text)
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


def run_distributed(scenario: Scenario, *, nproc: int = 2, timeout_s: float = 900) -> DistributedReport:
    """Run `scenario` on `nproc` ranks of one machine under torchrun: gloo on 127.0.0.1 (`GLOO_SOCKET_IFNAME=lo`),
    each rank measuring its own step (FSDP2 shards across them), every Report collected. A rank that dies is
    reported with the launcher's stderr."""
    if not isinstance(scenario, Scenario):
        raise TypeError(f"run_distributed() needs a Scenario, got {type(scenario).__name__}")
    check_int("run_distributed", "nproc", nproc, 1)
    check_seconds("run_distributed", "timeout_s", timeout_s)
    with tempfile.TemporaryDirectory(prefix="toolkit-ranks-") as tmp:
        spec = pathlib.Path(tmp, "scenario.json")
        spec.write_text(scenario.to_json())
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(nproc),
            "--nnodes",
            "1",
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(_free_port()),
            "-m",
            "toolkit.measurement.rank_worker",
            str(spec),
            tmp,
        ]
        env = {
            **os.environ,
            "GLOO_SOCKET_IFNAME": "lo",
            "MASTER_ADDR": "127.0.0.1",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc))),
        }
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
            tail = "" if done.returncode == 0 else " | ".join(done.stderr.strip().splitlines()[-8:])
        except subprocess.TimeoutExpired:
            tail = f"no result after {timeout_s:g} s"
        reports = []
        for rank in range(nproc):
            path = pathlib.Path(tmp, f"rank{rank}.json")
            if path.exists():
                reports.append(Report.from_json(path.read_text()))
        return DistributedReport(tuple(reports), tail)
