"""The matrix's views: markdown, a heatmap with its text twin, an offline HTML page, the files it writes.

The matrix's views: the central list as markdown, a heatmap (plotly) with its plain-text twin, a self-contained offline
HTML page, and the files `write` puts in a sweep's folder.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

from .. import _escape, _files
from ..instrument.records import fmt_bytes, fmt_measured_bytes
from ..transforms.ac import MODES
from . import catalogue
from .classification import EXPLAIN, SEVERITY

# One colour per classification, far apart in hue so that neighbouring cells never look alike: the failures that
# raise in reds and greys, the silent ones in purple / orange / ochre / blues, works in green. A combination the
# sweep did not run stays white.
COLORS = {
    "grads_differ": "#67001f",
    "crashed": "#252525",
    "timeout": "#8c8c8c",
    "error": "#e31a1c",
    "fell_back_to_eager": "#6a3d9a",
    "module_left_unwrapped": "#e7298a",
    "sac_not_applied": "#ff7f00",
    "ac_saves_nothing": "#b8860b",
    "recompiles": "#1f5fa8",
    "graph_breaks": "#41b6c4",
    "works": "#33a02c",
}
# What each cell says without hovering.
SYMBOLS = {
    "grads_differ": "GRAD≠",
    "crashed": "CRASH",
    "timeout": "TIMEOUT",
    "error": "ERROR",
    "fell_back_to_eager": "EAGER",
    "module_left_unwrapped": "NO AC",
    "sac_not_applied": "NO SAC",
    "ac_saves_nothing": "NO GAIN",
    "recompiles": "RECOMP",
    "graph_breaks": "BREAKS",
    "works": "ok",
}


class MatrixViews:
    """Views of a `MatrixResult` — its `rows`, `environment`, `others`, `counts()`, `central_list()` and
    `torch_changes()` — kept apart from the result model."""

    def changes_table(self) -> str:
        """Markdown: the cells that classify differently or save different bytes on the other torch releases measured
        (same results.jsonl), each with what it was there and why, most common cause first; when none differ, one line
        saying how many cells were compared; "" when no other release was measured."""
        changes = self.torch_changes()
        mine = self.environment.get("torch", "this torch")
        if not self.others:
            return ""
        compared = {
            t: sum(1 for r in self.rows if o.label_of(r.cell) is not None) for t, o in sorted(self.others.items())
        }
        measured = "; ".join(
            f"{n} of these {len(self.rows)} cells were also measured on torch {t}" for t, n in compared.items()
        )
        if not changes:
            return (
                f"## Changed between torch releases (0)\n\n{measured}: none classifies differently or saves other "
                f"bytes than on torch {mine}.\n"
            )
        others = sorted({t for _, there in changes for t in there})
        causes: dict[str, int] = {}
        for _, there in changes:
            for c in there.values():
                causes[c.cause] = causes.get(c.cause, 0) + 1
        lines = [
            f"## Changed between torch releases ({len(changes)})",
            "",
            f"{measured}. These classify differently or save different bytes there than on torch {mine}; each "
            "difference is named by the ops whose saved bytes differ (a classification change, by what it was and the "
            "cases it showed there), explained where the cause is known. By cause: "
            + "; ".join(f"{n} × {_escape.markdown(c)}" for c, n in sorted(causes.items(), key=lambda e: -e[1]))
            + ".",
            "",
            f"| cell | torch {mine} | " + " | ".join(f"torch {t}" for t in others) + " | why it differs |",
            "| --- | --- | " + " | ".join("---" for _ in others) + " | --- |",
        ]
        for r, there in changes:
            here = f"{r.classification.label}" + (f", {fmt_bytes(r.report.saved.total_bytes)}" if r.report.ok else "")
            cells = [
                (
                    f"{there[t].label}"
                    + (f", {fmt_bytes(there[t].saved_bytes)}" if there[t].saved_bytes is not None else "")
                )
                if t in there
                else "same"
                for t in others
            ]
            why = "; ".join(
                dict.fromkeys(f"{t}: {there[t].cause}" if len(there) > 1 else there[t].cause for t in there)
            )
            lines.append(
                f"| {_escape.markdown(r.cell.label)} | {here} | " + " | ".join(cells) + f" | {_escape.markdown(why)} |"
            )
        return "\n".join(lines) + "\n"

    def recipes_table(self, old: str = "torchtitan_0_3_0", new: str = "torchtitan_main") -> str:
        """Markdown: per block kind, what changes between two recipes (torchtitan 0.3.0 and main by default) —
        classification, saved bytes, graphs and breaks side by side; "" unless both were measured on some block."""
        by = {(r.cell.block, r.cell.recipe, r.cell.backend, r.cell.fsdp): r for r in self.rows if r.cell.recipe}
        pairs = [
            (b, by[(b, old, be, f)], by[(b, new, be, f)])
            for (b, rc, be, f) in by
            if rc == old and (b, new, be, f) in by
        ]
        if not pairs:
            return ""

        def cell(r: Any) -> str:  # a matrix Row
            rep = r.report
            if rep.outcome != "ok":
                return f"{r.classification.label}"
            return (
                f"{r.classification.label}, saved {fmt_bytes(rep.saved.total_bytes)}, "
                f"{rep.compile.graphs} graphs / {rep.compile.graph_breaks} breaks"
            )

        lines = [
            f"## Recipes: {old} → {new}",
            "",
            f"The same blocks under {old} and under {new}; a row is bold where the classification changes.",
            "",
            f"| block | {old} | {new} |",
            "| --- | --- | --- |",
        ]
        for block, a, b in pairs:
            changed = a.classification.label != b.classification.label
            name = f"**{block}**" if changed else block
            lines.append(f"| {name} | {_escape.markdown(cell(a))} | {_escape.markdown(cell(b))} |")
        return "\n".join(lines) + "\n"

    def cases_table(self, *, notebooks: str | None = "../../notebooks") -> str:
        """Markdown: the list by case — one row per known case the cells show: how many cells (by
        classification, and on other releases), the catalogue's verdict per release, status, workaround, notebook,
        upstream, and the cells themselves (collapsed). `notebooks`: the notebooks folder as a link from where the
        markdown is written (`notebooks_href`; the default fits docs/central-list), None for no links."""
        entries = self.by_case()
        if not entries:
            return ""
        lines = [
            f"## By case ({len(entries)})",
            "",
            "Each known case (`toolkit/analysis/catalogue.json`) at least one cell shows, most cells first. A working "
            "cell names a case too when it reproduces a documented baseline (C1: compile(AC(block)) works). "
            "*verified* is what the case's notebook or standalone repro checked on each release.",
            "",
            "| case | cells | other releases | verified | status | workaround | notebook | upstream |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for e in entries:
            c = e["case"]
            by, others, verified = _case_counts(e)
            cells = "<br>".join(_escape.markdown(r.cell.label) for r in e["rows"])
            href = _notebook_href(c, notebooks)
            notebook = f"[{pathlib.Path(c.notebook).stem}]({href})" if href else (c.notebook or "-")
            upstream = (
                ", ".join(f"[{u}]({link})" for u, link in zip(c.upstream, c.links))
                if c.links
                else (", ".join(c.upstream) or "-")
            )
            lines.append(
                f"| {_case_link(c.id)} {_md(c.title)} | {len(e['rows'])} ({by})<details><summary>cells</summary>"
                f"{cells}</details> | {others} | {verified} | {_md(c.status)} | {_md(c.workaround or '-')} | "
                f"{notebook} | {upstream} |"
            )
        return "\n".join(lines) + "\n"

    def backend_table(self) -> str:
        """Markdown: the cells measured with both aot_eager and inductor that classify differently or save different
        bytes; one line saying how many were compared when none differ; "" without an inductor half."""
        pairs = sum(1 for r in self.rows if r.cell.backend == "inductor")
        if not pairs:
            return ""
        diffs = self.backend_differences()
        head = [f"## aot_eager vs inductor ({len(diffs)})", ""]
        if not diffs:
            return "\n".join(
                head
                + [f"{pairs} cells measured with both backends: they classify the same and save the same bytes.", ""]
            )
        lines = head + [
            f"Of {pairs} cells measured with both backends, these classify differently or save different bytes.",
            "",
            "| cell | aot_eager | inductor | what differs |",
            "| --- | --- | --- | --- |",
        ]
        for a, i, what in diffs:
            lines.append(
                f"| {_escape.markdown(a.cell.label.rsplit(' | ', 1)[0])} | {a.classification.label} | "
                f"{i.classification.label} | "
                f"{_escape.markdown('; '.join(what))} |"
            )
        return "\n".join(lines) + "\n"

    def table(self) -> str:
        """The central list as markdown: grouped by classification, most severe first."""
        lines = []
        for label, rows in self.central_list():
            lines += [
                f"### {label} ({len(rows)}): {EXPLAIN[label]}",
                "",
                "| block | AC | compile | backend | saved | peak | breaks | explanation | known case | bare |",
                "| --- | --- | --- | --- | ---: | ---: | ---: | --- | --- | --- |",
            ]
            for c in rows:
                cases = ", ".join(_case_link(cid) for cid in c["cases"])
                lines.append(
                    f"| {c['block']} | {c['AC']} | {c['compile']} | {c['backend']} | {c['saved']} | "
                    f"{c['peak']} | {c['breaks']} | {_escape.markdown(c['explanation'])} | {cases} | {c['bare']} |"
                )
            lines.append("")
        return "\n".join(lines)

    def _panels(self) -> list[tuple[str, list[str], list[str], dict[tuple[str, str], Any]]]:
        """`(title, xs, ys, cells)` per heatmap panel: one per block kind (AC mode × compile setup), then one for the
        recipes (block kind × recipe), which fit no AC × compile grid."""
        backends = {r.cell.backend for r in self.rows if r.cell.scope != "none" or r.cell.recipe}
        several = len(backends) > 1  # otherwise the backend would only repeat on every column

        def column(c: Any) -> str:  # a Cell
            if c.recipe:
                return c.recipe + (f" · {c.backend}" if several else "")
            return c.compile_label + (f" · {c.backend}" if several and c.scope != "none" else "")

        modes = tuple(MODES)
        panels = []
        for block in dict.fromkeys(r.cell.block for r in self.rows if not r.cell.recipe):
            rows = [r for r in self.rows if r.cell.block == block and not r.cell.recipe]
            # Eager first, then the compile setups in sweep order; AC modes in ACConfig's order, "none" on top.
            xs = sorted(dict.fromkeys(column(r.cell) for r in rows), key=lambda x: not x.startswith("eager"))
            ys = sorted(
                dict.fromkeys(r.cell.ac for r in rows), key=lambda m: modes.index(m) if m in modes else len(modes)
            )
            panels.append((block, xs, ys, {(column(r.cell), r.cell.ac): r for r in rows}))
        recipes = [r for r in self.rows if r.cell.recipe]
        if recipes:
            panels.append(
                (
                    "recipes",
                    list(dict.fromkeys(column(r.cell) for r in recipes)),
                    list(dict.fromkeys(r.cell.block for r in recipes)),
                    {(column(r.cell), r.cell.block): r for r in recipes},
                )
            )
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
        fig = make_subplots(
            rows=len(heights),
            cols=1,
            subplot_titles=[p[0] for p in panels] or ["(no cells)"],
            row_heights=heights,
            vertical_spacing=min(0.12, 0.4 / len(heights)),
        )
        for pi, (title, xs, ys, cells) in enumerate(panels, start=1):
            z = [[None] * len(xs) for _ in ys]
            text = [[""] * len(xs) for _ in ys]
            hover = [["not in this sweep"] * len(xs) for _ in ys]
            for (x, y), r in cells.items():
                yi, xi = ys.index(y), xs.index(x)
                cl, rep = r.classification, r.report
                z[yi][xi] = cl.severity + 0.5
                text[yi][xi] = SYMBOLS[cl.label] + (f"<br>{' '.join(cl.cases)}" if cl.cases else "")
                hover[yi][xi] = (
                    f"{_escape.html(r.cell.label)}<br><b>{cl.label}</b>: {_escape.html(cl.explanation)}"
                    f"<br>saved {fmt_bytes(rep.saved.total_bytes)}, peak {fmt_measured_bytes(rep.memory.peak_bytes)}, "
                    f"{rep.compile.graphs} graphs, {rep.compile.graph_breaks} breaks"
                    + (f"<br>known case: {', '.join(cl.cases)}" if cl.cases else "")
                )
            fig.add_trace(
                go.Heatmap(
                    z=z,
                    x=xs,
                    y=ys,
                    text=text,
                    texttemplate="%{text}",
                    textfont=dict(size=font),
                    customdata=hover,
                    hovertemplate="%{customdata}<extra></extra>",
                    zmin=0,
                    zmax=n,
                    colorscale=colorscale,
                    showscale=pi == 1,
                    xgap=3,
                    ygap=3,
                    name=title,
                    colorbar=dict(
                        tickvals=[i + 0.5 for i in range(n)],
                        ticktext=[f"{SYMBOLS[k]}  {k}" for k in SEVERITY],
                        title="classification",
                        lenmode="pixels",
                        len=340,
                        y=1,
                        yanchor="top",
                    ),
                ),
                row=pi,
                col=1,
            )
            recipes = title == "recipes"
            # The first AC mode (or block kind) on top.
            fig.update_yaxes(autorange="reversed", title_text="block kind" if recipes else "AC mode", row=pi, col=1)
            fig.update_xaxes(title_text="recipe" if recipes else "compile setup", row=pi, col=1)
        fig.update_layout(
            title=f"AC × compile × MoE composability (torch {self.environment.get('torch', '?')}, "
            f"{self.environment.get('device', 'cpu')}); white: not in this sweep",
            height=int(48 * sum(heights) + (110 if crowded else 60) * len(heights) + 120),
            width=width,
            plot_bgcolor="white",
            margin=dict(l=130, r=40, t=90, b=40),
        )
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
                    mark = (
                        "."
                        if r is None
                        else SYMBOLS[r.classification.label]
                        + (f" {','.join(r.classification.cases)}" if r.classification.cases else "")
                    )
                    marks.append(f"{mark:<{w}}")
                lines.append(f"{y:<{width}}" + "".join(marks).rstrip())
            lines.append("")
        lines.append(", ".join(f"{SYMBOLS[k]} = {k}" for k in SEVERITY) + ", . = not in this sweep")
        lines.append(CASE_IDS)
        return "\n".join(lines)

    def write(self, out: str | os.PathLike) -> dict[str, pathlib.Path]:
        """matrix.json, matrix.md and matrix.html into `out`. The page (plotly, the slow one) is rewritten only when
        what it shows changed: its stamp, a hash of the JSON, the markdown, this file and plotly's version, is in
        its head."""
        out = pathlib.Path(out)
        out.mkdir(parents=True, exist_ok=True)
        paths = {"json": out / "matrix.json", "md": out / "matrix.md", "html": out / "matrix.html"}
        data = json.dumps(self.to_dict(), indent=1)
        env = ", ".join(f"{k} {v}" for k, v in self.environment.items())
        summary = ", ".join(f"{v} {k}" for k, v in self.counts().items())
        changes = self.changes_table()
        recipes = self.recipes_table()
        notebooks = notebooks_href(out)
        cases = self.cases_table(notebooks=notebooks)
        backends = self.backend_table()
        md = (
            f"# AC × compile × MoE: the central list\n\nGenerated by `python -m toolkit matrix` "
            f"({env}). {len(self.rows)} cells: {summary}.\n\n{BARE_LINE}\n\n"
            + (f"{cases}\n" if cases else "")
            + (f"{changes}\n" if changes else "")
            + (f"{backends}\n" if backends else "")
            + (f"{recipes}\n" if recipes else "")
            + self._by_classification()
        )
        # Each written whole or not at all (a full disk leaves the previous file as it was: `_files.WriteFailed`).
        _files.write_text(paths["json"], data)
        _files.write_text(paths["md"], md)
        stamp = _stamp(data, md)
        if _stamp_of(paths["html"]) != stamp:
            _files.write_text(paths["html"], self.html(stamp=stamp, notebooks=notebooks))
        return paths

    def _by_classification(self) -> str:
        """The central list's tables: the toolkit's and torchtitan's cells, then transformers' own models in a section
        of their own (another stack's model, its own AC and compile: not rows of the same grid)."""
        hf = [r for r in self.rows if r.cell.stack == "transformers"]
        if not hf:
            return f"## By classification\n\n{CASE_IDS}\n\n{self.table()}\n"
        own = [r for r in self.rows if r.cell.stack != "transformers"]
        out = ""
        if own:
            out += f"## By classification\n\n{CASE_IDS}\n\n{type(self)(rows=own).table()}\n"
        sub = type(self)(rows=hf)
        summary = ", ".join(f"{v} {k}" for k, v in sub.counts().items())
        head = f"## Hugging Face transformers' own models\n\n{TRANSFORMERS_LINE} {len(hf)} cells: {summary}."
        return out + f"{head}\n\n{sub.table()}\n"

    def html(self, *, stamp: str = "", notebooks: str | None = None) -> str:
        """A self-contained page: plotly.js embedded (opens offline), a legend with the counts, the heatmap, then the
        central list (with the markdown's backend column); `stamp` (what `write` checks) goes into its head.

        Every case id on the page is a link: in the by-case table to its upstream thread (or, where it has none, its
        notebook, or its own row), elsewhere to its row in that table (or, for a case the table does not show, the
        same target).
        `notebooks`: the notebooks folder as a link from the page (`write` passes it relative to the page's folder;
        the default is the folder's file:// address, None where the package was installed without them)."""
        if notebooks is None:
            notebooks = notebooks_href(None)

        plot = self.heatmap().to_html(include_plotlyjs=True, full_html=False, div_id="matrix-heatmap")
        counts, also = self.counts(), self.secondary_counts()
        legend = "".join(
            f'<div><span class="chip" style="background:{COLORS[k]}">{_escape.html(SYMBOLS[k])}</span>'
            f'<span class="count">{counts.get(k, 0)}</span>'
            + (f'<span class="also">+{also[k]} behind another finding</span>' if also.get(k) else "")
            + f" {k}: {_escape.html(EXPLAIN[k])}</div>"
            for k in SEVERITY
        )
        legend += (
            "<p>Each cell is counted once, under its most severe finding; a cell's other findings (graph breaks "
            "behind a recompile, say) are the <i>+N</i>.</p>"
        )
        parts = [f"<p>{_escape.html(BARE_LINE)}</p>"]
        entries = self.by_case()
        shown = {e["case"].id for e in entries}
        known = {c.id for c in catalogue.cases()}  # read once for the page: every row's text is linked

        def target(i: str) -> str | None:
            return f"#case-{i}" if i in shown else _case_href(i, notebooks) if i in known else None

        def text(t: str) -> str:  # escaped, every case id in it a link
            return _linked_ids(_escape.html(t), target)

        if entries:
            parts.append(
                f'<h2 id="by-case">By case ({len(entries)})</h2><table><tr><th>case</th><th>cells</th>'
                "<th>other releases</th><th>verified</th><th>status</th><th>workaround</th><th>notebook</th>"
                "<th>upstream</th></tr>"
            )
            for e in entries:
                c = e["case"]
                # A case with neither an upstream thread nor a notebook links to its own row (a permalink).
                link = _a(c.id, _case_href(c.id, notebooks) or f"#case-{c.id}")
                by, others, verified = _case_counts(e)
                cells = "<br>".join(_escape.html(r.cell.label) for r in e["rows"])
                href = _notebook_href(c, notebooks)
                nb = _a(pathlib.Path(c.notebook).stem, href) if href else _escape.html(c.notebook or "-")
                upstream = ", ".join(_a(u, link) for u, link in zip(c.upstream, c.links)) or _escape.html(
                    ", ".join(c.upstream) or "-"
                )
                parts.append(
                    f'<tr id="case-{c.id}"><td>{link} {text(c.title)}</td><td>{len(e["rows"])} ({by})<details>'
                    f"<summary>cells</summary>{cells}</details></td><td>{others}</td><td>{verified}</td>"
                    f"<td>{text(c.status)}</td><td>{text(c.workaround or '-')}</td><td>{nb}</td><td>{upstream}</td>"
                    "</tr>"
                )
            parts.append("</table>")
        diffs = self.backend_differences()
        if any(r.cell.backend == "inductor" for r in self.rows):
            parts.append(
                f"<h2>aot_eager vs inductor ({len(diffs)})</h2><table><tr><th>cell</th><th>aot_eager</th>"
                "<th>inductor</th><th>what differs</th></tr>"
            )
            parts += [
                f"<tr><td>{_escape.html(a.cell.label.rsplit(' | ', 1)[0])}</td><td>{a.classification.label}</td>"
                f"<td>{i.classification.label}</td><td>{_escape.html('; '.join(what))}</td></tr>"
                for a, i, what in diffs
            ]
            parts.append("</table>")
        parts.append(f"<h2>By classification</h2><p>{text(CASE_IDS)}</p>")
        # The explanation heads each group of cells that share it, rather than repeating in every row (the works table
        # said the same words 35 times): groups in order of first appearance, so the table keeps its order within one.
        cols = ("block", "AC", "compile", "backend", "saved", "peak", "breaks")
        for label, rows in self.central_list():
            parts.append(
                f'<h3 id="{label}"><span class="chip" style="background:{COLORS[label]}">'
                f"{_escape.html(SYMBOLS[label])}</span>{label} ({len(rows)}): {_escape.html(EXPLAIN[label])}</h3>"
                "<table><tr>" + "".join(f"<th>{c}</th>" for c in cols) + "<th>known case</th><th>bare</th></tr>"
            )
            groups: dict[str, list[dict[str, Any]]] = {}
            for c in rows:
                groups.setdefault(c["explanation"], []).append(c)
            for explanation, group in groups.items():
                parts.append(
                    f'<tr class="explanation"><td colspan="{len(cols) + 2}">{text(explanation)}'
                    + (f" <span class='n'>({len(group)} cells)</span>" if len(group) > 1 else "")
                    + "</td></tr>"
                )
                for c in group:
                    cases = ", ".join(text(i) for i in c["cases"])
                    parts.append(
                        '<tr class="cell">'
                        + "".join(f"<td>{_escape.html(c[k])}</td>" for k in cols)
                        + f"<td>{cases}</td><td>{c['bare']}</td></tr>"
                    )
            parts.append("</table>")
        env = _escape.html(", ".join(f"{k} {v}" for k, v in self.environment.items()))
        changes = self.torch_changes()
        if changes:
            others = sorted({t for _, there in changes for t in there})
            head = "".join(f"<th>torch {_escape.html(t)}</th>" for t in others)
            body = "".join(
                f"<tr><td>{_escape.html(r.cell.label)}</td><td>{r.classification.label}</td>"
                + "".join(f"<td>{there[t].label if t in there else 'same'}</td>" for t in others)
                + f"<td>{text('; '.join(dict.fromkeys(c.cause for c in there.values())))}</td>"
                + "</tr>"
                for r, there in changes
            )
            parts.insert(
                0,
                f"<h2>Changed between torch releases ({len(changes)})</h2><table><tr><th>cell</th>"
                f"<th>torch {_escape.html(self.environment.get('torch', '?'))}</th>{head}<th>why it differs</th></tr>"
                f"{body}</table>",
            )
        return (
            "<!DOCTYPE html><html><head><meta charset='utf-8'>"
            + (f'<meta name="{_STAMP}" content="{stamp}">' if stamp else "")
            + "<title>AC × compile × MoE composability</title>"
            "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin-bottom:1em}"
            "td,th{border:1px solid #ccc;padding:3px 6px;font-size:13px;text-align:left}"
            ".chip{display:inline-block;min-width:5.5em;padding:1px 6px;margin-right:8px;color:#fff;"
            "font-size:12px;font-weight:bold;text-align:center;border-radius:3px}"
            ".count{display:inline-block;min-width:2em;text-align:right;margin-right:6px;font-weight:bold}"
            ".also{color:#555;font-size:12px;margin-right:6px}"
            "tr.explanation td{background:#f3f3f3;font-style:italic}tr.explanation .n{color:#555;font-style:normal}"
            "#legend{line-height:1.8;margin:1em 0;font-size:14px}</style></head><body>"
            f"<h1>AC × compile × MoE: the central list</h1><p>{len(self.rows)} cells; {env}.</p>"
            f'<div id="legend">{legend}</div>{plot}{"".join(parts)}</body></html>'
        )


def _case_counts(entry: dict[str, Any]) -> tuple[str, str, str]:
    """A `by_case()` entry's counts as the markdown and the page both show them: cells per classification (most
    first), cells on other releases, the catalogue's verdict per release."""
    by = ", ".join(f"{n} {label}" for label, n in sorted(entry["labels"].items(), key=lambda kv: -kv[1]))
    others = ", ".join(f"{t}: {n}" for t, n in entry["other_releases"].items()) or "-"
    verified = ", ".join(f"{v} on {k}" for k, v in entry["case"].verified.items()) or "-"
    return by, others, verified


_STAMP = "toolkit-matrix-stamp"


def _stamp(data: str, md: str) -> str:
    """What the page is made of: the results (JSON), the tables (markdown, with the changes between releases), the
    code drawing it (this file) and plotly's release."""
    import hashlib
    from importlib import metadata

    try:
        plotly = metadata.version("plotly")
    except metadata.PackageNotFoundError:
        plotly = "?"
    h = hashlib.sha256()
    for part in (data, md, _files.read_capped(__file__, "views", "source", name="views.py"), plotly):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def _stamp_of(page: pathlib.Path) -> str | None:
    """The stamp in an existing page's head (its first few hundred bytes), or None."""
    import re

    raw = _files.read_head(page, 512)
    if raw is None:
        return None
    head = raw.decode("utf-8", "replace")
    found = re.search(f'<meta name="{_STAMP}" content="([0-9a-f]+)">', head)
    return found.group(1) if found else None


CASE_IDS = (
    "The ids on a cell (and in the known case column) are the catalogued cases its result matches; on a working "
    "cell they name the documented behaviour it reproduces (C1: compile(AC(block)) works; C3: per-child compile)."
)
BARE_LINE = (
    "bare: every failing cell is rerun with none of the toolkit's probes (outcome, graphs and gradients only). yes: "
    "it fails the same way without the instrument; no: the instrument caused it; n/a: a finding about saved bytes, "
    "which only the probes see (the bare run ran as the instrumented one did)."
)

TRANSFORMERS_LINE = (
    "`matrix --stack transformers`: transformers' own models (`hf:FAMILY`, `hf:FAMILY:EXPERTS` for an "
    "`experts_implementation` other than its default), its own activation checkpointing (full = `use_reentrant=False`, "
    "reentrant, selective_op = a per-op SAC `context_fn`, selective_layer = `every_n_layers`) and its users' compiles "
    "(`model.compile()`, `layer.compile()` per decoder layer)."
)


def _md(text: str) -> str:
    """The catalogue's own text (its titles, statuses and workarounds are Markdown written here) in a table cell:
    pipes and line breaks only. Anything read from a record goes through `_escape.markdown`."""
    return text.replace("|", "\\|").replace("\n", " ")


def notebooks_href(out: str | os.PathLike | None) -> str | None:
    """The notebooks folder as a link from files written into `out`: relative (it survives moving the repository),
    or its file:// address when `out` is None; None when the toolkit was installed without its notebooks."""
    here = pathlib.Path(__file__).resolve().parents[2] / "notebooks"
    if not here.is_dir():
        return None
    if out is None:
        return here.as_uri()
    return pathlib.Path(os.path.relpath(here, pathlib.Path(out).resolve())).as_posix()


def _notebook_href(case: catalogue.Case, notebooks: str | None) -> str | None:
    """A case's bug notebook as a link from where `notebooks` is the notebooks folder; None without either."""
    return f"{notebooks}/{case.notebook}" if case.notebook and notebooks else None


def _case_href(case_id: str, notebooks: str | None) -> str | None:
    """Where a case id links: its upstream thread, else its bug notebook, else nowhere (None)."""
    case = catalogue.get(case_id)
    return case.links[0] if case.links else _notebook_href(case, notebooks)


def _a(text: str, href: str | None) -> str:
    return f'<a href="{_escape.html(href)}">{_escape.html(text)}</a>' if href else _escape.html(text)


def _linked_ids(escaped: str, href) -> str:
    """`escaped` (already HTML-escaped) with each case id made a link to `href(id)` (None: left as text)."""
    import re

    def link(m: re.Match) -> str:
        target = href(m.group(0))
        return _a(m.group(0), target) if target else m.group(0)

    return re.sub(r"(?<![\w/#.-])C\d+\b", link, escaped)


def _case_link(case_id: str) -> str:
    case = catalogue.get(case_id)
    return f"[{case_id}]({case.links[0]})" if case.links else case_id
