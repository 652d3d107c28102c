"""matrix.html in headless Chromium (Debian's, driven by Playwright), offline: one cell of every classification.

The page is written from a hand-made MatrixResult (nothing is measured), opened from file:// with every other
request refused, and checked as a reader sees it: each classification drawn in its own colour (read back from the
rendered heatmap's pixels), empty cells white and unlike every classification, a label in every cell, the recipes in
a panel of their own, and the backend column in every table. The screenshot is kept in the test's tmp folder
(`matrix.png`) and, when TOOLKIT_SCREENSHOTS names a folder, copied there.

The committed central list (docs/central-list, its newest release) is drawn the same way and read as a user reads
it: every case id on the page is a link that leads somewhere (a row of the page, an upstream thread, a notebook that
exists), the notebook column links to the notebooks, and no table repeats one explanation row after row. Outside CI
the tests skip when Playwright or Chromium is missing; in CI (`CI` set) they fail instead, since `.ci/run` installs
both.
"""

import os
import pathlib
import re
import shutil
import tempfile
import urllib.parse

import pytest
from _helpers import playwright_and_chromium, synthetic_matrix

from toolkit.analysis.views import COLORS, SYMBOLS

pytestmark = pytest.mark.browser

# No network: no background services, no component or safe-browsing updates, no sync.
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]

# For each heatmap panel: the colour at the centre of every cell, read from the image plotly drew.
CELL_COLOURS = """async () => {
    const gd = document.getElementById('matrix-heatmap');
    const out = [];
    for (const [i, trace] of gd._fullData.entries()) {
        const img = [...gd.querySelectorAll('.hm image')][i];
        const el = new Image();
        el.src = img.getAttribute('href') || img.getAttribute('xlink:href');
        await el.decode();
        const canvas = document.createElement('canvas');
        canvas.width = el.naturalWidth; canvas.height = el.naturalHeight;
        const ctx = canvas.getContext('2d');
        ctx.drawImage(el, 0, 0);
        const ny = trace.z.length, nx = trace.z[0].length;
        const cells = [];
        for (let y = 0; y < ny; y++) for (let x = 0; x < nx; x++) {
            const px = ctx.getImageData(Math.floor((x + 0.5) * el.naturalWidth / nx),
                                        Math.floor((y + 0.5) * el.naturalHeight / ny), 1, 1).data;
            cells.push([px[0], px[1], px[2], px[3]]);
        }
        out.push({name: trace.name, cells: cells});
    }
    return out;
}"""


# Every case id in the page's text (the heatmap, a picture, aside) that is not inside a link.
UNLINKED_IDS = """() => {
    const bad = [], heat = document.getElementById('matrix-heatmap');
    const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
    for (let n; (n = walker.nextNode());) {
        const el = n.parentElement;
        if (heat.contains(el) || el.closest('script, style')) continue;
        for (const id of n.textContent.match(/(?<![\\w/#.-])C\\d+\\b/g) || [])
            if (!el.closest('a')) bad.push(`${id} in "${n.textContent.trim().slice(0, 80)}"`);
    }
    return bad;
}"""
ROOT = pathlib.Path(__file__).resolve().parents[1]


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    h = hex_colour.lstrip("#")
    return tuple(int(h[i : i + 2], 16) for i in (0, 2, 4))


def test_colours_are_distinct_and_unlike_empty_cells():
    """No two classifications within a small RGB distance, none near white (an empty cell) or the page grey."""
    rgb = {k: _rgb(v) for k, v in COLORS.items()}
    names = list(rgb)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert sum((x - y) ** 2 for x, y in zip(rgb[a], rgb[b])) ** 0.5 > 60, (a, b)
        assert sum((x - 255) ** 2 for x in rgb[a]) ** 0.5 > 120, f"{a} looks like an empty (white) cell"
    assert set(SYMBOLS) == set(COLORS) and len(set(SYMBOLS.values())) == len(SYMBOLS)


