"""error_on_graph_break(True) hid a graph break after a non-empty Dynamo restart point: fixed in torch (pytorch#166589).

Symptom (torch 2.9.0): `with torch._dynamo.error_on_graph_break(True): torch._dynamo.graph_break()` inside a compiled
function compiled without error when ops preceded it: Dynamo resumed from its last speculation checkpoint (a restart
point in the bytecode, not torch.utils.checkpoint) and split the graph instead of raising. Fixed by pytorch#166586
(cherry-picked as #166925): with error_on_graph_break set Dynamo re-raises instead of resuming.

Because activation checkpointing turns graph breaks silent (C2: the checkpointed block falls back to eager), the
variants check the same guard around and inside a `torch.utils.checkpoint` region, and whether
`torch.compiler.set_stance` sees a break: it does not (its stances are about recompiles and eager fallback).

Upstream: pytorch#166589 (issue), pytorch#166586 and pytorch#166925 (fix); neighbour C2.

Run: python c48_error_on_graph_break_nonempty_checkpoint.py

Shape suffixes: D model dim.
"""

import contextlib
import json
import re

import torch
from torch.utils.checkpoint import checkpoint

CASE = "C48"
NEEDS = "cpu"

D = 64


def _msg(e: BaseException) -> str:
    first = (str(e).splitlines() or [""])[0]
    first = re.sub(r"0x[0-9a-fA-F]+", "0x?", first)
    return f"{type(e).__name__}: {first}"


def _compile(fn, x_D: torch.Tensor, context=contextlib.nullcontext, backward: bool = False) -> dict:
    """Compile `fn` (aot_eager) and run it on `x_D` under `context`: the error (None if it compiled) and the graphs."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(fn, backend="aot_eager")
    try:
        with context():
            out_D = compiled(x_D)
            if backward:
                out_D.sum().backward()
        error = None
    except Exception as e:  # noqa: BLE001 - the error is the observation
        error = _msg(e)
    return {"error": error, "graphs": int(torch._dynamo.utils.counters["stats"]["unique_graphs"])}


def nonempty(x_D: torch.Tensor) -> torch.Tensor:
    """pytorch#166589's test: ops before the guarded break make Dynamo's restart point non-empty."""
    x_D = x_D + 1
    x_D = x_D + 1
    x_D = x_D + 1
    with torch._dynamo.error_on_graph_break(True):
        torch._dynamo.graph_break()
    return x_D + 1


def bug() -> dict:
    """The upstream test: an error is the fixed behaviour; `error: None` (and graphs compiled) is the bug."""
    return _compile(nonempty, torch.ones(3))


def fix() -> dict:
    """`fullgraph=True` has always refused the break, on the releases with the bug too."""
    torch._dynamo.reset()
    try:
        torch.compile(nonempty, backend="aot_eager", fullgraph=True)(torch.ones(3))
        return {"error": None}
    except Exception as e:  # noqa: BLE001
        return {"error": _msg(e)}


def block(x_D: torch.Tensor) -> torch.Tensor:
    h_D = x_D.sin() + 1
    torch._dynamo.graph_break()  # a .tolist(), a print, an FSDP hook in a real block
    return h_D.cos()


def guarded_block(x_D: torch.Tensor) -> torch.Tensor:
    h_D = x_D.sin() + 1
    with torch._dynamo.error_on_graph_break(True):
        torch._dynamo.graph_break()
    return h_D.cos()


def variant_checkpoint() -> dict:
    """The same guard with a torch.utils.checkpoint region: around the compiled call, inside the checkpointed
    function, and not set (C2's silent fallback: the block's graph is dropped, compile still succeeds); then
    `set_stance`, which has no stance for graph breaks."""
    x_D = torch.randn(D, requires_grad=True)

    def ac(fn):
        return lambda x: checkpoint(fn, x, use_reentrant=False) * 2

    guard = lambda: torch._dynamo.error_on_graph_break(True)  # noqa: E731
    return {
        "unguarded": _compile(ac(block), x_D, backward=True),
        "guard_around": _compile(ac(block), x_D, guard, backward=True),
        "guard_inside": _compile(ac(guarded_block), x_D, backward=True),
        "stance_fail_on_recompile": _warm_then_stance(ac(block), x_D),
    }


def _warm_then_stance(fn, x_D: torch.Tensor) -> dict:
    """Compiled once (the break splits it), then run under `set_stance("fail_on_recompile")`: the stance sees
    recompiles only, so the break it was compiled with stays hidden."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(fn, backend="aot_eager")
    compiled(x_D).sum().backward()
    try:
        with torch.compiler.set_stance("fail_on_recompile"):
            compiled(x_D).sum().backward()
        error = None
    except Exception as e:  # noqa: BLE001
        error = _msg(e)
    return {"error": error, "graph_breaks": int(sum(torch._dynamo.utils.counters["graph_break"].values()))}


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
    print("variant_checkpoint", json.dumps(variant_checkpoint()))
