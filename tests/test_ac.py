"""apply_ac: names, exact gradients, the recompute FLOP ladder, torchtitan's per-op policy, validation.

apply_ac: names, exact gradients, the exact FLOP recompute ladder, torchtitan's per-op policy op by op, validation.
"""

import inspect
import json

import pytest
import torch
from _helpers import extra, grads
from _truth import Truth, host_copies
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.utils.checkpoint import CheckpointPolicy
from torch.utils.flop_counter import FlopCounterMode, flop_registry

import toolkit as tk
from toolkit import ACConfig, ConfigError, compat

aten = torch.ops.aten

EAGER_MODES = [
    ACConfig.of(mode="none"),
    ACConfig.of(mode="full"),
    ACConfig.of(mode="selective_op"),
    ACConfig.of(mode="selective_layer", layer_every=2),
    ACConfig.of(mode="per_submodule", submodule_ac="selective"),
    ACConfig.of(mode="per_submodule", submodule_ac="full"),
    ACConfig.of(mode="custom", save_ops=(aten.mm.default,)),
    ACConfig.of(mode="custom", policy=lambda ctx, func, *a, **k: CheckpointPolicy.PREFER_RECOMPUTE),
    ACConfig.of(mode="full", preserve_rng_state=False, early_stop=True, determinism_check="none"),
]


def _ids(cfg):
    sub = cfg.submodule_ac if cfg.mode == "per_submodule" else ""
    return f"{cfg.mode}-{sub}{'-policy' if getattr(cfg, 'policy', None) else ''}"


@pytest.mark.parametrize("ac", EAGER_MODES, ids=[_ids(c) for c in EAGER_MODES])
def test_every_ac_mode_keeps_names_and_exact_gradients(moe_cfg, ac):
    cfg = moe_cfg.replace(n_layers=3, moe_layers=2)  # dense and MoE blocks
    batch = tk.make_batch(cfg)
    ref = tk.build_model(cfg)
    ref_loss = tk.train_step(ref, batch)
    model = tk.apply_ac(tk.build_model(cfg), ac)
    assert [n for n, _ in tk.transforms.named_modules(model)] == [n for n, _ in tk.transforms.named_modules(ref)]
    loss = tk.train_step(model, batch)
    assert loss.item() == ref_loss.item()
    g, gr = grads(model), grads(ref)
    assert g.keys() == gr.keys()
    for k in gr:
        torch.testing.assert_close(g[k], gr[k], rtol=0, atol=0, msg=lambda m: f"{k}: {m}")


def _wrapped(model):
    names = tk.transforms.naming.module_names(model)
    return sorted(names[id(m)] for m in model.modules() if isinstance(m, CheckpointWrapper))


def test_where_each_mode_wraps(moe_cfg):
    cfg = moe_cfg.replace(n_layers=4, moe_layers=2)
    assert _wrapped(tk.apply_ac(tk.build_model(cfg), ACConfig.of(mode="full"))) == [f"layers.{i}" for i in range(4)]
    assert _wrapped(tk.apply_ac(tk.build_model(cfg), ACConfig.of(mode="selective_layer", layer_every=2))) == [
        "layers.1",
        "layers.3",
    ]
    assert _wrapped(tk.apply_ac(tk.build_model(cfg), ACConfig.of(mode="selective_layer", layer_every=3))) == [
        "layers.2"
    ]
    assert _wrapped(tk.apply_ac(tk.build_model(cfg), ACConfig.of(mode="per_submodule"))) == [
        "layers.0.attention",
        "layers.0.feed_forward",
        "layers.1.attention",
        "layers.1.moe",
        "layers.2.attention",
        "layers.2.feed_forward",
        "layers.3.attention",
        "layers.3.moe",
    ]
    model = tk.apply_ac(tk.build_model(cfg), ACConfig.of(mode="memory_budget", memory_budget=0.3))
    assert _wrapped(model) == []
    assert tk.transforms.applied(model).functorch_config == {"activation_memory_budget": 0.3}
    # The same model twice gives the same pattern: no counter leaks across models (N14).
    again = tk.apply_ac(tk.build_model(cfg), ACConfig.of(mode="selective_layer", layer_every=2))
    assert _wrapped(again) == ["layers.1", "layers.3"]


