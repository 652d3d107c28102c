"""`python -m toolkit …` as a terminal user meets it, in subprocesses: the classification first, exit codes, readable
tables, help for every subcommand and option, no torch log noise, and every bad input refused with its fix."""

import json
import os
import subprocess
import sys

import pytest
import torch

import toolkit as tk
from toolkit import cli
from toolkit.analysis import catalogue
from toolkit.analysis.catalogue import torch_release

ENV = {**os.environ, "PYTHONWARNINGS": "ignore", "COLUMNS": "80"}


def toolkit(*args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "toolkit", *args], capture_output=True, text=True, env=ENV, timeout=timeout
    )


def test_run_puts_the_silent_failure_on_the_first_line_and_strict_fails_on_it():
    out = toolkit("run", "--preset", "graph_break_in_checkpoint", "--strict")
    lines = out.stdout.splitlines()
    assert lines[0].startswith(
        "graph_break_in_checkpoint: fell_back_to_eager [silent failure] — compile requested, "
        "but layers.0, layers.1 ran eagerly (0 graphs); known case C2"
    ), out.stdout
    assert "  step outcome: ok" in lines and "not checked" not in out.stdout  # the reference run without AC ran
    assert out.returncode == cli.EXIT_SILENT == 3, out.stderr
    assert "Traceback" not in out.stderr


def test_run_without_strict_exits_0_and_says_what_it_did_not_check():
    out = toolkit("run", "--preset", "graph_break_in_checkpoint", "--no-refs")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0].startswith("graph_break_in_checkpoint: fell_back_to_eager")
    assert "  not checked: ac_saves_nothing (they compare with the same setup run without AC)" in out.stdout


def test_run_of_a_working_scenario_says_works_and_passes_strict():
    out = toolkit("run", "--preset", "moe_eager", "--strict")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "moe_eager: works — ran eagerly (no compile requested), gradients match eager"


def test_run_json_keeps_stdout_a_report_and_puts_the_classification_on_stderr():
    from toolkit import Report

    out = toolkit("run", "--preset", "pr2052", "--json", "--strict")
    assert out.returncode == cli.EXIT_FAILED == 1  # the step raised: a failure, not a silent one
    assert Report.from_json(out.stdout).outcome == "error"
    first, data = out.stderr.strip().splitlines()[-2:]
    assert first.startswith("pr2052: error — Unsupported at forward") and "known case C4" in first
    assert json.loads(data)["classification"]["label"] == "error"


@pytest.mark.parametrize(
    "args, words",
    [
        (["--preset", "moe_eager", "--timeout-s", "5"], "--timeout-s needs --isolate"),
        (["--preset", "moe_eager", "--isolate", "--timeout-s", "-1"], "-1 is not a positive number of seconds"),
        (["--preset", "moe_eager", "--isolate", "--timeout-s", "nan"], "nan is not a positive number of seconds"),
    ],
)
def test_bad_timeouts_are_usage_errors(args, words):
    out = toolkit("run", *args, timeout=120)
    assert out.returncode == 2 and words in out.stderr and "Traceback" not in out.stderr
    assert out.stdout == ""  # refused before anything ran


