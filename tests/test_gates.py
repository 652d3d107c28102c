"""The write gate, searched: whatever is planted in a sweep folder in place of the files the toolkit keeps there (a
symlink to a user's file, a FIFO, a folder), no byte outside the folder changes, and the refusal names the file and
the fix; and nothing in the toolkit writes a file except through `toolkit._files`."""

import ast
import os
import pathlib
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from toolkit import _files
from toolkit._config import ConfigError
from toolkit.analysis import store

ROOT = pathlib.Path(__file__).resolve().parents[1]
KINDS = ("symlink", "dangling_symlink", "fifo", "directory")
OWNED = (store.LOCK, store.RESULTS, *store.OUTPUTS)


def _plant(path: pathlib.Path, kind: str, victim: pathlib.Path) -> None:
    if kind == "symlink":
        path.symlink_to(victim)
    elif kind == "dangling_symlink":
        path.symlink_to(victim.with_name("nowhere"))
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(OWNED), kind=st.sampled_from(KINDS), content=st.binary(max_size=64))
def test_nothing_planted_in_a_sweep_folder_is_written_through(tmp_path_factory, name, kind, content):
    """The sweep folder's own files, each replaced by each kind of thing: opening the folder is refused as a
    ConfigError on `sweep.out` naming the file, or goes on without touching it; the user's file the link points to
    keeps every byte, and nothing blocks (a FIFO in place of the lock or the results)."""
    tmp = tmp_path_factory.mktemp("gate")
    victim = tmp / "users_file.txt"
    victim.write_bytes(content)
    out = tmp / "out"
    out.mkdir()
    _plant(out / name, kind, victim)
    try:
        with store.Folder(out) as folder:
            folder.append({"key": "k"})
    except ConfigError as e:
        assert e.owner == "sweep" and e.field == "out" and name in str(e), e
    assert victim.read_bytes() == content
    assert sorted(p.name for p in tmp.iterdir()) == ["out", "users_file.txt"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(OWNED), content=st.binary(min_size=1, max_size=64))
def test_a_users_own_file_by_a_sweeps_name_is_never_cut_appended_to_or_replaced(tmp_path_factory, name, content):
    """A regular file of someone else's in a sweep folder, named as the sweep's own (notes.txt saved as
    results.jsonl, a matrix.md of one's own): the sweep refuses the folder on `sweep.out`, naming it, and the file
    keeps every byte (an empty file, a page that begins as the toolkit writes it, results with a record in them are
    the sweep's).
    A results.jsonl whose last line had no newline used to lose that line as 'torn'."""
    from hypothesis import assume

    tmp = tmp_path_factory.mktemp("own")
    out = tmp / "out"
    out.mkdir()
    if name == store.RESULTS:  # the sweep's own results may hold junk lines: it is theirs if one line is a record
        assume(not any(line.startswith(store._RECORD_BEGINS) for line in content.split(b"\n")))
    else:
        start = {**store._BEGINS, store.LOCK: b"pid "}[name]
        assume(not (content.startswith(start) or start.startswith(content)))
    (out / name).write_bytes(content)
    with pytest.raises(ConfigError) as e:
        with store.Folder(out) as folder:
            folder.append({"key": "k"})
    assert e.value.field == "out" and name in str(e.value)
    assert (out / name).read_bytes() == content


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(KINDS), mode=st.sampled_from(["a", "r+", "r+b"]), content=st.binary(max_size=64))
def test_the_writer_opens_only_the_regular_file_it_keeps(tmp_path_factory, kind, mode, content):
    """`_files.open_own`, the one way a kept file is written in place: each planted kind is refused in one line
    (`WriteFailed`), without following a link or blocking on a FIFO; a regular file opens."""
    tmp = tmp_path_factory.mktemp("own")
    victim = tmp / "victim"
    victim.write_bytes(content)
    target = tmp / "kept"
    _plant(target, kind, victim)
    with pytest.raises(_files.WriteFailed) as e:
        _files.open_own(target, mode).close()
    assert "kept" in str(e.value) and "\n" not in str(e.value)
    assert victim.read_bytes() == content
    regular = tmp / "regular"
    with _files.open_own(regular, "a") as f:
        f.write("x\n")
    assert regular.read_text() == "x\n"


