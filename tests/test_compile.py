"""apply_compile: scopes, names, order relative to AC, silent fallback (C2), grouped_mm, idempotence, global state."""

import pytest
import torch
from _helpers import break_count, grads, graph_count, state_diff
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

import toolkit as tk
from toolkit import ACConfig, CompileConfig, ConfigError, compat

SCOPES = [
    "model",
    "blocks",
    "attention",
    "moe",
    "experts",
    "router",
    "shared_experts",
    "feed_forward",
    ("layers.1.moe.router", "layers.0.attention"),
]


@pytest.mark.parametrize("method", ["module_compile", "torch_compile"])
@pytest.mark.parametrize("ac_mode", ["none", "full", "per_submodule"])
def test_names_stay_canonical_under_every_scope(moe_cfg, ac_mode, method):
    cfg = moe_cfg.replace(n_layers=2, moe_layers=2)  # layer 0 dense, layer 1 MoE
    ref = [n for n, _ in tk.transforms.named_modules(tk.build_model(cfg))]
    for scope in SCOPES:
        if method == "torch_compile" and scope == "model":
            continue
        model = tk.build_model(cfg)
        tk.transforms.prepare(model, ac=ACConfig.of(mode=ac_mode), compile=CompileConfig(scope=scope, method=method))
        assert [n for n, _ in tk.transforms.named_modules(model)] == ref, scope
        assert tk.transforms.get_module(model, "layers.1.moe.router.gate") is tk.transforms.unwrap(model).layers[
            "1"
        ].moe.router.gate or isinstance(tk.transforms.get_module(model, "layers.1.moe.router.gate"), torch.nn.Linear)
        tk.transforms.reset(model, dynamo=False)
        assert [n for n, _ in model.named_modules()] == [n for n, _ in tk.build_model(cfg).named_modules()]


def test_isinstance_sees_through_wrappers_via_unwrap(moe_cfg):
    model = tk.transforms.prepare(
        tk.build_model(moe_cfg),
        ac=ACConfig.of(mode="per_submodule"),
        compile=CompileConfig(scope="moe", method="torch_compile", order="compile_outside"),
    )
    block = model.layers["0"]
    assert not isinstance(block.moe, tk.models.MoE)  # what torchtitan's #1895 check saw
    assert isinstance(tk.transforms.unwrap(block.moe), tk.models.MoE)
    assert tk.transforms.naming.wrapper_chain(block.moe) == ["OptimizedModule", "CheckpointWrapper"]


@pytest.mark.parametrize(
    "ac, compile",
    [
        (ACConfig.of(mode="none"), CompileConfig(scope="blocks", fullgraph=True)),
        (ACConfig.of(mode="full"), CompileConfig(scope="blocks", fullgraph=True)),
        (ACConfig.of(mode="selective_op"), CompileConfig(scope="blocks", fullgraph=True)),
        (ACConfig.of(mode="full"), CompileConfig(scope="attention")),
        (ACConfig.of(mode="full"), CompileConfig(scope="blocks", order="ac_outside", capture_scalar_outputs=True)),
        (ACConfig.of(mode="memory_budget", memory_budget=0.0), CompileConfig(scope="blocks", fullgraph=True)),
        (ACConfig.of(mode="full"), CompileConfig(scope="blocks", fullgraph=True, backend="aot_eager_decomp_partition")),
    ],
    ids=[
        "none-blocks",
        "full-blocks",
        "sac-blocks",
        "full-attention",
        "full-ac_outside",
        "budget0-blocks",
        "full-decomp_partition",
    ],
)
def test_compiled_gradients_match_eager(moe_cfg, ac, compile):
    batch = tk.make_batch(moe_cfg)
    ref = tk.build_model(moe_cfg)
    ref_loss = tk.train_step(ref, batch)
    model = tk.transforms.prepare(tk.build_model(moe_cfg), ac=ac, compile=compile)
    loss = tk.train_step(model, batch)
    assert graph_count() >= 1
    torch.testing.assert_close(loss, ref_loss)
    g, gr = grads(model), grads(ref)
    for k in gr:
        torch.testing.assert_close(g[k], gr[k], rtol=1e-4, atol=1e-6)


