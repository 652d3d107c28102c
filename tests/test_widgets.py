"""The Explorer, driven headless: every control reachable, invalid combinations explained, run, pin, compare, export."""

import subprocess
import sys

from _helpers import extra

from toolkit.models import ModelConfig
from toolkit.notebook.widgets import Explorer


def test_every_control_is_reachable_and_maps_to_the_scenario():
    ex = Explorer()
    assert set(ex.controls) >= {
        "block",
        "n_layers",
        "dim",
        "n_experts",
        "top_k",
        "experts_impl",
        "ac_mode",
        "layer_every",
        "submodule_ac",
        "memory_budget",
        "scope",
        "backend",
        "fullgraph",
        "order",
        "method",
        "capture_scalar_outputs",
        "capture_dynamic_output_shape_ops",
        "recipe",
    }
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
    ex.controls["ac_mode"].value, ex.controls["scope"].value, ex.controls["order"].value = (
        "full",
        "attention",
        "compile_outside",
    )
    assert ex.run_button.disabled and "CompileConfig.order" in ex.status.value  # known from the structure, not run
    assert ex.run() is None
    ex.controls["order"].value, ex.controls["scope"].value = "auto", "blocks"
    ex.controls["method"].value = "torch_compile"  # each block replaced by its torch.compile wrapper
    assert not ex.run_button.disabled and ex.scenario.compile.method == "torch_compile"
    ex.controls["scope"].value = "model"  # the wrapper cannot replace the model in place
    assert ex.run_button.disabled and "CompileConfig.method" in ex.status.value


def test_run_pin_compare_and_export(tmp_path):
    ex = Explorer()
    ex.controls["n_layers"].value = 2
    r1 = ex.run()
    assert r1.ok and ex.report is r1 and "saved for backward" in ex.summary.value
    # The status line carries the classification, and says what "works" meant for this (eager) run.
    assert ex.stage_text == "done: works — ran eagerly (no compile requested), gradients match eager"
    # Figures went into the Output widget's state as plotly bundles (not displayed as a side effect).
    assert len(ex.figures.outputs) >= 3
    for out in ex.figures.outputs:
        fig = out["data"]["application/vnd.plotly.v1+json"]
        assert (
            fig["data"] and fig["data"][0]["type"] == "bar" and out["data"]["text/plain"].startswith("<plotly figure")
        )
    ex.pin()
    ex.controls["ac_mode"].value = "full"
    assert ex.run().ok
    ex.pin()
    text = ex.compare()
    assert "layers.0.moe.routed_experts" in text and "A = #1" in ex.comparison.value
    # ... and as figures: the two runs side by side, saved by module and memory, differences written in colour.
    (out,) = ex.comparison_figures.outputs
    fig = out["data"]["application/vnd.plotly.v1+json"]
    assert [t["name"] for t in fig["data"]] == ["A", "A", "B", "B"] and "A vs B" in out["data"]["text/plain"]
    assert "layers.0.moe.routed_experts" in fig["data"][0]["x"]
    assert any(a["text"].startswith("−") for a in fig["layout"]["annotations"])  # full AC saves less than no AC
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


def test_not_set_choices_show_a_label_not_a_blank():
    """ipywidgets selects nothing for an option whose value is None: the defaults carry sentinel strings instead."""
    ex = Explorer()
    for name, label in (("order", "as the scope implies"), ("recipe", "(none: use the controls)")):
        w = ex.controls[name]
        assert w.index == 0 and w.label == label and w.value is not None
    assert ex.scenario.compile.order is None and ex.scenario.recipe is None
    ex.controls["order"].value = "ac_outside"
    ex.controls["order"].value = "auto"
    assert ex.scenario.compile.order is None


def test_mode_options_reach_only_their_mode():
    ex = Explorer()
    c = ex.controls
    c["n_layers"].value = 4  # every 3rd of 4 blocks (the default 2 blocks have no 3rd to checkpoint)
    c["ac_mode"].value, c["layer_every"].value = "selective_layer", 3
    assert ex.scenario.ac.layer_every == 3
    c["ac_mode"].value = "full"  # the slider keeps 3, but full AC must not be handed layer_every
    assert not hasattr(ex.scenario.ac, "layer_every") and not ex.run_button.disabled  # full AC's config has none


