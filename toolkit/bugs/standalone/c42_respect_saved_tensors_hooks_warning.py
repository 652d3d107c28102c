"""torch 2.14 warns when saved_tensors_hooks surround a selective-checkpoint region.

torch 2.14 warns when a user's saved_tensors_hooks surround a selective-checkpoint region (respect_saved_tensors_hooks).

Symptom: on torch 2.14.1, a `torch.autograd.graph.saved_tensors_hooks` context (offloading, a memory probe, any
measuring tool) around `checkpoint(..., context_fn=<SAC policy>)` raises a FutureWarning: SAC-saved tensors bypass
the surrounding hooks today, a future release routes them through, and the caller should pass
`respect_saved_tensors_hooks=True|False`; a hard error is planned. On torch 2.13.0 there is no warning (and no such
argument). The warning also fires for tools that only watch what autograd saves.

Upstream: pytorch#190581, pytorch#191236 (the rollout).

Run: python c42_respect_saved_tensors_hooks_warning.py

Shape suffixes: T tokens, D model dim.
"""

import inspect
import json
import warnings
from functools import partial

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

CASE = "C42"
NEEDS = "cpu"

T, D = 32, 64


def _policy(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op is torch.ops.aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE


def _run(**checkpoint_kwargs) -> dict:
    torch.manual_seed(0)
    w_DD = torch.randn(D, D, requires_grad=True)
    x_TD = torch.randn(T, D, requires_grad=True)
    packed = []

    def pack(t):
        packed.append(t.shape)
        return t

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out_TD = checkpoint(
                lambda x: torch.relu(x @ w_DD),
                x_TD,
                use_reentrant=False,
                context_fn=partial(create_selective_checkpoint_contexts, _policy),
                **checkpoint_kwargs,
            )
        out_TD.sum().backward()
    future = [str(w.message).splitlines()[0] for w in caught if issubclass(w.category, FutureWarning)]
    return {"future_warning": future[0][:200] if future else None, "hooks_saw": len(packed)}


def _has_argument() -> bool:
    return "respect_saved_tensors_hooks" in inspect.signature(checkpoint).parameters


def bug() -> dict:
    """SAC inside a user's saved_tensors_hooks, no choice made: the FutureWarning's first line (None: no warning)."""
    return {"has_argument": _has_argument(), **_run()}


def fix() -> dict:
    """Say what you want where the argument exists (False: today's behaviour, SAC-saved tensors bypass the hooks)."""
    if not _has_argument():
        return {"has_argument": False, **_run()}
    return {"has_argument": True, **_run(respect_saved_tensors_hooks=False)}


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
