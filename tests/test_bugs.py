"""The catalogue, the bug notebooks' verdicts (`toolkit.bugs`), the standalone repro scripts and bug bundles."""

import ast
import dataclasses
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import nbformat
import pytest
import torch

import toolkit as tk
from toolkit import bugs, compat
from toolkit.analysis import catalogue
from toolkit.stacks import extras

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
STANDALONE = ROOT / "toolkit" / "bugs" / "standalone"


@pytest.fixture(autouse=True)
def _findings(tmp_path, monkeypatch):
    monkeypatch.setenv("TOOLKIT_FINDINGS", str(tmp_path / "findings.jsonl"))


def _outputs(nb) -> str:
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            out.append(o.get("text") or o.get("data", {}).get("text/plain", ""))
    return "\n".join(out)


# --- catalogue ---------------------------------------------------------------------------------------------------


def test_catalogue_lists_filters_and_renders():
    ids = [c.id for c in catalogue.cases()]
    assert ids == [f"C{i}" for i in range(1, 81)]
    assert catalogue.get("C4").upstream[0] == "torchtitan#2052"
    with pytest.raises(KeyError, match="known: C1"):
        catalogue.get("C99")
    gpu = catalogue.filter(cpu="gpu_only")
    assert {c.id for c in gpu} >= {"C5", "C17", "C23"} and all(c.cpu == "gpu_only" for c in gpu)
    assert [c.id for c in catalogue.filter(text="tokens_per_expert")] == [
        "C12",
        "C33",
        "C62",
    ]  # C33: the same under torch_remat; C62: the counter under the eager backend
    assert {c.id for c in catalogue.filter(notebook=False)} == {
        "C19",
        "C20",
        "C21",
        "C22",
        "C23",
        *(f"C{i}" for i in range(34, 45)),
        "C50",
        "C51",
        "C59",  # a process's exit: its standalone script is the repro
        "C63",  # a torch-only script, checked per release by test_a_standalone_repro_gives_this_releases_verdict
        "C64",  # found by the matrix's eager column; a torch + torch_remat script
        "C66",  # the eager column's memory budgets: the cells, and a torch-only script
        "C67",  # the transformers stack's: transformers-only scripts (skipped, with the install line, without it)
        "C68",
        "C69",
        "C70",  # DeepSeek-V3's per-layer recompile: the transformers cells are the repro
        "C71",  # transformers' offload=True on a CPU-only torch: a transformers-only script
        "C72",  # save_on_cpu around a checkpoint under compile: a torch-only script
        "C73",  # issue 39's reports the sweep cannot reach: torch-only scripts
        "C74",
        "C75",
        "C76",
        "C77",
        "C78",  # torchtune#2684: needs CUDA and tensor parallel ranks
        "C79",
        "C80",  # a stack's compile path skipping a module: a torch-only script, and the instrument's classification
    } - {"C36", "C41"}
    md = catalogue.markdown()
    lines = md.splitlines()
    assert lines[0] == "| id | case | status | upstream | CPU | needs | torch | notebook |" and len(lines) == 2 + 80
    row = next(ln for ln in lines if ln.startswith("| C8 |"))
    assert "[pytorch#166926](https://github.com/pytorch/pytorch/issues/166926)" in row
    assert "reproduced on 2.13.0" in row and "(notebooks/bugs/C08_lru_recompute_mismatch.ipynb)" in row


