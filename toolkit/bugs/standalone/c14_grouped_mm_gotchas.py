"""torch._grouped_mm on CPU: compiled dtype, stride alignment and backward-stride limits of the CPU fallback.

Symptom: eager fp32 `torch._grouped_mm` runs on CPU, but compiling it fails ("Expected inputs of BF16 type", raised
by the meta kernel), shapes whose row strides are not a multiple of 16 bytes fail ("strides should be multiple of 16
bytes"), and backward from `y.sum()` fails on the expanded upstream grad ("Invalid strides/sizes, got [0, 0] ...").
Workarounds (`fix`): compile in bf16; pad D/H to multiples of 8 (bf16) or 4 (fp32), i.e. 16-byte rows; use a loss
whose grad is a real tensor (`(y * y).mean()`) or make the grad contiguous with a tensor hook.

Upstream: pytorch#153384 (grouped_mm under compile), pytorch#161717 (CPU fallback), transformers#46743 (notes).

Run: python c14_grouped_mm_gotchas.py

Shape suffixes: T tokens routed to experts (rows, already grouped by expert), D model dim, H expert hidden dim,
E experts (x_TD is [T, D], w_EDH is [E, D, H], offs_E is the int32 cumulative row count per expert).
"""

import json
import logging
import re

import torch
import torch.nn.functional as F

CASE = "C14"
NEEDS = "cpu"

E, D, H, T = 4, 64, 128, 32


def _msg(e: BaseException) -> str:
    first = (str(e).splitlines() or [""])[0]
    first = re.sub(r"0x[0-9a-fA-F]+", "0x?", first)
    first = re.sub(r"(?<![\w.])(?:/[^\s:'\"]+)+", "<path>", first)
    return f"{type(e).__name__}: {first}"


def _cause(e: BaseException) -> str | None:
    # Dynamo wraps the fake-tensor failure in a generic first line; the kernel's own message is quoted inside.
    m = re.search(r"got (\w+)\('(.*?)'\)", str(e))
    return f"{m.group(1)}: {m.group(2)}" if m else None


