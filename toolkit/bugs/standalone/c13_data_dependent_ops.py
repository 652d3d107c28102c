"""MoE data-dependent ops under torch.compile: graph breaks, and unbacked-symint errors where they are captured.

Symptom: an MoE compiled with `fullgraph=False` breaks its graph at every data-dependent op: `.tolist()` of the
tokens per expert (for-loop experts' split sizes) is a "Data dependent operator" break, `torch.bincount` counts a
"Dynamic shape operator" break. With `fullgraph=True` (which turns scalar and dynamic-shape capture on) the values
become unbacked symbols, and splitting by bincount's counts, whose very length is one, fails: "Could not extract
specialized integer from data-dependent expression".

Mechanism: a scalar read out of a tensor, or an output whose shape depends on the data, needs an unbacked symbol;
without capture Dynamo breaks the graph there, with capture an op that needs a concrete int cannot take the symbol.

Fix: keep the capture flags on where the code can take symbols (`capture_dynamic_output_shape_ops` for bincount), and
use static-shape MoE code where it cannot: `scatter_add_` counts and experts run without splitting by the counts
(masked here; grouped_mm in torchtitan, which also replaced histc by a routing-map sum).

Upstream: torchtitan#1640 and torchtitan#1649 (capture_scalar_outputs off: hangs with EP), torchtitan#1895 (on
again), pytorch#163121 (fullgraph=True implies capture), pytorch#166460 (loop path not compiled), torchtitan#3308 (loop
path removed), torchtitan#3450 (histc -> routing-map sum), torchtitan#2312, torchtitan#2399.

Run: python c13_data_dependent_ops.py

Shape suffixes: T tokens, D model dim, E experts, K top-k, H expert hidden dim, N routed rows (T·K), n one expert's.
"""

import json
import re
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

CASE = "C13"
NEEDS = "cpu"

T, D, E, K, H = 64, 64, 4, 2, 128


