"""A router that draws random numbers, recomputed under AC without its RNG state: tokens re-routed in backward.

Symptom: an MoE block under full AC with `preserve_rng_state=False` whose router adds noise to its selection scores
re-draws the noise in the recompute and picks other experts for some tokens. Grouped-mm experts (T·K rows whatever
the routing) give silently different gradients: the loss equals the same model without AC, the gradients do not, and
nothing is raised. For-loop experts (rows split by the token counts) raise `CheckpointError: ... Recomputed values for
the following tensors have different metadata than during the forward pass` (an expert's rows change in number).

Mechanism: the recompute re-runs the router; without the forward's RNG state restored its noise differs, so top-k
re-routes tokens. A backend whose top-k is not deterministic run to run does the same without any noise (C47).

Fix: keep `preserve_rng_state=True` (torch's default, torchtitan's since torchtitan#2380), or save the routing
decision: a SAC policy that saves `aten.topk` (torchtitan#3146), so the recompute reuses the forward's expert ids.

Upstream: torchtitan#1117, torchtitan#1323, torchtitan#2380 (preserve_rng_state default True), torchtitan#3146
(aten.topk in the SAC save list), torchtitan#3600 and torchtitan#3647 (a deterministic top-k, reverted).

Run: python c11_routing_nondeterminism.py

Shape suffixes: T tokens, D model dim, E experts, K top-k, H expert hidden dim, N routed rows (T·K), n one expert's.
"""

import json
import re
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

CASE = "C11"
NEEDS = "cpu"

T, D, E, K, H = 64, 64, 4, 2, 128
NOISE = 0.5  # router noise on the selection scores only: the routing weights stay clean


def _msg(e: BaseException) -> str:
    first = (str(e).splitlines() or [""])[0]
    first = re.sub(r"0x[0-9a-fA-F]+", "0x?", first)
    first = re.sub(r"(?<![\w.])(?:/[^\s:'\"]+)+", "<path>", first)
    return f"{type(e).__name__}: {first}"


