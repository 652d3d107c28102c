"""A Python side effect inside a torch_remat SAVE region stops torch.compile, even with the checkpoint side-effect flag.

Symptom: a `torch_remat.region(..., recompute=False)` whose function updates Python state (a call counter on an
object here; a metrics dict or a lazily built cache in real code), inside a `torch_remat.checkpoint` block compiled with
`fullgraph=True`, fails with `Unsupported: HOP: Non-nullified side effect`. Unlike plain checkpoint regions (C29),
`torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint=True` does not help: under compile a SAVE region
is traced through the `dynamo_bypassing_wrapper` higher-order op, which refuses side effects on its own. The same
update in the block's body or in a `recompute=True` region compiles with the flag. Eagerly the block runs, and the
update happens twice (forward and recompute) unless it sits in a SAVE region.

Upstream: by design in torch_remat 0.2.2 (torch_remat/_compile.py: a SAVE region routes through
dynamo_bypassing_wrapper; docs/compilation.md lists what is unsupported under compile). Needs
`pip install torch-remat==0.2.2`.

Run: python c30_remat_save_region_side_effect.py

Shape suffixes: T tokens, D model dim.
"""

import json
import re

import torch
import torch_remat as remat
from torch import nn

CASE = "C30"
NEEDS = "cpu"

T, D = 32, 64


class Stats:
    """Python state the model updates as it runs."""

    calls = 0


def _msg(e: BaseException) -> str:
    first = (str(e).splitlines() or [""])[0]
    first = re.sub(r"0x[0-9a-fA-F]+", "0x?", first)
    first = re.sub(r"(?<![\w.])(?:/[^\s:'\"]+)+", "<path>", first)
    return f"{type(e).__name__}: {first}"


def _run(where: str, *, skip_flag: bool, compiled: bool = True) -> dict:
    """`where` the counter update sits: "save_region", "recompute_region", "body" (bare in the block), "outside"."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    stats = Stats()
    gate = nn.Linear(D, D)

    def counted_gate(x_TD):
        if where != "outside":
            stats.calls += 1
        return gate(x_TD)

    def body(x_TD):
        if where == "save_region":
            h_TD = remat.region(counted_gate, "gate", recompute=False)(x_TD)
        elif where == "recompute_region":
            h_TD = remat.region(counted_gate, "gate", recompute=True)(x_TD)
        else:
            h_TD = counted_gate(x_TD)
        # sin is a bare consumer of the region's output: without this the eager recompute reads a placeholder (C32).
        remat.recompute_needs_tensor(h_TD)
        return torch.sin(h_TD)

    block = remat.checkpoint(region_name="block")(body)
    step = torch.compile(block, backend="aot_eager", fullgraph=True) if compiled else block
    try:
        with torch._dynamo.config.patch(skip_fwd_side_effects_in_bwd_under_checkpoint=skip_flag):
            step(torch.randn(T, D, requires_grad=True)).sum().backward()
    except Exception as e:  # noqa: BLE001 - the error text is the observation
        return {"error": _msg(e)}
    if where == "outside":
        stats.calls += 1  # counted by the caller, once per step
    return {"error": None, "calls": stats.calls}


def bug() -> dict:
    """The counter in a SAVE region, compiled: Unsupported without the flag and with it."""
    return {
        "error": _run("save_region", skip_flag=False)["error"],
        "with_flag_error": _run("save_region", skip_flag=True)["error"],
    }


def fix() -> dict:
    """Count outside the checkpointed block: compiles without any flag, one call per step."""
    return _run("outside", skip_flag=False)


def variant_where() -> dict:
    """The flag is enough outside SAVE regions: the bare body and a recompute=True region compile with it (and count
    once); eagerly a SAVE region counts once and the bare body twice (forward and recompute)."""
    return {
        "body_with_flag": _run("body", skip_flag=True),
        "recompute_region_with_flag": _run("recompute_region", skip_flag=True),
        "eager_save_region": _run("save_region", skip_flag=False, compiled=False),
        "eager_body": _run("body", skip_flag=False, compiled=False),
    }


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
    print("variant_where", json.dumps(variant_where()))