def test_graph_break_inside_checkpointed_block_silently_disables_compile(moe_cfg):
    """C2 / pytorch#139989: for_loop experts call `.tolist()`; compile(AC(block)) with fullgraph=False runs eagerly."""
    moe_cfg = moe_cfg.replace(experts_impl="for_loop")
    batch = tk.make_batch(moe_cfg)
    model = tk.transforms.prepare(
        tk.build_model(moe_cfg), ac=ACConfig.of(mode="full"), compile=CompileConfig(scope="blocks")
    )
    tk.train_step(model, batch)
    assert graph_count() == 0 and break_count() >= 1
    assert tk.transforms.applied(model).compile_orders == {"layers.0": "compile(AC(x))", "layers.1": "compile(AC(x))"}

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    no_ac = tk.transforms.prepare(tk.build_model(moe_cfg), compile=CompileConfig(scope="blocks"))
    tk.train_step(no_ac, batch)
    assert graph_count() >= 2 and break_count() >= 1  # without AC the break only splits the graph

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    full = tk.transforms.prepare(
        tk.build_model(moe_cfg), ac=ACConfig.of(mode="full"), compile=CompileConfig(scope="blocks", fullgraph=True)
    )
    tk.train_step(full, batch)
    assert graph_count() >= 1 and break_count() == 0  # fullgraph=True captures .tolist() in torch 2.13


def test_capture_scalar_outputs_is_scoped_to_the_step(moe_cfg):
    model = tk.transforms.prepare(
        tk.build_model(moe_cfg),
        ac=ACConfig.of(mode="full"),
        compile=CompileConfig(scope="blocks", capture_scalar_outputs=True),
    )
    assert torch._dynamo.config.capture_scalar_outputs is False
    tk.train_step(model, tk.make_batch(moe_cfg))
    assert graph_count() >= 1 and torch._dynamo.config.capture_scalar_outputs is False


def test_order_is_explicit(moe_cfg):
    # A scope inside a checkpointed block can only be AC(compile(x)).
    with pytest.raises(ConfigError, match="CompileConfig.order") as e:
        tk.transforms.prepare(
            tk.build_model(moe_cfg),
            ac=ACConfig.of(mode="full"),
            compile=CompileConfig(scope="attention", order="compile_outside"),
        )
    assert "ac_outside" in str(e.value)
    # The model contains the checkpointed blocks: only compile(AC(x)).
    with pytest.raises(ConfigError, match="CompileConfig.order"):
        tk.transforms.prepare(
            tk.build_model(moe_cfg),
            ac=ACConfig.of(mode="full"),
            compile=CompileConfig(scope="model", order="ac_outside"),
        )
    inside = tk.transforms.prepare(
        tk.build_model(moe_cfg), ac=ACConfig.of(mode="full"), compile=CompileConfig(scope="attention")
    )
    assert set(tk.transforms.applied(inside).compile_orders.values()) == {"AC(compile(x))"}
    # Where the target is the checkpointed module itself, `order` picks which of the two is compiled.
    outside = tk.transforms.prepare(
        tk.build_model(moe_cfg), ac=ACConfig.of(mode="full"), compile=CompileConfig(scope="blocks")
    )
    assert outside.layers["0"]._compiled_call_impl is not None
    ac_out = tk.transforms.prepare(
        tk.build_model(moe_cfg), ac=ACConfig.of(mode="full"), compile=CompileConfig(scope="blocks", order="ac_outside")
    )
    assert isinstance(ac_out.layers["0"], CheckpointWrapper) and ac_out.layers["0"]._compiled_call_impl is None
    assert ac_out.layers["0"]._checkpoint_wrapped_module._compiled_call_impl is not None
    assert set(tk.transforms.applied(ac_out).compile_orders.values()) == {"AC(compile(x))"}
    with pytest.raises(RuntimeError, match="apply_ac must run before apply_compile"):
        tk.apply_ac(tk.apply_compile(tk.build_model(moe_cfg), CompileConfig(scope="blocks")), ACConfig.of(mode="full"))


