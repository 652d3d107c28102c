"""Hugging Face transformers in the loop: its own tiny MoE and dense models, its own activation checkpointing and
compile, measured through `tk.run` and checked against a truth computed here with transformers' own API (saved-tensor
hooks, a counting backend, a dispatch mode of the test's own), never the toolkit's stack code."""

import warnings

import pytest
import torch
from _helpers import extra
from _truth import CountingBackend, Truth, host_copies, patch_sac_contexts
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import toolkit as tk
from toolkit._config import ConfigError
from toolkit.stacks import transformers as hf

extra("transformers")
from transformers import AutoModelForCausalLM  # noqa: E402
from transformers.modeling_layers import GradientCheckpointingLayer  # noqa: E402

import toolkit.transforms.policies as policies  # noqa: E402

# per_release: CI runs it on both older releases (2.14.1 and 2.13.0 install transformers); README's stage skips it.
pytestmark = [
    pytest.mark.per_release,
    pytest.mark.filterwarnings("ignore:`gradient_checkpointing_enable` is deprecated:FutureWarning"),
]

QUICK = dict(measure_memory=False, steady_steps=0)


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def own_model(cfg: hf.TransformersConfig):
    """transformers' own model for `cfg`, built here with its own API (same seed → the stack's weights)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        options = {"attn_implementation": cfg.attention}
        if cfg.has_moe:
            options["experts_implementation"] = cfg.experts
        model = AutoModelForCausalLM.from_config(hf.hf_config(cfg), **options)
    return model.train()


def own_ac(model, ac: str, offload: bool = False):
    """transformers' own switch, as its docs write it (`offload`: its activation_checkpointing_enable's)."""
    if ac == "none":
        return
    kwargs = {"use_reentrant": ac == "reentrant"}
    if ac == "selective_op":
        layer = next(m for m in model.modules() if isinstance(m, GradientCheckpointingLayer))
        kwargs["context_fn"] = policies.per_op_context((), ("moe.router.gate",), layer)
    if offload:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs, offload=True)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def layers(model):
    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def truth_bytes(model, ids, checkpointed: bool) -> int:
    """Saved bytes at the end of the forward: outer saved-tensor hooks, plus (with AC) every tensor a decoder layer's
    call receives, which its checkpoint holds to re-run it (transformers passes them in a partial; those freed by
    then count 0), plus RNG stashes, SAC caches and the host copies of offload=True."""
    import transformers.modeling_utils

    truth = Truth(model)

    def hold(module, args, kwargs):
        for t in tree_leaves((args, kwargs)):  # the position embeddings travel as a (cos, sin) pair
            truth._add(t)

    hooks = [layer.register_forward_pre_hook(hold, with_kwargs=True) for layer in layers(model)] if checkpointed else []
    try:
        with patch_sac_contexts(truth, policies), host_copies(truth, transformers.modeling_utils), truth:
            out = model(input_ids=ids)
            n = truth.bytes(out.logits)
    finally:
        for h in hooks:
            h.remove()
    return n


FAMILIES = ["qwen3_moe", "mixtral", "deepseek_v3", "qwen3"]


@pytest.mark.parametrize("ac", ["none", "full", "reentrant", "selective_op"])
@pytest.mark.parametrize("family", FAMILIES)
def test_saved_bytes_equal_an_independent_truth(family, ac):
    cfg = hf.TransformersConfig(family=family)
    model = own_model(cfg)
    own_ac(model, ac)
    ids = hf.make_batch(cfg)
    report = tk.run(tk.Scenario(stack="transformers", model=cfg, ac=tk.ACConfig.of(mode=ac), **QUICK))
    if (family, ac) == ("mixtral", "selective_op"):
        # C68: Mixtral's router divides the top-k values SAC cached in place. transformers' own step fails the same.
        with pytest.raises(RuntimeError, match="selective activation checkpoint has been mutated"):
            model.loss_function(logits=model(input_ids=ids).logits, labels=ids, vocab_size=cfg.vocab_size).backward()
        assert report.outcome == "error" and "has been mutated" in report.error.message
        assert "C68" in tk.classify(report).cases
        return
    true = truth_bytes(model, ids, ac != "none")
    assert report.ok, report.error
    assert report.numerics.grads_match is True, report.numerics
    assert report.saved.total_bytes == true, (report.saved.total_bytes, true, report.saved.by_kind)
    assert "other" not in report.saved.by_kind
    # transformers' own module names, unchanged by its checkpointing.
    assert any(m.startswith("model.layers.") for m in report.saved.by_module)
    if ac != "none":
        assert report.transforms.checkpointed == tuple(f"model.layers.{i}" for i in range(cfg.n_layers))
        assert report.saved.by_kind.get("checkpoint_input", 0) > 0


@pytest.mark.parametrize("ac", ["full", "reentrant", "selective_op"])
def test_offload_is_transformers_own_and_its_host_copies_are_counted(ac):
    """transformers' `offload=True` (save_on_cpu around each checkpoint call) as
    `ACConfig.of(mode="full", offload=True)`: the saved bytes equal the truth with its host copies, which read as kind
    "offloaded" (they used to read "other"), and gradients match."""
    from transformers.utils.import_utils import get_current_accelerator

    cfg = hf.TransformersConfig()
    model = own_model(cfg)
    own_ac(model, ac, offload=True)
    report = tk.run(tk.Scenario(stack="transformers", model=cfg, ac=tk.ACConfig.of(mode=ac, offload=True), **QUICK))
    if get_current_accelerator() is None:
        # A torch built without any accelerator (2.13.0's CPU wheel): transformers 5.25 asks save_on_cpu for pinned
        # copies with device_type "cpu", and torch has no pinned allocator: its own forward raises, and so does the
        # measured one (its comment says nothing is copied then; a CUDA build with no GPU gets plain copies).
        with pytest.raises(RuntimeError, match="pin_memory=True requires"):
            model(input_ids=hf.make_batch(cfg))
        assert report.outcome == "error" and "pin_memory=True requires" in report.error.message
        return
    true = truth_bytes(model, hf.make_batch(cfg), True)
    assert report.ok and report.numerics.grads_match is True, (report.error, report.numerics)
    assert report.saved.total_bytes == true, (report.saved.total_bytes, true, report.saved.by_kind)
    # Each layer's hidden states, copied to the host: 2 layers × batch 2 × 16 tokens × 64 × 4 bytes.
    assert report.saved.by_kind.get("offloaded") == cfg.n_layers * cfg.batch * cfg.seq_len * cfg.dim * 4
    assert "other" not in report.saved.by_kind
    plain = tk.run(tk.Scenario(stack="transformers", model=cfg, ac=tk.ACConfig.of(mode=ac), **QUICK))
    assert "offloaded" not in plain.saved.by_kind and plain.recompute.ops == report.recompute.ops


def _layer_forward_ops(cfg, early_stop: bool) -> int:
    """The decoder layers' forward ops, counted with the test's own dispatch mode on each layer's real inputs: all
    of them (a reentrant checkpoint re-runs the whole layer), or up to the last tensor saved for backward (a
    non-reentrant one stops there: torch's early stop, on by default)."""
    model = own_model(cfg)
    calls = []
    hooks = [
        layer.register_forward_pre_hook(lambda m, a, k: calls.append((m, a, k)), with_kwargs=True)
        for layer in layers(model)
    ]
    with torch.no_grad():
        model(input_ids=hf.make_batch(cfg))
    for h in hooks:
        h.remove()
    total = 0
    for m, a, k in calls:
        args = tuple(t.detach().requires_grad_(t.is_floating_point()) if torch.is_tensor(t) else t for t in a)
        count, last = _Count(), [0]

        def pack(t):
            last[0] = count.n
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), count:
            m(*args, **k)
        total += last[0] if early_stop else count.n
    return total


