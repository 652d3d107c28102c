"""torchtitan main's local-compiled SwiGLU recompiles for each call shape and dtype: why main sets recompile_limit=16.

Symptom: main compiles small functions instead of blocks (`@local_compile`, #4895); its SwiGLU is one compiled
function called from every feed-forward of the model — the routed experts' rows (bf16 out of the grouped GEMM, a
number of rows set by the routing), the shared expert's rows (fp32, all tokens), dense blocks. Each new shape or
dtype fails the compiled graph's guards ("tensor 'up' size mismatch at index 0", "dtype mismatch. expected
BFloat16, actual Float") and compiles again: one recompile per variant, expected and bounded. Main raises the
activation's `recompile_limit` to 16 for it ("DeepSeek-V3 at TP8 needs 10"); under Dynamo's default limit (8) the
variants past it would run eagerly — here, with the limit set to one graph, the third variant raises (fullgraph).
The central list's `torchtitan_main` recipe cells are `recompiles` for this (4 graphs: SwiGLU twice, RoPE, loss).

Fix: nothing is wrong as long as the compiled function's recompile_limit is above its number of call variants, as
main sets it. To have one graph: call it in one dtype and mark the row dimension dynamic.

Upstream: torchtitan#4895 (local compile), torchtitan main's models/common/activation.py (recompile_limit=16).

Run: python c57_local_compiled_swiglu_recompiles_per_call_shape.py

Shapes: R routed rows, T tokens, F hidden.
"""

import json
import re

import torch
import torch.nn.functional as F

CASE = "C57"
NEEDS = "cpu"

T, F_HIDDEN = 64, 128


def _msg(e: BaseException) -> str:
    first = (str(e).splitlines() or [""])[0]
    return f"{type(e).__name__}: {re.sub(r'0x[0-9a-fA-F]+', '0x?', first)}"


def swiglu(gate, up):
    torch._dynamo.mark_static(gate, -1)  # main keeps the hidden size static: each size its own graph
    torch._dynamo.mark_static(up, -1)
    return F.silu(gate) * up


def _calls(limit: int, *, one_dtype: bool = False) -> dict:
    """One model step's SwiGLU calls through one compiled function (aot_eager, fullgraph, `recompile_limit`);
    `one_dtype`: every call in fp32 with its row dimension marked dynamic."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch._dynamo.utils.guard_failures.clear()
    torch.manual_seed(0)
    compiled = torch.compile(swiglu, backend="aot_eager", fullgraph=True)
    calls = [
        ("routed, bf16", torch.randn(2 * T, F_HIDDEN, dtype=torch.bfloat16)),  # R = T·K rows out of the grouped GEMM
        ("shared, fp32", torch.randn(T, F_HIDDEN)),  # the shared expert: every token, fp32
        ("dense, fp32", torch.randn(3 * T, F_HIDDEN)),  # another row count (a dense block, another batch)
    ]
    error, ran = None, []
    with torch._dynamo.config.patch(recompile_limit=limit):
        try:
            for name, x_RF in calls:
                gate_RF = x_RF.float() if one_dtype else x_RF
                up_RF = gate_RF.clone()
                if one_dtype:
                    torch._dynamo.mark_dynamic(gate_RF, 0)
                    torch._dynamo.mark_dynamic(up_RF, 0)
                compiled(gate_RF, up_RF)
                ran.append(name)
        except Exception as e:  # noqa: BLE001 - the error is the observation
            error = _msg(e)
    reasons = [str(r) for failures in torch._dynamo.utils.guard_failures.values() for r in failures]
    return {
        "ran": ran,
        "graphs": int(torch._dynamo.utils.counters["stats"]["unique_graphs"]),
        "recompiles": len(reasons),
        "dtype_guard": any("dtype mismatch" in r for r in reasons),
        "size_guard": any("size mismatch" in r for r in reasons),
        "error": error,
    }


def bug() -> dict:
    """Main's limit (16): every call runs compiled; the bf16 → fp32 change recompiles (the recompiled graph is dynamic
    in its rows, so the third row count reuses it)."""
    return _calls(16)


def fix() -> dict:
    """One dtype, rows marked dynamic: one graph for every call."""
    return _calls(16, one_dtype=True)


def variant_limit_one() -> dict:
    """The same calls under a limit of one graph: the second variant stops the function (fullgraph raises; without
    fullgraph it would run eagerly) — what main's raised limit is there to prevent."""
    return _calls(1)


class _FeedForwards(torch.nn.Module):
    """A user's MoE feed-forwards through one compiled SwiGLU, as main calls it: the routed experts' rows in bf16
    (two per token), the shared expert's in fp32."""

    def __init__(self):
        super().__init__()
        self.w_gate_TF = torch.nn.Parameter(torch.randn(F_HIDDEN, F_HIDDEN) * 0.05)
        self.w_up_TF = torch.nn.Parameter(torch.randn(F_HIDDEN, F_HIDDEN) * 0.05)
        self.swiglu = torch.compile(swiglu, backend="aot_eager", fullgraph=True)

    def forward(self, x_TF):
        x_RF = torch.cat([x_TF, x_TF]).bfloat16()
        routed_RF = self.swiglu(x_RF @ self.w_gate_TF.bfloat16(), x_RF @ self.w_up_TF.bfloat16())
        shared_TF = self.swiglu(x_TF @ self.w_gate_TF, x_TF @ self.w_up_TF)
        return routed_RF.float()[:T] + routed_RF.float()[T:] + shared_TF


def user_models() -> dict:
    """C57 as a user's training code holds it: one compiled SwiGLU called in one step with two dtypes and row counts;
    and its input."""
    torch.manual_seed(0)
    return {"C57": {"model": _FeedForwards(), "inputs": (torch.randn(T, F_HIDDEN, requires_grad=True),)}}


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
    print("variant_limit_one", json.dumps(variant_limit_one()))