def _inputs(dtype, d=D, h=H):
    torch.manual_seed(0)
    x_TD = torch.randn(T, d, dtype=dtype, requires_grad=True)
    w_EDH = torch.randn(E, d, h, dtype=dtype, requires_grad=True)
    offs_E = torch.arange(1, E + 1, dtype=torch.int32) * (T // E)
    return x_TD, w_EDH, offs_E


def grouped(x_TD, w_EDH, offs_E):
    return torch._grouped_mm(x_TD, w_EDH, offs=offs_E)


def _loop(x_TD, w_EDH, offs_E):
    starts = [0] + offs_E.tolist()[:-1]
    return torch.cat([x_TD[s:e] @ w_EDH[i] for i, (s, e) in enumerate(zip(starts, offs_E.tolist()))])


def _try(fn):
    try:
        fn()
        return None
    except Exception as e:  # noqa: BLE001 - the error text is the observation
        return e


def _true(fn) -> bool:
    """fn() ran and returned True (a check of its result); False if it raised."""
    try:
        return bool(fn())
    except Exception:  # noqa: BLE001
        return False


class _QuietFakeTensorLog:
    """FakeTensor logs the meta kernel's traceback at ERROR level before Dynamo re-raises it; keep stderr clean."""

    def __enter__(self):
        self.log = logging.getLogger("torch._subclasses.fake_tensor")
        self.level = self.log.level
        self.log.setLevel(logging.CRITICAL)

    def __exit__(self, *exc):
        self.log.setLevel(self.level)


def bug() -> dict:
    torch._dynamo.reset()
    x_TD, w_EDH, offs_E = _inputs(torch.float32)
    eager_fp32 = _try(lambda: grouped(x_TD, w_EDH, offs_E))
    with _QuietFakeTensorLog():
        compiled_fp32 = _try(lambda: torch.compile(grouped, backend="aot_eager", fullgraph=True)(x_TD, w_EDH, offs_E))
    # 62 fp32 = 248-byte rows
    unaligned = _try(lambda: grouped(*_inputs(torch.float32, d=62)))
    # y.sum()'s backward hands grouped_mm's backward an expanded ones tensor (strides [0, 0]).
    sum_backward = _try(lambda: grouped(x_TD, w_EDH, offs_E).sum().backward())
    return {
        "eager_fp32_runs": eager_fp32 is None,
        "compiled_fp32": compiled_fp32 and _msg(compiled_fp32),
        "compiled_fp32_cause": compiled_fp32 and _cause(compiled_fp32),
        "unaligned": unaligned and _msg(unaligned),
        "sum_backward": sum_backward and _msg(sum_backward),
    }


def fix() -> dict:
    torch._dynamo.reset()
    compiled = torch.compile(grouped, backend="aot_eager", fullgraph=True)

    def compiled_bf16(loss):
        x_TD, w_EDH, offs_E = _inputs(torch.bfloat16)
        loss(compiled(x_TD, w_EDH, offs_E)).backward()

    def padded(dtype, d):
        # Zero-padding the contraction dim leaves the product unchanged; True = it ran and matches a per-expert loop.
        x_TD, w_EDH, offs_E = _inputs(dtype, d=d)
        pad = (-d) % (16 // x_TD.element_size())
        y_TH = grouped(F.pad(x_TD, (0, pad)), F.pad(w_EDH, (0, 0, 0, pad)), offs_E)
        return torch.allclose(y_TH.float(), _loop(x_TD, w_EDH, offs_E).float(), rtol=1e-2, atol=1e-2)

    def contiguous_grad():
        # True = it ran and the grads match a per-expert loop.
        x_TD, w_EDH, offs_E = _inputs(torch.float32)
        y_TH = grouped(x_TD, w_EDH, offs_E)
        y_TH.register_hook(lambda g: g.contiguous())
        y_TH.sum().backward()
        got = [x_TD.grad, w_EDH.grad]
        x_TD.grad = w_EDH.grad = None
        _loop(x_TD, w_EDH, offs_E).sum().backward()
        return all(torch.allclose(g, r, rtol=1e-5, atol=1e-5) for g, r in zip(got, [x_TD.grad, w_EDH.grad]))

    def mean_square():
        x_TD, w_EDH, offs_E = _inputs(torch.float32)
        y_TH = grouped(x_TD, w_EDH, offs_E)
        (y_TH * y_TH).mean().backward()

    with _QuietFakeTensorLog():
        return {
            "compiled_bf16_runs": _try(lambda: compiled_bf16(lambda y: (y.float() ** 2).mean())) is None,
            # Unlike eager, the compiled backward gets a real grad tensor, so y.sum() is fine there.
            "compiled_bf16_sum_backward_runs": _try(lambda: compiled_bf16(lambda y: y.sum())) is None,
            "padded_bf16_runs": _true(lambda: padded(torch.bfloat16, 60)),
            "padded_fp32_runs": _true(lambda: padded(torch.float32, 62)),
            "mean_square_loss_runs": _try(mean_square) is None,
            "sum_contiguous_grad_runs": _true(contiguous_grad),
        }


def variant_alignment() -> dict:
    """Which contraction dims run eagerly: the rule is 16-byte row strides, so fp32 needs D % 4, bf16 D % 8; the
    compiled (meta) check words the same limit differently."""
    torch._dynamo.reset()
    dims = [60, 62, 64, 68, 72]
    ok = {
        dt: [d for d in dims if _try(lambda: grouped(*_inputs(dt, d=d))) is None]
        for dt in (torch.float32, torch.bfloat16)
    }
    with _QuietFakeTensorLog():
        compiled = _try(
            lambda: torch.compile(grouped, backend="aot_eager", fullgraph=True)(*_inputs(torch.bfloat16, d=60))
        )
    return {
        "dims": dims,
        "fp32_ok": ok[torch.float32],
        "bf16_ok": ok[torch.bfloat16],
        # H (the output row stride) follows the same rule; offsets need no alignment on the CPU fallback.
        "fp32_h126_runs": _try(lambda: grouped(*_inputs(torch.float32, h=126))) is None,
        "compiled_bf16_unaligned_cause": compiled and _cause(compiled),
    }


class _Experts(torch.nn.Module):
    """Grouped-GEMM experts in fp32, as a user's MoE layer calls `torch._grouped_mm` on its tokens sorted by expert."""

    def __init__(self):
        super().__init__()
        self.w_EDH = torch.nn.Parameter(torch.randn(E, D, H) * 0.05)

    def forward(self, x_TD, offs_E):
        return grouped(x_TD, self.w_EDH, offs_E)


def user_models() -> dict:
    """C14 as a user's training code holds it: fp32 grouped-GEMM experts compiled whole (aot_eager, fullgraph), which
    runs eagerly but fails to compile where the CPU kernel's meta function takes bf16 only; and its inputs."""
    x_TD, _, offs_E = _inputs(torch.float32)
    return {"C14": {"model": torch.compile(_Experts(), backend="aot_eager", fullgraph=True), "inputs": (x_TD, offs_E)}}


if __name__ == "__main__":
    print(torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
    print("variant_alignment", json.dumps(variant_alignment()))
