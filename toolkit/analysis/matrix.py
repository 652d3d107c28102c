"""The composability matrix: cells (block kind × AC mode × compile scope × order × backend, and recipes), their classified results, and the central list as JSON, markdown and an offline HTML page."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch

from .. import compat
from .._config import ConfigError, literal_choices
from ..measure import Report, Scenario, check_structure, fmt_bytes
from ..measure.report import fmt_measured_bytes
from ..models import ModelConfig
from ..transforms import ACConfig, CompileConfig
from . import catalogue
from .classification import EXPLAIN, SEVERITY, Classification, classify

BLOCKS = ("dense", "moe:for_loop", "moe:grouped_mm", "moe:masked", "moe:nonzero")
# The torch_remat AC modes of a cell: "remat" (full recompute, routing kept) and torchtitan main's selective policy.
REMAT_ACS = ("remat", "remat_selective")

# One colour per classification, far apart in hue so that neighbouring cells never look alike: the failures that
# raise in reds and greys, the silent ones in purple / orange / ochre / blues, works in green. A combination the
# sweep did not run stays white.
COLORS = {"grads_differ": "#67001f", "crashed": "#252525", "timeout": "#8c8c8c", "error": "#e31a1c",
          "fell_back_to_eager": "#6a3d9a", "sac_not_applied": "#ff7f00", "ac_saves_nothing": "#b8860b",
          "recompiles": "#1f5fa8", "graph_breaks": "#41b6c4", "works": "#33a02c"}
# What each cell says without hovering.
SYMBOLS = {"grads_differ": "GRAD≠", "crashed": "CRASH", "timeout": "TIMEOUT", "error": "ERROR",
           "fell_back_to_eager": "EAGER", "sac_not_applied": "NO SAC", "ac_saves_nothing": "NO GAIN",
           "recompiles": "RECOMP", "graph_breaks": "BREAKS", "works": "ok"}


@dataclass(frozen=True)
class Cell:
    """One point of the matrix; `scenario()` turns it into something `run` measures."""

    block: str = "moe:for_loop"
    ac: str = "none"
    scope: str = "none"
    fullgraph: bool = False
    order: str | None = None
    backend: str = "aot_eager"
    recipe: str | None = None
    fsdp: str = "none"
    """FSDP2 (`Scenario.fsdp`): "none", "blocks" or "blocks+experts", on one gloo rank."""

    @property
    def stack(self) -> str:
        """"torchtitan" for the blocks named `titan:FAMILY` (torchtitan's own model and transforms)."""
        return "torchtitan" if self.block.startswith("titan:") else "toolkit"

    def model_config(self) -> ModelConfig:
        # The 2025 recipes rebuild PR #2052's era: its layout (`moe.experts`), and for PR #2052 itself the
        # FSDP-like graph-breaking hook on the experts. grouped_mm runs in bfloat16 in the 0.3.0 layout.
        layout = "torchtitan_2025" if self.recipe and self.recipe.startswith("torchtitan_2025") else "torchtitan_0_3_0"
        if self.block == "dense":
            return ModelConfig(moe_layers="none", layout=layout)
        impl = self.block.split(":", 1)[1]
        return ModelConfig(layout=layout, experts_impl=impl,
                           dtype="bfloat16" if impl == "grouped_mm" and layout == "torchtitan_2025" else "float32",
                           # PR #2052's hook stands in for FSDP's; with real FSDP2 the hook is FSDP's own.
                           experts_graph_break=self.recipe == "torchtitan_2025_09" and self.fsdp == "none")

    def scenario(self) -> Scenario:
        common = dict(name=self.label, steady_steps=1, fsdp=self.fsdp)
        if self.stack == "torchtitan":
            from ..stacks.torchtitan import TorchtitanConfig

            config = TorchtitanConfig.of_family(self.block.split(":", 1)[1])
            comp = CompileConfig.of(self.scope, backend=self.backend, fullgraph=self.fullgraph)
            return Scenario(stack="torchtitan", torchtitan=config, ac=ACConfig(mode=self.ac), compile=comp, **common)
        if self.recipe:
            return Scenario(model=self.model_config(), recipe=self.recipe, recipe_backend=self.backend, **common)
        ac = ACConfig(mode=self.ac, memory_budget=0.3) if self.ac == "memory_budget" else \
            ACConfig.remat_selective() if self.ac == "remat_selective" else ACConfig(mode=self.ac)
        comp = CompileConfig.of(self.scope, backend=self.backend, fullgraph=self.fullgraph, order=self.order)
        return Scenario(model=self.model_config(), ac=ac, compile=comp, **common)

    @property
    def compile_label(self) -> str:
        sharded = f" + FSDP {self.fsdp}" if self.fsdp != "none" else ""
        if self.recipe:
            return f"recipe {self.recipe}{sharded}"
        if self.scope == "none":
            return "eager" + sharded
        extra = [x for x in ("fullgraph" if self.fullgraph else "", "AC outside" if self.order == "ac_outside" else "") if x]
        return self.scope + (f" ({', '.join(extra)})" if extra else "") + sharded

    @property
    def label(self) -> str:
        if self.recipe:
            return f"{self.block} | {self.compile_label} | {self.backend}"
        return f"{self.block} | AC {self.ac} | {self.compile_label} | {self.backend if self.scope != 'none' else 'eager'}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _scopes(block: str) -> tuple[str, ...]:
    return ("none", "model", "blocks", "attention", "feed_forward") if block == "dense" else \
        ("none", "model", "blocks", "attention", "moe", "experts")


def quick_cells(backends: Iterable[str] = ("aot_eager",)) -> list[Cell]:
    """The default sweep: 3 block kinds × 3 AC modes × 4 compile setups, per backend, plus the recipes."""
    cells = []
    for backend in backends:
        for block in ("dense", "moe:for_loop", "moe:masked"):
            for ac in ("none", "full", "selective_op"):
                cells.append(Cell(block, ac))
                for scope, fullgraph in (("blocks", False), ("blocks", True), ("attention", False)):
                    cells.append(Cell(block, ac, scope, fullgraph, backend=backend))
        for recipe in ("torchtitan_2025_09", "torchtitan_2025_12", "torchtitan_0_3_0") + \
                (("torchtitan_main",) if compat.available("torch_remat") else ()):
            cells.append(Cell("moe:for_loop", recipe=recipe, backend=backend))
    return _dedupe(cells)


def full_cells(backends: Iterable[str] = ("aot_eager",)) -> list[Cell]:
    """Every combination the toolkit can build: block kinds × AC modes × scopes × fullgraph × order × backends."""
    cells = []
    for backend in backends:
        for block in BLOCKS:
            for ac in ("none", "full", "selective_op", "selective_layer", "per_submodule", "memory_budget"):
                for scope in _scopes(block):
                    if scope == "none":
                        if ac != "memory_budget":
                            cells.append(Cell(block, ac))
                        continue
                    for fullgraph in (False, True):
                        for order in ((None,) if ac in ("none", "memory_budget") else (None, "ac_outside")):
                            cells.append(Cell(block, ac, scope, fullgraph, order, backend))
        # torchtitan main's torch_remat (`pip install torch-remat`): full recompute and its selective policy, eager
        # or compiled whole (compile(remat)) or inside the blocks (torchtitan main's way); no "AC outside" order,
        # since remat replaces the forward instead of wrapping it.
        for ac in REMAT_ACS if compat.available("torch_remat") else ():
            for block in BLOCKS:
                for scope in _scopes(block):
                    for fullgraph in ((False,) if scope == "none" else (False, True)):
                        cells.append(Cell(block, ac, scope, fullgraph, None, backend) if scope != "none" else Cell(block, ac))
        from ..transforms.recipes import NEEDS, RECIPES

        for recipe in RECIPES:
            if recipe in NEEDS and not compat.available(NEEDS[recipe]):
                continue
            for block in BLOCKS[1:]:
                cells.append(Cell(block, recipe=recipe, backend=backend))
        # Real FSDP2 (one gloo rank): blocks sharded, and the experts sharded on their own — the layout behind
        # PR #2052 (C4), which the 2025-09 recipe then compiles through.
        for block in ("dense", "moe:masked"):
            for fsdp in ("blocks",) + (("blocks+experts",) if block != "dense" else ()):
                for ac in ("none", "full", "selective_op"):
                    cells.append(Cell(block, ac, fsdp=fsdp))
                    cells.append(Cell(block, ac, "blocks", True, backend=backend, fsdp=fsdp))
        for fsdp in ("blocks", "blocks+experts"):
            cells.append(Cell("moe:for_loop", recipe="torchtitan_2025_09", backend=backend, fsdp=fsdp))
    return _dedupe(cells)


TORCHTITAN_BLOCKS = ("titan:qwen3_moe", "titan:deepseek_v3")


def torchtitan_cells(backends: Iterable[str] = ("aot_eager",)) -> list[Cell]:
    """torchtitan's own models with its own transforms (`stack="torchtitan"`): each family × its AC modes × eager
    or its compile (blocks whole, fullgraph) × without / with its FSDP2. Needs torchtitan installed."""
    cells = []
    for backend in backends:
        for block in TORCHTITAN_BLOCKS:
            for ac in ("none", "full", "selective_op"):
                for fsdp in ("none", "blocks"):
                    cells.append(Cell(block, ac, fsdp=fsdp))
                    cells.append(Cell(block, ac, "blocks", True, backend=backend, fsdp=fsdp))
    return _dedupe(cells)


def _dedupe(cells: list[Cell]) -> list[Cell]:
    seen, out = set(), []
    for c in cells:
        if c not in seen:
            seen.add(c)
            out.append(c)
    return out


def valid(cell: Cell) -> str | None:
    """Why a cell cannot be built (an invalid combination), or None. Cheap: builds and transforms, runs nothing."""
    try:
        check_structure(cell.scenario())
    except ConfigError as e:
        return str(e)
    return None


# ACConfig fields added after results were first recorded: left out of the key while unset, so that the results
# of every cell that does not use them stay valid.
_LATER_AC_FIELDS = ("save_regions", "recompute_regions")


def cell_key(scenario: Scenario, device: str = "cpu") -> str:
    """Cache key: the scenario, the torch version and the device."""
    data = scenario.to_dict()
    if isinstance(data.get("ac"), dict):
        data["ac"] = {k: v for k, v in data["ac"].items() if not (k in _LATER_AC_FIELDS and v is None)}
    blob = json.dumps({"scenario": data, "torch": torch.__version__, "device": device}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass
class Row:
    key: str
    cell: Cell
    report: Report
    classification: Classification | None = None


@dataclass
class MatrixResult:
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
                by_setup.setdefault((c.block, c.scope, c.fullgraph, c.order if c.ac != "none" else None, c.backend), {})[c.ac] = r.report
                if c.ac == "none":
                    by_setup.setdefault((c.block, c.scope, c.fullgraph, "ac_outside", c.backend), {}).setdefault("none", r.report)
        for r in self.rows:
            c = r.cell
            refs = by_setup.get((c.block, c.scope, c.fullgraph, c.order if c.ac != "none" else None, c.backend), {})
            if c.ac != "none" and "none" not in refs:
                refs = {**by_setup.get((c.block, c.scope, c.fullgraph, None, c.backend), {}), **refs}
            r.classification = classify(r.report, refs)

    def filter(self, *, label: str | None = None, block: str | None = None, ac: str | None = None,
               case: str | None = None) -> "MatrixResult":
        rows = [r for r in self.rows if (label is None or r.classification.label == label)
                and (block is None or r.cell.block == block) and (ac is None or r.cell.ac == ac)
                and (case is None or case in r.classification.cases)]
        out = MatrixResult.__new__(MatrixResult)
        out.rows, out.environment, out.others = rows, self.environment, self.others
        return out

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            out[r.classification.label] = out.get(r.classification.label, 0) + 1
        return dict(sorted(out.items(), key=lambda kv: SEVERITY.index(kv[0])))

    def central_list(self) -> list[tuple[str, list[dict[str, Any]]]]:
        """`(classification, rows)` groups, most severe first; each row holds the columns the outputs show."""
        groups = []
        for label in SEVERITY:
            rows = sorted((r for r in self.rows if r.classification.label == label),
                          key=lambda r: (r.cell.block, r.cell.ac, r.cell.compile_label))
            if not rows:
                continue
            out = []
            for r in rows:
                rep, ok = r.report, r.report.outcome == "ok"
                out.append({"block": r.cell.block, "AC": "-" if r.cell.recipe else r.cell.ac,
                            "compile": r.cell.compile_label,
                            "backend": r.cell.backend if r.cell.scope != "none" or r.cell.recipe else "eager",
                            "saved": fmt_bytes(rep.saved.total_bytes) if ok else "-",
                            "peak": fmt_measured_bytes(rep.memory.peak_bytes) if ok else "-",
                            "breaks": str(rep.compile.graph_breaks) if ok else "-",
                            "explanation": r.classification.explanation, "cases": r.classification.cases})
            groups.append((label, out))
        return groups

    def torch_changes(self) -> list[tuple[Row, dict[str, str]]]:
        """Cells whose classification differs on another torch release in `others`: (row, {torch: label})."""
        out = []
        for r in self.rows:
            there = {t: o.label_of(r.cell) for t, o in sorted(self.others.items())}
            there = {t: lab for t, lab in there.items() if lab is not None and lab != r.classification.label}
            if there:
                out.append((r, there))
        return out

    def label_of(self, cell: Cell) -> str | None:
        for r in self.rows:
            if r.cell == cell:
                return r.classification.label
        return None

    def changes_table(self) -> str:
        """Markdown: the cells that change between this torch and the others measured; when none do, one line saying
        so (with how many cells were compared); "" when no other release was measured."""
        changes = self.torch_changes()
        mine = self.environment.get("torch", "this torch")
        if not changes:
            if not self.others:
                return ""
            compared = {t: sum(1 for r in self.rows if o.label_of(r.cell) is not None) for t, o in sorted(self.others.items())}
            return ("## Changed between torch releases (0)\n\n" + "; ".join(
                f"{n} of these {len(self.rows)} cells were also measured on torch {t}" for t, n in compared.items())
                + f": none is classified differently from torch {mine}.\n")
        others = sorted({t for _, there in changes for t in there})
        lines = [f"## Changed between torch releases ({len(changes)})", "",
                 f"Cells classified differently on torch {mine} and on {', '.join(others)} (same results.jsonl).", "",
                 f"| cell | torch {mine} | " + " | ".join(f"torch {t}" for t in others) + " |",
                 "| --- | --- | " + " | ".join("---" for _ in others) + " |"]
        for r, there in changes:
            lines.append(f"| {_md(r.cell.label)} | {r.classification.label} | "
                         + " | ".join(there.get(t, "same") for t in others) + " |")
        return "\n".join(lines) + "\n"

    def recipes_table(self, old: str = "torchtitan_0_3_0", new: str = "torchtitan_main") -> str:
        """Markdown: per block kind, what changes between two recipes (torchtitan 0.3.0 and main by default) —
        classification, saved bytes, graphs and breaks side by side; "" unless both were measured on some block."""
        by = {(r.cell.block, r.cell.recipe, r.cell.backend, r.cell.fsdp): r for r in self.rows if r.cell.recipe}
        pairs = [(b, by[(b, old, be, f)], by[(b, new, be, f)]) for (b, rc, be, f) in by
                 if rc == old and (b, new, be, f) in by]
        if not pairs:
            return ""

        def cell(r: Row) -> str:
            rep = r.report
            if rep.outcome != "ok":
                return f"{r.classification.label}"
            return (f"{r.classification.label}, saved {fmt_bytes(rep.saved.total_bytes)}, "
                    f"{rep.compile.graphs} graphs / {rep.compile.graph_breaks} breaks")

        lines = [f"## Recipes: {old} → {new}", "",
                 f"The same blocks under {old} and under {new}; a row is bold where the classification changes.", "",
                 f"| block | {old} | {new} |", "| --- | --- | --- |"]
        for block, a, b in pairs:
            changed = a.classification.label != b.classification.label
            name = f"**{block}**" if changed else block
            lines.append(f"| {name} | {_md(cell(a))} | {_md(cell(b))} |")
        return "\n".join(lines) + "\n"

    def table(self) -> str:
        """The central list as markdown: grouped by classification, most severe first."""
        lines = []
        for label, rows in self.central_list():
            lines += [f"### {label} ({len(rows)}): {EXPLAIN[label]}", "",
                      "| block | AC | compile | backend | saved | peak | breaks | explanation | known case |",
                      "| --- | --- | --- | --- | ---: | ---: | ---: | --- | --- |"]
            for c in rows:
                cases = ", ".join(_case_link(cid) for cid in c["cases"])
                lines.append(f"| {c['block']} | {c['AC']} | {c['compile']} | {c['backend']} | {c['saved']} | "
                             f"{c['peak']} | {c['breaks']} | {_md(c['explanation'])} | {cases} |")
            lines.append("")
        return "\n".join(lines)

    def _panels(self) -> list[tuple[str, list[str], list[str], dict[tuple[str, str], Row]]]:
        """`(title, xs, ys, cells)` per heatmap panel: one per block kind (AC mode × compile setup), then one for the
        recipes (block kind × recipe), which fit no AC × compile grid."""
        backends = {r.cell.backend for r in self.rows if r.cell.scope != "none" or r.cell.recipe}
        several = len(backends) > 1  # otherwise the backend would only repeat on every column

        def column(c: Cell) -> str:
            if c.recipe:
                return c.recipe + (f" · {c.backend}" if several else "")
            return c.compile_label + (f" · {c.backend}" if several and c.scope != "none" else "")

        modes = literal_choices(ACConfig, "mode")
        panels = []
        for block in dict.fromkeys(r.cell.block for r in self.rows if not r.cell.recipe):
            rows = [r for r in self.rows if r.cell.block == block and not r.cell.recipe]
            # Eager first, then the compile setups in sweep order; AC modes in ACConfig's order, "none" on top.
            xs = sorted(dict.fromkeys(column(r.cell) for r in rows), key=lambda x: not x.startswith("eager"))
            ys = sorted(dict.fromkeys(r.cell.ac for r in rows), key=lambda m: modes.index(m) if m in modes else len(modes))
            panels.append((block, xs, ys, {(column(r.cell), r.cell.ac): r for r in rows}))
        recipes = [r for r in self.rows if r.cell.recipe]
        if recipes:
            panels.append(("recipes", list(dict.fromkeys(column(r.cell) for r in recipes)),
                           list(dict.fromkeys(r.cell.block for r in recipes)),
                           {(column(r.cell), r.cell.block): r for r in recipes}))
        return panels

    def heatmap(self):
        """A plotly figure: per block kind, classification by AC mode × compile setup, then the recipes in a panel of
        their own; each cell names its classification (and first known case), hover for the details. The
        plain-text twin is `grid_text()`."""
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        panels = self._panels()
        n = len(SEVERITY)
        colorscale = []
        for i, label in enumerate(SEVERITY):
            colorscale += [[i / n, COLORS[label]], [(i + 1) / n, COLORS[label]]]
        # Panel heights follow their number of rows (+1 for the title and the tick labels).
        heights = [len(ys) + 1 for _, _, ys, _ in panels] or [1]
        # A full sweep has ~20 compile setups per block kind: past a dozen the page grows wider than the window
        # (~80 px a column, room for "NO GAIN") instead of squeezing the labels out of their cells.
        widest = max([len(xs) for _, xs, _, _ in panels] or [1])
        crowded = widest > 8
        font = 9 if crowded else 11
        width = 80 * widest + 330 if widest > 12 else None
        fig = make_subplots(rows=len(heights), cols=1, subplot_titles=[p[0] for p in panels] or ["(no cells)"],
                            row_heights=heights, vertical_spacing=min(0.12, 0.4 / len(heights)))
        for pi, (title, xs, ys, cells) in enumerate(panels, start=1):
            z = [[None] * len(xs) for _ in ys]
            text = [[""] * len(xs) for _ in ys]
            hover = [["not in this sweep"] * len(xs) for _ in ys]
            for (x, y), r in cells.items():
                yi, xi = ys.index(y), xs.index(x)
                cl, rep = r.classification, r.report
                z[yi][xi] = cl.severity + 0.5
                text[yi][xi] = SYMBOLS[cl.label] + (f"<br>{cl.cases[0]}" if cl.cases else "")
                hover[yi][xi] = (f"{_html(r.cell.label)}<br><b>{cl.label}</b>: {_html(cl.explanation)}"
                                 f"<br>saved {fmt_bytes(rep.saved.total_bytes)}, peak {fmt_measured_bytes(rep.memory.peak_bytes)}, "
                                 f"{rep.compile.graphs} graphs, {rep.compile.graph_breaks} breaks"
                                 + (f"<br>known case: {', '.join(cl.cases)}" if cl.cases else ""))
            fig.add_trace(go.Heatmap(z=z, x=xs, y=ys, text=text, texttemplate="%{text}", textfont=dict(size=font),
                                     customdata=hover, hovertemplate="%{customdata}<extra></extra>", zmin=0, zmax=n,
                                     colorscale=colorscale, showscale=pi == 1, xgap=3, ygap=3, name=title,
                                     colorbar=dict(tickvals=[i + 0.5 for i in range(n)],
                                                   ticktext=[f"{SYMBOLS[k]}  {k}" for k in SEVERITY],
                                                   title="classification", lenmode="pixels", len=340, y=1,
                                                   yanchor="top")),
                          row=pi, col=1)
            fig.update_yaxes(autorange="reversed", row=pi, col=1)  # the first AC mode (or block kind) on top
        fig.update_layout(title=f"AC × compile × MoE composability (torch {self.environment.get('torch', '?')}, "
                                f"{self.environment.get('device', 'cpu')}); white: not in this sweep",
                          height=int(48 * sum(heights) + (110 if crowded else 60) * len(heights) + 120), width=width,
                          plot_bgcolor="white", margin=dict(l=130, r=40, t=90, b=40))
        # Slanted to the left, long setup names stay clear of the colour bar on the right.
        fig.update_xaxes(tickangle=-35 if crowded else 0)
        return fig

    def grid_text(self) -> str:
        """The plain-text twin of `heatmap()`: each panel as a grid of classification symbols."""
        lines = []
        for title, xs, ys, cells in self._panels():
            width = max([len(title)] + [len(y) for y in ys]) + 2
            cols = [max(len(x), 11) + 2 for x in xs]
            lines.append(f"{title:<{width}}" + "".join(f"{x:<{w}}" for x, w in zip(xs, cols)).rstrip())
            for y in ys:
                marks = []
                for x, w in zip(xs, cols):
                    r = cells.get((x, y))
                    mark = "." if r is None else SYMBOLS[r.classification.label] + (
                        f" {r.classification.cases[0]}" if r.classification.cases else "")
                    marks.append(f"{mark:<{w}}")
                lines.append(f"{y:<{width}}" + "".join(marks).rstrip())
            lines.append("")
        lines.append(", ".join(f"{SYMBOLS[k]} = {k}" for k in SEVERITY) + ", . = not in this sweep")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"environment": self.environment, "counts": self.counts(), "cells": [
            {"key": r.key, "cell": r.cell.to_dict(), "label": r.cell.label,
             "classification": dataclasses.asdict(r.classification), "report": _compact(r.report)} for r in self.rows]}

    def write(self, out: str | os.PathLike) -> dict[str, pathlib.Path]:
        out = pathlib.Path(out)
        out.mkdir(parents=True, exist_ok=True)
        paths = {"json": out / "matrix.json", "md": out / "matrix.md", "html": out / "matrix.html"}
        paths["json"].write_text(json.dumps(self.to_dict(), indent=1))
        env = ", ".join(f"{k} {v}" for k, v in self.environment.items())
        summary = ", ".join(f"{v} {k}" for k, v in self.counts().items())
        changes = self.changes_table()
        recipes = self.recipes_table()
        paths["md"].write_text(f"# AC × compile × MoE: the central list\n\nGenerated by `python -m toolkit matrix` "
                               f"({env}). {len(self.rows)} cells: {summary}.\n\n"
                               + (f"{changes}\n" if changes else "") + (f"{recipes}\n" if recipes else "")
                               + f"{self.table()}\n")
        paths["html"].write_text(self.html())
        return paths

    def html(self) -> str:
        """A self-contained page: plotly.js embedded (opens offline), a legend with the counts, the heatmap, then the
        central list (with the markdown's backend column)."""
        import html as _h

        plot = self.heatmap().to_html(include_plotlyjs=True, full_html=False, div_id="matrix-heatmap")
        counts = self.counts()
        legend = "".join(f'<div><span class="chip" style="background:{COLORS[k]}">{_h.escape(SYMBOLS[k])}</span>'
                         f'<span class="count">{counts.get(k, 0)}</span> {k}: {_h.escape(EXPLAIN[k])}</div>'
                         for k in SEVERITY)
        parts = []
        cols = ("block", "AC", "compile", "backend", "saved", "peak", "breaks", "explanation")
        for label, rows in self.central_list():
            parts.append(f'<h3 id="{label}"><span class="chip" style="background:{COLORS[label]}">'
                         f'{_h.escape(SYMBOLS[label])}</span>{label} ({len(rows)}): {_h.escape(EXPLAIN[label])}</h3>'
                         "<table><tr>" + "".join(f"<th>{c}</th>" for c in cols) + "<th>known case</th></tr>")
            for c in rows:
                cases = ", ".join(f'<a href="{_h.escape(catalogue.get(i).links[0])}">{i}</a>' if catalogue.get(i).links
                                  else i for i in c["cases"])
                parts.append("<tr>" + "".join(f"<td>{_h.escape(c[k])}</td>" for k in cols) + f"<td>{cases}</td></tr>")
            parts.append("</table>")
        env = _h.escape(", ".join(f"{k} {v}" for k, v in self.environment.items()))
        changes = self.torch_changes()
        if changes:
            others = sorted({t for _, there in changes for t in there})
            head = "".join(f"<th>torch {_h.escape(t)}</th>" for t in others)
            body = "".join(f"<tr><td>{_h.escape(r.cell.label)}</td><td>{r.classification.label}</td>"
                           + "".join(f"<td>{there.get(t, 'same')}</td>" for t in others) + "</tr>"
                           for r, there in changes)
            parts.insert(0, f"<h2>Changed between torch releases ({len(changes)})</h2><table><tr><th>cell</th>"
                            f"<th>torch {_h.escape(str(self.environment.get('torch', '?')))}</th>{head}</tr>{body}</table>")
        return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>AC × compile × MoE composability</title>"
                "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin-bottom:1em}"
                "td,th{border:1px solid #ccc;padding:3px 6px;font-size:13px;text-align:left}"
                ".chip{display:inline-block;min-width:5.5em;padding:1px 6px;margin-right:8px;color:#fff;"
                "font-size:12px;font-weight:bold;text-align:center;border-radius:3px}"
                ".count{display:inline-block;min-width:2em;text-align:right;margin-right:6px;font-weight:bold}"
                "#legend{line-height:1.8;margin:1em 0;font-size:14px}</style></head><body>"
                f"<h1>AC × compile × MoE: the central list</h1><p>{len(self.rows)} cells; {env}.</p>"
                f'<div id="legend">{legend}</div>{plot}{"".join(parts)}</body></html>')

    def __str__(self) -> str:
        return f"MatrixResult: {len(self.rows)} cells: " + ", ".join(f"{v} {k}" for k, v in self.counts().items())


def _compact(report: Report) -> dict[str, Any]:
    d = report.to_dict()
    d["saved"]["tensors"] = len(report.saved.tensors)
    return d


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _html(text: str) -> str:
    import html

    return html.escape(text)


def _case_link(case_id: str) -> str:
    case = catalogue.get(case_id)
    return f"[{case_id}]({case.links[0]})" if case.links else case_id


def __getattr__(name: str) -> Any:
    # `tk.matrix.sweep(...)` as before the sweeps moved to their own module.
    if name in ("sweep", "load_results", "main"):
        from . import sweeps

        return getattr(sweeps, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