@pytest.mark.parametrize(
    "content, words",
    [
        ("[1, 2, 3]", "Scenario: the JSON holds a list, not an object of Scenario fields."),
        (
            '{"compile": "blocks"}',
            'Scenario.compile: is the string "blocks", not an object of CompileConfig fields. '
            'Fix: write "compile": {"scope": "blocks"}',
        ),
        ('{"model": null}', "Scenario.model: is null, not an object of ModelConfig fields."),
        ('{"ac": {"mode": "full", "layer_every": 3}}', "ACConfig.layer_every: is only used by mode='selective_layer'"),
        (
            '{"model": {"n_layers": 2,}}',
            "is not valid JSON: Expecting property name enclosed in double quotes at line 1",
        ),
    ],
)
def test_bad_config_files_name_the_file_and_the_fix(tmp_path, content, words):
    path = tmp_path / "scenario.json"
    path.write_text(content)
    out = toolkit("run", "--config", str(path), timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.startswith(f"error: --config {path}") and words in out.stderr, out.stderr
    assert "Fix:" in out.stderr and "Traceback" not in out.stderr


def test_a_missing_config_file_is_named(tmp_path):
    out = toolkit("run", "--config", str(tmp_path / "nowhere.json"), timeout=120)
    assert (
        out.returncode == 2 and f"{tmp_path / 'nowhere.json'}: cannot read it (No such file or directory)" in out.stderr
    )


def test_cases_is_a_terminal_table_with_the_installed_torch():
    out = toolkit("cases", timeout=120)
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["id", "case", "status", "needs", "nb", "torch", torch_release()]
    assert torch_release() == torch.__version__.split("+")[0]
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    # Titles wrapped, no markdown: about 340 characters a case (20,848 for the 61 cases of 2026-12).
    assert "| --- |" not in out.stdout and len(out.stdout) < 400 * len(catalogue.cases())
    c2 = next(i for i, line in enumerate(lines) if line.startswith("C2 "))
    assert lines[c2].split()[-3:] == ["cpu", "yes", "reproduced"]  # needs, has a notebook, this torch's verdict
    md = toolkit("cases", "--markdown", timeout=120)
    assert md.returncode == 0 and md.stdout.startswith(
        "| id | case | status | upstream | CPU | needs | torch | notebook |"
    )


def test_help_describes_every_subcommand_and_every_run_option():
    out = toolkit("--help", timeout=120)
    assert out.returncode == 0
    overview = out.stdout.split("subcommands:", 1)[1]
    for name in ("demo", "run", "cases", "env", "matrix"):
        assert f"\n  {name} " in overview, name
    parser = cli._parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name in ("demo", "run", "cases"):
        for action in sub.choices[name]._actions:
            assert action.help, f"{name} {action.option_strings} has no help text"
    run_help = toolkit("run", "--help", timeout=120).stdout
    assert "exit codes:" in run_help and "--strict" in run_help and "--no-refs" in run_help


def _imports(*args, cwd=None):
    """The modules `python -X importtime -m toolkit ARGS` imported (importtime lists each on stderr)."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "toolkit", *args],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=cwd,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}


def test_commands_that_measure_nothing_do_not_import_dynamo(tmp_path):
    """`import toolkit`, `--help`, `cases` and `matrix` on a folder whose every cell is cached load neither Dynamo
    nor AOTAutograd (seconds of a re-run that measures nothing); `compat` detects torch's features when first asked."""
    from toolkit.analysis.cells import Cell
    from toolkit.analysis.sweeps import sweep

    heavy = {"torch._dynamo", "torch._functorch.aot_autograd"}
    for args in (["--help"], ["matrix", "--help"], ["cases"]):
        assert not heavy & _imports(*args), args
    quick = dict(check_numerics=False, measure_memory=False, steady_steps=0)
    sweep([Cell("dense")], out=tmp_path, progress=False, runner=lambda s: tk.run(s.replace(**quick)))
    cached = _imports("matrix", "--only", "^dense \\| AC none \\| eager", "--out", str(tmp_path), "--no-progress")
    assert "toolkit.analysis.sweeps" in cached and not heavy & cached


def test_matrix_run_again_unchanged_answers_from_its_stamp_without_importing_torch(tmp_path):
    """`python -m toolkit matrix` run again on a folder it left with nothing to run prints the same summary and exit
    code from the folder's stamp, importing no torch (a cached re-run took 3 s, nearly all `import torch`); a change
    to results.jsonl, an output, the arguments or the toolkit's own files runs the sweep as usual."""
    from toolkit import _stamp
    from toolkit.analysis.cells import Cell
    from toolkit.analysis.sweeps import sweep

    quick = dict(check_numerics=False, measure_memory=False, steady_steps=0)
    # A cell that works and one that falls back to eager (C2: its bare rerun is in the folder too).
    cells = [Cell("dense"), Cell("moe:for_loop", "full", "blocks")]
    first = sweep(cells, out=tmp_path, progress=False, runner=lambda s: tk.run(s.replace(**quick)))
    assert sorted(r.classification.label for r in first.rows) == ["fell_back_to_eager", "works"]
    assert all(r.bare is not None for r in first.rows if r.classification.label != "works")
    args = ["matrix", "--only", "^dense \\| AC none \\| eager|^moe:for_loop \\| AC full \\| blocks \\| aot_eager$"]
    args += ["--out", str(tmp_path), "--no-progress"]

    def matrix(*extra):
        out = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "toolkit", *args, *extra],
            capture_output=True,
            text=True,
            env=ENV,
            timeout=600,
        )
        imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if "import time:" in line}
        stderr = [line for line in out.stderr.splitlines() if not line.startswith("import time:")]
        return out.returncode, out.stdout.splitlines(), stderr, "torch" in imported

    code, swept, err, torch_imported = matrix()
    assert code == 0 and torch_imported, err
    assert swept[-1].startswith(f"wrote {tmp_path / 'matrix.json'}") and (tmp_path / _stamp.STAMP).is_file()
    assert any(line.endswith("…") for line in swept), "COLUMNS=80 cuts the reasons"
    pages = {name: (tmp_path / name).read_bytes() for name in ("matrix.json", "matrix.md", "matrix.html")}
    # Again, unchanged: the same lines (the reasons cut to the same width), nothing imported, nothing written.
    code, again, err2, torch_imported = matrix()
    assert (code, torch_imported, err2) == (0, False, err)
    assert again[:-1] == swept[:-1]
    assert again[-1].startswith("up to date: nothing to run, nothing written"), again[-1]
    assert {name: (tmp_path / name).read_bytes() for name in pages} == pages
    # --no-progress is not part of what the stamp compares; every other argument is.
    assert matrix()[3] is False and subprocess.run(
        [sys.executable, "-m", "toolkit", *args[:-1]], capture_output=True, env=ENV, timeout=600
    ).stdout.splitlines()[-1].startswith(b"up to date")
    assert matrix("--no-bare")[3] is True  # other arguments: swept as usual (and stamped for those)
    assert matrix()[3] is True  # the stamp is now --no-bare's
    assert matrix()[3] is False
    # A changed or missing output, a line added to results.jsonl: swept as usual, the output written again.
    (tmp_path / "matrix.md").unlink()
    code, swept_again, _, torch_imported = matrix()
    assert torch_imported and swept_again[-1].startswith("wrote") and (tmp_path / "matrix.md").read_bytes()
    assert matrix()[3] is False
    with open(tmp_path / "results.jsonl", "a") as f:
        f.write("\n")
    assert matrix()[3] is True
    assert matrix()[3] is False