def test_the_tables_say_what_a_repro_needs_its_notebook_and_each_releases_verdict():
    assert [c.id for c in catalogue.filter(needs="multi-rank")] == ["C39", "C43", "C44"]
    assert {c.id for c in catalogue.filter(needs="gpu")} == {
        "C5",
        "C17",
        "C23",
        "C34",
        "C35",
        "C37",
        "C50",
        "C51",
        "C78",
    }  # C52 was here until compiled autograd was run on CPU: it reproduces there (its notebook)
    assert all(c.needs == "cpu" for c in catalogue.filter(cpu="reproduced") + catalogue.filter(cpu="plausible"))
    assert {c.cpu for c in catalogue.cases()} <= set(catalogue.CPU_STATUSES)
    rows = [[cell.strip() for cell in ln.strip("|").split("|")] for ln in catalogue.markdown().splitlines()[2:]]
    cells = {r[0]: r for r in rows}
    assert cells["C44"][5] == "multi-rank" and cells["C44"][7] == ""  # no notebook
    assert cells["C34"][5] == "gpu" and cells["C33"][5] == "cpu"
    assert cells["C31"][6] == "reproduced on 2.13.0; fixed on 2.14.1; fixed on 2.15.0"
    assert "(notebooks/bugs/C33_remat_token_counter.ipynb)" in cells["C33"][7]
    # Every case with a notebook has a verdict per supported release.
    for c in catalogue.cases():
        if c.id in {f"C{i}" for i in range(28, 34)}:
            assert set(c.verified) == set(compat.CHECKED_ON) and c.notebook, c.id
    # Every case that has a verdict has one on every release the toolkit is checked on.
    assert [c.id for c in catalogue.cases() if c.verified and set(c.verified) != set(compat.CHECKED_ON)] == []
    text = catalogue.text(width=80).splitlines()
    assert text[0].split()[:5] == ["id", "case", "status", "needs", "nb"] and all(len(ln) <= 80 for ln in text)
    row = {ln.split()[0]: ln.split() for ln in text[2:] if ln[:1] == "C" and ln.split()[0][1:].isdigit()}
    assert row["C43"][-4:] == ["multi-rank", "no", "not", "checked"]
    assert row["C33"][-3:-1] == ["cpu", "yes"]


def test_signatures_on_observations_and_reports():
    c25 = catalogue.get("C25")
    assert c25.matches_observed({"saved": [3, 3, 3, 3], "isolated": [3, 4, 4, 4], "graphs": 1})
    assert not c25.matches_observed({"saved": [3, 4, 4, 4], "isolated": [3, 4, 4, 4]})
    assert not c25.matches_observed({"isolated": [3, 4, 4, 4]})
    c9 = catalogue.get("C9")
    assert c9.matches_observed(
        {"error": "RuntimeError: aten.view.default encountered during backward but not found in storage."}
    )
    assert not c9.matches_observed({"error": None})
    # A case only observations can show never matches a Report; C4's report signature never matches a dict.
    report = tk.Report(outcome="ok")
    assert not c25.matches("works", report)
    assert not catalogue.get("C4").matches_observed({"error": "Unsupported"})


def test_the_eager_backend_cases_match_a_step_without_aot_autograd_and_a_nan_is_not_a_difference():
    """C62 and C64 show where the step's graphs skipped AOTAutograd (the `eager` backend, whoever chose it: the
    matrix's eager column, or a user's own `backend="eager"`), read off the step, not the configuration; C64's NaN
    gradients are not C11's routing difference."""
    from toolkit.instrument.records import Numerics
    from toolkit.measurement.report import CompileInfo, ErrorInfo, ScenarioRecord

    def rec(backend, ac="remat"):
        return ScenarioRecord(name="x", ac_mode=ac, compile_scope="moe", backend=backend)

    def comp(aot):
        return CompileInfo(requested=True, graphs=1, compiled_in_step=1, aot_autograd=aot)

    text = "one of the variables needed for gradient computation has been modified by an inplace operation"
    # The configured backend does not decide: a user's eager-backend step measured by tk.measure says "user".
    for backend, aot, shows in (("user", False, True), ("eager", True, False), ("eager", None, False)):
        err = tk.Report(
            outcome="error",
            scenario=rec(backend, "full"),
            error=ErrorInfo("RuntimeError", text, "measure"),
            compile=comp(aot),
        )
        assert catalogue.get("C62").matches("error", err) is shows, (backend, aot)
    nan, diff = (
        Numerics(loss=5.0, reference_loss=5.0, loss_diff=0.0, max_grad_diff=d, worst_param="w", grads_match=False)
        for d in (float("nan"), 0.1)
    )
    for numerics, c11, c64 in ((nan, False, True), (diff, True, False)):
        r = tk.Report(outcome="ok", scenario=rec("eager"), numerics=numerics, compile=comp(False))
        assert (catalogue.get("C11").matches("grads_differ", r), catalogue.get("C64").matches("grads_differ", r)) == (
            c11,
            c64,
        )
    # After a JSON round trip the NaN is null: still not finite.
    r = tk.Report.from_json(tk.Report(outcome="ok", scenario=rec("eager"), numerics=nan, compile=comp(False)).to_json())
    assert catalogue.get("C64").matches("grads_differ", r) and not catalogue.get("C11").matches("grads_differ", r)