def _writes(tree: ast.AST) -> list[int]:
    """Lines that write a file by path: `open(..., mode)` with a write mode, `Path.write_text/write_bytes/touch`."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
        if name in ("write_text", "write_bytes", "touch") and isinstance(node.func, ast.Attribute):
            if getattr(node.func.value, "id", None) != "_files":
                found.append(node.lineno)
        elif name == "open" and getattr(node.func, "id", None) == "open":
            modes = [a for a in node.args[1:2]] + [k.value for k in node.keywords if k.arg == "mode"]
            if any(isinstance(m, ast.Constant) and set(str(m.value)) & set("wax+") for m in modes):
                found.append(node.lineno)
    return found


def _outside(door: set[str], find) -> dict[str, list[int]]:
    """The lines of the package, outside the files of `door`, where `find(tree)` finds a bypass. The standalone
    repros are torch-only scripts, pasted into upstream issues: not the toolkit's doors."""
    offenders = {}
    for path in sorted((ROOT / "toolkit").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in door or rel.startswith("toolkit/bugs/standalone/"):
            continue
        lines = find(ast.parse(path.read_text()))
        if lines:
            offenders[rel] = lines
    return offenders


def _calls_of(modules: set[str], names: set[str]):
    """A finder of `module.name(...)` calls, for `_outside`."""

    def find(tree: ast.AST) -> list[int]:
        return [
            n.lineno
            for n in ast.walk(tree)
            if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr in names
            and getattr(n.func.value, "id", None) in modules
        ]

    return find


def test_no_file_is_written_outside_the_writer():
    """Every file the toolkit writes goes through `toolkit._files` (atomic, or `open_own` for the files it appends
    to): no `open(path, "w"/"a"/...)`, `write_text` or `write_bytes` elsewhere in the package."""
    assert _outside({"toolkit/_files.py"}, _writes) == {}


def test_a_symlinked_lock_is_refused_from_the_command_line_and_its_target_kept(tmp_path):
    """README's route: `matrix --out DIR` where DIR/.sweep.lock links to a user's file: exit 2 before any cell runs,
    one line naming the link and the fix, the user's file byte for byte as it was."""
    victim = tmp_path / "notes.txt"
    victim.write_text("mine\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / store.LOCK).symlink_to(victim)
    done = subprocess.run(
        [sys.executable, "-m", "toolkit", "matrix", "--quick", "--out", str(out), "--only", "^dense"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2, done.stdout[-1000:] + done.stderr[-1000:]
    assert "is a symlink" in done.stderr and "Fix: remove the link" in done.stderr and "Traceback" not in done.stderr
    assert victim.read_text() == "mine\n" and os.readlink(out / store.LOCK) == str(victim)


# -- the escapers: one per output kind (toolkit/_escape.py) ------------------------------------------------------------

_NASTY = st.text(
    alphabet=st.one_of(
        st.characters(codec="utf-8"),
        st.sampled_from(list("<>[]()|`\\!\n") + ["\x1b", "\u202e", "\u200d", "\ud800"]),
    ),
    max_size=80,
) | st.sampled_from(
    ["<script>alert(1)</script>", "<img src=x onerror=alert(1)>", "[x](javascript:alert(1))", "![i](data:text/html,x)"]
)


@settings(max_examples=300, deadline=None)
@given(text=_NASTY)
def test_markdown_text_is_inert_whatever_it_holds(text):
    """No tag, no link or image, no code span, no cell break and no unsafe character survives `_escape.markdown`;
    it stays one line."""
    import re

    from toolkit import _escape

    out = _escape.markdown(text)
    assert "\n" not in out and "<" not in out and ">" not in out
    assert not any(_escape.unsafe(c) for c in out)
    # Every [, ], |, ` is backslashed (a backslash before it that is itself escaped would be "\\\\[").
    assert not re.search(r"(?<!\\)(\\\\)*[\[\]|`]", out)


@settings(max_examples=300, deadline=None)
@given(text=_NASTY)
def test_terminal_and_html_text_hold_no_unsafe_character(text):
    from toolkit import _escape

    assert not any(_escape.unsafe(c) for c in _escape.terminal(text))
    out = _escape.html(text)
    assert not any(_escape.unsafe(c) for c in out) and "<" not in out and '"' not in out
    (out.encode("utf-8"))  # a lone surrogate would raise here: printed output must encode


@settings(max_examples=300, deadline=None)
@given(text=_NASTY | st.sampled_from(["..", ".", "../../etc/passwd", "-rf", ".hidden", "CON", "a/b\\c", "_" * 90]))
def test_a_file_name_made_from_any_text_stays_in_its_folder(tmp_path_factory, text):
    """`_escape.file_name` (a bundle named after a scenario): the name is one plain entry of the folder (no separator,
    not `.` or `..`, not hidden, not an option), short, and creating it makes exactly that entry."""
    import re

    from toolkit import _escape

    name = _escape.file_name(text, "repro")
    assert re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,58}[a-z0-9]|[a-z0-9]", name), name
    folder = tmp_path_factory.mktemp("names")
    (folder / name).write_text("x")
    assert [p.name for p in folder.iterdir()] == [name]


@settings(max_examples=200, deadline=None)
@given(text=_NASTY)
def test_a_name_is_refused_when_a_terminal_could_not_show_it(text):
    """`check_text` (every name a user gives): a control, a bidi override or a lone surrogate is refused, naming the
    field, before any work."""
    from toolkit import _escape
    from toolkit._config import check_text

    if any(_escape.unsafe(c) for c in text) or len(text) > 200:
        with pytest.raises(ConfigError, match="Scenario.name"):
            check_text("Scenario", "name", text)
    else:
        check_text("Scenario", "name", text)


def test_a_record_that_carries_markup_reaches_matrix_md_inert(tmp_path):
    """A cell's error text holding a tag, a javascript: link and a pipe (a merged record from elsewhere, or an
    exception message): matrix.md shows it as text."""
    import toolkit as tk
    from toolkit.analysis.cells import Cell
    from toolkit.measurement.report import ErrorInfo, ScenarioRecord

    evil = "<script>alert(1)</script> [x](javascript:alert(1)) a|b"

    def runner(scenario):
        return tk.Report(
            outcome="error",
            scenario=ScenarioRecord.of(scenario),
            error=ErrorInfo("RuntimeError", evil, "forward"),
        )

    tk.sweep([Cell("dense", "none")], out=tmp_path / "out", progress=False, runner=runner)
    md = (tmp_path / "out" / "matrix.md").read_text()
    import re

    assert "alert(1)" in md  # shown, as text
    assert "<script" not in md and "a|b" not in md
    assert not re.search(r"(?<!\\)\]\(javascript:", md)  # a link needs an unescaped "](": none


def test_a_record_that_carries_markup_reaches_the_cell_page_and_the_picture_inert():
    """A merged record's block name and torch version holding tags (the records are read from anywhere): the cell
    page (matrix.html) and the picture (heatmap.svg) show them as text, and the picture stays well-formed XML."""
    import dataclasses
    import xml.etree.ElementTree as ET

    from _helpers import synthetic_matrix

    from toolkit.analysis.matrix import MatrixResult
    from toolkit.analysis.views import cells_html, svg

    result, _ = synthetic_matrix()
    evil = '<img src=x onerror="alert(1)">'
    rows = [dataclasses.replace(r, cell=dataclasses.replace(r.cell, block=evil)) for r in result.rows]
    marked = MatrixResult(rows, {"torch": "2.99<b>"})
    page = cells_html.page({"2.99<b>": marked}, case_href=lambda i: f'x"><script>{i}', title=evil, note=evil)
    assert "<img" not in page and "<b>" not in page and '"><script>' not in page
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in page and "2.99&lt;b&gt;" in page
    picture = svg.figure(marked, title=evil)
    assert "<img" not in picture and ET.fromstring(picture).tag.endswith("svg")


# -- the record reader: one door for results.jsonl, resume and --merge (toolkit/analysis/store.py) ------------------


@pytest.fixture(scope="module")
def a_record(tmp_path_factory):
    """One real record, as a sweep writes it (one eager cell, measured)."""
    import toolkit as tk
    from toolkit.analysis.cells import Cell

    out = tmp_path_factory.mktemp("rec") / "out"
    tk.sweep(
        [Cell("dense", "none")],
        out=out,
        progress=False,
        runner=lambda s: tk.run(s.replace(check_numerics=False, measure_memory=False, steady_steps=0)),
    )
    return (out / store.RESULTS).read_text().splitlines()[0]


def _leaves(obj, path=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(obj, list) and obj:
        for i, v in enumerate(obj):
            yield from _leaves(v, (*path, i))
    else:
        yield path


def _off_enum(obj, where="Report"):
    """Every field of a record whose type is a closed set (`Literal[...]`) but whose value is not one of it: walked
    from the type hints here, not through the reader's own conversion."""
    import dataclasses
    import typing

    if dataclasses.is_dataclass(obj):
        hints = typing.get_type_hints(type(obj))
        for f in dataclasses.fields(obj):
            value, tp = getattr(obj, f.name), hints[f.name]
            if typing.get_origin(tp) is typing.Literal and value not in typing.get_args(tp):
                yield f"{where}.{f.name}={value!r}"
            yield from _off_enum(value, f"{where}.{f.name}")
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _off_enum(v, where)


_JUNK = st.sampled_from(
    [
        "text",
        "other",
        "ok",
        "module",
        -1,
        10**300,
        None,
        [],
        {},
        True,
        1.5,
        [[[[[]]]]],
        "\u202e",
        {"nested": {"x": [1]}},
    ]
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), junk=_JUNK)
def test_the_record_reader_keeps_what_is_a_record_and_names_what_is_not(a_record, tmp_path_factory, data, junk):
    """A results.jsonl with a real record, then the same record with one leaf replaced by junk: reading never
    raises; the real record is kept; the other is skipped with its line number and why, or, where the junk fits the
    schema, read as a Report whose counts are counts and whose page renders."""
    import json

    rec = json.loads(a_record)
    paths = list(_leaves(rec["report"]))
    path = data.draw(st.sampled_from(paths))
    bad = json.loads(a_record)
    node = bad["report"]
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = junk
    bad["key"] = "another key"
    f = tmp_path_factory.mktemp("read") / store.RESULTS
    f.write_text(a_record + "\n" + json.dumps(bad) + "\n")
    records, skipped = store.read_results(f)
    assert rec["key"] in records
    if "another key" in records:
        report = records["another key"]["_report"]
        assert report.saved.total_bytes >= 0 and isinstance(report.saved.total_bytes, int)
        assert not list(_off_enum(report)), list(_off_enum(report))
        str(report)  # renders
    else:
        assert [s.line for s in skipped] == [2] and skipped[0].why


def test_records_that_are_not_records_are_skipped_and_the_page_is_still_written(a_record, tmp_path):
    """The audit's records: outcome error with a null error, a string where bytes belong, a 200,000-deep list, a
    negative and a 300-digit byte count, and a truncated .xz passed to --merge: each line is skipped and named, the
    sweep's page is written from the rest."""
    import json
    import lzma

    import toolkit as tk
    from toolkit.analysis.cells import Cell

    def variant(change, key):
        rec = json.loads(a_record)
        change(rec["report"])
        rec["key"] = key
        return json.dumps(rec)

    lines = [
        a_record,
        variant(lambda r: r.update(outcome="error", error=None), "k1"),
        variant(lambda r: r["saved"].update(total_bytes="12 KiB"), "k2"),
        variant(lambda r: r["saved"].update(total_bytes=-5), "k3"),
        variant(lambda r: r["saved"].update(total_bytes=10**300), "k4"),
        '{"key": "k5", "cell": ' + "[" * 200_000 + "]" * 200_000 + ', "report": {}}',
    ]
    out = tmp_path / "out"
    out.mkdir()
    (out / store.RESULTS).write_text("\n".join(lines) + "\n")
    records, skipped = store.read_results(out / store.RESULTS)
    assert list(records) == [json.loads(a_record)["key"]]
    assert [s.line for s in skipped] == [2, 3, 4, 5, 6], skipped
    assert "needs the error" in skipped[0].why and "Report.saved.total_bytes" in skipped[1].why
    # A truncated archive: the records before the cut stand, the cut is named.
    whole = lzma.compress(("\n".join([a_record] * 3) + "\n").encode())
    xz = tmp_path / "other.jsonl.xz"
    xz.write_bytes(whole[: len(whole) // 2])
    got, cut = store.read_results(xz)
    assert cut and "archive ends" in cut[-1].why
    # The sweep over the folder runs nothing (its one cell is recorded) and writes its page.
    calls = []
    tk.sweep([Cell("dense", "none")], out=out, progress=False, runner=lambda s: calls.append(s))
    assert calls == [] and (out / "matrix.md").exists() and (out / "matrix.html").exists()


# -- the terminal: what is replayed, and how wide ----------------------------------------------------------------


@pytest.mark.parametrize("code, replays", [(0, True), (4, True), (99, False), (True, False), ("0", False)])
def test_a_stamp_replays_only_what_the_toolkit_can_revalidate(tmp_path, capsys, code, replays):
    """A hand-edited `.matrix-stamp.json` whose inputs still match: an exit code `matrix` cannot end with is not
    replayed (the sweep runs as usual), and the text it replays has its escape sequences and bidi overrides shown,
    not run."""
    import json

    from toolkit import _stamp

    out = tmp_path / "out"
    out.mkdir()
    argv = ["matrix", "--out", str(out)]
    printed = {"stdout": [["ok \x1b[2J\u202eevil", False]], "stderr": ["\x1b]0;title\x07 x"], "code": code}
    (out / _stamp.STAMP).write_text(json.dumps({"inputs": _stamp.inputs(argv, out, ()), "printed": printed}))
    got = _stamp.replay(argv, ())
    said = capsys.readouterr()
    if not replays:
        assert got is None and said.out == ""
        return
    assert got == code and "\x1b" not in said.out + said.err and "\u202e" not in said.out
    assert "\\x1b[2J" in said.out and "\\u202e" in said.out


_ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.floats(allow_nan=False) | _NASTY,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["a", "code", "stdout"]), inner),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    stdout=st.lists(st.tuples(_NASTY, st.booleans()).map(list), max_size=3) | _ANY_JSON,
    stderr=st.lists(_NASTY, max_size=3) | _ANY_JSON,
    code=st.sampled_from([0, 1, 2, 3, 4, 5, 130, -1, True, False, "0", None, 1.0]) | _ANY_JSON,
)
def test_a_forged_stamp_replays_nothing_a_terminal_would_act_on(tmp_path_factory, capsys, stdout, stderr, code):
    """A search over hand-edited stamps whose inputs still match: `replay` never raises; it answers with an exit
    code `matrix` can end with, or not at all; nothing it prints holds a character a terminal would act on."""
    import json

    from toolkit import _escape, _stamp

    out = tmp_path_factory.mktemp("stamp") / "out"
    out.mkdir()
    argv = ["matrix", "--out", str(out)]
    printed = {"stdout": stdout, "stderr": stderr, "code": code}
    (out / _stamp.STAMP).write_text(json.dumps({"inputs": _stamp.inputs(argv, out, ()), "printed": printed}))
    got = _stamp.replay(argv, ())
    said = capsys.readouterr()
    assert got is None or (type(got) is int and got in _stamp.REPLAYABLE_CODES)
    assert (got is None) == (said.out + said.err == "")
    assert not any(_escape.unsafe(c) and c != "\n" for c in said.out + said.err)


_FINDING = st.fixed_dictionaries(
    {
        "case": st.sampled_from(["C2", "C65", "C9999", "c2", "C2<script>", "", "C2\u202e"]) | _NASTY,
        "torch": st.sampled_from(["2.14.1", "2.13.0+cpu", "2.14", "2.14.1+<b>", "x"]) | _NASTY,
        "reproduced": st.sampled_from([True, False, 1, "yes", None]),
    }
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(_FINDING.map(lambda f: __import__("json").dumps(f)) | _ANY_JSON.map(str), max_size=4))
def test_a_findings_file_is_read_whole_or_refused_naming_its_line(tmp_path_factory, monkeypatch, lines):
    """A search over findings files (`TOOLKIT_FINDINGS`, which `cases --findings` shows in its tables): each file is
    read as findings of the checked form (a case id, a release, a verdict), or refused with a ConfigError naming it;
    the Markdown table made from what was read is inert."""
    import re

    from toolkit.analysis import catalogue

    f = tmp_path_factory.mktemp("findings") / "findings.jsonl"
    f.write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("TOOLKIT_FINDINGS", str(f))
    try:
        got = catalogue.findings()
    except ConfigError as e:
        assert e.owner == "TOOLKIT_FINDINGS" and "line" in e.problem
        return
    for case, releases in got.items():
        assert re.fullmatch(r"C\d{1,4}", case)
        assert all(
            re.fullmatch(r"\d+\.\d+\.\d+", r) and v in ("reproduced", "not reproduced") for r, v in releases.items()
        )
    md = catalogue.markdown(catalogue.cases()[:3], with_findings=True)
    assert "<script" not in md and "\u202e" not in md


@settings(max_examples=150, deadline=None)
@given(data=st.data(), junk=_JUNK)
def test_a_scenario_file_is_a_checked_scenario_or_refused_naming_its_field(data, junk):
    """A search over `--config` files: a real scenario with one leaf replaced by junk is read as a Scenario that
    writes itself back the same, or refused with a ConfigError naming a field of Scenario or of its parts. Never
    another exception, and never a Scenario holding what its own check would refuse."""
    import json

    import toolkit as tk

    good = tk.measurement.preset("moe_full_ac").replace(compile=tk.CompileConfig(scope="blocks")).to_dict()
    path = data.draw(st.sampled_from(list(_leaves(good))))
    bad = json.loads(json.dumps(good))
    node = bad
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = junk
    try:
        sc = tk.Scenario.from_json(json.dumps(bad))
    except ConfigError as e:
        assert e.owner and "Traceback" not in str(e)
        return
    again = tk.Scenario.from_json(sc.to_json())
    assert again == sc
    sc.replace(name=sc.name)  # every check passes again on the Scenario read


def test_a_fifo_in_place_of_the_stamp_does_not_block(tmp_path):
    """`matrix` reads the stamp as a regular file only: a FIFO there means "no stamp", read without opening it."""
    from toolkit import _stamp

    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / _stamp.STAMP)
    assert _stamp.replay(["matrix", "--out", str(out)], ()) is None  # returns: it did not open the FIFO


@pytest.mark.parametrize("columns", ["1000000000", "0", "-5", "junk"])
def test_a_table_width_is_what_a_terminal_can_hold(columns):
    """COLUMNS set to anything: `cases` lays its table out at most 1000 and at least 20 columns wide."""
    done = subprocess.run(
        [sys.executable, "-m", "toolkit", "cases"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": columns},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert max(len(line) for line in done.stdout.splitlines()) <= 1000


@pytest.mark.parametrize("arg", [{"cpu": "nonsense"}, {"needs": "tpu"}, {"notebook": "yes"}, {"text": "a\u202eb"}])
def test_a_catalogue_filter_that_no_case_can_match_is_refused(arg):
    from toolkit.analysis import catalogue

    with pytest.raises(ConfigError, match=f"catalogue.filter.{next(iter(arg))}"):
        catalogue.filter(**arg)


# -- arguments: one check each, before any work ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda tk: tk.CompileConfig(dynamic=0), "CompileConfig.dynamic"),
        (lambda tk: tk.run(tk.Scenario(), threads=10**6), "run.threads"),
        (lambda tk: tk.transforms.prepare("model"), "prepare.model"),
        (lambda tk: tk.transforms.prepare(tk.build_model(tk.ModelConfig(n_layers=1)), ac="full"), "prepare.ac"),
        (
            lambda tk: tk.transforms.prepare(
                tk.build_model(tk.ModelConfig(n_layers=1)), compile=tk.CompileConfig(scope="blocks", order="ac_outside")
            ),
            "CompileConfig.order",
        ),
    ],
)
def test_an_argument_that_would_fail_inside_torch_or_do_nothing_is_refused_naming_it(call, field):
    """The audit's arguments: `dynamic=0` (0 == False, but not a bool: it failed inside torch), `threads=10**6` (a
    SIGSEGV), `prepare()` given a string or a mode name, `order` with no AC (ignored, silently)."""
    import toolkit as tk

    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        call(tk)


@settings(max_examples=60, deadline=None)
@given(keys=st.lists(st.sampled_from(["a", "b", "name", "ac"]), min_size=2, max_size=6))
def test_a_json_key_given_twice_is_refused_naming_it(keys):
    """Every JSON the toolkit reads (`_files.loads`: --config, records, findings): a key given twice is refused, not
    decided by which came last."""
    import json

    text = "{" + ", ".join(f"{json.dumps(k)}: {i}" for i, k in enumerate(keys)) + "}"
    if len(set(keys)) == len(keys):
        assert _files.loads(text, "x", "y") == {k: i for i, k in enumerate(keys)}
    else:
        with pytest.raises(ConfigError, match="twice"):
            _files.loads(text, "x", "y")


@pytest.mark.parametrize(
    "argv",
    [
        ["cases", "--cpu", "gpu_only", "--cpu", "reproduced"],
        ["matrix", "--quick", "--out", "a", "--out=b", "--dry-run"],
        ["run", "--preset", "x", "--preset", "y"],
    ],
)
def test_an_option_given_twice_is_refused_naming_it(argv, capsys):
    from toolkit.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "is given 2 times" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "argv, option",
    [
        (["run", "--list", "--json"], "--json"),
        (["run", "--list", "--nproc", "1"], "--nproc"),
        (["run", "--preset", "moe_full_ac", "--nproc", "2", "--strict"], "--strict"),
        (["run", "--preset", "moe_full_ac", "--nproc=2", "--isolate"], "--isolate"),
        (["cases", "--check", "C2", "--markdown"], "--markdown"),
        (["cases", "--check", "C2", "--cpu", "reproduced"], "--cpu"),
        (["cases", "--page", "--matrix-html"], "--matrix-html"),
        (["cases", "--matrix-html", "--heatmap-svg"], "--heatmap-svg"),
        (["cases", "--heatmap-svg", "--text", "router"], "--text"),
        (["matrix", "--blocks", "Block", "--dry-run"], "--blocks"),
        (["matrix", "--cold", "--executor", "ray", "--dry-run"], "--cold"),
    ],
)
def test_an_option_that_would_do_nothing_is_refused_naming_why(argv, option, capsys):
    """`run --list --json` printed the list and dropped --json; `cases --check C2 --markdown` ran C2's repro and
    dropped the table's option: each now exits 2 before any work, naming the option."""
    assert _exit_code(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") or "error:" in err.splitlines()[-1]
    assert option in err and ("would do nothing" in err or "would ignore it" in err) and "Traceback" not in err


def _exit_code(argv: list[str]) -> int:
    """What `python -m toolkit ARGV` exits with (argparse's own refusals leave through SystemExit)."""
    from toolkit.cli import main

    try:
        return main(argv)
    except SystemExit as e:
        return e.code


class _WouldRun(Exception):
    """Raised in place of a measurement: the CLI got past every check with this scenario."""


_JUNK_VALUES = ["0", "-1", "1e309", "nan", "x", "\u202ex", "\x1b[31m", "10000000000", "", "C999", "aot_eager", "2"]
_OPTIONS = {
    "run": ["--preset", "--config", "--list", "--json", "--isolate", "--timeout-s", "--strict", "--no-refs", "--nproc"],
    "cases": ["--cpu", "--needs", "--text", "--findings", "--markdown", "--check", "--page"],
    "plan": [
        "--preset", "--config", "--shape", "--layers", "--budget", "--world-size", "--backend", "--ac", "--scope",
        "--json",
    ],
    "matrix": [
        "--quick", "--full", "--backend", "--stack", "--only", "--timeout-s", "--workers", "--executor", "--cold",
        "--cluster", "--time-min", "--cpus-per-cell", "--keep-timeouts", "--no-bare", "--blocks", "--model",
    ],
}  # fmt: skip


_GOOD = {
    "--preset": "moe_full_ac", "--timeout-s": "5", "--nproc": "2", "--cpu": "reproduced", "--needs": "cpu",
    "--text": "router", "--check": "C2", "--backend": "aot_eager", "--stack": "toolkit", "--only": "AC full",
    "--workers": "1", "--executor": "local", "--cluster": "local", "--time-min": "5", "--cpus-per-cell": "1",
    "--budget": "1GiB", "--world-size": "2", "--shape": "deepseek_v3_layer", "--layers": "2", "--ac": "full",
    "--scope": "blocks",
}  # fmt: skip
"""A value each option takes, so that the search also reaches command lines that pass every check."""


@st.composite
def _argv(draw):
    command = draw(st.sampled_from(sorted(_OPTIONS)))
    argv = [command]
    if command in ("run", "plan") and draw(st.booleans()):
        argv += ["--preset", _GOOD["--preset"]]  # the one option `run` needs, so that more lines get through
    if command == "plan" and draw(st.booleans()):
        argv += ["--budget", _GOOD["--budget"]]
    for opt in draw(st.lists(st.sampled_from(_OPTIONS[command]), max_size=4)):
        argv.append(opt)
        value = draw(st.sampled_from(["none", "good", "junk"]))
        if value == "good" and opt in _GOOD:
            argv.append(_GOOD[opt])
        elif value == "junk":
            argv.append(draw(st.sampled_from(_JUNK_VALUES) | st.text(max_size=8)))
    if command == "matrix":
        argv.append("--dry-run")  # a matrix that passed its checks lists its cells and runs none
    return argv


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(argv=_argv())
def test_any_command_line_is_run_or_refused_in_one_line_never_a_traceback(argv, monkeypatch, capsys, tmp_path):
    """A search over command lines (each command's options, in any mix, with junk values): the CLI exits 0 or 2,
    a refusal is one `error:` line naming an option, and nothing it prints holds a character a terminal would act on.
    A `run` that gets through is stopped where it would measure, holding a checked Scenario."""
    from toolkit import _escape, bugs, execution
    from toolkit.analysis import plan

    def would_run(scenario, *a, **k):
        raise _WouldRun(scenario)

    monkeypatch.setattr(execution, "run", would_run)
    monkeypatch.setattr(execution, "run_distributed", would_run)
    monkeypatch.setattr(bugs, "check", would_run)  # `cases --check C2` would run a repro
    monkeypatch.setattr(plan, "plan", would_run)  # a plan would size ~20 setups
    monkeypatch.chdir(tmp_path)
    try:
        code = _exit_code(argv)
    except _WouldRun as e:
        assert type(e.args[0]).__name__ in ("Scenario", "str"), e.args
        event(f"{argv[0]}: would run")
        return
    out, err = capsys.readouterr()
    event(f"{argv[0]}: exit {code}")
    assert code in (0, 2), (argv, code, err)
    assert "Traceback" not in err
    assert not any(_escape.unsafe(c) and c != "\n" for c in out + err), (argv, out[-300:], err[-300:])
    if code == 2:
        assert "error:" in err.strip().splitlines()[-1], (argv, err)


_ARG_JUNK = [True, -1, 0, 10**12, 1.5, float("nan"), "x", None, [], {}, b"x", "\u202e", ("x",), print]


def _public_calls(tmp):
    """Each public function and argument the search tries: (call with that argument, the values of `_ARG_JUNK` that
    are valid there). Everything else must be a ConfigError naming the argument, raised before any work."""
    import torch

    import toolkit as tk

    tiny, x, sc = torch.nn.Linear(4, 4), torch.randn(2, 4), tk.measurement.preset("moe_eager")
    model = tk.build_model()
    return {
        ("measure", "loss_fn"): (lambda v: tk.measure(tiny, x, loss_fn=v), [None, print]),
        ("measure", "reference"): (lambda v: tk.measure(tiny, x, reference=v), [None]),
        ("measure", "cold"): (lambda v: tk.measure(tiny, x, cold=v), [True]),
        ("measure", "steady_steps"): (lambda v: tk.measure(tiny, x, steady_steps=v), [0]),
        ("measure", "forward_kwargs"): (lambda v: tk.measure(tiny, x, forward_kwargs=v), [None, {}]),
        ("measure", "name"): (lambda v: tk.measure(tiny, x, name=v), ["x"]),
        ("run", "on_stage"): (lambda v: tk.run(sc, on_stage=v), [None, print]),
        ("run", "threads"): (lambda v: tk.run(sc, threads=v), [None]),
        ("run", "isolate"): (lambda v: tk.run(sc, isolate=v), [True]),
        ("run", "timeout_s"): (lambda v: tk.run(sc, timeout_s=v), [None]),
        ("run_distributed", "nproc"): (lambda v: tk.run_distributed(sc, nproc=v), []),
        ("sweep", "runner"): (lambda v: tk.sweep([], out=tmp, runner=v), [None, print]),
        ("sweep", "backends"): (lambda v: tk.sweep([], out=tmp, backends=v), []),
        ("sweep", "stack"): (lambda v: tk.sweep([], out=tmp, stack=v), []),
        ("sweep", "quick"): (lambda v: tk.sweep([], out=tmp, quick=v), [True]),
        ("sweep", "workers"): (lambda v: tk.sweep([], out=tmp, workers=v), []),
        ("make_batch", "cfg"): (lambda v: tk.make_batch(v), [None]),
        ("make_batch", "seed"): (lambda v: tk.make_batch(seed=v), [None, 0, 10**12]),
        ("build_model", "cfg"): (lambda v: tk.build_model(v), [None]),
        ("preset", "name"): (lambda v: tk.measurement.preset(v), []),
        ("recipe", "name"): (lambda v: tk.transforms.apply_recipe(model, v), []),
        ("setup_notebook", "seed"): (lambda v: tk.setup_notebook(seed=v), [0, 10**12]),
        ("setup_notebook", "autoreload"): (lambda v: tk.setup_notebook(autoreload=v), [True, None]),
        ("setup_notebook", "needs"): (lambda v: tk.setup_notebook(needs=v), [[]]),
        ("setup_notebook", "threads"): (lambda v: tk.setup_notebook(threads=v), [None]),
        ("reset", "dynamo"): (lambda v: tk.transforms.reset(model, dynamo=v), [True]),
        ("estimate", "cuda_rounding"): (lambda v: tk.estimate(sc, cuda_rounding=v), [True]),
        ("classify", "report"): (lambda v: tk.classify(v), []),
    }


@pytest.fixture(scope="module")
def public_calls(tmp_path_factory):
    return _public_calls(tmp_path_factory.mktemp("calls") / "out")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), junk=st.sampled_from(_ARG_JUNK))