@pytest.mark.parametrize("ac, early_stop", [("full", True), ("reentrant", False)])
def test_recompute_is_the_layers_forward(ac, early_stop):
    """Non-reentrant checkpointing re-runs each layer up to its last saved tensor; the reentrant one re-runs the whole
    layer inside its backward (the probes used to see none of it: 0 ops)."""
    cfg = hf.TransformersConfig()
    expected = _layer_forward_ops(cfg, early_stop)
    report = tk.run(tk.Scenario(stack="transformers", model=cfg, ac=tk.ACConfig.of(mode=ac), **QUICK))
    assert report.ok and report.recompute.ops == expected, (report.recompute.ops, expected)
    assert sum(report.recompute.by_module.values()) == report.recompute.ops


@pytest.mark.parametrize(
    "ac, scope",
    [("none", "model"), ("none", "blocks"), ("full", "model"), ("reentrant", "model"), ("full", "wrapper")],
)
@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_compiled_graphs_and_saved_bytes_equal_an_independent_truth(family, ac, scope):
    """ "wrapper" is `torch.compile(model)`, the OptimizedModule users call (`method="torch_compile"`)."""
    cfg = hf.TransformersConfig(family=family)
    counter = CountingBackend()
    model = own_model(cfg)
    own_ac(model, ac)
    call = model
    if scope == "wrapper":
        call = torch.compile(model, backend=counter.backend)
    for m in [model] if scope == "model" else layers(model) if scope == "blocks" else []:
        m.compile(backend=counter.backend)
    ids = hf.make_batch(cfg)
    model.loss_function(logits=call(input_ids=ids).logits, labels=ids, vocab_size=cfg.vocab_size).backward()
    true_graphs = counter.graphs
    torch._dynamo.reset()
    comp = (
        tk.CompileConfig(scope="model", method="torch_compile") if scope == "wrapper" else tk.CompileConfig(scope=scope)
    )
    report = tk.run(tk.Scenario(stack="transformers", model=cfg, ac=tk.ACConfig.of(mode=ac), compile=comp))
    torch._dynamo.reset()
    assert report.ok, report.error
    assert report.compile.graphs == true_graphs >= 1, (report.compile.graphs, true_graphs)
    assert report.numerics.grads_match is True
    if scope == "wrapper":
        assert "torch.compile(model)" in report.scenario.name
    compiled = ("<model>",) if scope != "blocks" else tuple(f"model.layers.{i}" for i in range(cfg.n_layers))
    assert report.transforms.compiled == compiled
    if ac == "none":
        assert report.saved.total_bytes == truth_bytes(model, ids, False)


