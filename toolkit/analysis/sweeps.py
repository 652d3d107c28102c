"""Sweeping the matrix: every cell isolated (a subprocess with a timeout, here or on a cluster), results appended to `results.jsonl` as each cell finishes, re-runs resume.

`results.jsonl` holds one record per line, `{"key", "cell", "report", "limit_s"}`, keyed by scenario, torch version
and device (`matrix.cell_key`); the last record of a key wins. A re-run skips cells already there, except
`crashed` ones and `timeout`s that ran under a shorter limit than this run's. One sweep writes into a folder at a
time (a lock); results from several folders or machines merge by key (`merge_results`, `--merge`).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import shutil
import socket
import sys
import time
from typing import Any, Callable, Iterable

import torch

from .._config import ConfigError
from ..measure import Report
from ..measure import environment as run_environment
from .classification import EXPLAIN, classify
from .executors import EXECUTORS, Executor, Job, make
from .matrix import Cell, MatrixResult, Row, cell_key, full_cells, quick_cells, torchtitan_cells, valid

RESULTS = "results.jsonl"
LOCK = ".sweep.lock"


# ------------------------------------------------------------------------------------------------ results.jsonl

def _records(path: pathlib.Path) -> dict[str, dict]:
    """key → the last valid record for it (a torn line, e.g. after `kill -9`, is skipped)."""
    out: dict[str, dict] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
            rec["_cell"], rec["_report"] = Cell(**rec["cell"]), Report.from_dict(rec["report"])
            out[rec["key"]] = rec
        except (ValueError, KeyError, TypeError):
            continue
    return out


def load_results(path: str | os.PathLike) -> dict[str, tuple[Cell, Report]]:
    """Finished cells from a results.jsonl, the last record of each key (a torn line is ignored)."""
    return {k: (r["_cell"], r["_report"]) for k, r in _records(pathlib.Path(path)).items()}


def repair_tail(path: str | os.PathLike) -> bool:
    """Make sure the next record starts on a line of its own: a torn last line (a crash mid-write) is cut off,
    a whole record missing only its newline gets one. True when something was changed."""
    p = pathlib.Path(path)
    if not p.exists():
        return False
    with open(p, "rb+") as f:
        data = f.read()
        if not data or data.endswith(b"\n"):
            return False
        cut = data.rfind(b"\n") + 1
        try:
            json.loads(data[cut:])
            f.write(b"\n")
        except ValueError:
            f.truncate(cut)  # that cell's record is lost; it runs again
        f.flush()
        os.fsync(f.fileno())
    return True


def _needs_run(rec: dict | None, limit_s: float | None) -> bool:
    if rec is None:
        return True
    outcome = rec["_report"].outcome
    if outcome == "crashed":
        return True
    if outcome == "timeout":
        ran_under = rec.get("limit_s")
        return ran_under is None or limit_s is None or limit_s > ran_under
    return False


def merge_results(sources: Iterable[str | os.PathLike], into: str | os.PathLike) -> int:
    """Append to `into` (a results.jsonl) the records of `sources` it lacks, by cell key; a measured result
    replaces a `crashed`/`timeout` one. Returns how many records were added."""
    into = pathlib.Path(into)
    have = _records(into)
    repair_tail(into)
    added = 0
    with open(into, "a") as f:
        for src in sources:
            for key, rec in _records(pathlib.Path(src)).items():
                mine = have.get(key)
                if mine is not None and (mine["_report"].outcome not in ("crashed", "timeout")
                                         or rec["_report"].outcome in ("crashed", "timeout")):
                    continue
                f.write(json.dumps({k: v for k, v in rec.items() if not k.startswith("_")}) + "\n")
                have[key] = rec
                added += 1
        f.flush()
        os.fsync(f.fileno())
    return added


class _Folder:
    """The output folder, checked before any cell runs: a folder (not a file), writable, and this sweep's alone."""

    def __init__(self, out: str | os.PathLike):
        self.path = pathlib.Path(out)
        self.results = self.path / RESULTS
        self._lock = None

    def __enter__(self) -> "_Folder":
        p = self.path
        if p.exists() and not p.is_dir():
            raise ConfigError("sweep", "out", f"{str(p)!r} is a file, not a folder.",
                              "pass a folder (created if missing), or move the file away.")
        try:
            p.mkdir(parents=True, exist_ok=True)
            lock = open(p / LOCK, "a+")
        except OSError as e:
            raise ConfigError("sweep", "out", f"cannot write into {str(p)!r} ({e.strerror or e}).",
                              "pass a folder you can write to.") from None
        import fcntl

        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            who = lock.read().strip() or "another process"
            lock.close()
            raise ConfigError("sweep", "out", f"another sweep is writing into {str(p)!r} ({who}).",
                              "wait for it to finish, or pass another folder.") from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()} on {socket.gethostname()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        lock.flush()
        self._lock = lock
        try:
            with open(self.results, "a"):
                pass
            repair_tail(self.results)
        except OSError as e:
            self.__exit__()
            raise ConfigError("sweep", "out", f"cannot write {str(self.results)!r} ({e.strerror or e}).",
                              "pass a folder you can write to.") from None
        return self

    def append(self, rec: dict) -> None:
        with open(self.results, "a") as f:
            f.write(json.dumps(rec) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def __exit__(self, *exc) -> None:
        if self._lock is not None:
            with contextlib.suppress(OSError):
                self._lock.truncate(0)
            self._lock.close()  # closing releases the flock (so does dying: the kernel drops it)
            self._lock = None


# --------------------------------------------------------------------------------------------------- progress

class Progress:
    """Cells done, findings (any label but `works`), lost cells (crashed / timeout) and the last finished cell.
    On a terminal a tqdm bar sized to it (time left appears once a cell has finished); elsewhere a line per cell."""

    def __init__(self, total: int, done: int = 0, enabled: bool = True, stream=None):
        self.total, self.done, self.enabled = total, done, enabled and total > 0
        self.stream = stream or sys.stderr
        self.findings = self.lost = 0
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._bar = None
        self._t0 = time.perf_counter()
        if self.enabled and self.tty:
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=done, file=self.stream, dynamic_ncols=True, unit="cell",
                             desc="matrix", bar_format="{desc} {n_fmt}/{total_fmt} {bar} {elapsed}<{remaining} {postfix}")

    def finish(self, cell: Cell, label: str) -> None:
        self.done += 1
        self.lost += label in ("crashed", "timeout")
        self.findings += label != "works" and label not in ("crashed", "timeout")
        tally = f"{self.findings} findings" + (f", {self.lost} lost" if self.lost else "")
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_postfix_str(f"{tally} | last: {label} {cell.label}", refresh=False)
            self._bar.update(1)
        else:
            at = time.perf_counter() - self._t0
            self.stream.write(f"[{self.done}/{self.total}] {label:18} {cell.label} (at {at:.0f} s; {tally})\n")
            self.stream.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


# ------------------------------------------------------------------------------------------------------ sweep

def environment() -> dict[str, Any]:
    """The runner's environment plus the device the cells run on (part of every cell's cache key)."""
    return {**run_environment(), "device": "cuda" if torch.cuda.is_available() else "cpu"}


def _check_limit(owner: str, timeout_s: Any) -> None:
    if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                                  or not timeout_s > 0 or timeout_s != timeout_s or timeout_s == float("inf")):
        raise ConfigError(owner, "timeout_s", f"{timeout_s!r} is not a positive number of seconds.",
                          "pass e.g. 600, or None for no limit.")


