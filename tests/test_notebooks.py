"""What nbval cannot check about the committed notebooks: one setup call, no stray lines, no machine-specific text."""

import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "notebooks" / "bugs").glob("*.ipynb"))


def cells(path):
    return json.loads(path.read_text())["cells"]


def outputs(path):
    for cell in cells(path):
        for out in cell.get("outputs", []):
            text = out.get("text") or out.get("data", {}).get("text/plain", "")
            yield out, "".join(text) if isinstance(text, list) else text


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_each_notebook_sets_up_once_and_renders_clean_markdown(path):
    code = ["".join(c["source"]) for c in cells(path) if c["cell_type"] == "code"]
    assert sum(s.count("tk.setup_notebook(") for s in code) == 1
    for c in cells(path):
        if c["cell_type"] == "markdown":
            first = "".join(c["source"]).split("\n", 1)[0].strip()
            assert first not in ("md", "markdown"), f"stray {first!r} line above a markdown cell"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_outputs_carry_no_machine_or_checkout_specifics(path):
    for out, text in outputs(path):
        assert out.get("name") != "stderr", f"stderr in a committed output: {text[:300]}"
        assert "/work/" not in text and "/root/" not in text and "/home/" not in text, text[:300]
        # CPU peaks depend on the machine: printed with "~" (masked by notebooks/sanitize.cfg), never bare.
        for line in text.splitlines():
            if re.search(r"\bpeak\b", line) and "profiler" in line:
                assert re.search(r"peak ~\d", line), line
        assert "execution" not in json.dumps([c.get("metadata", {}) for c in cells(path)])


def sanitized(text: str) -> str:
    """`text` as nbval compares it: every rule of notebooks/sanitize.cfg applied."""
    import configparser

    cfg = configparser.RawConfigParser()  # as nbval reads it: "%" is literal
    cfg.read(ROOT / "notebooks" / "sanitize.cfg")
    for section in cfg.sections():
        text = re.sub(cfg[section]["regex"], cfg[section]["replace"], text)
    return text


def _execute_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("notebooks_execute", ROOT / "notebooks" / "execute.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


BUILD = _execute_module().BUILD
"""A torch build string (2.13.0+cpu, 2.14.1+cu130): it names the wheel the notebook last ran on (one home:
notebooks/execute.py, which strips it from what it commits)."""


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_committed_output_names_the_machine_it_ran_on(path):
    """Every output as committed (ignored cells and figures included): no torch build, no run's environment line.
    `python notebooks/execute.py` commits the sanitizer's placeholders in their place (`--strip` does only that)."""
    for i, cell in enumerate(cells(path)):
        for out in cell.get("outputs", []):
            text = json.dumps({k: out.get(k) for k in ("text", "data")})
            assert not BUILD.search(text), f"{path.name} cell {i}: {BUILD.search(text).group(0)}"
            assert not re.search(r"this run:  (?!<ENVIRONMENT>)", text), f"{path.name} cell {i}: an environment line"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_compared_outputs_name_no_torch_build(path):
    """nbval compares every output not marked NBVAL_IGNORE_OUTPUT: after the sanitizer, none may name the torch build
    or release it ran on (README's install takes the CUDA build, CI stage 2 the CPU one; both must pass)."""
    for cell in cells(path):
        source = "".join(cell.get("source", ""))
        if cell["cell_type"] != "code" or "NBVAL_IGNORE_OUTPUT" in source or "NBVAL_SKIP" in source:
            continue
        for out in cell.get("outputs", []):
            text = out.get("text") or out.get("data", {}).get("text/plain", "")
            text = sanitized("".join(text) if isinstance(text, list) else text)
            assert not BUILD.search(text), f"{path.name}: a torch build in a compared output: {text[:300]}"
            assert "torch.__version__" not in text


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_nbval_markers_are_alone_on_their_line(path):
    """nbval reads a marker only when the comment is the marker and nothing else: `# NBVAL_IGNORE_OUTPUT (why)` is
    silently an ordinary comment, and the cell's output is compared after all. The reason goes on its own line."""
    from nbval.plugin import comment_markers

    for c in cells(path):
        for line in "".join(c["source"]).splitlines():
            comment = line.strip().lstrip("#").strip()
            if line.strip().startswith("#") and comment.startswith(("NBVAL_", "PYTEST_VALIDATE_")):
                assert comment in comment_markers, f"{comment!r} is no nbval marker: put the reason on the next line"


def test_a_notebook_without_its_optional_package_stops_with_one_line(monkeypatch):
    """`setup_notebook(needs=(...))` without the package: one line naming it and its install (IPython shows
    `_render_traceback_` instead of a traceback); nbval skips such a notebook with the same reason."""
    from toolkit.notebook.setup import MissingExtra, setup_notebook

    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "torch_remat" else object())
    with pytest.raises(MissingExtra) as info:
        setup_notebook(needs=("torch_remat",))
    (line,) = info.value._render_traceback_()
    assert line.startswith("MissingExtra: this notebook needs torch_remat") and 'pip install -e ".[dev]"' in line


