"""compile(SAC(block)) reuses the first block's compiled graph, and so its SAC policy, for every block of the class.

Symptom: four identical blocks, each `torch.compile(block, fullgraph=True)` with the selective-checkpoint call inside
the compiled forward, get per-block policies from one factory (block 0 recomputes the first matmul, blocks 1-3 save
it); Dynamo compiles one graph and applies block 0's policy to all four, silently (saved tensors per block
[3, 3, 3, 3] where compiling each block on its own gives [3, 4, 4, 4]; the policies of blocks 1-3 are never called).

Upstream: no report found in a search of pytorch/pytorch issues; the opposite problem, over-guarding on policy
closures, is pytorch#168163 (closed). Dynamo matches closures by code id (`CLOSURE_MATCH`; cf. pytorch#109427).

Run: python c25_policy_reuse_across_compiled_blocks.py

Shape suffixes: T tokens, D model dim, H hidden dim (x_TD is [T, D]).

Bug write-up (for pytorch/pytorch)
----------------------------------
Summary. Under `torch.compile(fullgraph=True)` a `torch.utils.checkpoint.checkpoint(..., context_fn=
functools.partial(create_selective_checkpoint_contexts, policy))` call is traced into the checkpoint HOP, and the
policy is applied when AOTAutograd traces the graph (it is not called at run time). Dynamo's only guard on the policy
function is `ID_MATCH` on `policy.__code__` (`CLOSURE_MATCH`; see `TORCH_LOGS=guards`), and nothing guards the
closure cells, because Dynamo never inlines the policy body. Two policies made by the same factory share one code
object, so a second module instance of the same class whose policy differs only in captured data passes the guards
and reuses the first instance's graph, including its save/recompute decisions.

Expected vs actual (4 blocks of the same class, one compiled object per block, chained; counts are tensors saved
for backward per block, read with `saved_tensors_hooks`):
- expected, i.e. each block compiled after `torch._dynamo.reset()`: [3, 4, 4, 4]; reversed constants [4, 3, 3, 3];
- actual: [3, 3, 3, 3] and [4, 4, 4, 4]; one graph compiled; only block 0's policy is ever called.
Gradients stay correct; what changes is memory and recompute work, so nothing fails and nothing warns.

Why it matters. torchtitan-style training applies SAC per block and then compiles every block (`compile(AC(block))`,
all blocks the same class). Per-layer policy variation is natural there: per-layer force-recompute matmul shapes
(torchtitan's `force_recompute_mm_shapes_by_fqns` resolves FQNs to shapes per model), stateful per-call policies,
or "recompute more in the first layers" schedules. Written as one factory with captured data, every block silently
gets the first traced block's policy, and memory measurements per layer are wrong with no signal.

Workarounds (`fix`, `variant_partial_kwarg`): give each distinct policy its own function (different code object), or
pass the per-block data as `functools.partial` keyword arguments (Dynamo guards partial args/keywords by value), or
read it from a module attribute inside `forward`. Each distinct policy then costs one recompile; past
`torch._dynamo.config.recompile_limit` (default 8) `fullgraph=True` raises `FailOnRecompileLimitHit`.
A fix in Dynamo could guard the closure cells (or `__closure__` contents) of context_fn's policy, like the partial's
arguments already are.

Environment: torch 2.13.0+cpu, Python 3.11.7, Linux x86-64, CPU only; backend "aot_eager" here, and the same
[3, 3, 3, 3] with backend "inductor" (the policy is applied while AOTAutograd traces and partitions, before the
backend runs).
"""

import functools
import json

import torch
import torch.nn.functional as F
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

CASE = "C25"
NEEDS = "cpu"

D, H, T = 64, 128, 32
N_BLOCKS = 4

# torchtitan-style "force recompute" by weight shape: the mm against w1 ([D, H] after the transpose) is recomputed
# instead of saved. Saving it costs one [T, H] activation, hence 4 saved tensors instead of 3 (x, w1, w2).
RECOMPUTE_W1 = frozenset({(D, H)})
NOTHING = frozenset()


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(D, H, bias=False)
        self.w2 = nn.Linear(H, D, bias=False)

    def forward(self, x_TD):
        return self.w2(F.silu(self.w1(x_TD)))


class Block(nn.Module):
    def __init__(self, policy):
        super().__init__()
        self.mlp = MLP()
        self.context_fn = functools.partial(create_selective_checkpoint_contexts, policy)

    def forward(self, x_TD):
        return checkpoint(self.mlp, x_TD, use_reentrant=False, context_fn=self.context_fn)


