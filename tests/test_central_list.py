"""The central list's front page (docs/central-list/README.md): generated from the catalogue, one row per case, under
100 KB, every link resolving, and the same as what `python -m toolkit cases --page` prints."""

import pathlib
import re

from toolkit.analysis import catalogue
from toolkit.bugs import central_list

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_committed_page_is_what_the_catalogue_generates():
    committed = (ROOT / central_list.PAGE).read_text()
    assert committed == central_list.page(), (
        "docs/central-list/README.md is stale: run `python -m toolkit cases --page > docs/central-list/README.md`"
    )


def test_the_page_is_one_row_per_case_silently_wrong_gradients_first_and_small():
    page = central_list.page()
    assert len(page.encode()) < 100_000
    rows = re.findall(r"^\| \*\*(C\d+)\*\* \|", page, re.M)
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


def test_the_committed_upgrade_page_is_what_the_catalogue_and_records_generate():
    """docs/central-list/upgrade.md: per release pair, the cases gone and new (each case whose verdict changes, and no
    other) and the swept cells that changed, as `python -m toolkit cases --upgrade` writes it."""
    from toolkit import compat
    from toolkit.analysis import store

    records, skipped = store.read_results(ROOT / central_list.RECORDS)
    assert records and not skipped
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
