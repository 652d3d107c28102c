"""Every swept cell as one row of an offline HTML page with a search box and a filter per column (plain HTML and a
small inline script, no plotly): the per-cell detail of the central list, on each release measured.

Each row holds the cell's torch release, block, AC mode, compile scope, fullgraph, order, backend, FSDP,
classification, the case ids it shows (each a link `case_href` makes) and its label, one row per line, closing tags
left out (HTML does not need them): the page stays a fraction of the plotly one for three times its cells.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Callable

from ... import _escape
from ..classification import SEVERITY
from .heatmap import COLORS
from .links import classified

if TYPE_CHECKING:
    from ..matrix import MatrixResult, Row

COLUMNS = ("torch", "block", "AC", "compile", "fullgraph", "order", "backend", "FSDP", "classification", "cases")
"""The columns a select box filters, in the page's order; the label follows, found by the search box."""
_CASES, _CLASS = COLUMNS.index("cases"), COLUMNS.index("classification")


def _values(release: str, r: Row) -> tuple[str, ...]:
    """What a row shows in each filtered column but the cases, as plain text ("-": the cell has none)."""
    c = r.cell
    compiled = c.scope != "none" or bool(c.recipe)
    return (
        release,
        c.block,
        "-" if c.recipe else c.ac,
        f"recipe {c.recipe}" if c.recipe else c.scope,
        "yes" if c.fullgraph else "no",
        c.order or "-",
        c.backend if compiled else "-",
        c.fsdp,
        classified(r).label,
    )


# Rows are hidden, never removed: the filters and the search words (all of them, anywhere in the row) narrow the
# same rows, and the counts say how many are shown, by classification.
_SCRIPT = """(() => {
const table = document.getElementById('cells'), q = document.getElementById('q'), n = document.getElementById('n');
const rows = [...table.tBodies[0].rows], CASES = +table.dataset.cases, CLASS = +table.dataset.classification;
const sels = [...table.tHead.querySelectorAll('select')];
const colour = Object.fromEntries([...sels[CLASS].options].map(o => [o.value, o.dataset.color]));
const cells = rows.map(r => [...r.cells].map(c => c.textContent));
const text = cells.map(c => c.join(' ').toLowerCase());
rows.forEach((r, i) => { r.cells[CLASS].style.color = colour[cells[i][CLASS]] || ''; });
function apply() {
  const words = q.value.toLowerCase().split(/\\s+/).filter(Boolean), want = sels.map(s => s.value);
  const by = {};
  let shown = 0;
  rows.forEach((r, i) => {
    const c = cells[i];
    const ok = want.every((v, j) => !v || (j === CASES ? c[j].split(' ').includes(v) : c[j] === v))
      && words.every(w => text[i].includes(w));
    r.hidden = !ok;
    if (ok) { shown += 1; by[c[CLASS]] = (by[c[CLASS]] || 0) + 1; }
  });
  const counts = [...sels[CLASS].options].filter(o => by[o.value]).map(o => `${by[o.value]} ${o.value}`);
  n.textContent = `${shown} of ${rows.length} cells shown` + (counts.length ? `: ${counts.join(', ')}` : '');
}
q.addEventListener('input', apply);
sels.forEach(s => s.addEventListener('change', apply));
document.getElementById('clear').addEventListener('click', () => {
  q.value = '';
  sels.forEach(s => { s.value = ''; });
  apply();
});
apply();
})();"""

_STYLE = (
    "body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}"
    "td,th{border:1px solid #ccc;padding:2px 5px;font-size:12px;text-align:left;white-space:nowrap}"
    "thead th{position:sticky;background:#f6f6f6}thead tr:first-child th{top:0}thead tr+tr th{top:1.6em}"
    "select{max-width:11em;font-size:12px}#q{width:30em}#n{margin-left:1em;font-weight:bold}"
)


def page(results: dict[str, MatrixResult], *, case_href: Callable[[str], str], title: str, note: str) -> str:
    """The page: `results` (a MatrixResult per torch release, as `by_release` makes them, oldest first), every row of
    each, in that order; each case id a link to `case_href(id)`; `title` and `note` (plain text: what the page is
    and where it comes from) above the table. Every text and attribute goes through `_escape.html`."""
    rows = [(_values(release, r), classified(r).cases, r.cell.label) for release, m in results.items() for r in m.rows]
    esc = _escape.html
    options: list[list[str]] = [sorted({v[i] for v, _, _ in rows}) for i in range(len(COLUMNS) - 1)]
    options[0] = list(results)  # in the order given, not as text ("2.9" before "2.13")
    options[_CLASS] = [label for label in SEVERITY if label in options[_CLASS]]
    ids = {i for _, cases, _ in rows for i in cases}
    options.append(sorted(ids, key=lambda i: int(re.sub(r"\D", "", i) or 0)) + ["-"])

    def select(col: int) -> str:
        colour = (lambda v: f' data-color="{esc(COLORS[v])}"') if col == _CLASS else (lambda v: "")
        return (
            f'<th><select aria-label="{esc(COLUMNS[col])}"><option value="">all</option>'
            + "".join(f'<option value="{esc(v)}"{colour(v)}>{esc(v)}</option>' for v in options[col])
            + "</select></th>"
        )

    def linked(cases: tuple[str, ...] | list[str]) -> str:
        return " ".join(f'<a href="{esc(case_href(i))}">{esc(i)}</a>' for i in cases) or "-"

    body = "\n".join(
        "<tr>" + "".join(f"<td>{esc(v)}" for v in values) + f"<td>{linked(cases)}<td>{esc(label)}"
        for values, cases, label in rows
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{esc(title)}</title><style>{_STYLE}</style></head><body>\n"
        f"<h1>{esc(title)}</h1>\n<p>{esc(note)}</p>\n"
        '<p><input id="q" type="search" placeholder="search: words anywhere in a row" aria-label="search">'
        ' <button id="clear" type="button">clear</button><span id="n"></span></p>\n'
        f'<table id="cells" data-cases="{_CASES}" data-classification="{_CLASS}"><thead><tr>'
        + "".join(f"<th>{esc(c)}</th>" for c in (*COLUMNS, "label"))
        + "</tr>\n<tr>"
        + "".join(select(i) for i in range(len(COLUMNS)))
        + "<th></th></tr></thead><tbody>\n"
        + body
        + f"\n</tbody></table>\n<script>\n{_SCRIPT}\n</script>\n</body></html>\n"
    )


__all__ = ["COLUMNS", "page"]
