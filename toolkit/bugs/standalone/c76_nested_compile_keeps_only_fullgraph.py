"""A torch.compile'd function called inside another compile is inlined: its own backend and options vanish.

Symptom: `inner = torch.compile(fn, backend=..., options=...)` called from code that an outer `torch.compile` traces
is not compiled on its own: Dynamo inlines `fn` into the outer graph, so the inner backend never sees a graph and the
inner options (Inductor's `wrap_inductor_compiled_regions`, a custom pass, max-autotune) never apply. Only its
`fullgraph=True` survives: a graph break inside `fn` raises under the outer compile too. Called alone, the same inner
function compiles with its own backend. Nothing warns.

Mechanism: Dynamo treats an already-compiled callable met while tracing as its original code (the compile wrapper is
transparent to tracing) and keeps only the fullgraph flag of the nested frame (torchtitan
docs/torch_compile_asks/README.md asks for per-region options).

Fix: do not nest: compile the regions that need their own options and leave their caller eager, or give the outer
compile the options.

Upstream: torchtitan docs/torch_compile_asks/README.md (an ask, no pytorch issue).

Run: python c76_nested_compile_keeps_only_fullgraph.py

Shape suffixes: T tokens, D dim.
"""

import json

import torch

CASE = "C76"
NEEDS = "cpu"


def _counting(graphs: list):
    def backend(gm, example_inputs):
        graphs.append(len(gm.graph.nodes))
        return gm.forward

    return backend


def _run(nested: bool, inner_fullgraph: bool = False, breaks: bool = False) -> dict:
    """The inner compiled function called alone or from an outer compiled one: graphs each backend saw, or the
    error."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    lin_DD = torch.nn.Linear(64, 64)
    inner_graphs, outer_graphs = [], []

    def fn(x_TD):
        h_TD = lin_DD(x_TD).relu()
        if breaks:
            torch._dynamo.graph_break()
        return h_TD * 2

    inner = torch.compile(fn, backend=_counting(inner_graphs), fullgraph=inner_fullgraph)
    outer = torch.compile(lambda x_TD: inner(x_TD) + 1, backend=_counting(outer_graphs))
    try:
        (outer if nested else inner)(torch.randn(32, 64))
    except Exception as e:  # Unsupported: the inner fullgraph, kept under the outer compile
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"}
    return {"error": "", "inner_graphs": len(inner_graphs), "outer_graphs": len(outer_graphs)}


def bug() -> dict:
    """Alone the inner compile's backend gets the graph; nested, the outer one does. Its fullgraph still holds."""
    alone, nested = _run(nested=False), _run(nested=True)
    strict = _run(nested=True, inner_fullgraph=True, breaks=True)
    return {
        "alone": alone,
        "nested": nested,
        "nested_inner_fullgraph_break": strict,
        "inner_settings_vanish": alone["inner_graphs"] == 1 and nested["inner_graphs"] == 0,
        "fullgraph_kept": "graph_break" in strict["error"],
    }


def variant_inductor_options() -> dict:
    """The same with Inductor on both sides and an option only the inner one sets (a post-grad pass that counts its
    calls): it runs alone, never nested. Cold Inductor compiles: tens of seconds on 2 cores."""
    calls = []

    def count_pass(graph):
        calls.append(1)

    def run(nested: bool) -> int:
        torch._dynamo.reset()
        calls.clear()
        lin_DD = torch.nn.Linear(64, 64)
        inner = torch.compile(lambda x: lin_DD(x).relu() * 2, options={"post_grad_custom_post_pass": count_pass})
        outer = torch.compile(lambda x: inner(x) + 1)
        (outer if nested else inner)(torch.randn(32, 64))
        return len(calls)

    return {"inner_pass_calls_alone": run(False), "inner_pass_calls_nested": run(True)}


def fix() -> dict:
    """The region compiled with its own settings and its caller left eager: the inner backend gets its graph."""
    torch._dynamo.reset()
    lin_DD = torch.nn.Linear(64, 64)
    inner_graphs = []
    inner = torch.compile(lambda x_TD: lin_DD(x_TD).relu() * 2, backend=_counting(inner_graphs))
    (lambda x_TD: inner(x_TD) + 1)(torch.randn(32, 64))
    return {"inner_graphs": len(inner_graphs)}


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
    print("variant_inductor_options", json.dumps(variant_inductor_options()))
