"""The central list's pages: every case at a glance, what changes from one torch release to the next, every swept
cell, and the picture README shows.

`page()` (`docs/central-list/README.md`): every catalogued case once, silently wrong gradients first, then by theme,
with what happens, its verdict on each torch release the toolkit checks, the workaround, the upstream threads and
the repro to run, from the catalogue alone (`python -m toolkit cases --page`). `upgrade_page(records)`
(`docs/central-list/upgrade.md`): per pair of consecutive releases, the cases fixed and the cases that appeared, and
the swept cells that classify differently or save other bytes, grouped by why (`python -m toolkit cases --upgrade`).
`cells_page(records)` (`docs/central-list/matrix.html`): every swept cell on every release, one row each, with a
search box and a filter per column, each case id linking to its row of the list (`cases --matrix-html`).
`heatmap(records)` (`docs/central-list/heatmap.svg`): the newest release's cells, a square each, by block kind and
compile setup (`cases --heatmap-svg`). The records themselves are `results.jsonl.xz`, beside them.
"""

from __future__ import annotations

import pathlib
from typing import Any

from .. import _escape, compat
from ..analysis.catalogue import THEMES, Case, cases
from ..analysis.matrix import RECORDS, by_release
from ..analysis.views import cells_html, svg
from ..instrument.records import fmt_bytes
from . import has_script, script_name

PAGE = pathlib.Path("docs") / "central-list" / "README.md"
"""Where the page is committed, from the repository's root (GitHub shows it on opening the folder)."""
UPGRADE = pathlib.Path("docs") / "central-list" / "upgrade.md"
CELLS = pathlib.Path("docs") / "central-list" / "matrix.html"
HEATMAP = pathlib.Path("docs") / "central-list" / "heatmap.svg"

_VERDICT = {"reproduced": "reproduces", "fixed": "fixed", "not reproduced": "not yet"}
_UNCHECKED = {"gpu_only": "needs CUDA", "multi_rank": "needs ranks", "plausible": "not shown on CPU"}


def _silently_wrong(case: Case) -> bool:
    """A case whose step ends without an error but with wrong gradients: the first section of the page."""
    return (case.signature or {}).get("classification") == "grads_differ"


def _verdict(case: Case, release: str) -> str:
    if release in case.verified:
        return _VERDICT[case.verified[release]]
    return _UNCHECKED.get(case.cpu, "not checked")


def _link(label: str, url: str) -> str:
    """A Markdown link whose label is inert text and whose target is a web page or a file of this repository."""
    if not url.startswith(("https://", "../../")) or any(c in url for c in " ()<>\n"):
        return _escape.markdown(label)
    return f"[{_escape.markdown(label)}]({url})"


def anchor(case_id: str) -> str:
    """The name of a case's row on the page (`README.md#c12`): lower case, as GitHub names the anchors it makes."""
    return case_id.lower()


def _repro(case: Case) -> str:
    """The case's bug notebook, else its torch-only script, relative to the page's folder."""
    if case.notebook:
        return _link("notebook", f"../../notebooks/{case.notebook}")
    if has_script(case.id):
        return _link("script", f"../../toolkit/bugs/standalone/{script_name(case.id)}.py")
    return "-"


def _row(case: Case, releases: tuple[str, ...]) -> str:
    upstream = ", ".join(_link(u, link) for u, link in zip(case.upstream, case.links)) or _escape.markdown(
        ", ".join(case.upstream) or "-"
    )
    cells = [
        f'<a name="{_escape.html(anchor(case.id))}"></a>**{case.id}**',
        _escape.markdown(case.title),
        *(_verdict(case, r) for r in releases),
        _escape.markdown(case.workaround or "-"),
        upstream,
        _repro(case),
    ]
    return "| " + " | ".join(cells) + " |"


def _table(selection: list[Case], releases: tuple[str, ...]) -> list[str]:
    head = ["case", "what happens", *(f"torch {r}" for r in releases), "workaround", "upstream", "repro"]
    return ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head), *(_row(c, releases) for c in selection)]


def page() -> str:
    """The page's Markdown: deterministic, from the catalogue and the releases `compat` checks."""
    every = list(cases())
    releases = compat.CHECKED_ON
    wrong = [c for c in every if _silently_wrong(c)]
    lines = [
        "# The central list: activation checkpointing × torch.compile × Mixture-of-Experts",
        "",
        f"{len(every)} known ways in which AC, SAC, torch.compile and MoE fail to compose, or compose only with a "
        f"caveat, each with its verdict on torch {', '.join(releases)}: *reproduces*, *fixed*, *not yet* (the release "
        "before it began), or what a repro needs where a CPU cannot show it. Cases that train on silently with "
        "wrong gradients come first; the rest are grouped by theme. Generated from the toolkit's catalogue "
        "(`python -m toolkit cases --page`); every swept cell, with a filter per column, is in "
        "[matrix.html](matrix.html) (download it and open it offline), and what each measured is in the records beside "
        "it (`results.jsonl.xz`).",
        "",
        f"Themes: {' · '.join(THEMES)}.",
        "",
        f"## Silently wrong gradients ({len(wrong)})",
        "",
        *_table(wrong, releases),
    ]
    for theme in THEMES:
        selection = [c for c in every if c.theme == theme and not _silently_wrong(c)]
        if selection:
            lines += ["", f"## {theme} ({len(selection)})", "", *_table(selection, releases)]
    return "\n".join(lines) + "\n"


