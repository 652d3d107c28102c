"""SAC around an Inductor-compiled region sees generated-code calls or one opaque region, never the model's ops.

Symptom: without `torch._inductor.config.wrap_inductor_compiled_regions` the policy of SAC(compile(mlp)) sees only
the extern `aten.mm.out` calls of the generated code, so a policy saving `aten.mm.default` never fires (silent full
recompute) and a policy saving what it does see fails in backward with "Tensor cached during selective activation
checkpoint has been mutated" (catalogue C6); with the option on, the whole compiled graph is one
`inductor_compiled_code` call, so the policy can only save it whole (no memory saved for the region) or recompute it
whole (C7).

Upstream: pytorch#167844 (inductor_compiled_code HOP, Nov 2025), pytorch#161889, pytorch#175229, pytorch#175306,
pytorch#177198 (per-region storage keys), pytorch#179003 (region names); torchtitan#2052, torchtitan#2118.

Run: python c07_sac_around_compiled_region.py

Shape suffixes: T tokens, D model dim, H hidden dim (x_TD is [T, D]).
Byte counts are distinct storages cached by SAC (or saved for backward), excluding the parameters and the input.
"""

import json
import re

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

CASE = "C7"
CASES = {"C6": "bug", "C7": "fix"}  # which function shows which case
NEEDS = "cpu"

D, H, T = 64, 128, 64

MUST_SAVE = CheckpointPolicy.MUST_SAVE
RECOMPUTE = CheckpointPolicy.PREFER_RECOMPUTE


