"""The Explorer, driven headless: every control reachable, invalid combinations explained, run, pin, compare, export."""

import subprocess
import sys

from toolkit.notebook.widgets import Explorer


def test_every_control_is_reachable_and_maps_to_the_scenario():
    ex = Explorer()
    assert set(ex.controls) >= {"block", "n_layers", "dim", "n_experts", "top_k", "experts_impl", "ac_mode", "layer_every",
                                "submodule_ac", "memory_budget", "scope", "backend", "fullgraph", "order",
                                "capture_scalar_outputs", "capture_dynamic_output_shape_ops", "recipe"}
    c = ex.controls
    c["n_layers"].value, c["ac_mode"].value, c["scope"].value, c["fullgraph"].value = 3, "selective_op", "blocks", True
    s = ex.scenario
    assert s.model.n_layers == 3 and s.ac.mode == "selective_op" and s.compile.scope == "blocks" and s.compile.fullgraph
    assert not ex.run_button.disabled and "ready" in ex.status.value
    assert c["layer_every"].disabled and not c["top_k"].disabled
    c["block"].value = "dense"
    assert c["top_k"].disabled and ex.scenario.model.moe_layers == "none"


def test_invalid_combinations_are_explained_before_running():
    ex = Explorer()
    ex.controls["top_k"].value = 8  # more than the 4 experts
    assert ex.run_button.disabled and "ModelConfig.top_k" in ex.status.value
    ex.controls["top_k"].value = 2
    ex.controls["ac_mode"].value = "memory_budget"
    assert ex.run_button.disabled and "memory_budget" in ex.status.value
    ex.controls["scope"].value = "blocks"
    assert not ex.run_button.disabled
    ex.controls["ac_mode"].value, ex.controls["scope"].value, ex.controls["order"].value = "full", "attention", "compile_outside"
    assert ex.run_button.disabled and "CompileConfig.order" in ex.status.value  # known from the structure, not run
    assert ex.run() is None


def test_run_pin_compare_and_export(tmp_path):
    ex = Explorer()
    ex.controls["n_layers"].value = 2
    r1 = ex.run()
    assert r1.ok and ex.report is r1 and "saved for backward" in ex.summary.value and ex.stage.value == "done: ok"
    # Figures went into the Output widget's state as plotly bundles (not displayed as a side effect).
    assert len(ex.figures.outputs) >= 3
    for out in ex.figures.outputs:
        fig = out["data"]["application/vnd.plotly.v1+json"]
        assert fig["data"] and fig["data"][0]["type"] == "bar" and out["data"]["text/plain"].startswith("<plotly figure")
    ex.pin()
    ex.controls["ac_mode"].value = "full"
    assert ex.run().ok
    ex.pin()
    text = ex.compare()
    assert "layers.0.moe.routed_experts" in text and "A = #1" in ex.comparison.value
    py, ipynb = ex.export(tmp_path / "repro")
    assert py.exists() and ipynb.exists()
    out = subprocess.run([sys.executable, str(py)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "reproduced" in out.stdout and "torch" in out.stdout


def test_recipe_disables_the_ac_and_compile_controls():
    ex = Explorer()
    ex.controls["recipe"].value = "torchtitan_2025_09"
    assert ex.controls["ac_mode"].disabled and ex.controls["scope"].disabled
    assert ex.scenario.recipe == "torchtitan_2025_09" and ex.scenario.model.experts_graph_break
    r = ex.run()
    assert r.outcome == "error" and "error at forward" in ex.summary.value
