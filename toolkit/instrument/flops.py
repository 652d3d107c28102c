"""The FLOPs of one aten op: torch's own formulas (FlopCounterMode's registry), and the kernels it leaves out.

torch's registry counts matmuls, attention and convolutions by shape and nothing else (pointwise ops are free, as
in every FLOP count of a transformer). Two kernels a step on a CPU runs are not in it: the CPU flash attention
(counted with torch's own attention formula for its shapes) and `_grouped_mm`, the routed experts' one matmul
(2 · rows · in · out, as the same tokens through a loop of `mm` count). Works on fake tensors: shapes only.
"""

from __future__ import annotations

from typing import Any, Callable, cast

import torch

from .. import compat


def _shape(t: Any) -> tuple[int, ...]:
    return tuple(t.shape)


def _grouped_mm(a: torch.Tensor, b: torch.Tensor, *_: Any, **__: Any) -> int:
    if a.dim() == 2 and b.dim() == 3:  # tokens (T, K) by experts (E, K, N): each row through its own expert
        return 2 * a.shape[0] * a.shape[1] * b.shape[-1]
    if a.dim() == 2 and b.dim() == 2:  # the weights' gradient: (K, T) by (T, N), split into E groups along T
        return 2 * a.shape[0] * a.shape[1] * b.shape[1]
    if a.dim() == 3 and b.dim() == 3:  # (E, M, K) by (E, K, N)
        return 2 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]
    return 2 * a.shape[0] * a.shape[-1] * b.shape[-1]  # (E, M, K)-like by 2-D, split along the output


def _cpu_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *_: Any, **__: Any) -> int:
    counts = compat.sdpa_flop_counts()
    return counts[0](_shape(q), _shape(k), _shape(v)) if counts else 0


def _cpu_attention_backward(
    g: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *_: Any, **__: Any
) -> int:
    counts = compat.sdpa_flop_counts()
    return counts[1](_shape(g), _shape(q), _shape(k), _shape(v)) if counts else 0


_OWN: dict[str, Callable[..., int]] = {
    "_grouped_mm": _grouped_mm,
    "_scaled_dot_product_flash_attention_for_cpu": _cpu_attention,
    "_scaled_dot_product_flash_attention_for_cpu_backward": _cpu_attention_backward,
}


def flops(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int | None:
    """The op's FLOPs (0 for an op no formula counts: pointwise, views, copies); None where its shapes are symbolic
    and data-dependent (a compiled graph's unbacked sizes): counting must never guard on them, nor fail the step."""
    torchs = compat.flop_formula(func)
    own = None if torchs else _OWN.get(getattr(getattr(func, "_overloadpacket", None), "__name__", ""))
    if torchs is None and own is None:
        return 0
    try:
        # `own` is set whenever `torchs` is not (the early return above)
        n = torchs(*args, **kwargs, out_val=out) if torchs else cast("Callable[..., int]", own)(*args, **kwargs)
    except (TypeError, ValueError, IndexError, AttributeError, RuntimeError):  # shapes a formula cannot read
        return None
    return n if isinstance(n, int) else None  # a SymInt: left uncounted rather than guarded on
