"""Sweeping the matrix: every cell isolated, appended to `results.jsonl` as it finishes; re-runs resume.

Sweeping the matrix: every cell isolated (a subprocess with a timeout, here or on a cluster), results appended to
`results.jsonl` as each cell finishes, re-runs resume.

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
import shutil
import socket
import sys
import time
from dataclasses import replace
from typing import Any, Callable, Iterable

import torch

from .._config import ConfigError, check_bool, check_int, check_seconds
from ..measure import Report
from ..measure import environment as run_environment
from .cells import Cell, cell_key, full_cells, quick_cells, torchtitan_cells, valid
from .classification import EXPLAIN, classify
from .executors import Executor, Job, make
from .matrix import MatrixResult, Row

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
                if mine is not None and (
                    mine["_report"].outcome not in ("crashed", "timeout")
                    or rec["_report"].outcome in ("crashed", "timeout")
                ):
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
            raise ConfigError(
                "sweep",
                "out",
                f"{str(p)!r} is a file, not a folder.",
                "pass a folder (created if missing), or move the file away.",
            )
        try:
            p.mkdir(parents=True, exist_ok=True)
            lock = open(p / LOCK, "a+")
        except OSError as e:
            raise ConfigError(
                "sweep", "out", f"cannot write into {str(p)!r} ({e.strerror or e}).", "pass a folder you can write to."
            ) from None
        import fcntl

        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            who = lock.read().strip() or "another process"
            lock.close()
            raise ConfigError(
                "sweep",
                "out",
                f"another sweep is writing into {str(p)!r} ({who}).",
                "wait for it to finish, or pass another folder.",
            ) from None
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
            raise ConfigError(
                "sweep",
                "out",
                f"cannot write {str(self.results)!r} ({e.strerror or e}).",
                "pass a folder you can write to.",
            ) from None
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

            self._bar = tqdm(
                total=total,
                initial=done,
                file=self.stream,
                dynamic_ncols=True,
                unit="cell",
                desc="matrix",
                bar_format="{desc} {n_fmt}/{total_fmt} {bar} {elapsed}<{remaining} {postfix}",
            )

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


STACKS = ("toolkit", "torchtitan", "all")


def default_cells(*, quick: bool, backends: tuple[str, ...], stack: str) -> list[Cell]:
    """The cells of a sweep: the quick or full toolkit sweep, torchtitan's own models, or both. torchtitan is
    checked for before anything runs."""
    if stack not in STACKS:
        raise ConfigError(
            "sweep",
            "stack",
            f"{stack!r} is not one of {', '.join(STACKS)}.",
            "pass stack='toolkit' (the default), 'torchtitan' or 'all'.",
        )
    cells = [] if stack == "torchtitan" else (quick_cells(backends) if quick else full_cells(backends))
    if stack != "toolkit":
        from ..stacks.torchtitan import require

        require("sweep", "stack")
        cells += torchtitan_cells(backends)
    return cells


def sweep(
    cells: Iterable[Cell] | None = None,
    *,
    out: str | os.PathLike | None = None,
    quick: bool = True,
    backends: Iterable[str] = ("aot_eager",),
    workers: int = 1,
    timeout_s: float | None = 600,
    progress: bool = True,
    runner: Callable[..., Report] | None = None,
    executor: str | Executor = "local",
    warm: bool = True,
    stack: str = "toolkit",
    bare: bool = True,
    **executor_options: Any,
) -> MatrixResult:
    """Measure every cell (isolated), appending each result to `out/results.jsonl` as it finishes; cells already
    there (same scenario, torch version and device) are not run again, `crashed` ones and shorter-limit timeouts
    are. `executor`: "local" (`workers` at a time; `warm` forks each cell from a pre-imported server), "submitit"
    or "ray" (options: see `toolkit.analysis.executors`), or an Executor. `stack`: the toolkit's model ("toolkit"),
    torchtitan's own models and transforms ("torchtitan", `torchtitan_cells`), or both ("all"); ignored when
    `cells` is given. `bare`: then rerun every cell classified as an error or a silent failure with none of the
    probes (`Cell.bare`), so the list says whether the failure happens without the instrument. Writes
    matrix.json/.md/.html to `out`."""
    check_seconds("sweep", "timeout_s", timeout_s)
    check_bool("sweep", "bare", bare)
    cells = list(cells) if cells is not None else default_cells(quick=quick, backends=tuple(backends), stack=stack)
    check_int("sweep", "workers", workers, 1)
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
            print(
                f"matrix: {len(pending)} of {len(runnable)} cells to run on {ex.describe()}"
                + (f", {len(runnable) - len(pending)} from {folder.results}" if len(pending) < len(runnable) else ""),
                file=sys.stderr,
                flush=True,
            )
        bar = Progress(len(runnable), len(runnable) - len(pending), enabled=progress)

        def measure(jobs: list[Job]) -> None:
            for job, report in ex.run(jobs, folder.path if out else None):
                done[job.key] = (job.cell, report)
                if out is not None:
                    folder.append(
                        {"key": job.key, "cell": job.cell.to_dict(), "report": report.to_dict(), "limit_s": timeout_s}
                    )
                bar.finish(job.cell, classify(report).label)

        try:
            measure([Job(keys[c], c, timeout_s) for c in pending])
        finally:
            bar.close()
        result = MatrixResult(
            [Row(keys[c], c, done[keys[c]][1]) for c in runnable],
            environment(),
            _other_releases(records, set(runnable), set(keys.values())),
        )
        if bare:
            failing = [r for r in result.rows if r.classification.label in BARE_RERUN]
            bare_keys = {r.cell: cell_key(replace(r.cell, bare=True).scenario(), device) for r in failing}
            todo = [
                Job(bare_keys[r.cell], replace(r.cell, bare=True), timeout_s)
                for r in failing
                if _needs_run(records.get(bare_keys[r.cell]), timeout_s) and bare_keys[r.cell] not in done
            ]
            if progress and todo:
                print(f"matrix: {len(todo)} failing cells rerun bare (no probes)", file=sys.stderr, flush=True)
            bar = Progress(len(todo), 0, enabled=progress)
            try:
                measure(todo)
            finally:
                bar.close()
            for r in failing:
                if bare_keys[r.cell] in done:
                    r.bare = done[bare_keys[r.cell]][1]
        if out is not None:
            result.write(out)
    return result


# The classifications a bare rerun checks: the failures of the stack or of the instrument. A crash or a timeout is
# rerun by the next sweep anyway, and `works` needs no second opinion.
BARE_RERUN = (
    "error",
    "grads_differ",
    "fell_back_to_eager",
    "sac_not_applied",
    "ac_saves_nothing",
    "recompiles",
    "graph_breaks",
)


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
    bad = sorted(
        (r for r in result.rows if r.classification.label != "works"),
        key=lambda r: (r.classification.severity, r.cell.label),
    )
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
    return text if len(text) <= width else text[: max(10, width - 1)] + "…"


def plan(
    cells: Iterable[Cell], *, out: str | os.PathLike, timeout_s: float | None = 600
) -> tuple[list[Cell], list[Cell]]:
    """`(runnable, pending)`: the cells that can be built, and those of them `sweep` would run into `out` (not in
    its results.jsonl yet, crashed, or timed out under a shorter limit) — read only, nothing is run or written."""
    check_seconds("sweep", "timeout_s", timeout_s)
    runnable = [c for c in cells if valid(c) is None]
    results = pathlib.Path(out) / RESULTS
    records = _records(results) if results.is_file() else {}
    device = environment()["device"]
    return runnable, [c for c in runnable if _needs_run(records.get(cell_key(c.scenario(), device)), timeout_s)]


def merge_into(out: str | os.PathLike, sources: Iterable[str | os.PathLike]) -> int:
    """`merge_results` into `out/results.jsonl`, holding the folder's lock as a sweep does; each source must be a
    file. Returns how many records were added."""
    sources = list(sources)
    for src in sources:
        if not pathlib.Path(src).is_file():
            raise ConfigError("matrix", "merge", f"{str(src)!r} is not a file.", "pass results.jsonl files.")
    with _Folder(out) as folder:
        return merge_results(sources, folder.results)
