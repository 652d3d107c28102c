"""The `torchtitan_main` recipe against torchtitan main's code, rebuilt here apart from the toolkit's model.

main cannot be installed (no complete tree after 2026-08, a nightly torch, torch_remat from git), so its MoE block
is written below from its files, read in repository pytorch/torchtitan at:
- `torchtitan/distributed/activation_checkpoint.py`, `torchtitan/protocols/module.py`, `docs/remat.md` at
  03d9819f3416 (the policies, `configure_remat_regions` / `remat_should_recompute`, the trailing-add regions
  `ffn_residual` and `moe.shared_add`, token counting that ignores replay);
- `torchtitan/models/common/moe.py` at 00a4c147699f (`RoutedExperts` with fused `w13` [E, 2, F, D] and `w2`
  `GroupedLinear`s, `TokenChoiceTopKRouter` with the unqualified `routing_decision` region);
- `torchtitan/distributed/local_compile.py` at 2350f753348e (`@local_compile`: `torch.compile(fn,
  fullgraph=True, **kw)`), with SwiGLU's `recompile_limit=16` from main's `models/common/activation.py`.
Where main's files disagree, this block follows the remat design of docs/remat.md, activation_checkpoint.py and
protocols/module.py at 03d9819f3416, which is consistent in itself, and not moe.py at 00a4c147699f, which is
older remat code (stored files do not order the two commits):
- moe.py wraps each routed projection in an outer region, `moe.routed_experts.w13` / `.w2`, and its
  GroupedLinear declares none; the docs have GroupedLinear declare `<fqn>.grouped_mm` and forbid wrapping it again.
  Under the selective config's `*routed_experts.w13.*` the outer name matches nothing (fnmatch), so that moe.py
  would save w13; the docs' `moe.routed_experts.w13.grouped_mm` is what the pattern recomputes.
- moe.py adds the shared expert with a bare `+` and counts tokens on every forward, replay included (its TODO
  says AC double counts); the docs make the add the kept region `moe.shared_add` and the count ignore replay.
- moe.py reads the router gate's output with a bare op and no `recompute_needs_tensor`; the marker the docs
  require is added. The weights are the toolkit's main-layout model's, loaded by name with `strict=True` (so the
names are main's too). The truth is `_truth.Truth` (outer saved-tensor hooks, parameters excluded); recompute is
counted with torch_remat's own `is_recomputing()`; graphs with a counting backend. On a +cpu torch build the
reference borrows the toolkit's stand-in for torch_remat's placeholder (C31), which fabricates only the replay
value of an output nothing reads.
"""

from __future__ import annotations

import contextlib
import fnmatch

import pytest
import torch
import torch.nn.functional as F
from _helpers import extra
from _truth import Truth
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import toolkit as tk
from toolkit.transforms.settings import torch_settings

remat = extra("torch_remat")

# Shape suffixes: B batch, S sequence, T = B·S tokens, D model dim, H heads, Dh head dim, E experts, K top-k,
# N = T·K routed rows, F expert hidden, V vocabulary.


class Module(nn.Module):
    """protocols/module.py: the remat naming and policy every module of a block carries."""

    _remat_module_fqn = ""
    _remat_save_patterns: tuple[str, ...] = ()
    _remat_recompute_patterns: tuple[str, ...] = ()

    def remat_region_name(self, local_name: str) -> str:
        return f"{self._remat_module_fqn}.{local_name}" if self._remat_module_fqn else local_name

    def remat_should_recompute(self, local_name: str) -> bool:
        name = self.remat_region_name(local_name)
        return not any(fnmatch.fnmatch(name, p) for p in self._remat_save_patterns) or any(
            fnmatch.fnmatch(name, p) for p in self._remat_recompute_patterns
        )

    def configure_remat_regions(self, save, recompute=()) -> None:
        for fqn, m in self.named_modules():
            if isinstance(m, Module):
                m._remat_module_fqn, m._remat_save_patterns, m._remat_recompute_patterns = (
                    fqn,
                    tuple(save),
                    tuple(recompute),
                )


COMPILED: dict[str, object] = {}


