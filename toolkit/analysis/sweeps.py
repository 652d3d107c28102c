"""Sweeping the matrix: every cell isolated (a subprocess with a timeout), results appended to `results.jsonl` as each cell finishes, re-runs resume."""

from __future__ import annotations

import concurrent.futures as futures
import json
import os
import pathlib
import sys
import threading
import time
from typing import Any, Callable, Iterable

import torch

from ..measure import Report, run
from ..measure import environment as run_environment
from .classification import EXPLAIN, classify
from .matrix import Cell, MatrixResult, Row, cell_key, full_cells, quick_cells, valid

def load_results(path: str | os.PathLike) -> dict[str, tuple[Cell, Report]]:
    """Finished cells from a results.jsonl (a torn last line, e.g. after `kill -9`, is ignored)."""
    done: dict[str, tuple[Cell, Report]] = {}
    p = pathlib.Path(path)
    if not p.exists():
        return done
    for line in p.read_text().splitlines():
        try:
            rec = json.loads(line)
            done[rec["key"]] = (Cell(**rec["cell"]), Report.from_dict(rec["report"]))
        except (ValueError, KeyError, TypeError):
            continue
    return done


class Progress:
    """Cells done / running / failed and time left, on one updating stderr line (a line per cell off a tty)."""

    def __init__(self, total: int, workers: int, enabled: bool = True, stream=None):
        self.total, self.workers, self.enabled = total, max(1, workers), enabled
        self.stream = stream or sys.stderr
        self.done = self.running = self.failed = 0
        self.t0 = time.perf_counter()
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.lock = threading.Lock()

    def start(self) -> None:
        with self.lock:
            self.running += 1
            self._render()

    def finish(self, cell: Cell, label: str, seconds: float) -> None:
        with self.lock:
            self.running -= 1
            self.done += 1
            self.failed += label in ("crashed", "timeout", "error")
            self._render(f"{label:8} {cell.label} ({seconds:.1f} s)")

    def _render(self, last: str = "") -> None:
        if not self.enabled or not self.total:
            return
        elapsed = time.perf_counter() - self.t0
        left = (elapsed / self.done) * (self.total - self.done) if self.done else 0.0
        width = 24
        filled = int(width * self.done / self.total)
        bar = "#" * filled + "." * (width - filled)
        line = (f"[{bar}] {self.done}/{self.total} done, {self.running} running, {self.failed} failed, "
                f"~{int(left // 60)}m{int(left % 60):02d}s left")
        if self.tty:
            self.stream.write("\r" + line[:150].ljust(150))
            if self.done == self.total:
                self.stream.write("\n")
        elif last:
            self.stream.write(f"{line} | {last}\n")
        self.stream.flush()


def environment() -> dict[str, Any]:
    """The runner's environment plus the device the cells run on (part of every cell's cache key)."""
    return {**run_environment(), "device": "cuda" if torch.cuda.is_available() else "cpu"}


def sweep(cells: Iterable[Cell] | None = None, *, out: str | os.PathLike | None = None, quick: bool = True,
          backends: Iterable[str] = ("aot_eager",), workers: int = 1, timeout_s: float | None = 600,
          progress: bool = True, runner: Callable[..., Report] | None = None) -> MatrixResult:
    """Measure every cell (isolated), appending each result to `out/results.jsonl` as it finishes; cells already
    there (same scenario, torch version and device) are not run again. Writes matrix.json/.md/.html to `out`."""
    backends = tuple(backends)
    cells = list(cells) if cells is not None else (quick_cells(backends) if quick else full_cells(backends))
    runnable = [c for c in cells if valid(c) is None]
    device = environment()["device"]
    keys = {c: cell_key(c.scenario(), device) for c in runnable}
    results_path = pathlib.Path(out) / "results.jsonl" if out is not None else None
    if results_path is not None:
        results_path.parent.mkdir(parents=True, exist_ok=True)
    done = load_results(results_path) if results_path is not None else {}
    pending = [c for c in runnable if keys[c] not in done]
    bar = Progress(len(runnable), workers, enabled=progress)
    bar.done = len(runnable) - len(pending)
    write_lock = threading.Lock()
    threads = max(1, (os.cpu_count() or 1) // max(1, workers))
    run_cell = runner or (lambda scenario: run(scenario, isolate=True, timeout_s=timeout_s, threads=threads))

    def one(cell: Cell) -> None:
        bar.start()
        t = time.perf_counter()
        report = run_cell(cell.scenario())
        label = classify(report).label
        with write_lock:
            done[keys[cell]] = (cell, report)
            if results_path is not None:
                with open(results_path, "a") as f:
                    f.write(json.dumps({"key": keys[cell], "cell": cell.to_dict(), "report": report.to_dict()}) + "\n")
                    f.flush()
                    os.fsync(f.fileno())
        bar.finish(cell, label, time.perf_counter() - t)

    if pending:
        with futures.ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            for fut in futures.as_completed([pool.submit(one, c) for c in pending]):
                fut.result()
    result = MatrixResult([Row(keys[c], c, done[keys[c]][1]) for c in runnable], environment())
    if out is not None:
        result.write(out)
    return result


def main(argv: list[str] | None = None) -> int:
    import argparse

    from ..transforms.compile import BACKENDS

    parser = argparse.ArgumentParser(prog="python -m toolkit matrix", description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="the default sweep (about 40 cells, minutes on a laptop)")
    size.add_argument("--full", action="store_true", help="every combination (hundreds of cells)")
    parser.add_argument("--backend", action="append", choices=BACKENDS, help="repeat for several (default aot_eager)")
    parser.add_argument("--workers", type=int, default=max(1, min(2, os.cpu_count() or 1)))
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per cell")
    parser.add_argument("--out", default="matrix-out", help="folder for results.jsonl and matrix.json/.md/.html")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be >= 1")
    result = sweep(out=args.out, quick=not args.full, backends=args.backend or ["aot_eager"], workers=args.workers,
                   timeout_s=args.timeout_s, progress=not args.no_progress)
    print(result)
    for label, n in result.counts().items():
        print(f"  {label:20} {n:4d}  {EXPLAIN[label]}")
    print(f"wrote {args.out}/matrix.json, matrix.md, matrix.html (results in {args.out}/results.jsonl)")
    return 0