def test_status_line_names_a_silent_failure_and_the_break_table_only_when_needed():
    ex = Explorer()
    c = ex.controls
    c["n_layers"].value, c["ac_mode"].value, c["scope"].value = 2, "full", "blocks"
    c["experts_impl"].value = "for_loop"  # .tolist() inside the checkpointed block: a graph break
    r = ex.run()
    assert r.ok  # the step ran ...
    # ... but it is no success: C2, compile silently fell back to eager.
    assert ex.stage_text.startswith(
        "done: fell_back_to_eager [silent failure] — compile requested, but layers.0, "
        "layers.1 ran eagerly (0 graphs); known case C2"
    )
    assert "#b30000" in ex.stage.value and "<th>where</th>" in ex.breaks.value
    c["fullgraph"].value = True
    ex.run()
    assert ex.stage_text.startswith("done: works — ran compiled as requested (1 graph, no graph break)")
    assert "<table>" not in ex.breaks.value and ex.breaks.value.startswith("<b>1 graphs, 0 graph breaks")


def test_references_from_earlier_runs_classify_selective_ac(monkeypatch):
    """A selective run is compared with the same setup's earlier runs without AC and with full AC (what
    sac_not_applied and ac_saves_nothing need); the Explorer never runs them itself."""
    import toolkit.notebook.widgets as widgets

    seen = []
    real = widgets.classify
    monkeypatch.setattr(widgets, "classify", lambda report, refs: seen.append(dict(refs)) or real(report, refs))
    ex = Explorer()
    c = ex.controls
    c["n_layers"].value, c["block"].value = 2, "dense"
    c["ac_mode"].value = "selective_op"
    ex.run()
    for mode in ("none", "full", "selective_op"):
        c["ac_mode"].value = mode
        ex.run()
    assert [set(refs) for refs in seen] == [set(), set(), {"none"}, {"none", "full"}]
    assert seen[-1]["none"].scenario.ac_mode == "none" and seen[-1]["full"].scenario.ac_mode == "full"
    assert ex.classification.label == "works"


def test_explorer_runs_torchtitans_own_model_and_fsdp2():
    """The 'model from' control switches to torchtitan's own model and transforms (offered only when torchtitan is
    installed); the toolkit-only controls are then disabled, and FSDP2 is a control of its own for either model."""
    from toolkit.stacks import torchtitan as titan

    ex = Explorer()
    c = ex.controls
    keys = [key for _, key in c["stack"].options if not key.startswith("hf:")]  # transformers': its own test
    if not titan.available():
        assert keys == ["toolkit"]
        extra("torchtitan")  # skips, saying how to install it
    assert keys == ["toolkit", "titan:qwen3_moe", "titan:deepseek_v3"]
    c["stack"].value = "titan:qwen3_moe"
    c["n_layers"].value, c["ac_mode"].value = 2, "selective_op"
    c["scope"].value, c["fullgraph"].value, c["fsdp"].value = "blocks", True, "blocks"
    assert c["experts_impl"].disabled and c["recipe"].disabled and not c["ac_mode"].disabled
    sc = ex.scenario
    assert sc.stack == "torchtitan" and sc.torchtitan.family == "qwen3_moe" and sc.fsdp == "blocks"
    r = ex.run()
    assert r.ok and r.numerics.grads_match and r.compile.graphs == 1
    assert ex.stage_text.startswith("done: works") and "torchtitan qwen3_moe" in ex.summary.value
    # What torchtitan's compile cannot take is refused before anything runs, naming the field.
    c["fullgraph"].value = False
    assert ex.scenario is None and ex.run_button.disabled and "Scenario.compile" in ex.status.value
    # The toolkit's model with real FSDP2 on its experts too.
    c["stack"].value, c["fullgraph"].value, c["scope"].value, c["fsdp"].value = (
        "toolkit",
        False,
        "none",
        "blocks+experts",
    )
    assert not c["experts_impl"].disabled and ex.scenario.fsdp == "blocks+experts" and ex.scenario.stack == "toolkit"


def test_a_recipe_gets_the_same_model_in_the_explorer_as_in_the_matrix():
    """One owner for what a recipe needs of the model (`Recipe.model_config`): the 2025 layout, grouped_mm experts
    in bfloat16, and PR #2052's stand-in FSDP hook only where real FSDP2 does not put its own there (the Explorer
    used to install both)."""
    from toolkit.analysis.cells import Cell

    ex = Explorer()
    c = ex.controls
    c["n_layers"].value, c["dim"].value = 2, 64
    for recipe, impl, fsdp in (
        ("torchtitan_2025_09", "for_loop", "none"),
        ("torchtitan_2025_09", "for_loop", "blocks"),
        ("torchtitan_2025_12", "grouped_mm", "none"),
        ("torchtitan_0_3_0", "masked", "none"),
    ):
        c["experts_impl"].value, c["recipe"].value, c["fsdp"].value = impl, recipe, fsdp
        model = ex.build_scenario().model
        cell = Cell(f"moe:{impl}", recipe=recipe, fsdp=fsdp).model_config()
        assert (model.layout, model.dtype, model.experts_graph_break) == (
            cell.layout,
            cell.dtype,
            cell.experts_graph_break,
        ), (recipe, impl, fsdp)
    c["experts_impl"].value, c["recipe"].value, c["fsdp"].value = "for_loop", "torchtitan_2025_09", "blocks"
    assert ex.build_scenario().model.experts_graph_break is False  # FSDP2's own hook, not the stand-in too
    c["fsdp"].value = "none"
    assert ex.build_scenario().model.experts_graph_break is True


