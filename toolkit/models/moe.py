"""Token-choice top-k MoE in torchtitan 0.3.0's, main's (fused `w13`, `w2`) or 2025's layout, with main's remat regions.

Shape legend (suffixes on tensor names):
    B batch, S sequence, D model dim, T = B·S tokens, E routed experts, K top-k,
    N = T·K routed rows (token copies, sorted by expert), F expert hidden dim.

Remat regions (see `regions.py`; plain calls unless ACConfig.of(mode="remat") configured the block): `<fqn>.linear`
per Linear, `<fqn>.grouped_mm` per grouped matmul (0.3.0's inner experts name theirs after main's,
`moe.routed_experts.w13.grouped_mm` for w1_EFD and w3_EFD together and `moe.routed_experts.w2.grouped_mm`, so
main's patterns apply unchanged), the fixed kept regions `routing_decision` and `moe.shared_add`, and a
`needs(...)` (main's `recompute_needs_tensor`) before every bare op that reads a region's output.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from .. import compat
from . import regions
from .config import ModelConfig
from .local_compile import local_compile
from .regions import qualified

# torchtitan main sets 16 on its fused activations: one graph per hidden size, grad mode and static/dynamic row
# count ("DeepSeek-V3 at TP8 needs 10"); Dynamo's default is 8.
GLU_RECOMPILE_LIMIT = 16


@local_compile("swiglu", recompile_limit=GLU_RECOMPILE_LIMIT)
def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """`silu(gate) * up`, torchtitan main's `SwiGLU` (a `@local_compile("swiglu")` function there too)."""
    compat.mark_static(gate, -1)
    compat.mark_static(up, -1)
    return F.silu(gate) * up


