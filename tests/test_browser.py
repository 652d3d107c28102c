"""The Explorer in a real browser: JupyterLab + headless Chromium (Debian's, driven by Playwright), no browser download.

Opens notebooks/00_quickstart.ipynb at Playwright's default window size (1280 × 720, JupyterLab's file browser open),
runs all cells (the notebook's own asserts check its prose against the widget's defaults), then checks what a user
sees: no control label cut, every slider (the disabled ones too) drawing a track, long summary lines kept whole.
It unticks `fullgraph`, clicks Run, and checks that the Explorer's plotly figures (the pinned-run comparison among
them) and graph-break table render, that the status lines name the silent failure and the run just made, that no
dropdown shows a blank at its default, and that the browser console shows no errors. Widget or plotly versions that
render nothing in JupyterLab fail here. Screenshots (`explorer.png`, `controls.png`, `compare.png`) are kept in the
test's tmp folder and, when TOOLKIT_SCREENSHOTS names a folder, copied there. Outside CI it skips when Playwright or
Chromium is missing; in CI (`CI` set) it fails instead, since `.ci/run` installs both.
"""

import os
import pathlib
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from _helpers import playwright_and_chromium

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The for_loop experts' `.tolist()`: the graph break the table must point at (found, not hard-coded).
_MOE = pathlib.Path(__file__).resolve().parents[1] / "toolkit" / "models" / "moe.py"
TOLIST_LINE = next(i for i, line in enumerate(_MOE.read_text().splitlines(), 1) if "counts_E.tolist()" in line)

# Every cell ran, or one failed (Run All stops there; the test then names the error instead of timing out).
ALL_RAN = """() => {
    const p = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(e => e.textContent.trim());
    const failed = document.querySelector(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']");
    return (p.length > 0 && p.every(t => /^\\[\\d+\\]:$/.test(t))) || (failed && !p.some(t => t.includes('*')));
}"""
# What a user sees of each control: a label or button text cut short (ellipsis) or a control past the Explorer's right
# edge, a slider whose track is squeezed away or drawn too faint to see.
LAYOUT = """e => {
    const right = e.getBoundingClientRect().right + 1;
    const cut = [...e.querySelectorAll('.widget-label, button, .widget-checkbox label')]
        .filter(x => x.offsetParent !== null
                     && (x.scrollWidth > x.clientWidth + 1 || x.getBoundingClientRect().right > right))
        .map(x => x.textContent.trim() || x.outerHTML.slice(0, 80));
    const sliders = [...e.querySelectorAll('.widget-slider')].map(x => {
        const track = x.querySelector('.noUi-connects'), target = x.querySelector('.noUi-target');
        return {label: x.querySelector('.widget-label').textContent, width: track.getBoundingClientRect().width,
                colour: getComputedStyle(track).backgroundColor, opacity: +getComputedStyle(target).opacity,
                disabled: target.hasAttribute('disabled')};
    });
    // Each label sits left of its control, on the same line (the toggle buttons' label once sat above them).
    const above = [...e.querySelectorAll('.widget-label')].filter(l => l.offsetParent !== null).filter(l => {
        const control = l.nextElementSibling;
        if (!control) return false;
        const a = l.getBoundingClientRect(), b = control.getBoundingClientRect();
        return b.left < a.right - 1 || b.top >= a.bottom || b.bottom <= a.top;
    }).map(l => l.textContent);
    return {cut, sliders, above};
}"""
STARTED = """() => [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]
    .some(e => /\\[(\\*|\\d+)\\]/.test(e.textContent))"""