def test_a_signature_with_alternatives_matches_either_of_its_shapes(monkeypatch, tmp_path):
    """C6 shows in two ways under one order and AC mode: the mutated-cache error, and a silent full recompute whose
    recompute lists Inductor's extern `aten.mm.out` (the matrix's dense SAC(compile(block)) cells under inductor)."""
    from toolkit.measurement.report import CompileInfo, ErrorInfo, Recompute, ScenarioRecord

    c6 = catalogue.get("C6")
    record = ScenarioRecord(name="dense", ac_mode="selective_op", compile_scope="blocks", backend="inductor")
    around = CompileInfo(requested=True, graphs=2, orders={"layers.0": "AC(compile(x))"})
    silent = tk.Report(
        outcome="ok", scenario=record, compile=around, recompute=Recompute(ops=4, by_op={"aten.mm.out": 4})
    )
    mutated = tk.Report(
        outcome="error",
        scenario=record,
        compile=around,
        error=ErrorInfo(
            "RuntimeError", "Tensor cached during selective activation checkpoint has been mutated", "backward"
        ),
    )
    assert c6.matches("sac_not_applied", silent) and c6.matches("error", mutated)
    # Each alternative is whole: the error's classification with the recompute's evidence is neither shape.
    assert not c6.matches("error", silent) and not c6.matches("sac_not_applied", mutated)
    # The shared keys still hold: the same silent recompute inside compile, or under full AC, is not C6.
    inside = dataclasses.replace(silent, compile=dataclasses.replace(around, orders={"layers.0": "compile(AC(x))"}))
    full = dataclasses.replace(silent, scenario=dataclasses.replace(record, ac_mode="full"))
    assert not c6.matches("sac_not_applied", inside) and not c6.matches("sac_not_applied", full)
    # An alternative naming something no report carries is refused when the catalogue loads.
    data = json.loads(catalogue._PATH.read_text())
    (c6_entry,) = [case for case in data["cases"] if case["id"] == "C6"]
    c6_entry["signature"]["any_of"].append({"backend": "inductor"})
    bad = tmp_path / "catalogue.json"
    bad.write_text(json.dumps(data))
    monkeypatch.setattr(catalogue, "_PATH", bad)
    catalogue.cases.cache_clear()
    try:
        with pytest.raises(tk.ConfigError, match=r"C6.signature.any_of: an alternative names \['backend'\]"):
            catalogue.cases()
    finally:
        monkeypatch.undo()
        catalogue.cases.cache_clear()


# --- the bug notebooks -------------------------------------------------------------------------------------------


