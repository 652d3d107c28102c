"""Sweeping the matrix: every cell isolated, appended to `results.jsonl` as it finishes; re-runs resume.

Sweeping the matrix: every cell isolated (a subprocess with a timeout, here or on a cluster), results appended to
`results.jsonl` as each cell finishes, re-runs resume.

`results.jsonl` holds one record per line, `{"key", "cell", "report", "limit_s"}` (and `"timeouts"`, how many
times in a row a timed-out cell did), keyed by scenario, torch version and device (`cells.cell_key`); the last
record of a key wins, and a line that is not a record (torn by `kill -9`, not UTF-8, junk) is skipped and named. A
re-run skips cells already there, except `crashed` ones and `timeout`s: under a longer limit than theirs always,
under the same one once (`retry_timeouts`). One sweep writes into a folder at a time (a lock); results from several
folders or machines merge by key, read the same way (`merge_results`, `--merge`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import socket
import sys
import time
from dataclasses import replace
from typing import Any, Callable, Iterable, NamedTuple

import torch

from .._config import ConfigError, check_bool, check_int, check_seconds
from .._stamp import render
from ..measure import Report
from ..measure import environment as run_environment
from ..measure.report import OUTCOMES
from ..transforms.compile import BACKENDS
from .cells import Cell, cell_key, full_cells, quick_cells, torchtitan_cells, valid
from .classification import EXPLAIN, classify
from .executors import Executor, Job, make
from .matrix import MatrixResult, Row

RESULTS = "results.jsonl"
LOCK = ".sweep.lock"
OUTPUTS = ("matrix.json", "matrix.md", "matrix.html")


# ------------------------------------------------------------------------------------------------ results.jsonl


class Skipped(NamedTuple):
    """A line of a results.jsonl that is not a record: its number (from 1) and why."""

    line: int
    why: str


_CELL_FIELDS = frozenset(f.name for f in dataclasses.fields(Cell))
_CELL_NEEDS = frozenset(("block", "ac", "scope"))  # in every record ever written (later fields have defaults)


def _record(raw: bytes) -> dict:
    """One line as the record it must be — `{"key", "cell", "report", "limit_s"}` as `sweep` writes it — or
    ValueError saying what it is instead. The one reader of records: resume, `load_results` and `--merge`."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})") from None
    try:
        rec = json.loads(text)
    except ValueError:
        raise ValueError("not JSON (a torn or foreign line)") from None
    if not isinstance(rec, dict) or not {"key", "cell", "report"} <= set(rec):
        raise ValueError("not a record (an object with key, cell and report)")
    if not isinstance(rec["key"], str) or not rec["key"].strip():
        raise ValueError(f"key {rec['key']!r} is not a cell key (a non-empty string)")
    cell, report = rec["cell"], rec["report"]
    if not isinstance(cell, dict) or not _CELL_NEEDS <= set(cell) <= _CELL_FIELDS:
        raise ValueError("its cell does not hold the fields of a Cell")
    if not isinstance(report, dict) or report.get("outcome") not in OUTCOMES:
        raise ValueError("its report has no outcome")
    if not isinstance(report.get("environment"), dict) or not isinstance(report["environment"].get("torch"), str):
        raise ValueError("its report does not say which torch measured it")
    try:
        check_seconds("record", "limit_s", rec.get("limit_s"))
    except ConfigError as e:
        raise ValueError(f"limit_s {e.problem.rstrip('.')}") from None
    if "timeouts" in rec:
        try:
            check_int("record", "timeouts", rec["timeouts"], 0)
        except ConfigError as e:
            raise ValueError(f"timeouts {e.problem.rstrip('.')}") from None
    try:
        rec["_cell"], rec["_report"] = Cell(**cell), Report.from_dict(report)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"its cell or report cannot be read ({type(e).__name__}: {str(e)[:80]})") from None
    return rec