def _links_lead_somewhere(page) -> None:
    """Every case id is a link; in-page links find their row, file links a file that exists; the by-case table's
    notebook column links to notebooks."""
    assert page.evaluate(UNLINKED_IDS) == []
    hrefs = page.evaluate("() => [...document.querySelectorAll('a')].map(a => a.getAttribute('href'))")
    assert hrefs
    for href in set(hrefs):
        if href.startswith("#"):
            assert page.locator(f"[id='{href[1:]}']").count() == 1, href
        elif href.startswith("file:"):
            assert pathlib.Path(urllib.parse.unquote(urllib.parse.urlparse(href).path)).is_file(), href
        else:
            assert href.startswith("https://"), href
    rows = page.locator("#by-case + table tr[id^='case-']")
    for i in range(rows.count()):
        nb = rows.nth(i).locator("td").nth(6)
        if nb.inner_text() != "-":  # a case with no notebook (a standalone repro) says so
            assert nb.locator("a").get_attribute("href").endswith(".ipynb"), nb.inner_html()


def _open(p, chromium, profile):
    context = p.chromium.launch_persistent_context(
        profile,
        executable_path=chromium,
        args=ARGS,
        headless=True,
        viewport={"width": 1300, "height": 900},
        offline=True,
    )
    refused = []

    def only_local(route):
        url = route.request.url
        if url.startswith("file://") or url.startswith("data:"):
            route.continue_()
        else:
            refused.append(url)
            route.abort()

    context.route("**/*", only_local)
    return context, refused


def test_the_central_list_page_links_every_case_and_says_each_explanation_once(tmp_path):
    """The committed central list on its newest release, drawn as `matrix` writes it into docs/central-list."""
    from toolkit.analysis import store
    from toolkit.analysis.matrix import MatrixResult, Row

    sync_playwright, chromium = playwright_and_chromium()
    records = store.read_records(ROOT / "docs" / "central-list" / "results.jsonl.xz")
    release = lambda t: tuple(int(x) for x in re.findall(r"\d+", t.split("+")[0]))  # noqa: E731
    newest = max((r["_report"].environment.get("torch", "0") for r in records.values()), key=release)
    rows = [
        Row(k, r["_cell"], r["_report"])
        for k, r in records.items()
        if r["_report"].environment.get("torch") == newest and not r["_cell"].bare
    ]
    result = MatrixResult(rows, {"torch": newest, "device": "cpu"})
    folder = tmp_path / "docs" / "central-list"
    folder.mkdir(parents=True)
    # As `write` links it from docs/central-list: relative to the page, and so to this checkout's notebooks.
    (tmp_path / "notebooks").symlink_to(ROOT / "notebooks")
    page_path = folder / "matrix.html"
    page_path.write_text(result.html(notebooks="../../notebooks"))
    with sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
        context, refused = _open(p, chromium, profile)
        try:
            page = context.new_page()
            page.goto(page_path.as_uri())
            page.wait_for_selector("#matrix-heatmap .hm image", state="attached", timeout=60_000)
            # What a reader looks at first (the list by case) and longest (the works table).
            page.locator("#by-case + table").screenshot(path=str(tmp_path / "central-by-case.png"))
            page.locator("h3#works").evaluate("e => e.scrollIntoView()")
            page.screenshot(path=str(tmp_path / "central-works.png"))
            if os.environ.get("TOOLKIT_SCREENSHOTS"):
                for name in ("central-by-case.png", "central-works.png"):
                    shutil.copy(tmp_path / name, os.environ["TOOLKIT_SCREENSHOTS"])
            assert page.evaluate(UNLINKED_IDS) == []
            ids = page.locator("#by-case + table tr[id^='case-']").evaluate_all("rs => rs.map(r => r.id)")
            assert "case-C1" in ids and len(ids) >= 10  # C1 has no upstream thread: its id links to its notebook
            c1 = page.locator("#case-C1 td").first.locator("a").first
            assert c1.inner_text() == "C1" and c1.get_attribute("href").endswith("C01_order_matrix.ipynb")
            for href in set(page.evaluate("() => [...document.querySelectorAll('a')].map(a => a.href)")):
                if href.startswith("file:") and "#" not in href:
                    assert pathlib.Path(urllib.parse.unquote(urllib.parse.urlparse(href).path)).is_file(), href
            notebooks = page.locator("#by-case + table tr[id^='case-'] td:nth-child(7)")
            assert all(n.locator("a").count() == 1 for n in notebooks.all() if n.inner_text() != "-")
            # The works table: its cells grouped under the few explanations they share, each said once.
            works = page.locator("h3#works + table")
            heads = works.locator("tr.explanation").all_inner_texts()
            assert len(heads) == len(set(heads)) and len(heads) < works.locator("tr.cell").count() / 10, heads
            assert works.locator("tr.cell").count() == len(dict(result.central_list())["works"])
        finally:
            context.close()
    assert not refused