def _dense_flops(dense_cfg, ac):
    model = tk.apply_ac(tk.build_model(dense_cfg), ac)
    batch = tk.make_batch(dense_cfg)
    with FlopCounterMode(display=False) as counter:
        tk.models.loss_fn(model(batch.tokens), batch.labels).backward()
    return counter.get_total_flops()


def test_flop_recompute_ladder_is_exact(dense_cfg):
    c = dense_cfg
    L, D, F, V, T, S = c.n_layers, c.dim, c.ffn_hidden, c.vocab_size, c.batch * c.seq_len, c.seq_len
    # FlopCounterMode counts matmuls, and the CPU flash-attention kernel from torch 2.15 on: 2.15 registers its
    # formula (two matmuls of 2*T*S*D in the forward, 2.5 times that in the backward); 2.13 and 2.14 count it as 0.
    sdpa = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    attn = 2 * 2 * T * S * D if sdpa in flop_registry or sdpa.default in flop_registry else 0
    block_fwd = 4 * 2 * T * D * D + 3 * 2 * T * D * F
    fwd = L * block_fwd + 2 * T * D * V
    base = 3 * fwd + L * attn * 7 // 2  # forward + backward (two matmuls per forward matmul)
    # Per block the matmuls run wq, wk, wv, wo, w1, w3, w2: the policy saves the odd ones, recomputes wk, wo, w3.
    # Attention is recomputed under SAC too: torchtitan's save list names the CUDA kernels, not the CPU one.
    sac = base + L * (2 * 2 * T * D * D + 2 * T * D * F + attn)
    # Forcing wq's shape (D, D) recomputes all four attention matmuls (same shape); w3 is then the 2nd matmul.
    forced = base + L * (4 * 2 * T * D * D + 2 * T * D * F + attn)
    full = base + L * (block_fwd + attn)
    got = {
        "none": _dense_flops(c, ACConfig.of()),
        "selective_op": _dense_flops(c, ACConfig.of(mode="selective_op")),
        "forced": _dense_flops(
            c, ACConfig.of(mode="selective_op", force_recompute_mm_shapes_by_fqns=("attention.wq",))
        ),
        "full": _dense_flops(c, ACConfig.of(mode="full")),
    }
    assert got == {"none": base, "selective_op": sac, "forced": forced, "full": full}
    assert got["none"] < got["selective_op"] < got["forced"] < got["full"]
    if attn:  # torch 2.15.0
        assert (base, sac, forced, full) == (4784128, 5439488, 5701632, 6225920)
    else:  # torch 2.13.0, 2.14.1
        assert (base, sac, forced, full) == (4325376, 4849664, 5111808, 5636096)


def _decisions(cfg, ac, layer="0"):
    model = tk.apply_ac(tk.build_model(cfg), ac)
    batch = tk.make_batch(cfg)
    h = model.tok_embeddings(batch.tokens)
    with tk.transforms.record_policy_decisions() as log:
        out = model.layers[layer](h, model.rope)
    out.sum().backward()
    return log


def test_every_other_matmul_rule_op_by_op(dense_cfg):
    log = _decisions(dense_cfg, ACConfig.of(mode="selective_op"))
    D, F = dense_cfg.dim, dense_cfg.ffn_hidden
    mms = [(d.rhs_shape, d.decision) for d in log if d.op == "aten.mm.default"]
    assert mms == [
        ((D, D), "MUST_SAVE"),
        ((D, D), "PREFER_RECOMPUTE"),
        ((D, D), "MUST_SAVE"),
        ((D, D), "PREFER_RECOMPUTE"),
        ((D, F), "MUST_SAVE"),
        ((D, F), "PREFER_RECOMPUTE"),
        ((F, D), "MUST_SAVE"),
    ]
    # On CPU, SDPA runs `_scaled_dot_product_flash_attention_for_cpu`, which torchtitan's save list does not
    # hold: its output is recomputed (CUDA's flash / efficient / cudnn variants are saved).
    sdpa = [d for d in log if "scaled_dot_product" in d.op]
    assert [d.op for d in sdpa] == ["aten._scaled_dot_product_flash_attention_for_cpu.default"]
    assert sdpa[0].decision == "PREFER_RECOMPUTE" and sdpa[0].reason == "not in save set"
    others = {d.decision for d in log if d.op != "aten.mm.default"}
    assert others == {"PREFER_RECOMPUTE"}


