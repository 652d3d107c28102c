"""The composability matrix: isolated cells, persistence and resume, crash/hang as results, classification, outputs."""

import importlib.util
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from _helpers import synthetic_matrix

import toolkit as tk
from toolkit.analysis.cells import Cell, quick_cells
from toolkit.analysis.classification import EXPLAIN, SILENT, classify, describe, headline, reference_scenarios
from toolkit.analysis.matrix import MatrixResult
from toolkit.analysis.store import load_results
from toolkit.analysis.sweeps import sweep
from toolkit.analysis.views import COLORS, SYMBOLS

FOUR = [
    Cell("dense", "selective_op"),
    Cell("moe:for_loop", "full", "blocks"),
    Cell("moe:for_loop", "full", "blocks", fullgraph=True),
    Cell("moe:for_loop", recipe="torchtitan_2025_09"),
]


def _by_cell(result: MatrixResult) -> dict:
    return {r.cell: r.classification for r in result.rows}


def test_four_cell_sweep_end_to_end(tmp_path):
    result = sweep(FOUR, out=tmp_path, workers=2, timeout_s=300, progress=False)
    cls = _by_cell(result)
    assert cls[FOUR[0]].label == "works"
    fell = cls[FOUR[1]]
    assert fell.label == "fell_back_to_eager" and "C2" in fell.cases
    assert any("139989" in link for link in fell.links)
    assert cls[FOUR[2]].label == "works"
    err = cls[FOUR[3]]
    assert err.label == "error" and "C4" in err.cases and "Unsupported" in err.explanation
    # Outputs.
    data = json.loads((tmp_path / "matrix.json").read_text())
    assert len(data["cells"]) == 4 and {"torch", "device", "cpu"} <= set(data["environment"])
    assert data["cells"][0]["classification"]["label"] in ("works", "fell_back_to_eager", "error")
    md = (tmp_path / "matrix.md").read_text()
    assert md.index("### error") < md.index("### fell_back_to_eager") < md.index("### works")
    html = (tmp_path / "matrix.html").read_text()
    # No script is loaded from the network (plotly.js itself only mentions URLs in its config defaults).
    assert not re.search(r"<script[^>]*\bsrc\s*=", html) and "Plotly.newPlot" in html
    assert len(html) > 1_000_000  # plotly.js embedded: opens offline
    fig = result.heatmap()
    # One panel per block kind, and the recipe in a panel of its own.
    assert [t.name for t in fig.data] == ["dense", "moe:for_loop", "recipes"] and fig.data[0].type == "heatmap"
    assert "<th>backend</th>" in html
    assert "fell_back_to_eager" in str(result.filter(label="fell_back_to_eager").table())
    # The two failing cells were rerun bare (no probes), each a record of its own: both fail without the instrument.
    assert len(load_results(tmp_path / "results.jsonl")) == 6
    rows = {r.cell: r for r in result.rows}
    assert rows[FOUR[1]].bare.compile.graphs == 0 and rows[FOUR[1]].bare.compile.graph_breaks == 1
    assert [rows[c].bare_verdict for c in FOUR] == [None, "yes", None, "yes"]
    assert rows[FOUR[3]].bare.error.type == rows[FOUR[3]].report.error.type


def test_rerun_skips_finished_cells(tmp_path):
    calls = []

    def runner(scenario):
        calls.append((scenario.name, scenario.instrument))
        return tk.run(scenario.replace(check_numerics=False, measure_memory=False, steady_steps=0))

    cells = FOUR[:2]
    sweep(cells, out=tmp_path, progress=False, runner=runner)
    # The two cells, then the one that fell back to eager once more, bare.
    assert [instrumented for _, instrumented in calls] == [True, True, False]
    again = sweep(cells, out=tmp_path, progress=False, runner=runner)
    assert len(calls) == 3 and len(again.rows) == 2  # the cache answered, the bare rerun's included
    sweep(cells + [Cell("dense")], out=tmp_path, progress=False, runner=runner)
    assert len(calls) == 4