def test_per_layer_compile_with_checkpointing_silently_runs_eagerly_and_the_report_says_so():
    """transformers' checkpointed layers compiled one by one (`layer.compile()`): Dynamo meets a side effect inside the
    checkpoint (kernels' CompileableContextVar), 'HOP: Unsafe side effect', and runs each layer eagerly: no graph.
    The truth: a counting backend sees 0 graphs. Dynamo's own hint, `skip_fwd_side_effects_in_bwd_under_checkpoint`,
    compiles them."""
    cfg = hf.TransformersConfig()
    counter = CountingBackend()
    model = own_model(cfg)
    own_ac(model, "full")
    for m in layers(model):
        m.compile(backend=counter.backend)
    ids = hf.make_batch(cfg)
    model.loss_function(logits=model(input_ids=ids).logits, labels=ids, vocab_size=cfg.vocab_size).backward()
    assert counter.graphs == 0
    torch._dynamo.reset()
    scenario = tk.Scenario(
        stack="transformers",
        model=cfg,
        ac=tk.ACConfig.of(mode="full"),
        compile=tk.CompileConfig(scope="blocks"),
        **QUICK,
    )
    report = tk.run(scenario)
    assert report.ok and report.compile.fell_back_to_eager, report.compile
    assert report.compile.graphs == 0
    assert any("Unsafe side effect" in b.reason for b in report.compile.breaks)
    assert str(report).splitlines()[0].endswith("ran eagerly (0 graphs)")
    assert tk.classify(report).label == "fell_back_to_eager"
    fixed = tk.run(
        scenario.replace(compile=scenario.compile.replace(skip_fwd_side_effects_in_bwd_under_checkpoint=True))
    )
    assert fixed.ok and not fixed.compile.fell_back_to_eager and fixed.compile.graphs >= 1
    assert fixed.recompute.in_compiled_backward > 0  # the recompute moved into the compiled backward
    assert fixed.numerics.grads_match is True