def test_router_gate_is_force_recomputed_and_not_counted(moe_cfg):
    cfg = moe_cfg.replace(n_shared_experts=1)
    log = _decisions(cfg, ACConfig.of(mode="selective_op"))
    D, E, Fe = cfg.dim, cfg.n_experts, cfg.moe_hidden
    mms = [(d.rhs_shape, d.decision, d.reason) for d in log if d.op == "aten.mm.default"]
    # Attention: 4 matmuls (#1-#4); then the router gate (forced, not counted); then the experts' loop matmuls
    # continue the count at #5; topk is saved; _grouped_mm would not be (see test below).
    assert mms[:4] == [
        ((D, D), "MUST_SAVE", "matmul #1 (odd)"),
        ((D, D), "PREFER_RECOMPUTE", "matmul #2 (even)"),
        ((D, D), "MUST_SAVE", "matmul #3 (odd)"),
        ((D, D), "PREFER_RECOMPUTE", "matmul #4 (even)"),
    ]
    assert mms[4] == ((D, E), "PREFER_RECOMPUTE", "force-recompute shape")
    assert mms[5] == ((D, Fe), "MUST_SAVE", "matmul #5 (odd)")
    assert [d.decision for d in log if d.op == "aten.topk.default"] == ["MUST_SAVE"]
    # Without the force rule the gate is counted like any other matmul.
    log = _decisions(cfg, ACConfig.of(mode="selective_op", force_recompute_mm_shapes_by_fqns=()))
    gate = [d for d in log if d.op == "aten.mm.default" and d.rhs_shape == (D, E)]
    assert [(d.decision, d.reason) for d in gate] == [("MUST_SAVE", "matmul #5 (odd)")]


def test_grouped_mm_is_never_saved_by_the_default_policy(moe_cfg):
    log = _decisions(moe_cfg.replace(experts_impl="grouped_mm"), ACConfig.of(mode="selective_op"))
    gmm = [d.decision for d in log if d.op == "aten._grouped_mm.default"]
    assert gmm == ["PREFER_RECOMPUTE"] * 3  # C15
    log = _decisions(
        moe_cfg.replace(experts_impl="grouped_mm"),
        ACConfig.of(mode="selective_op", extra_save_ops=(aten._grouped_mm.default,)),
    )
    assert [d.decision for d in log if d.op == "aten._grouped_mm.default"] == ["MUST_SAVE"] * 3


def test_default_save_ops_contents():
    """torchtitan 0.3.0's list: `.default` overloads only (tests/test_torchtitan.py compares with its own)."""
    from torch._functorch.partitioners import get_default_op_list

    ops = tk.transforms.default_save_ops()
    for op in (
        aten.mm.default,
        aten.addmm.default,
        aten.bmm.default,
        aten.topk.default,
        aten.linear.default,
        aten.max.default,
        aten._scaled_dot_product_attention_math.default,
        torch.ops._c10d_functional.all_to_all_single.default,
        torch.ops._c10d_functional.reduce_scatter_tensor.default,
    ):
        assert op in ops
    for op in (
        aten._grouped_mm.default,
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        aten.mm.out,
        aten.topk.values,
    ):
        assert op not in ops
    assert {p.default for p in get_default_op_list().compute_intensive_ops} <= ops
    if hasattr(torch.ops.higher_order, "inductor_compiled_code"):
        assert torch.ops.higher_order.inductor_compiled_code in ops


def test_policy_is_fresh_per_checkpoint_call(dense_cfg):
    """Each block's forward starts counting at 1, so both blocks save the same matmuls."""
    model = tk.apply_ac(tk.build_model(dense_cfg), ACConfig.of(mode="selective_op"))
    batch = tk.make_batch(dense_cfg)
    with tk.transforms.record_policy_decisions() as log:
        model(batch.tokens)
    reasons = [d.reason for d in log if d.op == "aten.mm.default"]
    assert reasons[:7] == reasons[7:14] and reasons[0] == "matmul #1 (odd)"


