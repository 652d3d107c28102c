"""A module compiled inside an eager torch_remat checkpoint loses its `recompute=False` regions: they are recomputed.

Symptom: a block checkpointed with `torch_remat.checkpoint` keeps the output of a SAVE region (`remat.region(...,
recompute=False)`) for backward and skips it in recompute — until the submodule that declares the region is
compiled (`torch.compile(submodule)`, "compile inside a remat region"): then nothing is kept for the region and
the whole submodule re-runs in backward. No warning; gradients stay right, only memory and time change. Under
compile, torch_remat honours `recompute=False` only while a *compiled* `remat.checkpoint` is being traced
(`torch_remat._compile.compiled_region` passes through otherwise).

Fixes: compile only functions that declare no regions (torchtitan main's `@local_compile` functions: norms,
activations, RoPE), or compile the whole checkpointed block, where the regions are tagged MUST_SAVE for the
partitioner.

Upstream: torchtitan main's rule "compile inside a remat region is fine; avoid remat inside a compiled region"
(docs/torch_compile_asks, #4895); torch_remat docs/compilation.md. Found by the toolkit's matrix; no upstream
report. Needs `pip install torch-remat==0.2.2`.

Run: python c45_compile_inside_remat_drops_save_regions.py

Shape suffixes: T tokens, D model dim, F hidden dim.
"""

import json

import torch
import torch_remat as remat
from torch import nn

CASE = "C45"
NEEDS = "cpu"

T, D, F = 64, 32, 64


class Projection(nn.Module):
    """`up` is a SAVE region: its output is kept for backward and `up` is skipped in recompute."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(D, F, bias=False)
        self.act = torch.relu

    def forward(self, x_TD):
        h_TF = remat.region(self.up, "up", recompute=False)(x_TD)
        remat.recompute_needs_tensor(h_TF)
        return self.act(h_TF)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = Projection()
        self.down = nn.Linear(F, D, bias=False)

    def forward(self, x_TD):
        return x_TD + self.down(self.proj(x_TD))


class _Kept:
    """Bytes of the storages torch_remat packs as kept by a SAVE region (its own account, not ours)."""

    def __init__(self):
        self.keys = {}

    def pack(self, t):
        if (
            remat.current_saved_tensor_info().kind != remat.SavedTensorKind.CHECKPOINT_INPUT
            and not isinstance(t, nn.Parameter)
            and not torch.compiler.is_compiling()
        ):
            st = t.untyped_storage()
            self.keys[st._cdata] = st.nbytes()
        return t


def _run(scope: str) -> dict:
    """One step of a remat-checkpointed block; `scope` = what is compiled ("none", "proj" inside the checkpoint).
    Returns the bytes torch_remat packs as kept by SAVE regions, and whether the input gradient equals the one
    of the same block run without any checkpoint."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    block = Block()
    x_TD = torch.randn(T, D, requires_grad=True)
    block(x_TD).square().mean().backward()
    expected, x_TD.grad = x_TD.grad, None
    if scope == "proj":
        block.proj = torch.compile(block.proj, backend="aot_eager", fullgraph=True)
    elif scope == "activation":  # torchtitan main's way: a small compiled function with no region inside
        block.proj.act = torch.compile(torch.relu, backend="aot_eager", fullgraph=True)
    kept = _Kept()
    step = remat.checkpoint(region_name="block", saved_tensors_hooks=(kept.pack, lambda t: t))(block)
    step(x_TD).square().mean().backward()
    return {"kept_bytes": sum(kept.keys.values()), "grads_match": bool(torch.equal(x_TD.grad, expected))}


def bug() -> dict:
    """Eager: the SAVE region keeps what `up` saves and outputs (x_TD 8192 B + h_TF 16384 B). Compiling `proj`
    inside the checkpoint: nothing is kept — the region is recomputed — and the gradients are still right, so
    nothing says so."""
    return {"eager": _run("none"), "compiled_inside": _run("proj")}


def fix() -> dict:
    """Compile a function without regions instead (here: only the activation), keeping `up` an eager SAVE
    region: its output is kept again."""
    return {"compiled_activation": _run("activation")}


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
