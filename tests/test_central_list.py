"""The central list's pages, each the same as the command that prints it: the front page (docs/central-list/README.md,
`cases --page`: generated from the catalogue, one row per case, under 100 KB, every link resolving), the upgrade page
(`--upgrade`), every swept cell (matrix.html, `--matrix-html`: one row per record, each case id linking to its row of
the front page) and the picture README shows (heatmap.svg, `--heatmap-svg`). The records are read once (~9 s)."""

import pathlib
import re
import xml.etree.ElementTree as ET

import pytest

from toolkit.analysis import catalogue
from toolkit.bugs import central_list

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def records():
    """The committed records, as `cases --upgrade`, `--matrix-html` and `--heatmap-svg` read them."""
    from toolkit.analysis import store

    records, skipped = store.read_results(ROOT / central_list.RECORDS)
    assert records and not skipped
    return records


def test_the_committed_page_is_what_the_catalogue_generates():
    committed = (ROOT / central_list.PAGE).read_text()
    assert committed == central_list.page(), (
        "docs/central-list/README.md is stale: run `python -m toolkit cases --page > docs/central-list/README.md`"
    )


def test_the_page_is_one_row_per_case_silently_wrong_gradients_first_and_small():
    page = central_list.page()
    assert len(page.encode()) < 100_000
    rows = re.findall(r'^\| <a name="(c\d+)"></a>\*\*(C\d+)\*\* \|', page, re.M)
    assert all(name == central_list.anchor(i) for name, i in rows)  # each row is the anchor matrix.html links to
    rows = [i for _, i in rows]
    ids = [c.id for c in catalogue.cases()]
    assert sorted(rows, key=lambda i: int(i[1:])) == ids  # every case, once
    sections = re.findall(r"^## (.+?) \(\d+\)$", page, re.M)
    assert sections[0] == "Silently wrong gradients" and set(sections[1:]) <= set(catalogue.THEMES)
    first = page.split("\n## ")[1]
    wrong = {c.id for c in catalogue.cases() if (c.signature or {}).get("classification") == "grads_differ"}
    assert wrong and set(re.findall(r"\*\*(C\d+)\*\*", first)) == wrong
    for line in page.splitlines():  # a table row holds as many cells as its header: no stray pipe in a cell
        if line.startswith("| "):
            assert len(re.findall(r"(?<!\\)\|", line)) == 9, line


def test_every_link_on_the_page_resolves():
    page = central_list.page()
    folder = (ROOT / central_list.PAGE).parent
    links = re.findall(r"\]\(([^)]+)\)", page)
    known = {link for c in catalogue.cases() for link in c.links}
    assert links
    for target in links:
        if target.startswith("https://"):
            assert target in known, target
        else:
            assert (folder / target).resolve().exists(), target


def test_the_committed_upgrade_page_is_what_the_catalogue_and_records_generate(records):
    """docs/central-list/upgrade.md: per release pair, the cases gone and new (each case whose verdict changes, and no
    other) and the swept cells that changed, as `python -m toolkit cases --upgrade` writes it."""
    from toolkit import compat

    page = central_list.upgrade_page(records)
    committed = (ROOT / central_list.UPGRADE).read_text()
    assert committed == page, (
        "docs/central-list/upgrade.md is stale: run `python -m toolkit cases --upgrade > docs/central-list/upgrade.md`"
    )
    releases = compat.CHECKED_ON
    for a, b in zip(releases, releases[1:]):
        section = page.split(f"## torch {a} → {b}")[1].split("\n## ")[0]
        changed = {
            c.id for c in catalogue.cases() if a in c.verified and c.verified[a] != c.verified.get(b, c.verified[a])
        }
        listed = set(re.findall(r"^- \*\*(C\d+)\*\*", section, re.M))
        assert listed == changed, (a, b)
        assert "### Swept cells (" in section
    folder = (ROOT / central_list.UPGRADE).parent
    for target in re.findall(r"\]\(([^)]+)\)", page):
        assert (folder / target).resolve().exists(), target


def _cell_rows(page: str) -> list[list[str]]:
    """matrix.html's rows, each its cells' HTML (one row a line, `<td>` opening each cell)."""
    return [line.split("<td>")[1:] for line in page.splitlines() if line.startswith("<tr><td>")]


