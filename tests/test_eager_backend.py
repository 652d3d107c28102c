"""Dynamo's `eager` backend (capture, no AOTAutograd): its graphs run as compiled regions, and a fallback is still seen.

The truth is torch's own: a backend that counts each graph run and then runs the graph as `eager` does (`gm.forward`),
and independent saved-tensor hooks for the bytes. Before the tracker looked for a Dynamo graph's code, every region
compiled with `backend="eager"` read "fell back to eager" (the probes saw only AOTAutograd's saves).
"""

import pytest
import torch
from _truth import Truth

import toolkit as tk

DENSE = tk.ModelConfig(moe_layers="none")


def counting(calls: list):
    """`eager`'s behaviour (the graph's own forward), counting each run of a graph that calls anything. Dynamo also
    hands a backend empty graphs (around a checkpoint that fell back: two that read `is_meta` and return `()`)."""

    def backend(gm, example_inputs):
        does_work = any(
            n.op in ("call_function", "call_method", "call_module") and n.target is not getattr for n in gm.graph.nodes
        )

        def run(*args):
            if does_work:
                calls.append(gm)
            return gm.forward(*args)

        return run

    return backend


def _measure(cfg, ac, backend, **compile_kw):
    torch.manual_seed(0)
    model = tk.build_model(cfg)
    tk.transforms.prepare(
        model, ac=tk.ACConfig.of(mode=ac), compile=tk.CompileConfig(scope="blocks", backend=backend, **compile_kw)
    )
    tokens = tk.make_batch(cfg).tokens
    report = tk.measure(model, tokens, cold=True)
    with Truth(model) as truth:
        truth_bytes = truth.bytes(model(tokens))
    return report, truth_bytes


@pytest.mark.parametrize("ac", ["none", "full", "selective_op"])
def test_graphs_of_the_eager_backend_are_seen_running(ac):
    calls = []
    report, truth_bytes = _measure(DENSE, ac, counting(calls))
    assert report.ok, report.error
    assert calls  # Dynamo's graphs ran (the backend's own count) ...
    c = report.compile
    assert not c.fell_back_to_eager and c.regions_without_graphs == () and c.graphs >= 1  # ... and the Report says so
    # Outer saved-tensor hooks see all but SAC's cache, which its own dispatch mode keeps (the probes' `sac_cache`).
    sac = report.saved.by_kind.get("sac_cache", 0)
    assert report.numerics.grads_match and report.saved.total_bytes - sac == truth_bytes
    assert (sac > 0) == (ac == "selective_op")
    # The named backend reads the same as the counting one: same graphs, same bytes.
    named, _ = _measure(DENSE, ac, "eager")
    assert (named.compile.fell_back_to_eager, named.compile.graphs, named.saved.total_bytes) == (
        False,
        c.graphs,
        report.saved.total_bytes,
    )


def test_a_region_that_fell_back_is_still_seen_under_the_eager_backend():
    """C2 under `eager`: a graph break inside the checkpointed block leaves it no graph, and no graph of it runs."""
    calls = []
    cfg = tk.ModelConfig(experts_impl="for_loop")
    report, _ = _measure(cfg, "full", counting(calls))
    assert report.ok and not calls  # the backend never ran a graph ...
    c = report.compile
    assert c.fell_back_to_eager and c.regions_without_graphs == ("layers.0", "layers.1")  # ... and the Report says so
    assert tk.classify(report).label == "fell_back_to_eager"


def test_full_ac_is_honoured_under_the_eager_backend():
    """pytorch#160773 ("backend=eager ignores AC"), closed as not reproducible: under compile(AC(block)) with the
    eager backend each block keeps only its checkpoint input, as plain full AC does, far less than without AC."""
    full, truth_full = _measure(DENSE, "full", "eager")
    none, truth_none = _measure(DENSE, "none", "eager")
    assert full.saved.total_bytes == truth_full < truth_none == none.saved.total_bytes
    assert full.recompute.ops > 0 and none.recompute.ops == 0