def test_matrix_page_in_headless_chromium(tmp_path):
    sync_playwright, chromium = playwright_and_chromium()
    result, cells = synthetic_matrix()
    page_path = tmp_path / "matrix.html"
    page_path.write_text(result.html())
    problems = []

    with sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
        context, refused = _open(p, chromium, profile)
        try:
            page = context.new_page()
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.goto(page_path.as_uri())
            page.wait_for_selector("#matrix-heatmap .hm image", state="attached", timeout=60_000)
            page.screenshot(path=str(tmp_path / "matrix.png"), full_page=True)
            if os.environ.get("TOOLKIT_SCREENSHOTS"):
                shutil.copy(tmp_path / "matrix.png", os.path.join(os.environ["TOOLKIT_SCREENSHOTS"], "matrix.png"))

            # A label in each cell, readable without hovering, and the recipes in a panel of their own.
            texts = page.evaluate(
                "() => [...document.querySelectorAll('#matrix-heatmap text')].map(t => t.textContent)"
            )
            joined = " ".join(texts)
            for label in cells:
                assert SYMBOLS[label] in joined, f"no {SYMBOLS[label]!r} ({label}) drawn in the heatmap"
            assert "recipes" in texts and "C2" in joined
            panels = page.evaluate("() => document.getElementById('matrix-heatmap')._fullData.map(t => t.name)")
            assert panels == ["moe:for_loop", "dense", "recipes"]

            # Each classification in its own colour; a cell the sweep did not run is transparent (the white page).
            drawn = page.evaluate(CELL_COLOURS)
            traces = {t.name: t for t in result.heatmap().data}
            seen: dict[str, tuple] = {}
            for panel in drawn:
                z = [v for row in traces[panel["name"]].z for v in row]
                for value, (r, g, b, a) in zip(z, panel["cells"]):
                    if value is None:
                        assert a == 0, f"an empty cell of {panel['name']} is drawn ({r}, {g}, {b}, {a})"
                        continue
                    label = _label_of(value)
                    want = _rgb(COLORS[label])
                    assert a == 255 and max(abs(x - y) for x, y in zip((r, g, b), want)) <= 3, (label, (r, g, b), want)
                    seen[label] = (r, g, b)
            assert set(seen) == set(cells)  # every classification was drawn, each in its colour
            assert len(set(seen.values())) == len(seen)
            background = page.evaluate("() => getComputedStyle(document.body).backgroundColor")
            assert background in ("rgba(0, 0, 0, 0)", "rgb(255, 255, 255)")

            # The list opens with its view by case; the per-classification tables below carry the backend column
            # and the bare rerun's verdict, as the markdown does.
            assert page.locator("h2").first.inner_text().startswith("By case (")
            heads = page.locator("table tr:first-child").all_inner_texts()
            assert heads[0].split("\t")[:2] == ["case", "cells"]
            assert heads[1:] and all("backend" in h and h.endswith("bare") for h in heads[1:])
            assert page.locator("h3").count() == len(cells)
            by_case = page.locator("#by-case + table td:first-child").all_inner_texts()
            assert {t.split()[0] for t in by_case} == {i for r in result.rows for i in r.classification.cases}
            # Every panel names its axes; a working cell's ids are explained on the page.
            titles = page.evaluate(
                "() => [...document.querySelectorAll('#matrix-heatmap .g-xtitle, #matrix-heatmap .g-ytitle')]"
                ".map(t => t.textContent)"
            )
            assert {"compile setup", "AC mode"} <= set(titles)
            assert "on a working cell they name the documented behaviour" in page.content()
            # Legend counts agree with the tables: each head says how many rows its table holds.
            counts = dict(
                zip(
                    page.locator("#legend .chip").all_inner_texts(),
                    (int(n) for n in page.locator("#legend .count").all_inner_texts()),
                )
            )
            for label, rows in result.central_list():
                assert counts[SYMBOLS[label]] == len(rows) == page.locator(f"h3#{label} + table tr.cell").count()
            chips = page.evaluate(
                "() => [...document.querySelectorAll('#legend .chip')].map(c => getComputedStyle(c).backgroundColor)"
            )
            assert len(set(chips)) == len(COLORS)
            _links_lead_somewhere(page)
        except Exception:
            page.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
            raise
        finally:
            context.close()
    assert not problems, "\n".join(problems)
    assert not refused, f"the page asked the network for {refused}"