def test_each_notebook_that_needs_an_optional_package_says_so_in_its_setup_call():
    """The remat notebooks name torch_remat and notebook 08 torchtitan, so that without them they stop (or skip)
    with the reason instead of failing half-way."""
    needs = {}
    for path in NOTEBOOKS:
        code = "".join("".join(c["source"]) for c in cells(path) if c["cell_type"] == "code")
        m = re.search(r"setup_notebook\(needs=\((.*?)\)\)", code)
        needs[path.name] = m.group(1) if m else ""
        if "torch_remat" in code or 'mode="remat"' in code or "torchtitan_main" in code:
            assert "torch_remat" in needs[path.name], path.name
        if 'stack="torchtitan"' in code:
            assert "torchtitan" in needs[path.name], path.name
    assert needs["08_torchtitan_in_the_loop.ipynb"] == '"torchtitan",'


TEACHING = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _links(markdown: str) -> list[str]:
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", markdown) if not t.startswith(("http://", "https://", "#"))]


def test_the_instructors_kit_walks_every_teaching_notebook_and_its_links_resolve():
    """notebooks/README.md (the 90-minute path, the install check, the glossary) names every teaching notebook, and
    every file it links exists: a renamed notebook cannot leave the kit pointing nowhere."""
    kit = (ROOT / "notebooks" / "README.md").read_text()
    linked = _links(kit)
    assert [p.name for p in TEACHING if p.name not in linked] == []
    assert [t for t in linked if not (ROOT / "notebooks" / t).exists()] == []
    # The install check's commands are the command line's own.
    for command in re.findall(r"^python -m toolkit (\w+)", kit, flags=re.M):
        assert command in ("env", "demo", "lab", "cases", "matrix", "plan", "run"), command


@pytest.mark.parametrize("path", TEACHING, ids=lambda p: p.name)
def test_each_teaching_notebook_ends_saying_what_comes_next(path):
    """The last cell is a **Next:** link to the following notebook (the last one: the central list and the bug
    notebooks), and every file it links exists."""
    last = cells(path)[-1]
    text = "".join(last["source"])
    assert last["cell_type"] == "markdown" and text.startswith("**Next:** "), text[:200]
    targets = _links(text)
    following = TEACHING[TEACHING.index(path) + 1 :]
    assert targets and (not following or targets[0] == following[0].name), targets
    assert [t for t in targets if not (path.parent / t).exists()] == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_markdown_types_a_source_line_number(path):
    """A line of the model file moves with every edit; the outputs print it from the source (`moe.py:249`), and the
    prose refers to what they print ("the line the table names"), never to a number typed beside them."""
    typed = [
        m.group(0)
        for c in cells(path)
        if c["cell_type"] == "markdown"
        for m in re.finditer(r"\blines? \d{2,}\b|\.py:\d+", "".join(c["source"]))
    ]
    assert typed == []


@pytest.mark.parametrize("path", [p for p in TEACHING if int(p.name[:2]) <= 9], ids=lambda p: p.name)
def test_each_notebook_on_the_lab_path_asks_before_it_shows_and_ends_with_exercises(path):
    """The 90-minute path and the three notebooks after it (notebooks/README.md): every **Predict first.** question
    comes before a run and is answered in a fold after it, and three exercises close the notebook with their answers
    folded."""
    kinds = [c["cell_type"] for c in cells(path)]
    texts = ["".join(c["source"]) for c in cells(path)]
    asks = [i for i, t in enumerate(texts) if kinds[i] == "markdown" and t.startswith("**Predict first.**")]
    assert asks, "no question before a run"
    for i in asks:
        run = kinds.index("code", i)
        answer = next(j for j in range(run, len(texts)) if kinds[j] == "markdown")
        assert texts[answer].startswith("<details><summary><b>Answer:</b>"), (i, texts[answer][:80])
    (ex,) = [t for t in texts if t.startswith("## Exercises")]
    assert len(re.findall(r"^\d\. ", ex.split("<details>")[0], flags=re.M)) == 3 and "<details><summary>Answers" in ex
