"""`python -m toolkit cases`: the catalogue of known cases as a table, the central list's pages, or their
standalone repros run again."""

from __future__ import annotations

import argparse
from typing import Any

from .common import Rule, UsageError, say_error

_FILTERS = ("cpu", "needs", "text", "markdown", "findings", "check")
"""The listing's options: none of them shapes a page of the central list, which is every case or every cell."""

INERT: tuple[Rule, ...] = (
    (
        lambda a: a.page,
        (*_FILTERS, "upgrade", "matrix_html", "heatmap_svg"),
        "--page prints every case, from the catalogue alone",
        "drop {opt}, or list the cases without --page",
    ),
    (
        lambda a: a.upgrade,
        (*_FILTERS, "matrix_html", "heatmap_svg"),
        "--upgrade prints every release pair, from the catalogue and the committed records",
        "drop {opt}, or list the cases without --upgrade",
    ),
    (
        lambda a: a.matrix_html,
        (*_FILTERS, "heatmap_svg"),
        "--matrix-html prints every swept cell, from the committed records",
        "drop {opt}, or list the cases without --matrix-html",
    ),
    (
        lambda a: a.heatmap_svg,
        _FILTERS,
        "--heatmap-svg draws every cell of the newest release, from the committed records",
        "drop {opt}, or list the cases without --heatmap-svg",
    ),
    (
        lambda a: bool(a.check),
        ("cpu", "needs", "text", "markdown", "findings"),
        "--check runs the repros it names; the filters and the table's options shape the listing",
        "drop {opt}, or list the cases without --check",
    ),
)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    from ..analysis.catalogue import CPU_STATUSES

    c: argparse.ArgumentParser = sub.add_parser(
        "cases", description="The catalogue of known AC x compile x MoE cases, or their repros re-run."
    )
    c.add_argument("--cpu", choices=list(CPU_STATUSES), help="only cases with this CPU status")
    c.add_argument(
        "--needs",
        choices=["cpu", "gpu", "multi-rank"],
        help="only cases whose repro needs this: one CPU process, a GPU, or several ranks",
    )
    c.add_argument("--text", help="only cases whose title/configuration/symptom/mechanism contain this text")
    c.add_argument("--findings", action="store_true", help="add this machine's recorded verdicts to the torch column")
    c.add_argument(
        "--markdown",
        action="store_true",
        help="print the markdown table (upstream links, notebooks, every release's verdict)",
    )
    c.add_argument(
        "--page",
        action="store_true",
        help="print the central list as one Markdown page (docs/central-list/README.md): every case by theme, its "
        "verdict on each release, workaround, upstream links and repro",
    )
    c.add_argument(
        "--upgrade",
        action="store_true",
        help="print 'Before you upgrade torch' (docs/central-list/upgrade.md): per release pair, the cases gone and "
        "new, and the swept cells that changed, from the catalogue and the committed records",
    )
    c.add_argument(
        "--matrix-html",
        action="store_true",
        help="print every swept cell as one offline HTML page (docs/central-list/matrix.html): a row per cell and "
        "release, a search box and a filter per column, from the committed records",
    )
    c.add_argument(
        "--heatmap-svg",
        action="store_true",
        help="print the picture README shows (docs/central-list/heatmap.svg): the newest release's cells, a square "
        "each, by block kind and compile setup, coloured by classification, from the committed records",
    )
    c.add_argument(
        "--check",
        nargs="+",
        metavar="CASE",
        help="run the standalone repro of these cases (or 'all') and check their signatures on this torch",
    )
    return c


def command(args: argparse.Namespace) -> int:
    from .. import bugs
    from .._escape import terminal_width
    from ..analysis import catalogue

    if args.page:
        from ..bugs import central_list

        print(central_list.page(), end="")
        return 0
    # The pages drawn from the committed records: the upgrade page, every cell, the picture (one at a time: INERT).
    drawn = [dest for dest in ("upgrade", "matrix_html", "heatmap_svg") if getattr(args, dest)]
    if drawn:
        from ..analysis import store
        from ..analysis.matrix import records_path
        from ..bugs import central_list

        path = records_path()
        if not path.is_file():
            raise UsageError(
                f"--{drawn[0].replace('_', '-')} reads the central list's committed records, and {str(path)!r} is "
                "not there.",
                "run it from a checkout of the repository (they are docs/central-list/results.jsonl.xz).",
            )
        draw = {
            "upgrade": central_list.upgrade_page,
            "matrix_html": central_list.cells_page,
            "heatmap_svg": central_list.heatmap,
        }[drawn[0]]
        print(draw(store.read_results(path)[0]), end="")
        return 0
    if not args.check:
        sel = catalogue.filter(cpu=args.cpu, text=args.text, needs=args.needs)
        if args.markdown:
            print(catalogue.markdown(sel, with_findings=args.findings))
        else:
            print(catalogue.text(sel, width=terminal_width(100), with_findings=args.findings))
        return 0
    ids = args.check
    if ids == ["all"]:
        ids = [c.id for c in catalogue.cases() if c.signature and bugs.has_script(c.id)]
    unknown = [cid for cid in ids if not bugs.has_script(cid)]
    if unknown:
        say_error(
            f"no standalone repro for {', '.join(unknown)} (cases with a standalone script: see "
            "toolkit/bugs/standalone/, or `python -m toolkit cases --check all`)"
        )
        return 2
    status = 0
    for cid in ids:
        try:
            finding = bugs.check(cid)
        except AssertionError as e:
            print(e)
            status = 1
            continue
        print(finding)  # a Finding, or "CNN skipped: why" (no GPU; an optional package, with its install line)
    return status
