"""Every bad input the issues name, in one table each for the API and the CLI: refused with the field and its fix, or
named in the Report's first lines — never silently accepted, never a cryptic error, never a traceback."""

import ast
import dataclasses
import json
import os
import pathlib
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time

import nbformat
import psutil
import pytest
import torch
from _helpers import extra
from torch import nn

import toolkit as tk
from toolkit import cli
from toolkit._config import InputWarning
from toolkit._escape import terminal
from toolkit.analysis import sweeps
from toolkit.analysis.cells import Cell
from toolkit.analysis.executors import LocalExecutor
from toolkit.analysis.store import merge_into, read_results
from toolkit.analysis.sweeps import sweep
from toolkit.execution.isolate import crashed_report, timeout_report

ROOT = pathlib.Path(tk.__file__).parents[1]
ENV = {
    **os.environ,
    "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    "PYTHONWARNINGS": "ignore",
    "COLUMNS": "160",
}
TINY = tk.ModelConfig(n_layers=1)
DENSE = Cell("dense")


def _fast(scenario):
    return tk.run(scenario.replace(check_numerics=False, measure_memory=False, steady_steps=0))


def _model():
    return tk.build_model(TINY)


class _NaNInTheMiddle(nn.Module):
    """Finite weights and inputs; its own forward multiplies by NaN between its two layers."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 3), nn.Linear(3, 3)

    def forward(self, x):
        return self.b(self.a(x) * float("nan"))


# ------------------------------------------------------------------------------------------------------- the API

# (id, call, exception, field, words in the message). Each is refused before anything runs, naming the field and
# the fix (ConfigError's "Fix:").
API = [
    ("meta tokens for a CPU model", lambda: tk.measure(_model(), tk.make_batch(TINY).tokens.to("meta")),
     tk.ConfigError, "args", "input tensor 0 is on meta, the model's parameters on cpu"),
    ("tokens >= vocab_size", lambda: tk.measure(_model(), torch.full((2, 8), TINY.vocab_size)),
     tk.ConfigError, "vocab_size", f"a token id is {TINY.vocab_size}, but the model's vocab_size is"),
    ("negative token", lambda: tk.measure(_model(), torch.full((2, 8), -1)),
     tk.ConfigError, "vocab_size", "a token id is -1"),
    ("train_step with tokens >= vocab_size",
     lambda: tk.train_step(_model(), tk.make_batch(TINY)._replace(tokens=torch.full((2, 8), 10**6))),
     tk.ConfigError, "vocab_size", "a token id is 1000000"),
    ("vocab_size=2**24 at dim 1024 (past this machine's memory)",
     lambda: tk.build_model(tk.ModelConfig(vocab_size=2**24, dim=1024)),
     tk.ConfigError, "vocab_size", "vocab_size=16777216 makes"),
    ("vocab_size=2**40 (past any machine: the bound)", lambda: tk.ModelConfig(vocab_size=2**40),
     tk.ConfigError, "vocab_size", "1099511627776 is above 16777216"),
    ("n_experts=2**22", lambda: tk.ModelConfig(n_experts=2**22), tk.ConfigError, "n_experts", "4194304 is above 8192"),
    ("n_layers=4096 at dim 4096 (past this machine's memory)",
     lambda: tk.build_model(tk.ModelConfig(n_layers=4096, dim=4096, moe_layers="none")),
     tk.ConfigError, "n_layers", "n_layers=4096 makes"),
    ("n_layers=10**6", lambda: tk.ModelConfig(n_layers=10**6), tk.ConfigError, "n_layers", "1000000 is above 4096"),
    ("make_batch seq_len=2**24, batch 1024", lambda: tk.make_batch(tk.ModelConfig(seq_len=2**24, batch=2**10)),
     tk.ConfigError, "seq_len", "seq_len=16777216 makes a batch of 1024 x 16777216 tokens"),
    ("measure(nn.Identity())", lambda: tk.measure(nn.Identity(), torch.randn(3)),
     tk.ConfigError, "module_or_fn", "Identity has no parameters"),
    ("loss_fn returning a float", lambda: tk.measure(nn.Linear(3, 3), torch.randn(2, 3), loss_fn=lambda o: 1.0),
     tk.ConfigError, "loss_fn", "returned a float (1.0), not a tensor"),
    ("loss_fn returning a non-scalar", lambda: tk.measure(nn.Linear(3, 3), torch.randn(2, 3), loss_fn=lambda o: o),
     tk.ConfigError, "loss_fn", "returned a tensor of shape (2, 3), not a scalar"),
    ("sweep backends=('bogus',)", lambda: sweep(backends=("bogus",), out="unused", progress=False),
     tk.ConfigError, "backends", "'bogus' is not a compile backend"),
    ("sweep backends='inductor' (a string)", lambda: sweep(backends="inductor", out="unused", progress=False),
     tk.ConfigError, "backends", "'inductor' is not a compile backend"),
    ("sweep executor=local partition=gpu", lambda: sweep(executor="local", partition="gpu", out="unused"),
     tk.ConfigError, "partition", "is an option of executor='submitit', not of executor='local'"),
    ("sweep executor=submitit workers=4", lambda: sweep([DENSE], executor="submitit", workers=4, out="unused"),
     tk.ConfigError, "workers", "is an option of executor='local'; submitit runs the cells as jobs of its own"),
    ("sweep executor=ray warm=False", lambda: sweep([DENSE], executor="ray", warm=False, out="unused"),
     tk.ConfigError, "warm", "is an option of executor='local'; ray runs the cells as jobs of its own"),
    ("sweep Executor instance plus options",
     lambda: sweep([DENSE], executor=LocalExecutor(workers=2), workers=3, out="unused"),
     tk.ConfigError, "workers", "is given beside an Executor instance (LocalExecutor)"),
    ("sweep out=''", lambda: sweep([DENSE], out="", progress=False, runner=_fast),
     tk.ConfigError, "out", "'' names no folder"),
    ("sweep retry_timeouts='no'", lambda: sweep([DENSE], out="unused", retry_timeouts="no", runner=_fast),
     tk.ConfigError, "retry_timeouts", "'no' is not a bool"),
    ("recipe_backend without a recipe", lambda: tk.Scenario(recipe_backend="inductor"),
     tk.ConfigError, "recipe_backend", "no recipe is set: it would be ignored"),
    ("memory_snapshot on CPU", lambda: tk.Scenario(memory_snapshot="snap.pickle"),
     tk.ConfigError, "memory_snapshot", "CUDA allocator snapshots need a CUDA device"),
    ("CompileConfig(scope='none', fullgraph=True, backend='inductor')",
     lambda: tk.CompileConfig(scope="none", fullgraph=True, backend="inductor"),
     tk.ConfigError, "backend", "means nothing with scope='none'"),
    ("CompileConfig(scope='none', fullgraph=True)", lambda: tk.CompileConfig(scope="none", fullgraph=True),
     tk.ConfigError, "fullgraph", "fullgraph=True means nothing with scope='none'"),
    ("unknown key under compile", lambda: tk.CompileConfig.from_dict({"scope": "blocks", "bogus": 1}),
     tk.ConfigError, "bogus", "is not a field of CompileConfig"),
    ("inductor_options [1, 2]",
     lambda: tk.CompileConfig.from_dict({"scope": "blocks", "backend": "inductor", "inductor_options": [1, 2]}),
     tk.ConfigError, "inductor_options", "[1, 2] is not a dict of inductor config names"),
    ("run(isolate=True, timeout_s=nan)", lambda: tk.run(tk.Scenario(), isolate=True, timeout_s=float("nan")),
     tk.ConfigError, "timeout_s", "nan is not a positive number of seconds"),
    ("repro.export path ''", lambda: tk.repro.export(_REPORT(), ""), tk.ConfigError, "path", "'' is empty"),
    ("repro.export path as bytes", lambda: tk.repro.export(_REPORT(), b"bundle"), tk.ConfigError, "path",
     "b'bundle' is bytes, not text"),
    ("repro.export under a file",
     lambda: pathlib.Path("afile").write_text("mine") and tk.repro.export(_REPORT(), "afile/sub"),
     tk.ConfigError, "path", "cannot make the folder 'afile'"),
    # The 341-try audit (issue 38): raw AttributeErrors, silent accepts and unbounded sizes, each a named refusal now.
    ("train_step(model, 'batch')", lambda: tk.train_step(_model(), "batch"), tk.ConfigError, "batch",
     "'batch' (str) is not a Batch"),
    ("reset(42)", lambda: tk.transforms.reset(42), tk.ConfigError, "model", "42 (int) is not a Module"),
    ("named_modules(42)", lambda: list(tk.transforms.named_modules(42)), tk.ConfigError, "model",
     "42 (int) is not a Module"),
    ("classify(None)", lambda: tk.classify(None), tk.ConfigError, "report", "None (NoneType) is not a Report"),
    ("estimate(None)", lambda: tk.estimate(None), tk.ConfigError, "scenario", "is not a Scenario or ModelConfig"),
    ("estimate('no such shape')", lambda: tk.estimate("no such shape"), tk.ConfigError, "scenario",
     "a name of tk.estimation.LAYER_SHAPES (deepseek_v3_layer"),
    ("estimate(cuda_rounding='yes')", lambda: tk.estimate(TINY, cuda_rounding="yes"), tk.ConfigError,
     "cuda_rounding", "'yes' is not a bool"),
    ("repro.export(None, path)", lambda: tk.repro.export(None, "bundle"), tk.ConfigError, "report",
     "None (NoneType) is not a Report"),
    ("repro.export timeout_s=-1, before writing",
     lambda: tk.repro.export(_REPORT(), "bundle", trace=True, timeout_s=-1),
     tk.ConfigError, "timeout_s", "-1 is not a positive number of seconds"),
    ("sweep(cells='abc')", lambda: sweep(cells="abc", out="unused"), tk.ConfigError, "cells", "'abc' is not a list"),
    ("sweep(progress='x')", lambda: sweep([DENSE], out="unused", progress="x"), tk.ConfigError, "progress",
     "'x' is not a bool"),
    ("run(isolate='yes')", lambda: tk.run(tk.Scenario(), isolate="yes"), tk.ConfigError, "isolate",
     "'yes' is not a bool"),
    ("run(timeout_s=1e300)", lambda: tk.run(tk.Scenario(), isolate=True, timeout_s=1e300), tk.ConfigError,
     "timeout_s", "longer than 604800 s (a week)"),
    ("ModelConfig(seed=2**70)", lambda: tk.ModelConfig(seed=2**70), tk.ConfigError, "seed",
     "is above 9223372036854775807"),
    ("ModelConfig(n_layers=99999999999)", lambda: tk.ModelConfig(n_layers=99999999999), tk.ConfigError, "n_layers",
     "99999999999 is above 4096"),
    ("ModelConfig(n_experts=10**6)", lambda: tk.ModelConfig(n_experts=10**6, top_k=8), tk.ConfigError, "n_experts",
     "1000000 is above 8192"),
    ("ModelConfig(dim=5001 digits)", lambda: tk.ModelConfig(dim=10**5000), tk.ConfigError, "dim",
     "a number of about 5001 digits is above"),
    ("Scenario(steady_steps=10**9)", lambda: tk.Scenario(steady_steps=10**9), tk.ConfigError, "steady_steps",
     "1000000000 is above 1000"),
    ("measure(steady_steps=10**9)", lambda: tk.measure(nn.Linear(3, 3), torch.randn(2, 3), steady_steps=10**9),
     tk.ConfigError, "steady_steps", "1000000000 is above 1000"),
    ("run_distributed(nproc=100000)", lambda: tk.run_distributed(tk.Scenario(), nproc=100000), tk.ConfigError,
     "nproc", "100000 is above 64"),
    ("Scenario name with an ESC colour code", lambda: tk.Scenario(name="red\x1b[31m"), tk.ConfigError, "name",
     "holds the control character '\\x1b'"),
    ("Scenario name with a newline", lambda: tk.Scenario(name="a\nb"), tk.ConfigError, "name",
     "holds the control character '\\n'"),
    ("selective_layer wrapping no block",
     lambda: tk.apply_ac(_model(), tk.ACConfig.of(mode="selective_layer", layer_every=4096)), tk.ConfigError,
     "layer_every", "layer_every=4096 checkpoints none of the model's 1 blocks"),
    ("Report.from_json('{}')", lambda: tk.Report.from_json("{}"), tk.ConfigError, "outcome", "is missing"),
    ("Report with outcome 5", lambda: tk.Report.from_dict({"outcome": 5, "saved": {}, "environment": {}}),
     tk.ConfigError, "outcome", "5 is not one of ok, error"),
    ("Report of schema 99", lambda: tk.Report.from_dict({**_REPORT().to_dict(), "schema_version": 99}),
     tk.ConfigError, "schema_version", "99 is not a schema this toolkit reads"),
    ("bugs.export into a file",
     lambda: pathlib.Path("afile").write_text("mine") and tk.bugs.export("C27", "afile"), tk.ConfigError,
     "directory", "'afile' is a file, not a folder"),
]  # fmt: skip


@pytest.mark.parametrize("call, exc, field, words", [c[1:] for c in API], ids=[c[0] for c in API])
def test_bad_api_input_is_refused_naming_the_field_and_the_fix(call, exc, field, words, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # what a refused call must not write, it would write here
    with pytest.raises(exc) as e:
        call()
    assert e.value.field == field, str(e.value)
    assert words in str(e.value) and "Fix:" in str(e.value), str(e.value)
    # "afile" is what a row may put there itself (a file where the path wants a folder): left as it was.
    assert [p.name for p in tmp_path.iterdir() if p.name != "afile"] == [], "a refused input wrote something"
    assert not (tmp_path / "afile").exists() or (tmp_path / "afile").read_text() == "mine"


# Inputs that run but do nothing of what they say: an InputWarning, and the Report's lines right after its title.
WARNED = [
    ("force_recompute_mm_shapes_by_fqns naming no Linear",
     tk.ACConfig.of(mode="selective_op", force_recompute_mm_shapes_by_fqns=("nosuch",)),
     "force_recompute_mm_shapes_by_fqns", "'nosuch' is in the name of no nn.Linear"),
    ("per_submodule SAC force_recompute naming no Linear",
     tk.ACConfig.of(mode="per_submodule", force_recompute_mm_shapes_by_fqns=("nosuch",)),
     "force_recompute_mm_shapes_by_fqns", "'nosuch' is in the name of no nn.Linear"),
    ("remat save_regions wildcard matching nothing", tk.ACConfig.of(mode="remat", save_regions=("nosuch.*",)),
     "save_regions", "the pattern 'nosuch.*' matches no region"),
    ("remat recompute_regions wildcard matching nothing", tk.ACConfig.of(mode="remat", recompute_regions=("zz*",)),
     "recompute_regions", "the pattern 'zz*' matches no region"),
]  # fmt: skip


@pytest.mark.parametrize("ac, field, words", [c[1:] for c in WARNED], ids=[c[0] for c in WARNED])
def test_an_input_that_does_nothing_is_warned_and_leads_the_report(ac, field, words):
    if ac.mode == "remat":
        extra("torch_remat")
    scenario = tk.Scenario(model=TINY, ac=ac, check_numerics=False, measure_memory=False, steady_steps=0)
    report = tk.run(scenario)
    assert report.ok, report
    assert any(w.startswith("InputWarning: ") and words in w for w in report.warnings), report.warnings
    second = str(report).splitlines()[1]
    assert second.startswith(f"  input: ACConfig.{field}: ") and words in second and "Fix:" in second, str(report)


def test_the_fixed_policies_own_patterns_are_not_warned_about():
    """torchtitan's own defaults (the router gate for force_recompute, main's remat policies) match nothing in some
    models by design: no warning for them."""
    dense = tk.ModelConfig(n_layers=1, moe_layers="none")
    for ac in (tk.ACConfig.of(mode="selective_op"), tk.ACConfig.of(mode="remat")):
        if ac.mode == "remat" and not tk.compat.available("torch_remat"):
            continue
        report = tk.run(tk.Scenario(model=dense, ac=ac, check_numerics=False, measure_memory=False, steady_steps=0))
        assert report.ok and not [w for w in report.warnings if w.startswith("InputWarning")], report
    # Outside a Report the warning is an InputWarning, the category a warnings filter can name.
    with pytest.warns(InputWarning, match="'nosuch' is in the name of no nn.Linear"):
        tk.apply_ac(_model(), tk.ACConfig.of(mode="selective_op", force_recompute_mm_shapes_by_fqns=("nosuch",)))


def test_a_nan_loss_is_named_with_where_it_first_appears_not_grads_differ():
    report = tk.measure(_NaNInTheMiddle(), torch.randn(2, 3))
    assert report.outcome == "error" and report.error.type.endswith("NonFiniteLoss")
    assert tk.classify(report).label != "grads_differ"
    first = str(report).splitlines()[1]
    assert "the loss is nan (first non-finite value: the forward of the model itself" in first, str(report)
    assert "before it calls b" in first
    # A NaN that is already in a parameter is named as that parameter.
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
    with torch.no_grad():
        model[1].weight[0, 0] = float("nan")
    report = tk.measure(model, torch.randn(2, 3))
    assert "first non-finite value: 1.weight holds non-finite values before the step" in report.error.message


# ---------------------------------------------------------------------------------------------------- the bundles


def _REPORT(name="tiny"):
    return tk.run(tk.Scenario(name=name, model=TINY, measure_memory=False, check_numerics=False, steady_steps=0))


INJECT = "x\n        open('INJECTED','w').write('ran')  #"


def _run_script(path, cwd):
    return subprocess.run([sys.executable, str(path)], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=600)


def test_nothing_a_report_holds_becomes_code_in_a_bundle(tmp_path):
    """A Report read from a file can hold any name (a Scenario refuses control characters when it is made): the
    bundle shows it escaped, as data, and nothing of it runs."""
    report = _REPORT()
    record = dataclasses.replace(report.scenario, name=INJECT, config={**report.scenario.config, "name": INJECT})
    report = dataclasses.replace(report, scenario=record)
    # The torch version is the other string that went into the script unescaped.
    report = dataclasses.replace(report, environment={**report.environment, "torch": "2.13'\nopen('INJECTED2','w')\n#"})
    bundle = tk.repro.export(report, tmp_path / "b")
    source = bundle.script.read_text()
    tree = ast.parse(source)  # a plain newline in a name used to leave an IndentationError
    data = {"NAME", "OBSERVED", "SCENARIO"}
    assigns = [n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id in data]
    values = {n.targets[0].id: ast.literal_eval(n.value) for n in assigns}  # literals, nothing that runs
    shown = terminal(INJECT)
    assert values["NAME"] == shown and values["OBSERVED"]["torch"] == report.environment["torch"]
    assert json.loads(values["SCENARIO"])["name"] == shown
    assert not any("INJECTED" in ast.unparse(n) for n in tree.body if n not in assigns)
    nb = nbformat.read(bundle.notebook, as_version=4)
    assert all("open(" not in line for c in nb.cells if c.cell_type == "code" for line in c.source.splitlines()[1:] if
               "NAME =" not in line and "OBSERVED =" not in line and "SCENARIO =" not in line)  # fmt: skip
    assert "\n" not in nb.cells[0].source.split("\n\n")[0]  # the title is one line of inert markdown
    done = _run_script(bundle.script, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "reproduced" in done.stdout and f"reproducing {shown}" in done.stdout
    assert not (tmp_path / "INJECTED").exists() and not (tmp_path / "INJECTED2").exists()


def test_a_bundle_never_replaces_a_file_and_adds_its_suffixes(tmp_path):
    report = _REPORT()
    mine = tmp_path / "important.py"
    mine.write_text("my work\n")
    with pytest.raises(tk.ConfigError) as e:
        tk.repro.export(report, tmp_path / "important")
    assert e.value.field == "path" and "exists" in str(e.value) and "overwrite=True" in str(e.value)
    assert mine.read_text() == "my work\n" and not (tmp_path / "important.ipynb").exists()  # nothing written
    bundle = tk.repro.export(report, tmp_path / "important", overwrite=True)
    assert bundle.script == mine and "tk.run(scenario)" in mine.read_text()
    # A folder (ending in / or existing) means a bundle inside it, named after the scenario.
    (tmp_path / "bundles").mkdir()
    inside = tk.repro.export(report, str(tmp_path / "bundles") + "/")
    assert inside.script == tmp_path / "bundles" / "tiny.py" and not (tmp_path / "bundles.py").exists()
    fresh = tk.repro.export(report, f"{tmp_path}/not-yet/")
    assert fresh.script == tmp_path / "not-yet" / "tiny.py"
    # Suffixes are added, never substituted; a bundle's own suffix names it.
    assert tk.repro.export(report, tmp_path / "my.bundle.v2").script == tmp_path / "my.bundle.v2.py"
    assert tk.repro.export(report, tmp_path / "named.py").names() == ["named.py", "named.ipynb", "named.env.json"]


def test_the_explorers_export_goes_through_the_same_rules(tmp_path):
    pytest.importorskip("ipywidgets")
    from toolkit.notebook.widgets import export_repro

    report = _REPORT()
    (tmp_path / "mine.py").write_text("keep\n")
    with pytest.raises(tk.ConfigError, match="exists"):
        export_repro(report.scenario.to_scenario(), report, tmp_path / "mine")
    assert (tmp_path / "mine.py").read_text() == "keep\n"


# --------------------------------------------------------------------------------------- results files, the sweep


def test_undecodable_torn_and_junk_lines_are_skipped_counted_and_named(tmp_path):
    sweep([DENSE], out=tmp_path / "a", progress=False, runner=_fast)
    results = tmp_path / "a" / "results.jsonl"
    good = results.read_bytes()
    junk = [
        b"\xff\xfe not utf-8",
        b'{"key":"k","cell":{},"report":{}}',
        b'{"key": "", "cell": {}, "report": {}}',
        b"[1, 2]",
        b'{"torn": ',
        b'{"key": "0123456789abcdef", "cell": {"block": "dense", "ac": "none", "scope": "none"}, "report": {}}',
    ]
    # A real record with a field the reader relies on spoiled: `timeouts` (which made resume die with a TypeError)
    # and `limit_s` (NaN compared as "shorter" with every limit).
    record = json.loads(good.splitlines()[0])
    junk += [json.dumps({**record, "timeouts": "x"}).encode(), json.dumps({**record, "limit_s": float("nan")}).encode()]
    results.write_bytes(b"\n".join(junk) + b"\n" + good)
    records, skipped = read_results(results)
    assert len(records) == 1 and [s.line for s in skipped] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert [s.why for s in skipped] == [
        "not UTF-8 (byte 0xff at column 1)",
        "its cell does not hold the fields of a Cell",
        "key '' is not a cell key (a non-empty string)",
        "not a record (an object with key, cell and report)",
        "not JSON (a torn or foreign line)",
        "its report has no outcome",
        "timeouts 'x' is not a whole number >= 0",
        "limit_s nan is not a positive number of seconds",
    ]
    # Resume reads it (it used to die with UnicodeDecodeError) and runs nothing.
    calls = []
    result = sweep([DENSE], out=tmp_path / "a", progress=False, runner=lambda s: calls.append(s) or _fast(s))
    assert calls == [] and [r.classification.label for r in result.rows] == ["works"]
    # --merge reads it the same way and says what it skipped.
    added, bad = merge_into(tmp_path / "b", [results])
    assert added == 1 and [s.line for s in bad[str(results)]] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert len(read_results(tmp_path / "b" / "results.jsonl")[0]) == 1


def test_outputs_that_cannot_be_written_are_refused_before_the_first_cell(tmp_path):
    (tmp_path / "matrix.html").mkdir()
    calls = []
    with pytest.raises(tk.ConfigError) as e:
        sweep([DENSE], out=tmp_path, progress=False, runner=lambda s: calls.append(s) or _fast(s))
    assert e.value.field == "out" and "matrix.html" in str(e.value) and "Is a directory" in str(e.value)
    assert calls == []


def test_a_timeout_is_retried_once_under_the_same_limit_then_kept(tmp_path):
    calls = []

    def slow(scenario):
        calls.append(scenario.name)
        return timeout_report(scenario, 5, b"stage forward\n", 5.0)

    for _ in range(3):
        sweep([DENSE], out=tmp_path, timeout_s=5, progress=False, runner=slow)
    assert len(calls) == 2  # the first run and its one retry; the third run keeps the timeout
    recs = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["timeouts"] for r in recs] == [1, 2]
    # retry_timeouts=False (--keep-timeouts) keeps the first timeout at once.
    calls.clear()
    sweep([DENSE], out=tmp_path / "k", timeout_s=5, progress=False, runner=slow)
    sweep([DENSE], out=tmp_path / "k", timeout_s=5, progress=False, runner=slow, retry_timeouts=False)
    assert len(calls) == 1
    # A longer limit runs it again whatever the count.
    sweep([DENSE], out=tmp_path, timeout_s=6, progress=False, runner=slow)
    assert len(calls) == 2


def test_a_sweep_that_measured_nothing_says_so(tmp_path):
    crash = lambda s: crashed_report(s, "killed by SIGKILL (-9)", "forward")  # noqa: E731
    result = sweep([DENSE, Cell("dense", "full")], out=tmp_path, progress=False, runner=crash)
    assert sweeps.measured(result) == 0
    assert "no cell produced a measurement" in sweeps.summary(result)


# --------------------------------------------------------------------------------------------------------- the CLI


def _cli(*args, cwd, timeout=300, **env):
    return subprocess.run(
        [sys.executable, "-m", "toolkit", *args],
        cwd=cwd,
        env={**ENV, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _files(tmp: pathlib.Path) -> dict:
    (tmp / "binary.json").write_bytes(b"\xff\xfe\x00\x01 not text")
    (tmp / "unknown.json").write_text('{"compile": {"scope": "blocks", "bogus": 1}}')
    (tmp / "options.json").write_text(
        '{"compile": {"scope": "blocks", "backend": "inductor", "inductor_options": [1,2]}}'
    )
    (tmp / "none.json").write_text('{"compile": {"scope": "none", "fullgraph": true}}')
    (tmp / "findings.jsonl").write_text('{"case": "C2", "torch": "2.13.0", "reproduced": true}\n[1, 2]\n')
    (tmp / "undecodable.jsonl").write_bytes(b'\xff\xfe\n{"case": "C2", "torch": "2.13.0", "reproduced": true}\n')
    (tmp / "no-verdict.jsonl").write_text('{"case": "C2"}\n{"case": "C2", "torch": "2.13.0", "reproduced": true}\n')
    (tmp / "a-folder").mkdir()
    (tmp / "junk.jsonl").write_bytes(b'{"key":"k","cell":{},"report":{}}\n\xff\n')
    os.mkfifo(tmp / "fifo.json")  # no writer: open() would block for ever
    (tmp / "zero.json").symlink_to("/dev/zero")  # read() would never end
    (tmp / "digits.json").write_text('{"seed": ' + "9" * 5001 + "}")
    (tmp / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp / "steady.json").write_text('{"steady_steps": 1000000000}')
    (tmp / "zero-results").mkdir()
    (tmp / "zero-results" / "results.jsonl").symlink_to("/dev/zero")
    (tmp / "dangling").symlink_to(tmp / "nowhere")
    return {}


# (id, argv, extra environment, exit code, words on stderr). Every one is one `error: … Fix: …` (or argparse's own
# usage error), exit 2, and no traceback.
CLI = [
    ("run --config of a binary file", ["run", "--config", "binary.json"], {}, 2, "is not UTF-8 text (byte 0xff"),
    ("unknown key under compile", ["run", "--config", "unknown.json"], {}, 2,
     "CompileConfig.bogus: is not a field of CompileConfig"),
    ("inductor_options [1,2]", ["run", "--config", "options.json"], {}, 2,
     "CompileConfig.inductor_options: [1, 2] is not a dict"),
    ("compile options with scope none", ["run", "--config", "none.json"], {}, 2,
     "CompileConfig.fullgraph: fullgraph=True means nothing with scope='none'"),
    ("demo --layers 0", ["demo", "--layers", "0"], {}, 2, "argument --layers: 0 is not a whole number >= 1"),
    ("cases --check BOGUS", ["cases", "--check", "BOGUS"], {}, 2, "no standalone repro for BOGUS"),
    ("a findings file with a non-object line", ["cases", "--findings"], {"TOOLKIT_FINDINGS": "findings.jsonl"}, 2,
     "'findings.jsonl' line 2 holds '[1, 2]', not a finding"),
    ("a findings file with a line that is not UTF-8", ["cases", "--findings"],
     {"TOOLKIT_FINDINGS": "undecodable.jsonl"}, 2, "'undecodable.jsonl' line 1 holds"),
    ("a finding without its torch and verdict", ["cases", "--findings"], {"TOOLKIT_FINDINGS": "no-verdict.jsonl"}, 2,
     "'no-verdict.jsonl' line 1 holds '{\"case\": \"C2\"}', not a finding"),
    ("TOOLKIT_FINDINGS naming a folder", ["cases", "--findings"], {"TOOLKIT_FINDINGS": "a-folder"}, 2,
     "TOOLKIT_FINDINGS: 'a-folder' is a folder, not a findings file"),
    ("matrix --out ''", ["matrix", "--out", ""], {}, 2, "sweep.out: '' names no folder"),
    # Found by test_gates' command-line search: an empty --model reached the import as a ValueError traceback.
    ("matrix --model ''", ["matrix", "--quick", "--model", "", "--dry-run"], {}, 2,
     "UserModelConfig.build: '' is not FILE.py:FUNCTION or MODULE:FUNCTION"),
    ("plan --ac memory_budget --scope none", ["plan", "--preset", "moe_full_ac", "--budget", "1GiB", "--ac",
     "memory_budget", "--scope", "none"], {}, 2, "plan.ac: no candidate setup has these AC modes"),
    ("matrix --backend bogus", ["matrix", "--backend", "bogus", "--out", "o"], {}, 2,
     "argument --backend: invalid choice: 'bogus'"),
    ("matrix --merge of a folder", ["matrix", "--merge", "a-folder", "--out", "o"], {}, 2,
     "'a-folder' is not a file"),
    ("matrix --timeout-s nan", ["matrix", "--timeout-s", "nan", "--out", "o"], {}, 2, "--timeout-s"),
    ("run --isolate --timeout-s nan", ["run", "--preset", "moe_eager", "--isolate", "--timeout-s", "nan"], {}, 2,
     "nan is not a positive number of seconds"),
    ("run --config of JSON lines", ["run", "--config", "findings.jsonl"], {}, 2, "is not valid JSON"),
    # The 341-try audit (issue 38): hangs, unbounded reads and sizes, tracebacks; each one line, exit 2, at once.
    ("run --config naming a FIFO with no writer", ["run", "--config", "fifo.json"], {}, 2,
     "it is not a regular file (a FIFO, a device or a folder)"),
    ("run --config naming /dev/zero", ["run", "--config", "zero.json"], {}, 2, "it is not a regular file"),
    ("run --config with a 5001-digit integer", ["run", "--config", "digits.json"], {}, 2,
     "it holds Exceeds the limit (4300 digits)"),
    ("run --config nested 100,000 deep", ["run", "--config", "deep.json"], {}, 2, "it is JSON nested too deep"),
    ("run --config steady_steps 10**9", ["run", "--config", "steady.json"], {}, 2,
     "Scenario.steady_steps: 1000000000 is above 1000"),
    ("run --preset ''", ["run", "--preset", ""], {}, 2, "preset.name: '' is not a preset"),
    ("run --nproc 100000", ["run", "--preset", "moe_eager", "--nproc", "100000"], {}, 2,
     "argument --nproc: 100000 is above 64"),
    ("run --isolate --timeout-s 1e300", ["run", "--preset", "moe_eager", "--isolate", "--timeout-s", "1e300"], {}, 2,
     "longer than 604800 s (a week)"),
    ("demo --layers 99999999999", ["demo", "--layers", "99999999999"], {}, 2,
     "argument --layers: 99999999999 is above 4096"),
    ("matrix --partition with the local executor", ["matrix", "--partition", "gpu", "--out", "o"], {}, 2,
     "--partition is an option of --executor submitit; --executor local would ignore it"),
    ("matrix --address with the local executor", ["matrix", "--address=auto", "--out", "o"], {}, 2,
     "--address is an option of --executor ray"),
    ("matrix --out a dangling symlink", ["matrix", "--only", "^dense \\| AC none \\| eager", "--out", "dangling"], {},
     2, "is a symlink to"),
    ("matrix whose results.jsonl is /dev/zero",
     ["matrix", "--only", "^dense \\| AC none \\| eager", "--out", "zero-results"], {}, 2, "is not a regular file"),
]  # fmt: skip


def _cli_in_process(argv, cwd, env, monkeypatch, capsys) -> tuple[int, str]:
    """`python -m toolkit ARGV` less the interpreter's start: `cli.main` is all that the command runs after its
    imports (3 s of torch per subprocess). An exception that escapes it fails the test as a traceback would."""
    monkeypatch.chdir(cwd)
    for name, value in {**env, "COLUMNS": "160"}.items():
        monkeypatch.setenv(name, value)
    try:
        code = cli.main(list(argv))
    except SystemExit as e:  # argparse's own usage errors exit from inside `main`
        code = e.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("argv, env, code, words", [c[1:] for c in CLI], ids=[c[0] for c in CLI])
def test_bad_cli_input_is_one_error_and_exit_2(tmp_path, argv, env, code, words, monkeypatch, capsys):
    _files(tmp_path)
    if argv == CLI[0][1]:  # one through the real command line, end to end
        out = _cli(*argv, cwd=tmp_path, timeout=120, **env)
        returncode, stderr = out.returncode, out.stdout + out.stderr
    else:
        returncode, stderr = _cli_in_process(argv, tmp_path, env, monkeypatch, capsys)
    assert returncode == code, stderr
    assert words in stderr and "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, stderr
    assert "Fix:" in errors[0] or "argument" in errors[0] or "no standalone repro" in errors[0], errors[0]
    assert not (tmp_path / "o").exists()  # refused before anything was written


def test_merge_says_how_many_lines_it_skipped_and_why(tmp_path):
    _files(tmp_path)
    only = ("--only", "^dense \\| AC none \\| eager", "--timeout-s", "0.01", "--no-progress")
    out = _cli("matrix", "--merge", "junk.jsonl", "--out", "o", *only, cwd=tmp_path)
    assert "Traceback" not in out.stderr, out.stderr
    assert (
        "junk.jsonl: skipped 2 lines that are not a record (line 1: its cell does not hold the fields of a Cell"
        in out.stderr
    )
    assert "line 2: not UTF-8 (byte 0xff at column 1)" in out.stderr
    assert "merged 0 records into o/results.jsonl (2 lines skipped: not records)" in out.stderr
    # --dry-run reads the --merge files the same way (it only checked that they exist), and writes nothing.
    dry = _cli("matrix", "--merge", "junk.jsonl", "--out", "d", "--dry-run", *only, cwd=tmp_path)
    assert dry.returncode == 0 and "Traceback" not in dry.stderr, dry.stderr
    assert "--merge junk.jsonl: skipped 2 lines that are not a record" in dry.stderr
    assert "once 0 records from 1 results file(s) are merged in" in dry.stdout and not (tmp_path / "d").exists()


def test_a_matrix_where_every_cell_timed_out_exits_4_and_retries_them_once(tmp_path):
    only = ("--only", "^dense \\| AC none \\| eager", "--timeout-s", "0.01", "--out", "o")
    first = _cli("matrix", *only, cwd=tmp_path)
    assert first.returncode == cli.EXIT_NOTHING_MEASURED == 4, first.stderr
    assert "no cell produced a measurement: all 1 crashed or timed out" in first.stderr + first.stdout
    assert "Traceback" not in first.stderr
    # --keep-timeouts keeps it at once; by default it is retried once under the same limit (a load spike is not a
    # result), then kept.
    assert "cells to run" not in _cli("matrix", *only, "--keep-timeouts", cwd=tmp_path).stderr
    assert "1 of 1 cells to run" in _cli("matrix", *only, cwd=tmp_path).stderr
    third = _cli("matrix", *only, cwd=tmp_path)
    assert "cells to run" not in third.stderr and third.returncode == 4
    helped = _cli("matrix", "--help", cwd=tmp_path).stdout
    assert "--keep-timeouts" in helped and "4    no cell produced a measurement" in helped


def test_ctrl_c_exits_130_without_a_traceback(tmp_path):
    p = subprocess.Popen(
        [sys.executable, "-m", "toolkit", "matrix", "--only", "^dense \\| AC (none|full) \\|", "--out", "o"],
        cwd=tmp_path,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    t = time.monotonic()
    line = ""
    while "cells to run" not in line and time.monotonic() - t < 300:
        line = p.stderr.readline()
    assert "cells to run" in line
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == cli.EXIT_INTERRUPTED == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err and "interrupted" in err


@pytest.mark.parametrize("delay_s", [0.3, 1.0, 2.0])
def test_ctrl_c_while_the_command_line_starts_is_quiet(delay_s):
    """`python -m toolkit` imports the package (and torch, 2-3 s here) before `__main__` can catch anything: Ctrl-C
    then printed a raw KeyboardInterrupt traceback. At each delay the interrupt lands in the import or in the
    command; either way the command stops with one line and exit 130 (or finishes, if it was quicker)."""
    p = subprocess.Popen(
        [sys.executable, "-m", "toolkit", "cases"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    time.sleep(delay_s)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    # Landing while the interpreter shuts down (the command done), Python ends by SIGINT itself, silently: -2. CI
    # once saw (-2, "interrupted"), and a local run "Exception ignored in … importlib … KeyboardInterrupt" when the
    # interrupt was raised inside importlib's callbacks; the import now stops at once instead
    # (toolkit/_interrupt.py), but a shell reads -2 as 130 too, so a SIGINT exit after the one line is accepted.
    assert (p.returncode, err.strip()) in (
        (130, "interrupted"),
        (-signal.SIGINT, "interrupted"),
        (0, ""),
        (-signal.SIGINT, ""),
    ), (p.returncode, err)


def test_importing_the_package_changes_nothing_in_the_process():
    """A library changes nothing in its host at import: in a fresh Python that has imported torch, `import toolkit`
    adds no module but its own, installs no signal handler and changes no torch config or global switch; the public
    API is imported on first use of one of its names (`tk.ModelConfig`), and that too leaves the process as it was."""
    script = r"""
