"""The matrix as a heatmap (plotly): one panel per block kind, AC mode × compile setup, and its plain-text twin."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ... import _escape
from ...instrument.records import fmt_bytes, fmt_measured_bytes
from ...transforms.ac import MODES
from ..classification import SEVERITY
from .links import CASE_IDS

if TYPE_CHECKING:
    from ..matrix import MatrixResult

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


def _panels(m: MatrixResult) -> list[tuple[str, list[str], list[str], dict[tuple[str, str], Any]]]:
    """`(title, xs, ys, cells)` per heatmap panel: one per block kind (AC mode × compile setup), then one for the
    recipes (block kind × recipe), which fit no AC × compile grid."""
    backends = {r.cell.backend for r in m.rows if r.cell.scope != "none" or r.cell.recipe}
    several = len(backends) > 1  # otherwise the backend would only repeat on every column

    def column(c: Any) -> str:  # a Cell
        if c.recipe:
            return c.recipe + (f" · {c.backend}" if several else "")
        return c.compile_label + (f" · {c.backend}" if several and c.scope != "none" else "")

    modes = tuple(MODES)
    panels = []
    for block in dict.fromkeys(r.cell.block for r in m.rows if not r.cell.recipe):
        rows = [r for r in m.rows if r.cell.block == block and not r.cell.recipe]
        # Eager first, then the compile setups in sweep order; AC modes in ACConfig's order, "none" on top.
        xs = sorted(dict.fromkeys(column(r.cell) for r in rows), key=lambda x: not x.startswith("eager"))
        ys = sorted(dict.fromkeys(r.cell.ac for r in rows), key=lambda m: modes.index(m) if m in modes else len(modes))
        panels.append((block, xs, ys, {(column(r.cell), r.cell.ac): r for r in rows}))
    recipes = [r for r in m.rows if r.cell.recipe]
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


def figure(m: MatrixResult) -> Any:
    """A plotly figure: per block kind, classification by AC mode × compile setup, then the recipes in a panel of
    their own; each cell names its classification (and first known case), hover for the details. The
    plain-text twin is `grid_text()`."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    panels = _panels(m)
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
        title=f"AC × compile × MoE composability (torch {m.environment.get('torch', '?')}, "
        f"{m.environment.get('device', 'cpu')}); white: not in this sweep",
        height=int(48 * sum(heights) + (110 if crowded else 60) * len(heights) + 120),
        width=width,
        plot_bgcolor="white",
        margin=dict(l=130, r=40, t=90, b=40),
    )
    # Slanted to the left, long setup names stay clear of the colour bar on the right.
    fig.update_xaxes(tickangle=-35 if crowded else 0)
    return fig


def grid_text(m: MatrixResult) -> str:
    """The plain-text twin of `heatmap()`: each panel as a grid of classification symbols."""
    lines = []
    for title, xs, ys, cells in _panels(m):
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