def test_the_committed_cell_page_is_what_the_records_generate(records):
    committed = (ROOT / central_list.CELLS).read_text()
    assert committed == central_list.cells_page(records), (
        "docs/central-list/matrix.html is stale: run "
        "`python -m toolkit cases --matrix-html > docs/central-list/matrix.html`"
    )
    assert len(committed.encode()) < 2_000_000  # offline, with no plotly.js: a fraction of the sweep's own page
    assert "<script src" not in committed and "http" not in committed  # nothing to fetch


def test_the_cell_page_holds_a_row_per_record_each_case_linking_to_its_row_of_the_list(records):
    """One row per swept cell and release (the bare reruns are the failing cells' second opinion, not cells), with
    a filter per column; every case id links to the anchor of its row in README.md, which exists."""
    from toolkit import compat
    from toolkit.analysis.findings import torch_release
    from toolkit.analysis.views.cells_html import COLUMNS

    page = (ROOT / central_list.CELLS).read_text()
    rows = _cell_rows(page)
    swept = [r for r in records.values() if not r["_cell"].bare]
    assert len(rows) == len(swept) and all(len(r) == len(COLUMNS) + 1 for r in rows)
    per_release = {}
    for r in swept:
        release = torch_release(r["_report"].environment["torch"])
        per_release[release] = per_release.get(release, 0) + 1
    column = {name: i for i, name in enumerate(COLUMNS)}
    assert {t: sum(r[column["torch"]] == t for r in rows) for t in per_release} == per_release
    assert set(per_release) == set(compat.CHECKED_ON)  # the sweep holds every release checked
    assert {r[column["backend"]] for r in rows} >= {"aot_eager", "inductor", "eager"}  # eager: Dynamo alone
    assert any(r[column["block"]].startswith("hf:") for r in rows)  # transformers' own models
    assert page.count("<select") == len(COLUMNS) and 'id="q"' in page
    anchors = set(re.findall(r'<a name="(c\d+)"></a>', (ROOT / central_list.PAGE).read_text()))
    links = [re.findall(r'<a href="README\.md#([^"]+)">(C\d+)</a>', r[column["cases"]]) for r in rows]
    assert sum(map(len, links)) == sum(r[column["cases"]].count("<a ") for r in rows) > 0  # every id a link
    for name, case in {x for row in links for x in row}:
        assert name in anchors and name == central_list.anchor(case), (name, case)


def test_the_committed_picture_is_what_the_records_generate(records):
    """heatmap.svg (README's picture): the newest release's cells, one square each, as `cases --heatmap-svg` draws
    it; a well-formed SVG document with nothing to fetch."""
    from toolkit.analysis.matrix import by_release

    committed = (ROOT / central_list.HEATMAP).read_text()
    assert committed == central_list.heatmap(records), (
        "docs/central-list/heatmap.svg is stale: run "
        "`python -m toolkit cases --heatmap-svg > docs/central-list/heatmap.svg`"
    )
    svg = ET.fromstring(committed)
    ns = "{http://www.w3.org/2000/svg}"
    squares = [r for g in svg.iter(f"{ns}g") for r in g.findall(f"{ns}rect")[1:]]  # each group's, less its ground
    release, newest = list(by_release(records).items())[-1]
    assert len(squares) == len(newest.rows) and release in svg.findtext(f"{ns}title")
    assert "href" not in committed and len(committed.encode()) < 300_000


def test_a_sweep_into_the_folder_of_the_committed_pages_is_refused(tmp_path):
    """The sweep writes its own matrix.html (plotly): beside the committed cell page it is refused before any cell runs,
    naming the page, so the sweep has a folder of its own (docs/cli.md: matrix-out/central-list)."""
    import shutil

    from toolkit._config import ConfigError
    from toolkit.analysis import store

    shutil.copy(ROOT / central_list.CELLS, tmp_path / "matrix.html")
    with pytest.raises(ConfigError, match="matrix.html' exists and is not a sweep's"):
        with store.Folder(tmp_path):
            pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["matrix.html"]