class MoE(nn.Module):
    """Top-k routed SwiGLU experts. `counts`: how tokens per expert are counted ("bincount" or "scatter");
    `experts`: "for_loop" (rows sorted by expert, split by `.tolist()` of the counts) or "masked" (every expert on
    every row, its gate masking the rest: static shapes)."""

    def __init__(self, counts: str = "scatter", experts: str = "masked"):
        super().__init__()
        torch.manual_seed(0)
        self.router = nn.Linear(D, E, bias=False)
        self.w1_EDH = nn.Parameter(torch.randn(E, D, H) * 0.05)
        self.w3_EDH = nn.Parameter(torch.randn(E, D, H) * 0.05)
        self.w2_EHD = nn.Parameter(torch.randn(E, H, D) * 0.05)
        self.counts, self.experts = counts, experts

    def expert(self, e: int, x_nD: torch.Tensor) -> torch.Tensor:
        return (F.silu(x_nD @ self.w1_EDH[e]) * (x_nD @ self.w3_EDH[e])) @ self.w2_EHD[e]

    def forward(self, x_TD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        weights_TK, ids_TK = torch.topk(torch.softmax(self.router(x_TD), dim=-1), K, dim=-1)
        ids_N = ids_TK.flatten()
        if self.counts == "bincount":
            counts_E = torch.bincount(ids_N, minlength=E)
        else:
            counts_E = torch.zeros(E, dtype=torch.int64).scatter_add_(0, ids_N, torch.ones_like(ids_N))
        if self.experts == "masked":
            gate_TE = torch.zeros(T, E).scatter_add_(1, ids_TK, weights_TK)
            out_TD = torch.zeros_like(x_TD)
            for e in range(E):
                out_TD = out_TD + gate_TE[:, e : e + 1] * self.expert(e, x_TD)
            # The counts feed the load-balancing loss, as a router's aux loss does.
            return out_TD, counts_E
        order_N = torch.argsort(ids_N, stable=True)
        chunks = torch.split(x_TD[order_N // K], counts_E.tolist())
        out_ND = torch.cat([self.expert(e, x_nD) for e, x_nD in enumerate(chunks)])
        out_ND = out_ND * weights_TK.flatten()[order_N].unsqueeze(-1)
        return torch.zeros_like(x_TD).index_add(0, order_N // K, out_ND), counts_E


class Block(nn.Module):
    """`x + moe(x)` plus a Switch-style load-balancing loss from the token counts; returns the loss to train."""

    def __init__(self, counts: str = "scatter", experts: str = "masked"):
        super().__init__()
        self.moe = MoE(counts, experts)

    def forward(self, x_TD: torch.Tensor) -> torch.Tensor:
        out_TD, counts_E = self.moe(x_TD)
        probs_E = torch.softmax(self.moe.router(x_TD), dim=-1).mean(0)
        aux = E * (counts_E.float() / (T * K) * probs_E).sum()
        return (x_TD + out_TD).square().mean() + 0.01 * aux


def _msg(e: BaseException) -> str:
    first = (str(e).splitlines() or [""])[0]
    first = re.sub(r"0x[0-9a-fA-F]+", "0x?", first)
    first = re.sub(r"(?<![\w.])(?:/[^\s:'\"]+)+", "<path>", first)
    return f"{type(e).__name__}: {first}"


def inputs() -> torch.Tensor:
    return torch.randn(T, D, generator=torch.Generator().manual_seed(1), requires_grad=True)


def _step(counts: str, experts: str, fullgraph: bool = False, **capture: Any) -> dict[str, Any]:
    """One step of the block compiled (aot_eager) with Dynamo's capture flags as given: graphs, graph breaks, the
    first break's reason, recompiles, and the error if one is raised."""
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    counter = CompileCounterWithBackend("aot_eager")
    block = Block(counts, experts)
    block.compile(backend=counter, fullgraph=fullgraph)
    error = None
    with torch._dynamo.config.patch(**capture):
        try:
            block(inputs()).backward()
        except Exception as e:  # noqa: BLE001 - the error is the observation
            error = _msg(e)
    breaks = list(counters["graph_break"])
    out = {
        "graphs": counter.frame_count,
        "graph_breaks": sum(counters["graph_break"].values()),
        "first_break": breaks[0].splitlines()[0][:60] if breaks else None,
        "recompiles": sum(counters["recompiles"].values()) if "recompiles" in counters else 0,
        "error": error,
    }
    torch._dynamo.reset()
    return out


def bug() -> dict:
    """Census of the data-dependent sites, capture flags at their defaults: the breaks; then fullgraph=True (capture
    on) on for-loop experts split by bincount's counts, whose length is itself an unbacked symbol: an error."""
    for_loop = _step("scatter", "for_loop")
    bincount = _step("bincount", "masked")
    fullgraph = _step("bincount", "for_loop", fullgraph=True)
    return {
        "for_loop": for_loop,
        "bincount": bincount,
        "bincount_for_loop_fullgraph": fullgraph,
        "for_loop_break": for_loop["first_break"],
        "bincount_break": bincount["first_break"],
        "fullgraph_error": fullgraph["error"],
    }


def fix() -> dict:
    """bincount with dynamic-shape capture on; for-loop experts under fullgraph=True with counts of a static shape
    (scatter_add_: the split sizes are unbacked symbols, their number is not); static-shape code throughout (masked
    experts): one graph each, no break."""
    return {
        "for_loop_fullgraph_scatter_counts": _step("scatter", "for_loop", fullgraph=True),
        "bincount_capture_dynamic_output_shape_ops": _step("bincount", "masked", capture_dynamic_output_shape_ops=True),
        "static": _step("scatter", "masked"),
    }


class _Model(nn.Module):
    """Two MoE blocks with for-loop experts, as a user's model holds them."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block("scatter", "for_loop") for _ in range(2))

    def forward(self, x_TD: torch.Tensor) -> torch.Tensor:
        loss = x_TD.new_zeros(())
        for layer in self.layers:
            loss = loss + layer(x_TD)
        return loss


def user_models() -> dict:
    """The case as a user's training code holds it: for-loop experts, each block compiled (aot_eager,
    fullgraph=False, capture flags at their defaults), and the input."""
    model = _Model()
    for layer in model.layers:
        layer.compile(backend="aot_eager")
    return {"C13": {"model": model, "inputs": (inputs(),)}}


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
