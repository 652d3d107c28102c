"""Eager SAC recomputes an op registered as having an ordered side effect: the side effect runs twice.

Symptom: a custom op registered as effectful (`torch.library._register_effectful_op(..., EffectType.ORDERED)`: a
logger, a counter, a collective's bookkeeping) inside a selectively checkpointed block runs once in the forward and
again in backward's recompute, so its side effect happens twice per step, and nothing warns. The compiled path
means to run it once (the partitioner marks the outputs of `with_effects` MUST_SAVE, never recomputed), but an
effectful op whose output is differentiated, inside a checkpoint under torch.compile, fails in the forward:
AOTAutograd's `save_from_forward` asserts "expected all tensors_saved_with_vc_check to be Tensors" (the effect token
is saved as None). Outside a checkpoint the same op compiles and runs once.

Mechanism: `_CachingTorchDispatchMode` (torch/utils/checkpoint.py) asks the user's policy about every op, effectful
or not, and the default answer is PREFER_RECOMPUTE; nothing in eager SAC reads the op's registered effect.

Fix: the policy saves effectful ops: `MUST_SAVE` when `torch._higher_order_ops.effects.has_effects(op)`.

Fixed in torch 2.15.0: eager SAC saves a non-aliasing op with an ordered effect unless the policy says MUST_RECOMPUTE
(`_is_cacheable_effect` in torch/utils/checkpoint.py), and the compiled assertion is gone.

Upstream: pytorch#196956.

Run: python c74_eager_sac_recomputes_ordered_effect_op.py

Shape suffixes: T tokens, D dim, H hidden.
"""

import functools
import json

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

CASE = "C74"
NEEDS = "cpu"

CALLS = []  # the side effect: one entry per real execution of the op


@functools.cache
def _op():
    """Defined on first use (not at import, and before any compile traces the block): `c74::tally`, a copy whose
    side effect is an entry in CALLS, registered as ORDERED."""
    from torch._library.effects import EffectType

    @torch.library.custom_op("c74::tally", mutates_args=())
    def tally(x: torch.Tensor) -> torch.Tensor:
        CALLS.append(tuple(x.shape))
        return x.clone()

    @tally.register_fake
    def _(x):
        return torch.empty_like(x)

    tally.register_autograd(lambda ctx, grad: grad)
    torch.library._register_effectful_op("c74::tally", EffectType.ORDERED)
    return torch.ops.c74.tally.default


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up_DH, self.down_HD = torch.nn.Linear(64, 128), torch.nn.Linear(128, 64)

    def forward(self, x_TD):
        h_TH = torch.ops.c74.tally(self.up_DH(x_TD).relu())
        return x_TD + self.down_HD(h_TH)


def _recompute_all(ctx, op, *args, **kwargs):
    return CheckpointPolicy.PREFER_RECOMPUTE


def _save_effectful(ctx, op, *args, **kwargs):
    from torch._higher_order_ops.effects import has_effects

    return CheckpointPolicy.MUST_SAVE if has_effects(op) else CheckpointPolicy.PREFER_RECOMPUTE


def _run(policy, compiled: bool = False) -> dict:
    """One step of the block under SAC with `policy`: how often the side effect ran in forward and in backward."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    block = Block()
    _op()
    context = functools.partial(create_selective_checkpoint_contexts, policy)

    def fn(x):
        return checkpoint(block, x, use_reentrant=False, context_fn=context)

    run = torch.compile(fn, backend="aot_eager", fullgraph=True) if compiled else fn
    x_TD = torch.randn(32, 64, requires_grad=True)
    CALLS.clear()
    try:
        out = run(x_TD)
        forward = len(CALLS)
        out.sum().backward()
    except Exception as e:  # compiled: AOTAutograd's assertion on the saved effect token
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0].split(', got')[0]}"}
    return {"forward": forward, "backward": len(CALLS) - forward}


def bug() -> dict:
    """Eager SAC runs the effectful op again in backward. Compiled, the same checkpointed block does not run at all:
    AOTAutograd saves the effect token as None and asserts (a differentiable effectful op inside a checkpoint)."""
    eager, compiled = _run(_recompute_all), _run(_recompute_all, compiled=True)
    return {
        "eager_sac": eager,
        "compiled_sac": compiled,
        "side_effect_twice": eager.get("backward", 0) > 0,
        "compiled_error": "tensors_saved_with_vc_check" in compiled.get("error", ""),
    }


def fix() -> dict:
    """A policy that saves effectful ops: once per step in eager too."""
    return {"eager_sac_save_effectful": _run(_save_effectful)}


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