def make_policy(recompute_shapes, calls, i):
    """The factory: one code object for every block; the per-block data lives only in the closure."""

    def policy(ctx, op, *args, **kwargs):
        calls[i] += 1
        if op == torch.ops.aten.mm.default:
            if tuple(args[1].shape) in recompute_shapes:
                return CheckpointPolicy.PREFER_RECOMPUTE
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def policy_kw(ctx, op, *args, recompute_shapes, **kwargs):
    # No call counter here: a partial's keywords are guarded by value, so a per-block counter would itself force
    # one graph per block.
    if op == torch.ops.aten.mm.default:
        if tuple(args[1].shape) in recompute_shapes:
            return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _recompute_w1_policy(calls, i):
    def recompute_w1(ctx, op, *args, **kwargs):
        calls[i] += 1
        if op == torch.ops.aten.mm.default and tuple(args[1].shape) != (D, H):
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return recompute_w1


def _save_mm_policy(calls, i):
    def save_mm(ctx, op, *args, **kwargs):
        calls[i] += 1
        if op == torch.ops.aten.mm.default:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return save_mm


def _saved_count(fn, x_TD):
    n = [0]

    def pack(t):
        n[0] += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y_TD = fn(x_TD)
    return n[0], y_TD


def _run(policies_for) -> dict:
    """Chain N_BLOCKS blocks, each wrapped in its own torch.compile object, and compare with per-block isolation.

    `policies_for(calls)` returns one policy per block; `calls[i]` counts how often block i's policy is called
    (at trace time: under compile a policy is never called at run time)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    calls = [0] * N_BLOCKS
    blocks = [Block(p) for p in policies_for(calls)]
    x_TD = torch.randn(T, D, requires_grad=True)

    # Reference gradients: the same chain, no AC, no compile.
    h_TD = x_TD
    for b in blocks:
        h_TD = b.mlp(h_TD)
    h_TD.sum().backward()
    params = [p for b in blocks for p in b.parameters()] + [x_TD]
    ref = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None

    counter = CompileCounterWithBackend("aot_eager")
    saved, h_TD = [], x_TD
    for b in blocks:
        n, h_TD = _saved_count(torch.compile(b, backend=counter, fullgraph=True), h_TD)
        saved.append(n)
    policy_calls = list(calls)
    h_TD.sum().backward()
    grads_match = all(torch.allclose(p.grad, r, rtol=1e-5, atol=1e-6) for p, r in zip(params, ref))

    isolated = []
    for b in blocks:
        torch._dynamo.reset()
        n, _ = _saved_count(torch.compile(b, backend="aot_eager", fullgraph=True), x_TD.detach().requires_grad_())
        isolated.append(n)
    return {
        "saved": saved,
        "isolated": isolated,
        "graphs": counter.frame_count,
        "recompiles": counter.frame_count - 1,
        "policy_called": [c > 0 for c in policy_calls] if any(policy_calls) else None,
        "grads_match": grads_match,
    }


def _constants(first, rest):
    return [first] + [rest] * (N_BLOCKS - 1)


def bug() -> dict:
    """Block 0 recomputes the w1 matmul, blocks 1-3 save it; all policies come from `make_policy`."""
    shapes = _constants(RECOMPUTE_W1, NOTHING)
    return _run(lambda calls: [make_policy(s, calls, i) for i, s in enumerate(shapes)])


def variant_reversed() -> dict:
    """Block 0 saves everything, blocks 1-3 recompute the w1 matmul: all four now save, as block 0 does."""
    shapes = _constants(NOTHING, RECOMPUTE_W1)
    return _run(lambda calls: [make_policy(s, calls, i) for i, s in enumerate(shapes)])


def fix() -> dict:
    """Same decisions written as two functions (two code objects): Dynamo recompiles once and each block is right."""
    makers = _constants(_recompute_w1_policy, _save_mm_policy)
    return _run(lambda calls: [m(calls, i) for i, m in enumerate(makers)])


def variant_partial_kwarg() -> dict:
    """One policy function, per-block data as functools.partial keywords: guarded by value, so also correct."""
    shapes = _constants(RECOMPUTE_W1, NOTHING)
    return _run(lambda calls: [functools.partial(policy_kw, recompute_shapes=s) for s in shapes])


if __name__ == "__main__":
    print(torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
    print("variant_reversed", json.dumps(variant_reversed()))
    print("variant_partial_kwarg", json.dumps(variant_partial_kwarg()))