STACKS = ("toolkit", "torchtitan", "all")


def default_cells(*, quick: bool, backends: tuple[str, ...], stack: str) -> list[Cell]:
    """The cells of a sweep: the quick or full toolkit sweep, torchtitan's own models, or both. torchtitan is
    checked for before anything runs."""
    if stack not in STACKS:
        raise ConfigError("sweep", "stack", f"{stack!r} is not one of {', '.join(STACKS)}.",
                          "pass stack='toolkit' (the default), 'torchtitan' or 'all'.")
    cells = [] if stack == "torchtitan" else (quick_cells(backends) if quick else full_cells(backends))
    if stack != "toolkit":
        from ..stacks.torchtitan import require

        require("sweep", "stack")
        cells += torchtitan_cells(backends)
    return cells


def sweep(cells: Iterable[Cell] | None = None, *, out: str | os.PathLike | None = None, quick: bool = True,
          backends: Iterable[str] = ("aot_eager",), workers: int = 1, timeout_s: float | None = 600,
          progress: bool = True, runner: Callable[..., Report] | None = None,
          executor: str | Executor = "local", warm: bool = True, stack: str = "toolkit",
          **executor_options: Any) -> MatrixResult:
    """Measure every cell (isolated), appending each result to `out/results.jsonl` as it finishes; cells already
    there (same scenario, torch version and device) are not run again, `crashed` ones and shorter-limit timeouts
    are. `executor`: "local" (`workers` at a time; `warm` forks each cell from a pre-imported server), "submitit"
    or "ray" (options: see `toolkit.analysis.executors`), or an Executor. `stack`: the toolkit's model ("toolkit"),
    torchtitan's own models and transforms ("torchtitan", `torchtitan_cells`), or both ("all"); ignored when
    `cells` is given. Writes matrix.json/.md/.html to `out`."""
    _check_limit("sweep", timeout_s)
    cells = list(cells) if cells is not None else default_cells(quick=quick, backends=tuple(backends), stack=stack)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError("sweep", "workers", f"{workers!r} is not a whole number >= 1.", "pass e.g. workers=2.")
    ex = make(executor, workers=workers, warm=warm, runner=runner, **executor_options)
    runnable = [c for c in cells if valid(c) is None]
    device = environment()["device"]
    keys = {c: cell_key(c.scenario(), device) for c in runnable}
    folder = _Folder(out) if out is not None else contextlib.nullcontext()
    with folder:
        records = _records(folder.results) if out is not None else {}
        done = {k: (r["_cell"], r["_report"]) for k, r in records.items()}
        pending = [c for c in runnable if _needs_run(records.get(keys[c]), timeout_s)]
        if progress and pending:
            print(f"matrix: {len(pending)} of {len(runnable)} cells to run on {ex.describe()}"
                  + (f", {len(runnable) - len(pending)} from {folder.results}" if len(pending) < len(runnable) else ""),
                  file=sys.stderr, flush=True)
        bar = Progress(len(runnable), len(runnable) - len(pending), enabled=progress)
        try:
            for job, report in ex.run([Job(keys[c], c, timeout_s) for c in pending], folder.path if out else None):
                done[job.key] = (job.cell, report)
                if out is not None:
                    folder.append({"key": job.key, "cell": job.cell.to_dict(), "report": report.to_dict(),
                                   "limit_s": timeout_s})
                bar.finish(job.cell, classify(report).label)
        finally:
            bar.close()
        result = MatrixResult([Row(keys[c], c, done[keys[c]][1]) for c in runnable], environment(),
                              _other_releases(records, set(runnable), set(keys.values())))
        if out is not None:
            result.write(out)
    return result