class SwiGLU(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(D, H, bias=False)
        self.w3 = nn.Linear(D, H, bias=False)
        self.w2 = nn.Linear(H, D, bias=False)

    def forward(self, x_TD):
        return self.w2(F.silu(self.w1(x_TD)) * self.w3(x_TD))


def _msg(e: BaseException) -> str:
    first = (str(e).splitlines() or [""])[0]
    first = re.sub(r"0x[0-9a-fA-F]+", "0x?", first)
    first = re.sub(r"(?<![\w.])(?:/[^\s:'\"]+)+", "<path>", first)
    return f"{type(e).__name__}: {first}"


def _setup():
    torch._dynamo.reset()
    torch.manual_seed(0)
    mlp = SwiGLU()
    x_TD = torch.randn(T, D, requires_grad=True)
    return mlp, x_TD


def _grads(mlp, x_TD):
    return [p.grad.clone() for p in mlp.parameters()] + [x_TD.grad.clone()]


def _zero(mlp, x_TD):
    mlp.zero_grad(set_to_none=True)
    x_TD.grad = None


def _eager_grads(mlp, x_TD):
    _zero(mlp, x_TD)
    mlp(x_TD).sum().backward()
    return _grads(mlp, x_TD)


def _match(a, b) -> bool:
    return all(torch.allclose(g, r, rtol=1e-4, atol=1e-5) for g, r in zip(a, b))


def _distinct_bytes(tensors, exclude) -> int:
    # Parameters and the input are alive anyway; the compiled forward returns them among its saved outputs, so
    # counting them would hide what the region itself costs.
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen = {}
    for t in tensors:
        st = t.untyped_storage()
        if st.data_ptr() not in skip:
            seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def _sac_step(fn, mlp, x_TD, decide) -> dict:
    """One forward + backward of SAC(fn); `decide(op)` is the policy. Bytes are read before backward consumes them."""
    ops, storages = [], []

    def policy(ctx, op, *args, **kwargs):
        ops.append(str(op))
        return decide(op)

    def context_fn():
        # The storage dict is the only exact record of what SAC keeps; the policy does not see the cache itself.
        caching, cached = create_selective_checkpoint_contexts(policy)
        storages.append(caching.storage)
        return caching, cached

    _zero(mlp, x_TD)
    out_TD = checkpoint(fn, x_TD, use_reentrant=False, context_fn=context_fn)
    fwd_ops = list(ops)
    cached = [
        leaf.val
        for st in storages
        for per_idx in st.values()
        for entry in per_idx.values()
        for leaf in tree_leaves(entry)
        if isinstance(getattr(leaf, "val", None), torch.Tensor)
    ]
    cached_bytes = _distinct_bytes(cached, list(mlp.parameters()) + [x_TD])
    try:
        out_TD.sum().backward()
        error, grads = None, _grads(mlp, x_TD)
    except RuntimeError as e:
        error, grads = _msg(e), None
    return {
        "ops": fwd_ops,
        "bwd_policy_calls": len(ops) - len(fwd_ops),
        "cached_bytes": cached_bytes,
        "error": error,
        "grads": grads,
    }


def _saved_bytes_no_ac(fn, mlp, x_TD) -> int:
    saved = []

    def pack(t):
        saved.append(t)
        return t

    _zero(mlp, x_TD)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out_TD = fn(x_TD)
    n = _distinct_bytes(saved, list(mlp.parameters()) + [x_TD])
    out_TD.sum().backward()
    return n


def bug() -> dict:
    """Default Inductor (no wrapped regions): what the policy sees, and two ways that policies go wrong."""
    mlp, x_TD = _setup()
    ref = _eager_grads(mlp, x_TD)
    with torch._inductor.config.patch(wrap_inductor_compiled_regions=False):
        compiled = torch.compile(mlp, backend="inductor")
        mm_default = _sac_step(
            compiled, mlp, x_TD, lambda op: MUST_SAVE if op == torch.ops.aten.mm.default else RECOMPUTE
        )
        save_all = _sac_step(compiled, mlp, x_TD, lambda op: MUST_SAVE)
        save_mm_out = _sac_step(compiled, mlp, x_TD, lambda op: MUST_SAVE if op == torch.ops.aten.mm.out else RECOMPUTE)
    return {
        "ops_seen": sorted(set(mm_default["ops"])),
        "policy_calls": len(mm_default["ops"]),
        "mm_default_saved": mm_default["ops"].count("aten.mm.default"),
        "cached_bytes": mm_default["cached_bytes"],
        "grads_match": mm_default["error"] is None and _match(mm_default["grads"], ref),
        "save_all_error": save_all["error"],
        "save_mm_out_error": save_mm_out["error"],
    }


def fix() -> dict:
    """Wrapped regions: one `inductor_compiled_code` call per forward; the policy saves or recomputes it whole."""
    mlp, x_TD = _setup()
    ref = _eager_grads(mlp, x_TD)
    hop = torch._higher_order_ops.wrap.inductor_compiled_code
    # The option is read when Inductor compiles, so it must be on around the first call of the compiled module.
    with torch._inductor.config.patch(wrap_inductor_compiled_regions=True):
        compiled = torch.compile(mlp, backend="inductor")
        saved_no_ac = _saved_bytes_no_ac(compiled, mlp, x_TD)
        must_save = _sac_step(compiled, mlp, x_TD, lambda op: MUST_SAVE if op is hop else RECOMPUTE)
        recompute = _sac_step(compiled, mlp, x_TD, lambda op: RECOMPUTE)
    return {
        "ops_seen": sorted(set(must_save["ops"])),
        "policy_calls": len(must_save["ops"]),
        "bwd_policy_calls": must_save["bwd_policy_calls"],
        "saved_bytes_no_ac": saved_no_ac,
        "cached_bytes_must_save": must_save["cached_bytes"],
        "cached_bytes_prefer_recompute": recompute["cached_bytes"],
        "grads_match_must_save": must_save["error"] is None and _match(must_save["grads"], ref),
        "grads_match_prefer_recompute": recompute["error"] is None and _match(recompute["grads"], ref),
    }


class _SACAroundCompiled(nn.Module):
    """SAC around a compiled MLP whose policy saves everything it is shown (C6's second way to go wrong)."""

    def __init__(self):
        super().__init__()
        self.mlp = SwiGLU()
        self.compiled = torch.compile(self.mlp, backend="inductor")

    def forward(self, x_TD):
        def context_fn():
            return create_selective_checkpoint_contexts(lambda ctx, op, *args, **kwargs: MUST_SAVE)

        return checkpoint(self.compiled, x_TD, use_reentrant=False, context_fn=context_fn)


class _SaveTheRegion(nn.Module):
    """SAC around a compiled MLP with wrapped regions, its policy saving the one thing it is shown, the region (C7's
    `fix()`: MUST_SAVE on `inductor_compiled_code`); `ac=False` is the same model compiled without AC."""

    def __init__(self, ac: bool = True):
        super().__init__()
        self.mlp = SwiGLU()
        self.compiled = torch.compile(self.mlp, backend="inductor")
        self.ac = ac

    def forward(self, x_TD):
        if not self.ac:
            return self.compiled(x_TD)
        hop = torch._higher_order_ops.wrap.inductor_compiled_code

        def context_fn():
            return create_selective_checkpoint_contexts(
                lambda ctx, op, *args, **kwargs: MUST_SAVE if op is hop else RECOMPUTE
            )

        return checkpoint(self.compiled, x_TD, use_reentrant=False, context_fn=context_fn)


def user_models() -> dict:
    """C6 and C7 as a user's training code holds them, with their inputs: SAC around an Inductor-compiled MLP. C6:
    regions not wrapped (Inductor's default), the policy saving everything it is shown. C7: regions wrapped, the
    region saved whole — it holds at least what the same model holds without AC (its `reference`)."""
    torch.manual_seed(0)
    x_TD = torch.randn(T, D, requires_grad=True)
    torch.manual_seed(0)
    c7, c7_reference = _SaveTheRegion(), _SaveTheRegion(ac=False)
    c7_reference.load_state_dict(c7.state_dict())
    return {
        "C6": {
            "model": _SACAroundCompiled(),
            "inputs": (x_TD,),
            "config": {"torch._inductor.config.wrap_inductor_compiled_regions": False},
        },
        "C7": {
            "model": c7,
            "reference": c7_reference,
            "inputs": (x_TD,),
            "config": {"torch._inductor.config.wrap_inductor_compiled_regions": True},
        },
    }


if __name__ == "__main__":
    print(torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
