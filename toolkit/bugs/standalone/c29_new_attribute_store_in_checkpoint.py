"""Storing a new attribute on an outside object inside a compiled checkpoint region fails with "Observed exception".

Symptom: under `torch.compile(fullgraph=True)`, a checkpoint region whose body sets an attribute the object did not
have before (spmd_types' lazily created `threading.local` mesh stack does this on first use) fails with
`Unsupported: Observed exception` — a generic message that names neither the attribute nor the checkpoint. The same
store to an attribute that already exists fails with the message that does point at the cause,
`HOP: Non-nullified side effect`. With `fullgraph=False` the frame silently runs eagerly: 0 graphs. Setting
`torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint=True` compiles it (the store is applied once,
by the forward, and skipped in the recompute).

Upstream: none filed; torchtitan's docs/torch_compile_asks/README.md lists it among known behaviours (its repro
kb_hop_outer_attr_store.py asks for the "Non-nullified side effect" message in both cases).

Run: python c29_new_attribute_store_in_checkpoint.py

Shape suffixes: T tokens, D model dim.
"""

import json
import re

import torch
from torch.utils.checkpoint import checkpoint

CASE = "C29"
NEEDS = "cpu"

T, D = 32, 64


class State:
    """Stands in for a module-level `threading.local()`: state that lives outside the model."""


def _msg(e: BaseException) -> str:
    first = (str(e).splitlines() or [""])[0]
    first = re.sub(r"0x[0-9a-fA-F]+", "0x?", first)
    first = re.sub(r"(?<![\w.])(?:/[^\s:'\"]+)+", "<path>", first)
    return f"{type(e).__name__}: {first}"


def _run(*, existing: bool, skip_flag: bool = False, fullgraph: bool = True) -> dict:
    torch._dynamo.reset()
    torch.manual_seed(0)
    state = State()
    if existing:
        state.mesh_stack = []
    lin = torch.nn.Linear(D, D)

    def body(x_TD):
        state.mesh_stack = ["mesh"]  # a new attribute unless `existing`
        return torch.relu(lin(x_TD))

    step = torch.compile(
        lambda x_TD: checkpoint(body, x_TD, use_reentrant=False), backend="aot_eager", fullgraph=fullgraph
    )
    torch._dynamo.utils.counters.clear()
    try:
        with torch._dynamo.config.patch(skip_fwd_side_effects_in_bwd_under_checkpoint=skip_flag):
            step(torch.randn(T, D, requires_grad=True)).sum().backward()
    except Exception as e:  # noqa: BLE001 - the error text is the observation
        return {"error": _msg(e)}
    return {
        "error": None,
        "graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"],
        "stored": getattr(state, "mesh_stack", None) == ["mesh"],
    }


def bug() -> dict:
    """A new attribute: "Observed exception"; an existing one: the clearer "Non-nullified side effect"."""
    return {"error": _run(existing=False)["error"], "existing_attribute_error": _run(existing=True)["error"]}


def fix() -> dict:
    """The same store with `skip_fwd_side_effects_in_bwd_under_checkpoint=True`: one graph, the store applied."""
    return _run(existing=False, skip_flag=True)


def variant_fullgraph_false() -> dict:
    """fullgraph=False: no error, and no graph either — the whole step silently ran eagerly."""
    return _run(existing=False, fullgraph=False)


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
    print("variant_fullgraph_false", json.dumps(variant_fullgraph_false()))
