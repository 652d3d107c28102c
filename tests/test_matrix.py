"""The composability matrix: isolated cells, persistence and resume, crash/hang as results, classification, outputs."""

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

import toolkit as tk
from toolkit.analysis.matrix import Cell, MatrixResult, quick_cells
from toolkit.analysis.classification import classify
from toolkit.analysis.sweeps import load_results, sweep

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
    assert len(fig.data) == 2 and fig.data[0].type == "heatmap"  # one panel per block kind
    assert "fell_back_to_eager" in str(result.filter(label="fell_back_to_eager").table())
    assert len(load_results(tmp_path / "results.jsonl")) == 4


def test_rerun_skips_finished_cells(tmp_path):
    calls = []

    def runner(scenario):
        calls.append(scenario.name)
        return tk.run(scenario.replace(check_numerics=False, measure_memory=False, steady_steps=0))

    cells = FOUR[:2]
    sweep(cells, out=tmp_path, progress=False, runner=runner)
    assert len(calls) == 2
    again = sweep(cells, out=tmp_path, progress=False, runner=runner)
    assert len(calls) == 2 and len(again.rows) == 2  # the cache answered
    sweep(cells + [Cell("dense")], out=tmp_path, progress=False, runner=runner)
    assert len(calls) == 3


def test_kill_minus_nine_mid_sweep_loses_only_cells_in_flight(tmp_path):
    script = textwrap.dedent(f"""
        from toolkit.analysis.matrix import Cell
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
        return tk.run(scenario.replace(check_numerics=False, measure_memory=False, steady_steps=0), isolate=True,
                      timeout_s=15 if fault == "hang" else 300)

    result = sweep([Cell("dense"), bad], out=tmp_path, progress=False, runner=runner)
    cls = _by_cell(result)
    assert cls[bad].label == label and cls[Cell("dense")].label == "works"
    assert len(load_results(tmp_path / "results.jsonl")) == 2


def test_classifier_silent_failures():
    cfg = tk.ModelConfig(router_noise=0.5, experts_impl="grouped_mm")
    bad = tk.run(tk.Scenario(model=cfg, ac=tk.ACConfig(mode="full", preserve_rng_state=False), measure_memory=False,
                             steady_steps=0))
    cl = classify(bad)
    assert cl.label == "grads_differ" and "C11" in cl.cases
    breaks = tk.run(tk.Scenario(model=tk.ModelConfig(experts_impl="for_loop"), compile=tk.CompileConfig(scope="moe"),
                                measure_memory=False, steady_steps=0))
    cl = classify(breaks)
    # The `.tolist()` break splits the graph, and the resumed code specialises on the split sizes: the second
    # MoE layer routes differently and recompiles (a recompile per distinct routing).
    assert cl.label == "recompiles" and "graph_breaks" in cl.flags and "C13" in cl.cases
    assert "torch.split" in cl.explanation
    # SAC whose policy saves nothing selective looks like full AC.
    none = tk.run(tk.Scenario(measure_memory=False, steady_steps=0))
    full = tk.run(tk.Scenario(ac=tk.ACConfig(mode="full"), measure_memory=False, steady_steps=0))
    nothing = tk.run(tk.Scenario(ac=tk.ACConfig(mode="custom", save_ops=()), measure_memory=False, steady_steps=0))
    assert classify(nothing, {"none": none, "full": full}).label in ("sac_not_applied",)
    assert classify(full, {"none": none, "full": full}).label == "works"
    assert classify(none, {"none": full, "full": full}).label == "works"  # AC none is never 'saves nothing'


def test_quick_sweep_size():
    cells = quick_cells()
    assert len(cells) >= 24
    assert {c.block for c in cells} >= {"dense", "moe:for_loop"} and any(c.recipe for c in cells)
