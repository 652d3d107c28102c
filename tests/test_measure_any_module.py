"""`measure` on modules nobody here wrote: inputs, warm models, no side effects, a real reference.

`measure` on modules nobody here wrote: keyword inputs, warm compiled models, no side effects, a real reference, blind
spots.
"""

import copy

import pytest
import torch
from _helpers import state_diff
from _truth import Truth
from torch import nn
from torch.utils.checkpoint import checkpoint

import toolkit as tk
from toolkit import compat


class Block(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x, scale=None):
        with torch.no_grad():
            self.calls.add_(1)  # an in-place counter, like MoE's tokens_per_expert
        h = torch.relu(self.up(x))
        if scale is not None:
            h = h * scale
        return x + self.down(h)


class Net(nn.Module):
    def __init__(self, n=2, d=32):
        super().__init__()
        self.layers = nn.ModuleList([Block(d) for _ in range(n)])

    def forward(self, x, scale=None):
        for layer in self.layers:
            x = layer(x, scale=scale)
        return x


def truth_bytes(model, *args, **kwargs):
    with Truth(model) as truth:
        out = model(*args, **kwargs)
        return truth.bytes(out)


def test_keyword_inputs_keep_module_names_and_reach_the_forward():
    torch.manual_seed(0)
    net = Net()
    x, scale = torch.randn(8, 32), torch.full((8, 64), 0.5)
    report = tk.measure(net, x, scale=scale)
    assert report.ok, report.error
    real = {name for name, _ in tk.transforms.named_modules(net)}
    assert {"layers.0", "layers.1"} <= set(report.saved.by_module) <= real
    assert report.saved.total_bytes == truth_bytes(net, x, scale=scale)
    # `scale` multiplied the hidden state: its saved product exists only with the keyword input.
    without = tk.measure(net, x)
    assert "aten.mul.Tensor" in report.saved.by_op and "aten.mul.Tensor" not in without.saved.by_op

    # forward_kwargs carries a keyword input whose name clashes with an option of measure().
    class Named(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x, name):
            assert name == "inner"
            return self.lin(x)

    r = tk.measure(Named(), torch.randn(2, 4), name="outer", forward_kwargs={"name": "inner"})
    assert r.ok and r.scenario.name == "outer"


def test_measure_has_no_side_effects_on_the_model_or_the_process():
    torch.manual_seed(0)
    net = Net()
    net.compile(backend="aot_eager")
    x = torch.randn(8, 32)
    net(x).sum().backward()  # the user's own step: grads set, counters at 1, compiled
    grads = {n: p.grad for n, p in net.named_parameters()}
    values = {n: p.grad.clone() for n, p in net.named_parameters()}
    calls = [b.calls.clone() for b in net.layers]
    before_dict = set(net.__dict__)
    compat.set_lru_cache(False)  # as torchtitan's apply_ac leaves it
    try:
        state = tk.transforms.global_state()
        counters = compat.counters_snapshot()
        report = tk.measure(net, x)
        assert report.ok, report.error
        assert tk.transforms.global_state() == state, state_diff(state, tk.transforms.global_state())
        assert compat.lru_cache_enabled() is False
        assert compat.counters_snapshot() == counters
    finally:
        compat.set_lru_cache(True)
    assert set(net.__dict__) == before_dict
    for n, p in net.named_parameters():
        assert p.grad is grads[n]
        torch.testing.assert_close(p.grad, values[n])
    assert [b.calls.item() for b in net.layers] == [c.item() for c in calls]
    # No forced recompile: the user's next step reuses the compiled graph.
    before = compat.counters_snapshot()
    net(x).sum().backward()
    assert compat.graphs_compiled(before) == (0, 0)


def test_a_warm_model_reports_its_graphs_and_per_module_attribution():
    torch.manual_seed(0)
    cold_net = Net()
    warm_net = copy.deepcopy(cold_net)
    x = torch.randn(8, 32)
    cold_net.compile(backend="aot_eager")
    cold = tk.measure(cold_net, x, cold=True)
    compat.reset_dynamo()
    warm_net.compile(backend="aot_eager")
    warm_net(x).sum().backward()
    warm = tk.measure(warm_net, x)
    assert warm.ok and cold.ok
    assert warm.compile.graphs == cold.compile.graphs >= 1
    assert warm.compile.warm_graphs == warm.compile.graphs and warm.compile.compiled_in_step == 0
    assert cold.compile.compiled_in_step == cold.compile.graphs and cold.compile.warm_graphs == 0
    assert not warm.compile.fell_back_to_eager and "FELL BACK" not in str(warm)
    assert warm.saved.by_module == cold.saved.by_module
    assert {"layers.0", "layers.1"} <= set(warm.saved.by_module)
    assert warm.saved.total_bytes == truth_bytes(warm_net, x)
    assert any("compiled before the step" in b for b in warm.blind_spots)


