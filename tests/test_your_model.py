"""Your model as well as ours: the same verdict and the same known cases whoever built the model.

The truth here is not the instrument: how many `tag_activation_checkpoint` calls Dynamo put in the graphs, and how
many graphs it compiled, counted by the test's own backend; the memory budget the test itself set in torch's config;
a model transformers built from a config object, checkpointed and compiled the way its users do it.
"""

import pytest
import torch
from _helpers import extra
from torch import nn
from torch.utils.checkpoint import checkpoint

import toolkit as tk
from toolkit.analysis.classification import classify


class Body(nn.Module):
    def __init__(self, d=32, breaks=False):
        super().__init__()
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d)
        self.breaks = breaks

    def forward(self, x):
        h = torch.relu(self.up(x))
        if self.breaks:
            torch._dynamo.graph_break()  # what Dynamo cannot put inside a checkpoint's higher-order op
        return x + self.down(h)


class Layer(nn.Module):
    """A layer that checkpoints its own body, as transformers' GradientCheckpointingLayer does."""

    def __init__(self, breaks):
        super().__init__()
        self.body = Body(breaks=breaks)

    def forward(self, x):
        return checkpoint(self.body, x, use_reentrant=False)


class Net(nn.Module):
    def __init__(self, breaks, d=32):
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.layers = nn.ModuleList([Layer(breaks) for _ in range(2)])
        self.out = nn.Linear(d, d)

    def forward(self, x):
        x = self.inp(x)
        # Unrolled: Dynamo cannot resume after a graph break inside a loop, and would skip the whole frame.
        x = self.layers[0](x)
        x = self.layers[1](x)
        return self.out(x)


class HopCounter:
    """aot_eager behind a Dynamo backend that counts the graphs and the checkpoint calls in them."""

    def __init__(self):
        from torch._dynamo.backends.registry import lookup_backend

        self.graphs = 0
        self.checkpoints = 0
        self._inner = lookup_backend("aot_eager")

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        self.checkpoints += sum(
            1 for n in gm.graph.nodes if n.op == "call_function" and "checkpoint" in str(n.target).lower()
        )
        return self._inner(gm, example_inputs)


@pytest.mark.parametrize("breaks", [True, False])
def test_a_checkpoint_dynamo_gives_up_inside_a_compiled_model_is_named_on_line_1(breaks):
    """Whole-model compile, each layer checkpointing its body. A graph break in the body: Dynamo puts no checkpoint
    in any graph (the test's backend counts 0), so both layers' checkpoints ran eagerly, outside the graph, while
    the rest of the model still compiled; line 1 names them (C2). Without the break, both checkpoints are in the
    graphs and the verdict is ok."""
    torch.manual_seed(0)
    counter = HopCounter()
    model = torch.compile(Net(breaks), backend=counter)
    x = torch.randn(4, 32, requires_grad=True)
    report = tk.measure(model, x, cold=True)
    found = classify(report)
    if breaks:
        assert counter.checkpoints == 0 and counter.graphs >= 1
        assert report.compile.eager_checkpoints == ("layers.0.body", "layers.1.body")
        assert report.verdict == "fell_back_to_eager" and found.label == "fell_back_to_eager"
        assert "checkpointed layers ran eagerly, outside the graph: layers.0.body, layers.1.body" in found.explanation
        assert "C2" in found.cases
        assert str(report).splitlines()[0].startswith("OptimizedModule: fell_back_to_eager [silent failure]")
    else:
        assert counter.checkpoints == 2
        assert report.compile.eager_checkpoints == () and report.verdict == "ok"
        assert "C2" not in found.cases
    assert report.numerics.grads_match is True
    assert set(report.transforms.under_checkpoint) >= {"layers.0.body", "layers.1.body"}


