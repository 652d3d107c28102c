"""The baseline that works: compile(AC(block)) per block, fullgraph=True, full AC or per-op SAC.

Symptom (none: this is the layout the other cases break): each transformer block wrapped in a non-reentrant
checkpoint and then compiled whole with `fullgraph=True` compiles into one graph with no graph break (both blocks run
that one graph: the same code, the parameters are graph inputs), trains with gradients equal to eager, and honours the
AC it was given: full AC saves less than per-op SAC, which saves less than no AC, and the SAC policy is asked about
the block's aten ops one by one (it sees `aten.mm`, not one opaque region).

Mechanism: Dynamo speculates the checkpointed function into the `tag_activation_checkpoint` higher-order op; a SAC
context_fn stamps each traced node with a recompute tag that the min-cut partitioner respects.

Upstream: none filed (torchtitan's layout since llama3: `apply_ac` then `apply_compile` per block, and again whole
blocks since torchtitan#2741).

Run: python c01_compile_ac_baseline.py

Shape suffixes: B batch, S sequence, D model dim, H MLP hidden dim, N heads.
"""

import json
from functools import partial
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

CASE = "C1"
NEEDS = "cpu"

B, S, D, H, N = 2, 16, 64, 128, 4
BLOCKS = 2


class Block(nn.Module):
    """Pre-norm attention (SDPA) and a SwiGLU MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.attn_norm, self.mlp_norm = nn.RMSNorm(D), nn.RMSNorm(D)
        self.wqkv = nn.Linear(D, 3 * D, bias=False)
        self.wo = nn.Linear(D, D, bias=False)
        self.w1, self.w3 = nn.Linear(D, H, bias=False), nn.Linear(D, H, bias=False)
        self.w2 = nn.Linear(H, D, bias=False)

    def forward(self, x_BSD: torch.Tensor) -> torch.Tensor:
        q, k, v = self.wqkv(self.attn_norm(x_BSD)).view(B, S, 3, N, D // N).permute(2, 0, 3, 1, 4)
        attn_BSD = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, S, D)
        h_BSD = x_BSD + self.wo(attn_BSD)
        m_BSD = self.mlp_norm(h_BSD)
        return h_BSD + self.w2(F.silu(self.w1(m_BSD)) * self.w3(m_BSD))


POLICY_SAW: list[str] = []
"""Each op the SAC policy was asked about. Module-level on purpose: under compile the policy runs at trace time as
plain Python, while a list handed to it through the context_fn's partial is copied by Dynamo."""


def every_other_mm() -> Callable[..., CheckpointPolicy]:
    """A per-op SAC policy in torchtitan's style: save every other matmul, recompute the rest. Made fresh per
    checkpoint call (its counter is its state)."""
    mms = [0]

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        POLICY_SAW.append(str(op))
        if op is torch.ops.aten.mm.default:
            mms[0] += 1
            return CheckpointPolicy.MUST_SAVE if mms[0] % 2 else CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def sac_context() -> Any:
    return create_selective_checkpoint_contexts(every_other_mm())


class Checkpointed(nn.Module):
    """AC(block): full AC, or per-op SAC (`selective`)."""

    def __init__(self, block: nn.Module, selective: bool):
        super().__init__()
        self.block = block
        self.selective = selective

    def forward(self, x_BSD: torch.Tensor) -> torch.Tensor:
        if not self.selective:
            return checkpoint(self.block, x_BSD, use_reentrant=False)
        # Dynamo traces a context_fn that is a partial of a global function (not a closure), as torchtitan passes it.
        return checkpoint(self.block, x_BSD, use_reentrant=False, context_fn=partial(sac_context))


class Model(nn.Module):
    """BLOCKS blocks, each AC'd (`ac`: "none", "full" or "sac") and then compiled whole (`compiled`)."""

    def __init__(self, ac: str, compiled: bool = True, backend: Any = "aot_eager"):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList()
        for _ in range(BLOCKS):
            layer: nn.Module = Block()
            if ac != "none":
                layer = Checkpointed(layer, selective=ac == "sac")
            if compiled:
                layer = torch.compile(layer, backend=backend, fullgraph=True)  # type: ignore[assignment]
            self.layers.append(layer)

    def forward(self, x_BSD: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x_BSD = layer(x_BSD)
        return x_BSD


def inputs() -> torch.Tensor:
    return torch.randn(B, S, D, generator=torch.Generator().manual_seed(1), requires_grad=True)


def _saved_bytes(model: nn.Module, x_BSD: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The forward's output and the bytes of the distinct storages autograd saved for backward, parameters and the
    input excluded (they are alive anyway)."""
    skip = {t.untyped_storage().data_ptr() for t in [*model.parameters(), x_BSD]}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in skip:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(x_BSD)
    return out, sum(seen.values())


def _step(ac: str, compiled: bool = True) -> dict:
    """One training step; graphs and graph breaks counted by Dynamo, gradients kept for the comparison."""
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    counter = CompileCounterWithBackend("aot_eager")
    POLICY_SAW.clear()
    model = Model(ac, compiled, counter)
    x_BSD = inputs()
    out, saved = _saved_bytes(model, x_BSD)
    out.square().mean().backward()
    grads = [p.grad for p in model.parameters()] + [x_BSD.grad]
    torch._dynamo.reset()
    return {
        "graphs": counter.frame_count,
        "graph_breaks": sum(counters["graph_break"].values()),
        "saved_bytes": saved,
        "policy_saw": sorted(set(POLICY_SAW)),
        "grads": grads,
    }


def _match(a: list, b: list) -> bool:
    return all(g is not None and r is not None and torch.allclose(g, r, rtol=1e-4, atol=1e-6) for g, r in zip(a, b))


def bug() -> dict:
    """Full AC and per-op SAC, each block compiled whole: every step compiles without a break, gradients equal
    eager's, and the saved bytes order as the AC asked (full < SAC < none); SAC's policy saw the aten matmuls."""
    eager = _step("none", compiled=False)
    none, full, sac = _step("none"), _step("full"), _step("sac")
    out: dict[str, Any] = {}
    for name, run in (("full", full), ("sac", sac)):
        out[name] = {
            "graphs": run["graphs"],
            "graph_breaks": run["graph_breaks"],
            "grads_match": _match(run["grads"], eager["grads"]),
        }
    out["sac_policy_saw_mm"] = "aten.mm.default" in sac["policy_saw"]
    out["saved_full_lt_sac_lt_none"] = full["saved_bytes"] < sac["saved_bytes"] < none["saved_bytes"]
    out["works"] = (
        all(
            out[name]["graphs"] >= 1 and out[name]["graph_breaks"] == 0 and out[name]["grads_match"]
            for name in ("full", "sac")
        )
        and out["sac_policy_saw_mm"]
        and out["saved_full_lt_sac_lt_none"]
    )
    return out


def fix() -> dict:
    """Nothing to fix: the same blocks compiled without AC, the reference the AC'd runs are compared with."""
    eager, none = _step("none", compiled=False), _step("none")
    return {
        "graphs": none["graphs"],
        "graph_breaks": none["graph_breaks"],
        "grads_match": _match(none["grads"], eager["grads"]),
    }


def user_models() -> dict:
    """The case as a user's training code holds it: each block AC'd with per-op SAC and then compiled whole
    (aot_eager, fullgraph=True), and the input."""
    return {"C1": {"model": Model("sac"), "inputs": (inputs(),)}}


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