def _other_releases(records: dict[str, dict], cells: set[Cell], mine: set[str]) -> dict[str, MatrixResult]:
    """The sweep's cells as measured on other torch releases, from the same results.jsonl (the central list is
    regenerated once per release into one folder, and marks what changed)."""
    by_torch: dict[str, dict[Cell, Row]] = {}
    for key, rec in records.items():
        cell, report = rec["_cell"], rec["_report"]
        release = report.environment.get("torch")
        if key in mine or cell not in cells or not release or release == torch.__version__:
            continue
        by_torch.setdefault(release, {})[cell] = Row(key, cell, report)
    return {t: MatrixResult(list(rows.values()), {"torch": t}) for t, rows in sorted(by_torch.items())}


def summary(result: MatrixResult, width: int | None = None) -> str:
    """The counts, then every cell that is not `works`, most severe first: label, cell, known cases, one-line
    reason (cut to `width`, default the terminal's)."""
    width = width or shutil.get_terminal_size((120, 24)).columns
    lines = [str(result)]
    for label, n in result.counts().items():
        lines.append(f"  {label:20} {n:4d}  {EXPLAIN[label]}")
    bad = sorted((r for r in result.rows if r.classification.label != "works"),
                 key=lambda r: (r.classification.severity, r.cell.label))
    if bad:
        lines.append(f"\nnot works ({len(bad)}):")
    for r in bad:
        cl = r.classification
        cases = f"  [{', '.join(cl.cases)}]" if cl.cases else ""
        lines.append(f"  {cl.label:20} {r.cell.label}{cases}")
        reason = " ".join(cl.explanation.split())
        lines.append(_cut(f"  {'':20} {reason}", width))
    changes = result.torch_changes()
    if changes:
        lines.append(f"\nchanged from another torch release ({len(changes)}):")
        for r, there in changes:
            was = ", ".join(f"{lab} on {t}" for t, lab in there.items())
            lines.append(_cut(f"  {r.classification.label:20} {r.cell.label}  (was {was})", width))
    return "\n".join(lines)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:max(10, width - 1)] + "…"


