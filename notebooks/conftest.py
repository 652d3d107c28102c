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


@functools.lru_cache(maxsize=None)
def repro_cases(path) -> tuple[str, ...]:
    """The cases whose standalone repro a bug notebook runs and confirms (`tk.bugs.script("CNN")` or
    `tk.bugs.check("CNN")` in its code), read from its source."""
    code = "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")
    return tuple(sorted(set(re.findall(r"bugs\.(?:script|check)\(\s*[\"'](C\d+)[\"']", code))))


def _differs_between_releases(path) -> bool:
    """A case the notebook is named for, or whose repro it runs, has another verdict on another release (C14)."""
    from toolkit.analysis import catalogue

    named = {f"C{int(n)}" for n in re.findall(r"C(\d+)", path.name)}
    return any(len(set(catalogue.get(c).verified.values())) > 1 for c in named | set(repro_cases(path)))


def pytest_collection_modifyitems(config, items):
    from toolkit.stacks import missing

    for item in items:
        if item.fspath.ext != ".ipynb":
            continue
        if "torchtitan" in _needs(item.path):
            item.add_marker(pytest.mark.extras)  # `-m extras` (tests/conftest.py)
        if item.path.parent.name == "bugs":
            runs = repro_cases(item.path)
            item.add_marker(pytest.mark.runs_repros(*runs))
            # What can differ between releases, `-m per_release` (tests/conftest.py): a notebook whose case is shown by
            # a Scenario, not a repro (the notebook is its only check), or whose verdict is not the same on every
            # release. The others' repros are checked there once each, by tests/test_bugs.py, without a kernel;
            # README's stage runs every notebook (and no repro twice: tests/conftest.py).
            if not runs or _differs_between_releases(item.path):
                item.add_marker(pytest.mark.per_release)
        why = missing(_needs(item.path))
        if why:
            item.add_marker(pytest.mark.skip(reason=f"{item.path.name}: {why}"))