def test_every_public_function_refuses_a_wrong_argument_naming_it(public_calls, data, junk):
    """A search over the public functions' arguments with values of every kind (a bool where a count belongs, a
    huge or negative count, NaN, bytes, a bidi override, a container, a function): each is taken, when it is one
    of the argument's valid values, or refused with a ConfigError on that argument. `make_batch(cfg={})` used to
    be the default config, `setup_notebook(seed=True)` seeded with 1, `run(on_stage=0)` measured a step that ended
    on `'int' object is not callable`, `sweep([], backends='x')` was ignored: each is refused now."""
    from hypothesis import assume

    (owner, field), (call, valid) = data.draw(st.sampled_from(sorted(public_calls.items(), key=lambda kv: kv[0])))
    assume(not any(type(v) is type(junk) and v == junk for v in valid))
    with pytest.raises(ConfigError) as e:
        call(junk)
    assert e.value.field == field, (owner, field, junk, str(e.value))


@pytest.mark.parametrize("export", ["bugs", "sweep"])
def test_an_empty_folder_name_is_refused_wherever_a_folder_is_taken(export, tmp_path, monkeypatch):
    """`bugs.export(case, "")` wrote into the working directory while `sweep(out="")` refused: one check now."""
    import toolkit as tk

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="names no folder"):
        tk.bugs.export("C27", "") if export == "bugs" else tk.sweep([], out="", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_jupyterlab_ends_with_the_lab_command_even_after_kill_minus_nine(tmp_path):
    """`python -m toolkit lab` killed with SIGKILL: the JupyterLab it started is gone within seconds (it was left
    serving, an orphan)."""
    import signal
    import time

    import psutil

    lab = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "toolkit",
            "lab",
            "--no-browser",
            "--ServerApp.port=0",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.root_dir={tmp_path}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")},
    )
    deadline = time.monotonic() + 120
    children: list = []
    while time.monotonic() < deadline and not children:
        children = psutil.Process(lab.pid).children(recursive=True)
        time.sleep(0.2)
    assert children, "JupyterLab did not start"
    lab.send_signal(signal.SIGKILL)
    lab.wait()
    gone, alive = psutil.wait_procs(children, timeout=60)
    assert alive == [], [p.cmdline() for p in alive]


