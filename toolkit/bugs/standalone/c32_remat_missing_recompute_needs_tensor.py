"""A bare op reading a torch_remat SAVE region's output fails, but only in recompute, without recompute_needs_tensor.

Symptom: in a `torch_remat.checkpoint` block, a SAVE region (`region(..., recompute=False)`) is skipped during
recompute; its output is real there only if some consumer asked the region to keep it. A `remat.region` consumer
asks automatically; a bare op (a residual add, `.contiguous()`, any unwrapped call) cannot be detected. The forward
runs and the loss is right; the backward fails when the recompute reaches the bare op: on a CUDA build of torch
"RuntimeError: … is a placeholder for the output of remat.region … (recompute=False)", on a `+cpu` build the
placeholder cannot even be built (C31: "AttributeError: … _set_storage_data_ptr_access_error_msg"). The same code
with `recompute=True` works, so the error depends on the remat policy, not on the model. The fix is
`remat.recompute_needs_tensor(t)` right before the bare consumer (or wrapping the consumer in a region).

Upstream: torchtitan#4497 (review of the torch_remat migration) and torchtitan docs/remat.md; torch_remat 0.2.2
documents the rule (`region`, `recompute_needs_tensor`). Needs `pip install torch-remat==0.2.2`.

Run: python c32_remat_missing_recompute_needs_tensor.py

Shape suffixes: T tokens, D model dim.
"""

import json
import re

import torch
import torch_remat as remat
from torch import nn

CASE = "C32"
NEEDS = "cpu"

T, D = 32, 64


def _msg(e: BaseException) -> str:
    first = (str(e).splitlines() or [""])[0]
    first = re.sub(r"0x[0-9a-fA-F]+", "0x?", first)
    first = re.sub(r"(?<![\w.])(?:/[^\s:'\"]+)+", "<path>", first)
    return f"{type(e).__name__}: {first}"


def _run(*, consumer: str = "bare", recompute: bool = False) -> dict:
    """`consumer` of the SAVE region's output: "bare", "bare_after_needs_tensor" or "region"."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    proj = nn.Linear(D, D)
    x_TD = torch.randn(T, D, requires_grad=True)

    def residual(h_TD, x_TD):
        return torch.sin(h_TD.contiguous() + x_TD)

    def body(x_TD):
        h_TD = remat.region(proj, "proj", recompute=recompute)(x_TD)
        if consumer == "region":
            return remat.region(residual, "residual", recompute=True)(h_TD, x_TD)
        if consumer == "bare_after_needs_tensor":
            remat.recompute_needs_tensor(h_TD)
        return residual(h_TD, x_TD)

    ref = torch.autograd.grad(body(x_TD).sum(), x_TD)[0]
    try:
        loss = remat.checkpoint(region_name="block")(body)(x_TD).sum()
    except Exception as e:  # noqa: BLE001 - the error text is the observation
        return {"forward_error": _msg(e)}
    try:
        grad = torch.autograd.grad(loss, x_TD)[0]
    except Exception as e:  # noqa: BLE001
        return {"forward_error": None, "backward_error": _msg(e)}
    return {"forward_error": None, "backward_error": None, "grads_match": bool(torch.allclose(grad, ref, atol=1e-6))}


def bug() -> dict:
    """A bare residual reads the SAVE region's output: forward fine, backward fails; with recompute=True it runs."""
    r = _run()
    return {**r, "recompute_true_backward_error": _run(recompute=True)["backward_error"]}


def fix() -> dict:
    """`remat.recompute_needs_tensor(h_TD)` right before the bare consumer: the region keeps its output."""
    return _run(consumer="bare_after_needs_tensor")


def variant_region_consumer() -> dict:
    """The consumer wrapped in a `remat.region` asks for the output by itself."""
    return _run(consumer="region")


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
    print("variant_region_consumer", json.dumps(variant_region_consumer()))