import json, signal, sys
import torch, torch._dynamo, torch._functorch.config, torch._inductor.config

def state():
    mods = (torch._dynamo.config, torch._functorch.config, torch._inductor.config)
    return {
        "signals": {s.name: repr(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD)},
        "configs": {m.__name__: repr(sorted(m.get_config_copy().items(), key=str)) for m in mods},
        "grad": torch.is_grad_enabled(),
        "dtype": str(torch.get_default_dtype()),
        "threads": torch.get_num_threads(),
        "rng": torch.random.get_rng_state().sum().item(),
    }

before, mods = state(), set(sys.modules)
import toolkit
after_import, new = state(), sorted(set(sys.modules) - mods)
toolkit.ModelConfig  # the API, imported on first use
print(json.dumps({"same": before == after_import, "new": new, "same_after_use": before == state(),
                  "cfg": type(toolkit.ModelConfig()).__name__, "measure": callable(toolkit.measure)}))
"""
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=ENV, timeout=300)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["new"] == ["toolkit"], out["new"]  # nothing imported but the package itself
    assert out["same"] and out["same_after_use"], out
    assert out["cfg"] == "ModelConfig" and out["measure"]


def test_no_public_name_is_shadowed_by_a_module():
    """`tk.measure` is the function and `toolkit.measurement` the package; `import toolkit.X.Y as m` gives the module
    named, for every module in the package (`toolkit.measure.estimate` was both a module and a function)."""
    import importlib
    import pkgutil

    import toolkit

    for info in pkgutil.walk_packages(toolkit.__path__, "toolkit."):
        if ".standalone." in info.name or info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        parent, _, leaf = info.name.rpartition(".")
        assert getattr(importlib.import_module(parent), leaf) is module, info.name
    assert callable(toolkit.measure) and callable(toolkit.estimate) and callable(toolkit.run)


def test_the_command_hands_ctrl_c_back_to_keyboard_interrupt(capsys):
    """`cli.main` turns the import's stop-at-once handler back into KeyboardInterrupt (a sweep must stop its workers
    and keep finished results); a handler someone else installed, Jupyter's say, is left alone."""
    from toolkit import _interrupt, cli

    before = signal.getsignal(signal.SIGINT)

    def theirs(signum, frame):
        pass

    try:
        _interrupt.stop_at_once_while_importing()
        assert signal.getsignal(signal.SIGINT) is _interrupt._stop_at_once
        assert cli.main([]) == 0  # help, no command
        assert signal.getsignal(signal.SIGINT) is _interrupt._raise_unless_importing
        with pytest.raises(KeyboardInterrupt):  # outside an import: the command's own handling
            signal.raise_signal(signal.SIGINT)
        signal.signal(signal.SIGINT, theirs)
        assert cli.main([]) == 0
        assert signal.getsignal(signal.SIGINT) is theirs
    finally:
        signal.signal(signal.SIGINT, before)
    assert "usage" in capsys.readouterr().out