@pytest.fixture
def lab(tmp_path):
    """JupyterLab on a free localhost port with a random token, serving a copy of the quickstart notebook."""
    import nbformat

    # Without its committed outputs, so that every execution prompt the test waits for is this run's.
    nb = nbformat.read(ROOT / "notebooks" / "00_quickstart.ipynb", as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nbformat.write(nb, tmp_path / "00_quickstart.ipynb")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(16)
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / ".config"), "JUPYTER_RUNTIME_DIR": str(tmp_path / ".rt")}
    log = open(tmp_path / "lab.log", "w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter",
            "lab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={tmp_path}",
            "--ServerApp.allow_root=True",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"JupyterLab did not start:\n{(tmp_path / 'lab.log').read_text()[-3000:]}")
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/lab/tree/00_quickstart.ipynb?token={token}"
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_explorer_renders_and_runs_in_jupyterlab(lab, tmp_path):
    sync_playwright, chromium = playwright_and_chromium()
    problems = []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium, args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
        )
        page = browser.new_page()  # the default window: 1280 × 720
        page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        try:
            page.goto(lab)
            page.wait_for_selector(".jp-Notebook .jp-CodeCell", timeout=120_000)
            # JupyterLab may ask which kernel to start even for a known kernelspec: take the proposed one.
            select = page.locator(".jp-Dialog button:has-text('Select')")
            try:
                select.wait_for(timeout=5_000)
                select.click()
            except Exception:
                pass
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
            for _ in range(3):  # a menu opened while the app is still settling can swallow the click
                page.click(".lm-MenuBar-itemLabel:text-is('Run')")
                page.click(".lm-Menu-itemLabel:text-is('Run All Cells')")
                try:
                    page.wait_for_function(STARTED, timeout=20_000)
                    break
                except Exception:
                    page.keyboard.press("Escape")
            page.wait_for_function(ALL_RAN, timeout=300_000)
            # Every cell ran without an error: the notebook's asserts (its prose against the widget's defaults) held.
            errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
            assert not [t for t in errors.all_inner_texts() if "Error" in t], errors.all_inner_texts()
            news = page.locator(".jp-Notification-Toast button:text-is('No')")  # "get notified about news?" toast
            if news.count():
                news.first.click()
            explorer = page.locator(".jp-OutputArea-output .widget-vbox").first
            explorer.evaluate("e => e.scrollIntoView()")
            page.wait_for_timeout(300)
            page.screenshot(path=str(tmp_path / "controls.png"))
            seen = explorer.evaluate(LAYOUT)
            assert not seen["cut"], f"cut off at 1280 × 720: {seen['cut']}"
            assert not seen["above"], f"labels not left of their controls: {seen['above']}"
            # layers, experts, top-k, every N-th and budget; the last two disabled in full AC, and still a slider.
            assert len(seen["sliders"]) == 5 and sum(s["disabled"] for s in seen["sliders"]) == 2, seen["sliders"]
            for s in seen["sliders"]:
                assert s["width"] >= 40 and s["colour"] not in ("rgba(0, 0, 0, 0)", "transparent"), s
                assert s["opacity"] >= 0.6, s  # ipywidgets' own 0.35 leaves a disabled track nearly invisible
            assert (
                explorer.locator(".widget-dropdown").count() >= 8
                and explorer.locator("button.widget-button").count() >= 4
            )
            # Every dropdown shows its choice: value None used to select nothing ("order", "recipe" blank).
            shown = explorer.locator(".widget-dropdown select").evaluate_all(
                "els => els.map(s => [s.parentElement.querySelector('label').textContent, "
                "s.selectedIndex >= 0 ? s.options[s.selectedIndex].text : ''])"
            )
            shown = [
                [label.replace("\xa0", " "), text.replace("\xa0", " ")] for label, text in shown
            ]  # ipywidgets' nbsp
            assert all(text.strip() for _, text in shown), shown
            assert dict(shown).get("order") == "as the scope implies"
            assert dict(shown).get("recipe") == "(none: use the controls)"
            # The notebook's last run was fullgraph=True (one graph, no break); untick it and run from the browser.
            box = explorer.locator(".widget-checkbox:has-text('fullgraph') input[type=checkbox]")
            assert box.is_checked()
            box.uncheck()
            explorer.locator("button.widget-button:has-text('Run')").first.click()
            table = explorer.locator("table:has(th:text-is('where'))")
            table.locator("td:has-text('Data dependent operator')").wait_for(timeout=300_000)
            assert f"moe.py:{TOLIST_LINE}" in table.inner_text()
            assert "fell back to eager" in explorer.inner_text()  # C2, seen from the browser
            assert "done: fell_back_to_eager [silent failure]" in explorer.inner_text()  # the status line says so
            # The status lines follow the run just made: what the controls describe now, and what the last run was.
            summary = explorer.locator(".widget-html pre").first
            label = summary.inner_text().split(": fell_back_to_eager", 1)[0]
            assert label.startswith("for_loop | AC full | compile blocks (aot_eager")
            status = explorer.locator(".widget-html:has-text('ready:')").inner_text()
            assert status.splitlines() == [f"ready: {label}", f"last run: {label} → fell_back_to_eager"], status
            # Long summary lines stay whole (JupyterLab wraps a <pre> mid-word): the block scrolls sideways instead.
            assert summary.evaluate("e => getComputedStyle(e).whiteSpace") == "pre"
            plots = explorer.locator(".widget-output .js-plotly-plot")
            plots.nth(3).locator(".main-svg").first.wait_for(timeout=60_000)
            assert plots.count() >= 4
            assert "saved for backward by module" in plots.first.inner_text()
            # The notebook compared its two pinned runs: the comparison is drawn as well as written.
            compare = explorer.locator(".js-plotly-plot:has-text('A vs B')")
            assert compare.count() == 1 and "where the runs differ" in compare.inner_text()
            explorer.locator(".widget-html:has-text('ready:')").evaluate("e => e.scrollIntoView()")
            page.wait_for_timeout(300)
            page.screenshot(path=str(tmp_path / "explorer.png"))
            compare.screenshot(path=str(tmp_path / "compare.png"))
            if os.environ.get("TOOLKIT_SCREENSHOTS"):
                for name in ("controls.png", "explorer.png", "compare.png"):
                    shutil.copy(tmp_path / name, os.path.join(os.environ["TOOLKIT_SCREENSHOTS"], name))
        except Exception:
            page.screenshot(path=str(tmp_path / "failure.png"))
            raise
        finally:
            browser.close()
    assert not problems, "\n".join(problems)
