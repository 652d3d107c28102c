"""A graph break inside a compiled torch_remat block silently turns it into plain full AC: SAVE regions re-run.

Symptom: `torch.compile(remat.checkpoint(region_name=...)(block))` with `fullgraph=False`, where the block graph-breaks
(a `.tolist()`, a print, an FSDP hook), runs with 0 graphs and no error — and the block's `recompute=False` regions
are no longer kept: they run again in backward, as every other op of the block. The routing decision torchtitan
main keeps this way (so that recompute never re-routes, C11) is recomputed too. Gradients stay right for a
deterministic block, so nothing says so.

Mechanism: traced, `remat.checkpoint` takes its compiled path, a plain `torch.utils.checkpoint` whose regions the
partitioner is to keep; Dynamo cannot split that checkpoint at the break, so the call runs eagerly — as that plain
non-reentrant checkpoint, outside torch_remat's own machinery, where `remat.region` is a plain call.

Fixes: `fullgraph=True` (the break becomes an error instead of a silent change), or compile inside the block
(torchtitan main's way), or remove the break.

Upstream: torch_remat docs/compilation.md (hooks and diagnostics unsupported under compile); C2 is the same silent
fallback for torch.utils.checkpoint. Found by the toolkit's matrix; no upstream report. Needs
`pip install torch-remat==0.2.2`.

Run: python c46_graph_break_in_compiled_remat.py

Shape suffixes: T tokens, D model dim, F hidden dim.
"""

import json

import torch
import torch_remat as remat
from torch import nn

CASE = "C46"
NEEDS = "cpu"

T, D, F = 64, 32, 64


class Block(nn.Module):
    """`up` is a SAVE region: kept (its output and what it saves stay for backward), skipped in recompute."""

    def __init__(self, graph_break: bool):
        super().__init__()
        self.up, self.down = nn.Linear(D, F, bias=False), nn.Linear(F, D, bias=False)
        self.graph_break = graph_break

    def forward(self, x_TD):
        h_TF = remat.region(self.up, "up", recompute=False)(x_TD)
        remat.recompute_needs_tensor(h_TF)
        if self.graph_break:
            torch._dynamo.graph_break()  # stands in for a .tolist(), a print, an FSDP hook
        return x_TD + self.down(torch.relu(h_TF))


def _run(*, compiled: bool, graph_break: bool = True, fullgraph: bool = False) -> dict:
    """Bytes held for backward at the end of the forward (storages packed by an outer saved-tensor hook, parameters
    excluded) and the graphs compiled: the kept region holds x_TD and h_TF; a plain checkpoint only x_TD."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    block = Block(graph_break)
    params = {p.untyped_storage()._cdata for p in block.parameters()}
    held = {}

    def pack(t):
        if not torch.compiler.is_compiling() and t.untyped_storage()._cdata not in params:
            held[t.untyped_storage()._cdata] = t.untyped_storage().nbytes()
        return t

    step = remat.checkpoint(region_name="block")(block)
    if compiled:
        step = torch.compile(step, backend="aot_eager", fullgraph=fullgraph)
    x_TD = torch.randn(T, D, requires_grad=True)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = step(x_TD)
        out.square().mean().backward()
    except Exception as e:  # noqa: BLE001 - the error is the observation
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"}
    return {"held_bytes": sum(held.values()), "graphs": int(counters["stats"]["unique_graphs"])}


def bug() -> dict:
    """Eager remat keeps the region: x_TD (8192 B) and h_TF (16384 B). Compiled with a break inside: 0 graphs and
    only the checkpoint's input — the region is recomputed like the rest."""
    return {"eager": _run(compiled=False), "compiled_with_break": _run(compiled=True)}


def fix() -> dict:
    """fullgraph=True says so (an error); without the break the compiled block keeps the region again."""
    return {"fullgraph": _run(compiled=True, fullgraph=True), "no_break": _run(compiled=True, graph_break=False)}


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