def test_dropout_is_replayed_by_its_checkpoint_and_a_redraw_is_caught():
    """attention dropout on: transformers' checkpoint restores the RNG state (preserve_rng_state), so gradients match;
    without it the recompute draws other numbers. The truth for the latter is computed here: the gradients of the
    same model with and without checkpointing really differ."""
    cfg = hf.TransformersConfig(attention_dropout=0.5)
    ok = tk.run(tk.Scenario(stack="transformers", model=cfg, ac=tk.ACConfig.of(mode="full"), **QUICK))
    assert ok.ok and ok.numerics.grads_match is True and not ok.recompute.redrawn
    bad = tk.run(
        tk.Scenario(stack="transformers", model=cfg, ac=tk.ACConfig.of(mode="full", preserve_rng_state=False), **QUICK)
    )
    assert bad.numerics.grads_match is False and bad.recompute.redrawn
    assert str(bad).splitlines()[0].split(": ", 1)[1].startswith("grads_differ")

    def grads(ac_kwargs):
        model = own_model(cfg)
        if ac_kwargs is not None:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=ac_kwargs)
        ids = hf.make_batch(cfg)
        torch.manual_seed(5)
        model.loss_function(logits=model(input_ids=ids).logits, labels=ids, vocab_size=cfg.vocab_size).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    plain = grads(None)
    assert torch.equal(grads({"use_reentrant": False}), plain)
    assert not torch.allclose(grads({"use_reentrant": False, "preserve_rng_state": False}), plain)


def test_every_n_layers_is_transformers_own_selective_layer():
    """`selective_layer` is transformers' `every_n_layers`: layer i checkpoints when i % n == 0 (its rule, not the
    toolkit's (i + 1) % n)."""
    cfg = hf.TransformersConfig(n_layers=4)
    report = tk.run(
        tk.Scenario(stack="transformers", model=cfg, ac=tk.ACConfig.of(mode="selective_layer", layer_every=2), **QUICK)
    )
    assert report.ok and report.transforms.checkpointed == ("model.layers.0", "model.layers.2")
    model = own_model(cfg)
    model.gradient_checkpointing_enable(every_n_layers=2)
    assert [i for i, m in enumerate(layers(model)) if m.gradient_checkpointing] == [0, 2]


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(ac=tk.ACConfig.of(mode="per_submodule")), "ac"),
        (dict(ac=tk.ACConfig.of(mode="full", early_stop=True)), "early_stop"),
        (dict(compile=tk.CompileConfig(scope="moe")), "scope"),
        (dict(compile=tk.CompileConfig(scope="blocks", method="torch_compile")), "method"),
        (dict(compile=tk.CompileConfig(scope="model", method="forward")), "method"),
        (dict(recipe="torchtitan_0_3_0"), "recipe"),
        (dict(fsdp="blocks"), "fsdp"),
        (dict(ep=2), "ep"),
        (dict(model=tk.ModelConfig(n_layers=3)), "model"),
    ],
)
def test_what_transformers_own_code_cannot_take_is_refused_up_front(change, field):
    with pytest.raises(ConfigError) as e:
        tk.Scenario(stack="transformers", **change)
    assert e.value.field == field, e.value


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(family="llama4"), "family"),
        (dict(experts="loop"), "experts"),
        (dict(top_k=9), "top_k"),
        (dict(dim=60, n_heads=8), "dim"),
        (dict(attention_dropout=1.5), "attention_dropout"),
        (dict(n_layers=10**6), "n_layers"),
        (dict(family="deepseek_v3", n_layers=1), "n_layers"),
    ],
)
def test_a_bad_transformers_config_names_its_field(kw, field):
    with pytest.raises(ConfigError) as e:
        hf.TransformersConfig(**kw)
    assert e.value.field == field