def test_ac_outside_reruns_the_compiled_forward_in_backward(dense_cfg):
    calls = {"fw": 0}

    def counting_backend(gm, example_inputs):
        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd

        def fw(g, _):
            def run(*args):
                calls["fw"] += 1
                return g(*args)

            return make_boxed_func(run)

        return aot_autograd(fw_compiler=fw, bw_compiler=lambda g, _: make_boxed_func(g))(gm, example_inputs)

    model = tk.transforms.prepare(
        tk.build_model(dense_cfg),
        ac=ACConfig.of(mode="full"),
        compile=CompileConfig(scope="blocks", backend=counting_backend, order="ac_outside", fullgraph=True),
    )
    tk.train_step(model, tk.make_batch(dense_cfg))
    assert calls["fw"] == 2 * dense_cfg.n_layers  # forward + recompute for each block
    calls["fw"] = 0
    torch._dynamo.reset()
    model = tk.transforms.prepare(
        tk.build_model(dense_cfg),
        ac=ACConfig.of(mode="full"),
        compile=CompileConfig(scope="blocks", backend=counting_backend, order="compile_outside", fullgraph=True),
    )
    tk.train_step(model, tk.make_batch(dense_cfg))
    assert calls["fw"] == dense_cfg.n_layers  # the checkpoint is inside the graph: no second compiled forward


def _torch_compiles_fp32_grouped_mm() -> bool:
    """Truth from torch alone: does compile (aot_eager, fullgraph) of a float32 `_grouped_mm` run on this release?"""
    x, w, offs = torch.randn(16, 16), torch.randn(2, 16, 16), torch.tensor([8, 16], dtype=torch.int32)
    try:
        torch.compile(lambda x, w: torch._grouped_mm(x, w, offs=offs), backend="aot_eager", fullgraph=True)(x, w)
    except Exception:  # noqa: BLE001 - the failure is the answer
        return False
    finally:
        torch._dynamo.reset()
    return True


@pytest.mark.per_release  # what torch's meta kernel accepts is the release's own
def test_grouped_mm_fp32_under_compile_on_cpu_is_refused_bf16_works():
    """C14: the 2025 layout runs `_grouped_mm` in the model's dtype, which compile refuses in float32 on CPU on torch
    2.13 and 2.14 (2.15's meta kernel accepts float32: the toolkit then compiles it); torchtitan 0.3.0 (and the
    default layout) cast to bfloat16 inside the experts, so a float32 model compiles."""
    cfg = tk.ModelConfig(experts_impl="grouped_mm", layout="torchtitan_2025")
    if _torch_compiles_fp32_grouped_mm():
        assert compat.grouped_mm_traces_in("float32")
        batch = tk.make_batch(cfg)
        ref_loss = tk.train_step(tk.build_model(cfg), batch)
        model = tk.apply_compile(tk.build_model(cfg), CompileConfig(scope="blocks"))
        torch.testing.assert_close(tk.train_step(model, batch), ref_loss, rtol=1e-5, atol=1e-5)
        assert graph_count() >= 1
        torch._dynamo.reset()
    else:
        assert not compat.grouped_mm_traces_in("float32")
        with pytest.raises(ConfigError, match="CompileConfig.scope") as e:
            tk.apply_compile(tk.build_model(cfg), CompileConfig(scope="blocks"))
        assert "bfloat16" in str(e.value) and "layers.0.moe.experts" in str(e.value)
    # A scope that leaves the experts eager is fine.
    tk.apply_compile(tk.build_model(cfg), CompileConfig(scope="attention"))
    fp32 = tk.ModelConfig()
    batch = tk.make_batch(fp32)
    ref_loss = tk.train_step(tk.build_model(fp32), batch)
    compiled = tk.apply_compile(tk.build_model(fp32), CompileConfig(scope="experts", fullgraph=True))
    torch.testing.assert_close(tk.train_step(compiled, batch), ref_loss, rtol=1e-5, atol=1e-5)
    assert tk.transforms.applied(compiled).compiled == ["layers.0.moe.routed_experts", "layers.1.moe.routed_experts"]
    torch._dynamo.reset()
    bf16 = cfg.replace(dtype="bfloat16")
    ref = tk.build_model(bf16)
    batch = tk.make_batch(bf16)
    ref_loss = tk.train_step(ref, batch)
    model = tk.apply_compile(tk.build_model(bf16), CompileConfig(scope="experts", fullgraph=True))
    loss = tk.train_step(model, batch)
    assert graph_count() >= 1
    torch.testing.assert_close(loss, ref_loss, rtol=1e-2, atol=1e-2)


