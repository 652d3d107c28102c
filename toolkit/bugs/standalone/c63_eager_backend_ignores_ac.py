"""pytorch#160773, "torch.compile(backend="eager") with AC just ignores AC": checked on each release.

Symptom (reported 2025-08): under `torch.compile(backend="eager")` a `torch.utils.checkpoint` call saved what the
un-checkpointed function saves and recomputed nothing, because Dynamo turns the call into a higher-order op that only
AOTAutograd interpreted as a checkpoint; the eager backend ran its body plainly. Closed 2026-05 as not reproducible on
a nightly. The toolkit's matrix had no `eager` backend column to show it either way.

Check: one checkpointed two-matmul function, compiled with `backend="eager"`, against the same without the checkpoint:
the bytes packed for backward (a saved-tensors hook) and the matmuls run in backward (a dispatch mode: the gradient's
own, plus the forward's when it is recomputed). AC is honoured when the checkpointed run saves less and runs more
matmuls in backward.

Verdict on the releases the toolkit runs: not reproduced on 2.13.0, 2.14.1 and 2.15.0 (the eager backend runs the
higher-order op as `torch.utils.checkpoint.checkpoint(body, ...)`, torch/_higher_order_ops/wrap.py). The toolkit's
matrix shows it in its `eager` column: compile(AC(block)) cells save what eager full AC saves.

Fix: nothing to do on these releases; on an older torch, test AC with `aot_eager` rather than `eager`.

Upstream: pytorch#160773 (closed).

Run: python c63_eager_backend_ignores_ac.py

Shape suffixes: T tokens, D dim.
"""

import json

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint

CASE = "C63"
NEEDS = "cpu"


class CountMatmuls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.mm = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
            self.mm += 1
        return func(*args, **(kwargs or {}))


def body(x_TD, w1_DD, w2_DD):
    return ((x_TD @ w1_DD).relu() @ w2_DD).relu()


def _step(checkpointed: bool, backend: str) -> dict:
    torch._dynamo.reset()
    torch.manual_seed(0)
    x_TD = torch.randn(64, 32, requires_grad=True)
    w1_DD, w2_DD = (torch.randn(32, 32, requires_grad=True) for _ in range(2))

    def fn(x, a, b):
        return checkpoint(body, x, a, b, use_reentrant=False) if checkpointed else body(x, a, b)

    run = fn if backend == "none" else torch.compile(fn, backend=backend, fullgraph=True)
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t.nbytes) or t, lambda t: t):
        out = run(x_TD, w1_DD, w2_DD)
    with CountMatmuls() as count:
        out.sum().backward()
    return {"saved_bytes": sum(packed), "backward_matmuls": count.mm}


def bug() -> dict:
    """Checkpointed vs not, under the eager backend (and without compile, for reference)."""
    eager_backend = {"checkpoint": _step(True, "eager"), "plain": _step(False, "eager")}
    no_compile = {"checkpoint": _step(True, "none"), "plain": _step(False, "none")}
    ck, plain = eager_backend["checkpoint"], eager_backend["plain"]
    return {
        "eager_backend": eager_backend,
        "no_compile": no_compile,
        "ignores_ac": not (
            ck["saved_bytes"] < plain["saved_bytes"] and ck["backward_matmuls"] > plain["backward_matmuls"]
        ),
        "same_as_uncompiled_checkpoint": ck == no_compile["checkpoint"],
    }


def fix() -> dict:
    """The backend AC is meant for under compile: aot_eager saves less with the checkpoint too."""
    return {"aot_eager": {"checkpoint": _step(True, "aot_eager"), "plain": _step(False, "aot_eager")}}


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