def test_submitit_without_slurm_runs_no_more_cells_at_once_than_the_machine_has_cores(monkeypatch):
    """Where there is no Slurm, submitit runs each task as a local process, all submitted at once: a load of 52 on 2
    cores. The executor now hands it at most cores / cpus_per_cell tasks at a time. A stand-in for submitit's
    local executor counts the tasks running together (the real one is exercised by tests/test_sweeps.py)."""
    import itertools

    from toolkit.analysis import executors
    from toolkit.analysis.cells import Cell

    running, most, seen = set(), [0], itertools.count()

    class Task:
        def __init__(self, cells):
            self.cells, self.job_id, self.polls = cells, next(seen), 0
            running.add(self)
            most[0] = max(most[0], len(running))

        def done(self):
            self.polls += 1
            if self.polls > 2:
                running.discard(self)
                return True
            return False

        def result(self):
            return []

    class Local:
        cluster = "local"

        def submit(self, fn, cells, threads, me):
            return Task(cells)

    monkeypatch.setattr(executors.SubmititExecutor, "_executor", lambda self, folder: Local())
    monkeypatch.setattr(executors, "_reports", lambda chunk, result, where: iter([(j, None) for j in chunk]))
    monkeypatch.setattr(executors.time, "sleep", lambda s: None)
    monkeypatch.setattr(executors.os, "cpu_count", lambda: 2)
    jobs = [executors.Job(f"k{i}", Cell("dense", "none"), None) for i in range(9)]
    out = list(executors.SubmititExecutor(cluster="local", cells_per_job=1, cpus_per_cell=1).run(jobs, None))
    assert len(out) == 9 and most[0] == 2


