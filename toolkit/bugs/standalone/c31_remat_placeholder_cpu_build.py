"""torch_remat cannot build its recompute placeholder on a CPU-only torch build: AttributeError in backward.

Symptom: in a `torch_remat.checkpoint` block, a SAVE region (`region(..., recompute=False)`) whose output nothing
reads during recompute (here both of two chained regions: the first one's output only feeds the second, itself
skipped; the second's is the block's output) is skipped in recompute and its output stands in as a storage-free
placeholder. torch_remat poisons the placeholder's storage with `torch._C._set_storage_data_ptr_access_error_msg`,
a helper that only CUDA builds of torch have, so on a `+cpu` wheel the backward of a correct model fails with
`AttributeError: module 'torch._C' has no attribute '_set_storage_data_ptr_access_error_msg'`. On a CUDA build
(also when it runs on CPU, as torch 2.14.1+cu130 here) the same block runs and its gradients are right. Compiled,
the block does not use placeholders and runs on both builds.

Upstream: torch_remat 0.2.2's own tests xfail placeholder tests on CPU-only builds (tests/conftest.py of
meta-pytorch/remat); no torch issue found. Needs `pip install torch-remat==0.2.2`.

Run: python c31_remat_placeholder_cpu_build.py

Shape suffixes: T tokens, D model dim.
"""

import json
import re

import torch
import torch_remat as remat
from torch import nn

CASE = "C31"
NEEDS = "cpu"

T, D = 32, 64


def _msg(e: BaseException) -> str:
    first = (str(e).splitlines() or [""])[0]
    first = re.sub(r"0x[0-9a-fA-F]+", "0x?", first)
    first = re.sub(r"(?<![\w.])(?:/[^\s:'\"]+)+", "<path>", first)
    return f"{type(e).__name__}: {first}"


def _run(*, persist: bool = False, compiled: bool = False) -> dict:
    torch._dynamo.reset()
    torch.manual_seed(0)
    up, down = nn.Linear(D, D), nn.Linear(D, D)
    x_TD = torch.randn(T, D, requires_grad=True)

    def body(x_TD):
        h_TD = remat.region(up, "up", recompute=False)(torch.sin(x_TD))
        out_TD = remat.region(down, "down", recompute=False)(h_TD)
        if persist:
            # Asks each producer to keep its output for recompute, so no placeholder is built; both are needed, as
            # `down` is skipped in recompute too and so does not need `h_TD`.
            remat.recompute_needs_tensor(h_TD, out_TD)
        return out_TD

    ref = torch.autograd.grad(body(x_TD).sum(), x_TD)[0]
    block = remat.checkpoint(region_name="block")(body)
    step = torch.compile(block, backend="aot_eager", fullgraph=True) if compiled else block
    try:
        grad = torch.autograd.grad(step(x_TD).sum(), x_TD)[0]
    except Exception as e:  # noqa: BLE001 - the error text is the observation
        return {"error": _msg(e), "grads_match": None}
    return {"error": None, "grads_match": bool(torch.allclose(grad, ref, atol=1e-6))}


def bug() -> dict:
    """Eager remat block whose last SAVE region's output is not read in recompute; reports whether this build has
    the placeholder helper."""
    return {"has_placeholder_helper": hasattr(torch._C, "_set_storage_data_ptr_access_error_msg"), **_run()}


def fix() -> dict:
    """`recompute_needs_tensor` on both outputs makes the regions keep them: no placeholder, right gradients on any
    build (at the cost of two saved [T, D] tensors)."""
    return _run(persist=True)


def variant_compiled() -> dict:
    """Compiled, the block is plain non-reentrant AC with MUST_SAVE tags: no placeholder, no error."""
    return _run(compiled=True)


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
    print("variant_compiled", json.dumps(variant_compiled()))
