"""A memory budget under Dynamo's eager backend does nothing: there is no partitioner to apply it.

Symptom: `torch._functorch.config.activation_memory_budget` set to 0.0 (save only the graph inputs) on a block
compiled with `backend="eager"` recomputes nothing in backward: it saves what budget 1.0 saves, and nothing warns.
Under `aot_eager` the same block at 0.0 runs its forward matmuls again in backward (it saves less). A user who
bisects a memory problem with the eager backend sees the budget "not work".

Mechanism: the budget is read by AOTAutograd's min-cut partitioner when it splits the joint graph into forward and
backward; the eager backend runs Dynamo's graph with ordinary autograd and never partitions.

Fix: measure a memory budget under aot_eager or inductor.

Upstream: none (expected behaviour, undocumented for the eager backend).

Run: python c66_eager_backend_memory_budget_inert.py

Shape suffixes: T tokens, D dim, H hidden.
"""

import json

import torch
from torch.utils._python_dispatch import TorchDispatchMode

CASE = "C66"
NEEDS = "cpu"


class CountForwardMatmuls(TorchDispatchMode):
    """Counts addmm, the forward's own matmul (backward's gradients use mm): one in backward is a recompute."""

    def __init__(self):
        super().__init__()
        self.addmm = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.addmm.default:
            self.addmm += 1
        return func(*args, **(kwargs or {}))


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up_DH, self.down_HD = torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)

    def forward(self, x_TD):
        return self.down_HD(torch.nn.functional.gelu(self.up_DH(x_TD))).tanh()


def _recomputed(backend: str, budget: float) -> int:
    """Forward matmuls a compiled block runs again in backward at `budget`. (Counted in backward rather than by
    saved-tensor hooks: on torch 2.13 Dynamo skips a frame that runs under outer saved-tensor hooks.)"""
    torch._dynamo.reset()
    torch.manual_seed(0)
    block = Block()
    block.compile(backend=backend, fullgraph=True)
    x_TD = torch.randn(128, 64, requires_grad=True)
    with torch._functorch.config.patch(activation_memory_budget=budget):
        out = block(x_TD)
        counter = CountForwardMatmuls()
        with counter:
            out.sum().backward()
    return counter.addmm


def bug() -> dict:
    """The eager backend recomputes nothing at budget 0.0 (it saves what 1.0 saves); aot_eager recomputes."""
    eager = {"1.0": _recomputed("eager", 1.0), "0.0": _recomputed("eager", 0.0)}
    aot = {"0.0": _recomputed("aot_eager", 0.0)}
    return {"eager": eager, "aot_eager": aot, "budget_inert": eager["1.0"] == eager["0.0"] == 0 < aot["0.0"]}


def fix() -> dict:
    """aot_eager: budget 1.0 recomputes nothing, 0.0 recomputes the forward matmuls (it saves less)."""
    aot = {"1.0": _recomputed("aot_eager", 1.0), "0.0": _recomputed("aot_eager", 0.0)}
    return {"aot_eager": aot, "budget_applies": aot["1.0"] == 0 < aot["0.0"]}


def user_models() -> dict:
    """The case as a user's training code holds it: the block compiled with `eager`, its input, and the budget."""
    torch.manual_seed(0)
    block = Block()
    block.compile(backend="eager", fullgraph=True)
    return {
        "C66": {
            "model": block,
            "inputs": (torch.randn(128, 64, requires_grad=True),),
            "config": {"torch._functorch.config.activation_memory_budget": 0.0},
        }
    }


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