def test_apply_twice_is_refused_and_remove_restores(moe_cfg):
    model = tk.build_model(moe_cfg)
    before = [n for n, _ in model.named_modules()]
    tk.apply_ac(model, ACConfig.of(mode="full"))
    with pytest.raises(RuntimeError, match="already applied"):
        tk.apply_ac(model, ACConfig.of(mode="selective_op"))
    tk.transforms.remove_ac(model)
    assert [n for n, _ in model.named_modules()] == before
    assert not any(isinstance(m, CheckpointWrapper) for m in model.modules())
    tk.apply_ac(model, ACConfig.of(mode="selective_op"))  # allowed again after removal
    # A wrapper a user put on by hand is detected too.
    other = tk.build_model(moe_cfg)
    other.layers.register_module(
        "0", torch.distributed.algorithms._checkpoint.checkpoint_wrapper.checkpoint_wrapper(other.layers["0"])
    )
    with pytest.raises(RuntimeError, match="CheckpointWrapper found"):
        tk.apply_ac(other, ACConfig.of(mode="full"))


def test_ac_turns_lru_off_only_inside_torch_settings(moe_cfg):
    from toolkit.compat import lru_cache_enabled, set_lru_cache

    model = tk.apply_ac(tk.build_model(moe_cfg), ACConfig.of(mode="full"))
    assert lru_cache_enabled()
    with tk.transforms.torch_settings(model):
        assert not lru_cache_enabled()
    assert lru_cache_enabled()
    # Turned off by someone else (torchtitan's apply_ac does it directly): it stays off after the step.
    torch._C._dynamo.eval_frame._set_lru_cache(False)
    try:
        assert lru_cache_enabled() is False
        with tk.transforms.torch_settings(model):
            assert not lru_cache_enabled()
        assert lru_cache_enabled() is False
    finally:
        set_lru_cache(True)


def test_memory_budget_without_compile_is_refused(moe_cfg):
    with pytest.raises(ConfigError, match="ACConfig.mode") as e:
        tk.transforms.prepare(tk.build_model(moe_cfg), ac=ACConfig.of(mode="memory_budget"))
    assert "compile" in str(e.value)
    model = tk.apply_ac(tk.build_model(moe_cfg), ACConfig.of(mode="memory_budget"))
    with pytest.raises(ConfigError, match="nothing is compiled"):
        tk.apply_compile(model, tk.CompileConfig())
    with pytest.raises(ConfigError, match="nothing is compiled"):
        tk.train_step(model, tk.make_batch(moe_cfg))


@pytest.mark.parametrize(
    "kwargs, field, words",
    [
        (dict(mode="sometimes"), "mode", "not one of"),
        (dict(mode="selective_layer", layer_every=0), "layer_every", "below 1"),
        (dict(mode="memory_budget", memory_budget=1.5), "memory_budget", "between 0 and 1"),
        (dict(mode="custom"), "policy", "exactly one"),
        (dict(mode="custom", policy=print, save_ops=(aten.mm.default,)), "policy", "exactly one"),
        (dict(mode="full", save_ops=(aten.mm.default,)), "mode", "only used by mode='custom'"),
        (dict(mode="selective_op", debug=True), "debug", "C24"),
        (dict(mode="per_submodule", debug=True), "debug", "C24"),
        (dict(force_recompute_mm_shapes_by_fqns="moe.router.gate"), "force_recompute_mm_shapes_by_fqns", "tuple"),
        (dict(determinism_check="strict"), "determinism_check", "not one of"),
        (dict(preserve_rng_state="yes"), "preserve_rng_state", "not a bool"),
        # Options of one mode set for another, which would ignore them (accepted silently before).
        (dict(mode="full", layer_every=3), "layer_every", "only used by mode='selective_layer'"),
        (dict(mode="none", memory_budget=0.2), "memory_budget", "only used by mode='memory_budget'"),
        (dict(mode="full", submodule_ac="full"), "submodule_ac", "only used by mode='per_submodule'"),
        (dict(mode="full", extra_save_ops=(aten.mm.default,)), "extra_save_ops", "per-op policy"),
        (
            dict(mode="per_submodule", submodule_ac="full", force_recompute_mm_shapes_by_fqns=()),
            "force_recompute_mm_shapes_by_fqns",
            "submodule_ac='full'",
        ),
        (dict(mode="none", preserve_rng_state=False), "preserve_rng_state", "the modes that wrap"),
        (dict(mode="memory_budget", early_stop=True), "early_stop", "the modes that wrap"),
        # Ops a policy can never match.
        (dict(mode="selective_op", extra_save_ops=("not_an_op",)), "extra_save_ops", "not a torch op"),
        (dict(mode="selective_op", extra_save_ops=(aten.mm,)), "extra_save_ops", "overload packet"),
        (dict(mode="selective_op", extra_save_ops=(print,)), "extra_save_ops", "not a torch op"),
        (dict(mode="custom", save_ops=("aten.nothing_like_this.default",)), "save_ops", "not a torch op"),
        (dict(mode="memory_budget", memory_budget=float("nan")), "memory_budget", "between 0 and 1"),
    ],
)
def test_ac_config_validation_names_the_field(kwargs, field, words):
    with pytest.raises(ConfigError) as e:
        ACConfig.of(**kwargs)
    assert e.value.field == field and f"ACConfig.{field}" in str(e.value) and words in str(e.value)