def _label_of(z_value: float) -> str:
    from toolkit.analysis.classification import SEVERITY

    return SEVERITY[int(z_value)]


def test_the_committed_cell_page_filters_and_searches_offline(tmp_path):
    """docs/central-list/matrix.html (`cases --matrix-html`) as a reader opens it, from file:// with nothing fetched:
    the counts say every row is shown; a column's filter, then search words, narrow the rows to those that hold them
    (a case id's filter to the rows naming it) and the counts follow; `clear` shows every row again."""
    from toolkit.analysis.views.cells_html import COLUMNS

    sync_playwright, chromium = playwright_and_chromium()
    page_path = ROOT / "docs" / "central-list" / "matrix.html"
    rows = [
        [re.sub(r"<[^>]+>", "", c) for c in line.split("<td>")[1:]]
        for line in page_path.read_text().splitlines()
        if line.startswith("<tr><td>")
    ]
    col = {name: i for i, name in enumerate(COLUMNS)}
    newest = rows[-1][col["torch"]]
    wrong = [r for r in rows if r[col["torch"]] == newest and r[col["classification"]] == "grads_differ"]
    dropout = [r for r in wrong if "dropout" in " ".join(r).lower() and "inductor" in " ".join(r).lower()]
    case = next(r[col["cases"]].split()[0] for r in rows if r[col["cases"]] != "-")
    naming = [r for r in rows if case in r[col["cases"]].split()]
    assert 0 < len(dropout) < len(wrong) < len(rows)
    problems = []
    with sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
        context, refused = _open(p, chromium, profile)
        try:
            page = context.new_page()
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.goto(page_path.as_uri())

            def shown() -> tuple[int, str]:
                return page.locator("#cells tbody tr:not([hidden])").count(), page.locator("#n").inner_text()

            n, says = shown()
            assert n == len(rows) and says.startswith(f"{len(rows)} of {len(rows)} cells shown: ")
            page.select_option("select[aria-label='torch']", newest)
            page.select_option("select[aria-label='classification']", "grads_differ")
            n, says = shown()
            assert n == len(wrong) and says == f"{len(wrong)} of {len(rows)} cells shown: {len(wrong)} grads_differ"
            page.fill("#q", "Dropout  inductor")  # every word, anywhere in the row, in any case
            assert shown()[0] == len(dropout)
            page.screenshot(path=str(tmp_path / "cells.png"))
            page.click("#clear")
            assert shown()[0] == len(rows)
            page.select_option("select[aria-label='cases']", case)
            assert shown()[0] == len(naming)
        finally:
            context.close()
    assert not refused and not problems, (refused, problems)
