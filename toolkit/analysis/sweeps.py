"""Sweeping the matrix: every cell isolated, appended to `results.jsonl` as it finishes; re-runs resume.

Sweeping the matrix: every cell isolated (a subprocess with a timeout, here or on a cluster), results appended to
`results.jsonl` as each cell finishes, re-runs resume.

A re-run skips cells already there (`store`), except `crashed` ones and `timeout`s: under a longer limit than theirs
always, under the same one once (`retry_timeouts`).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import sys
from dataclasses import replace
from typing import Any, Callable, Iterable, cast

import torch

from .._config import ConfigError, check_bool, check_int, check_seconds
from .._stamp import render
from ..execution import environment as run_environment
from ..measurement import Report
from ..stacks import get
from ..transforms.compile import BACKENDS
from .cells import Cell, cell_key, full_cells, quick_cells, valid
from .classification import EXPLAIN, SEVERITY, Classification, classify
from .executors import Executor, Job, make
from .grids import GRIDS, model_cells, stack_cells
from .matrix import MatrixResult, Row
from .progress import Progress
from .store import RESULTS, Folder, check_out, read_records, read_results, replaces, skipped_text


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


def environment() -> dict[str, Any]:
    """The sweep's environment plus the device the cells run on (part of every cell's cache key). The private
    torch APIs this torch lacks are in each cell's Report, not here: detecting them imports Dynamo, and a sweep of
    cached cells needs nothing of it."""
    return {**run_environment(features=False), "device": "cuda" if torch.cuda.is_available() else "cpu"}


STACK_NAMES = ("toolkit", *GRIDS)
"""The stacks `matrix --stack` sweeps: the toolkit's own grid (`cells`) and each other stack's (`grids.GRIDS`)."""
STACKS = (*STACK_NAMES, "all")


def default_cells(*, quick: bool, backends: str | tuple[str, ...], stack: str | tuple[str, ...]) -> list[Cell]:
    """The cells of a sweep: the quick or full toolkit sweep, torchtitan's or transformers' own models, several of
    them (a tuple of names) or all. An optional stack's package is checked for before anything runs."""
    stacks = (stack,) if isinstance(stack, str) else tuple(stack)
    for name in stacks or ("",):
        if name not in STACKS:
            raise ConfigError(
                "sweep",
                "stack",
                f"{name!r} is not one of {', '.join(STACKS)}.",
                f"pass stack='toolkit' (the default), {', '.join(repr(s) for s in STACKS[1:])}, or a tuple of them.",
            )
    wanted = set(STACK_NAMES) if "all" in stacks else set(stacks)
    if isinstance(backends, str) or not backends or any(b not in BACKENDS for b in backends):
        bad = backends if isinstance(backends, str) or not backends else next(b for b in backends if b not in BACKENDS)
        raise ConfigError(
            "sweep",
            "backends",
            f"{bad!r} is not a compile backend (a cell with it could not be built, and only the eager cells "
            "would run).",
            f"pass a tuple of {', '.join(map(repr, BACKENDS))}, e.g. backends=('aot_eager',).",
        )
    cells = (quick_cells(backends) if quick else full_cells(backends)) if "toolkit" in wanted else []
    for name in GRIDS:
        if name in wanted:
            get(name).require("sweep", "stack")
            cells += stack_cells(name, backends, quick=quick)
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
    stack: str | tuple[str, ...] = "toolkit",
    retry_timeouts: bool = True,
    bare: bool = True,
    model: str | Callable[[], Any] | None = None,
    blocks: str | None = None,
    **executor_options: Any,
) -> MatrixResult:
    """Measure every cell (isolated), appending each result to `out/results.jsonl` as it finishes; cells already
    there (same scenario, torch version and device) are not run again, `crashed` ones and shorter-limit timeouts
    are, and a timeout under the same limit is retried once (`retry_timeouts=False` keeps it: `--keep-timeouts`).
    `executor`: "local" (`workers` at a time; `warm` forks each cell from a pre-imported server), "submitit"
    or "ray" (options: see `toolkit.analysis.executors`), or an Executor. `stack`: the toolkit's model ("toolkit"),
    torchtitan's or transformers' own models and transforms ("torchtitan", "transformers": `stack_cells`), a tuple
    of them, or "all" (refused beside `cells` or `model`, which give the cells). `bare`: then rerun every cell
    classified as an error or a silent failure with none of the probes (`Cell.bare`), so the list says whether the
    failure happens without the instrument. `model`: sweep your own model instead (`matrix --model`): a `build()`
    defined at the top of a .py file, or `"FILE.py:FUNCTION"`, returning `(model, inputs)` or
    `(model, inputs, loss_fn)`; `blocks` the class of its repeated blocks (default: found as FSDP's auto-wrap would).
    Writes matrix.json/.md/.html to `out` (each checked to be writable before the first cell)."""
    check_seconds("sweep", "timeout_s", timeout_s)
    for name, flag in (("retry_timeouts", retry_timeouts), ("bare", bare), ("progress", progress), ("quick", quick)):
        check_bool("sweep", name, flag)
    check_bool("sweep", "warm", warm)
    if runner is not None and not callable(runner):
        raise ConfigError("sweep", "runner", f"{runner!r} is not callable.", "pass a function Scenario -> Report.")
    ignored: list[tuple[str, object, object]] = (
        [("stack", stack, "toolkit")] if cells is not None or model is not None else []
    )
    if cells is not None:
        ignored += [("quick", quick, True), ("backends", backends, ("aot_eager",))]
    for name, value, default in ignored:
        if (tuple(value) if isinstance(value, list) else value) != default:
            given = "model=" if model is not None else "cells="
            raise ConfigError(
                "sweep",
                name,
                f"{name}={value!r} would do nothing: {given} gives the cells.",
                f"drop {name}, or drop {given} to sweep the {name} you name.",
            )
    if model is not None:
        from ..stacks.user import UserModelConfig, preflight, spec_of

        if cells is not None:
            raise ConfigError("sweep", "model", "sweeps your model's own cells; cells= would be left out.", "pass one.")
        spec = spec_of(model)
        preflight(UserModelConfig(build=spec, blocks=blocks))  # before any cell: the file, build() and its blocks
        cells = model_cells(spec, blocks, backends if isinstance(backends, str) else tuple(backends), quick=quick)
    elif blocks is not None:
        raise ConfigError("sweep", "blocks", "names the blocks of model=.", "pass model= too, or drop blocks.")
    if cells is None:
        cells = default_cells(
            quick=quick, backends=backends if isinstance(backends, str) else tuple(backends), stack=stack
        )
    if isinstance(cells, (str, bytes)) or not hasattr(cells, "__iter__"):
        raise ConfigError(
            "sweep", "cells", f"{cells!r} is not a list of Cells.", "pass e.g. tk.analysis.quick_cells()."
        )
    cells = list(cells)
    bad = next((c for c in cells if not isinstance(c, Cell)), None)
    if bad is not None:
        raise ConfigError(
            "sweep",
            "cells",
            f"{bad!r} is a {type(bad).__name__}, not a Cell.",
            "pass Cells (tk.analysis.quick_cells()).",
        )
    check_int("sweep", "workers", workers, 1, 1024)
    ex = make(executor, workers=workers, warm=warm, runner=runner, **executor_options)
    folder = Folder(out) if out is not None else contextlib.nullcontext()
    device = environment()["device"]
    keys = _keys(cells, device)
    with folder:
        # `folder` is a Folder wherever `out` is given (a line skipped, a result read, a record written).
        records, skipped = read_results(cast(Folder, folder).results) if out is not None else ({}, [])
        if skipped:
            print(f"matrix: {skipped_text(cast(Folder, folder).results, skipped)}", file=sys.stderr, flush=True)
        # A cell with a result at its key was built and measured: only the others are checked for being buildable.
        runnable = [c for c in cells if c in keys and (keys[c] in records or valid(c) is None)]
        done = {k: (r["_cell"], r["_report"]) for k, r in records.items()}
        pending = [c for c in runnable if _needs_run(records.get(keys[c]), timeout_s, retry_timeouts)]
        if progress and pending:
            print(
                f"matrix: {len(pending)} of {len(runnable)} cells to run on {ex.describe()}"
                + (
                    f", {len(runnable) - len(pending)} from {cast(Folder, folder).results}"
                    if len(pending) < len(runnable)
                    else ""
                ),
                file=sys.stderr,
                flush=True,
            )
        bar = Progress(len(runnable), len(runnable) - len(pending), enabled=progress)

        def measure(jobs: list[Job]) -> None:
            for job, report in ex.run(jobs, cast(Folder, folder).path if out else None):
                done[job.key] = (job.cell, report)
                if out is not None:
                    rec = {"key": job.key, "cell": job.cell.to_dict(), "report": report.to_dict(), "limit_s": timeout_s}
                    if report.outcome == "timeout":
                        rec["timeouts"] = _timeouts(records.get(job.key), timeout_s) + 1
                    cast(Folder, folder).append(rec)
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
            failing = [r for r in result.rows if cast(Classification, r.classification).label in BARE_RERUN]
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
BARE_RERUN = tuple(label for label in SEVERITY if label not in ("crashed", "timeout", "works"))


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
        (r for r in result.rows if cast(Classification, r.classification).label != "works"),
        key=lambda r: (cast(Classification, r.classification).severity, r.cell.label),
    )
    if bad:
        lines.append((f"\nnot works ({len(bad)}):", False))
    for r in bad:
        cl = r.classification
        assert cl is not None
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
    relabeled = [
        (r, {t: c for t, c in there.items() if c.label != cast(Classification, r.classification).label})
        for r, there in changes
    ]
    relabeled = [(r, there) for r, there in relabeled if there]
    if relabeled:
        lines.append((f"\nchanged from another torch release ({len(relabeled)}):", False))
        for r, there in relabeled:
            was = ", ".join(f"{c.label} on {t}" for t, c in there.items())
            assert r.classification is not None
            lines.append((f"  {r.classification.label:20} {r.cell.label}  (was {was})", True))
    if len(changes) > len(relabeled):
        n = len(changes) - len(relabeled)
        lines.append((f"\n{n} cells save other bytes on another torch release (matrix.md says which and why)", False))
    return lines


def plan(
    cells: Iterable[Cell],
    *,
    out: str | os.PathLike,
    timeout_s: float | None = 600,
    retry_timeouts: bool = True,
    merging: Iterable[dict] = (),
) -> tuple[list[Cell], list[Cell]]:
    """`(runnable, pending)`: the cells that can be built, and those of them `sweep` would run into `out` (not in
    its results.jsonl yet, crashed, or timed out under a shorter limit) once the records `merging` (a `--merge`'s)
    were merged in by `store.replaces` — read only, nothing is run or written."""
    check_seconds("sweep", "timeout_s", timeout_s)
    check_bool("sweep", "retry_timeouts", retry_timeouts)
    check_out(out)
    results = pathlib.Path(out) / RESULTS
    records = read_records(results) if results.is_file() else {}
    for rec in merging:
        if replaces(rec, records.get(rec["key"])):
            records[rec["key"]] = rec
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
        if bare and cast(Classification, r.classification).label in BARE_RERUN:
            key = cell_key(replace(r.cell, bare=True).scenario(), device)
            if _needs_run(records.get(key), timeout_s, retry_timeouts):
                return False
    return True
