"""The model zoo: torchtitan names, determinism, the four experts implementations, MoE details, config validation."""

import pytest
import torch
from _helpers import grads

import toolkit as tk
from toolkit import ConfigError, ModelConfig


def test_default_model_has_torchtitan_0_3_0_names(moe_cfg):
    """The names torchtitan 0.3.0's Qwen3-MoE / DeepSeek-V3 use (tests/test_torchtitan.py compares with its
    real models), so its FQN options (`force_recompute_mm_shapes_by_fqns`) apply unchanged."""
    model = tk.build_model(moe_cfg)
    names = {n for n, _ in tk.transforms.named_modules(model)}
    for i in range(moe_cfg.n_layers):
        for leaf in (
            "attention.wq",
            "attention.wk",
            "attention.wv",
            "attention.wo",
            "attention_norm",
            "ffn_norm",
            "moe.router.gate",
            "moe.routed_experts",
            "moe.routed_experts.inner_experts",
            "moe.shared_experts.w1",
            "moe.shared_experts.w2",
            "moe.shared_experts.w3",
        ):
            assert f"layers.{i}.{leaf}" in names
    assert {"tok_embeddings", "norm", "lm_head"} <= names and "output" not in names
    params = dict(model.named_parameters())
    E, D, F = moe_cfg.n_experts, moe_cfg.dim, moe_cfg.moe_hidden
    assert params["layers.0.moe.routed_experts.inner_experts.w1_EFD"].shape == (E, F, D)
    assert params["layers.0.moe.routed_experts.inner_experts.w2_EDF"].shape == (E, D, F)
    assert params["layers.0.moe.routed_experts.inner_experts.w3_EFD"].shape == (E, F, D)
    assert {n for n, _ in model.named_buffers()} >= {"layers.0.moe.expert_bias_E", "layers.0.moe.tokens_per_expert_E"}
    # The dispatcher is a plain object, as in torchtitan: no module, no name.
    assert type(model.layers["0"].moe.routed_experts.token_dispatcher).__name__ == "LocalTokenDispatcher"


