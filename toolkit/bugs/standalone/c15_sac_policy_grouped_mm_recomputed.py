"""torchtitan's per-op SAC policy always recomputes the routed experts' grouped GEMMs (`aten._grouped_mm`).

Symptom: under torchtitan's selective AC policy, an MoE block's routed experts — most of its FLOPs — are recomputed
in every backward: each `aten._grouped_mm` is PREFER_RECOMPUTE, while the dense, router and shared-expert matmuls
alternate between saved and recomputed. The backward runs 9 grouped GEMMs (3 recomputed + 6 for the gradients)
instead of 6 without AC, silently. Whether that trade is right is a policy question; that nothing says so is the case.

Mechanism: the policy saves the partitioner's `compute_intensive_ops` plus torchtitan's extra save ops (SDPA, max,
topk, collectives ...) and every other `aten.mm`; `aten._grouped_mm` is in neither list.

Fix: add `aten._grouped_mm.default` to the policy's save list if the routed GEMMs should be saved (more memory, no
grouped GEMM recomputed); torchtitan leaves it out.

Upstream: torchtitan `_get_default_save_ops` / `_op_sac_save_list` (unchanged at HEAD); no issue filed. Near C10
(pytorch#176455, torchtitan#3098: policy semantics across torch releases).

Run: python c15_sac_policy_grouped_mm_recomputed.py

Shape suffixes: T tokens, D model dim, E experts, K top-k, H expert hidden dim, N routed rows (T·K).
"""

import json
from collections import Counter
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

CASE = "C15"
NEEDS = "cpu"

T, D, E, K, H, HEADS = 64, 64, 4, 2, 128, 4
aten = torch.ops.aten


def torchtitan_save_list(extra: tuple = ()) -> set:
    """torchtitan's SAC save list: each compute-intensive op of the partitioner (its `.default` overload), SDPA's
    kernels, max, linear, topk and the reduce-scatter collective, plus `extra`."""
    from torch._functorch.partitioners import get_default_op_list

    intensive: list[Any] = list(get_default_op_list().compute_intensive_ops)
    ops = {packet.default for packet in intensive}
    for name in (
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_cudnn_attention",
        "max",
        "linear",
        "topk",
    ):
        packet: Any = getattr(aten, name)
        ops.add(packet.default)
    ops.add(torch.ops._c10d_functional.reduce_scatter_tensor.default)
    return ops | set(extra)


DECISIONS: list[tuple[str, str]] = []
"""(op, decision) of every policy call, for the repro to show."""


def torchtitan_policy(save_list: set) -> Any:
    """torchtitan's `_custom_policy`: save what the list names, but only every other `aten.mm` (counted per
    checkpoint call, so the policy is made per call); the router's [D, E] matmul is always recomputed."""
    mm_count = [0]

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if op is aten.mm.default:
            if tuple(args[1].shape) == (D, E):
                DECISIONS.append((str(op), "PREFER_RECOMPUTE"))
                return CheckpointPolicy.PREFER_RECOMPUTE
            mm_count[0] += 1
        save = op in save_list and not (op is aten.mm.default and mm_count[0] % 2 == 0)
        decision = CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE
        DECISIONS.append((str(op), decision.name))
        return decision

    return create_selective_checkpoint_contexts(policy)