def local(name):
    """distributed/local_compile.py: the function, or its compiled twin once `bind` ran."""

    def deco(fn):
        def call(*a, **k):
            return COMPILED.get(name, fn)(*a, **k)

        call.reference = fn
        LOCAL[name] = fn
        return call

    return deco


LOCAL: dict[str, object] = {}
KWARGS = {"swiglu": {"recompile_limit": 16}}


@local("swiglu")
def swiglu(gate, up):
    if torch.compiler.is_compiling():
        torch._dynamo.mark_static(gate, -1)
        torch._dynamo.mark_static(up, -1)
    return F.silu(gate) * up


@local("cos_sin_rope")
def rope(q_BSHD, k_BSHD, cache):
    def one(x):
        cos, sin = cache[0][None, :, None, :].to(x.dtype), cache[1][None, :, None, :].to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    return one(q_BSHD), one(k_BSHD)


@local("loss")
def loss(logits_BSV, labels_BS):
    return F.cross_entropy(logits_BSV.flatten(0, 1).float(), labels_BS.flatten())


class Linear(nn.Linear, Module):
    """main's Linear: stacked projections, the projection is the region `<fqn>.linear`."""

    def __init__(self, i, o, num_linears=1):
        super().__init__(i, num_linears * o, bias=False)
        self.num_linears = num_linears
        if num_linears > 1:
            self.weight = nn.Parameter(self.weight.detach().unflatten(0, (num_linears, o)))

    def _linear(self, x, w, b):
        return F.linear(x, w, b)

    def forward(self, x):
        out = remat.region(
            self._linear, self.remat_region_name("linear"), recompute=self.remat_should_recompute("linear")
        )(x, self.weight.flatten(0, -2), self.bias)
        return out if self.num_linears == 1 else out.unflatten(-1, self.weight.shape[:-1])


class _GateFn(torch.autograd.Function):
    """linear.py's `_RouterGateLinearFunction`, portable path: fp32 operands, fp32 output."""

    @staticmethod
    def forward(ctx, x_TD, w_ED):
        x32, w32 = x_TD.float(), w_ED.float()
        ctx.save_for_backward(x32, w32)
        ctx.dtypes = x_TD.dtype, w_ED.dtype
        return torch.mm(x32, w32.T)

    @staticmethod
    def backward(ctx, g_TE):
        x32, w32 = ctx.saved_tensors
        g = g_TE.float()
        return torch.mm(g, w32).to(ctx.dtypes[0]), torch.mm(g.T, x32).to(ctx.dtypes[1])


class RouterGateLinear(Linear):
    def _linear(self, x, w, b):
        return _GateFn.apply(x, w)


class GroupedLinear(Module):
    def __init__(self, groups, i, o, num_linears=1):
        super().__init__()
        shape = (o,) if num_linears == 1 else (num_linears, o)
        self.weight = nn.Parameter(torch.empty(groups, *shape, i))

    def _grouped_mm(self, *, input_RI, weight_EOI, offsets_E):
        return torch._grouped_mm(input_RI, weight_EOI.bfloat16().transpose(-2, -1), offs=offsets_E)

    def forward(self, input_RI, offsets_E):
        out_shape = self.weight.shape[1:-1]
        out_RO = remat.region(
            self._grouped_mm, self.remat_region_name("grouped_mm"), recompute=self.remat_should_recompute("grouped_mm")
        )(input_RI=input_RI, weight_EOI=self.weight.flatten(1, -2), offsets_E=offsets_E)
        return out_RO.reshape(*out_RO.shape[:-1], *out_shape)


class Dispatcher:
    """The EP=1 token dispatcher: a plain object."""

    def __init__(self, K):
        self.K = K

    def dispatch(self, x_TD, scores_TK, ids_TK):
        order_N = torch.argsort(ids_TK.flatten(), stable=True)
        token_N = order_N // self.K
        return x_TD[token_N], (token_N, scores_TK.flatten()[order_N].unsqueeze(-1))

    def combine(self, out_ND, meta, x_TD):
        token_N, scores_N1 = meta
        return torch.zeros_like(x_TD).index_add(0, token_N, (out_ND.float() * scores_N1).to(x_TD.dtype))


