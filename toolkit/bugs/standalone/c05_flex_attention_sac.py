"""FlexAttention under selective AC: SAC(compile(flex)) with the model uncompiled vs compile(SAC(block with flex)).

Symptom (torch of Aug-Nov 2025 and earlier): with model compile off, a `torch.compile`d flex_attention called
inside an eager SAC region was silently not compiled (warning "SOLUTION: Use torch.compile(flex_attention)(...)"),
because Dynamo declined to compile under SAC's dispatch modes. Since the SAC modes declare
`ignore_compile_internals()` the inner compile runs; what the SAC policy then sees depends on
`torch._inductor.config.wrap_inductor_compiled_regions` (off: only what the generated code dispatches, so flex is
silently recomputed whole; on: one `inductor_compiled_code` call). `bug()` records, on CUDA, whether flex was
compiled (an Inductor frame, no eager-flex warning) and what the policy saw, with the option off and on.
`fix()` is the model-compile-on order, compile(SAC(block)) with the block calling a compiled flex (catalogue C17):
the inner compile is inlined into one graph and the policy sees the `flex_attention` HOP at trace time.

CPU: `bug()`/`fix()` return {"skipped": ...}: in torch 2.13 and 2.14 `flex_attention()` raises NotImplementedError
("FlexAttention does not support backward on CPU") as soon as a CPU input requires grad, in eager, aot_eager and
inductor alike. `variant_cpu()` shows that this is a front-end check: with it patched out, eager and aot_eager flex
backward run on CPU and match SDPA, and the model-compile-on path runs with aot_eager, while Inductor's CPU flex
backward fails.

Upstream: torchtitan#1631 (flex not compiled under SAC), torchtitan#1683 (workaround: full AC on attention when
compile is off), torchtitan#2118 (workaround removed), torchtitan#1645; pytorch#161889, pytorch#161648
(`ignore_compile_internals`), pytorch#167844 (`inductor_compiled_code` HOP), pytorch#169646 (flex CPU backward error).

Run: python c05_flex_attention_sac.py   (CUDA; about 30 s on an H200, most of it Inductor compiling flex)

Shape suffixes: B batch, S sequence, D model dim (= N * A), N heads, A head dim (q_BNSA is [B, N, S, A]).
"""

import copy
import functools
import json
import re
import warnings

import torch
import torch.nn.attention.flex_attention as flex_module
import torch.nn.functional as F
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend
from torch.nn.attention.flex_attention import flex_attention
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

CASE = "C5"
NEEDS = "cuda"

B, N, S, A = 2, 4, 256, 64
D = N * A

CPU_REASON = (
    "FlexAttention has no backward on CPU (torch 2.13.0, 2.14.1 and 2.15.0): flex_attention() raises "
    "NotImplementedError when a CPU input requires grad"
)

_EAGER_FLEX_WARNING = "flex_attention_performance"


def _msg(e: BaseException) -> str:
    first = (str(e).splitlines() or [""])[0]
    first = re.sub(r"0x[0-9a-fA-F]+", "0x?", first)
    first = re.sub(r"(?<![\w.])(?:/[^\s:'\"]+)+", "<path>", first)
    return f"{type(e).__name__}: {first}"


def _save_list():
    # torchtitan's save list, reduced to what this block can emit: matmuls, the flex HOP (seen when the policy runs
    # at trace time) and the wrapped Inductor region (seen when it runs around a compiled callable).
    return {
        torch.ops.aten.mm.default,
        torch.ops.aten.addmm.default,
        torch.ops.higher_order.flex_attention,
        torch._higher_order_ops.wrap.inductor_compiled_code,
    }


def _context_fn(ops):
    # The policy records into `ops` through a closure: Dynamo turns a functools.partial's arguments into constants
    # (copies), so a list passed as a partial argument would stay empty under compile(SAC(...)).
    def policy(ctx, op, *args, **kwargs):
        save = op in _save_list()
        ops.append((str(op), save))
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    return functools.partial(create_selective_checkpoint_contexts, policy)