def test_full_ac_with_debug_is_allowed():
    ACConfig.of(mode="full", debug=True)


def test_mode_options_take_their_default_only_in_their_mode():
    assert (
        ACConfig.of(mode="selective_layer").layer_every
        == 2
        == ACConfig.of(mode="selective_layer", layer_every=2).layer_every
    )
    assert ACConfig.of(mode="selective_layer") == ACConfig.of(mode="selective_layer", layer_every=2)
    # Each mode's config holds only its own options (a per-mode class: `MODES`).
    assert ACConfig.of(mode="memory_budget").memory_budget == 0.5 and not hasattr(ACConfig.of(), "memory_budget")
    assert ACConfig.of(mode="per_submodule").submodule_ac == "selective"
    assert ACConfig.of(mode="selective_op").force_recompute_mm_shapes_by_fqns == ("moe.router.gate",)
    assert ACConfig.of(mode="per_submodule", submodule_ac="full").force_recompute_mm_shapes_by_fqns is None
    full = ACConfig.of(mode="full")
    assert (full.preserve_rng_state, full.early_stop, full.determinism_check, full.debug) == (
        True,
        False,
        "default",
        False,
    )
    assert not hasattr(full, "layer_every") and not hasattr(ACConfig.of(), "preserve_rng_state")
    assert ACConfig.of(mode="selective_op", extra_save_ops=("aten.mm.default",)).extra_save_ops == (aten.mm.default,)


@pytest.mark.parametrize(
    "cfg",
    [c for c in EAGER_MODES if getattr(c, "policy", None) is None]
    + [
        ACConfig.of(mode="memory_budget", memory_budget=0.25),
        ACConfig.of(mode="selective_op", extra_save_ops=(aten.topk.default,), force_recompute_mm_shapes_by_fqns=()),
    ],
    ids=_ids,
)
def test_every_mode_round_trips_through_json(cfg):  # a policy callable cannot travel through JSON
    data = json.loads(json.dumps(cfg.to_dict()))
    assert ACConfig.from_dict(data) == cfg


def test_files_written_before_options_became_mode_specific_still_load():
    """Older `to_dict` output carries every option at its default whatever the mode: those defaults are dropped for
    the modes that ignore them, any other value is still refused."""
    legacy = {
        "mode": "full",
        "preserve_rng_state": True,
        "early_stop": False,
        "determinism_check": "default",
        "debug": False,
        "layer_every": 2,
        "submodule_ac": "selective",
        "force_recompute_mm_shapes_by_fqns": ["moe.router.gate"],
        "extra_save_ops": [],
        "memory_budget": 0.5,
        "policy": None,
        "save_ops": None,
        "wrap_inductor_compiled_regions": False,
    }
    assert ACConfig.from_dict(legacy) == ACConfig.of(mode="full")
    assert ACConfig.from_dict({**legacy, "mode": "none"}) == ACConfig.of()
    assert ACConfig.from_dict({**legacy, "mode": "memory_budget", "memory_budget": 0.3}) == ACConfig.of(
        mode="memory_budget", memory_budget=0.3
    )
    with pytest.raises(ConfigError, match="ACConfig.layer_every"):
        ACConfig.from_dict({**legacy, "layer_every": 3})
    with pytest.raises(ConfigError, match="ACConfig: "):
        ACConfig.from_dict(["full"])


def test_force_recompute_must_name_linear_modules(moe_cfg):
    with pytest.raises(ConfigError, match="not nn.Linear"):
        tk.apply_ac(
            tk.build_model(moe_cfg), ACConfig.of(mode="selective_op", force_recompute_mm_shapes_by_fqns=("moe.router",))
        )


