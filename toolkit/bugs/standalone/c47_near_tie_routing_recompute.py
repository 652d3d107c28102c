"""Near-tie top-k routing flips between a checkpoint's forward and recompute: counts move by one, CheckpointError.

Symptom: an MoE block under non-reentrant activation checkpointing recomputes its router in backward. Where two
experts' scores nearly tie, router math that is not bit-identical run to run (GPU split-K matmuls, atomics) can pick
the other expert in the recompute; with no capacity padding the expert buffers are sized by the token counts, which
move by one, and `torch.utils.checkpoint` raises "CheckpointError: ... Recomputed values for the following tensors
have different metadata than during the forward pass" (saved [n, D], recomputed [n ± 1, D]). Ordinary data has
almost no near-ties, so the recompute agrees and nothing fires.

CPU math is bit-identical run to run, so two things stand in for the GPU here: the gate sums over D in an order
that rotates with every call (elementwise adds, the same on every CPU), and three experts' gate columns differ by
~4e-7, so their scores nearly tie for every token. Nothing random is drawn and nothing is compiled.

Fixes: save the routing decision instead of recomputing it — a SAC policy that saves `aten.topk` (torchtitan#3146;
Automodel#2635 saves the router output; torch_remat keeps a `routing_decision` region in torchtitan main) — or
replay the forward's routing in the recompute (Automodel#3156's router replay).

Upstream: Automodel#3156 (router replay during AC recompute, a draft PR), Automodel#2635, torchtitan#3146;
neighbours C11 (RNG-driven routing) and C38 (EP dispatch / LoRA drift).

Run: python c47_near_tie_routing_recompute.py

Shape suffixes: T tokens, D model dim, E experts, K top-k, H expert hidden dim, n rows of one expert.
"""

import json
import re

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

CASE = "C47"
NEEDS = "cpu"

T, D, E, K, H = 64, 64, 4, 2, 32
TIE = 4e-7  # how far apart the three near-tied experts' gate columns are


def _msg(e: BaseException) -> str:
    first = (str(e).splitlines() or [""])[0]
    first = re.sub(r"0x[0-9a-fA-F]+", "0x?", first)
    return f"{type(e).__name__}: {first}"


class Router(nn.Module):
    """Scores tokens against experts; the selection's logits are summed over D starting at an offset that moves with
    every call (a stand-in for kernels that are not bit-identical run to run)."""

    def __init__(self, gate_DE: torch.Tensor):
        super().__init__()
        self.gate_DE = nn.Parameter(gate_DE)
        self.calls = 0

    def selection_logits(self, x_TD: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        start = (7 * self.calls) % D
        logits_TE = torch.zeros(x_TD.shape[0], E, dtype=x_TD.dtype)
        for i in range(D):
            d = (start + i) % D
            logits_TE = logits_TE + x_TD[:, d : d + 1] * self.gate_DE[d]
        return logits_TE

    def forward(self, x_TD: torch.Tensor):
        with torch.no_grad():
            ids_TK = torch.topk(self.selection_logits(x_TD), K, dim=-1).indices
        weights_TK = torch.sigmoid(x_TD @ self.gate_DE).gather(-1, ids_TK)
        return weights_TK, ids_TK


class Experts(nn.Module):
    """E SiLU MLPs run on each expert's rows, split by the token counts (no capacity padding)."""

    def __init__(self):
        super().__init__()
        self.w1_EDH = nn.Parameter(torch.randn(E, D, H) * 0.1)
        self.w2_EHD = nn.Parameter(torch.randn(E, H, D) * 0.1)

    def forward(self, x_ND: torch.Tensor, counts_E: torch.Tensor) -> torch.Tensor:
        chunks = torch.split(x_ND, counts_E.tolist())
        return torch.cat([F.silu(x_nD @ self.w1_EDH[e]) @ self.w2_EHD[e] for e, x_nD in enumerate(chunks)])


class MoE(nn.Module):
    def __init__(self, gate_DE: torch.Tensor):
        super().__init__()
        self.router, self.experts = Router(gate_DE), Experts()
        self.counts: list[list[int]] = []
        """Tokens per expert of every call (the forward, then the recompute): for the repro to show, not used."""

    def forward(self, x_TD: torch.Tensor) -> torch.Tensor:
        weights_TK, ids_TK = self.router(x_TD)
        counts_E = torch.bincount(ids_TK.flatten(), minlength=E)
        self.counts.append(counts_E.tolist())
        order_N = torch.argsort(ids_TK.flatten(), stable=True)
        out_ND = self.experts(x_TD[order_N // K], counts_E) * weights_TK.flatten()[order_N].unsqueeze(-1)
        return torch.zeros_like(x_TD).index_add(0, order_N // K, out_ND)


def save_topk(ctx, op, *args, **kwargs):
    """Save the routing decision; recompute everything else."""
    return CheckpointPolicy.MUST_SAVE if op is torch.ops.aten.topk.default else CheckpointPolicy.PREFER_RECOMPUTE


class Block(nn.Module):
    """`x + moe(x)`, the MoE checkpointed (non-reentrant, early_stop=False as torchtitan sets it)."""

    def __init__(self, *, ties: bool = True, policy=None):
        super().__init__()
        torch.manual_seed(0)
        gate_DE = torch.randn(D, E) * 0.1
        if ties:
            gate_DE[:, 1] = gate_DE[:, 0] + TIE * torch.randn(D)
            gate_DE[:, 2] = gate_DE[:, 0] + TIE * torch.randn(D)
        self.moe = MoE(gate_DE)
        self.policy = policy

    def forward(self, x_TD: torch.Tensor) -> torch.Tensor:
        kwargs = {"context_fn": lambda: create_selective_checkpoint_contexts(self.policy)} if self.policy else {}
        return x_TD + checkpoint(self.moe, x_TD, use_reentrant=False, early_stop=False, **kwargs)


def inputs() -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(T, D, requires_grad=True)


def _run(block: Block) -> dict:
    try:
        block(inputs()).square().mean().backward()
        error = None
    except Exception as e:  # noqa: BLE001 - the error is the observation
        error = _msg(e)
    counts = block.moe.counts
    return {
        "error": error,
        "counts_forward": counts[0] if counts else None,
        "counts_recompute": counts[1] if len(counts) > 1 else None,
    }


def bug() -> dict:
    """Near-tied scores: the recompute routes one token to another expert (counts move by one) and the checkpoint's
    metadata check fails on that expert's rows."""
    return _run(Block())


def fix() -> dict:
    """The routing decision saved (SAC: MUST_SAVE aten.topk): the recompute reuses it, whatever its scores say."""
    return _run(Block(policy=save_topk))


def variant_no_ties() -> dict:
    """The same rotating sums without near-ties: the last bits move, no top-k choice does, nothing fires."""
    return _run(Block(ties=False))


def user_models() -> dict:
    """The case as a user's training code holds it: the block with near-tied router scores, and its input."""
    return {"C47": {"model": Block(), "inputs": (inputs(),)}}


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
    print("variant_no_ties", json.dumps(variant_no_ties()))