class Attention(nn.Module):
    def __init__(self, flex_fn):
        super().__init__()
        self.wqkv = nn.Linear(D, 3 * D, bias=False)
        self.wo = nn.Linear(D, D, bias=False)
        self.flex_fn = flex_fn

    def forward(self, x_BSD):
        q_BNSA, k_BNSA, v_BNSA = self.wqkv(x_BSD).view(B, S, 3, N, A).permute(2, 0, 3, 1, 4).unbind(0)
        o_BNSA = self.flex_fn(q_BNSA, k_BNSA, v_BNSA)
        return self.wo(o_BNSA.transpose(1, 2).reshape(B, S, D))


class SACBlock(nn.Module):
    """compile(SAC(block)) needs the checkpoint call inside the compiled forward, as torchtitan's wrapper has it."""

    def __init__(self, block, context_fn):
        super().__init__()
        self.block = block
        self.context_fn = context_fn

    def forward(self, x_BSD):
        return checkpoint(self.block, x_BSD, use_reentrant=False, context_fn=self.context_fn)


def _setup(device, dtype):
    torch._dynamo.reset()
    torch.manual_seed(0)
    block = Attention(None).to(device=device, dtype=dtype)
    x_BSD = torch.randn(B, S, D, device=device, dtype=dtype, requires_grad=True)
    return block, x_BSD


def _grads(block, x_BSD):
    out = [p.grad.clone() for p in block.parameters()] + [x_BSD.grad.clone()]
    block.zero_grad(set_to_none=True)
    x_BSD.grad = None
    return out


def _loss(y_BSD):
    # A real upstream grad (not the expanded ones of .sum()), and fp32 accumulation for bf16 runs.
    return (y_BSD.float() ** 2).mean()


def _reference(block, x_BSD):
    # fp32 copy, eager flex (unfused, materialises the scores; fine at S=256), no AC: what both orders must match.
    ref_block = copy.deepcopy(block).float()
    ref_block.flex_fn = flex_attention
    x_ref = x_BSD.detach().float().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _loss(ref_block(x_ref)).backward()
    return _grads(ref_block, x_ref)


def _match(a, b) -> bool:
    # Normwise relative error against the fp32 reference: bf16 with a fused softmax is off by ~1e-2 elementwise;
    # a wrong gradient is off by O(1).
    return all(((g.float() - r).norm() / r.norm().clamp_min(1e-12)).item() < 5e-2 for g, r in zip(a, b))


def _eager_flex_warned(fn):
    """Run fn and report whether flex_attention took its uncompiled path (it warns once per process, so the
    record is cleared first)."""
    shown = flex_module._WARNINGS_SHOWN
    before = _EAGER_FLEX_WARNING in shown
    shown.discard(_EAGER_FLEX_WARNING)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
            result = fn()
        warned = _EAGER_FLEX_WARNING in shown
    finally:
        if before:
            shown.add(_EAGER_FLEX_WARNING)
    return result, warned


def _fwd_bwd(forward, block, x_BSD, ref):
    """(error or None, grads match the reference, eager-flex warning seen in forward)."""
    warned = False
    try:
        y_BSD, warned = _eager_flex_warned(forward)
        _loss(y_BSD).backward()
        return None, _match(_grads(block, x_BSD), ref), warned
    except Exception as e:  # noqa: BLE001 - the error text is the observation
        return _msg(e), False, warned


def _sac_around_compiled_flex(device, dtype, backend, wrap: bool) -> dict:
    """Model compile off: eager block, compiled flex, SAC around the block (torchtitan before #1683 / after #2118)."""
    counter = CompileCounterWithBackend(backend)
    block, x_BSD = _setup(device, dtype)
    ref = _reference(block, x_BSD)
    block.flex_fn = torch.compile(flex_attention, backend=counter)
    ops = []
    context_fn = _context_fn(ops)
    # The option is read when Inductor compiles, i.e. at the first call.
    with torch._inductor.config.patch(wrap_inductor_compiled_regions=wrap):
        error, grads_match, warned = _fwd_bwd(
            lambda: checkpoint(block, x_BSD, use_reentrant=False, context_fn=context_fn), block, x_BSD, ref
        )
    fwd_ops = list(ops)  # nothing is recorded in backward: 2.13 calls the policy in forward only
    return {
        "flex_compiled": counter.frame_count > 0 and not warned,
        "flex_frames": counter.frame_count,
        "eager_flex_warning": warned,
        "policy_ops": sorted({o for o, _ in fwd_ops}),
        "policy_saved": sorted({o for o, save in fwd_ops if save}),
        # Could the policy save flex's output at all? Only if it saw the flex HOP or the wrapped region.
        "flex_saveable": any(o in ("flex_attention", "inductor_compiled_code") for o, _ in fwd_ops),
        "error": error,
        "grads_match": grads_match,
    }