@pytest.mark.inductor
def test_a_warm_inductor_model_says_what_it_cannot_attribute():
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(8, 32)
    net.compile(backend="inductor")
    net(x).sum().backward()
    report = tk.measure(net, x)
    assert report.ok and report.compile.graphs >= 1 and not report.compile.fell_back_to_eager
    assert report.saved.total_bytes == truth_bytes(net, x)
    assert any("attributed to their compiled region only" in b for b in report.blind_spots)
    assert "cannot see: saved tensors of graphs compiled before the step" in str(report)


def test_gradients_are_compared_with_a_real_reference_or_not_at_all():
    torch.manual_seed(0)

    class Noisy(nn.Module):
        """Dropout inside a checkpoint that does not restore the RNG: recompute draws a different mask."""

        def __init__(self, preserve):
            super().__init__()
            self.lin, self.preserve = nn.Linear(16, 16), preserve

        def forward(self, x):
            return checkpoint(
                lambda t: torch.nn.functional.dropout(self.lin(t), 0.5),
                x,
                use_reentrant=False,
                preserve_rng_state=self.preserve,
            )

    x = torch.randn(4, 16)
    good, bad = tk.measure(Noisy(True), x), tk.measure(Noisy(False), x)
    assert good.numerics.grads_match is True and "match" in str(good)
    assert bad.numerics.grads_match is False and bad.numerics.max_grad_diff > 1e-3 and "MISMATCH" in str(bad)
    w = torch.randn(16, 16, requires_grad=True)
    fn = tk.measure(lambda t: torch.tanh(t @ w), torch.randn(4, 16))
    assert fn.numerics.grads_match is None and not fn.numerics.compared
    assert "gradients not compared (a callable, not a module" in str(fn) and "MISMATCH" not in str(fn)
    skipped = tk.measure(Noisy(True), x, reference=None)
    assert skipped.numerics.grads_match is None and "not compared (reference=None)" in str(skipped)


def test_eager_fallback_of_compile_ac_block_counts_the_eager_recompute():
    """C2: compile(AC(block)) with a graph break falls back to an eager checkpoint, which recomputes the blocks in
    backward exactly as full AC without compile does."""
    quick = dict(check_numerics=False, measure_memory=False, steady_steps=0)
    scenario = tk.measurement.preset("graph_break_in_checkpoint").replace(**quick)
    fallback = tk.run(scenario)
    eager = tk.run(scenario.replace(compile=tk.CompileConfig()))
    assert fallback.compile.fell_back_to_eager
    assert fallback.recompute.ops == eager.recompute.ops > 0
    assert fallback.recompute.by_op == eager.recompute.by_op
    # Inside a compiled region there are no module hooks (Dynamo would trace them): the recompute is attributed
    # to the checkpointed block that re-ran.
    blocks = {"layers.0": 0, "layers.1": 0}
    for name, n in eager.recompute.by_module.items():
        blocks[name.split(".moe")[0].split(".attention")[0].split(".ffn_norm")[0]] += n
    assert fallback.recompute.by_module == blocks