def test_matrix_stamps_only_a_folder_with_nothing_left_to_run(tmp_path):
    """A cell that timed out once under this limit is retried by the next run: not settled, so not stamped (with
    --keep-timeouts it is kept, and settled). A stamp is the folder's, checked in full: one for other arguments, with
    --merge, or copied from another folder answers nothing."""
    from toolkit import _stamp
    from toolkit.analysis.cells import Cell
    from toolkit.analysis.sweeps import settled, sweep
    from toolkit.execution.isolate import timeout_report

    def timed_out(scenario):
        return timeout_report(scenario, 5, b"", 5.0)

    result = sweep([Cell("dense")], out=tmp_path, progress=False, runner=timed_out, timeout_s=5)
    assert [r.report.outcome for r in result.rows] == ["timeout"]
    assert not settled(result, out=tmp_path, timeout_s=5, retry_timeouts=True, bare=True)
    assert settled(result, out=tmp_path, timeout_s=5, retry_timeouts=False, bare=True)
    result = sweep([Cell("dense")], out=tmp_path, progress=False, runner=timed_out, timeout_s=5)
    assert settled(result, out=tmp_path, timeout_s=5, retry_timeouts=True, bare=True)  # twice: kept
    assert not settled(result, out=tmp_path, timeout_s=600, retry_timeouts=True, bare=True)  # a longer limit
    # A stamp copied into another folder, or for other arguments, is not this command's.
    from toolkit.stacks import extras

    packages = extras()  # the stacks' own packages too: a sweep of transformers' models depends on its release
    assert {"torchtitan", "transformers", "torch_remat"} <= set(packages)
    _stamp.write(["--out", str(tmp_path)], tmp_path, {"stdout": [["x", False]], "stderr": [], "code": 0}, packages)
    assert _stamp.replay(["--out", str(tmp_path)], packages) == 0
    assert _stamp.replay(["--out", str(tmp_path), "--full"], packages) is None
    assert _stamp.replay(["--out", str(tmp_path), "--merge", "x"], packages) is None
    assert _stamp.replay(["--out", str(tmp_path)], [*packages, "numpy"]) is None  # another package's version counts
    other = tmp_path / "copy"
    other.mkdir()
    for p in tmp_path.iterdir():
        if p.is_file():
            (other / p.name).write_bytes(p.read_bytes())
    assert _stamp.replay(["--out", str(other)], packages) is None
