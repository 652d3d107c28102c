"""`checkpoint(debug=True)` cannot be combined with a selective-checkpoint `context_fn`.

Symptom: turning on checkpoint debugging to investigate a SAC problem fails immediately with
"ValueError: debug=True is incompatible with non-default context_fn": the debug mode installs its own context, so
the tool you reach for first is unavailable exactly under SAC. Full AC (default context) accepts debug=True.

Upstream: by design, `torch/utils/checkpoint.py` (`_checkpoint_without_reentrant_generator`).

Run: python c24_debug_with_context_fn.py

Shape suffixes: T tokens, D model dim.
"""

import json
from functools import partial

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

CASE = "C24"
NEEDS = "cpu"

T, D = 16, 32


def _policy(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op == torch.ops.aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE


def _step(**kwargs) -> str | None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(D, D, bias=False)
    x_TD = torch.randn(T, D, requires_grad=True)
    try:
        checkpoint(lambda x: torch.relu(lin(x)), x_TD, use_reentrant=False, **kwargs).sum().backward()
        return None
    except Exception as e:  # noqa: BLE001 - the error text is the observation
        return f"{type(e).__name__}: {str(e).splitlines()[0]}"


def bug() -> dict:
    """SAC with debug=True."""
    return {"error": _step(debug=True, context_fn=partial(create_selective_checkpoint_contexts, _policy))}


def fix() -> dict:
    """Debug the region under full AC (default context_fn), or SAC without debug."""
    return {
        "full_ac_debug_error": _step(debug=True),
        "sac_no_debug_error": _step(context_fn=partial(create_selective_checkpoint_contexts, _policy)),
    }


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(D, D, bias=False)

    def forward(self, x_TD):
        context_fn = partial(create_selective_checkpoint_contexts, _policy)
        return checkpoint(
            lambda x: torch.relu(self.lin(x)), x_TD, use_reentrant=False, debug=True, context_fn=context_fn
        )


def user_models() -> dict:
    """The case as a user's training code holds it: SAC with debug=True around a layer, and its input."""
    torch.manual_seed(0)
    return {"C24": {"model": _Model(), "inputs": (torch.randn(T, D, requires_grad=True),)}}


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