class Router(nn.Module):
    """Sigmoid scores; the top-k is taken on the scores plus uniform noise (exploration), the weights are the clean
    scores of the chosen experts."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(D, E, bias=False)

    def forward(self, x_TD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores_TE = torch.sigmoid(self.gate(x_TD))
        noisy_TE = scores_TE.detach() + NOISE * torch.rand_like(scores_TE)
        ids_TK = torch.topk(noisy_TE, K, dim=-1).indices
        return scores_TE.gather(-1, ids_TK), ids_TK


class MoE(nn.Module):
    """Routed SwiGLU experts on the rows sorted by expert: `torch._grouped_mm` (N rows always) or a for-loop over the
    rows split by the token counts."""

    def __init__(self, experts: str = "grouped_mm"):
        super().__init__()
        self.router = Router()
        self.w1_EDH = nn.Parameter(torch.randn(E, D, H) * 0.05)
        self.w3_EDH = nn.Parameter(torch.randn(E, D, H) * 0.05)
        self.w2_EHD = nn.Parameter(torch.randn(E, H, D) * 0.05)
        self.experts = experts
        self.counts: list[list[int]] = []
        """Tokens per expert of each call (the forward, then the recompute): for the repro to show, not used."""

    def forward(self, x_TD: torch.Tensor) -> torch.Tensor:
        weights_TK, ids_TK = self.router(x_TD)
        counts_E = torch.bincount(ids_TK.flatten(), minlength=E)
        self.counts.append(counts_E.tolist())
        order_N = torch.argsort(ids_TK.flatten(), stable=True)
        x_ND = x_TD[order_N // K]
        if self.experts == "grouped_mm":
            offs_E = torch.cumsum(counts_E, 0, dtype=torch.int32)
            gate_NH = torch._grouped_mm(x_ND, self.w1_EDH, offs=offs_E)
            up_NH = torch._grouped_mm(x_ND, self.w3_EDH, offs=offs_E)
            out_ND = torch._grouped_mm(F.silu(gate_NH) * up_NH, self.w2_EHD, offs=offs_E)
        else:
            chunks = torch.split(x_ND, counts_E.tolist())
            out_ND = torch.cat(
                [
                    (F.silu(x_nD @ self.w1_EDH[e]) * (x_nD @ self.w3_EDH[e])) @ self.w2_EHD[e]
                    for e, x_nD in enumerate(chunks)
                ]
            )
        out_ND = out_ND * weights_TK.flatten()[order_N].unsqueeze(-1)
        return torch.zeros_like(x_TD).index_add(0, order_N // K, out_ND)


def save_topk() -> Any:
    """SAC that saves the routing decision (`aten.topk`) and recomputes everything else."""
    return create_selective_checkpoint_contexts(
        lambda ctx, op, *args, **kwargs: (
            CheckpointPolicy.MUST_SAVE if op is torch.ops.aten.topk.default else CheckpointPolicy.PREFER_RECOMPUTE
        )
    )


class Block(nn.Module):
    """`x + moe(x)`; `ac`: "none", "full" (non-reentrant, RNG state restored as `preserve_rng_state` says) or
    "save_topk" (SAC saving aten.topk)."""

    def __init__(self, experts: str = "grouped_mm", ac: str = "full", preserve_rng_state: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.moe = MoE(experts)
        self.ac, self.preserve_rng_state = ac, preserve_rng_state

    def forward(self, x_TD: torch.Tensor) -> torch.Tensor:
        if self.ac == "none":
            return x_TD + self.moe(x_TD)
        kwargs: dict[str, Any] = {"context_fn": partial(save_topk)} if self.ac == "save_topk" else {}
        out = checkpoint(self.moe, x_TD, use_reentrant=False, preserve_rng_state=self.preserve_rng_state, **kwargs)
        return x_TD + out


def inputs() -> torch.Tensor:
    return torch.randn(T, D, generator=torch.Generator().manual_seed(1), requires_grad=True)


def _step(block: Block) -> tuple[float, list[Any] | None, str | None]:
    """Loss, gradients and the error of one step from the same RNG seed (the forward draws the same noise)."""
    x_TD = inputs()
    torch.manual_seed(2)
    loss = block(x_TD).square().mean()
    try:
        loss.backward()
    except Exception as e:  # noqa: BLE001 - the CheckpointError is the observation
        return loss.item(), None, _msg(e)
    return loss.item(), [p.grad for p in block.parameters()] + [x_TD.grad], None


def _run(experts: str, ac: str = "full", preserve_rng_state: bool = False) -> dict:
    """One step against the same block without AC."""
    torch._dynamo.reset()
    ref_loss, ref_grads, _ = _step(Block(experts, "none"))
    block = Block(experts, ac, preserve_rng_state)
    loss, grads, error = _step(block)
    assert ref_grads is not None
    return {
        "same_loss": abs(loss - ref_loss) < 1e-6,
        "grads_match": grads is not None
        and all(torch.allclose(g, r, rtol=1e-4, atol=1e-6) for g, r in zip(grads, ref_grads)),
        "error": error,
        "counts_forward": block.moe.counts[0],
        "counts_recompute": block.moe.counts[1] if len(block.moe.counts) > 1 else None,
    }


def bug() -> dict:
    """Full AC, preserve_rng_state=False: grouped-mm experts train on silently different gradients, for-loop experts
    raise CheckpointError; the recompute's token counts differ from the forward's."""
    grouped, loop = _run("grouped_mm"), _run("for_loop")
    return {
        "grouped_mm": grouped,
        "for_loop": loop,
        "grouped_mm_same_loss": grouped["same_loss"],
        "grouped_mm_grads_match": grouped["grads_match"],
        "for_loop_error": loop["error"],
    }


def fix() -> dict:
    """The RNG state restored (torch's default), or the routing decision saved (SAC keeping aten.topk, the RNG not
    restored): the recompute routes as the forward did, gradients match for both experts."""
    return {
        f"{name}_{experts}": _run(experts, ac, preserve)["grads_match"]
        for name, ac, preserve in (("preserve_rng_state", "full", True), ("save_topk", "save_topk", False))
        for experts in ("grouped_mm", "for_loop")
    }


class _Model(nn.Module):
    """The block as a user's model holds it (`layers.0.moe.router`)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block("grouped_mm", "full", preserve_rng_state=False)])

    def forward(self, x_TD: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x_TD = layer(x_TD)
        return x_TD


def user_models() -> dict:
    """The case as a user's training code holds it: a noisy router, grouped-mm experts, full AC without the RNG state
    restored, and the input."""
    return {"C11": {"model": _Model(), "inputs": (inputs(),)}}


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