def test_ac_config_json_round_trip():
    cfg = ACConfig.of(mode="custom", save_ops=(aten.mm.default, aten.topk.default))
    data = cfg.to_dict()
    assert data["save_ops"] == ["aten.mm.default", "aten.topk.default"]
    assert ACConfig.from_dict(data) == cfg
    cfg2 = ACConfig.of(mode="selective_op", extra_save_ops=(aten._grouped_mm.default,))
    assert ACConfig.from_dict(cfg2.to_dict()) == cfg2
    with pytest.raises(ConfigError, match="callable"):
        ACConfig.from_dict(ACConfig.of(mode="custom", policy=print).to_dict())


def test_each_mode_is_its_own_config_that_applies_itself(moe_cfg):
    """`ACConfig.of(mode=...)` is the one entry point; it builds the mode's own class (`MODES`), which holds only its
    options and applies itself, and round-trips through the same JSON record as before the split."""
    from toolkit.transforms.ac import MODES, FullAC, NoAC, RematAC, SelectiveOpAC

    assert list(MODES) == [
        "none",
        "full",
        "reentrant",
        "selective_op",
        "selective_layer",
        "per_submodule",
        "memory_budget",
        "custom",
        "remat",
        "policy_dict",
    ]
    assert (
        type(ACConfig.of()) is NoAC
        and type(ACConfig.of(mode="full")) is FullAC
        and FullAC() == ACConfig.of(mode="full")
    )
    assert type(ACConfig.of(mode="selective_op")) is SelectiveOpAC and isinstance(FullAC(), ACConfig)
    assert type(ACConfig.of("remat")) is RematAC  # the mode may be given by position too
    # The family's base is no config of its own: calling it says which entry points build one.
    for call in (lambda: ACConfig(), lambda: ACConfig(mode="full", preserve_rng_state=False)):
        with pytest.raises(
            ConfigError, match=r"ACConfig\.mode: .*ACConfig\.of\(mode='(none|full)', \.\.\.\) or .*FullAC"
        ):
            call()
    assert FullAC.options() == (
        "preserve_rng_state",
        "early_stop",
        "determinism_check",
        "debug",
        "wrap_inductor_compiled_regions",
        "offload",
    )
    assert RematAC.options() == (
        "save_regions",
        "recompute_regions",
        "preserve_rng_state",
        "determinism_check",
        "debug",
    )
    for mode, cls in MODES.items():
        if mode in ("custom", "remat") or (mode == "policy_dict" and not compat.available("checkpoint_policy_dict")):
            continue  # a callable cannot travel through JSON; remat is checked in test_remat; policy_dict below
        cfg = cls()
        record = cfg.to_dict()
        assert list(record) == list(ACConfig.of().to_dict()) and record["mode"] == mode  # one record for every mode
        assert ACConfig.from_dict(json.loads(json.dumps(record))) == cfg
    model = tk.build_model(moe_cfg)
    tk.apply_ac(model, FullAC(preserve_rng_state=False))  # a class used directly is the same config
    assert tk.transforms.applied(model).ac == ACConfig.of(mode="full", preserve_rng_state=False)
    tk.transforms.remove_ac(model)
    with pytest.raises(ConfigError, match="ACConfig.mode: FullAC is mode 'full', not 'none'"):
        FullAC(mode="none")


