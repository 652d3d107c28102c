"""The central list as one page a maintainer reads before upgrading torch: `docs/central-list/README.md`.

Every catalogued case once, silently wrong gradients first, then by theme: what happens, its verdict on each torch
release the toolkit checks, the workaround, the upstream threads and the repro to run. Generated from the catalogue
alone (`python -m toolkit cases --page`), so the page and the catalogue cannot disagree; the per-cell detail stays
in `matrix.md`, `matrix.html` and the records beside it.
"""

from __future__ import annotations

import pathlib

from .. import _escape, compat
from ..analysis.catalogue import THEMES, Case, cases
from . import has_script, script_name

PAGE = pathlib.Path("docs") / "central-list" / "README.md"
"""Where the page is committed, from the repository's root (GitHub shows it on opening the folder)."""

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
        f"**{case.id}**",
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
        "(`python -m toolkit cases --page`); what each swept cell measured is in [matrix.md](matrix.md) and "
        "the records beside it.",
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


__all__ = ["PAGE", "page"]