def test_the_main_layout_has_torchtitan_mains_names_exactly():
    """Every module, parameter and buffer name as torchtitan main's files name them (models/common/moe.py at
    00a4c147699f; attention's qkv_linear.wqkv, w13 + w2 feed-forwards and lm_head per docs/remat.md at
    03d9819f3416), listed in full; tests/test_torchtitan_main.py loads these weights into main's rebuilt code."""
    cfg = ModelConfig(layout="torchtitan_main", n_layers=2, moe_layers=(1,))
    model = tk.build_model(cfg)
    E, D, F, Fd = cfg.n_experts, cfg.dim, cfg.moe_hidden, cfg.ffn_hidden
    assert {n: tuple(p.shape) for n, p in model.named_parameters()} == {
        "tok_embeddings.weight": (cfg.vocab_size, D),
        "layers.0.attention_norm.weight": (D,),
        "layers.0.attention.qkv_linear.wqkv.weight": (3 * D, D),
        "layers.0.attention.wo.weight": (D, D),
        "layers.0.ffn_norm.weight": (D,),
        "layers.0.feed_forward.w13.weight": (2, Fd, D),
        "layers.0.feed_forward.w2.weight": (D, Fd),
        "layers.1.attention_norm.weight": (D,),
        "layers.1.attention.qkv_linear.wqkv.weight": (3 * D, D),
        "layers.1.attention.wo.weight": (D, D),
        "layers.1.ffn_norm.weight": (D,),
        "layers.1.moe.router.gate.weight": (E, D),
        "layers.1.moe.routed_experts.w13.weight": (E, 2, F, D),
        "layers.1.moe.routed_experts.w2.weight": (E, D, F),
        "layers.1.moe.shared_experts.w13.weight": (2, F, D),
        "layers.1.moe.shared_experts.w2.weight": (D, F),
        "norm.weight": (D,),
        "lm_head.weight": (cfg.vocab_size, D),
    }
    assert [n for n, _ in model.named_buffers()] == [
        "rope",
        "layers.1.moe.expert_bias_E",
        "layers.1.moe.router.tokens_per_expert_E",
    ]
    modules = [n for n, _ in tk.transforms.named_modules(model)]
    block = ["attention_norm", "attention", "attention.qkv_linear", "attention.qkv_linear.wqkv", "attention.wo"]
    block += ["ffn_norm"]
    assert modules == [
        "",
        "tok_embeddings",
        "layers",
        "layers.0",
        *(f"layers.0.{n}" for n in block),
        "layers.0.feed_forward",
        "layers.0.feed_forward.w13",
        "layers.0.feed_forward.w2",
        "layers.1",
        *(f"layers.1.{n}" for n in block),
        "layers.1.moe",
        "layers.1.moe.router",
        "layers.1.moe.router.gate",
        "layers.1.moe.routed_experts",
        "layers.1.moe.routed_experts.w13",
        "layers.1.moe.routed_experts.w2",
        "layers.1.moe.shared_experts",
        "layers.1.moe.shared_experts.w13",
        "layers.1.moe.shared_experts.w2",
        "norm",
        "lm_head",
    ]
    # The activation and the dispatcher are plain objects beside the grouped linears, as in main.
    routed = model.layers["1"].moe.routed_experts
    assert {type(routed.activation_fn).__name__, type(routed.token_dispatcher).__name__} == {
        "SwiGLU",
        "LocalTokenDispatcher",
    }
    # The gate computes in float32 whatever the model's dtype (main's RouterGateLinear).
    bf16 = tk.build_model(cfg.replace(dtype="bfloat16"))
    x = torch.randn(4, D, dtype=torch.bfloat16)
    assert bf16.layers["1"].moe.router(x, None)[0].dtype == torch.float32
    # One seed, the same model: main's fused weights hold 0.3.0's draws, so the step is the same.
    old = tk.build_model(cfg.replace(layout="torchtitan_0_3_0"))
    w13 = model.layers["1"].moe.routed_experts.w13.weight
    assert torch.equal(w13[:, 0], old.layers["1"].moe.routed_experts.inner_experts.w1_EFD)
    assert torch.equal(w13[:, 1], old.layers["1"].moe.routed_experts.inner_experts.w3_EFD)
    batch = tk.make_batch(cfg)
    assert tk.train_step(model, batch).item() == pytest.approx(tk.train_step(old, batch).item(), abs=1e-6)


def test_the_main_layout_refuses_what_main_does_not_have():
    with pytest.raises(ConfigError, match="experts_impl.*'masked' does not exist in torchtitan main.*grouped_mm"):
        ModelConfig(layout="torchtitan_main", experts_impl="masked")
    with pytest.raises(ConfigError, match="token_count.*'histc' does not exist in torchtitan main"):
        ModelConfig(layout="torchtitan_main", token_count="histc")
    ModelConfig(layout="torchtitan_main", experts_impl="masked", moe_layers="none")  # no experts, nothing to refuse


def test_the_2025_layout_keeps_the_names_of_pr_2052s_era():
    model = tk.build_model(ModelConfig(layout="torchtitan_2025", experts_impl="for_loop"))
    names = {n for n, _ in tk.transforms.named_modules(model)}
    assert {"layers.0.moe.experts", "output"} <= names and "lm_head" not in names
    assert {"layers.0.moe.experts.w1", "layers.0.moe.experts.w2"} <= {n for n, _ in model.named_parameters()}
    assert {"layers.0.moe.expert_bias", "layers.0.moe.tokens_per_expert"} <= {n for n, _ in model.named_buffers()}
    # Same seed, same weights, same step: the layouts differ only in names (and grouped_mm's dtype).
    new = tk.build_model(ModelConfig(experts_impl="for_loop"))
    batch = tk.make_batch(ModelConfig())
    assert tk.train_step(model, batch).item() == tk.train_step(new, batch).item()