# Records as the flat ACConfig wrote them (c304631, before each mode had a config of its own): files and the
# matrix's cache keys hold these, so the per-mode configs must write them byte for byte.
FLAT_RECORDS = {
    "full": '{"debug": false, "determinism_check": "default", "early_stop": false, "extra_save_ops": [], '
    '"force_recompute_mm_shapes_by_fqns": null, "layer_every": null, "memory_budget": null, "mode": "full", '
    '"policy": null, "preserve_rng_state": true, "recompute_regions": null, "save_ops": null, "save_regions": null, '
    '"submodule_ac": null, "wrap_inductor_compiled_regions": false}',
    "selective_op": '{"debug": false, "determinism_check": "default", "early_stop": false, "extra_save_ops": [], '
    '"force_recompute_mm_shapes_by_fqns": ["moe.router.gate"], "layer_every": null, "memory_budget": null, '
    '"mode": "selective_op", "policy": null, "preserve_rng_state": true, "recompute_regions": null, '
    '"save_ops": null, "save_regions": null, "submodule_ac": null, "wrap_inductor_compiled_regions": false}',
    "remat": '{"debug": null, "determinism_check": "default", "early_stop": null, "extra_save_ops": [], '
    '"force_recompute_mm_shapes_by_fqns": null, "layer_every": null, "memory_budget": null, "mode": "remat", '
    '"policy": null, "preserve_rng_state": false, "recompute_regions": [], "save_ops": null, "save_regions": [], '
    '"submodule_ac": null, "wrap_inductor_compiled_regions": false}',
    "remat_selective": '{"debug": null, "determinism_check": "default", "early_stop": null, "extra_save_ops": [], '
    '"force_recompute_mm_shapes_by_fqns": null, "layer_every": null, "memory_budget": null, "mode": "remat", '
    '"policy": null, "preserve_rng_state": false, "recompute_regions": ["*routed_experts.w13.*"], '
    '"save_ops": null, "save_regions": ["*"], "submodule_ac": null, "wrap_inductor_compiled_regions": false}',
}


@pytest.mark.parametrize("name", list(FLAT_RECORDS))
def test_each_mode_writes_the_record_the_flat_config_wrote(name):
    """A remat config wrote `"debug": false` for a while, which changed the cache key of all 106 remat cells of the
    full sweep (their cached results were measured again); every mode's record is pinned here."""
    if name.startswith("remat"):
        extra("torch_remat")
    cfg = ACConfig.remat_selective() if name == "remat_selective" else ACConfig.of(mode=name)
    record = cfg.to_dict()
    assert record.pop("policy_save") is None  # added since (the dict policy), and left out of cache keys while unset
    assert json.dumps(record, sort_keys=True) == FLAT_RECORDS[name]
    assert ACConfig.from_dict(json.loads(FLAT_RECORDS[name])) == cfg


def test_a_failure_half_way_through_apply_ac_leaves_the_model_as_it_was(moe_cfg, monkeypatch):
    """The changes a mode makes go into an undo list as they are made: when wrapping the second block fails, the
    first is unwrapped again, and the next apply_ac works."""
    from toolkit.transforms.ac import FullAC

    model = tk.build_model(moe_cfg)
    before = [type(b) for b in model.layers.values()]
    calls = []
    original = FullAC.wrap

    def failing(self, module, fqn, **kw):
        calls.append(fqn)
        if fqn == "layers.1":
            raise RuntimeError("refused")
        return original(self, module, fqn, **kw)

    monkeypatch.setattr(FullAC, "wrap", failing)
    with pytest.raises(RuntimeError, match="refused"):
        tk.apply_ac(model, ACConfig.of(mode="full"))
    assert calls == ["layers.0", "layers.1"] and [type(b) for b in model.layers.values()] == before
    assert tk.transforms.applied(model).empty
    monkeypatch.setattr(FullAC, "wrap", original)
    tk.apply_ac(model, ACConfig.of(mode="full"))
    assert tk.transforms.applied(model).ac_wrapped == ["layers.0", "layers.1"]


def test_policy_dict_mode_needs_the_torch_that_has_it():
    """pytorch#186277's `checkpoint(policy=dict)` / `name()`: a mode where torch has it, a ConfigError naming the
    torch it needs where not (none of 2.13.0, 2.14.1 and 2.15.0 has it)."""
    import torch.utils.checkpoint as ckpt

    has = "policy" in inspect.signature(ckpt.checkpoint).parameters and callable(getattr(ckpt, "name", None))
    assert compat.available("checkpoint_policy_dict") == has
    if torch.__version__.split("+")[0] in compat.CHECKED_ON:
        assert not has
    if not has:
        with pytest.raises(
            ConfigError, match=r"ACConfig.mode: 'policy_dict' needs .*pytorch#186277.*newer than 2.15.0"
        ):
            ACConfig.of(mode="policy_dict")
        with pytest.raises(ConfigError, match="ACConfig.policy_save"):
            ACConfig.of(mode="policy_dict", policy_save="aten.mm.default")  # the shape is checked first
        from toolkit.notebook.widgets import Explorer

        assert "policy_dict" not in Explorer().controls["ac_mode"].options
    with pytest.raises(ConfigError, match="policy_save"):
        ACConfig.of(mode="full", policy_save=("aten.mm.default",))  # only its own mode reads it