def _reads(tree: ast.AST) -> list[int]:
    """Lines that read a file by path: `Path.read_text/read_bytes`, a builtin, `lzma` or `gzip` `open(...)` for
    reading."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in ("read_text", "read_bytes"):
            found.append(node.lineno)
        elif isinstance(f, ast.Name) and f.id == "open":
            found.append(node.lineno)
        elif isinstance(f, ast.Attribute) and f.attr == "open" and getattr(f.value, "id", None) in ("lzma", "gzip"):
            found.append(node.lineno)
    return found


def test_no_file_is_read_outside_the_reader():
    """Every file the toolkit reads goes through `toolkit._files` (a regular file, capped, strictly decoded; a page's
    head without blocking on a FIFO) or, for results.jsonl and its archives, the record reader that streams it line by
    line (analysis/store.py). A Scenario file, a rank's report, the catalogue and a user's model file were each read
    with a bare `read_text()`."""
    assert _outside({"toolkit/_files.py", "toolkit/analysis/store.py"}, _reads) == {}


def test_no_json_is_read_outside_the_readers():
    """Every JSON the toolkit reads from a file, a record or a user goes through `_files.loads` (duplicate keys,
    depth, digits: one door) or, for results.jsonl, the record reader built on the same hook (analysis/store.py).
    The fork server's messages between its own processes are the one other place."""
    allowed = {"toolkit/_files.py", "toolkit/analysis/store.py", "toolkit/execution/forkserver.py"}
    assert _outside(allowed, _calls_of({"json"}, {"loads", "load"})) == {}


def test_every_renderer_escapes_through_the_one_escaper_of_its_kind():
    """HTML, Markdown and terminal text is escaped by `toolkit/_escape.py` alone: no `html.escape` elsewhere (three
    renderers each called it on their own, one of them missing what a terminal cannot show)."""
    assert _outside({"toolkit/_escape.py"}, _calls_of({"html", "_h", "_html"}, {"escape"})) == {}