def test_every_notebook_case_is_confirmed_by_its_executed_notebook():
    """Each case with a notebook: the notebook calls `confirm` for it, and its committed (nbval-checked) output says
    the signature matched on every torch release the catalogue lists as reproducing it."""
    referenced = set()
    for case in catalogue.cases():
        if not case.notebook:
            continue
        path = NOTEBOOKS / case.notebook
        assert path.exists(), f"{case.id}: {case.notebook} is missing"
        referenced.add(path.name)
        nb = nbformat.read(path, as_version=4)
        assert nb.metadata["kernelspec"]["name"] == "python3" and "widgets" not in nb.metadata
        source = "\n".join(c.source for c in nb.cells)
        title = nb.cells[0].source.splitlines()[0]
        assert title.startswith("# ") and case.id in title.replace("(", " ").replace(")", " ").split(), (case.id, title)
        if case.signature is None:
            continue
        assert f'confirm("{case.id}"' in source, f"{case.id}: {path.name} never confirms it"
        # Outputs name no torch release (nbval re-checks them on each one): the committed run confirmed the case,
        # and where the catalogue has it fixed on some release the notebook asserts the verdict per release.
        outputs = _outputs(nb)
        if set(case.verified.values()) == {"reproduced"}:
            assert f"{case.id} reproduced on torch" in outputs, f"{case.id}: {path.name} does not show it reproduced"
        elif case.verified:
            # C31 depends on the torch build, not the release (CUDA builds have the placeholder helper): its
            # notebook asserts the verdict against the build's helper instead.
            assert f'expected("{case.id}")' in source or "has_placeholder_helper" in source, (
                f"{case.id}: {path.name} must assert tk.bugs.expected"
            )
    on_disk = {p.name for p in (NOTEBOOKS / "bugs").glob("*.ipynb")}
    assert on_disk == referenced, f"notebooks no case points to: {on_disk - referenced}"


def test_confirm_is_version_aware(monkeypatch):
    case = catalogue.get("C27")
    fixed_like = {"first_model": [1], "second_model": [1]}
    # On the release the catalogue says reproduces it, a non-matching run is a broken repro: fail loudly.
    monkeypatch.setattr(torch, "__version__", "2.13.0+cpu")
    with pytest.raises(AssertionError, match="catalogued as reproducing on torch 2.13.0"):
        bugs.confirm("C27", fixed_like)
    found = bugs.confirm("C27", {"first_model": [1], "second_model": [0, 2]})
    assert found.reproduced and catalogue.findings() == {}  # nothing new to record
    # On a release with no verdict: a record, not a failure.
    monkeypatch.setattr(torch, "__version__", "2.99.0")
    found = bugs.confirm("C27", fixed_like)
    assert not found.reproduced and found.catalogued == "unknown"
    text = str(found)
    assert text.startswith("C27 not reproduced on torch 2.99.0") and "recorded as a finding" in text
    assert catalogue.findings() == {"C27": {"2.99.0": "not reproduced"}}
    assert (
        catalogue.versions(case)
        == "reproduced on 2.13.0; reproduced on 2.14.1; reproduced on 2.15.0; not reproduced on 2.99.0 (local finding)"
    )
    assert "not reproduced on 2.99.0 (local finding)" in catalogue.markdown([case], with_findings=True)
    assert "local finding" not in catalogue.markdown([case])
    assert bugs.Finding.from_json(json.loads(json.dumps(found.to_json()))) == found
    with pytest.raises(ValueError, match="no signature"):
        bugs.confirm("C19", {})


def test_confirm_a_report_uses_the_classifier():
    report = tk.run(
        tk.Scenario(
            model=tk.ModelConfig(experts_impl="masked", token_count="bincount"),
            ac=tk.ACConfig.of(mode="full"),
            compile=tk.CompileConfig(scope="blocks"),
            measure_memory=False,
            steady_steps=0,
        )
    )
    found = bugs.confirm("C2", report)
    assert found.reproduced and found.observed["graphs"] == 0 and found.observed["fell_back_to_eager"] is True
    assert found.observed["classification"] == "fell_back_to_eager" and found.observed["grads_match"] is True


# --- standalone scripts ------------------------------------------------------------------------------------------


def _scripts():
    return sorted(p for p in STANDALONE.glob("c*.py"))


