"""The curried `checkpoint(use_reentrant=False)(fn)` form (new in torch 2.14) works eagerly and crashes under compile.

Symptom: `checkpoint(**kwargs)` with no function returns a wrapper (`functools.partial(_make_checkpoint_wrapper,
...)`); calling it checkpoints `fn` eagerly. Inside torch.compile the same line raises `IndexError: list index out of
range` while Dynamo traces it, with fullgraph and without it alike: not a graph break, an error, so a model written
in the new form cannot be compiled at all. The positional form `checkpoint(fn, x, use_reentrant=False)` traces into
one graph with one checkpoint op. `checkpoint_sequential` is no way round: Dynamo skips it (fullgraph: Unsupported
"Attempted to call function marked as skipped"; without fullgraph a graph break, and the graphs made hold no
checkpoint op, so the checkpointing runs eagerly).

Mechanism: Dynamo maps every call of `torch.utils.checkpoint.checkpoint` to its checkpoint higher-order op, which
takes the first positional argument as the function to speculate; the curried call has none.

Fix: the positional form under compile (`checkpoint(fn, *args, use_reentrant=False)`), or `functools.partial(checkpoint,
fn, use_reentrant=False)`.

Upstream: pytorch#189411, pytorch#189412.

Run: python c75_curried_checkpoint_under_compile.py

Shape suffixes: T tokens, D dim, H hidden.
"""

import json

import torch
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

CASE = "C75"
NEEDS = "cpu"


def _layers():
    torch.manual_seed(0)
    return torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64)


def _call(form: str, layers):
    up_DH, act, down_HD = layers

    def body(x_TD):
        return x_TD + down_HD(act(up_DH(x_TD)))

    if form == "curried":
        return lambda x_TD: checkpoint(use_reentrant=False)(body)(x_TD)
    if form == "sequential":
        return lambda x_TD: checkpoint_sequential(torch.nn.Sequential(*layers), 2, x_TD, use_reentrant=False)
    return lambda x_TD: checkpoint(body, x_TD, use_reentrant=False)


def _message(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"


def _run(form: str, compiled: bool, fullgraph: bool = False) -> dict:
    """One step of `form`: graphs and checkpoint ops a counting backend saw, or the error."""
    torch._dynamo.reset()
    layers = _layers()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(sum(1 for n in gm.graph.nodes if "checkpoint" in str(n.target)))
        return gm.forward

    fn = _call(form, layers)
    run = torch.compile(fn, backend=backend, fullgraph=fullgraph) if compiled else fn
    x_TD = torch.randn(32, 64, requires_grad=True)
    try:
        run(x_TD).sum().backward()
    except Exception as e:  # Dynamo's IndexError; 2.13's eager TypeError (no curried form there)
        return {"error": _message(e)}
    return {"error": "", "graphs": len(graphs), "checkpoint_ops": sum(graphs)}


def bug() -> dict:
    """The curried form eagerly, and compiled with and without fullgraph."""
    eager = _run("curried", compiled=False)
    compiled, strict = _run("curried", compiled=True), _run("curried", compiled=True, fullgraph=True)
    return {
        "eager": eager,
        "compiled": compiled,
        "compiled_fullgraph": strict,
        "eager_works_compiled_raises": not eager["error"] and bool(compiled["error"]) and bool(strict["error"]),
    }


def variant_sequential() -> dict:
    """checkpoint_sequential under compile, with and without fullgraph."""
    return {
        "sequential": _run("sequential", compiled=True),
        "sequential_fullgraph": _run("sequential", compiled=True, fullgraph=True),
    }


def fix() -> dict:
    """The positional form compiles into one graph holding one checkpoint op."""
    return {"positional_fullgraph": _run("positional", compiled=True, fullgraph=True)}


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("variant_sequential", json.dumps(variant_sequential()))
    print("fix", json.dumps(fix()))