def test_the_toolkits_own_checkpoints_offload_alike():
    """`ACConfig.of(mode="full", offload=True)` on the toolkit's model: each checkpoint call inside save_on_cpu, as
    transformers does; the truth counts the host copies the test's own subclass of save_on_cpu records."""
    cfg = tk.ModelConfig(n_layers=2)
    model = tk.build_model(cfg)
    tk.transforms.prepare(model, ac=tk.ACConfig.of(mode="full", offload=True))
    tokens = tk.make_batch(cfg).tokens
    report = tk.measure(model, tokens)
    truth = Truth(model)
    with host_copies(truth, torch.autograd.graph), truth:
        true = truth.bytes(model(tokens))
    assert report.ok and report.saved.total_bytes == true, (report.saved.total_bytes, true, report.saved.by_kind)
    assert report.saved.by_kind.get("offloaded", 0) > 0 and "other" not in report.saved.by_kind
    run = tk.run(
        tk.Scenario(model=cfg, ac=tk.ACConfig.of(mode="full", offload=True), measure_memory=False, steady_steps=0)
    )
    assert run.numerics.grads_match is True and run.saved.by_kind == report.saved.by_kind


@pytest.mark.parametrize("fullgraph", [True, False])
def test_offload_under_compile_reads_as_dynamo_says_without_the_probes(fullgraph):
    """C72 through the instrument: the probes stand in for save_on_cpu's constructor and pack hook, so Dynamo must meet
    the same rules as with the originals. Truth: the same prepared model run bare, Dynamo's own graph-break counters
    and its exception. Before, Dynamo inlined the stand-ins: fullgraph failed on the probes object ("Unexpected type in
    sourceless builder ... Probes") and the step had one more break ("Call to `torch.compiler.disable()`")."""
    from torch._dynamo.utils import counters

    cfg = tk.ModelConfig(moe_layers="none", n_layers=2)
    ac, comp = tk.ACConfig.of(mode="full", offload=True), tk.CompileConfig(scope="blocks", fullgraph=fullgraph)
    torch._dynamo.reset()
    counters.clear()
    model = tk.transforms.prepare(tk.build_model(cfg), ac=ac, compile=comp)
    try:
        model(tk.make_batch(cfg).tokens).float().sum().backward()
        plain_error = ""
    except Exception as e:
        plain_error = str(e).splitlines()[0]
    plain_breaks = {k.splitlines()[0] for k in counters["graph_break"]}
    report = tk.run(tk.Scenario(model=cfg, ac=ac, compile=comp, measure_memory=False, steady_steps=0))
    if fullgraph:
        assert plain_error == "Attempted to inline function marked as skipped", plain_error
        assert report.verdict == "error" and report.error.message.splitlines()[0] == plain_error
        assert "save_on_cpu.__init__" in report.error.message and "Probes" not in report.error.message
    else:
        assert not plain_error and plain_breaks == {"Attempted to inline function marked as skipped"}, plain_breaks
        assert report.verdict == "fell_back_to_eager" and report.compile.graphs == 0
        reasons = {b.reason.splitlines()[0] for b in report.compile.breaks}
        assert plain_breaks <= reasons and not any("compiler.disable" in r for r in reasons), reasons
        assert report.numerics.grads_match is True


def test_reentrant_checkpoints_the_toolkits_own_blocks():
    """mode="reentrant" on the toolkit's own model (it raised AttributeError: its class wraps blocks but was not one of
    the `Checkpointing` modes that had the wrapping loop): each block saves only its input and the RNG state it
    restores, and re-runs whole in backward, as full AC does; gradients match the model without AC."""
    cfg = tk.ModelConfig()
    rng_state = torch.get_rng_state().numel()  # preserve_rng_state stashes the CPU generator's state per block
    report = tk.run(tk.Scenario(model=cfg, ac=ACConfig.of(mode="reentrant"), steady_steps=0))
    block_input = cfg.batch * cfg.seq_len * cfg.dim * 4  # float32
    assert report.saved.by_module["layers.0"] == block_input + rng_state
    full = tk.run(tk.Scenario(model=cfg, ac=ACConfig.of(mode="full"), steady_steps=0))
    assert report.recompute.ops == full.recompute.ops > 0
    assert report.numerics.grads_match and report.numerics.max_grad_diff == 0.0