def test_standalone_scripts_follow_the_contract():
    assert len(_scripts()) >= 9
    for path in _scripts():
        tree = ast.parse(path.read_text())
        doc = ast.get_docstring(tree)
        assert doc and "Run: python" in doc and "Upstream:" in doc, path.name
        imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
        names = [a.name for n in imports if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in imports if isinstance(n, ast.ImportFrom)]
        assert not any(n.split(".")[0] == "toolkit" for n in names), f"{path.name} imports toolkit"
        top = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert {"bug", "fix"} <= top, path.name
        consts = {
            t.id: n.value.value
            for n in tree.body
            if isinstance(n, ast.Assign)
            for t in n.targets
            if isinstance(t, ast.Name) and isinstance(n.value, ast.Constant)
        }
        assert consts["CASE"] == f"C{int(path.name[1:3])}" and consts["NEEDS"] in ("cpu", "cuda"), path.name
        case = catalogue.get(consts["CASE"])
        assert case.notebook or (case.signature and case.verified), path.name  # C42: a script and verdicts suffice
        try:
            assert bugs.script(consts["CASE"]).__name__ == f"toolkit.bugs.standalone.{path.stem}"
        except ModuleNotFoundError as e:  # a transformers repro where it is not installed: `check` skips it so
            assert e.name in extras(), e
    assert bugs.script("C6").CASE == "C7"  # found through CASES
    with pytest.raises(KeyError, match="no standalone repro for C19"):
        bugs.script("C19")