def test_memory_budget_is_live_while_compiling(moe_cfg):
    seen = []

    def backend(gm, example_inputs):
        seen.append(torch._functorch.config.activation_memory_budget)
        return gm.forward

    model = tk.transforms.prepare(
        tk.build_model(moe_cfg.replace(experts_impl="masked")),
        ac=ACConfig.of(mode="memory_budget", memory_budget=0.25),
        compile=CompileConfig(scope="blocks", backend=backend, fullgraph=True),
    )
    tk.train_step(model, tk.make_batch(moe_cfg))
    assert seen and set(seen) == {0.25}
    assert torch._functorch.config.activation_memory_budget == 1.0


def test_compile_twice_is_refused_and_remove_restores(moe_cfg):
    model = tk.apply_compile(tk.build_model(moe_cfg), CompileConfig(scope="blocks"))
    with pytest.raises(RuntimeError, match="already compiled"):
        tk.apply_compile(model, CompileConfig(scope="attention"))
    tk.transforms.remove_compile(model)
    assert all(getattr(m, "_compiled_call_impl", None) is None for m in model.modules())
    tk.apply_compile(model, CompileConfig(scope="attention", method="torch_compile"))
    tk.transforms.remove_compile(model)
    assert [n for n, _ in model.named_modules()] == [n for n, _ in tk.build_model(moe_cfg).named_modules()]
    user = tk.build_model(moe_cfg)
    user.layers["0"].compile()
    with pytest.raises(RuntimeError, match="already compiled"):
        tk.apply_compile(user, CompileConfig(scope="blocks"))


def test_global_state_is_identical_after_apply_step_and_reset(moe_cfg):
    before = tk.transforms.global_state()
    model = tk.build_model(moe_cfg)
    tk.transforms.prepare(
        model,
        ac=ACConfig.of(mode="memory_budget", memory_budget=0.5),
        compile=CompileConfig(
            scope="blocks",
            fullgraph=True,
            capture_scalar_outputs=True,
            capture_dynamic_output_shape_ops=True,
            skip_fwd_side_effects_in_bwd_under_checkpoint=True,
        ),
    )
    tk.train_step(model, tk.make_batch(moe_cfg))
    assert graph_count() >= 1
    tk.transforms.reset(model)
    after = tk.transforms.global_state()
    assert after == before


def test_torch_settings_restores_on_error(moe_cfg):
    before = tk.transforms.global_state()
    model = tk.transforms.prepare(
        tk.build_model(moe_cfg),
        ac=ACConfig.of(mode="full"),
        compile=CompileConfig(scope="blocks", capture_scalar_outputs=True),
    )
    with pytest.raises(ZeroDivisionError):
        with tk.transforms.torch_settings(model):
            assert torch._dynamo.config.capture_scalar_outputs is True
            1 / 0
    assert tk.transforms.global_state() == before, state_diff(before, tk.transforms.global_state())


@pytest.mark.parametrize(
    "kwargs, field, words",
    [
        (dict(scope="everything"), "scope", "not one of"),
        (dict(scope=()), "scope", "non-empty"),
        (dict(backend="tensorrt"), "backend", "not one of"),
        (dict(inductor_options={"max_autotune": True}), "inductor_options", "only apply to the inductor"),
        (dict(order="inside"), "order", "not one of"),
        (dict(dynamic="yes"), "dynamic", "None/True/False"),
        (dict(fullgraph=1), "fullgraph", "not a bool"),
    ],
)
def test_compile_config_validation_names_the_field(kwargs, field, words):
    with pytest.raises(ConfigError) as e:
        CompileConfig(**kwargs)
    assert e.value.field == field and f"CompileConfig.{field}" in str(e.value) and words in str(e.value)


