"""A graph break inside a selectively checkpointed block: compile(SAC(block)) runs the block, and its policy, eagerly.

Symptom: an MoE block whose router counts tokens per expert with `torch.bincount` (a graph break: "Dynamic shape
operator"), wrapped in a per-op selective checkpoint (SAC) and compiled with `fullgraph=False`, compiles zero graphs:
the whole block runs eagerly, with no error, and its gradients match eager. The SAC policy runs eagerly too: on every
later step it is asked about each aten op of the forward, and the matmul outputs it saves are kept in the eager
checkpoint's cache until backward. Compiled, a policy runs only while the graph is traced (its choices become the
partitioner's recompute tags) and never again.

Mechanism: as C2 — Dynamo speculates the checkpointed function into the `tag_activation_checkpoint` higher-order op;
the break inside it cannot be split, so Dynamo backs out and the (dynamo-disabled) checkpoint runs eagerly, with its
context_fn's caching dispatch mode.

Fix: count tokens without a data-dependent shape (`scatter_add_`, torchtitan since #2281), or `fullgraph=True` so a
break cannot hide (in these releases it captures bincount instead): the block compiles and the policy is not asked
again after the trace.

Upstream: torchtitan#2281 and torchtitan#2741 (removed the break, compile whole blocks), torchtitan#1895 ("we fall
back the entire block to eager"); pytorch#139989 for the fallback itself (C2).

Run: python c18_graph_break_in_sac_block.py

Shape suffixes: T tokens, D model dim, E experts, K top-k, H expert hidden dim.
"""

import json
import re
from functools import partial
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

CASE = "C18"
NEEDS = "cpu"

T, D, E, K, H = 64, 64, 4, 2, 128
SAVE = {torch.ops.aten.mm.default, torch.ops.aten.bmm.default}


class MoE(nn.Module):
    """Top-k routed SwiGLU experts, every expert run on every token and masked by its gate (static shapes), counting
    the tokens routed to each expert into a buffer (aux-loss-free load balancing, as torchtitan does). `static=False`
    counts with `torch.bincount` (a data-dependent output shape: a graph break); `static=True` with `scatter_add_`."""

    tokens_per_expert: torch.Tensor  # the buffer registered in __init__

    def __init__(self, static: bool = False):
        super().__init__()
        self.router = nn.Linear(D, E, bias=False)
        self.w1_EDH = nn.Parameter(torch.randn(E, D, H) * 0.05)
        self.w3_EDH = nn.Parameter(torch.randn(E, D, H) * 0.05)
        self.w2_EHD = nn.Parameter(torch.randn(E, H, D) * 0.05)
        self.register_buffer("tokens_per_expert", torch.zeros(E))
        self.static = static

    def forward(self, x_TD: torch.Tensor) -> torch.Tensor:
        weights_TK, ids_TK = torch.topk(torch.softmax(self.router(x_TD), dim=-1), K, dim=-1)
        if self.static:
            counts_E = torch.zeros(E).scatter_add_(0, ids_TK.flatten(), torch.ones(T * K))
        else:
            counts_E = torch.bincount(ids_TK.flatten(), minlength=E).float()
        with torch.no_grad():
            self.tokens_per_expert.add_(counts_E)
        gate_TE = torch.zeros(T, E).scatter_add_(1, ids_TK, weights_TK)
        h_ETH = F.silu(torch.einsum("td,edh->eth", x_TD, self.w1_EDH)) * torch.einsum("td,edh->eth", x_TD, self.w3_EDH)
        return torch.einsum("eth,ehd,te->td", h_ETH, self.w2_EHD, gate_TE)


POLICY_ASKED: list[tuple[bool, bool]] = []
"""(in recompute, saved) per op the SAC policy was asked about; only older releases ask it in the recompute, those
calls are left out. Module-level on purpose: under compile the policy runs
at trace time as plain Python, while a list handed to it through the context_fn's partial is copied by Dynamo."""


def save_matmuls() -> Callable[..., CheckpointPolicy]:
    """A per-op SAC policy: save the matmuls, recompute the rest."""

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        POLICY_ASKED.append((bool(ctx.is_recompute), op in SAVE))
        return CheckpointPolicy.MUST_SAVE if op in SAVE else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def sac_context() -> Any:
    return create_selective_checkpoint_contexts(save_matmuls())