def test_ctrl_c_inside_an_import_the_command_makes_stops_at_once(tmp_path):
    """The commands import torch when they first need it, after `cli.main` has handed Ctrl-C back: a SIGINT landing
    inside that import (CI, 2.13.0: numpy's C extension, 0.3 s into `cases`) raised KeyboardInterrupt in the half-run
    import, and the next import of the module failed with a traceback. Made deterministic here: a module whose import
    raises SIGINT, imported once the command runs, ends the process with one line and 130; the same SIGINT outside an
    import is a KeyboardInterrupt the command handles."""
    (tmp_path / "interrupted_import.py").write_text("import signal\nsignal.raise_signal(signal.SIGINT)\n")
    script = (
        "import signal, sys\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "from toolkit import _interrupt\n"
        "_interrupt.stop_at_once_while_importing()\n"
        "_interrupt.raise_again()\n"
        "try:\n"
        "    signal.raise_signal(signal.SIGINT)\n"
        "except KeyboardInterrupt:\n"
        "    print('raised outside the import', flush=True)\n"
        "import interrupted_import\n"
        "print('imported')\n"
    )
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert (p.returncode, p.stdout, p.stderr) == (130, "raised outside the import\n", "interrupted\n")


def test_the_warm_pools_reader_does_not_raise_when_the_server_is_slow_to_exit():
    from toolkit.execution.forkserver import WarmPool

    class Closed:
        def recv(self, n):
            return b""

    class Slow:
        def poll(self):
            return None

        def wait(self, timeout=None):
            raise subprocess.TimeoutExpired("server", timeout)

    pool = WarmPool.__new__(WarmPool)
    pool._lock, pool._ctrl, pool._waiting = threading.Lock(), None, {}
    pool._read(Closed(), Slow())  # raised TimeoutExpired (a traceback in the reader thread) before