def test_function_form_checkpoint_inputs_are_held_whatever_the_torch_release():
    torch.manual_seed(0)
    blocks = nn.ModuleList([Block(), Block()])

    class Fn(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = blocks

        def forward(self, x):
            h = self.blocks[0](x)
            return checkpoint(self.blocks[1], h, use_reentrant=False)

    net = Fn()
    x = torch.randn(8, 32, requires_grad=True)
    report = tk.measure(net, x)
    held = [t for t in report.saved.tensors if t.kind == "checkpoint_input" and t.op != "torch.get_rng_state"]
    assert [(t.module, t.bytes) for t in held] == [("blocks.0", 8 * 32 * 4)]
    assert report.recompute.by_module.get("blocks.1.up", 0) > 0
    assert not any("respect_saved_tensors_hooks" in w for w in report.warnings)


def test_sac_under_the_probes_hooks_raises_no_future_warning():
    report = tk.run(
        tk.Scenario(ac=tk.ACConfig.of(mode="selective_op"), check_numerics=False, measure_memory=False, steady_steps=0)
    )
    assert report.ok and report.saved.by_kind["sac_cache"] > 0
    assert not any("saved_tensors_hooks" in w for w in report.warnings), report.warnings


def test_transforms_on_a_foreign_model():
    """A model that is not the toolkit's (no ModelConfig): the transforms work on the scopes it has, or say which
    field is missing."""
    torch.manual_seed(0)
    net = Net()
    net.config = object()  # like torchtitan's models, a config the toolkit does not know
    tk.apply_ac(net, tk.ACConfig.of(mode="full"))
    tk.apply_compile(net, tk.CompileConfig(scope="blocks", fullgraph=True))
    assert tk.transforms.applied(net).compiled == ["layers.0", "layers.1"]
    report = tk.measure(net, torch.randn(8, 32))
    assert report.ok and report.compile.graphs >= 1 and not report.compile.fell_back_to_eager
    tk.transforms.reset(net)
    tk.transforms.apply_recipe(net, "torchtitan_0_3_0")
    assert tk.transforms.applied(net).recipe == "torchtitan_0_3_0"
    tk.transforms.reset(net)
    with pytest.raises(tk.ConfigError, match="model.layers"):
        tk.apply_ac(nn.Linear(2, 2), tk.ACConfig.of(mode="full"))
    with pytest.raises(tk.ConfigError, match="model.layers"):
        tk.transforms.apply_recipe(nn.Sequential(nn.Linear(2, 2)), "torchtitan_0_3_0")
    with pytest.raises(tk.ConfigError, match="CompileConfig.scope"):
        tk.apply_compile(net, tk.CompileConfig(scope="experts"))


def test_a_missing_private_api_is_a_blind_spot_not_a_silent_zero(monkeypatch):
    """Remove SAC's caching mode from the toolkit's view: the bytes stay right (the cached tensors are still alive),
    the Report says it cannot tell them apart, and the text twin shows it."""
    scenario = tk.Scenario(
        ac=tk.ACConfig.of(mode="selective_op"), check_numerics=False, measure_memory=False, steady_steps=0
    )
    seen = tk.run(scenario)
    monkeypatch.setattr(
        compat.features, "_FINDERS", {**compat._FINDERS, "sac_mode": lambda: compat._Found(False, "removed")}
    )
    compat.refresh()
    try:
        blind = tk.run(scenario)
    finally:
        monkeypatch.undo()
        compat.refresh()
    assert blind.ok and blind.saved.total_bytes == seen.saved.total_bytes
    assert "sac_cache" not in blind.saved.by_kind and blind.saved.by_kind["other"] == seen.saved.by_kind["sac_cache"]
    assert any("selective checkpointing" in b and "removed" in b for b in blind.blind_spots)
    assert "cannot see: tensors cached by selective checkpointing" in str(blind)
    assert not seen.blind_spots


def test_lru_probe_reads_the_real_switch_and_leaves_no_trace():
    counters = compat.counters_snapshot()
    assert compat.lru_cache_enabled() is True
    torch._C._dynamo.eval_frame._set_lru_cache(False)
    try:
        assert compat.lru_cache_enabled() is False
    finally:
        torch._C._dynamo.eval_frame._set_lru_cache(True)
    assert compat.lru_cache_enabled() is True
    assert compat.counters_snapshot() == counters


def test_without_the_partition_hook_the_kept_graphs_still_attribute(monkeypatch):
    """aot_eager keeps its forward and backward FX graphs: with AOTAutograd's partition function gone, the probes
    read those instead, and the Report is the same (inductor keeps only code: see the warm inductor test)."""
    scenario = tk.Scenario(
        model=tk.ModelConfig(experts_impl="masked"),
        ac=tk.ACConfig.of(mode="full"),
        compile=tk.CompileConfig(scope="blocks", fullgraph=True),
        check_numerics=False,
        measure_memory=False,
        steady_steps=0,
    )
    seen = tk.run(scenario)
    monkeypatch.setitem(compat._FINDERS, "aot_partition", lambda: compat._Found(False, "removed"))
    compat.refresh()
    try:
        kept = tk.run(scenario)
    finally:
        monkeypatch.undo()
        compat.refresh()
    assert kept.ok and kept.saved == seen.saved
    assert kept.recompute.in_compiled_backward == seen.recompute.in_compiled_backward > 0
    assert kept.compile.graphs == seen.compile.graphs and not kept.blind_spots


def test_a_step_that_fails_in_backward_keeps_the_graphs_it_compiled():
    """A failure after compiling (here, in backward) no longer reports 0 graphs: the step counts what Dynamo compiled
    up to the failure. Truth: a backend of the test's own counts the graphs it was given; the outputs of its graphs
    carry a hook that raises in backward, so the eager reference `measure` runs first never fails."""
    graphs = []

    def fail(grad):
        raise RuntimeError("boom in backward")

    def counting(gm, example_inputs):
        graphs.append(gm)

        def run(*args):
            outs = gm(*args)
            for o in outs if isinstance(outs, (tuple, list)) else (outs,):
                if isinstance(o, torch.Tensor) and o.requires_grad:
                    o.register_hook(fail)
            return outs

        return run

    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    model[0] = torch.compile(model[0], backend=counting)
    report = tk.measure(model, torch.randn(4, 8), loss_fn=lambda out: out.sum())
    assert report.outcome == "error" and report.error.stage == "backward" and "boom" in report.error.message
    assert report.compile.requested and report.compile.graphs == len(graphs) == 1