def test_exported_script_runs_with_only_torch(tmp_path):
    path = bugs.export("C27", tmp_path)
    assert path.name == "c27_per_layer_sac_counter.py" and path.read_text() == (STANDALONE / path.name).read_text()
    # Run it from a directory where `toolkit` cannot be imported from the checkout.
    out = subprocess.run([sys.executable, "-I", str(path)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    assert 'bug {"first_model": [1], "second_model": [0, 2]}' in out.stdout


def test_show_prints_the_source(capsys):
    bugs.show("C24", "bug")
    assert capsys.readouterr().out.startswith("def bug() -> dict:")


# --- bug bundles -------------------------------------------------------------------------------------------------


def test_repro_export_bundle_with_trace(tmp_path):
    scenario = tk.Scenario(
        name="blocks compiled",
        model=tk.ModelConfig(experts_impl="masked"),
        ac=tk.ACConfig.of(mode="full"),
        compile=tk.CompileConfig(scope="blocks", fullgraph=True),
        measure_memory=False,
        steady_steps=0,
    )
    report = tk.run(scenario)
    with pytest.raises(ValueError, match="does not show C4's catalogue signature .it shows C1"):
        tk.repro.export(report, tmp_path / "wrong", case="C4")
    assert not (tmp_path / "wrong.py").exists()
    bundle = tk.repro.export(report, tmp_path / "bundle", case="C1", trace=True)
    assert bundle.names() == ["bundle.py", "bundle.ipynb", "bundle.env.json", "bundle.trace"]
    env = json.loads(bundle.environment.read_text())
    assert env["observed"]["torch"] == torch.__version__ and "exported_on" in env
    logs = list(bundle.trace.glob("dedicated_log_torch_trace*"))
    assert logs and logs[0].stat().st_size > 0
    assert "reproduced" in (bundle.trace / "script-output.txt").read_text()
    assert '"dynamo_start"' in logs[0].read_text()
    if shutil.which("tlparse"):  # the `trace` extra; .ci/run installs it
        out = subprocess.run(
            ["tlparse", str(logs[0]), "-o", str(tmp_path / "tl"), "--overwrite", "--no-browser"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr
        assert "compile_directory.json" in {p.name for p in (tmp_path / "tl").iterdir()}
    # Without the Scenario, export rebuilds it from the report.
    again = tk.repro.export(report, tmp_path / "again")
    assert repr(scenario.to_json()) in again.script.read_text()


def test_cases_cli(capsys):
    from toolkit.cli import main

    assert main(["cases", "--cpu", "gpu_only", "--markdown"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| id | case |") and "| C23 |" in out and "| C1 |" not in out
    assert main(["cases", "--cpu", "gpu_only"]) == 0  # the terminal table
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines()[2:] if line[:1] == "C"]
    assert "C23" in rows and "C1" not in rows
    assert main(["cases", "--needs", "multi-rank", "--markdown"]) == 0
    rows = [line.split(" | ")[0][2:] for line in capsys.readouterr().out.splitlines()[2:]]
    assert rows == ["C39", "C43", "C44"]
    assert main(["cases", "--check", "C27", "C24"]) == 0
    out = capsys.readouterr().out
    assert "C27 reproduced on torch" in out and "C24 reproduced on torch" in out
    assert main(["cases", "--check", "C19"]) == 2
    assert "no standalone repro for C19" in capsys.readouterr().err


def _repro_cases() -> list[str]:
    """Every case `cases --check all` runs: a signature and a standalone repro."""
    return [c.id for c in catalogue.cases() if c.signature and bugs.has_script(c.id)]


def test_every_standalone_repro_is_checked_on_every_release_once():
    """CI's older releases run `-m per_release`: each case `cases --check all` covers is confirmed there once, by the
    repro test below or by a bug notebook that runs the same repro, never twice (tests/conftest.py deselects the
    test where the notebook runs). A bug notebook is per release where it is its case's only check (a Scenario, no
    repro) or its verdict differs between releases; in README's stage every notebook runs, and their repros' tests
    step aside. Checked on this session's collection (the same rules whatever `-m` said) and on the notebooks."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("notebooks_conftest", NOTEBOOKS / "conftest.py")
    nb_conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nb_conftest)
    notebooks = sorted((NOTEBOOKS / "bugs").glob("*.ipynb"))
    runs = {path.name: set(nb_conftest.repro_cases(path)) for path in notebooks}
    everything = set(_repro_cases())
    ran_by_notebooks = set().union(*runs.values())
    assert len(everything) >= 30 and ran_by_notebooks <= everything
    per_release = {
        name
        for name, cases in runs.items()
        if not cases or nb_conftest._differs_between_releases(NOTEBOOKS / "bugs" / name)
    }
    # The Scenario-only notebooks, and those whose verdict moves (C14: fixed on 2.15; C26; C31: fixed after 2.13).
    assert {"C01_order_matrix.ipynb", "C14_grouped_mm_gotchas.ipynb", "C31_remat_placeholder_cpu_build.ipynb"} <= (
        per_release
    )
    assert "C52_compiled_autograd_eager_checkpoint.ipynb" not in per_release  # 42 s of kernel: its repro, alone
    # Under -m per_release, each repro is run once: by a per-release notebook, else by its own test.
    by_notebook = set().union(*(runs[n] for n in per_release))
    by_test = everything - by_notebook
    assert by_notebook | by_test == everything and not by_notebook & by_test


# The run's own findings file (CI's, read by .ci/verdicts.py), taken before `_findings` points each test elsewhere.
_RUN_FINDINGS = os.environ.get("TOOLKIT_FINDINGS")


@pytest.mark.per_release
@pytest.mark.parametrize("case_id", _repro_cases())
def test_a_standalone_repro_gives_this_releases_verdict(case_id, monkeypatch):
    """What `cases --check` says of a case, against the catalogue's verdict for the running release (C42: the
    FutureWarning exists from torch 2.14 on; C59: the exit-time SIGSEGV of 2.15); deselected where a bug notebook of
    this run runs the same repro (tests/conftest.py). A new verdict is recorded where the run records the bug
    notebooks' (CI's verdict line counts it)."""
    if _RUN_FINDINGS:
        monkeypatch.setenv("TOOLKIT_FINDINGS", _RUN_FINDINGS)
    found = bugs.check(case_id)
    if isinstance(found, bugs.Skipped):
        pytest.skip(found.reason)
    if case_id == "C42":
        assert found.reproduced == found.observed["has_argument"], found
    expected = catalogue.get(case_id).verified.get(catalogue.torch_release())
    if expected is not None:
        assert ("reproduced" if found.reproduced else "not reproduced") == expected or (
            expected == "fixed" and not found.reproduced
        ), found


def test_cases_check_skips_a_repro_whose_optional_package_is_missing(monkeypatch, capsys):
    """Without torch_remat, `cases --check` names the package and its install line for the remat repros, and runs
    the others (a case without its own file is found without importing every script)."""
    import sys

    from toolkit.cli import main

    monkeypatch.setitem(sys.modules, "torch_remat", None)  # `import torch_remat` raises ModuleNotFoundError
    for name in [m for m in sys.modules if m.startswith("toolkit.bugs.standalone.c3")]:
        monkeypatch.delitem(sys.modules, name)
    skipped = bugs.check("C30")
    assert (
        isinstance(skipped, bugs.Skipped) and "needs torch_remat" in skipped.reason and "pip install" in skipped.reason
    )
    assert bugs.script("C6").CASE == "C7"  # found through c07's CASES without importing c30
    assert main(["cases", "--check", "C30", "C27"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("C30 skipped: its repro needs torch_remat") and "C27 reproduced on torch" in out


def test_a_sweep_without_torch_remat_says_which_cells_it_leaves_out(monkeypatch, capsys, tmp_path):
    """The matrix without torch_remat leaves out the remat cells and main's recipe, and says so with the install
    line (the quick sweep was 40 cells with it, 39 without, and nothing said why); `--only remat` says it too, and
    `env` gives the install line of every missing extra."""
    from toolkit import compat
    from toolkit.analysis.cells import full_cells, quick_cells
    from toolkit.cli import main

    with_remat = (len(quick_cells()), len(full_cells()))
    monkeypatch.setitem(sys.modules, "torch_remat", None)
    monkeypatch.setitem(compat._FINDERS, "torch_remat", lambda: compat._Found(False, "removed"))
    compat.refresh()
    try:
        assert (len(quick_cells()), len(full_cells())) < with_remat
        assert main(["matrix", "--dry-run", "--out", str(tmp_path / "o")]) == 0
        err = capsys.readouterr().err
        assert "left out: the remat cells and recipe torchtitan_main, which needs torch_remat" in err
        assert 'pip install -e ".[dev]"' in err
        with pytest.raises(SystemExit):
            main(["matrix", "--only", "remat", "--dry-run", "--out", str(tmp_path / "o")])
        err = capsys.readouterr().err
        assert "matches no cell of the quick sweep; left out: the remat cells" in err
        assert main(["env"]) == 0
        assert "optional: needs torch_remat (not installed" in capsys.readouterr().out
    finally:
        monkeypatch.undo()
        compat.refresh()


def test_every_status_line_agrees_with_the_verdicts():
    """A case's status stays true on every release CI runs: "fixed in torch X" has no `reproduced` verdict on X or
    a later release, and a case whose verdicts turn to `fixed` on some release says so in its status (naming the
    release, or that it is fixed) — the verdicts are rechecked per release, the status is prose."""

    def key(release):
        return tuple(int(x) for x in release.split("."))

    wrong = []
    for c in catalogue.cases():
        releases = sorted(c.verified, key=key)
        m = re.search(r"fixed in torch (\d+\.\d+\.\d+)", c.status)
        if m and any(c.verified[r] == "reproduced" for r in releases if key(r) >= key(m.group(1))):
            wrong.append(f"{c.id}: says fixed in {m.group(1)}, verdicts {c.verified}")
        fixed = [r for r in releases if c.verified[r] == "fixed"]
        if fixed and fixed[0] not in c.status and "fixed" not in c.status:
            wrong.append(f"{c.id}: fixed on {fixed[0]} but the status says {c.status[:60]!r}")
    assert wrong == []
    assert catalogue.get("C74").verified["2.15.0"] == "fixed" and "fixed in torch 2.15.0" in catalogue.get("C74").status