# ------------------------------------------------------------------------------------- faults: files and processes


def test_a_full_disk_leaves_the_previous_outputs_whole_and_says_so_in_one_line(tmp_path):
    """The page rewritten on a disk that takes no more (a file-size limit stands in for a full disk: the write
    fails with an OSError part way): matrix.json, .md and .html are each the previous file, byte for byte, no
    temporary is left, and the error is one line naming the file."""
    script = textwrap.dedent(f"""
        import os, resource, signal, sys
        sys.path.insert(0, {str(ROOT / "tests")!r})
        from _helpers import synthetic_matrix
        from toolkit import _files
        result, _ = synthetic_matrix()
        result.write({str(tmp_path)!r})
        before = {{p: open(os.path.join({str(tmp_path)!r}, p), "rb").read() for p in os.listdir({str(tmp_path)!r})}}
        result.environment["torch"] = "changed"  # every output changes
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        try:
            result.write({str(tmp_path)!r})
        except _files.WriteFailed as e:
            print("error:", e.strerror)
        after = {{p: open(os.path.join({str(tmp_path)!r}, p), "rb").read() for p in os.listdir({str(tmp_path)!r})}}
        print("same" if after == before else sorted(set(after) ^ set(before)) or "changed")
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=ENV, timeout=300)
    assert p.returncode == 0, p.stderr
    error, verdict = p.stdout.strip().splitlines()
    assert error.startswith("error: could not write") and "the previous file is as it was" in error, error
    assert verdict == "same", verdict  # no temporary left beside them either


def test_a_file_written_atomically_gets_the_mode_open_would_give_it(tmp_path):
    """mkstemp's temporary is 0600: renamed as it is, a matrix.html would be unreadable to a web server that served
    the last one. A new file gets 0666 less the umask; a rewritten one keeps its mode."""
    from toolkit import _files

    old = os.umask(0o027)
    try:
        _files.write_text(tmp_path / "new.md", "a")
        (tmp_path / "kept.md").write_text("a")
        os.chmod(tmp_path / "kept.md", 0o604)
        _files.write_text(tmp_path / "kept.md", "b")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "new.md").st_mode) == 0o640
    assert stat.S_IMODE(os.stat(tmp_path / "kept.md").st_mode) == 0o604
    assert (tmp_path / "kept.md").read_text() == "b"


def test_the_stamp_on_a_full_disk_leaves_no_temporary(tmp_path):
    from toolkit import _stamp

    script = textwrap.dedent(f"""
        import resource, signal
        from toolkit import _stamp
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (16, 16))
        printed = {{"stdout": [["x" * 100, False]], "code": 0}}
        _stamp.write(["--out", {str(tmp_path)!r}], {str(tmp_path)!r}, printed, ["transformers"])
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=ENV, timeout=300)
    assert p.returncode == 0, p.stderr
    assert sorted(q.name for q in tmp_path.iterdir()) == [] and not (tmp_path / _stamp.STAMP).exists()


