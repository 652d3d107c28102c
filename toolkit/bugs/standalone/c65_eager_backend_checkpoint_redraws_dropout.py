"""Dynamo's `eager` backend: a compiled checkpoint recomputes dropout with new random numbers (silently wrong grads).

Symptom: `torch.compile(fn, backend="eager")` around `torch.utils.checkpoint.checkpoint(block, x,
use_reentrant=False)` (RNG preserved: the default) where the block draws dropout. The step runs, the loss is right,
and the gradients differ from the same checkpoint run uncompiled: backward's recompute drew a new dropout mask. The
central list's `dense:dropout | AC full / selective_op / remat | blocks (fullgraph) | eager` cells are this case
(bare too); the same cells under aot_eager and inductor work.

Mechanism: Dynamo turns the checkpoint call into the `tag_activation_checkpoint` higher-order op, whose eager
implementation (torch/_higher_order_ops/wrap.py) calls `checkpoint(..., preserve_rng_state=False)` whatever the user
passed: RNG is meant to be preserved by AOTAutograd / Inductor's RNG functionalization (the comment beside it says
so). The eager backend has neither, so the recompute runs on the advanced RNG state. Same on 2.13.0, 2.14.1 and
2.15.0 (2.15 routes plain AC through the SAC path; the flag is still forced).

Fix: aot_eager or inductor; or, under the eager backend, restore the RNG yourself (draw the mask outside the
checkpointed function and pass it in).

Upstream: not filed (2026-12); pytorch#160773 is about the same code path (C63).

Run: python c65_eager_backend_checkpoint_redraws_dropout.py

Shape suffixes: T tokens, D dim.
"""

import json

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

CASE = "C65"
NEEDS = "cpu"


def block(x_TD, w_DD, mask_TD=None):
    h_TD = (x_TD @ w_DD).relu()
    return h_TD * mask_TD * 2.0 if mask_TD is not None else F.dropout(h_TD, p=0.5, training=True)


def _grads(backend: str, mask: bool = False) -> tuple[float, torch.Tensor]:
    torch._dynamo.reset()
    torch.manual_seed(0)
    x_TD = torch.randn(32, 16, requires_grad=True)
    w_DD = torch.randn(16, 16, requires_grad=True)
    mask_TD = (torch.rand(32, 16) > 0.5).float() if mask else None

    def fn(x, w):
        return checkpoint(block, x, w, mask_TD, use_reentrant=False)

    run = fn if backend == "none" else torch.compile(fn, backend=backend, fullgraph=True)
    torch.manual_seed(1)
    loss = run(x_TD, w_DD).square().sum()
    loss.backward()
    return loss.item(), w_DD.grad


def _against_uncompiled(backend: str, mask: bool = False) -> dict:
    ref_loss, ref = _grads("none", mask)
    loss, got = _grads(backend, mask)
    return {"loss_matches": abs(loss - ref_loss) < 1e-4, "grads_match": bool(torch.allclose(got, ref, atol=1e-5))}


def bug() -> dict:
    """The checkpointed dropout block under `eager` and `aot_eager`, each against the uncompiled checkpoint."""
    eager, aot = _against_uncompiled("eager"), _against_uncompiled("aot_eager")
    return {
        "eager": eager,
        "aot_eager": aot,
        "redraws": eager["loss_matches"] and not eager["grads_match"],
    }


def fix() -> dict:
    """The mask drawn outside the checkpointed function: nothing random is recomputed, `eager` matches."""
    return {"eager_mask_outside": _against_uncompiled("eager", mask=True)}


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w_DD = torch.nn.Parameter(torch.randn(16, 16))

    def forward(self, x_TD):
        return checkpoint(block, x_TD, self.w_DD, use_reentrant=False)


def user_models() -> dict:
    """The case as a user's training code holds it: the checkpointed block compiled with `eager`, and its input."""
    torch.manual_seed(0)
    model = torch.compile(_Model(), backend="eager", fullgraph=True)
    return {"C65": {"model": model, "inputs": (torch.randn(32, 16, requires_grad=True),)}}


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