def test_dense_and_interleaved_layers():
    m = tk.build_model(ModelConfig(n_layers=4, moe_layers=2))
    kinds = ["moe" if b.moe_enabled else "ffn" for b in m.layers.values()]
    assert kinds == ["ffn", "moe", "ffn", "moe"]  # torchtitan llama4: (i + 1) % k == 0
    names = {n for n, _ in tk.transforms.named_modules(m)}
    assert {"layers.0.feed_forward.w1", "layers.0.feed_forward.w2", "layers.0.feed_forward.w3"} <= names
    assert ModelConfig(n_layers=3, moe_layers=(0, 2)).moe_layer_ids == (0, 2)


def test_same_seed_same_model_and_global_rng_untouched(moe_cfg):
    before = torch.random.get_rng_state()
    a, b = tk.build_model(moe_cfg), tk.build_model(moe_cfg)
    assert torch.equal(torch.random.get_rng_state(), before)
    for (na, pa), (nb, pb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert na == nb and torch.equal(pa, pb)
    c = tk.build_model(moe_cfg.replace(seed=1))
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)
    assert torch.equal(tk.make_batch(moe_cfg).tokens, tk.make_batch(moe_cfg).tokens)


def test_training_step_is_one_call_and_deterministic(moe_cfg):
    batch = tk.make_batch(moe_cfg)
    m1, m2 = tk.build_model(moe_cfg), tk.build_model(moe_cfg)
    l1, l2 = tk.train_step(m1, batch), tk.train_step(m2, batch)
    assert l1.item() == l2.item()
    assert l1.item() == pytest.approx(torch.log(torch.tensor(float(moe_cfg.vocab_size))).item(), rel=0.1)
    g1, g2 = grads(m1), grads(m2)
    assert set(g1) == {tk.transforms.canonical_name(n) for n, p in m1.named_parameters()}
    for k in g1:
        torch.testing.assert_close(g1[k], g2[k], rtol=0, atol=0)


@pytest.mark.parametrize(
    "impl, layout, tol",
    [
        ("masked", "torchtitan_0_3_0", 1e-4),
        ("nonzero", "torchtitan_0_3_0", 1e-4),
        ("grouped_mm", "torchtitan_2025", 1e-4),
        ("grouped_mm", "torchtitan_0_3_0", 2e-2),
    ],
)
def test_experts_implementations_agree_with_for_loop(moe_cfg, impl, layout, tol):
    """fp32 implementations agree with the for-loop experts to fp32 precision; 0.3.0's grouped_mm computes the
    experts in bfloat16 (as torchtitan does), so it agrees to bfloat16 precision."""
    batch = tk.make_batch(moe_cfg)
    ref = tk.build_model(moe_cfg.replace(experts_impl="for_loop", layout=layout))
    ref_loss = tk.train_step(ref, batch)
    m = tk.build_model(moe_cfg.replace(experts_impl=impl, layout=layout))
    loss = tk.train_step(m, batch)
    torch.testing.assert_close(loss, ref_loss, rtol=tol / 100, atol=tol / 100)
    g, gr = grads(m), grads(ref)
    for k in gr:
        torch.testing.assert_close(g[k], gr[k], rtol=tol, atol=tol / 100)


@pytest.mark.parametrize("count", ["histc", "bincount"])
def test_token_count_methods_agree(moe_cfg, count):
    batch = tk.make_batch(moe_cfg)
    ref, m = tk.build_model(moe_cfg), tk.build_model(moe_cfg.replace(token_count=count))
    tk.train_step(ref, batch)
    tk.train_step(m, batch)
    for i in ("0", "1"):
        assert torch.equal(m.layers[i].moe.tokens_per_expert_E, ref.layers[i].moe.tokens_per_expert_E)


def test_tokens_per_expert_counts_every_routed_copy(moe_cfg):
    m = tk.build_model(moe_cfg)
    tk.train_step(m, tk.make_batch(moe_cfg))
    T = moe_cfg.batch * moe_cfg.seq_len
    for block in m.layers.values():
        counts = block.moe.tokens_per_expert_E
        assert counts.dtype == torch.float32 and counts.sum().item() == T * moe_cfg.top_k
    m.eval()
    with torch.no_grad():
        m(tk.make_batch(moe_cfg).tokens)
    assert m.layers["0"].moe.tokens_per_expert_E.sum().item() == T * moe_cfg.top_k  # no counting in eval