def read_results(path: str | os.PathLike) -> tuple[dict[str, dict], list[Skipped]]:
    """key → the last valid record for it, and every line skipped with why: a torn line (`kill -9` mid-write), an
    undecodable one (not UTF-8), junk that is not a record."""
    out: dict[str, dict] = {}
    skipped: list[Skipped] = []
    p = pathlib.Path(path)
    if not p.exists():
        return out, skipped
    for n, raw in enumerate(p.read_bytes().split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            rec = _record(raw)
        except ValueError as e:
            skipped.append(Skipped(n, str(e)))
            continue
        out[rec["key"]] = rec
    return out, skipped


def _records(path: pathlib.Path) -> dict[str, dict]:
    return read_results(path)[0]


def skipped_text(path: str | os.PathLike, skipped: list[Skipped], limit: int = 5) -> str:
    """`results.jsonl: skipped 3 lines that are not records (line 4: not UTF-8 …; line 9: not JSON …)`."""
    shown = "; ".join(f"line {s.line}: {s.why}" for s in skipped[:limit])
    more = f"; +{len(skipped) - limit} more" if len(skipped) > limit else ""
    n = len(skipped)
    return (
        f"{path}: skipped {n} line{'' if n == 1 else 's'} that {'is' if n == 1 else 'are'} not a record ({shown}{more})"
    )


def load_results(path: str | os.PathLike) -> dict[str, tuple[Cell, Report]]:
    """Finished cells from a results.jsonl, the last record of each key (torn, undecodable and junk lines are
    skipped: `read_results` says which)."""
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


def _needs_run(rec: dict | None, limit_s: float | None, retry_timeouts: bool = True) -> bool:
    """A cell runs when it has no record, crashed, or timed out under a shorter limit than this run's; a timeout
    under the same or a longer limit is retried once (`retry_timeouts`: a load spike is not a result), then kept."""
    if rec is None:
        return True
    outcome = rec["_report"].outcome
    if outcome == "crashed":
        return True
    if outcome == "timeout":
        ran_under = rec.get("limit_s")
        if ran_under is None or limit_s is None or limit_s > ran_under:
            return True
        return retry_timeouts and rec.get("timeouts", 1) < 2
    return False


def merge_results(
    sources: Iterable[str | os.PathLike], into: str | os.PathLike, skipped: dict[str, list[Skipped]] | None = None
) -> int:
    """Append to `into` (a results.jsonl) the records of `sources` it lacks, by cell key; a measured result
    replaces a `crashed`/`timeout` one. Each source is read as a sweep reads its own file (`read_results`): the lines
    that are not records are skipped, and listed in `skipped` by source when a dict is given. Returns how many
    records were added."""
    into = pathlib.Path(into)
    have = _records(into)
    repair_tail(into)
    added = 0
    with open(into, "a") as f:
        for src in sources:
            records, bad = read_results(src)
            if skipped is not None and bad:
                skipped[str(src)] = bad
            for key, rec in records.items():
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


def check_out(out: Any) -> None:
    """An output folder is a non-empty path: `""` would write into the working directory (`wrote /matrix.json`)."""
    if not isinstance(out, (str, os.PathLike)) or not os.fspath(out).strip():
        raise ConfigError(
            "sweep",
            "out",
            f"{out!r} names no folder (an empty path would write into the working directory).",
            "pass a folder, e.g. out='matrix-out' (--out matrix-out).",
        )


class _Folder:
    """The output folder, checked before any cell runs: a folder (not a file), writable, and this sweep's alone."""

    def __init__(self, out: str | os.PathLike):
        check_out(out)
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
            for name in OUTPUTS:  # what the sweep writes at the end, checked before the first cell runs
                target = p / name
                if target.is_dir():
                    raise IsADirectoryError(21, "Is a directory", str(target))
                if target.exists() and not os.access(target, os.W_OK):
                    raise PermissionError(13, "Permission denied", str(target))
        except OSError as e:
            self.__exit__()
            where = e.filename or str(self.results)
            raise ConfigError(
                "sweep",
                "out",
                f"cannot write {str(where)!r} ({e.strerror or e}).",
                "move it away, or pass another folder.",
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
    """The sweep's environment plus the device the cells run on (part of every cell's cache key). The private
    torch APIs this torch lacks are in each cell's Report, not here: detecting them imports Dynamo, and a sweep of
    cached cells needs nothing of it."""
    return {**run_environment(features=False), "device": "cuda" if torch.cuda.is_available() else "cpu"}


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
    if isinstance(backends, str) or not backends or any(b not in BACKENDS for b in backends):
        bad = backends if isinstance(backends, str) or not backends else next(b for b in backends if b not in BACKENDS)
        raise ConfigError(
            "sweep",
            "backends",
            f"{bad!r} is not a compile backend (a cell with it could not be built, and only the eager cells "
            "would run).",
            f"pass a tuple of {', '.join(map(repr, BACKENDS))}, e.g. backends=('aot_eager',).",
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
    retry_timeouts: bool = True,
    bare: bool = True,
    **executor_options: Any,
) -> MatrixResult:
    """Measure every cell (isolated), appending each result to `out/results.jsonl` as it finishes; cells already
    there (same scenario, torch version and device) are not run again, `crashed` ones and shorter-limit timeouts
    are, and a timeout under the same limit is retried once (`retry_timeouts=False` keeps it: `--keep-timeouts`).
    `executor`: "local" (`workers` at a time; `warm` forks each cell from a pre-imported server), "submitit"
    or "ray" (options: see `toolkit.analysis.executors`), or an Executor. `stack`: the toolkit's model ("toolkit"),
    torchtitan's own models and transforms ("torchtitan", `torchtitan_cells`), or both ("all"); ignored when
    `cells` is given. `bare`: then rerun every cell classified as an error or a silent failure with none of the
    probes (`Cell.bare`), so the list says whether the failure happens without the instrument. Writes
    matrix.json/.md/.html to `out` (each checked to be writable before the first cell)."""
    check_seconds("sweep", "timeout_s", timeout_s)
    check_bool("sweep", "retry_timeouts", retry_timeouts)
    check_bool("sweep", "bare", bare)
    if cells is None:
        cells = default_cells(
            quick=quick, backends=backends if isinstance(backends, str) else tuple(backends), stack=stack
        )
    cells = list(cells)
    check_int("sweep", "workers", workers, 1)
    ex = make(executor, workers=workers, warm=warm, runner=runner, **executor_options)
    folder = _Folder(out) if out is not None else contextlib.nullcontext()
    device = environment()["device"]
    keys = _keys(cells, device)
    with folder:
        records, skipped = read_results(folder.results) if out is not None else ({}, [])
        if skipped:
            print(f"matrix: {skipped_text(folder.results, skipped)}", file=sys.stderr, flush=True)
        # A cell with a result at its key was built and measured: only the others are checked for being buildable.
        runnable = [c for c in cells if c in keys and (keys[c] in records or valid(c) is None)]
        done = {k: (r["_cell"], r["_report"]) for k, r in records.items()}
        pending = [c for c in runnable if _needs_run(records.get(keys[c]), timeout_s, retry_timeouts)]
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
                    rec = {"key": job.key, "cell": job.cell.to_dict(), "report": report.to_dict(), "limit_s": timeout_s}
                    if report.outcome == "timeout":
                        rec["timeouts"] = _timeouts(records.get(job.key), timeout_s) + 1
                    folder.append(rec)
                bar.finish(job.cell, classify(report).label)

        try:
            measure([Job(keys[c], c, timeout_s) for c in pending])
        finally:
            bar.close()
        result = MatrixResult(
            [Row(keys[c], c, done[keys[c]][1]) for c in runnable],
            environment(),
            _other_releases(records, set(runnable), {keys[c] for c in runnable}),
        )
        if bare:
            failing = [r for r in result.rows if r.classification.label in BARE_RERUN]
            bare_keys = {r.cell: cell_key(replace(r.cell, bare=True).scenario(), device) for r in failing}
            todo = [
                Job(bare_keys[r.cell], replace(r.cell, bare=True), timeout_s)
                for r in failing
                if _needs_run(records.get(bare_keys[r.cell]), timeout_s, retry_timeouts)
                and bare_keys[r.cell] not in done
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


def _keys(cells: Iterable[Cell], device: str) -> dict[Cell, str]:
    """Each cell's cache key; a cell whose Scenario is refused has none (an invalid combination)."""
    out = {}
    for c in cells:
        try:
            out[c] = cell_key(c.scenario(), device)
        except ConfigError:
            continue
    return out


def _timeouts(rec: dict | None, limit_s: float | None) -> int:
    """How many times in a row the cell of `rec` timed out under `limit_s` or a longer limit (0: none)."""
    if rec is None or rec["_report"].outcome != "timeout":
        return 0
    ran_under = rec.get("limit_s")
    if ran_under is None or limit_s is None or limit_s > ran_under:
        return 0
    return rec.get("timeouts", 1)


def measured(result: MatrixResult) -> int:
    """Cells whose step ran in the sweep's workers (outcome ok or error); crashed and timed-out cells measured
    nothing."""
    return sum(r.report.outcome in ("ok", "error") for r in result.rows)


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
    return render(summary_lines(result), width)


def summary_lines(result: MatrixResult) -> list[tuple[str, bool]]:
    """`summary`'s lines, each with whether it is cut to the terminal's width (the stamp prints them again)."""
    lines = [(str(result), False)]
    for label, n in result.counts().items():
        lines.append((f"  {label:20} {n:4d}  {EXPLAIN[label]}", False))
    bad = sorted(
        (r for r in result.rows if r.classification.label != "works"),
        key=lambda r: (r.classification.severity, r.cell.label),
    )
    if bad:
        lines.append((f"\nnot works ({len(bad)}):", False))
    for r in bad:
        cl = r.classification
        cases = f"  [{', '.join(cl.cases)}]" if cl.cases else ""
        lines.append((f"  {cl.label:20} {r.cell.label}{cases}", False))
        reason = " ".join(cl.explanation.split())
        lines.append((f"  {'':20} {reason}", True))
    if result.rows and not measured(result):
        lines.append(
            (
                f"\nno cell produced a measurement: all {len(result.rows)} crashed or timed out (a longer timeout_s, "
                "or fewer workers, if the machine is loaded).",
                False,
            )
        )
    changes = result.torch_changes()
    if changes:
        lines.append((f"\nchanged from another torch release ({len(changes)}):", False))
        for r, there in changes:
            was = ", ".join(f"{lab} on {t}" for t, lab in there.items())
            lines.append((f"  {r.classification.label:20} {r.cell.label}  (was {was})", True))
    return lines


def plan(
    cells: Iterable[Cell], *, out: str | os.PathLike, timeout_s: float | None = 600, retry_timeouts: bool = True
) -> tuple[list[Cell], list[Cell]]:
    """`(runnable, pending)`: the cells that can be built, and those of them `sweep` would run into `out` (not in
    its results.jsonl yet, crashed, or timed out under a shorter limit) — read only, nothing is run or written."""
    check_seconds("sweep", "timeout_s", timeout_s)
    check_bool("sweep", "retry_timeouts", retry_timeouts)
    check_out(out)
    results = pathlib.Path(out) / RESULTS
    records = _records(results) if results.is_file() else {}
    keys = _keys(cells, environment()["device"])
    runnable = [c for c in cells if c in keys and (keys[c] in records or valid(c) is None)]
    return runnable, [c for c in runnable if _needs_run(records.get(keys[c]), timeout_s, retry_timeouts)]


def settled(
    result: MatrixResult, *, out: str | os.PathLike, timeout_s: float | None, retry_timeouts: bool, bare: bool
) -> bool:
    """Whether the same sweep into `out` would run nothing: every cell of `result` and, with `bare`, the bare rerun
    of each failing one has a result that stands, and results.jsonl has no line that is not a record."""
    records, skipped = read_results(pathlib.Path(out) / RESULTS)
    if skipped:
        return False
    device = environment()["device"]
    for r in result.rows:
        if _needs_run(records.get(r.key), timeout_s, retry_timeouts):
            return False
        if bare and r.classification.label in BARE_RERUN:
            key = cell_key(replace(r.cell, bare=True).scenario(), device)
            if _needs_run(records.get(key), timeout_s, retry_timeouts):
                return False
    return True


def merge_into(out: str | os.PathLike, sources: Iterable[str | os.PathLike]) -> tuple[int, dict[str, list[Skipped]]]:
    """`merge_results` into `out/results.jsonl`, holding the folder's lock as a sweep does; each source must be a
    file. Returns how many records were added, and the lines of each source that were skipped (with why)."""
    sources = list(sources)
    for src in sources:
        if not pathlib.Path(src).is_file():
            raise ConfigError("matrix", "merge", f"{str(src)!r} is not a file.", "pass results.jsonl files.")
    skipped: dict[str, list[Skipped]] = {}
    with _Folder(out) as folder:
        return merge_results(sources, folder.results, skipped), skipped
