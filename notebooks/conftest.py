"""nbval settings for every notebook here: plots and widgets are not compared; the numbers are printed as text.

A notebook that needs an optional package says so in its setup cell, `tk.setup_notebook(needs=("torchtitan",))`;
without the package nbval skips it with the same one-line reason the notebook itself gives when opened."""

import functools
import json
import re

import pytest

# Bug bundles the notebooks export (`repro-out/`, ignored by git) are a run's output, not notebooks to check: a
# bundle reproduces its bug, so its own cells fail by design.
collect_ignore_glob = ["repro-out/*", "bugs/repro-out/*"]


def pytest_collectstart(collector):
    if collector.fspath and collector.fspath.ext == ".ipynb":
        collector.skip_compare += (
            "application/vnd.plotly.v1+json",
            "text/html",
            "application/javascript",
            "application/vnd.jupyter.widget-view+json",
            "image/png",
        )


@functools.lru_cache(maxsize=None)
def _needs(path) -> tuple[str, ...]:
    """The optional packages a notebook's `setup_notebook(needs=...)` names (read from its source, not run)."""
    for cell in json.loads(path.read_text())["cells"]:
        src = "".join(cell["source"])
        m = re.search(r"setup_notebook\([^)]*needs=\(?([^)]*)\)?", src)
        if m:
            return tuple(re.findall(r"[\"']([\w.]+)[\"']", m.group(1)))
    return ()


def pytest_collection_modifyitems(config, items):
    from toolkit.stacks import missing

    for item in items:
        if item.fspath.ext != ".ipynb":
            continue
        if "torchtitan" in _needs(item.path):
            item.add_marker(pytest.mark.extras)  # `-m extras` (tests/conftest.py)
        if item.path.parent.name == "bugs":
            # A bug notebook is its case's evidence on the release it runs on: `-m per_release` (tests/conftest.py).
            item.add_marker(pytest.mark.per_release)
        why = missing(_needs(item.path))
        if why:
            item.add_marker(pytest.mark.skip(reason=f"{item.path.name}: {why}"))