def test_expert_bias_steers_selection_not_weights(moe_cfg):
    m = tk.build_model(moe_cfg)
    router = m.layers["0"].moe.router
    x = torch.randn(8, moe_cfg.dim)
    w0, ids0, _ = router(x, torch.zeros(moe_cfg.n_experts))
    bias = torch.tensor([10.0, 10.0, 0.0, 0.0])
    w1, ids1, counts = router(x, bias)
    assert set(ids1.flatten().tolist()) == {0, 1}  # the bias forces experts 0 and 1
    scores = torch.sigmoid(router.gate(x).float())
    torch.testing.assert_close(w1, scores.gather(-1, ids1))  # weights come from unbiased scores
    assert counts.tolist() == [8, 8, 0, 0]


def test_router_options():
    cfg = ModelConfig(score_func="softmax", route_norm=True, route_scale=2.0)
    router = tk.build_model(cfg).layers["0"].moe.router
    w, ids, _ = router(torch.randn(5, cfg.dim))
    torch.testing.assert_close(w.sum(-1), torch.full((5,), 2.0))


def test_router_noise_uses_rng_only_in_training():
    cfg = ModelConfig(router_noise=0.5)
    m = tk.build_model(cfg)
    x = torch.randn(64, cfg.dim)
    router = m.layers["0"].moe.router
    torch.manual_seed(0)
    _, a, _ = router(x)
    torch.manual_seed(1)
    _, b, _ = router(x)
    assert not torch.equal(a, b)
    router.eval()
    assert torch.equal(router(x)[1], router(x)[1])


def test_shared_experts_and_balancing_optional():
    m = tk.build_model(ModelConfig(n_shared_experts=0, load_balance=False))
    moe = m.layers["0"].moe
    # torchtitan 0.3.0 counts tokens per expert whether or not it balances; the 2025 layout only when it did.
    assert moe.shared_experts is None and moe.expert_bias_E is None and moe.tokens_per_expert_E is not None
    tk.train_step(m, tk.make_batch(ModelConfig()))
    old = tk.build_model(ModelConfig(n_shared_experts=0, load_balance=False, layout="torchtitan_2025"))
    assert old.layers["0"].moe.tokens_per_expert is None


def test_bfloat16_model_with_grouped_mm():
    cfg = ModelConfig(dtype="bfloat16", experts_impl="grouped_mm")
    m = tk.build_model(cfg)
    assert m.lm_head.weight.dtype == torch.bfloat16 and m.rope.dtype == torch.float32
    assert m.layers["0"].moe.tokens_per_expert_E.dtype == torch.float32
    loss = tk.train_step(m, tk.make_batch(cfg))
    assert torch.isfinite(loss)
    assert m.layers["0"].moe.routed_experts.inner_experts.w1_EFD.grad.dtype == torch.bfloat16


def test_experts_graph_break_hook_is_compile_disabled():
    m = tk.build_model(ModelConfig(experts_graph_break=True))
    hooks = list(m.layers["0"].moe.routed_experts.inner_experts._forward_pre_hooks.values())
    assert len(hooks) == 1 and getattr(hooks[0], "_torchdynamo_disable", False)


def test_meta_model_builds_without_memory():
    m = tk.build_model(ModelConfig(device="meta", dim=4096, n_heads=32, moe_hidden=4096, n_experts=64))
    assert m.lm_head.weight.is_meta