class RoutedExperts(Module):
    def __init__(self, E, D, Fe, K):
        super().__init__()
        self.w13, self.w2 = GroupedLinear(E, D, Fe, num_linears=2), GroupedLinear(E, Fe, D)
        self.activation_fn, self.token_dispatcher = swiglu, Dispatcher(K)

    def forward(self, x_TD, scores_TK, ids_TK, counts_E):
        routed_ND, meta = self.token_dispatcher.dispatch(x_TD, scores_TK, ids_TK)
        offsets_E = torch.cumsum(counts_E, dim=0, dtype=torch.int32)
        gate_NF, up_NF = self.w13(routed_ND.bfloat16(), offsets_E).unbind(dim=-2)
        remat.recompute_needs_tensor(gate_NF, up_NF)
        out_ND = self.w2(self.activation_fn(gate_NF, up_NF), offsets_E)
        remat.recompute_needs_tensor(out_ND)
        return self.token_dispatcher.combine(out_ND.type_as(routed_ND), meta, x_TD)


class Router(Module):
    def __init__(self, D, E, K, route_scale=1.0):
        super().__init__()
        self.gate, self.K, self.route_scale = RouterGateLinear(D, E), K, route_scale
        self.register_buffer("tokens_per_expert_E", torch.zeros(E), persistent=False)

    def _select_experts(self, scores_TE, bias_E):
        return torch.topk(scores_TE + bias_E, k=self.K, dim=-1, sorted=False).indices

    def forward(self, x_TD, bias_E):
        logits_TE = self.gate(x_TD)
        remat.recompute_needs_tensor(logits_TE)  # docs/remat.md: a bare consumer (the score function) follows
        scores_TE = torch.sigmoid(logits_TE)
        ids_TK = remat.region(self._select_experts, "routing_decision", recompute=False)(scores_TE, bias_E)
        remat.recompute_needs_tensor(ids_TK)
        scores_TK = scores_TE.gather(dim=-1, index=ids_TK) * self.route_scale
        map_TE = torch.zeros_like(scores_TE, dtype=torch.bool).scatter_(-1, ids_TK, True)
        if self.training and not remat.is_recomputing():  # "ignores checkpoint replay"
            with torch.no_grad():
                self.tokens_per_expert_E.add_(map_TE.sum(dim=0))
        return scores_TK, ids_TK, map_TE


class FeedForward(Module):
    def __init__(self, D, Fs):
        super().__init__()
        self.w13, self.w2 = Linear(D, Fs, num_linears=2), Linear(Fs, D)

    def forward(self, x):
        gate, up = self.w13(x).unbind(-2)
        remat.recompute_needs_tensor(gate, up)
        out = self.w2(swiglu(gate, up))
        remat.recompute_needs_tensor(out)
        return out


class MoE(Module):
    def __init__(self, D, E, K, Fe, shared):
        super().__init__()
        self.routed_experts, self.router = RoutedExperts(E, D, Fe, K), Router(D, E, K)
        self.shared_experts = FeedForward(D, Fe * shared) if shared else None
        self.register_buffer("expert_bias_E", torch.zeros(E))

    def forward(self, x_BSD):
        B, S, D = x_BSD.shape
        x_TD = x_BSD.reshape(-1, D)
        scores_TK, ids_TK, map_TE = self.router(x_TD, self.expert_bias_E)
        out_TD = self.routed_experts(x_TD, scores_TK, ids_TK, map_TE.sum(dim=0))
        if self.shared_experts is not None:
            out_TD = remat.region(torch.add, self.remat_region_name("shared_add"), recompute=False)(
                out_TD, self.shared_experts(x_TD)
            )
        return out_TD.reshape(B, S, D)


class QKVLinear(Module):
    def __init__(self, D, H, Dh):
        super().__init__()
        self.H, self.Dh, self.wqkv = H, Dh, Linear(D, 3 * H * Dh)

    def forward(self, x_BSD):
        B, S, _ = x_BSD.shape
        qkv = self.wqkv(x_BSD)
        remat.recompute_needs_tensor(qkv)
        q, k, v = torch.split(qkv.view(B, S, self.H, 3, self.Dh), [1, 1, 1], dim=-2)
        return tuple(t.reshape(B, S, self.H, self.Dh).contiguous() for t in (q, k, v))


