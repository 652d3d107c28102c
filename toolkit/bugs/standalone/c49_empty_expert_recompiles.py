"""An expert that receives no tokens makes a compiled expert MLP recompile for its zero-row input (torchtitan#1364).

Symptom: for-loop MoE experts called through one `torch.compile`d MLP, the rows split by the token counts and dim 0
marked dynamic, compile one graph for every count — until an expert gets no tokens: its [0, D] input fails the
dynamic graph's `2 <= x.size()[0]` guard (sizes 0 and 1 are specialized) and Dynamo compiles a second graph. Without
`mark_dynamic` each new count recompiles anyway (static first, then dynamic) and the empty expert adds one more. A
router bias of -1e4 on one expert starves it here; in training a collapsing router does the same.

Fix (torchtitan#1364's proposal): hide zero-row experts from the compiler (skip them; their output is empty) and
mark the rest dynamic: one graph whatever the counts.

torchtitan#1364 also reported dynamic-shape errors; on torch 2.13.0 / 2.14.1 the zero-row call recompiles and raises
nothing (`error` stays None).

Upstream: torchtitan#1364 (DSv3 compile support: zero-shaped inactive experts), torchtitan#2369 (static shapes for
the for-loop path).

Run: python c49_empty_expert_recompiles.py

Shape suffixes: T tokens, D model dim, E experts, K top-k, H expert hidden dim, n rows of one expert.
"""

import json
import re

import torch
import torch.nn.functional as F

CASE = "C49"
NEEDS = "cpu"

T, D, E, K, H = 64, 64, 4, 2, 128
STEPS = 3


def _msg(e: BaseException) -> str:
    first = (str(e).splitlines() or [""])[0]
    first = re.sub(r"0x[0-9a-fA-F]+", "0x?", first)
    return f"{type(e).__name__}: {first}"


def mlp(x_nD: torch.Tensor, w1_DH: torch.Tensor, w2_HD: torch.Tensor) -> torch.Tensor:
    return F.silu(x_nD @ w1_DH) @ w2_HD


def _steps(*, starve: bool, mark_dynamic: bool, skip_empty: bool) -> dict:
    """STEPS routing steps through one compiled expert MLP (aot_eager): the graphs it compiled, the last counts."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    gate_DE = torch.randn(D, E) * 0.1
    w1_EDH, w2_EHD = torch.randn(E, D, H) * 0.1, torch.randn(E, H, D) * 0.1
    bias_E = torch.zeros(E)
    if starve:
        bias_E[E - 1] = -1e4  # expert E-1 never wins a top-k slot
    compiled = torch.compile(mlp, backend="aot_eager")
    error, counts_E = None, None
    try:
        for _ in range(STEPS):
            x_TD = torch.randn(T, D)
            ids_TK = torch.topk(x_TD @ gate_DE + bias_E, K, dim=-1).indices
            counts_E = torch.bincount(ids_TK.flatten(), minlength=E)
            order_N = torch.argsort(ids_TK.flatten(), stable=True)
            for e, x_nD in enumerate(torch.split(x_TD[order_N // K], counts_E.tolist())):
                if skip_empty and x_nD.shape[0] == 0:
                    continue
                if mark_dynamic:
                    torch._dynamo.mark_dynamic(x_nD, 0)
                compiled(x_nD, w1_EDH[e], w2_EHD[e])
    except Exception as e:  # noqa: BLE001 - the error is the observation
        error = _msg(e)
    return {
        "error": error,
        "graphs": int(torch._dynamo.utils.counters["stats"]["unique_graphs"]),
        "counts": counts_E.tolist() if counts_E is not None else None,
    }


def _both(**kwargs) -> dict:
    balanced, starved = _steps(starve=False, **kwargs), _steps(starve=True, **kwargs)
    return {
        "graphs_balanced": balanced["graphs"],
        "graphs_starved": starved["graphs"],
        "counts_starved": starved["counts"],
        "error": balanced["error"] or starved["error"],
    }


def bug() -> dict:
    """Dim 0 marked dynamic: one graph while every expert has tokens, two once one has none."""
    return _both(mark_dynamic=True, skip_empty=False)


def fix() -> dict:
    """Empty experts skipped, the rest marked dynamic: one graph, starved or not."""
    return _both(mark_dynamic=True, skip_empty=True)


def variant_static() -> dict:
    """No mark_dynamic: the second count recompiles dynamic, the storage offset's 0/1 specialization once more, and
    the empty expert once more again."""
    return _both(mark_dynamic=False, skip_empty=False)


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
    print("variant_static", json.dumps(variant_static()))
