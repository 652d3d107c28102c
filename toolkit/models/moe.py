"""Token-choice top-k MoE laid out like torchtitan 0.3.0's (router, routed experts = token dispatcher + inner experts, shared experts), or like its 2025 layout (`moe.experts`).

Shape legend (suffixes on tensor names):
    B batch, S sequence, D model dim, T = B·S tokens, E routed experts, K top-k,
    N = T·K routed rows (token copies, sorted by expert), F expert hidden dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig


class FeedForward(nn.Module):
    """SwiGLU FFN `w2(silu(w1 x) * w3 x)`, used for dense blocks and for the shared experts."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TokenChoiceTopKRouter(nn.Module):
    """Scores tokens against experts; the bias and the noise steer selection only, never the routing weights."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate = nn.Linear(cfg.dim, cfg.n_experts, bias=False)
        self.n_experts, self.top_k = cfg.n_experts, cfg.top_k
        self.score_func, self.route_norm, self.route_scale = cfg.score_func, cfg.route_norm, cfg.route_scale
        self.noise = cfg.router_noise
        self.token_count = cfg.token_count

    def forward(self, x_TD: torch.Tensor, expert_bias_E: torch.Tensor | None = None):
        logits_TE = self.gate(x_TD).float()
        scores_TE = torch.sigmoid(logits_TE) if self.score_func == "sigmoid" else F.softmax(logits_TE, dim=-1)
        select_TE = scores_TE if expert_bias_E is None else scores_TE + expert_bias_E
        if self.noise > 0 and self.training:
            # RNG in the forward: recompute only matches the forward when the checkpoint restores the RNG state.
            select_TE = select_TE + self.noise * torch.rand_like(select_TE)
        _, expert_ids_TK = torch.topk(select_TE, k=self.top_k, dim=-1, sorted=False)
        weights_TK = scores_TE.gather(-1, expert_ids_TK)
        if self.route_norm:
            weights_TK = weights_TK / (weights_TK.sum(dim=-1, keepdim=True) + 1e-20)
        weights_TK = weights_TK * self.route_scale
        return weights_TK, expert_ids_TK, self._count(expert_ids_TK)

    def _count(self, expert_ids_TK: torch.Tensor) -> torch.Tensor:
        """Tokens per expert as int64 [E]; the three methods differ only in what the compiler sees."""
        if self.token_count == "bincount":
            return torch.bincount(expert_ids_TK.flatten(), minlength=self.n_experts)
        if self.token_count == "histc":
            return torch.histc(expert_ids_TK.flatten().float(), bins=self.n_experts, min=0,
                               max=self.n_experts).to(torch.int64)
        T = expert_ids_TK.shape[0]
        map_TE = torch.zeros(T, self.n_experts, dtype=torch.int64, device=expert_ids_TK.device)
        map_TE = map_TE.scatter(1, expert_ids_TK, 1)
        return map_TE.sum(dim=0)


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

    def forward(self, x_ND: torch.Tensor, counts_E: torch.Tensor, expert_ids_N: torch.Tensor) -> torch.Tensor:
        """`x_ND` rows are sorted by expert; `counts_E` rows belong to expert 0, then 1, …"""
        if self.impl == "for_loop":
            return self._for_loop(x_ND, counts_E)
        if self.impl == "grouped_mm":
            return self._grouped_mm(x_ND, counts_E)
        if self.impl == "masked":
            return self._masked(x_ND, expert_ids_N)
        return self._nonzero(x_ND, expert_ids_N)

    def _swiglu(self, x_nD: torch.Tensor, e: int) -> torch.Tensor:
        w1, w2, w3 = self.weights()
        h_nF = F.silu(torch.matmul(x_nD, w1[e].transpose(-2, -1))) * torch.matmul(x_nD, w3[e].transpose(-2, -1))
        return torch.matmul(h_nF, w2[e].transpose(-2, -1))

    def _for_loop(self, x_ND, counts_E):
        # Data-dependent: `.tolist()` is a host sync and, under compile, a graph break or unbacked symints.
        counts = counts_E.tolist()
        chunks = torch.split(x_ND, counts, dim=0)
        return torch.cat([self._swiglu(chunk, e) for e, chunk in enumerate(chunks)], dim=0)

    def _grouped_mm(self, x_ND, counts_E):
        w1, w2, w3 = self.weights()
        offsets_E = torch.cumsum(counts_E, dim=0, dtype=torch.int32)
        x = x_ND.bfloat16() if self.bf16_grouped_mm else x_ND
        if self.bf16_grouped_mm:
            w1, w2, w3 = w1.bfloat16(), w2.bfloat16(), w3.bfloat16()
        h_NF = F.silu(torch._grouped_mm(x, w1.transpose(-2, -1), offs=offsets_E))
        h_NF = h_NF * torch._grouped_mm(x, w3.transpose(-2, -1), offs=offsets_E)
        return torch._grouped_mm(h_NF, w2.transpose(-2, -1), offs=offsets_E).type_as(x_ND)

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


class LocalTokenDispatcher:
    """Reorders token copies by expert and back, applying the routing weights on the way back (torchtitan 0.3.0's
    EP=1 dispatcher: a plain object, not a module — it has no parameters or buffers)."""

    def __init__(self, top_k: int):
        self.top_k = top_k

    def dispatch(self, x_TD: torch.Tensor, weights_TK: torch.Tensor, expert_ids_TK: torch.Tensor):
        order_N = torch.argsort(expert_ids_TK.flatten(), stable=True)
        token_N = order_N // self.top_k
        return x_TD[token_N], token_N, weights_TK.flatten()[order_N].unsqueeze(-1), expert_ids_TK.flatten()[order_N]

    def combine(self, out_ND: torch.Tensor, token_N: torch.Tensor, weights_N1: torch.Tensor,
                x_TD: torch.Tensor) -> torch.Tensor:
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


@torch.compiler.disable
def _stand_in_fsdp_pre_hook(module, args):
    """Does nothing, but Dynamo may not trace it: like FSDP2's pre-forward hook, it breaks the graph."""
    return None