class MoE(nn.Module):
    """Top-k router, routed SwiGLU experts as `torch._grouped_mm` on the rows sorted by expert, one shared expert."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(D, E, bias=False)
        self.w1_EDH = nn.Parameter(torch.randn(E, D, H) * 0.05)
        self.w3_EDH = nn.Parameter(torch.randn(E, D, H) * 0.05)
        self.w2_EHD = nn.Parameter(torch.randn(E, H, D) * 0.05)
        self.shared_w1, self.shared_w2 = nn.Linear(D, H, bias=False), nn.Linear(H, D, bias=False)

    def forward(self, x_TD: torch.Tensor) -> torch.Tensor:
        weights_TK, ids_TK = torch.topk(torch.sigmoid(self.router(x_TD)), K, dim=-1)
        order_N = torch.argsort(ids_TK.flatten(), stable=True)
        offs_E = torch.cumsum(torch.bincount(ids_TK.flatten(), minlength=E), 0, dtype=torch.int32)
        x_ND = x_TD[order_N // K]
        gate_NH = torch._grouped_mm(x_ND, self.w1_EDH, offs=offs_E)
        up_NH = torch._grouped_mm(x_ND, self.w3_EDH, offs=offs_E)
        out_ND = torch._grouped_mm(F.silu(gate_NH) * up_NH, self.w2_EHD, offs=offs_E)
        out_ND = out_ND * weights_TK.flatten()[order_N].unsqueeze(-1)
        routed_TD = torch.zeros_like(x_TD).index_add(0, order_N // K, out_ND)
        return routed_TD + self.shared_w2(F.silu(self.shared_w1(x_TD)))


class Block(nn.Module):
    """Attention (SDPA) and the MoE, the whole block under SAC with torchtitan's policy (`ac="sac"`), with
    `aten._grouped_mm` added to its save list (`"sac_save_grouped_mm"`), or without AC (`"none"`)."""

    def __init__(self, ac: str = "sac"):
        super().__init__()
        torch.manual_seed(0)
        self.wqkv, self.wo = nn.Linear(D, 3 * D, bias=False), nn.Linear(D, D, bias=False)
        self.moe = MoE()
        self.ac = ac

    def body(self, x_TD: torch.Tensor) -> torch.Tensor:
        q, k, v = self.wqkv(x_TD).view(T, 3, HEADS, D // HEADS).permute(1, 2, 0, 3)
        h_TD = x_TD + self.wo(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1).reshape(T, D))
        return h_TD + self.moe(h_TD)

    def forward(self, x_TD: torch.Tensor) -> torch.Tensor:
        if self.ac == "none":
            return self.body(x_TD)
        extra = (aten._grouped_mm.default,) if self.ac == "sac_save_grouped_mm" else ()
        context_fn = partial(torchtitan_policy, torchtitan_save_list(extra))
        return checkpoint(self.body, x_TD, use_reentrant=False, context_fn=context_fn)


def inputs() -> torch.Tensor:
    return torch.randn(T, D, generator=torch.Generator().manual_seed(1), requires_grad=True)


class _CountOps(TorchDispatchMode):
    """Counts the ops that run. Entered around backward, it sits below SAC's recompute mode: an op that SAC serves
    from its cache never reaches it, an op recomputed does."""

    def __enter__(self) -> Counter:
        super().__enter__()
        self.counts: Counter = Counter()
        return self.counts

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.counts[str(func)] += 1
        return func(*args, **(kwargs or {}))


def _step(ac: str) -> dict:
    """One step: the policy's decisions per op, and the grouped GEMMs the backward ran."""
    torch._dynamo.reset()
    DECISIONS.clear()
    block, x_TD = Block(ac), inputs()
    loss = block(x_TD).square().mean()
    with _CountOps() as ran:
        loss.backward()
    decided: dict[str, list[str]] = {}
    for op, decision in DECISIONS:
        if op in ("aten._grouped_mm.default", "aten.mm.default"):
            decided.setdefault(op, []).append(decision)
    return {
        "backward_grouped_mm": ran["aten._grouped_mm.default"],
        "decisions": decided,
        "grads": [p.grad for p in block.parameters()] + [x_TD.grad],
    }


def bug() -> dict:
    """torchtitan's policy: every grouped GEMM recomputed (3 more in backward than without AC), the matmuls
    alternating; `_grouped_mm` is in neither the partitioner's compute-intensive ops nor torchtitan's list."""
    none, sac = _step("none"), _step("sac")
    return {
        "grouped_mm_in_save_list": aten._grouped_mm.default in torchtitan_save_list(),
        "backward_grouped_mm": {"no_ac": none["backward_grouped_mm"], "sac": sac["backward_grouped_mm"]},
        "grouped_mm_decisions": sac["decisions"]["aten._grouped_mm.default"],
        "mm_decisions": sac["decisions"]["aten.mm.default"],
        "grouped_mm_recomputed": sac["backward_grouped_mm"] > none["backward_grouped_mm"],
    }


def fix() -> dict:
    """`aten._grouped_mm` added to the save list: the backward runs only the 6 gradient grouped GEMMs, as without AC;
    gradients still equal the block without AC."""
    none, saved = _step("none"), _step("sac_save_grouped_mm")
    return {
        "backward_grouped_mm": saved["backward_grouped_mm"],
        "grouped_mm_decisions": saved["decisions"]["aten._grouped_mm.default"],
        "grads_match": all(torch.allclose(g, r, rtol=1e-4, atol=1e-6) for g, r in zip(saved["grads"], none["grads"])),
    }


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block("sac")])

    def forward(self, x_TD: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x_TD = layer(x_TD)
        return x_TD


def user_models() -> dict:
    """The case as a user's training code holds it: an MoE block under torchtitan's SAC policy, and the input."""
    return {"C15": {"model": _Model(), "inputs": (inputs(),)}}


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