class Attention(Module):
    def __init__(self, D, H):
        super().__init__()
        self.qkv_linear, self.wo = QKVLinear(D, H, D // H), Linear(D, D)

    def inner_attention(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward(self, x_BSD, cache):
        B, S, D = x_BSD.shape
        q, k, v = self.qkv_linear(x_BSD)
        remat.recompute_needs_tensor(q, k)
        q, k = rope(q, k, cache)
        out_BHSD = remat.region(
            self.inner_attention,
            self.remat_region_name("inner_attention"),
            recompute=self.remat_should_recompute("inner_attention"),
        )(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        remat.recompute_needs_tensor(out_BHSD)
        return self.wo(out_BHSD.transpose(1, 2).reshape(B, S, D))


class Block(Module):
    def __init__(self, cfg):
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(cfg.dim, eps=1e-6), nn.RMSNorm(cfg.dim, eps=1e-6)
        self.attention = Attention(cfg.dim, cfg.n_heads)
        self.moe = MoE(cfg.dim, cfg.n_experts, cfg.top_k, cfg.moe_hidden, cfg.n_shared_experts)

    def forward(self, x, cache):
        attn_out = self.attention(self.attention_norm(x), cache)
        remat.recompute_needs_tensor(attn_out)
        x = x + attn_out
        return remat.region(torch.add, self.remat_region_name("ffn_residual"), recompute=False)(
            x, self.moe(self.ffn_norm(x))
        )


class Decoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.n_layers)})
        self.norm, self.lm_head = nn.RMSNorm(cfg.dim, eps=1e-6), nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.register_buffer("rope", torch.zeros(2, cfg.seq_len, cfg.head_dim // 2), persistent=False)

    def forward(self, tokens_BS):
        h = self.tok_embeddings(tokens_BS)
        cache = self.rope[:, : tokens_BS.shape[1]]  # the toolkit's cos/sin table, cut to the sequence
        for layer in self.layers.values():
            h = layer(h, cache)
        return self.lm_head(self.norm(h))


def apply_activation_remat(model, save, recompute):
    """distributed/activation_checkpoint.py's `apply_activation_remat`."""
    for layer_id, block in model.layers.named_children():
        block.configure_remat_regions(save, recompute)
        block.forward = remat.checkpoint(
            region_name=f"layers.{layer_id}", determinism_check="default", preserve_rng_state=False
        )(block.forward)


class CountRecompute(TorchDispatchMode):
    """Ops dispatched while torch_remat replays (its own flag); compiled graphs' insides are not dispatched
    eagerly, so, like the toolkit's counter, this sees only eager ops."""

    supports_higher_order_operators = True  # without it Dynamo would skip the local compiled functions

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __init__(self):
        super().__init__()
        self.ops = 0
        self.by_op: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if remat.is_recomputing():
            self.ops += 1
            self.by_op[str(func)] = self.by_op.get(str(func), 0) + 1
        return func(*args, **(kwargs or {}))


def main_reference(cfg, compiled: bool) -> dict:
    """main's model with main's selective policy: saved bytes (truth), recompute ops, graphs, loss, grads."""
    torch._dynamo.reset()
    source = tk.build_model(cfg.replace(layout="torchtitan_main"))
    model = Decoder(cfg)
    model.load_state_dict(source.state_dict(), strict=True)  # main's names, the toolkit's same-seed weights
    model.rope = source.rope
    model.train()
    apply_activation_remat(model, ["*"], ["*routed_experts.w13.*"])
    graphs = []

    def counting(gm, inputs):
        graphs.append(gm)
        return torch._dynamo.lookup_backend("aot_eager")(gm, inputs)

    COMPILED.clear()
    if compiled:
        for name, fn in LOCAL.items():
            COMPILED[name] = torch.compile(fn, fullgraph=True, backend=counting, **KWARGS.get(name, {}))
    batch = tk.make_batch(cfg)
    placeholders = (
        contextlib.nullcontext() if tk.compat.available("storage_placeholder") else tk.compat.remat_placeholders()
    )
    try:
        with placeholders:
            with Truth(model) as truth:
                logits = model(batch.tokens)
                saved = truth.bytes(logits)
            value = loss(logits, batch.labels)
            with CountRecompute() as counted:
                value.backward()
    finally:
        COMPILED.clear()
    grads = {n: p.grad for n, p in model.named_parameters()}
    counts = int(model.layers["0"].moe.router.tokens_per_expert_E.sum())
    return dict(
        saved=saved,
        recompute=counted.ops,
        by_op=counted.by_op,
        graphs=len(graphs),
        loss=value.item(),
        grads=grads,
        counted_tokens=counts,
    )


def toolkit_recipe(cfg, compiled: bool):
    model = tk.build_model(cfg)
    if compiled:
        tk.transforms.apply_recipe(model, "torchtitan_main")
    else:
        tk.apply_ac(model, tk.ACConfig.remat_selective())
    batch = tk.make_batch(cfg)
    report = tk.measure(model, batch.tokens, loss_fn=lambda out: tk.models.loss_fn(out, batch.labels), cold=True)
    with torch_settings(model), Truth(model) as truth:
        truth_bytes = truth.bytes(model(batch.tokens))
    tk.transforms.reset(model)
    return report, truth_bytes


# The research note's numbers for main's layout on this setup (dim 64, 2 MoE layers, 4 experts, top-2, seq 32,
# batch 2, fp32 parameters, bf16 grouped_mm): the toolkit's default ModelConfig.
NOTE_BYTES = {0: 350_976, 1: 449_280}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "local_compile"])
@pytest.mark.parametrize("shared", [0, 1])
def test_the_recipe_saves_recomputes_and_compiles_what_mains_code_does(shared, compiled):
    cfg = tk.ModelConfig(layout="torchtitan_main", n_shared_experts=shared)
    ref = main_reference(cfg, compiled)
    report, truth = toolkit_recipe(cfg, compiled)
    assert report.ok and report.numerics.grads_match is True
    assert ref["saved"] == truth == report.saved.total_bytes == NOTE_BYTES[shared]
    # main's replay count holds the machinery's own work too (checkpoint's detaches, kept regions' replays).
    assert report.recompute.ops + report.recompute.bookkeeping == ref["recompute"]
    assert 0 < report.recompute.ops < ref["recompute"]
    # Graphs: SwiGLU (one more for the shared expert's rows, a recompile), RoPE and the loss; no breaks.
    assert report.compile.graphs == ref["graphs"] == (3 + shared if compiled else 0)
    assert report.compile.graph_breaks == 0 and not report.compile.fell_back_to_eager
    # Token counting ignores the replay: T·K per block, once.
    assert ref["counted_tokens"] == cfg.batch * cfg.seq_len * cfg.top_k


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "local_compile"])
@pytest.mark.parametrize("shared", [0, 1])
def test_on_the_0_3_0_layout_the_recipe_saves_what_mains_layout_saves(shared, compiled):
    """w1_EFD + w3_EFD declared as main's w13 region: the same bytes and graphs as main's fused weights. Not the same
    replay: the 0.3.0 layout runs w1 and w3 as two grouped matmuls and joins them, so it replays more ops (292
    against 270 without a shared expert, eager)."""
    cfg = tk.ModelConfig(n_shared_experts=shared)
    report, truth = toolkit_recipe(cfg, compiled=compiled)
    ref = main_reference(cfg, compiled=compiled)
    assert report.ok and report.numerics.grads_match is True
    assert report.saved.total_bytes == truth == ref["saved"] == NOTE_BYTES[shared]
    assert report.compile.graphs == ref["graphs"] == (3 + shared if compiled else 0)


def test_the_reference_is_mains_model_step_for_step():
    """The rebuilt main and the toolkit's main layout compute the same step (loss and every gradient)."""
    cfg = tk.ModelConfig(layout="torchtitan_main")
    ref = main_reference(cfg, compiled=False)
    model = tk.build_model(cfg)
    tk.apply_ac(model, tk.ACConfig.remat_selective())
    batch = tk.make_batch(cfg)
    value = tk.train_step(model, batch)
    assert value.item() == pytest.approx(ref["loss"], abs=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref["grads"][name], rtol=1e-5, atol=1e-6)
    assert int(model.layers["0"].moe.router.tokens_per_expert_E.sum()) == ref["counted_tokens"]
    tk.transforms.reset(model)