def test_scope_errors_name_the_field(moe_cfg, dense_cfg):
    with pytest.raises(ConfigError, match="CompileConfig.scope.*matches no module"):
        tk.apply_compile(tk.build_model(dense_cfg), CompileConfig(scope="moe"))
    with pytest.raises(ConfigError, match="CompileConfig.scope.*matches no module"):
        tk.apply_compile(tk.build_model(moe_cfg), CompileConfig(scope="feed_forward"))
    with pytest.raises(ConfigError, match="no module named 'layers.0.moe.routr'"):
        tk.apply_compile(tk.build_model(moe_cfg), CompileConfig(scope=("layers.0.moe.routr",)))
    with pytest.raises(ConfigError, match="CompileConfig.method"):
        tk.apply_compile(tk.build_model(moe_cfg), CompileConfig(scope="model", method="torch_compile"))
    with pytest.raises(ConfigError, match="ACConfig.wrap_inductor_compiled_regions"):
        tk.transforms.prepare(
            tk.build_model(moe_cfg),
            ac=ACConfig.of(mode="selective_op", wrap_inductor_compiled_regions=True),
            compile=CompileConfig(scope="attention", backend="aot_eager"),
        )


def test_compile_config_json_round_trip():
    cfg = CompileConfig(
        scope=("layers.0.moe",),
        backend="inductor",
        fullgraph=True,
        order="ac_outside",
        inductor_options={"wrap_inductor_compiled_regions": True},
    )
    assert CompileConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.inductor
def test_inductor_compiles_a_checkpointed_dense_block(dense_cfg):
    batch = tk.make_batch(dense_cfg)
    ref = tk.build_model(dense_cfg)
    tk.train_step(ref, batch)
    model = tk.transforms.prepare(
        tk.build_model(dense_cfg),
        ac=ACConfig.of(mode="selective_op"),
        compile=CompileConfig(scope="blocks", backend="inductor", fullgraph=True),
    )
    tk.train_step(model, batch)
    assert graph_count() == 1  # both blocks share one graph
    g, gr = grads(model), grads(ref)
    for k in gr:
        torch.testing.assert_close(g[k], gr[k], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("ac", ["none", "full"])
def test_the_instrument_compiles_none_of_its_own_code_into_the_models_counts(ac):
    """A model compiled whole whose blocks graph-break runs them eagerly under Dynamo's frame callback; autograd then
    calls the probes' pack hook there, and Dynamo compiled what the hook calls (`is_real`): the Report counted 2 more
    graphs and a recompile on a Parameter than the model had. Checked against Dynamo's own counters in a bare run."""
    s = tk.Scenario(
        model=tk.ModelConfig(experts_impl="for_loop"),
        ac=tk.ACConfig.of(mode=ac),
        compile=tk.CompileConfig(scope="model"),
        steady_steps=0,
        check_numerics=False,
        measure_memory=False,
    )
    probed, bare = tk.run(s), tk.run(s.replace(instrument=False))
    assert (probed.compile.graphs, probed.compile.graph_breaks) == (bare.compile.graphs, bare.compile.graph_breaks)
    assert not any("is_real" in r or "probes" in r for r in probed.compile.recompiles), probed.compile.recompiles


def test_a_target_inside_another_is_inlined_and_the_report_says_so(moe_cfg):
    """C76: `layers.0.moe` compiled inside compiled `layers.0` never compiles on its own: Dynamo's own counter sees
    one graph for the pair, as the Report says, and its warning names the inner target. Side by side targets do not
    warn."""
    nested = CompileConfig(scope=("layers.0", "layers.0.moe"))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    with pytest.warns(UserWarning, match=r"layers\.0\.moe lies inside another compiled target.*C76"):
        model = tk.transforms.prepare(tk.build_model(moe_cfg), compile=nested)
    tk.train_step(model, tk.make_batch(moe_cfg))
    assert graph_count() == 1 and break_count() == 0
    report = tk.run(tk.Scenario(model=moe_cfg, compile=nested, steady_steps=0))
    assert report.ok and report.numerics.grads_match and report.verdict == "ok"
    assert report.compile.graphs == 1 and not report.compile.regions_without_graphs
    (warning,) = [w for w in report.warnings if "inside another compiled target" in w]
    assert "'layers.0'" not in warning and "layers.0.moe" in warning
    apart = tk.run(
        tk.Scenario(model=moe_cfg, compile=CompileConfig(scope=("layers.0.moe", "layers.1.attention")), steady_steps=0)
    )
    assert apart.ok and not [w for w in apart.warnings if "inside another compiled target" in w]