def test_the_eager_backend_running_a_graphs_checkpoint_is_not_a_fallback():
    """Under the `eager` backend the graph's own code runs its checkpoints eagerly: no fallback, a blind spot on
    which modules they covered (as before)."""
    torch.manual_seed(0)
    model = torch.compile(Net(breaks=False), backend="eager")
    report = tk.measure(model, torch.randn(4, 32, requires_grad=True), cold=True, checkpointed=("layers.0",))
    assert report.compile.eager_checkpoints == () and report.verdict == "ok"
    assert report.transforms.unresolved == ("",)


class Counting(nn.Module):
    """A module whose forward reads a Python number that changes every call: Dynamo guards on it and compiles again
    on each call."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.lin(x) * self.calls


def test_graphs_are_counted_per_step_and_a_later_step_compiling_again_is_reported_apart():
    """Step 1 compiles one graph; the memory step compiles another (the guard on `calls` fails). The test's own
    backend counts 2; the Report gives step 1 its 1 and the later one apart."""
    from _truth import CountingBackend

    torch.manual_seed(0)
    counter = CountingBackend()
    model = Counting()
    model.compile(backend=counter.backend)
    report = tk.measure(model, torch.randn(4, 8, requires_grad=True), reference=None, cold=True)
    assert counter.graphs == 2
    assert report.compile.graphs == 1 and report.compile.compiled_later == 1
    assert "a later step compiled 1 more graphs" in str(report)


class Dropping(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(32, 32)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return x + self.drop(torch.relu(self.lin(x)))


@pytest.mark.parametrize("budget", [None, 0.0])
def test_a_memory_budget_the_user_set_is_read_from_torch_and_names_its_case(budget):
    """The user's own `activation_memory_budget` (not the toolkit's memory-budget mode): at 0 the compiled backward
    draws dropout again, C60, named from the budget read in the step; at the default, no budget and no C60."""
    torch.manual_seed(0)
    model = nn.Sequential(Dropping(), Dropping()).train()
    for i in range(2):
        model[i].compile(backend="aot_eager", fullgraph=True)
    x = torch.randn(8, 32, requires_grad=True)
    if budget is None:
        report = tk.measure(model, x, cold=True)
    else:
        with torch._functorch.config.patch(activation_memory_budget=budget):
            report = tk.measure(model, x, cold=True)
    found = classify(report)
    assert report.compile.memory_budget == budget
    if budget is None:
        assert "C60" not in found.cases and not report.recompute.redrawn
    else:
        assert found.label == "grads_differ" and found.cases == ("C60",)
        assert "activation_memory_budget 0 (read from torch's config in the step)" in str(report)


class Raising(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        raise ValueError("my forward is broken")


@pytest.mark.parametrize("reference", ["auto", None])
def test_an_error_in_a_users_forward_is_not_an_error_at_build(reference):
    report = tk.measure(Raising(), torch.randn(2, 4), reference=reference)
    assert report.outcome == "error" and report.error.type == "ValueError"
    assert report.error.stage == ("reference" if reference else "forward")


# -- the toolkit's own cells against the same model prepared by the public API and measured as a user's ----------

TOOLKIT_CELLS = [
    ("none", "blocks", "compile_outside"),
    ("full", "blocks", "compile_outside"),
    ("full", "blocks", "ac_outside"),
    ("selective_op", "blocks", "compile_outside"),
    ("full", "model", "compile_outside"),
    ("selective_op", "moe", "compile_outside"),
    ("memory_budget", "blocks", "compile_outside"),
]


@pytest.mark.parametrize("ac,scope,order", TOOLKIT_CELLS, ids=["-".join(c) for c in TOOLKIT_CELLS])
def test_toolkit_cells_get_the_same_verdict_and_cases_from_measure(ac, scope, order):
    """`tk.run(Scenario(...))` and the same model built with `tk.build_model`, `tk.prepare` and measured by
    `tk.measure` (as a user who calls the toolkit's transforms does): the same verdict, explanation and cases."""
    cfg = tk.ModelConfig(n_layers=2, experts_impl="for_loop")
    options = {"memory_budget": 0.3} if ac == "memory_budget" else {}
    ac_cfg = tk.ACConfig(mode=ac, **options)
    comp = tk.CompileConfig(
        scope=scope, backend="aot_eager", order=order if ac != "none" and scope == "blocks" else None
    )
    ours = tk.run(tk.Scenario(model=cfg, ac=ac_cfg, compile=comp, steady_steps=0))
    model = tk.prepare(tk.build_model(cfg), ac=ac_cfg, compile=comp)
    batch = tk.make_batch(cfg)
    try:
        theirs = tk.measure(model, batch.tokens, loss_fn=lambda logits: tk.loss_fn(logits, batch.labels), cold=True)
    finally:
        tk.reset(model)
    a, b = classify(ours), classify(theirs)
    assert (b.label, b.explanation, b.cases) == (a.label, a.explanation, a.cases)
    assert theirs.saved.total_bytes == ours.saved.total_bytes
    assert theirs.compile.memory_budget == ours.compile.memory_budget == options.get("memory_budget")


# -- transformers: the stack's cells against the same model built by a user's own code -----------------------------

CELLS = [
    (ac, scope)
    for ac in ("none", "full", "reentrant")
    for scope in ("none", "blocks", "model")
    if not (ac == "reentrant" and scope == "none")
]


def _users_model(ac: str, scope: str):
    """Qwen3-MoE as a user builds it: from a config object, with its own checkpointing switch and compile calls."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "qwen3_moe",
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=8,
        num_experts_per_tok=2,
        vocab_size=256,
        use_cache=False,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).train()
    if ac != "none":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": ac == "reentrant"})
    counter = HopCounter()
    if scope == "blocks":
        for layer in model.model.layers:
            layer.compile(backend=counter)
    elif scope == "model":
        model = torch.compile(model, backend=counter)
    return model, counter


@pytest.mark.parametrize("ac,scope", CELLS, ids=[f"{a}-{s}" for a, s in CELLS])
def test_transformers_cells_get_the_same_verdict_and_cases_whoever_built_the_model(ac, scope):
    """Each kind of cell transformers' stack builds (its AC modes × no compile, `layer.compile()`, `torch.compile
    (model)`), run by `tk.run`, and the same model a user built, measured by `tk.measure` with no `loss_fn` (the
    ModelOutput's own loss): the same verdict, explanation and known cases. Where AC and compile meet, Dynamo puts
    no checkpoint in any graph (the test's backend counts 0) and both say which layers ran eagerly (C67)."""
    extra("transformers")
    from toolkit.stacks.transformers import TransformersConfig

    cfg = TransformersConfig(family="qwen3_moe")
    compile_ = (
        tk.CompileConfig()
        if scope == "none"
        else tk.CompileConfig(
            scope=scope, backend="aot_eager", method="torch_compile" if scope == "model" else "module_compile"
        )
    )
    ours = tk.run(
        tk.Scenario(stack="transformers", model=cfg, ac=tk.ACConfig(mode=ac), compile=compile_, steady_steps=0)
    )
    model, counter = _users_model(ac, scope)
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    theirs = tk.measure(model, input_ids=ids, labels=ids, cold=True)
    a, b = classify(ours), classify(theirs)
    assert (b.label, b.explanation, b.cases) == (a.label, a.explanation, a.cases)
    assert theirs.packages == ours.packages == ("transformers",)
    if ac != "none" and scope != "none":
        assert counter.checkpoints == 0
        assert a.label == "fell_back_to_eager" and "C67" in a.cases
        assert theirs.compile.eager_checkpoints == ("model.layers.0", "model.layers.1")
        if scope == "model":  # the rest of the model compiled: only the checkpoints show the fallback
            assert counter.graphs >= 1 and theirs.compile.regions_without_graphs == ()
            assert "C56" not in b.cases
        else:  # each layer's compile held nothing but its checkpoint
            assert counter.graphs == 0
            assert theirs.compile.regions_without_graphs == ("model.layers.0", "model.layers.1")
    else:
        assert a.label == "works", a


# -- models nobody here wrote: transformers families the stack does not name, built offline from config objects ----

OTHER_FAMILIES = [
    "olmoe",
    "qwen2_moe",
    "granitemoe",
    "phimoe",
    "glm4_moe",
    "ernie4_5_moe",
    "hunyuan_v1_moe",
    "gpt_oss",
    "minimax",
    "exaone_moe",
    "olmo2",  # dense
]
_SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=128,
    use_cache=False,
    max_position_embeddings=64,
    num_experts=4,
    num_local_experts=4,
    n_routed_experts=4,
    num_experts_per_tok=2,
)


def _family(family: str):
    """A family at a CPU size, from its own config class with the sizes it has (nothing downloaded)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    base = AutoConfig.for_model(family)
    small = {k: v for k, v in _SMALL.items() if hasattr(base, k)}
    if isinstance(getattr(base, "layer_types", None), list):
        small["layer_types"] = None  # re-derived for 2 layers
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(family, **small)).train()


def _truth_bytes(model, ids) -> int:
    """Saved bytes at the end of the forward by the test's own saved-tensor hooks, plus what each checkpointed
    decoder layer's call receives (its checkpoint holds it to re-run it), RNG stashes; the loss included."""
    from _truth import Truth
    from torch.utils._pytree import tree_leaves
    from transformers.modeling_layers import GradientCheckpointingLayer

    truth = Truth(model)

    def hold(module, args, kwargs):
        for t in tree_leaves((args, kwargs)):
            truth._add(t)

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    hooks = [m.register_forward_pre_hook(hold, with_kwargs=True) for m in layers if m.gradient_checkpointing]
    try:
        with truth:
            out = model(input_ids=ids, labels=ids)
            return truth.bytes((out.loss, out.logits))
    finally:
        for h in hooks:
            h.remove()


@pytest.mark.parametrize("family", OTHER_FAMILIES)
def test_families_the_stack_does_not_name_are_exact_against_independent_truth(family):
    """Eagerly, without AC and with the model's own `gradient_checkpointing_enable`: saved bytes equal the test's
    own hooks' count to the byte, gradients match, the verdict is ok."""
    extra("transformers")
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    for ac in ("none", "full"):
        model = _family(family)
        if ac == "full":
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        expected = _truth_bytes(model, ids)
        model.zero_grad(set_to_none=True)
        report = tk.measure(model, input_ids=ids, labels=ids, measure_memory=False)
        assert report.saved.total_bytes == expected, (family, ac)
        assert report.verdict == "ok" and report.numerics.grads_match is True
        assert report.packages == ("transformers",)


@pytest.mark.parametrize("family", ["olmoe", "phimoe", "glm4_moe", "minimax"])
def test_families_compiled_whole_name_exactly_the_checkpoints_no_graph_holds(family):
    """`torch.compile(model)` over the model's own checkpointing: the graphs the toolkit counts are the test's
    backend's; a layer whose checkpoint is in no graph (the backend counts the checkpoint calls) is named on line 1,
    and only those: all of them (olmoe, phimoe: C67), none (glm4_moe compiles them), one of two (minimax)."""
    extra("transformers")
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    model = _family(family)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    counter = HopCounter()
    report = tk.measure(
        torch.compile(model, backend=counter), input_ids=ids, labels=ids, measure_memory=False, cold=True
    )
    assert report.compile.graphs == counter.graphs >= 1
    eager = 2 - counter.checkpoints
    assert len(report.compile.eager_checkpoints) == eager
    assert report.verdict == ("fell_back_to_eager" if eager else "ok")
    if eager:
        assert "C67" in classify(report).cases
