"""The matrix as one static SVG picture (no script, no font to fetch): a square per cell, grouped by block kind and
compile setup, coloured by classification, with the legend's counts.

A row per block kind; a column per compile scope under each backend (the uncompiled cells first, a recipe's cells
under "recipe"). Each group holds its cells as small squares, most severe first, so a single cell of a rare
classification (8 silently wrong gradients among 1,961 cells) shows as plainly as a hundred of a common one: the
picture a page that shows only its image (README) can carry, where the plotly heatmap needs a browser.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ... import _escape
from ...transforms.compile import SCOPES
from ..classification import SEVERITY
from .heatmap import COLORS
from .links import classified

if TYPE_CHECKING:
    from ..matrix import MatrixResult, Row

_UNCOMPILED = ("", "none")
"""The column of the cells that compile nothing (their backend is unused)."""
_HOW = "a square per cell, most severe first; a row per block kind, a column per compile scope under each backend"
_SQUARE, _GAP, _PAD = 5, 1, 6
_LEFT, _TOP, _FONT = 130, 120, 11


def _column(r: Row) -> tuple[str, str]:
    """(backend, scope) of a cell's column: a recipe compiles the scopes its recipe names, shown as "recipe"."""
    c = r.cell
    if c.recipe:
        return c.backend, "recipe"
    return _UNCOMPILED if c.scope == "none" else (c.backend, c.scope)


def figure(m: MatrixResult, *, title: str) -> str:
    """The picture of `m`'s cells as an SVG document; `title` (plain text) heads it."""
    esc = _escape.html
    blocks = list(dict.fromkeys(r.cell.block for r in m.rows))
    backends = list(dict.fromkeys(r.cell.backend for r in m.rows if _column(r) != _UNCOMPILED))
    order = {s: i for i, s in enumerate((*SCOPES, "recipe"))}
    present = {_column(r) for r in m.rows}
    columns = [_UNCOMPILED] * (_UNCOMPILED in present) + [
        (b, s) for b in backends for s in sorted({s for bb, s in present if bb == b}, key=lambda s: order.get(s, 99))
    ]
    groups: dict[tuple[str, tuple[str, str]], list[Row]] = {}
    for r in m.rows:
        groups.setdefault((r.cell.block, _column(r)), []).append(r)
    largest = max(map(len, groups.values()), default=1)
    across = math.ceil(math.sqrt(largest * 1.5))  # a group wider than tall, as the labels are
    down = math.ceil(largest / across)
    pitch = _SQUARE + _GAP
    width_of, height_of = across * pitch + _PAD, down * pitch + _PAD
    width = _LEFT + len(columns) * width_of + 60  # room for the last column's slanted label
    legend_y = _TOP + len(blocks) * height_of + 24
    counts = m.counts()
    height = legend_y + 22 * math.ceil(len(counts) / 4) + 30

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'font-family="sans-serif" font-size="{_FONT}">',
        f"<title>{esc(title)}</title>",
        f'<rect width="{width}" height="{height}" fill="#fff"/>',
        f'<text x="10" y="20" font-size="14" font-weight="bold">{esc(title)}</text>',
        f'<text x="10" y="37" fill="#555">{esc(_HOW)}</text>',
    ]
    # Each backend's label over its columns, each scope's label slanted above its own column.
    for backend in dict.fromkeys(b for b, _ in columns):
        first = columns.index(next(c for c in columns if c[0] == backend))
        n = sum(1 for c in columns if c[0] == backend)
        x = _LEFT + first * width_of
        label = backend or "no compile"
        out.append(
            f'<text x="{x + n * width_of / 2:.0f}" y="60" text-anchor="middle" font-weight="bold">{esc(label)}</text>'
        )
        out.append(f'<line x1="{x + 2}" x2="{x + n * width_of - 4}" y1="66" y2="66" stroke="#888"/>')
    for i, (_, scope) in enumerate(columns):
        middle = _LEFT + i * width_of + width_of // 2
        text = "eager" if scope == "none" else scope
        out.append(f'<text transform="translate({middle},{_TOP - 6}) rotate(-45)">{esc(text)}</text>')
    for j, block in enumerate(blocks):
        y0 = _TOP + j * height_of
        out.append(f'<text x="{_LEFT - 8}" y="{y0 + height_of / 2 + 4:.0f}" text-anchor="end">{esc(block)}</text>')
        for i, column in enumerate(columns):
            rows = groups.get((block, column))
            if not rows:
                continue
            x0 = _LEFT + i * width_of
            labels = sorted((classified(r) for r in rows), key=lambda c: c.severity)
            names = [c.label for c in labels]
            what = ", ".join(f"{names.count(n)} {n}" for n in dict.fromkeys(names))
            out.append(
                f"<g><title>{esc(block)}, {esc(column[0] or 'no compile')} {esc(column[1])}: {esc(what)}</title>"
                f'<rect x="{x0 + 1}" y="{y0 + 1}" width="{width_of - 2}" height="{height_of - 2}" fill="#f2f2f2"/>'
            )
            for k, name in enumerate(names):
                x, y = x0 + _PAD // 2 + (k % across) * pitch, y0 + _PAD // 2 + (k // across) * pitch
                out.append(f'<rect x="{x}" y="{y}" width="{_SQUARE}" height="{_SQUARE}" fill="{esc(COLORS[name])}"/>')
            out.append("</g>")
    for k, label in enumerate(c for c in SEVERITY if c in counts):
        x, y = 10 + (k % 4) * 230, legend_y + (k // 4) * 22
        out.append(f'<rect x="{x}" y="{y}" width="12" height="12" fill="{esc(COLORS[label])}"/>')
        out.append(f'<text x="{x + 18}" y="{y + 10}">{esc(label)} ({counts[label]})</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


__all__ = ["figure"]