def _why_bytes(a: Any, b: Any) -> str:
    """What moved the saved bytes of one cell between two releases: the op whose saved bytes changed most, and what
    the matrix knows of it."""
    from ..analysis.matrix import KNOWN_SAVE_CHANGES

    deltas = {op: b.saved.by_op.get(op, 0) - a.saved.by_op.get(op, 0) for op in {*a.saved.by_op, *b.saved.by_op}}
    op = max(sorted(deltas), key=lambda o: abs(deltas[o]))
    return f"{op}" + (f": {KNOWN_SAVE_CHANGES[op]}" if op in KNOWN_SAVE_CHANGES else "")


def _cases_changed(a: str, b: str) -> list[str]:
    fixed = [
        c for c in cases() if c.verified.get(a) == "reproduced" and c.verified.get(b) in ("fixed", "not reproduced")
    ]
    began = [
        c for c in cases() if c.verified.get(a) in ("fixed", "not reproduced") and c.verified.get(b) == "reproduced"
    ]
    lines = []
    for title, selection in ((f"Gone on {b}", fixed), (f"New on {b}", began)):
        lines += ["", f"### {title} ({len(selection)})", ""]
        lines += [f"- **{c.id}** {_escape.markdown(c.title)} ({_repro(c)})" for c in selection] or ["- none"]
    return lines


def _cells_changed(a: str, b: str, old: Any, new: Any) -> list[str]:
    labels: dict[tuple[str, str], list[str]] = {}
    named: dict[tuple[str, str], set[str]] = {}
    saved: dict[str, list[tuple[str, int, int]]] = {}
    compared = 0
    for r in new.rows:
        o = old.row_of(r.cell)
        if o is None:
            continue
        compared += 1
        la, lb = o.classification.label, r.classification.label
        if la != lb:
            labels.setdefault((la, lb), []).append(r.cell.label)
            named.setdefault((la, lb), set()).update(o.classification.cases, r.classification.cases)
        elif o.report.ok and r.report.ok and o.report.saved.total_bytes != r.report.saved.total_bytes:
            why = _why_bytes(o.report, r.report)
            saved.setdefault(why, []).append((r.cell.label, o.report.saved.total_bytes, r.report.saved.total_bytes))
    n_labels, n_saved = sum(map(len, labels.values())), sum(map(len, saved.values()))
    lines = [
        "",
        f"### Swept cells ({compared} measured on both)",
        "",
        f"{n_labels} classify differently and {n_saved} save other bytes for backward.",
    ]
    if labels:
        lines += ["", f"| on {a} | on {b} | cells | cases named | for example |", "| --- | --- | --- | --- | --- |"]
        for (la, lb), cells in sorted(labels.items(), key=lambda e: (-len(e[1]), e[0])):
            ids = ", ".join(sorted(named[(la, lb)], key=lambda i: int(i[1:]))) or "-"
            lines.append(f"| {la} | {lb} | {len(cells)} | {ids} | {_escape.markdown(sorted(cells)[0])} |")
    if saved:
        lines += ["", "| the op whose saved bytes moved most, and why | cells | for example |", "| --- | --- | --- |"]
        for why, moved in sorted(saved.items(), key=lambda e: (-len(e[1]), e[0])):
            label, x, y = sorted(moved)[0]
            example = f"{_escape.markdown(label)}: {fmt_bytes(x)} → {fmt_bytes(y)}"
            lines.append(f"| {_escape.markdown(why)} | {len(moved)} | {example} |")
    return lines


def upgrade_page(records: dict[str, dict]) -> str:
    """ "Before you upgrade torch": per pair of consecutive checked releases, the cases gone and new (the catalogue's
    verdicts) and the swept cells that changed (`records`, as `store.read_results` reads the committed ones)."""
    releases = compat.CHECKED_ON
    results = by_release(records)
    lines = [
        "# Before you upgrade torch",
        "",
        f"What changes between the torch releases the toolkit checks ({' → '.join(releases)}): the known cases that "
        "are gone or new (from [the central list](README.md)), and the cells of the central list's sweep that "
        "classify differently or save other bytes for backward, grouped by why. Generated by "
        "`python -m toolkit cases --upgrade` from the catalogue and the committed records "
        "(`results.jsonl.xz`); a new release adds its column when its sweep is merged into them.",
    ]
    for a, b in zip(releases, releases[1:]):
        lines += ["", f"## torch {a} → {b}", *_cases_changed(a, b)]
        if a in results and b in results:
            lines += _cells_changed(a, b, results[a], results[b])
        else:
            lines += ["", "### Swept cells", "", f"The records hold no sweep on {a if a not in results else b}."]
    return "\n".join(lines) + "\n"


def cells_page(records: dict[str, dict]) -> str:
    """matrix.html: every swept cell of `records` on every release, one row each, filtered and searched offline;
    each case id links to its row of `page()`."""
    results = by_release(records)
    n = sum(len(m.rows) for m in results.values())
    note = (
        f"{n} cells: the central list's sweep on torch {', '.join(results)}, one row per cell and release "
        "(the bare reruns of failing cells left out). Pick a value in a column to keep its rows, or type words "
        "found anywhere in a row; a case id leads to its row in the central list (README.md). Generated by "
        "python -m toolkit cases --matrix-html from the committed records (results.jsonl.xz)."
    )
    title = "The central list: every swept cell"
    return cells_html.page(results, case_href=lambda i: f"{PAGE.name}#{anchor(i)}", title=title, note=note)


def heatmap(records: dict[str, dict]) -> str:
    """heatmap.svg: the newest release's swept cells, a square each, by block kind and compile setup."""
    release, m = list(by_release(records).items())[-1]
    return svg.figure(m, title=f"The central list on torch {release}: {len(m.rows)} cells, by classification")


__all__ = ["CELLS", "HEATMAP", "PAGE", "RECORDS", "UPGRADE", "anchor", "cells_page", "heatmap", "page", "upgrade_page"]