class Block(nn.Module):
    """`x + moe(norm(x))`, the whole body in a per-op selective checkpoint (non-reentrant) when `sac`."""

    def __init__(self, sac: bool, static: bool = False):
        super().__init__()
        self.norm = nn.RMSNorm(D)
        self.moe = MoE(static)
        self.sac = sac

    def body(self, x_TD: torch.Tensor) -> torch.Tensor:
        return x_TD + self.moe(self.norm(x_TD))

    def forward(self, x_TD: torch.Tensor) -> torch.Tensor:
        if not self.sac:
            return self.body(x_TD)
        # Dynamo traces a context_fn that is a partial of a global function (not a closure), as torchtitan passes it.
        return checkpoint(self.body, x_TD, use_reentrant=False, context_fn=partial(sac_context))


class Model(nn.Module):
    def __init__(self, sac: bool, static: bool = False, n_blocks: int = 2):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(Block(sac, static) for _ in range(n_blocks))

    def forward(self, x_TD: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x_TD = layer(x_TD)
        return x_TD


def _msg(e: BaseException) -> str:
    first = (str(e).splitlines() or [""])[0]
    first = re.sub(r"0x[0-9a-fA-F]+", "0x?", first)
    first = re.sub(r"(?<![\w.])(?:/[^\s:'\"]+)+", "<path>", first)
    return f"{type(e).__name__}: {first}"


def inputs() -> torch.Tensor:
    return torch.randn(T, D, generator=torch.Generator().manual_seed(1), requires_grad=True)


def _eager_grads(static: bool) -> list[Any]:
    model, x_TD = Model(sac=False, static=static), inputs()
    model(x_TD).square().mean().backward()
    return [p.grad for p in model.parameters()] + [x_TD.grad]


def _step(sac: bool, static: bool = False, fullgraph: bool = False) -> dict[str, Any]:
    """Two training steps of the blocks compiled one by one (compile(SAC(block)) when `sac`): graphs, breaks, the
    first break's reason, whether the first step's gradients match eager's, and how often the SAC policy was asked
    about an op of the second step's forward and saved its output (compiled, never: the trace is done)."""
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    counter = CompileCounterWithBackend("aot_eager")
    model = Model(sac, static)
    for layer in model.layers:
        layer.compile(backend=counter, fullgraph=fullgraph)
    x_TD = inputs()
    error = None
    try:
        model(x_TD).square().mean().backward()
        grads: list[Any] = [p.grad for p in model.parameters()] + [x_TD.grad]
        model.zero_grad()
        POLICY_ASKED.clear()
        model(inputs()).square().mean().backward()
    except Exception as e:  # noqa: BLE001 - fullgraph=True's Unsupported is an observation
        error = _msg(e)
    asked = list(POLICY_ASKED)
    POLICY_ASKED.clear()
    breaks = list(counters["graph_break"])
    torch._dynamo.reset()
    return {
        "graphs": counter.frame_count,
        "graph_breaks": sum(counters["graph_break"].values()),
        "first_break": breaks[0].splitlines()[0][:60] if breaks else None,
        "error": error,
        "grads_match": error is None
        and all(torch.allclose(g, r, rtol=1e-4, atol=1e-6) for g, r in zip(grads, _eager_grads(static))),
        "policy_asked": sum(1 for recompute, _ in asked if not recompute) if error is None else None,
        "policy_saved": sum(1 for recompute, saved in asked if saved and not recompute) if error is None else None,
    }


def bug() -> dict:
    """The same blocks compiled with fullgraph=False, without AC and as compile(SAC(block)): with SAC nothing
    compiles, nothing is raised, the gradients match — and the SAC policy keeps running, op by op, at every step."""
    no_ac, sac = _step(sac=False), _step(sac=True)
    return {
        "no_ac": {k: no_ac[k] for k in ("graphs", "graph_breaks", "first_break")},
        "sac": sac,
        "falls_back": no_ac["graphs"] > 0 and sac["graphs"] == 0 and sac["error"] is None and sac["grads_match"],
        "sac_eager": bool(sac["policy_asked"] and sac["policy_saved"]),
    }


def fix() -> dict:
    """Static-shape counting (scatter_add_), and fullgraph=True (the break cannot hide: here bincount is captured
    instead): both compile(SAC(block)) runs compile, match eager, and leave the policy alone after the trace."""
    return {"static_counts": _step(sac=True, static=True), "fullgraph": _step(sac=True, fullgraph=True)}


def user_models() -> dict:
    """The case as a user's training code holds it: each block in a per-op selective checkpoint, then compiled
    (aot_eager, fullgraph=False), and the input."""
    model = Model(sac=True)
    for layer in model.layers:
        layer.compile(backend="aot_eager")
    # C2 too: a checkpointed block that fell back to eager is its general case; C13: the break itself is a
    # data-dependent op's.
    return {"C18": {"model": model, "inputs": (inputs(),), "also": ["C2", "C13"]}}


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
