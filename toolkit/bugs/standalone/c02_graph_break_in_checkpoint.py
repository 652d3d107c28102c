"""A graph break inside a checkpointed block silently turns compile off: compile(AC(block)) runs the block eagerly.

Symptom: an MoE block whose router counts tokens per expert with `torch.bincount` (a graph break: "Dynamic shape
operator") compiles around the break without AC, but wrapped in a checkpoint and compiled with `fullgraph=False` (the
default) it compiles zero graphs: the whole block runs eagerly, with no error and no warning, and its gradients still
match eager. Only the graph count tells.

Mechanism: Dynamo speculates the checkpointed function into the `tag_activation_checkpoint` higher-order op; a graph
break inside it cannot be split, so Dynamo backs out of the HOP and runs the (dynamo-disabled) checkpoint eagerly.

Fix: `fullgraph=True`, so that a break raises instead of hiding (in these releases it also captures bincount,
giving one graph), or count tokens without a data-dependent shape (`scatter_add_`, what torchtitan does today).

Upstream: pytorch#139989 (open; draft fix pytorch#193143), torchtitan#1895 ("we fall back the entire block to
eager"), torchtitan#2281 and torchtitan#2741 (removed the break, compile whole blocks).

Run: python c02_graph_break_in_checkpoint.py

Shape suffixes: T tokens, D model dim, E experts, K top-k, H expert hidden dim.
"""

import json
import re
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

CASE = "C2"
NEEDS = "cpu"

T, D, E, K, H = 64, 64, 4, 2, 128


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


class Block(nn.Module):
    """`x + moe(norm(x))`, the whole body checkpointed (non-reentrant) when `ac`."""

    def __init__(self, ac: bool, static: bool = False):
        super().__init__()
        self.norm = nn.RMSNorm(D)
        self.moe = MoE(static)
        self.ac = ac

    def body(self, x_TD: torch.Tensor) -> torch.Tensor:
        return x_TD + self.moe(self.norm(x_TD))

    def forward(self, x_TD: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.body, x_TD, use_reentrant=False) if self.ac else self.body(x_TD)


class Model(nn.Module):
    def __init__(self, ac: bool, static: bool = False, n_blocks: int = 2):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(Block(ac, static) for _ in range(n_blocks))

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
    model, x_TD = Model(ac=False, static=static), inputs()
    model(x_TD).square().mean().backward()
    return [p.grad for p in model.parameters()] + [x_TD.grad]


def _step(ac: bool, static: bool = False, fullgraph: bool = False) -> dict[str, Any]:
    """One step of the blocks compiled one by one (compile(AC(block)) when `ac`): graphs, breaks, the first break's
    reason and whether the gradients match eager's."""
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    counter = CompileCounterWithBackend("aot_eager")
    model = Model(ac, static)
    for layer in model.layers:
        layer.compile(backend=counter, fullgraph=fullgraph)
    x_TD = inputs()
    try:
        model(x_TD).square().mean().backward()
        error = None
    except Exception as e:  # noqa: BLE001 - fullgraph=True's Unsupported is an observation
        error = _msg(e)
    grads: list[Any] = [p.grad for p in model.parameters()] + [x_TD.grad]
    breaks = list(counters["graph_break"])
    torch._dynamo.reset()
    return {
        "graphs": counter.frame_count,
        "graph_breaks": sum(counters["graph_break"].values()),
        "first_break": breaks[0].splitlines()[0][:60] if breaks else None,
        "error": error,
        "grads_match": error is None
        and all(torch.allclose(g, r, rtol=1e-4, atol=1e-6) for g, r in zip(grads, _eager_grads(static))),
    }


def bug() -> dict:
    """The same blocks compiled with fullgraph=False, without AC and as compile(AC(block)): with AC nothing compiles,
    nothing is raised, the gradients match — the block silently ran eagerly."""
    no_ac, ac = _step(ac=False), _step(ac=True)
    return {
        "no_ac": no_ac,
        "ac": ac,
        "falls_back": no_ac["graphs"] > 0 and ac["graphs"] == 0 and ac["error"] is None and ac["grads_match"],
    }


def fix() -> dict:
    """fullgraph=True (the break cannot hide: here bincount is captured instead), and static-shape counting
    (scatter_add_): both compile(AC(block)) runs compile and match eager."""
    return {"fullgraph": _step(ac=True, fullgraph=True), "static_counts": _step(ac=True, static=True)}


def user_models() -> dict:
    """The case as a user's training code holds it: each block checkpointed, then compiled (aot_eager, fullgraph=False),
    and the input."""
    model = Model(ac=True)
    for layer in model.layers:
        layer.compile(backend="aot_eager")
    # C13 too: the break itself is a data-dependent op's, the general case of MoE code that breaks graphs.
    return {"C2": {"model": model, "inputs": (inputs(),), "also": ["C13"]}}


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