class SwiGLU:
    """main's `moe.routed_experts.activation_fn`: a plain callable, not a module (no parameters)."""

    def __call__(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return swiglu(gate, up)


class Linear(nn.Linear):
    """`nn.Linear` whose projection is the remat region `<fqn>.linear`; `num_linears > 1` stacks projections as
    torchtitan main's Linear does (weight [n, out, in], output [..., n, out])."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, num_linears: int = 1):
        super().__init__(in_features, num_linears * out_features, bias=bias)
        self.num_linears = num_linears
        if num_linears > 1:
            self.weight = nn.Parameter(self.weight.detach().unflatten(0, (num_linears, out_features)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.num_linears == 1:
            return regions.region(self, "linear", F.linear, x, self.weight, self.bias)
        out = regions.region(self, "linear", F.linear, x, self.weight.flatten(0, -2), self.bias)
        return out.unflatten(-1, self.weight.shape[:-1])

    def remat_regions(self, fqn: str) -> list[str]:
        return [qualified(fqn, "linear")]


class FeedForward(nn.Module):
    """SwiGLU FFN for dense blocks and shared experts: `w2(swiglu(w1 x, w3 x))` (0.3.0 and 2025 layouts) or
    `w2(swiglu(*w13 x))` with one stacked `w13` [2, F, D] (main's layout)."""

    def __init__(self, dim: int, hidden: int, fused: bool = False):
        super().__init__()
        self.fused = fused
        if fused:
            self.w13 = Linear(dim, hidden, num_linears=2)
            self.w2 = Linear(hidden, dim)
        else:
            self.w1 = Linear(dim, hidden)
            self.w2 = Linear(hidden, dim)
            self.w3 = Linear(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            gate, up = self.w13(x).unbind(-2)
        else:
            gate, up = self.w1(x), self.w3(x)
        regions.needs(self, gate, up)  # the activation reads both projections with bare ops
        out = self.w2(swiglu(gate, up))
        # main's FeedForward marks its output too: its consumer (an add, a gate) lies outside this module.
        regions.needs(self, out)
        return out

    def projections(self) -> list[nn.Linear]:
        return [self.w13, self.w2] if self.fused else [self.w1, self.w2, self.w3]


class _FP32Gate(torch.autograd.Function):
    """torchtitan main's `RouterGateLinear` off CUDA: both operands promoted to float32, a float32 output, and
    the backward's matmuls in float32 (the gradients cast back to the operands' dtypes)."""

    @staticmethod
    def forward(ctx, x_TD: torch.Tensor, weight_ED: torch.Tensor) -> torch.Tensor:
        x32_TD, w32_ED = x_TD.float(), weight_ED.float()
        ctx.save_for_backward(x32_TD, w32_ED)
        ctx.dtypes = x_TD.dtype, weight_ED.dtype
        return torch.mm(x32_TD, w32_ED.T)

    @staticmethod
    def backward(ctx, grad_TE: torch.Tensor):
        x32_TD, w32_ED = ctx.saved_tensors
        g32_TE = grad_TE.float()
        return torch.mm(g32_TE, w32_ED).to(ctx.dtypes[0]), torch.mm(g32_TE.T, x32_TD).to(ctx.dtypes[1])


class TokenChoiceTopKRouter(nn.Module):
    """Scores tokens against experts; the bias and the noise steer selection only, never the routing weights.

    In main's layout the gate computes in float32 (`RouterGateLinear`'s fp32 output) and the router owns the
    `tokens_per_expert_E` buffer and returns a routing map; in 0.3.0's it returns the counts per expert."""

    tokens_per_expert_E: torch.Tensor  # a buffer, in main's layout only (registered in `__init__`)

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.main = cfg.layout == "torchtitan_main"
        self.gate = Linear(cfg.dim, cfg.n_experts)
        self.n_experts, self.top_k = cfg.n_experts, cfg.top_k
        self.score_func, self.route_norm, self.route_scale = cfg.score_func, cfg.route_norm, cfg.route_scale
        self.noise = cfg.router_noise
        self.token_count = cfg.token_count
        if self.main:
            self.register_buffer(
                "tokens_per_expert_E", torch.zeros(cfg.n_experts, dtype=torch.float32), persistent=False
            )

    @staticmethod
    def _fp32_gate(x_TD: torch.Tensor, weight_ED: torch.Tensor) -> torch.Tensor:
        return _FP32Gate.apply(x_TD, weight_ED)

    def _select(self, scores_TE: torch.Tensor, expert_bias_E: torch.Tensor | None) -> torch.Tensor:
        """The routing decision: top-k of the (biased, noised) scores."""
        select_TE = scores_TE if expert_bias_E is None else scores_TE + expert_bias_E
        if self.noise > 0 and self.training:
            # RNG in the forward: a recompute that re-ran it would re-route (C11); the kept routing_decision
            # region never re-runs.
            select_TE = select_TE + self.noise * torch.rand_like(select_TE)
        return torch.topk(select_TE, k=self.top_k, dim=-1, sorted=False).indices

    def forward(self, x_TD: torch.Tensor, expert_bias_E: torch.Tensor | None = None):
        if self.main:
            # The weight goes in as an argument, as main's Linear passes it to its region.
            logits_TE = regions.region(self.gate, "linear", self._fp32_gate, x_TD, self.gate.weight)
        else:
            logits_TE = self.gate(x_TD)
        regions.needs(self, logits_TE)  # the score function reads the gate's output with a bare op
        logits_TE = logits_TE.float()
        scores_TE = torch.sigmoid(logits_TE) if self.score_func == "sigmoid" else F.softmax(logits_TE, dim=-1)
        # Kept under every policy, and named as main names it (unqualified): replay never re-routes.
        expert_ids_TK = regions.kept(self, "routing_decision", self._select, scores_TE, expert_bias_E)
        regions.needs(self, expert_ids_TK)
        weights_TK = scores_TE.gather(-1, expert_ids_TK)
        if self.route_norm:
            weights_TK = weights_TK / (weights_TK.sum(dim=-1, keepdim=True) + 1e-20)
        weights_TK = weights_TK * self.route_scale
        if not self.main:
            return weights_TK, expert_ids_TK, self._count(expert_ids_TK)
        routing_map_TE = torch.zeros_like(scores_TE, dtype=torch.bool).scatter_(-1, expert_ids_TK, True)
        if self.training and not regions.replaying(self):
            with torch.no_grad():
                # Counted on the original forward only (main: "token-count accumulation explicitly ignores
                # checkpoint replay"); any other recompute repeats the add (C12).
                self.tokens_per_expert_E.add_(routing_map_TE.sum(dim=0))
        return weights_TK, expert_ids_TK, routing_map_TE

    def _count(self, expert_ids_TK: torch.Tensor) -> torch.Tensor:
        """Tokens per expert as int64 [E]; the three methods differ only in what the compiler sees."""
        if self.token_count == "bincount":
            return torch.bincount(expert_ids_TK.flatten(), minlength=self.n_experts)
        if self.token_count == "histc":
            return torch.histc(expert_ids_TK.flatten().float(), bins=self.n_experts, min=0, max=self.n_experts).to(
                torch.int64
            )
        T = expert_ids_TK.shape[0]
        map_TE = torch.zeros(T, self.n_experts, dtype=torch.int64, device=expert_ids_TK.device)
        map_TE = map_TE.scatter(1, expert_ids_TK, 1)
        return map_TE.sum(dim=0)

    def remat_regions(self, fqn: str) -> list[str]:
        return ["routing_decision"]


class _Experts(nn.Module):
    """E SwiGLU experts as 3-D weights [E, F, D] / [E, D, F], in four implementations."""

    bf16_grouped_mm = False
    """torchtitan 0.3.0 always runs `_grouped_mm` in bfloat16 (so an fp32 model compiles on CPU)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.impl = cfg.experts_impl
        self.n_experts = cfg.n_experts

    def weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def owner(self, fqn: str) -> str:
        """The fqn the regions are named after (main's `routed_experts`)."""
        return fqn

    def _name(self, local: str, e: int | None = None):  # formatted lazily: Dynamo would specialise an f-string's e
        return lambda fqn: qualified(self.owner(fqn), local if e is None else f"{local}{e}")

    def remat_regions(self, fqn: str) -> list[str]:
        base = self.owner(fqn)
        if self.impl == "grouped_mm":
            return [qualified(base, "w13.grouped_mm"), qualified(base, "w2.grouped_mm")]
        return [qualified(base, f"{w}.expert{e}") for e in range(self.n_experts) for w in ("w13", "w2")]

    def forward(self, x_ND: torch.Tensor, counts_E: torch.Tensor, expert_ids_N: torch.Tensor) -> torch.Tensor:
        """`x_ND` rows are sorted by expert; `counts_E` rows belong to expert 0, then 1, …"""
        if self.impl == "for_loop":
            return self._for_loop(x_ND, counts_E)
        if self.impl == "grouped_mm":
            return self._grouped_mm(x_ND, counts_E)
        if self.impl == "masked":
            return self._masked(x_ND, expert_ids_N)
        return self._nonzero(x_ND, expert_ids_N)

    @staticmethod
    def _gate_up(x_nD: torch.Tensor, w1_FD: torch.Tensor, w3_FD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.matmul(x_nD, w1_FD.transpose(-2, -1)), torch.matmul(x_nD, w3_FD.transpose(-2, -1))

    @staticmethod
    def _down(h_nF: torch.Tensor, w2_DF: torch.Tensor) -> torch.Tensor:
        return torch.matmul(h_nF, w2_DF.transpose(-2, -1))

    def _swiglu(self, x_nD: torch.Tensor, e: int) -> torch.Tensor:
        # Weights go into the regions as arguments, as main's linears pass them.
        w1, w2, w3 = self.weights()
        gate, up = regions.region(self, self._name("w13.expert", e), self._gate_up, x_nD, w1[e], w3[e])
        regions.needs(self, gate, up)
        out = regions.region(self, self._name("w2.expert", e), self._down, swiglu(gate, up), w2[e])
        regions.needs(self, out)
        return out

    def _for_loop(self, x_ND, counts_E):
        # Data-dependent: `.tolist()` is a host sync and, under compile, a graph break or unbacked symints.
        counts = counts_E.tolist()
        chunks = torch.split(x_ND, counts, dim=0)
        return torch.cat([self._swiglu(chunk, e) for e, chunk in enumerate(chunks)], dim=0)

    def _grouped_gate_up(self, x, w1_EFD, w3_EFD, offsets_E):
        """w1 and w3 as one region: main's fused `w13` (same bytes saved, the same pattern matches it)."""
        if self.bf16_grouped_mm:
            w1_EFD, w3_EFD = w1_EFD.bfloat16(), w3_EFD.bfloat16()
        return (
            torch._grouped_mm(x, w1_EFD.transpose(-2, -1), offs=offsets_E),
            torch._grouped_mm(x, w3_EFD.transpose(-2, -1), offs=offsets_E),
        )

    def _grouped_down(self, h_NF, w2_EDF, offsets_E):
        # The cast lies inside the region, as in main's GroupedLinear: a kept w2 keeps its bfloat16 copy.
        w2_EDF = w2_EDF.bfloat16() if self.bf16_grouped_mm else w2_EDF
        return torch._grouped_mm(h_NF, w2_EDF.transpose(-2, -1), offs=offsets_E)

    def _grouped_mm(self, x_ND, counts_E):
        w1, w2, w3 = self.weights()
        offsets_E = torch.cumsum(counts_E, dim=0, dtype=torch.int32)
        x = x_ND.bfloat16() if self.bf16_grouped_mm else x_ND
        gate_NF, up_NF = regions.region(self, self._name("w13.grouped_mm"), self._grouped_gate_up, x, w1, w3, offsets_E)
        regions.needs(self, gate_NF, up_NF)
        out_ND = regions.region(
            self, self._name("w2.grouped_mm"), self._grouped_down, swiglu(gate_NF, up_NF), w2, offsets_E
        )
        regions.needs(self, out_ND)
        return out_ND.type_as(x_ND)

    def _masked(self, x_ND, expert_ids_N):
        # Static shapes: every expert runs on every row and a mask keeps the rows it owns.
        out_ND = torch.zeros_like(x_ND)
        for e in range(self.n_experts):
            mask_N1 = (expert_ids_N == e).unsqueeze(-1).to(x_ND.dtype)
            out_ND = out_ND + self._swiglu(x_ND, e) * mask_N1
        return out_ND

    def _nonzero(self, x_ND, expert_ids_N):
        out_ND = torch.zeros_like(x_ND)
        for e in range(self.n_experts):
            rows_n = torch.nonzero(expert_ids_N == e).squeeze(-1)
            out_ND = out_ND.index_add(0, rows_n, self._swiglu(x_ND[rows_n], e))
        return out_ND


class GroupedExperts(_Experts):
    """torchtitan 0.3.0's `inner_experts`: weights `w1_EFD`, `w2_EDF`, `w3_EFD`; `_grouped_mm` in bfloat16."""

    bf16_grouped_mm = True

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        E, D, Fe = cfg.n_experts, cfg.dim, cfg.moe_hidden
        self.w1_EFD = nn.Parameter(torch.empty(E, Fe, D))
        self.w2_EDF = nn.Parameter(torch.empty(E, D, Fe))
        self.w3_EFD = nn.Parameter(torch.empty(E, Fe, D))

    def weights(self):
        return self.w1_EFD, self.w2_EDF, self.w3_EFD

    def owner(self, fqn: str) -> str:
        # Named after `moe.routed_experts`, main's home of w13/w2, not after `inner_experts`.
        return fqn[: -len(".inner_experts")] if fqn.endswith(".inner_experts") else fqn


class LegacyGroupedExperts(_Experts):
    """The 2025 layout's `moe.experts`: weights `w1`, `w2`, `w3`, `_grouped_mm` in the model's dtype."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        E, D, Fe = cfg.n_experts, cfg.dim, cfg.moe_hidden
        self.w1 = nn.Parameter(torch.empty(E, Fe, D))
        self.w2 = nn.Parameter(torch.empty(E, D, Fe))
        self.w3 = nn.Parameter(torch.empty(E, Fe, D))

    def weights(self):
        return self.w1, self.w2, self.w3


class GroupedLinear(nn.Module):
    """torchtitan main's `GroupedLinear`: one `weight` [E, (n,) O, I]; the grouped matmul, in bfloat16, is the
    region `<fqn>.grouped_mm` (the weight's bfloat16 copy is made inside it, so a kept region keeps it)."""

    def __init__(self, groups: int, in_features: int, out_features: int, num_linears: int = 1):
        super().__init__()
        shape = (out_features,) if num_linears == 1 else (num_linears, out_features)
        self.weight = nn.Parameter(torch.empty(groups, *shape, in_features))

    @staticmethod
    def _grouped_mm(input_RI: torch.Tensor, weight_EOI: torch.Tensor, offsets_E: torch.Tensor) -> torch.Tensor:
        return torch._grouped_mm(input_RI, weight_EOI.bfloat16().transpose(-2, -1), offs=offsets_E)

    def forward(self, input_RI: torch.Tensor, offsets_E: torch.Tensor) -> torch.Tensor:
        output_shape = self.weight.shape[1:-1]
        output_RO = regions.region(
            self, "grouped_mm", self._grouped_mm, input_RI, self.weight.flatten(1, -2), offsets_E
        )
        return output_RO.reshape(*output_RO.shape[:-1], *output_shape)

    def remat_regions(self, fqn: str) -> list[str]:
        return [qualified(fqn, "grouped_mm")]


class LocalTokenDispatcher:
    """Reorders token copies by expert and back, applying the routing weights on the way back (torchtitan's
    EP=1 dispatcher: a plain object, not a module — it has no parameters or buffers)."""

    def __init__(self, top_k: int):
        self.top_k = top_k

    def dispatch(
        self, x_TD: torch.Tensor, weights_TK: torch.Tensor, expert_ids_TK: torch.Tensor, with_ids: bool = True
    ):
        """Rows sorted by expert, their tokens, their weights and (`with_ids`, for the experts that need them)
        their experts; main's dispatcher returns no ids."""
        order_N = torch.argsort(expert_ids_TK.flatten(), stable=True)
        token_N = order_N // self.top_k
        ids_N = expert_ids_TK.flatten()[order_N] if with_ids else None
        return x_TD[token_N], token_N, weights_TK.flatten()[order_N].unsqueeze(-1), ids_N

    def combine(
        self, out_ND: torch.Tensor, token_N: torch.Tensor, weights_N1: torch.Tensor, x_TD: torch.Tensor
    ) -> torch.Tensor:
        out_ND = (out_ND.float() * weights_N1).to(x_TD.dtype)
        return torch.zeros_like(x_TD).index_add(0, token_N, out_ND)


class RoutedExperts(nn.Module):
    """torchtitan 0.3.0's `moe.routed_experts`: `token_dispatcher` (dispatch, combine) around `inner_experts`."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.inner_experts = GroupedExperts(cfg)
        self.token_dispatcher = LocalTokenDispatcher(cfg.top_k)

    def forward(self, x_TD, weights_TK, expert_ids_TK, counts_E):
        routed_ND, token_N, weights_N1, ids_N = self.token_dispatcher.dispatch(x_TD, weights_TK, expert_ids_TK)
        out_ND = self.inner_experts(routed_ND, counts_E, ids_N)
        return self.token_dispatcher.combine(out_ND, token_N, weights_N1, x_TD)

    def weights(self) -> tuple[torch.Tensor, ...]:
        return self.inner_experts.weights()


class MainRoutedExperts(nn.Module):
    """torchtitan main's `moe.routed_experts` (its names from models/common/moe.py at 00a4c147699f): dispatch → `w13`
    grouped linear [E, 2, F, D] → `activation_fn` (bare) → `w2` [E, D, F] → combine (bare). Its regions are the
    GroupedLinears' own `<fqn>.grouped_mm`, as docs/remat.md at 03d9819f3416 has them; that moe.py wraps w13 and w2
    in outer regions instead (older remat code, see tests/test_torchtitan_main.py)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        E, D, Fe = cfg.n_experts, cfg.dim, cfg.moe_hidden
        self.w13 = GroupedLinear(E, D, Fe, num_linears=2)
        self.w2 = GroupedLinear(E, Fe, D)
        self.activation_fn = SwiGLU()
        self.token_dispatcher = LocalTokenDispatcher(cfg.top_k)

    def forward(self, x_TD, weights_TK, expert_ids_TK, counts_E):
        routed_ND, token_N, weights_N1, _ = self.token_dispatcher.dispatch(
            x_TD, weights_TK, expert_ids_TK, with_ids=False
        )
        offsets_E = torch.cumsum(counts_E, dim=0, dtype=torch.int32)
        gate_NF, up_NF = self.w13(routed_ND.bfloat16(), offsets_E).unbind(dim=-2)
        regions.needs(self, gate_NF, up_NF)
        hidden_NF = self.activation_fn(gate_NF, up_NF)
        out_ND = self.w2(hidden_NF, offsets_E)
        regions.needs(self, out_ND)
        return self.token_dispatcher.combine(out_ND.type_as(routed_ND), token_N, weights_N1, x_TD)

    def weights(self) -> tuple[torch.Tensor, ...]:
        return self.w13.weight, self.w2.weight


def _fsdp_pre_hook(module, args):
    """Does nothing, but Dynamo may not trace it (`_stand_in_fsdp_pre_hook`): like FSDP2's pre-forward hook, it
    breaks the graph."""
    return None


_disabled_hook: list = []


def _stand_in_fsdp_pre_hook():
    """`_fsdp_pre_hook` behind `torch.compiler.disable`, made once, when a model first asks for it (disabling
    imports Dynamo, which building any other model never needs)."""
    if not _disabled_hook:
        _disabled_hook.append(torch.compiler.disable(_fsdp_pre_hook))
    return _disabled_hook[0]


class MoE(nn.Module):
    """Router → routed experts (reorder by expert → experts → weight and scatter back) → plus shared experts.

    Layout "torchtitan_0_3_0": `routed_experts.inner_experts`, buffers `expert_bias_E` (with load balancing) and
    `tokens_per_expert_E` (always, counted in training, as in torchtitan 0.3.0). Layout "torchtitan_main":
    `routed_experts.w13` / `w2`, `expert_bias_E` here and `router.tokens_per_expert_E`. Layout "torchtitan_2025":
    `experts` and buffers `expert_bias` / `tokens_per_expert` (only with load balancing)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.layout = cfg.layout
        self.router = TokenChoiceTopKRouter(cfg)
        if cfg.layout == "torchtitan_0_3_0":
            self.routed_experts: RoutedExperts | MainRoutedExperts = RoutedExperts(cfg)
        elif cfg.layout == "torchtitan_main":
            self.routed_experts = MainRoutedExperts(cfg)
        else:
            self.experts = LegacyGroupedExperts(cfg)
            self.dispatcher = LocalTokenDispatcher(cfg.top_k)
        hidden = cfg.moe_hidden * cfg.n_shared_experts
        self.shared_experts = FeedForward(cfg.dim, hidden, fused=cfg.layout == "torchtitan_main") if hidden else None
        self.top_k, self.n_experts = cfg.top_k, cfg.n_experts
        self.load_balance = cfg.load_balance
        bias, counter = self.buffer_names(cfg.layout)
        if cfg.load_balance:
            self.register_buffer(bias, torch.zeros(cfg.n_experts, dtype=torch.float32), persistent=True)
        else:
            setattr(self, bias, None)
        if cfg.layout == "torchtitan_main":
            pass  # the router owns the counter
        elif cfg.load_balance or cfg.layout == "torchtitan_0_3_0":
            self.register_buffer(counter, torch.zeros(cfg.n_experts, dtype=torch.float32), persistent=False)
        else:
            setattr(self, counter, None)
        if cfg.experts_graph_break:
            self.routed_experts_module().register_forward_pre_hook(_stand_in_fsdp_pre_hook())

    @staticmethod
    def buffer_names(layout: str) -> tuple[str, str]:
        """`(expert bias, tokens per expert)` buffer names of a layout (main's counter lives in `router`)."""
        return (
            ("expert_bias", "tokens_per_expert")
            if layout == "torchtitan_2025"
            else ("expert_bias_E", "tokens_per_expert_E")
        )

    def routed_experts_module(self) -> _Experts | MainRoutedExperts:
        """The module holding the expert weights (`routed_experts.inner_experts`, main's `routed_experts`, or
        `experts`)."""
        if self.layout == "torchtitan_0_3_0":
            return cast(RoutedExperts, self.routed_experts).inner_experts
        return cast(MainRoutedExperts, self.routed_experts) if self.layout == "torchtitan_main" else self.experts

    @property
    def expert_bias_buffer(self) -> torch.Tensor | None:
        return getattr(self, self.buffer_names(self.layout)[0])

    @property
    def tokens_per_expert_buffer(self) -> torch.Tensor | None:
        owner = self.router if self.layout == "torchtitan_main" else self
        return getattr(owner, self.buffer_names(self.layout)[1])

    def remat_regions(self, fqn: str) -> list[str]:
        return [qualified(fqn, "shared_add")] if self.shared_experts is not None else []

    def forward(self, x_BSD: torch.Tensor) -> torch.Tensor:
        B, S, D = x_BSD.shape
        x_TD = x_BSD.reshape(-1, D)
        if self.layout == "torchtitan_main":
            weights_TK, expert_ids_TK, routing_map_TE = self.router(x_TD, self.expert_bias_buffer)
            counts_E = routing_map_TE.sum(dim=0)
        else:
            weights_TK, expert_ids_TK, counts_E = self.router(x_TD, self.expert_bias_buffer)
            counter = self.tokens_per_expert_buffer
            if counter is not None and self.training and not regions.replaying(self):
                with torch.no_grad():
                    # An in-place side effect in the forward: any recompute but torch_remat's repeats it (C12).
                    counter.add_(counts_E.to(counter.dtype))
        if self.layout == "torchtitan_2025":
            routed_ND, token_N, weights_N1, ids_N = self.dispatcher.dispatch(x_TD, weights_TK, expert_ids_TK)
            out_TD = self.dispatcher.combine(self.experts(routed_ND, counts_E, ids_N), token_N, weights_N1, x_TD)
        else:
            out_TD = self.routed_experts(x_TD, weights_TK, expert_ids_TK, counts_E)
        if self.shared_experts is not None:
            # A trailing add, kept under every policy: it saves nothing, so replay skips it and its inputs need
            # no marker (main's `moe.shared_add`).
            out_TD = regions.kept(
                self, regions.region_name(self, "shared_add"), torch.add, out_TD, self.shared_experts(x_TD)
            )
        return out_TD.reshape(B, S, D)

    def init_weights(self, std: float = 0.02) -> None:
        """Draws in 0.3.0's order and shapes whatever the layout (main's fused weights take the same values), so
        one seed gives the same model in every layout."""
        if self.layout == "torchtitan_main":
            routed = cast(MainRoutedExperts, self.routed_experts)  # main's layout built these
            w13, w2 = routed.w13.weight, routed.w2.weight
            w1_EFD, w2_EDF, w3_EFD = torch.empty_like(w13[:, 0]), torch.empty_like(w2), torch.empty_like(w13[:, 1])
            for p in (w1_EFD, w2_EDF, w3_EFD):
                nn.init.trunc_normal_(p, std=std)
            with torch.no_grad():
                w13[:, 0].copy_(w1_EFD)
                w13[:, 1].copy_(w3_EFD)
                w2.copy_(w2_EDF)
        else:
            for p in self.routed_experts_module().weights():
                nn.init.trunc_normal_(p, std=std)
        nn.init.trunc_normal_(self.router.gate.weight, std=std)
        if self.shared_experts is not None:
            init_feed_forward(self.shared_experts, std)
        for buf in (self.expert_bias_buffer, self.tokens_per_expert_buffer):
            if buf is not None:
                buf.zero_()


@torch.no_grad()
def init_feed_forward(ffn: FeedForward, std: float) -> None:
    """w1, w2, w3 drawn in that order; a fused w13 [2, F, D] holds w1 then w3."""
    if not ffn.fused:
        for lin in (ffn.w1, ffn.w2, ffn.w3):
            nn.init.trunc_normal_(lin.weight, std=std)
        return
    w1, w3 = torch.empty_like(ffn.w13.weight[0]), torch.empty_like(ffn.w13.weight[1])
    nn.init.trunc_normal_(w1, std=std)
    nn.init.trunc_normal_(ffn.w2.weight, std=std)
    nn.init.trunc_normal_(w3, std=std)
    ffn.w13.weight[0].copy_(w1)
    ffn.w13.weight[1].copy_(w3)


EXPERTS_ATTRS = ("routed_experts", "experts")
"""Where an MoE keeps its routed experts, by attribute: `routed_experts` (torchtitan 0.3.0's dispatch and inner experts,
main's), `experts` (the 2025 layout, transformers' families). The one home of the experts' location."""


def experts_attr(layout: str) -> str:
    """The attribute holding a toolkit MoE's routed experts in `layout`."""
    return "experts" if layout == "torchtitan_2025" else "routed_experts"


def experts_child(moe: nn.Module) -> nn.Module | None:
    """The routed experts of any MoE module (the toolkit's, torchtitan's, transformers'), or None."""
    return next((c for a in EXPERTS_ATTRS if isinstance(c := getattr(moe, a, None), nn.Module)), None)
