"""A compiled MoE inside a torch_remat checkpoint reaches the recompile limit: replay reads a kept placeholder.

Symptom: a per-expert loop over `nonzero` (each expert's rows a new shape) compiled inside a `torch_remat.checkpoint`
block whose expert matmuls are kept regions (`recompute=False`, torchtitan main's selective policy). While the frames
recompile under the limit, the step is exact. Once Dynamo's recompile limit is reached inside the step, its backward
fails: on a CUDA build torch_remat raises "... is a placeholder for the output of remat.region 'w2.expert1'
(recompute=False)"; on a +cpu build (2.13.0's wheel) it cannot even make the placeholder (C31: `AttributeError:
... _set_storage_data_ptr_access_error_msg`). The toolkit stands in for the missing helper with NaN-filled buffers
(C31), so there the same read shows as NaN gradients: how the matrix's eager column found this case (2.13.0, the toolkit
model's `moe:nonzero` × remat_selective × `moe` / `experts` scope × `eager`, 12 recompiles in one step; exact with the
limit raised to 64). 2.14.1 and 2.15.0 recompile fewer times in that cell and stay under the limit.

Mechanism: compiled frames trace torch_remat's regions away (C45: under compile `recompute=False` is honoured only in a
compiled checkpoint); the frames that run after the limit is reached run eagerly and keep their regions. Replay
re-runs the block and a bare op (the `index_add` that scatters an expert's output) meets a kept region's output that
replay skipped: a placeholder. Forced here with `recompile_limit=1`, which the backend does not matter for.

Fix: keep the step under the recompile limit (raise `torch._dynamo.config.recompile_limit`, or `mark_dynamic` the
varying dimension), or compile the whole checkpointed block (C45's advice), or do not compile inside it.

Upstream: none found (2026-12); torch_remat's own docs (docs/compilation.md) list regions under compile as unsupported.
Needs `pip install torch-remat==0.2.2`.

Run: python c64_remat_recompile_limit_replay_reads_placeholder.py

Shape suffixes: T tokens, D dim, F expert hidden, E experts, N rows routed to one expert.
"""

import json
import re

import torch
import torch.nn.functional as F
import torch_remat as remat
from torch import nn

CASE = "C64"
NEEDS = "cpu"

T, D, FH, E = 32, 16, 32, 4


def _msg(e: BaseException) -> str:
    first = (str(e).splitlines() or [""])[0]
    first = re.sub(r"0x[0-9a-fA-F]+", "0x?", first)
    first = re.sub(r"(?<![\w.])(?:/[^\s:'\"]+)+", "<path>", first)
    return f"{type(e).__name__}: {first[:120]}"


class Experts(nn.Module):
    """Each expert's rows found with `nonzero` (a new shape per expert), its two matmuls kept regions."""

    def __init__(self):
        super().__init__()
        self.w1_EFD = nn.Parameter(torch.randn(E, FH, D) * 0.1)
        self.w3_EFD = nn.Parameter(torch.randn(E, FH, D) * 0.1)
        self.w2_EDF = nn.Parameter(torch.randn(E, D, FH) * 0.1)

    def forward(self, x_TD, ids_T):
        out_TD = torch.zeros_like(x_TD)
        for e in range(E):
            rows_N = torch.nonzero(ids_T == e).squeeze(-1)
            gate_NF, up_NF = remat.region(
                lambda x, w1, w3: (x @ w1.t(), x @ w3.t()), f"w13.expert{e}", recompute=False
            )(x_TD[rows_N], self.w1_EFD[e], self.w3_EFD[e])
            remat.recompute_needs_tensor(gate_NF, up_NF)
            y_ND = remat.region(lambda h, w2: h @ w2.t(), f"w2.expert{e}", recompute=False)(
                F.silu(gate_NF) * up_NF, self.w2_EDF[e]
            )
            remat.recompute_needs_tensor(y_ND)
            out_TD = out_TD.index_add(0, rows_N, y_ND)
        return out_TD


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.router = nn.Linear(D, E)
        self.experts = Experts()

    def forward(self, x_TD):
        top = self.router(x_TD).softmax(-1).topk(1, dim=-1)
        return x_TD + self.experts(x_TD, top.indices.squeeze(-1)) * top.values


def _step(backend: str | None, limit: int) -> dict:
    """One training step of the checkpointed block (the experts compiled by `backend`), against the same block
    uncompiled and not checkpointed."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    ref_block = Block()
    block = Block()
    block.load_state_dict(ref_block.state_dict())
    x_TD = torch.randn(T, D)
    ref_block(x_TD).square().mean().backward()
    if backend is not None:
        block.experts.compile(backend=backend)
    with torch._dynamo.config.patch(recompile_limit=limit):
        try:
            remat.checkpoint()(block)(x_TD).square().mean().backward()
        except Exception as e:  # noqa: BLE001
            return {"error": _msg(e)}
    grads = [(p.grad, q.grad) for p, q in zip(block.parameters(), ref_block.parameters())]
    return {
        "error": None,
        "grads_finite": all(bool(g.isfinite().all()) for g, _ in grads),
        "grads_match": all(bool(torch.allclose(g, r, atol=1e-6)) for g, r in grads),
    }


def bug() -> dict:
    """The recompile limit reached inside the step (1: every new expert shape after the first runs eagerly)."""
    eager = _step("eager", limit=1)
    error = eager["error"] or ""
    return {
        "eager_backend_limit_1": eager,
        "aot_eager_limit_1": _step("aot_eager", limit=1),
        "placeholder_read": "is a placeholder for the output of remat.region" in error,
        "build_cannot_make_placeholders": "_set_storage_data_ptr_access_error_msg" in error,
        "fails_at_the_limit": error != "",
    }


def fix() -> dict:
    """Under the limit (the default, 8, is enough for 4 experts here) the same step is exact."""
    return {"eager_backend_default_limit": _step("eager", limit=8), "not_compiled": _step(None, limit=1)}


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