def test_the_scenario_round_trips_and_its_default_model_is_transformers():
    s = tk.Scenario(stack="transformers", ac=tk.ACConfig.of(mode="reentrant"), compile=tk.CompileConfig(scope="blocks"))
    assert s.model == hf.TransformersConfig()
    again = tk.Scenario.from_json(s.to_json())
    assert again == s and isinstance(again.model, hf.TransformersConfig)
    assert s.label == "transformers qwen3_moe (grouped_mm) | AC reentrant | compile blocks (aot_eager)"


def test_a_missing_or_unchecked_transformers_is_said_with_its_install_line(monkeypatch):
    monkeypatch.setattr(hf, "available", lambda: False)
    with pytest.raises(ConfigError) as e:
        tk.Scenario(stack="transformers")
    assert 'pip install -e ".[transformers]"' in e.value.fix
    monkeypatch.setattr(hf, "available", lambda: True)
    monkeypatch.setattr(hf, "version", lambda: "5.19.0")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tk.Scenario(stack="transformers")
    said = [str(w.message) for w in caught if "transformers 5.19.0" in str(w.message)]
    assert len(said) == 1 and "5.25.x" in said[0]


def test_the_sweeps_cells_are_transformers_own_and_its_failures_are_named():
    """`matrix --stack transformers`: the quick grid (2 families × 2 AC × eager and 3 compiles), every cell a
    transformers scenario; the per-layer compile under checkpointing is classified and named C2 (a graph break in a
    checkpointed block disables compile) and C67 (this one's cause)."""
    from toolkit.analysis.grids import stack_cells

    quick, full = stack_cells("transformers", quick=True), stack_cells("transformers")
    assert len(quick) == 16 and len(full) == 120
    assert {c.scenario().stack for c in full} == {"transformers"}
    offloaded = [c for c in full if c.ac == "full+offload"]
    assert len(offloaded) == 20 and all(c.scenario().ac.offload for c in offloaded)
    assert {c.scenario().model.experts for c in full if c.block == "hf:qwen3_moe:eager"} == {"eager"}
    cell = next(
        c for c in quick if c.block == "hf:mixtral" and c.ac == "full" and c.scope == "blocks" and not c.fullgraph
    )
    report = tk.run(cell.scenario().replace(measure_memory=False, steady_steps=0))
    found = tk.classify(report)
    assert found.label == "fell_back_to_eager" and {"C2", "C67"} <= set(found.cases), found


def test_the_explorer_builds_transformers_scenarios():
    from toolkit.notebook.widgets import Explorer

    e = Explorer(tk.Scenario(stack="transformers", model=hf.TransformersConfig(family="mixtral")))
    assert e.controls["stack"].value == "hf:mixtral"
    e.controls["ac_mode"].value = "selective_layer"
    assert not e.controls["layer_every"].disabled
    e.controls["scope"].value = "blocks"
    assert e.scenario == tk.Scenario(
        stack="transformers",
        model=hf.TransformersConfig(family="mixtral"),
        ac=tk.ACConfig.of(mode="selective_layer", layer_every=e.controls["layer_every"].value),
        compile=tk.CompileConfig(scope="blocks"),
    )
    e.controls["ac_mode"].value = "reentrant"
    e.controls["offload"].value = True  # transformers' offload=True
    assert not e.controls["offload"].disabled and e.scenario.ac == tk.ACConfig.of(mode="reentrant", offload=True)
    e.controls["offload"].value = False
    e.controls["scope"].value, e.controls["method"].value = "model", "torch_compile"  # torch.compile(model)
    assert not e.run_button.disabled and e.scenario.compile == tk.CompileConfig(scope="model", method="torch_compile")
    e.controls["scope"].value = "blocks"  # transformers' users compile layers in place: refused, naming the field
    assert e.run_button.disabled and "method" in e.status.value
    e.controls["scope"].value, e.controls["method"].value = "none", "module_compile"
    e.controls["ac_mode"].value = "per_submodule"  # not transformers' own: said on the status line, not raised
    assert e.scenario is None and "not runnable" in e.status.value