# -------------------------------------------------------------------------------------------------------- CLI

def main(argv: list[str] | None = None) -> int:
    import argparse

    from ..transforms.compile import BACKENDS

    def seconds(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not v > 0 or v == float("inf"):
            raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds (e.g. 600)")
        return v

    def count(minimum: int):
        def parse(text: str) -> int:
            try:
                v = int(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
            if v < minimum:
                raise argparse.ArgumentTypeError(f"{v} is below {minimum}")
            return v
        return parse

    parser = argparse.ArgumentParser(prog="python -m toolkit matrix", description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="the default sweep (about 40 cells, a minute on a laptop)")
    size.add_argument("--full", action="store_true", help="every combination (hundreds of cells)")
    parser.add_argument("--backend", action="append", choices=BACKENDS, help="repeat for several (default aot_eager)")
    parser.add_argument("--stack", choices=STACKS, default="toolkit",
                        help="the toolkit's model (default), torchtitan's own models and transforms "
                             "(pip install -e '.[torchtitan]'), or all")
    parser.add_argument("--only", metavar="REGEX", help="only cells whose label matches, e.g. '^dense \\| AC full'")
    parser.add_argument("--timeout-s", type=seconds, default=600.0, help="per cell (default 600)")
    parser.add_argument("--out", default="matrix-out", help="folder for results.jsonl and matrix.json/.md/.html")
    parser.add_argument("--merge", nargs="+", metavar="RESULTS", default=[],
                        help="first merge these results.jsonl files (from other machines) into OUT, by cell key")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--executor", choices=EXECUTORS, default="local", help="where cells run (default local)")
    loc = parser.add_argument_group("--executor local")
    loc.add_argument("--workers", type=count(1), default=max(1, min(2, os.cpu_count() or 1)))
    loc.add_argument("--cold", action="store_true", help="a fresh Python per cell instead of the warm fork server")
    sub = parser.add_argument_group("--executor submitit (Slurm; without Slurm, local processes)")
    sub.add_argument("--cluster", choices=["slurm", "local", "debug"], help="default: slurm if sbatch is found")
    sub.add_argument("--partition", help="Slurm partition")
    sub.add_argument("--time-min", type=count(1), default=60, help="time limit per task, minutes (default 60)")
    sub.add_argument("--gpus-per-cell", type=count(0), default=0)
    sub.add_argument("--array-parallelism", type=count(1), default=64, help="array tasks at once (default 64)")
    both = parser.add_argument_group("--executor submitit and ray")
    both.add_argument("--cpus-per-cell", type=count(1), default=None, help="default 2 (submitit), 1 (ray)")
    both.add_argument("--cells-per-job", type=count(1), default=1, help="cells per task, run in turn (default 1)")
    ray = parser.add_argument_group("--executor ray")
    ray.add_argument("--address", help="an existing Ray cluster ('auto', or ray://HEAD:10001); default: start one here")
    parser.add_argument("--dry-run", action="store_true",
                        help="check the options, the cells and the --merge files, say how many cells would run "
                             "(and how many OUT already holds), then exit without running or writing anything")
    args = parser.parse_args(argv)

    backends = args.backend or ["aot_eager"]
    try:
        cells = default_cells(quick=not args.full, backends=tuple(backends), stack=args.stack)
    except (ConfigError, ImportError) as e:
        parser.error(f"--stack {args.stack}: {e}")
    if args.only:
        try:
            pattern = re.compile(args.only)
        except re.error as e:
            parser.error(f"--only: {e}")
        cells = [c for c in cells if pattern.search(c.label)]
        if not cells:
            parser.error(f"--only {args.only!r} matches no cell of the {'full' if args.full else 'quick'} sweep")
    options: dict[str, Any] = {}
    if args.executor == "submitit":
        options = dict(cluster=args.cluster, partition=args.partition, time_min=args.time_min,
                       gpus_per_cell=args.gpus_per_cell, cpus_per_cell=args.cpus_per_cell or 2,
                       cells_per_job=args.cells_per_job, array_parallelism=args.array_parallelism)
    elif args.executor == "ray":
        options = dict(address=args.address, cpus_per_cell=args.cpus_per_cell or 1, cells_per_task=args.cells_per_job)
    if args.dry_run:
        return _dry_run(args, cells, options)
    try:
        if args.merge:
            for src in args.merge:
                if not pathlib.Path(src).is_file():
                    raise ConfigError("matrix", "merge", f"{src!r} is not a file.", "pass results.jsonl files.")
            with _Folder(args.out) as f:
                added = merge_results(args.merge, f.results)
            print(f"merged {added} records into {args.out}/{RESULTS}", file=sys.stderr)
        result = sweep(cells, out=args.out, workers=args.workers, timeout_s=args.timeout_s,
                       progress=not args.no_progress, executor=args.executor, warm=not args.cold, **options)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(summary(result))
    print(f"wrote {args.out}/matrix.json, matrix.md, matrix.html (results in {args.out}/{RESULTS})")
    return 0


def _dry_run(args: Any, cells: list[Cell], options: dict[str, Any]) -> int:
    """`matrix --dry-run`: what the sweep would do, without running a cell or writing a file."""
    from .._extras import available, reason

    try:
        ex = make(args.executor, workers=args.workers, warm=not args.cold, **options)
        for src in args.merge:
            if not pathlib.Path(src).is_file():
                raise ConfigError("matrix", "merge", f"{src!r} is not a file.", "pass results.jsonl files.")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.executor in ("submitit", "ray") and not available(args.executor):
        print(f"error: --executor {args.executor} {reason(args.executor)}", file=sys.stderr)
        return 2
    runnable = [c for c in cells if valid(c) is None]
    device = environment()["device"]
    results = pathlib.Path(args.out) / RESULTS
    records = _records(results) if results.is_file() else {}
    pending = [c for c in runnable if _needs_run(records.get(cell_key(c.scenario(), device)), args.timeout_s)]
    print(f"matrix --dry-run: {len(runnable)} cells ({len(cells) - len(runnable)} invalid combinations left out), "
          f"{len(pending)} to run on {ex.describe()}, {len(runnable) - len(pending)} already in {results}"
          + (f"; would first merge {len(args.merge)} results file(s)" if args.merge else "") + ". Nothing was run.")
    return 0