def _compile_sac_block(device, dtype, backend) -> dict:
    """Model compile on: compile(SAC(block)), the block calling a compiled flex (C17: the inner compile is inlined)."""
    block, x_BSD = _setup(device, dtype)
    ref = _reference(block, x_BSD)
    block.flex_fn = torch.compile(flex_attention, backend=backend)
    ops = []
    context_fn = _context_fn(ops)
    counter = CompileCounterWithBackend(backend)
    model = torch.compile(SACBlock(block, context_fn), backend=counter, fullgraph=True)
    error, grads_match, warned = _fwd_bwd(lambda: model(x_BSD), block, x_BSD, ref)
    trace_ops = list(ops)
    return {
        "graphs": counter.frame_count,
        "eager_flex_warning": warned,
        # Under compile the policy runs while AOTAutograd traces (never at run time), once per traced op.
        "policy_saw_flex": any(o == "flex_attention" for o, _ in trace_ops),
        "policy_saved": sorted({o for o, save in trace_ops if save}),
        "error": error,
        "grads_match": grads_match,
    }


def bug() -> dict:
    if not torch.cuda.is_available():
        return {"skipped": CPU_REASON}
    off = _sac_around_compiled_flex("cuda", torch.bfloat16, "inductor", wrap=False)
    on = _sac_around_compiled_flex("cuda", torch.bfloat16, "inductor", wrap=True)
    return {**{f"{k}_nowrap": v for k, v in off.items()}, **{f"{k}_wrap": v for k, v in on.items()}}


def fix() -> dict:
    if not torch.cuda.is_available():
        return {"skipped": CPU_REASON}
    return _compile_sac_block("cuda", torch.bfloat16, "inductor")


def variant_cpu() -> dict:
    """What torch 2.13 does with flex backward on CPU, and how far it gets with the front-end check patched out."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 128, 16, requires_grad=True) for _ in range(3))

    def fwd_bwd(fn):
        try:
            out = fn(q, k, v)
            got = torch.autograd.grad(out.sum(), (q, k, v))
        except Exception as e:  # noqa: BLE001
            return _msg(e)
        ref = F.scaled_dot_product_attention(q, k, v)
        want = torch.autograd.grad(ref.sum(), (q, k, v))
        return torch.allclose(out, ref, atol=1e-5) and all(torch.allclose(g, w, atol=1e-4) for g, w in zip(got, want))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = {
            "eager": fwd_bwd(flex_attention),
            "aot_eager": fwd_bwd(torch.compile(flex_attention, backend="aot_eager")),
        }
        check = flex_module._validate_device
        flex_module._validate_device = lambda *args: None
        try:
            torch._dynamo.reset()
            result["unchecked_eager_matches_sdpa"] = fwd_bwd(flex_attention)
            result["unchecked_aot_eager_matches_sdpa"] = fwd_bwd(torch.compile(flex_attention, backend="aot_eager"))
            torch._dynamo.reset()
            result["unchecked_inductor"] = fwd_bwd(torch.compile(flex_attention, backend="inductor"))
            # The model-compile-on path on CPU (fp32, aot_eager): same code as fix(), minus Inductor.
            dry = _compile_sac_block("cpu", torch.float32, "aot_eager")
            result["unchecked_compile_sac_block"] = {
                k: dry[k] for k in ("graphs", "policy_saw_flex", "policy_saved", "error", "grads_match")
            }
        finally:
            flex_module._validate_device = check
    return result


if __name__ == "__main__":
    print(torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
    print("variant_cpu", json.dumps(variant_cpu()))