def test_the_scenario_estimated_at_a_full_size_the_user_picks():
    """The button estimates the controls' scenario with the picked layer of `tk.estimation.LAYER_SHAPES` on fake
    tensors: under full AC a Qwen3-30B-A3B layer keeps the final norm's tensors and the block's input, the sizes its
    shape gives."""
    import toolkit as tk
    from toolkit.estimation import CUDA_BLOCK

    ex = Explorer()
    assert list(ex.full_size.options) == list(tk.estimation.LAYER_SHAPES)
    ex.controls["ac_mode"].value, ex.full_size.value = "full", "qwen3_30b_a3b_layer"
    ex.estimate_button.click()
    est, cfg = ex.estimate_result, tk.estimation.LAYER_SHAPES["qwen3_30b_a3b_layer"]
    T, D = cfg.batch * cfg.seq_len, cfg.dim
    ids = -(-(T + 1) * 8 // CUDA_BLOCK) * CUDA_BLOCK  # the token ids: a view of the batch's S + 1 int64 ids
    assert est.saved_by_module == {"norm": T * D * (4 + 4 + 2) + T * 4, "tok_embeddings": T * D * 2 + ids}
    assert est.scenario["name"] == "qwen3_30b_a3b_layer" and "estimate qwen3_30b_a3b_layer" in ex.estimated.value
    # What the estimate cannot follow is said in the widget, not raised: a 2025 recipe's graph-breaking compile.
    ex.controls["recipe"].value = "torchtitan_2025_12"
    assert ex.estimate() is None and ex.estimate_result is None
    assert "cannot estimate: estimate.recipe" in ex.estimated.value and not ex.estimate_button.disabled


def test_will_it_fit_plans_the_full_size_layer_at_n_ranks(monkeypatch):
    """The panel plans the picked layer for one rank of N under FSDP2: the setups on the controls' backend (three of
    them here, for time), the pick and its table in the widget; a budget that is not a size is said in the widget,
    not raised."""
    from toolkit.analysis import plan
    from toolkit.notebook import widgets

    asked = []

    def three(backends):
        asked.append(backends)
        return tuple(s for s in plan.candidates(backends) if s.scope != "model")[:3]

    monkeypatch.setattr(widgets, "candidates", three)
    ex = Explorer()
    ex.full_size.value, ex.world_size.value, ex.budget.value = "qwen3_30b_a3b_layer", 8, "1TiB"
    ex.plan_button.click()
    result = ex.plan_result
    assert result.world_size == 8 and result.pick is not None and result.budget_bytes == 2**40
    assert asked == [("aot_eager",)] and len(result.rows) == 3
    assert "plan: use" in ex.planned.value and not ex.plan_button.disabled
    pick = next(r for r in result.rows if r.setup == result.pick)
    assert pick.status == "fits" and pick.per_rank_bytes <= 2**40
    ex.budget.value = "a lot"
    assert ex.plan() is None and ex.plan_result is None and "cannot plan: plan.budget" in ex.planned.value


def test_the_status_line_says_what_run_would_run_and_what_the_last_run_was():
    """Issue 42: the "ready:" line went stale after a run. It now names the controls' scenario and the last run."""
    ex = Explorer()
    assert ex.build_scenario().model_config == ModelConfig()  # the default the quickstart's prose describes
    ex.controls["ac_mode"].value = "full"
    label = ex.scenario.label
    assert ex.status.value == f"ready: {label}"
    ex.run()
    assert ex.status.value == f"ready: {label}<br>last run: {label} → works"
    ex.controls["ac_mode"].value = "selective_op"
    assert ex.status.value == f"ready: {ex.scenario.label}<br>last run: {label} → works"
    assert ex.scenario.label != label and "selective_op" in ex.scenario.label
    ex.controls["top_k"].value = 8  # not runnable: said, and the last run is still named
    assert "not runnable" in ex.status.value and ex.status.value.endswith(f"<br>last run: {label} → works")