def test_a_torn_last_line_is_cut_and_said(tmp_path, capsys):
    report = _REPORT()
    first = sweep([DENSE], out=tmp_path, progress=False, runner=lambda sc: report)
    results = tmp_path / "results.jsonl"
    whole = results.read_bytes()
    results.write_bytes(whole + b'{"key": "torn", "cell": {"blo')  # a crash mid-write
    capsys.readouterr()
    again = sweep([DENSE], out=tmp_path, progress=False, runner=lambda sc: report)
    err = capsys.readouterr().err
    assert "its last line was torn (a crash mid-write): 29 bytes cut, that cell runs again" in err, err
    assert results.read_bytes() == whole and [r.key for r in again.rows] == [r.key for r in first.rows]


def test_bugs_export_never_overwrites_an_edited_script(tmp_path):
    path = tk.bugs.export("C27", tmp_path)
    path.write_text("# my edits\n")
    with pytest.raises(tk.ConfigError, match="exists \\(perhaps edited since it was exported\\).*overwrite=True"):
        tk.bugs.export("C27", tmp_path)
    assert path.read_text() == "# my edits\n"
    assert tk.bugs.export("C27", tmp_path, overwrite=True) == path and "import torch" in path.read_text()


def test_an_option_dropped_from_an_old_config_file_is_said_naming_the_file(tmp_path):
    """A record written before AC options became mode-specific held every option: one the mode does not read, at
    the value old files held, is dropped with one line naming the file and the option; any other value is refused."""
    old = tmp_path / "old.json"
    old.write_text('{"ac": {"mode": "full", "memory_budget": 0.5}, "check_numerics": false, "steady_steps": 0}')
    out = _cli("run", "--config", str(old), "--no-refs", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    (line,) = [ln for ln in out.stderr.splitlines() if "dropped" in ln]
    assert line.startswith(f"warning: --config {old}: ACConfig.memory_budget: 0.5 dropped: mode='full'"), line


def _marked(mark: str) -> list[str]:
    """The command lines of every process whose environment carries `mark` (a run's descendants, whoever their
    parent is now)."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.info["pid"] != os.getpid() and p.environ().get("TOOLKIT_TEST_MARK") == mark:
                found.append(" ".join(p.info["cmdline"] or []))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@pytest.mark.parametrize(
    "argv, kill_after_s",
    [
        (["run", "--preset", "moe_eager", "--nproc", "2"], 1.0),  # while the command imports
        (["run", "--preset", "moe_eager", "--nproc", "2"], 4.0),  # torchrun starting its ranks
        (["run", "--preset", "moe_eager", "--nproc", "2"], 7.0),  # the ranks measuring
        (["run", "--preset", "moe_eager", "--isolate"], 3.0),
    ],
)
def test_kill_minus_nine_of_the_command_leaves_no_process_and_no_folder(tmp_path, argv, kill_after_s):
    """Every process a command starts dies with it, kill -9 included: torchrun's ranks (sessions of their own) and
    the launcher, the isolated worker; a later run removes the rank folder the killed one left."""
    mark = f"{os.getpid()}-{time.monotonic_ns()}"
    env = {**ENV, "TOOLKIT_TEST_MARK": mark, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolkit", *argv],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    time.sleep(kill_after_s)
    seen = _marked(mark)
    proc.kill()
    proc.wait()
    deadline = time.time() + 15
    while time.time() < deadline and _marked(mark):
        time.sleep(0.25)
    assert _marked(mark) == [], f"left running after kill -9 at {kill_after_s} s (had {len(seen)}): {_marked(mark)}"
    from toolkit.execution import distributed

    distributed.remove_orphaned_folders(tmp_path)  # what the next run_distributed does first
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("toolkit-ranks-")] == []


def test_a_distributed_run_past_its_time_limit_leaves_no_rank(tmp_path):
    mark = f"{os.getpid()}-{time.monotonic_ns()}"
    env = {**ENV, "TOOLKIT_TEST_MARK": mark, "TMPDIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-m", "toolkit", "run", "--preset", "moe_eager", "--nproc", "2", "--timeout-s", "3"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 1 and "no result after 3 s" in out.stdout + out.stderr
    deadline = time.time() + 10
    while time.time() < deadline and _marked(mark):
        time.sleep(0.25)
    assert _marked(mark) == [] and not [p for p in tmp_path.iterdir() if p.name.startswith("toolkit-ranks-")]


def test_a_results_line_the_disk_cannot_take_is_one_error_and_the_file_stays_readable(tmp_path):
    """A sweep whose results.jsonl cannot grow (a file-size limit for a full disk): `WriteFailed`, one line naming
    the file, and what was there before reads as before."""
    results = tmp_path / "results.jsonl"
    script = textwrap.dedent(f"""
        import resource, signal, toolkit as tk
        from toolkit import _files
        from toolkit.analysis.cells import Cell
        from toolkit.analysis.sweeps import sweep
        report = tk.run(tk.Scenario(model=tk.ModelConfig(n_layers=1), check_numerics=False, measure_memory=False,
                                    steady_steps=0))
        sweep([Cell("dense")], out={str(tmp_path)!r}, progress=False, runner=lambda sc: report)
        size = len(open({str(results)!r}, "rb").read())
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 100, size + 100))
        try:
            sweep([Cell("dense", "full")], out={str(tmp_path)!r}, progress=False, runner=lambda sc: report)
        except _files.WriteFailed as e:
            print("error:", e.strerror)
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=ENV, timeout=300)
    assert p.returncode == 0, p.stderr
    (line,) = p.stdout.strip().splitlines()
    assert line.startswith(f"error: could not append to {str(results)!r}: "), line
    assert len(read_results(results)[0]) == 1  # the first record still reads; a torn tail is skipped and named


def test_an_estimate_checks_each_storage_a_bounded_number_of_times():
    """A deep model's estimate is linear in its layers: it no longer looks at every live storage after every op
    (40 layers took 40 s, 500 never ended). Counted, not timed: the weak-reference checks per layer stay flat."""
    from torch.multiprocessing.reductions import StorageWeakRef

    calls = [0]
    original = StorageWeakRef.expired

    def counting(self):
        calls[0] += 1
        return original(self)

    per_layer = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(StorageWeakRef, "expired", counting)
        for n in (4, 16):
            calls[0] = 0
            tk.estimate(tk.ModelConfig(n_layers=n))
            per_layer[n] = calls[0] / n
    assert per_layer[16] < 1.5 * per_layer[4], per_layer  # quadratic was 4x per layer at 16 layers