@pytest.mark.parametrize(
    "kwargs, field, words",
    [
        (dict(top_k=5, n_experts=4), "top_k", "exceeds n_experts"),
        (dict(dim=30, n_heads=4), "dim", "not divisible by n_heads"),
        (dict(dim=6, n_heads=2), "n_heads", "odd"),
        (dict(attention="flex"), "attention", "no backward on CPU"),
        (dict(experts_impl="grouped_mm", dim=36, n_heads=2), "dim", "multiple of 8"),
        (dict(experts_impl="bogus"), "experts_impl", "not one of"),
        (dict(dtype="float16"), "dtype", "not one of"),
        (dict(moe_layers=(0, 7)), "moe_layers", "not in range"),
        (dict(moe_layers=0), "moe_layers", "below 1"),
        (dict(n_layers=0), "n_layers", "below 1"),
        (dict(device="cuda"), "device", "CUDA"),
        (dict(device="potato"), "device", "not a device"),
        (dict(router_noise=-1.0), "router_noise", ">= 0"),
        # Accepted silently before: a truthy string or 1 switched a bool option on; inf / NaN passed range checks
        # (NaN noise even ran "ok" with the loss of no noise at all).
        (dict(route_norm="yes"), "route_norm", "not a bool"),
        (dict(load_balance=1), "load_balance", "not a bool"),
        (dict(experts_graph_break="no"), "experts_graph_break", "not a bool"),
        (dict(route_scale=float("inf")), "route_scale", "not a finite number"),
        (dict(route_scale=0.0), "route_scale", "not > 0"),
        (dict(router_noise=float("nan")), "router_noise", "not a finite number"),
    ],
)
def test_model_config_validation_names_the_field(kwargs, field, words):
    if field == "device" and "CUDA" in words and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(ConfigError) as e:
        ModelConfig(**kwargs)
    assert e.value.field == field and f"ModelConfig.{field}" in str(e.value) and words in str(e.value)
    assert "Fix:" in str(e.value)


def test_model_config_json_round_trip():
    cfg = ModelConfig(moe_layers=(0, 1), experts_impl="masked", router_noise=0.25)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match="ModelConfig.nlayers"):
        ModelConfig.from_dict({"nlayers": 3})


def test_config_is_keyword_only():
    with pytest.raises(TypeError):
        ModelConfig(2)  # type: ignore[misc]


def test_grouped_query_attention_with_its_own_head_width_and_qk_norm():
    """Qwen3's attention (32 query heads of 128 sharing 4 key/value heads, on a 2048-wide model, RMSNorm on each
    head's q and k), small: the projections' shapes, and the output against the same weights run through plain
    multi-head SDPA with each key/value head repeated for its queries."""
    from toolkit.models.transformer import apply_rope, rope_cache

    cfg = ModelConfig(dim=32, n_heads=4, n_kv_heads=2, attention_head_dim=16, qk_norm=True)
    attn = tk.transforms.get_module(tk.build_model(cfg), "layers.0.attention")
    assert (attn.wq.weight.shape, attn.wk.weight.shape, attn.wv.weight.shape) == ((64, 32), (32, 32), (32, 32))
    assert attn.wo.weight.shape == (32, 64) and attn.q_norm.weight.shape == attn.k_norm.weight.shape == (16,)
    torch.manual_seed(1)
    x, rope = torch.randn(2, 8, 32), rope_cache(8, 16)
    with torch.no_grad():
        attn.q_norm.weight.uniform_(0.5, 1.5)  # not ones: the norm's weight must reach the output
        q = attn.q_norm(attn.wq(x).view(2, 8, 4, 16))
        k = attn.k_norm(attn.wk(x).view(2, 8, 2, 16)).repeat_interleave(2, dim=2)
        v = attn.wv(x).view(2, 8, 2, 16).repeat_interleave(2, dim=2)
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        o = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True)
        torch.testing.assert_close(attn(x, rope), attn.wo(o.transpose(1, 2).reshape(2, 8, 64)))
    with pytest.raises(ConfigError, match="ModelConfig.n_kv_heads"):
        ModelConfig(n_heads=4, n_kv_heads=3)
    with pytest.raises(ConfigError, match="ModelConfig.n_kv_heads.*fused wqkv"):
        ModelConfig(n_kv_heads=2, layout="torchtitan_main")
    assert "n_kv_heads" not in ModelConfig().to_dict() and ModelConfig.from_dict(cfg.to_dict()) == cfg