def test_kill_minus_nine_mid_sweep_loses_only_cells_in_flight(tmp_path):
    script = textwrap.dedent(f"""
        from toolkit.analysis.cells import Cell
        from toolkit.analysis.sweeps import sweep
        cells = [Cell("dense"), Cell("dense", "full"), Cell("dense", "selective_op"), Cell("moe:for_loop")]
        sweep(cells, out={str(tmp_path)!r}, workers=1, timeout_s=300, progress=False)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=pathlib.Path(tk.__file__).parents[1])
    results = tmp_path / "results.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and (not results.exists() or len(results.read_text().splitlines()) < 1):
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    first = load_results(results)
    assert 1 <= len(first) < 4
    cells = [Cell("dense"), Cell("dense", "full"), Cell("dense", "selective_op"), Cell("moe:for_loop")]
    calls = []

    def runner(scenario):
        calls.append(scenario.name)
        return tk.run(scenario.replace(check_numerics=False, measure_memory=False, steady_steps=0))

    result = sweep(cells, out=tmp_path, progress=False, runner=runner)
    assert len(calls) == 4 - len(first)
    keys = [json.loads(line)["key"] for line in results.read_text().splitlines() if line.strip().startswith("{")]
    assert len(keys) == len(set(keys)) == 4
    assert len(result.rows) == 4


@pytest.mark.parametrize("fault, label", [("abort", "crashed"), ("hang", "timeout")])
def test_a_crashing_or_hanging_cell_is_a_result_and_the_sweep_goes_on(tmp_path, monkeypatch, fault, label):
    bad = Cell("dense", "full")

    def runner(scenario):
        if scenario.name == bad.label:
            monkeypatch.setenv("TOOLKIT_WORKER_FAULT", f"{fault}@forward")
        else:
            monkeypatch.delenv("TOOLKIT_WORKER_FAULT", raising=False)
        return tk.run(
            scenario.replace(check_numerics=False, measure_memory=False, steady_steps=0),
            isolate=True,
            timeout_s=15 if fault == "hang" else 300,
        )

    result = sweep([Cell("dense"), bad], out=tmp_path, progress=False, runner=runner)
    cls = _by_cell(result)
    assert cls[bad].label == label and cls[Cell("dense")].label == "works"
    assert len(load_results(tmp_path / "results.jsonl")) == 2


def test_classifier_silent_failures():
    cfg = tk.ModelConfig(router_noise=0.5, experts_impl="grouped_mm")
    bad = tk.run(
        tk.Scenario(
            model=cfg, ac=tk.ACConfig.of(mode="full", preserve_rng_state=False), measure_memory=False, steady_steps=0
        )
    )
    cl = classify(bad)
    assert cl.label == "grads_differ" and "C11" in cl.cases
    breaks = tk.run(
        tk.Scenario(
            model=tk.ModelConfig(experts_impl="for_loop"),
            compile=tk.CompileConfig(scope="moe"),
            measure_memory=False,
            steady_steps=0,
        )
    )
    cl = classify(breaks)
    # The `.tolist()` break splits the graph, and the resumed code specialises on the split sizes: the second
    # MoE layer routes differently and recompiles (a recompile per distinct routing).
    assert cl.label == "recompiles" and "graph_breaks" in cl.flags and "C13" in cl.cases
    assert "torch.split" in cl.explanation
    # SAC whose policy saves nothing selective looks like full AC.
    none = tk.run(tk.Scenario(measure_memory=False, steady_steps=0))
    full = tk.run(tk.Scenario(ac=tk.ACConfig.of(mode="full"), measure_memory=False, steady_steps=0))
    nothing = tk.run(tk.Scenario(ac=tk.ACConfig.of(mode="custom", save_ops=()), measure_memory=False, steady_steps=0))
    assert classify(nothing, {"none": none, "full": full}).label in ("sac_not_applied",)
    assert classify(full, {"none": none, "full": full}).label == "works"
    assert classify(none, {"none": full, "full": full}).label == "works"  # AC none is never 'saves nothing'


def test_quick_sweep_size():
    cells = quick_cells()
    assert len(cells) >= 24
    assert {c.block for c in cells} >= {"dense", "moe:for_loop"} and any(c.recipe for c in cells)


def test_works_is_explained_per_cell_kind():
    """An eager cell is never said to be "compiled as requested"; a compiled cell and a recipe say how many graphs."""
    result, _ = synthetic_matrix()
    why = {r.key: r.classification.explanation for r in result.rows if r.classification.label == "works"}
    assert why["moe_none"] == "ran eagerly (no compile requested), gradients match eager"
    assert why["works"] == "ran compiled as requested (1 graph, no graph break), gradients match eager"
    assert why["recipe_ok"] == "the recipe ran compiled (1 graph, no graph break), gradients match eager"
    assert "compiled as requested" not in EXPLAIN["works"]
    eager = tk.run(tk.Scenario(check_numerics=False, measure_memory=False, steady_steps=0))
    assert classify(eager).explanation.startswith("ran eagerly (no compile requested), gradients not compared")


def test_heatmap_cells_carry_their_label_and_the_grid_text_twin():
    result, cells = synthetic_matrix()
    fig = result.heatmap()
    assert [t.name for t in fig.data] == ["moe:for_loop", "dense", "recipes"]
    moe, dense, recipes = fig.data
    assert list(moe.y) == ["none", "full", "selective_op"] and list(moe.x)[0] == "eager"  # no AC and eager first
    assert list(recipes.x) == ["torchtitan_2025_09", "torchtitan_0_3_0"] and list(recipes.y) == ["moe:for_loop"]
    texts = [t for trace in fig.data for row in trace.text for t in row if t]
    assert {t.split("<br>")[0] for t in texts} == {SYMBOLS[k] for k in cells}
    # Every case a cell matches, not only the first; every panel says what its axes are.
    assert "EAGER<br>C2 C13" in texts and moe.texttemplate == "%{text}"
    assert (fig.layout.xaxis.title.text, fig.layout.yaxis.title.text) == ("compile setup", "AC mode")
    # Discrete colours: each classification's band of the colour scale is its own colour.
    scale = {round(v, 3): c for v, c in moe.colorscale}
    from toolkit.analysis.classification import SEVERITY

    assert [scale[round(i / len(SEVERITY), 3)] for i in range(len(SEVERITY))] == [COLORS[k] for k in SEVERITY]
    grid = result.grid_text()
    assert grid.splitlines()[0].split()[:3] == ["moe:for_loop", "eager", "blocks"]
    assert "EAGER C2,C13" in grid and "NO SAC" in grid and "ERROR C4" in grid and "recipes" in grid
    assert grid == synthetic_matrix()[0].grid_text()  # deterministic


def test_headline_and_describe_lead_with_the_classification():
    result, _ = synthetic_matrix()
    row = next(r for r in result.rows if r.key == "fell_back_to_eager")
    line = headline(row.report, row.classification)
    assert line.startswith(f"{row.cell.label}: fell_back_to_eager [silent failure] — compile requested")
    assert line.endswith("known case C2, C13") and "fell_back_to_eager" in SILENT and "error" not in SILENT
    text = describe(row.report, row.classification, references=False)
    assert text.splitlines()[0] == line and "  also: graph_breaks" in text and "  step outcome: ok" in text
    assert "not checked: ac_saves_nothing" in text  # full AC: sac_not_applied is never a question
    sac = next(r for r in result.rows if r.key == "sac_not_applied")
    assert "not checked: sac_not_applied, ac_saves_nothing" in describe(
        sac.report, sac.classification, references=False
    )
    assert "https://github.com/pytorch/pytorch/issues/139989" in text


def test_reference_scenarios_are_the_same_setup_without_ac_and_with_full_ac():
    sc = tk.Scenario(
        ac=tk.ACConfig.of(mode="selective_op"), compile=tk.CompileConfig(scope="blocks", order="ac_outside")
    )
    refs = reference_scenarios(sc)
    assert refs["none"].ac == tk.ACConfig.of() and refs["none"].compile.order is None
    assert refs["full"].ac == tk.ACConfig.of(mode="full") and refs["full"].compile == sc.compile
    assert all(not r.check_numerics and not r.measure_memory for r in refs.values())
    assert set(reference_scenarios(sc.replace(ac=tk.ACConfig.of(mode="full")))) == {"none"}
    assert (
        reference_scenarios(tk.Scenario()) == {} and reference_scenarios(tk.Scenario(recipe="torchtitan_0_3_0")) == {}
    )


def test_fsdp_and_torchtitan_axes_of_the_matrix(tmp_path):
    """Real FSDP2 in the full sweep (PR #2052 with `fully_shard(moe.experts)` itself, C4) and torchtitan's own
    models with its own transforms (`--stack torchtitan`), measured, classified and drawn like any cell."""
    from toolkit.analysis.cells import full_cells
    from toolkit.analysis.grids import stack_cells, torchtitan_cells
    from toolkit.analysis.sweeps import default_cells

    c4 = Cell("moe:for_loop", recipe="torchtitan_2025_09", fsdp="blocks+experts")
    sharded_blocks = Cell("moe:for_loop", recipe="torchtitan_2025_09", fsdp="blocks")
    assert {c4, sharded_blocks} <= set(full_cells()) and not any(c.fsdp != "none" for c in quick_cells())
    assert c4.label == "moe:for_loop | recipe torchtitan_2025_09 + FSDP blocks+experts | aot_eager"
    assert not c4.model_config().experts_graph_break  # FSDP's own hook, not the stand-in
    cells = [c4, sharded_blocks]
    if importlib.util.find_spec("torchtitan") is not None:
        titan = Cell("titan:qwen3_moe", "selective_op", "blocks", True, fsdp="blocks")
        assert titan in torchtitan_cells() and len(torchtitan_cells()) == 24
        # "all" is every stack's grid: the toolkit's quick cells, torchtitan's, and transformers' quick grid where it
        # is installed too (or a refusal naming its install line where it is not).
        both = set(default_cells(quick=True, backends=("aot_eager",), stack=("toolkit", "torchtitan")))
        assert both == set(quick_cells()) | set(torchtitan_cells())
        if importlib.util.find_spec("transformers") is not None:
            hf = set(stack_cells("transformers", ("aot_eager",), quick=True))
            assert hf and all(c.block.startswith("hf:") for c in hf)
            assert set(default_cells(quick=True, backends=("aot_eager",), stack="all")) == both | hf
        else:
            with pytest.raises(tk.ConfigError, match=r"sweep\.stack: .*transformers"):
                default_cells(quick=True, backends=("aot_eager",), stack="all")
        cells.append(titan)
    with pytest.raises(tk.ConfigError, match="sweep.stack: 'titan' is not one of"):
        default_cells(quick=True, backends=("aot_eager",), stack="titan")
    result = sweep(cells, out=tmp_path, workers=1, timeout_s=600, progress=False)
    cls = _by_cell(result)
    assert cls[c4].label == "error" and "C4" in cls[c4].cases and "Unsupported" in cls[c4].explanation
    # Sharding only the blocks runs, with one recompile: the guard `len(args) == 2` on checkpoint_wrapper's forward
    # fails — the recipe's per-submodule wrappers share one compiled forward called with two arities (C56).
    assert cls[sharded_blocks].label == "recompiles" and "len(args)" in cls[sharded_blocks].explanation
    assert cls[sharded_blocks].cases == ("C56",)
    rows = {r.cell: r for r in result.rows}
    assert rows[sharded_blocks].report.scenario.fsdp == "blocks"
    if len(cells) == 3:
        assert cls[titan].label == "works" and rows[titan].report.scenario.stack == "torchtitan"
        assert [t.name for t in result.heatmap().data] == ["titan:qwen3_moe", "recipes"]


def test_the_list_by_case_counts_each_case_once_per_cell_with_its_workaround(tmp_path):
    from toolkit.analysis import catalogue

    result, cells = synthetic_matrix()
    entries = {e["case"].id: e for e in result.by_case()}
    # Counted from the hand-made cells: C13 on the fallback, the recompile and the graph-break cells; the rest once.
    assert {cid: len(e["rows"]) for cid, e in entries.items()} == {"C13": 3, "C2": 1, "C4": 1, "C11": 1}
    assert entries["C13"]["labels"] == {"fell_back_to_eager": 1, "recompiles": 1, "graph_breaks": 1}
    md = result.cases_table()
    lines = md.splitlines()
    assert lines[0] == "## By case (4)" and lines[6].startswith("| [C13](")  # most cells first
    for cid in entries:
        (row,) = [line for line in lines if line.startswith(f"| [{cid}](")]
        case = catalogue.get(cid)
        assert case.workaround in row and pathlib.Path(case.notebook).stem in row
    # The markdown page opens with it, before the per-classification tables.
    page = result.write(tmp_path)["md"].read_text()
    assert page.index("## By case (4)") < page.index("### error")


def test_every_catalogued_case_says_its_workaround():
    from toolkit.analysis import catalogue

    missing = [c.id for c in catalogue.cases() if len(c.workaround) < 20]
    assert not missing, f"catalogue.json: give these cases a workaround: {missing}"


def test_backend_differences_name_what_differs_between_aot_eager_and_inductor():
    import dataclasses

    from toolkit.analysis.matrix import Row
    from toolkit.measurement.report import Saved

    result, cells = synthetic_matrix()
    base = {r.cell: r for r in result.rows}
    same = cells["works"]  # 200,000 B with aot_eager
    sac = cells["sac_not_applied"]
    twins = [
        Row(key="i1", cell=dataclasses.replace(same, backend="inductor"), report=base[same].report),
        Row(
            key="i2",
            cell=dataclasses.replace(sac, backend="inductor"),
            report=dataclasses.replace(base[sac].report, saved=Saved(total_bytes=123_456)),
        ),
    ]
    both = MatrixResult(rows=[*result.rows, *twins])
    diffs = both.backend_differences()
    assert [(a.cell, i.cell.backend) for a, i, _ in diffs] == [(sac, "inductor")]
    # More saved under inductor than under full AC's reference is no longer "SAC not applied".
    assert diffs[0][2] == ["classified sac_not_applied vs works", "saved 60000 vs 123456 B"]
    md = both.backend_table()
    assert md.startswith("## aot_eager vs inductor (1)") and "Of 2 cells measured with both backends" in md
    assert result.backend_table() == ""  # no inductor half: no section


def test_legend_counts_agree_with_the_tables_and_add_what_hides_behind_another_finding():
    result, _ = synthetic_matrix()
    tables = {label: len(rows) for label, rows in result.central_list()}
    assert result.counts() == tables
    # The fallback and the recompile cell have graph breaks too: two cells behind a more severe finding.
    assert result.secondary_counts() == {"graph_breaks": 2}
    assert "+2 behind another finding" in result.html()


def test_recipe_cells_carry_the_ac_mode_their_recipe_applies_so_mode_keyed_cases_match():
    from toolkit.analysis import catalogue
    from toolkit.measurement.report import CompileInfo, Report, ScenarioRecord
    from toolkit.transforms.recipes import RECIPES

    # What each recipe's code applies to a block (toolkit/transforms/recipes.py), written out here.
    applies = {
        "torchtitan_2025_09": "per_submodule",
        "torchtitan_2025_09_see_through": "per_submodule",
        "torchtitan_2025_12": "selective_op",
        "torchtitan_0_3_0": "selective_op",
        "torchtitan_0_3_0_full_ac": "full",
        "torchtitan_main": "remat",
    }
    assert {name: ScenarioRecord.of(tk.Scenario(recipe=name)).ac_mode for name in RECIPES} == applies
    # A record written before recipes carried their mode reads as the recipe's mode.
    assert ScenarioRecord(name="old", recipe="torchtitan_main", ac_mode="recipe").ac_mode == "remat"
    # C46 is keyed on remat: a torchtitan_main cell that fell back to eager is named by it.
    record = ScenarioRecord.of(tk.Scenario(recipe="torchtitan_main"))
    fell = Report(outcome="ok", scenario=record, compile=CompileInfo(requested=True, graphs=0, graph_breaks=1))
    assert "C46" in [c.id for c in catalogue.match("fell_back_to_eager", fell)]


def test_a_cell_that_saves_other_bytes_on_another_release_is_listed_with_its_cause():
    """The central list's "Changed between torch releases" lists byte differences too, each named by the ops whose
    saved bytes differ and explained where the cause is known (the RNG stash 2.14 stopped keeping)."""
    from toolkit.analysis.classification import classify
    from toolkit.analysis.matrix import MatrixResult, Row
    from toolkit.measurement.report import Report, Saved, ScenarioRecord

    cell = Cell("dense", "full", "blocks", True)
    record = ScenarioRecord(name=cell.label, ac_mode="full", compile_scope="blocks", backend="aot_eager")

    def row(rng: int, other: int = 32768) -> Row:
        by_op = {"aten.add.Tensor": other, **({"run_and_save_rng_state": rng} if rng else {})}
        report = Report(outcome="ok", scenario=record, saved=Saved(total_bytes=sum(by_op.values()), by_op=by_op))
        return Row(cell.label, cell, report, classify(report))

    old = MatrixResult(rows=[row(10112)], environment={"torch": "2.13.0+cpu"})
    new = MatrixResult(rows=[row(0)], environment={"torch": "2.15.0+cu132"}, others={"2.13.0+cpu": old})
    ((r, there),) = new.torch_changes()
    assert there["2.13.0+cpu"].saved_bytes == 42880 and there["2.13.0+cpu"].label == "works"
    assert there["2.13.0+cpu"].cause.startswith("+10,112 B there: the compiled checkpoint's RNG stash")
    assert there["2.13.0+cpu"].cause.endswith("(by op: run_and_save_rng_state +10,112 B)")
    md = new.changes_table()
    assert "## Changed between torch releases (1)" in md and "1 × +10,112 B there: the compiled checkpoint's" in md
    # An op the table does not know is named with its difference, unexplained; the same bytes are no change.
    unknown = MatrixResult(rows=[row(0, 4096)], environment={"torch": "2.15.0"}, others={"2.13.0": old})
    cause = unknown.torch_changes()[0][1]["2.13.0"].cause
    assert cause == "+38,784 B there (by op: aten.add.Tensor +28,672 B; run_and_save_rng_state +10,112 B)"
    same = MatrixResult(rows=[row(10112)], environment={"torch": "2.14.1"}, others={"2.13.0": old})
    assert same.torch_changes() == [] and "none classifies differently or saves other bytes" in same.changes_table()
