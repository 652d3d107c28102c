"""Dynamo's `eager` backend: a checkpointed block that updates a buffer in place (no grad) fails in backward.

Symptom: a block that counts tokens per expert into a buffer (`with torch.no_grad(): counts.add_(...)`, as
torchtitan's MoE does) and is checkpointed (non-reentrant) trains eagerly, and compiled with `aot_eager` or
`inductor`, but compiled with `backend="eager"` its backward raises "RuntimeError: one of the variables needed for
gradient computation has been modified by an inplace operation: [torch.FloatTensor [E]] is at version 1; expected
version 0". The central list's `moe | AC full / selective_op | blocks | eager` cells and the toolkit's 0.3.0 recipe
under `eager` are this case (bare too: the probes are not involved).

Mechanism: Dynamo turns the `checkpoint` call into a higher-order op whose body takes the module's buffer as an
explicit input (eagerly it is an attribute the checkpointed function reads). The `eager` backend runs the higher-order
op as `torch.utils.checkpoint.checkpoint(body, *inputs)`, and non-reentrant checkpoint saves every tensor input for
its recompute, the buffer among them, at version 0. The body's in-place update then bumps it to 1, and backward's
saved-variable check refuses it. AOTAutograd (aot_eager, inductor) functionalizes the mutation, so nothing is saved at
the old version. Seen with a saved-tensors hook: the buffer's storage is packed once, at version 0, under `eager` only
(and such a hook, handing the tensor back itself, hides the error: autograd checks versions only of what it saved).

Fix: the production backends (`aot_eager` / `inductor`); or update the buffer outside the checkpointed function
(return the counts and add them after it), or clone it into the body; `backend="eager"` is a debugging backend and
this is the first thing that breaks when one bisects a compile problem with it.

Upstream: not filed (2026-12); related pytorch#160773 (how `backend="eager"` runs the checkpoint higher-order op;
C63) and pytorch#113737 (in-place ops under compiled checkpointing).

Run: python c62_eager_backend_checkpoint_buffer_update.py

Shape suffixes: T tokens, D dim, E experts.
"""

import json

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

CASE = "C62"
NEEDS = "cpu"


class Block(nn.Module):
    """A router-like block: scores per expert, a running count of them kept in a buffer (no grad)."""

    def __init__(self, update_inside: bool = True):
        super().__init__()
        self.update_inside = update_inside
        self.gate = nn.Linear(8, 4)
        self.register_buffer("counts_E", torch.zeros(4))

    def body(self, x_TD):
        scores_TE = self.gate(x_TD).softmax(-1)
        if self.update_inside:
            with torch.no_grad():
                self.counts_E.add_(scores_TE.sum(0))
        return scores_TE * self.gate(x_TD), scores_TE.detach().sum(0)

    def forward(self, x_TD):
        out_TE, counted_E = checkpoint(self.body, x_TD, use_reentrant=False)
        if not self.update_inside:
            with torch.no_grad():
                self.counts_E.add_(counted_E)
        return out_TE


def _step(backend: str, update_inside: bool = True, hooked: bool = False) -> dict:
    """One forward and backward; `hooked`: under a saved-tensors hook that notes the version at which the buffer is
    packed (such a hook also hides the error: a tensor it hands back skips autograd's version check)."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    block = Block(update_inside)
    run = block if backend == "none" else torch.compile(block, backend=backend, fullgraph=True)
    x_TD = torch.randn(16, 8, requires_grad=True)
    buffer = block.counts_E.untyped_storage().data_ptr()
    packed_versions = []

    def pack(t):
        if t.untyped_storage().data_ptr() == buffer:
            packed_versions.append(t._version)
        return t

    try:
        if hooked:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out_TE = run(x_TD)
        else:
            out_TE = run(x_TD)
        out_TE.sum().backward()
        result = "ok"
    except RuntimeError as e:
        result = "inplace error" if "modified by an inplace operation" in str(e) else f"RuntimeError: {e}"[:200]
    return {"result": result, **({"buffer_packed_at_versions": packed_versions} if hooked else {})}


def bug() -> dict:
    """The same checkpointed block eagerly, under `eager` and under `aot_eager`; then where the buffer is saved."""
    steps = {backend: _step(backend) for backend in ("none", "eager", "aot_eager")}
    return {
        **steps,
        "eager_backend_raises": steps["eager"]["result"] == "inplace error",
        "others_train": steps["none"]["result"] == steps["aot_eager"]["result"] == "ok",
        "buffer_saved_under_eager_backend": _step("eager", hooked=True)["buffer_packed_at_versions"],
        "buffer_saved_under_aot_eager": _step("aot_eager", hooked=True)["buffer_packed_at_versions"],
    }


def fix() -> dict:
    """The buffer updated after the checkpointed function, from the counts it returns: `eager` trains too."""
    return {"eager_update_outside": _step("eager", update_inside=False)}


def user_models() -> dict:
    """The case as a user's training code holds it: the block compiled with the `eager` backend, and its input."""
    torch.manual_seed(0)
    block = Block()
    return {
        "C62": {
            "model": torch.compile(block, backend="eager", fullgraph=True),
            "inputs": (torch.randn(16, 8, requires_grad=True),),
        }
    }


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
