"""save_on_cpu around a checkpoint inside a compiled region: Dynamo will not trace it, so the region runs eagerly.

Symptom: activation offloading the way transformers 5.25 does it (`activation_checkpointing_enable(offload=True)`:
`with save_on_cpu(...)` around each checkpoint call) inside `torch.compile` — per-layer `layer.compile()` or the whole
model — never compiles the checkpointed layer. fullgraph=True raises Unsupported "Attempted to inline function marked
as skipped" (`save_on_cpu.__init__`); without fullgraph the frame breaks there and the layer runs eagerly, silently
(0 graphs for a per-layer compile). Dynamo's own switch for transformers' other break (C67,
`skip_fwd_side_effects_in_bwd_under_checkpoint`) does not help: this break is the offload's, not the layer's.

Mechanism: Dynamo's trace rules mark `torch.autograd.graph.save_on_cpu.__init__` as never traced; a
saved_tensors_hooks object created inside the frame is a graph break (fullgraph: an error).

Fix: offload from outside the compiled region: `with save_on_cpu(...)` around the compiled call (the compiled graph's
saved tensors are then packed by it at run time), and checkpoint inside without a per-call save_on_cpu.

Upstream: not reported (2026-12). Near torchtune#2684 (offloading + compile, a different error) and C50.

Run: python c72_offload_checkpoint_under_compile.py

Shape suffixes: T tokens, D dim.
"""

import json

import torch
from torch.autograd.graph import save_on_cpu
from torch.utils.checkpoint import checkpoint

CASE = "C72"
NEEDS = "cpu"


class Layer(torch.nn.Module):
    def __init__(self, offload: bool):
        super().__init__()
        self.up_DD, self.down_DD = torch.nn.Linear(64, 128), torch.nn.Linear(128, 64)
        self.offload = offload

    def body(self, x_TD):
        return x_TD + self.down_DD(self.up_DD(x_TD).relu())

    def forward(self, x_TD):
        if self.offload:  # transformers' offload=True: save_on_cpu around each checkpoint call
            with save_on_cpu(pin_memory=False):
                return checkpoint(self.body, x_TD, use_reentrant=False)
        return checkpoint(self.body, x_TD, use_reentrant=False)


def _step(offload_inside: bool, fullgraph: bool, offload_outside: bool = False) -> dict:
    torch._dynamo.reset()
    torch.manual_seed(0)
    layer = Layer(offload_inside)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    layer.compile(backend=backend, fullgraph=fullgraph)
    x_TD = torch.randn(32, 64, requires_grad=True)
    try:
        if offload_outside:
            with save_on_cpu(pin_memory=False):
                out = layer(x_TD)
        else:
            out = layer(x_TD)
        out.sum().backward()
    except Exception as e:  # Dynamo's Unsupported under fullgraph
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0]}", "graphs": len(graphs)}
    grad = x_TD.grad.clone()
    x_TD.grad = None
    Layer.forward(layer, x_TD).sum().backward()  # the same layer uncompiled: the reference gradient
    return {"error": "", "graphs": len(graphs), "grads_match": bool(torch.allclose(grad, x_TD.grad))}


def bug() -> dict:
    """save_on_cpu inside the compiled layer, with and without fullgraph (and without it, for reference)."""
    fallback = _step(offload_inside=True, fullgraph=False)
    strict = _step(offload_inside=True, fullgraph=True)
    return {
        "offload_inside": fallback,
        "offload_inside_fullgraph": strict,
        "no_offload": _step(offload_inside=False, fullgraph=False),
        "runs_eagerly": fallback["graphs"] == 0 and not fallback["error"],
        "fullgraph_error": "marked as skipped" in strict["error"],
    }


def fix() -> dict:
    """save_on_cpu around the compiled call instead: the layer compiles into one graph under fullgraph."""
    return {"offload_outside_fullgraph": _step(offload_inside=False, fullgraph=True, offload_outside=True)}


def user_models() -> dict:
    """The case as a user's training code holds it: the offloading layer compiled, and its input."""
    torch.manual_seed(0)
    layer = Layer(offload=True)
    layer.compile(backend="aot_eager")
    # C2 too: the general case, a checkpoint Dynamo gave up inside a compiled region (here save_on_cpu made it).
    return {"C72": {"model": layer, "inputs": (torch.randn(32, 64, requires_grad=True),), "also": ["C2"]}}


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
