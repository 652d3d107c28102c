"""Recipes reproduce torchtitan's AC + compile over time: PR #2052's failure, its fixes, per-block compile.

Recipes reproduce torchtitan's AC + compile over time: PR #2052's failure, its fixes, and today's per-block compile.
"""

import pytest
import torch
from _helpers import grads, graph_count, state_diff

import toolkit as tk
from toolkit import ModelConfig

BREAKING = ModelConfig(experts_graph_break=True)


def _check_grads_match_eager(cfg, model):
    batch = tk.make_batch(cfg)
    ref = tk.build_model(cfg)
    ref_loss = tk.train_step(ref, batch)
    loss = tk.train_step(model, batch)
    torch.testing.assert_close(loss, ref_loss)
    g, gr = grads(model), grads(ref)
    for k in gr:
        torch.testing.assert_close(g[k], gr[k], rtol=1e-4, atol=1e-6)


def test_2025_09_recipe_fails_like_pr_2052():
    model = tk.transforms.apply_recipe(tk.build_model(BREAKING), "torchtitan_2025_09")
    rec = tk.transforms.applied(model)
    # The isinstance test missed the wrapped MoE, so the whole moe went to the fullgraph branch.
    assert "layers.0.moe" in rec.compiled and "layers.0.moe.router" not in rec.compiled
    assert rec.ac_wrapped == ["layers.0.moe", "layers.0.attention", "layers.1.moe", "layers.1.attention"]
    with pytest.raises(torch._dynamo.exc.Unsupported) as e:
        tk.train_step(model, tk.make_batch(BREAKING))
    msg = str(e.value)
    assert "torch.compiler.disable" in msg and "torch.utils.checkpoint.checkpoint" in msg


def test_2025_09_recipe_runs_when_experts_do_not_break():
    """Without the FSDP-like hook the fullgraph compile of the wrapped MoE works in torch 2.13 (wrong scope, no
    error)."""
    cfg = ModelConfig()
    model = tk.transforms.apply_recipe(tk.build_model(cfg), "torchtitan_2025_09")
    _check_grads_match_eager(cfg, model)
    assert graph_count() >= 1


def test_see_through_fix_compiles_router_and_leaves_experts_eager():
    model = tk.transforms.apply_recipe(tk.build_model(BREAKING), "torchtitan_2025_09_see_through")
    rec = tk.transforms.applied(model)
    assert {"layers.0.moe.router", "layers.0.moe.shared_experts"} <= set(rec.compiled)
    assert not any(t.endswith("experts") and not t.endswith("shared_experts") for t in rec.compiled)
    assert rec.compile_orders["layers.0.moe.router"] == "AC(compile(x))"
    _check_grads_match_eager(BREAKING, model)


def test_2025_12_recipe_runs_on_breaking_experts():
    model = tk.transforms.apply_recipe(tk.build_model(BREAKING), "torchtitan_2025_12")
    rec = tk.transforms.applied(model)
    assert rec.ac_wrapped == ["layers.0", "layers.1"] and "layers.0.moe.router" in rec.compiled
    assert set(rec.compile_orders.values()) == {"AC(compile(x))"}
    _check_grads_match_eager(BREAKING, model)


def test_today_recipe_compiles_each_block_whole():
    cfg = ModelConfig()
    model = tk.transforms.apply_recipe(tk.build_model(cfg), "torchtitan_0_3_0")
    rec = tk.transforms.applied(model)
    assert rec.recipe == "torchtitan_0_3_0" and rec.compiled == ["layers.0", "layers.1"]
    assert rec.compile.fullgraph and rec.compile_orders == {"layers.0": "compile(AC(x))", "layers.1": "compile(AC(x))"}
    assert rec.disable_lru_cache and rec.dynamo_config["capture_scalar_outputs"]
    _check_grads_match_eager(cfg, model)
    assert graph_count() >= 1


def test_today_recipe_still_fails_if_the_experts_break():
    """Today's recipe relies on FSDP2 no longer hooking the experts (PR #2281)."""
    model = tk.transforms.apply_recipe(tk.build_model(BREAKING), "torchtitan_0_3_0")
    with pytest.raises(torch._dynamo.exc.Unsupported):
        tk.train_step(model, tk.make_batch(BREAKING))


@pytest.mark.parametrize("name", list(tk.transforms.RECIPES))
def test_reset_undoes_a_recipe(name):
    model = tk.build_model(ModelConfig())
    before = [n for n, _ in model.named_modules()]
    state = tk.transforms.global_state()
    tk.transforms.apply_recipe(model, name)
    with pytest.raises(RuntimeError, match="reset"):
        tk.transforms.apply_recipe(model, name)
    tk.transforms.reset(model)
    assert [n for n, _ in model.named_modules()] == before
    assert tk.transforms.global_state() == state, state_diff(state, tk.transforms.global_state())
    assert tk.transforms.RECIPES[name].apply.__doc__ or name.endswith(("see_through", "full_ac"))


def test_unknown_recipe_names_the_field():
    with pytest.raises(tk.ConfigError, match="recipe.name.*torchtitan_0_3_0"):
        tk.transforms.apply_recipe(tk.build_model(ModelConfig()), "torchtitan_2024")
