"""transformers' own models under Inductor, against a truth the instrument did not compute: aot_eager does not always
save what Inductor saves. Not `per_release` (a cold Inductor compile of these models takes about a minute on 2 cores):
it runs where transformers is installed, CI's torch 2.14.1 stage (`-m extras`)."""

import pytest
import torch
from _helpers import extra

import toolkit as tk
from toolkit.stacks import transformers as hf

extra("transformers")
from test_transformers import own_ac, own_model, truth_bytes  # noqa: E402  (transformers' own API, as users call it)

pytestmark = [
    pytest.mark.inductor,
    pytest.mark.filterwarnings("ignore:`gradient_checkpointing_enable` is deprecated:FutureWarning"),
]


@pytest.mark.parametrize("ac", ["none", "full"])
def test_inductor_saved_bytes_and_graphs_equal_an_independent_truth(ac):
    """Qwen3-MoE compiled whole by Inductor; with full AC, Dynamo's switch for C67 so that the checkpointed layers
    compile (the recompute moves into the compiled backward). Truth: outer saved-tensor hooks on the same compiled
    model run bare, and a counting backend that hands each graph to Inductor."""
    cfg = hf.TransformersConfig(family="qwen3_moe")
    flag = {"skip_fwd_side_effects_in_bwd_under_checkpoint": ac != "none"}
    torch._dynamo.reset()
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("inductor")  # torch's own counter, handing each graph to Inductor
    model = own_model(cfg)
    own_ac(model, ac)
    ids = hf.make_batch(cfg)
    with torch._dynamo.config.patch(**flag):
        model.compile(backend=counter)
        true_bytes = truth_bytes(model, ids, checkpointed=False)
    torch._dynamo.reset()
    comp = tk.CompileConfig(scope="model", backend="inductor", **flag)
    report = tk.run(
        tk.Scenario(stack="transformers", model=cfg, ac=tk.ACConfig.of(mode=ac), compile=comp, measure_memory=False)
    )
    torch._dynamo.reset()
    assert report.ok and report.verdict == "ok", report
    assert report.compile.graphs == counter.frame_count == 1, (report.compile.graphs, counter.frame_count)
    assert report.saved.total_bytes == true_bytes, (report.saved.total_bytes, true_bytes, report.saved.by_kind)
    assert report.numerics.grads_match is True
