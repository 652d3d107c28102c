"""The matrix as one offline HTML page (plotly.js embedded): the legend, the heatmap and the central list, with the
stamp that tells `write` whether the page on disk already shows the same."""

from __future__ import annotations

import pathlib
from typing import TYPE_CHECKING, Any

from ... import _escape, _files
from .. import catalogue
from ..classification import EXPLAIN, SEVERITY
from .heatmap import COLORS, SYMBOLS, figure
from .links import BARE_LINE, CASE_IDS, a, case_counts, case_href, classified, linked_ids, notebook_href, notebooks_href

if TYPE_CHECKING:
    from ..matrix import MatrixResult


def page(m: MatrixResult, *, stamp: str = "", notebooks: str | None = None) -> str:
    """A m-contained page: plotly.js embedded (opens offline), a legend with the counts, the heatmap, then the
    central list (with the markdown's backend column); `stamp` (what `write` checks) goes into its head.

    Every case id on the page is a link: in the by-case table to its upstream thread (or, where it has none, its
    notebook, or its own row), elsewhere to its row in that table (or, for a case the table does not show, the
    same target).
    `notebooks`: the notebooks folder as a link from the page (`write` passes it relative to the page's folder;
    the default is the folder's file:// address, None where the package was installed without them)."""
    if notebooks is None:
        notebooks = notebooks_href(None)

    plot = figure(m).to_html(include_plotlyjs=True, full_html=False, div_id="matrix-heatmap")
    counts, also = m.counts(), m.secondary_counts()
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
    entries = m.by_case()
    shown = {e["case"].id for e in entries}
    known = {c.id for c in catalogue.cases()}  # read once for the page: every row's text is linked

    def target(i: str) -> str | None:
        return f"#case-{i}" if i in shown else case_href(i, notebooks) if i in known else None

    def text(t: str) -> str:  # escaped, every case id in it a link
        return linked_ids(_escape.html(t), target)

    if entries:
        parts.append(
            f'<h2 id="by-case">By case ({len(entries)})</h2><table><tr><th>case</th><th>cells</th>'
            "<th>other releases</th><th>verified</th><th>status</th><th>workaround</th><th>notebook</th>"
            "<th>upstream</th></tr>"
        )
        for e in entries:
            c = e["case"]
            # A case with neither an upstream thread nor a notebook links to its own row (a permalink).
            link = a(c.id, case_href(c.id, notebooks) or f"#case-{c.id}")
            by, others, verified = case_counts(e)
            cells = "<br>".join(_escape.html(r.cell.label) for r in e["rows"])
            href = notebook_href(c, notebooks)
            nb = a(pathlib.Path(c.notebook).stem, href) if href else _escape.html(c.notebook or "-")
            upstream = ", ".join(a(u, link) for u, link in zip(c.upstream, c.links)) or _escape.html(
                ", ".join(c.upstream) or "-"
            )
            parts.append(
                f'<tr id="case-{c.id}"><td>{link} {text(c.title)}</td><td>{len(e["rows"])} ({by})<details>'
                f"<summary>cells</summary>{cells}</details></td><td>{others}</td><td>{verified}</td>"
                f"<td>{text(c.status)}</td><td>{text(c.workaround or '-')}</td><td>{nb}</td><td>{upstream}</td>"
                "</tr>"
            )
        parts.append("</table>")
    diffs = m.backend_differences()
    if any(r.cell.backend == "inductor" for r in m.rows):
        parts.append(
            f"<h2>aot_eager vs inductor ({len(diffs)})</h2><table><tr><th>cell</th><th>aot_eager</th>"
            "<th>inductor</th><th>what differs</th></tr>"
        )
        parts += [
            f"<tr><td>{_escape.html(a.cell.label.rsplit(' | ', 1)[0])}</td><td>{classified(a).label}</td>"
            f"<td>{classified(i).label}</td><td>{_escape.html('; '.join(what))}</td></tr>"
            for a, i, what in diffs
        ]
        parts.append("</table>")
    parts.append(f"<h2>By classification</h2><p>{text(CASE_IDS)}</p>")
    # The explanation heads each group of cells that share it, rather than repeating in every row (the works table
    # said the same words 35 times): groups in order of first appearance, so the table keeps its order within one.
    cols = ("block", "AC", "compile", "backend", "saved", "peak", "breaks")
    for label, rows in m.central_list():
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
    env = _escape.html(", ".join(f"{k} {v}" for k, v in m.environment.items()))
    changes = m.torch_changes()
    if changes:
        releases = sorted({t for _, there in changes for t in there})
        head = "".join(f"<th>torch {_escape.html(t)}</th>" for t in releases)
        body = "".join(
            f"<tr><td>{_escape.html(r.cell.label)}</td><td>{classified(r).label}</td>"
            + "".join(f"<td>{there[t].label if t in there else 'same'}</td>" for t in releases)
            + f"<td>{text('; '.join(dict.fromkeys(c.cause for c in there.values())))}</td>"
            + "</tr>"
            for r, there in changes
        )
        parts.insert(
            0,
            f"<h2>Changed between torch releases ({len(changes)})</h2><table><tr><th>cell</th>"
            f"<th>torch {_escape.html(m.environment.get('torch', '?'))}</th>{head}<th>why it differs</th></tr>"
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
        f"<h1>AC × compile × MoE: the central list</h1><p>{len(m.rows)} cells; {env}.</p>"
        f'<div id="legend">{legend}</div>{plot}{"".join(parts)}</body></html>'
    )


_STAMP = "toolkit-matrix-stamp"


def stamp_of_parts(data: str, md: str) -> str:
    """What the page is made of: the results (JSON), the tables (markdown, with the changes between releases), the
    code drawing it (the views' modules) and plotly's release."""
    import hashlib
    from importlib import metadata

    try:
        plotly = metadata.version("plotly")
    except metadata.PackageNotFoundError:
        plotly = "?"
    h = hashlib.sha256()
    code = [
        _files.read_capped(f, "views", "source", name=f.name)
        for f in sorted(pathlib.Path(__file__).parent.glob("*.py"))
    ]
    for part in (data, md, *code, plotly):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def stamp_of(page: pathlib.Path) -> str | None:
    """The stamp in an existing page's head (its first few hundred bytes), or None."""
    import re

    raw = _files.read_head(page, 512)
    if raw is None:
        return None
    head = raw.decode("utf-8", "replace")
    found = re.search(f'<meta name="{_STAMP}" content="([0-9a-f]+)">', head)
    return found.group(1) if found else None
