"""The matrix's results: each cell's Report and classification, grouped into the central list.

The matrix's results: each cell's Report and classification (against the same setup without AC / with full AC), grouped
into the central list; its views are `views.MatrixViews`.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
from dataclasses import dataclass, field
from typing import Any, cast

from ..instrument.records import fmt_bytes, fmt_measured_bytes
from ..measurement import Report
from . import catalogue
from .cells import Cell
from .classification import SEVERITY, Classification, classify
from .views import MatrixViews


@dataclass
class Row:
    key: str
    cell: Cell
    report: Report
    classification: Classification | None = None
    """Set for every row by the MatrixResult holding it: its readers there assert or cast it to a Classification."""
    bare: Report | None = None
    """The same cell rerun bare, with none of the probes (`Cell.bare`): set for a failing cell by the sweep."""

    @property
    def bare_verdict(self) -> str | None:
        """Does the failure show without the instrument? "yes" (the bare run fails the same way), "no" (it does
        not: the instrument caused it), "n/a" (a finding about saved bytes, which only the probes see; the bare run
        ran as the instrumented one did), None when not rerun."""
        b, r, label = self.bare, self.report, self.classification.label if self.classification else None
        if b is None or label is None:
            return None
        if label == "error":
            same = b.outcome == "error" and b.error is not None and r.error is not None and b.error.type == r.error.type
            return "yes" if same else "no"
        if not b.ok:
            return "no"  # the bare run failed where the instrumented one ran: a different problem, not this one
        if label == "grads_differ":
            return "yes" if b.numerics.grads_match is False else "no"
        same_graphs = (b.compile.graphs, b.compile.graph_breaks) == (r.compile.graphs, r.compile.graph_breaks)
        if label in ("fell_back_to_eager", "recompiles", "graph_breaks"):
            return "yes" if same_graphs else "no"
        return "n/a" if same_graphs else "no"  # sac_not_applied, ac_saves_nothing: saved bytes need the probes


@dataclass
class MatrixResult(MatrixViews):
    rows: list[Row]
    environment: dict[str, Any] = field(default_factory=dict)
    others: dict[str, "MatrixResult"] = field(default_factory=dict)
    """The same cells measured on other torch releases (from the same results.jsonl), by torch version."""

    def __post_init__(self) -> None:
        self._classify()

    def _classify(self) -> None:
        by_setup: dict[tuple, dict[str, Report]] = {}
        for r in self.rows:
            c = r.cell
            if not c.recipe:
                by_setup.setdefault(
                    (c.block, c.scope, c.fullgraph, c.order if c.ac != "none" else None, c.backend), {}
                )[c.ac] = r.report
                if c.ac == "none":
                    by_setup.setdefault((c.block, c.scope, c.fullgraph, "ac_outside", c.backend), {}).setdefault(
                        "none", r.report
                    )
        for r in self.rows:
            c = r.cell
            refs = by_setup.get((c.block, c.scope, c.fullgraph, c.order if c.ac != "none" else None, c.backend), {})
            if c.ac != "none" and "none" not in refs:
                refs = {**by_setup.get((c.block, c.scope, c.fullgraph, None, c.backend), {}), **refs}
            r.classification = classify(r.report, refs)

    def filter(
        self, *, label: str | None = None, block: str | None = None, ac: str | None = None, case: str | None = None
    ) -> "MatrixResult":
        rows = [
            r
            for r in self.rows
            if (label is None or cast(Classification, r.classification).label == label)
            and (block is None or r.cell.block == block)
            and (ac is None or r.cell.ac == ac)
            and (case is None or case in cast(Classification, r.classification).cases)
        ]
        out = MatrixResult.__new__(MatrixResult)
        out.rows, out.environment, out.others = rows, self.environment, self.others
        return out

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            assert r.classification is not None
            out[r.classification.label] = out.get(r.classification.label, 0) + 1
        return dict(sorted(out.items(), key=lambda kv: SEVERITY.index(kv[0])))

    def central_list(self) -> list[tuple[str, list[dict[str, Any]]]]:
        """`(classification, rows)` groups, most severe first; each row holds the columns the outputs show."""
        groups = []
        for label in SEVERITY:
            rows = sorted(
                (r for r in self.rows if cast(Classification, r.classification).label == label),
                key=lambda r: (r.cell.block, r.cell.ac, r.cell.compile_label),
            )
            if not rows:
                continue
            out = []
            for r in rows:
                assert r.classification is not None
                rep, ok = r.report, r.report.outcome == "ok"
                out.append(
                    {
                        "block": r.cell.block,
                        "AC": "-" if r.cell.recipe else r.cell.ac,
                        "compile": r.cell.compile_label,
                        "backend": r.cell.backend if r.cell.scope != "none" or r.cell.recipe else "eager",
                        "saved": fmt_bytes(rep.saved.total_bytes) if ok else "-",
                        "peak": fmt_measured_bytes(rep.memory.peak_bytes) if ok else "-",
                        "breaks": str(rep.compile.graph_breaks) if ok else "-",
                        "explanation": r.classification.explanation,
                        "cases": r.classification.cases,
                        "bare": r.bare_verdict or "-",
                    }
                )
            groups.append((label, out))
        return groups

    def by_case(self) -> list[dict[str, Any]]:
        """One entry per known case the cells show (most cells first): the case, its rows here, how many per
        classification, and how many cells show it on each other torch release measured."""
        seen: dict[str, list[Row]] = {}
        for r in self.rows:
            assert r.classification is not None
            for cid in r.classification.cases:
                seen.setdefault(cid, []).append(r)
        out = []
        for cid, rows in seen.items():
            labels: dict[str, int] = {}
            for r in rows:
                assert r.classification is not None
                labels[r.classification.label] = labels.get(r.classification.label, 0) + 1
            elsewhere = {
                t: sum(1 for r in o.rows if cid in cast(Classification, r.classification).cases)
                for t, o in sorted(self.others.items())
            }
            out.append({"case": catalogue.get(cid), "rows": rows, "labels": labels, "other_releases": elsewhere})
        return sorted(out, key=lambda e: (-len(e["rows"]), int(e["case"].id.lstrip("C"))))

    def backend_differences(self) -> list[tuple[Row, Row, list[str]]]:
        """Cells measured with both aot_eager and inductor whose classification or saved bytes differ:
        `(aot_eager row, inductor row, what differs)`."""
        by = {r.cell: r for r in self.rows if r.cell.backend == "aot_eager"}
        out = []
        for r in self.rows:
            if r.cell.backend != "inductor":
                continue
            a = by.get(dataclasses.replace(r.cell, backend="aot_eager"))
            if a is None:
                continue
            what = []
            assert a.classification is not None and r.classification is not None
            if a.classification.label != r.classification.label:
                what.append(f"classified {a.classification.label} vs {r.classification.label}")
            if a.report.ok and r.report.ok and a.report.saved.total_bytes != r.report.saved.total_bytes:
                what.append(f"saved {a.report.saved.total_bytes} vs {r.report.saved.total_bytes} B")
            if what:
                out.append((a, r, what))
        return out

    def torch_changes(self) -> list[tuple[Row, dict[str, "ReleaseChange"]]]:
        """Cells that classify differently, or save different bytes, on another torch release in `others`:
        (row, {torch: what it was there and why it differs}), most common cause first."""
        out = []
        for r in self.rows:
            there = {}
            for t, o in sorted(self.others.items()):
                other = o.row_of(r.cell)
                if other is not None:
                    change = release_change(r, other)
                    if change is not None:
                        there[t] = change
            if there:
                out.append((r, there))
        causes: dict[str, int] = {}
        for _, there in out:
            for c in there.values():
                causes[c.cause] = causes.get(c.cause, 0) + 1
        return sorted(out, key=lambda e: (-max(causes[c.cause] for c in e[1].values()), e[0].cell.label))

    def row_of(self, cell: Cell) -> Row | None:
        if not hasattr(self, "_by_cell"):
            self._by_cell = {r.cell: r for r in self.rows}
        return self._by_cell.get(cell)

    def label_of(self, cell: Cell) -> str | None:
        r = self.row_of(cell)
        return cast(Classification, r.classification).label if r is not None else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "environment": self.environment,
            "counts": self.counts(),
            "cells": [
                {
                    "key": r.key,
                    "cell": r.cell.to_dict(),
                    "label": r.cell.label,
                    "classification": dataclasses.asdict(cast(Classification, r.classification)),
                    "report": _compact(r.report),
                    **(
                        {"bare": {"reproduces": r.bare_verdict, "report": _compact(r.bare)}}
                        if r.bare is not None
                        else {}
                    ),
                }
                for r in self.rows
            ],
        }

    def secondary_counts(self) -> dict[str, int]:
        """Per classification, the cells that also show it behind a more severe main finding (a cell classified
        `recompiles` may have graph breaks too): what the legend adds to each main count."""
        out: dict[str, int] = {}
        for r in self.rows:
            assert r.classification is not None
            for flag in r.classification.flags:
                if flag != r.classification.label:
                    out[flag] = out.get(flag, 0) + 1
        return out

    def __str__(self) -> str:
        return f"MatrixResult: {len(self.rows)} cells: " + ", ".join(f"{v} {k}" for k, v in self.counts().items())


# What a byte difference between releases in an op's saved tensors means, where it is known (measured on the central
# list's cells; README's "Supported torch releases"). An op not here is named with its difference, unexplained.
KNOWN_SAVE_CHANGES = {
    "run_and_save_rng_state": "the compiled checkpoint's RNG stash (torch 2.14 keeps it only when the block draws "
    "random numbers)",
    "aten.full.default": "a filled buffer torch 2.13's Inductor keeps for backward and later releases do not "
    "(notebook 04 shows it op by op)",
}


@dataclass(frozen=True)
class ReleaseChange:
    """A cell as another torch release measured it: its classification, its saved bytes (None unless it ran), and
    why it differs from this release's (the classification, or the ops whose saved bytes differ, explained where
    `KNOWN_SAVE_CHANGES` knows them)."""

    label: str
    saved_bytes: int | None
    cause: str


def release_change(mine: Row, theirs: Row) -> ReleaseChange | None:
    """How `theirs` (the same cell on another release) differs from `mine`, or None when it classifies the same and
    saves the same bytes."""
    assert mine.classification is not None and theirs.classification is not None
    a, b = mine.report, theirs.report
    label = theirs.classification.label
    saved = b.saved.total_bytes if b.ok else None
    if label != mine.classification.label:
        why = f"classified {label} there"
        if b.error is not None and (a.error is None or a.error.type != b.error.type):
            why += f" ({b.error.type.rsplit('.', 1)[-1]}: {b.error.message.splitlines()[0][:120]})"
        if theirs.classification.cases:  # the case that release's failure is, as the sweep named it there
            why += f", {', '.join(theirs.classification.cases)}"
        return ReleaseChange(label, saved, why)
    if not (a.ok and b.ok) or a.saved.total_bytes == b.saved.total_bytes:
        return None
    deltas = {op: b.saved.by_op.get(op, 0) - a.saved.by_op.get(op, 0) for op in {*a.saved.by_op, *b.saved.by_op}}
    net = b.saved.total_bytes - a.saved.total_bytes
    moved = [(op, d) for op, d in sorted(deltas.items(), key=lambda e: (-abs(e[1]), e[0])) if d]
    # A storage a partition attributes to another op on another release moves bytes between ops, netting to nothing:
    # the cause is what is left once those cancel, and the one explained is the op whose difference is the net.
    known = next((KNOWN_SAVE_CHANGES[op] for op, d in moved if d == net and op in KNOWN_SAVE_CHANGES), None)
    if known is None and len(moved) == 1:
        known = KNOWN_SAVE_CHANGES.get(moved[0][0])
    ops = "; ".join(f"{op} {d:+,} B" for op, d in moved)
    cause = f"{net:+,} B there" + (f": {known}" if known else "") + (f" (by op: {ops})" if ops else "")
    return ReleaseChange(label, saved, cause)


def _compact(report: Report) -> dict[str, Any]:
    d = report.to_dict()
    d["saved"]["tensors"] = len(report.saved.tensors)
    return d


RECORDS = pathlib.Path("docs") / "central-list" / "results.jsonl.xz"
"""The committed records of the central list's sweep, on every checked release (from the repository's root): what
the upgrade page and `tk.plan` read."""


def records_path() -> pathlib.Path:
    """Where `RECORDS` is in this checkout (absent from an installed wheel: readers say so)."""
    return pathlib.Path(__file__).resolve().parents[2] / RECORDS


def by_release(records: dict[str, dict]) -> dict[str, Any]:
    """The swept cells (bare reruns left out) as one MatrixResult per torch release, classified as the matrix does;
    the releases oldest first."""
    from .catalogue import torch_release

    rows: dict[str, dict[Any, Row]] = {}
    for key, rec in records.items():
        cell, report = rec["_cell"], rec["_report"]
        release = report.environment.get("torch")
        if cell.bare or not release:
            continue
        rows.setdefault(torch_release(release), {})[cell] = Row(key, cell, report)
    oldest_first = sorted(rows, key=lambda t: tuple(int(x) for x in re.findall(r"\d+", t)))
    return {t: MatrixResult(list(rows[t].values()), {"torch": t}) for t in oldest_first}