class MoE(nn.Module):
    """Router → routed experts (reorder by expert → experts → weight and scatter back) → plus shared experts.

    Layout "torchtitan_0_3_0": `routed_experts.inner_experts`, buffers `expert_bias_E` (with load balancing) and
    `tokens_per_expert_E` (always, counted in training, as in torchtitan 0.3.0). Layout "torchtitan_2025":
    `experts` and buffers `expert_bias` / `tokens_per_expert` (only with load balancing)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.layout = cfg.layout
        self.router = TokenChoiceTopKRouter(cfg)
        if cfg.layout == "torchtitan_0_3_0":
            self.routed_experts = RoutedExperts(cfg)
        else:
            self.experts = LegacyGroupedExperts(cfg)
            self.dispatcher = LocalTokenDispatcher(cfg.top_k)
        self.shared_experts = FeedForward(cfg.dim, cfg.moe_hidden * cfg.n_shared_experts) if cfg.n_shared_experts else None
        self.top_k, self.n_experts = cfg.top_k, cfg.n_experts
        self.load_balance = cfg.load_balance
        bias, counter = self.buffer_names(cfg.layout)
        if cfg.load_balance:
            self.register_buffer(bias, torch.zeros(cfg.n_experts, dtype=torch.float32), persistent=True)
        else:
            setattr(self, bias, None)
        if cfg.load_balance or cfg.layout == "torchtitan_0_3_0":
            self.register_buffer(counter, torch.zeros(cfg.n_experts, dtype=torch.float32), persistent=False)
        else:
            setattr(self, counter, None)
        if cfg.experts_graph_break:
            self.routed_experts_module().register_forward_pre_hook(_stand_in_fsdp_pre_hook)

    @staticmethod
    def buffer_names(layout: str) -> tuple[str, str]:
        """`(expert bias, tokens per expert)` buffer names of a layout."""
        return ("expert_bias_E", "tokens_per_expert_E") if layout == "torchtitan_0_3_0" else \
            ("expert_bias", "tokens_per_expert")

    def routed_experts_module(self) -> nn.Module:
        """The module holding the expert weights (`routed_experts.inner_experts` or `experts`)."""
        return self.routed_experts.inner_experts if self.layout == "torchtitan_0_3_0" else self.experts

    @property
    def expert_bias_buffer(self) -> torch.Tensor | None:
        return getattr(self, self.buffer_names(self.layout)[0])

    @property
    def tokens_per_expert_buffer(self) -> torch.Tensor | None:
        return getattr(self, self.buffer_names(self.layout)[1])

    def forward(self, x_BSD: torch.Tensor) -> torch.Tensor:
        B, S, D = x_BSD.shape
        x_TD = x_BSD.reshape(-1, D)
        weights_TK, expert_ids_TK, counts_E = self.router(x_TD, self.expert_bias_buffer)
        counter = self.tokens_per_expert_buffer
        if counter is not None and self.training:
            with torch.no_grad():
                # An in-place side effect in the forward: eager recompute repeats it (case C12).
                counter.add_(counts_E.to(counter.dtype))
        if self.layout == "torchtitan_0_3_0":
            out_TD = self.routed_experts(x_TD, weights_TK, expert_ids_TK, counts_E)
        else:
            routed_ND, token_N, weights_N1, ids_N = self.dispatcher.dispatch(x_TD, weights_TK, expert_ids_TK)
            out_TD = self.dispatcher.combine(self.experts(routed_ND, counts_E, ids_N), token_N, weights_N1, x_TD)
        if self.shared_experts is not None:
            out_TD = out_TD + self.shared_experts(x_TD)
        return out_TD.reshape(B, S, D)

    def init_weights(self, std: float = 0.02) -> None:
        for p in self.routed_experts_module().weights():
            nn.init.trunc_normal_(p, std=std)
        nn.init.trunc_normal_(self.router.gate.weight, std=std)
        if self.shared_experts is not None:
            for lin in (self.shared_experts.w1, self.shared_experts.w2, self.shared_experts.w3):
                nn.init.trunc_normal_(lin.weight, std=std)
        for buf in (self.expert_bias_buffer, self.tokens_per_expert_buffer):
            if buf is not None:
                buf.zero_()
