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
    """`tk.run(Scenario(...))` and the same model built with `tk.build_model`, `tk.transforms.prepare` and measured by
    `tk.measure` (as a user who calls the toolkit's transforms does): the same verdict, explanation and cases."""
    cfg = tk.ModelConfig(n_layers=2, experts_impl="for_loop")
    options = {"memory_budget": 0.3} if ac == "memory_budget" else {}
    ac_cfg = tk.ACConfig.of(mode=ac, **options)
    comp = tk.CompileConfig(
        scope=scope, backend="aot_eager", order=order if ac != "none" and scope == "blocks" else None
    )
    ours = tk.run(tk.Scenario(model=cfg, ac=ac_cfg, compile=comp, steady_steps=0))
    model = tk.transforms.prepare(tk.build_model(cfg), ac=ac_cfg, compile=comp)
    batch = tk.make_batch(cfg)
    try:
        theirs = tk.measure(
            model, batch.tokens, loss_fn=lambda logits: tk.models.loss_fn(logits, batch.labels), cold=True
        )
    finally:
        tk.transforms.reset(model)
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
        tk.Scenario(stack="transformers", model=cfg, ac=tk.ACConfig.of(mode=ac), compile=compile_, steady_steps=0)
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


# litgpt's MoE (`LLaMAMoE`): a test-only truth model, not a toolkit extra. litgpt pins huggingface-hub < 1.4, which
# transformers 5 does not take, so it goes in with --no-deps, as .ci/run installs it.
LITGPT = (
    'needs litgpt 0.5.x: pip install --no-deps "litgpt==0.5.13" "lightning==2.6.6" lightning-utilities torchmetrics'
)


def _litgpt_moe(ac: str):
    """litgpt's GPT with `LLaMAMoE` feed-forwards at a CPU size, from its own Config (nothing downloaded); with
    `ac="full"` each Block checkpointed by torch's `apply_activation_checkpointing`, as a litgpt user without Fabric
    does it."""
    import functools

    from litgpt.model import GPT, Block, Config
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    config = Config(
        n_layer=2,
        n_head=4,
        n_embd=64,
        block_size=32,
        vocab_size=128,
        padded_vocab_size=128,
        mlp_class_name="LLaMAMoE",
        moe_intermediate_size=32,
        n_expert=4,
        n_expert_per_token=2,
        intermediate_size=128,
        norm_class_name="RMSNorm",
        bias=False,
    )
    torch.manual_seed(0)
    model = GPT(config)
    if ac == "full":
        wrapper = functools.partial(checkpoint_wrapper, preserve_rng_state=True)
        apply_activation_checkpointing(model, checkpoint_wrapper_fn=wrapper, check_fn=lambda m: isinstance(m, Block))
    return model


def test_litgpt_llama_moe_is_exact_against_independent_truth():
    """litgpt 0.5's LLaMAMoE: eagerly without AC and with every Block checkpointed, saved bytes equal the test's own
    hooks' count to the byte and gradients match; compiled whole, the graphs are the test's backend's and the
    checkpoints that no graph holds (its counted checkpoint calls) are the ones line 1 names."""
    import importlib.util

    from _truth import Truth

    if importlib.util.find_spec("litgpt") is None:
        pytest.skip(LITGPT)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    for ac in ("none", "full"):
        model = _litgpt_moe(ac)
        with Truth(model) as truth:
            out = model(ids)
            expected = truth.bytes(out)
        del out
        model.zero_grad(set_to_none=True)
        report = tk.measure(model, ids, measure_memory=False)
        assert report.saved.total_bytes == expected > 0, ac
        assert report.verdict == "ok" and report.numerics.grads_match is True
        assert report.packages == ("litgpt",)
    counter = HopCounter()
    report = tk.measure(torch.compile(_litgpt_moe("full"), backend=counter), ids, measure_memory=False, cold=True)
    assert report.compile.graphs == counter.graphs >= 1
    assert len(report.compile.eager_checkpoints) == 2 - counter.checkpoints
    assert report.verdict == ("fell_back_to_eager" if counter.checkpoints < 2 else "ok")


# -- sweep your own model: `matrix --model FILE.py:FUNCTION` ---------------------------------------------------------

MINE = '''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class Expert(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.w = nn.Linear(d, d, bias=False)


class Mine(nn.Module):
    """Blocks in `trunk`, not `layers`; a longer ModuleList of small experts that are not the blocks."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(32, 32)
        self.trunk = nn.ModuleList(Block() for _ in range(3))
        self.spare = nn.ModuleList(Expert() for _ in range(5))
        self.head = nn.Linear(32, 8)

    def forward(self, x):
        x = self.embed(x)
        for block in self.trunk:
            x = block(x)
        return self.head(x)


def build():
    return Mine(), torch.randn(4, 32)


def not_a_model():
    return 3
'''


def _matrix(*args, timeout=600):
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONWARNINGS": "ignore", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "toolkit", "matrix", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def test_a_users_model_is_swept_resumed_and_swept_again_when_edited(tmp_path):
    """`matrix --model mine.py:build`: the blocks found as FSDP's auto-wrap would (`trunk`, the ModuleList with the
    most parameters, not the longer `spare`), the cells listed by --dry-run, three run for real. Saved bytes equal
    the test's own hooks on the same model: plain, and with the test's own checkpoint_wrapper on each trunk block.
    Run again it runs nothing; the file edited, it runs again."""
    import importlib.util
    import json

    from _truth import Truth
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    mine = tmp_path / "mine.py"
    mine.write_text(MINE)
    spec = f"{mine}:build"
    out = tmp_path / "out"
    dry = _matrix("--model", spec, "--dry-run", "--out", str(out))
    assert dry.returncode == 0, dry.stderr
    assert f"--model {spec}: blocks trunk.0 … trunk.2 (3)" in dry.stderr
    listed = [line.strip() for line in dry.stdout.splitlines()[1:]]
    assert len(listed) == 7 and all(line.startswith(f"user:{spec} | AC ") for line in listed)
    assert f"user:{spec} | AC full | blocks (AC outside) | aot_eager" in listed
    only = ("--only", r"\| AC (none \| eager|full \| eager|full \| blocks) \| (eager|aot_eager)$")
    swept = _matrix("--model", spec, *only, "--out", str(out), "--no-progress", "--no-bare")
    assert swept.returncode == 0, swept.stderr
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    reports = {r["cell"]["ac"] + " " + r["cell"]["scope"]: tk.Report.from_dict(r["report"]) for r in records}
    assert set(reports) == {"none none", "full none", "full blocks"}
    assert reports["full blocks"].verdict == "ok" and reports["full blocks"].compile.graphs >= 1
    assert set(reports["full blocks"].transforms.checkpointed) == {"trunk.0", "trunk.1", "trunk.2"}
    module_spec = importlib.util.spec_from_file_location("mine_for_truth", mine)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    for ac in ("none", "full"):
        torch.manual_seed(0)
        model, x = module.build()
        if ac == "full":
            for i, block in enumerate(model.trunk):
                model.trunk[i] = checkpoint_wrapper(block)
        with Truth(model) as truth:
            out_t = model(x)
            expected = truth.bytes(out_t)
        assert reports[f"{ac} none"].saved.total_bytes == expected, ac
    for name in ("matrix.md", "matrix.json", "matrix.html"):
        assert (out / name).is_file()
    again = _matrix("--model", spec, *only, "--out", str(out), "--no-progress", "--no-bare")
    assert again.returncode == 0 and "up to date" in again.stdout.splitlines()[-1], again.stdout
    mine.write_text(MINE + "\n# edited\n")
    edited = _matrix("--model", spec, *only, "--out", str(out), "--dry-run")
    assert "3 to run" in edited.stdout, edited.stdout


@pytest.mark.parametrize(
    "args,words",
    [
        (("--model", "{dir}/absent.py:build"), "is not a file"),
        (("--model", "{dir}/mine.py:nothing"), "has no function 'nothing'"),
        (("--model", "{dir}/mine.py:not_a_model"), "returned int, not (model, inputs)"),
        (("--model", "{dir}/mine.py"), "is not FILE.py:FUNCTION"),
        (("--model", "{dir}/mine.py:build", "--blocks", "Nope"), "whose children are of class 'Nope'"),
        (("--blocks", "Block"), "--blocks names the blocks of --model's model"),
        (("--model", "{dir}/mine.py:build", "--stack", "toolkit"), "--model sweeps your model alone"),
    ],
)
def test_a_users_model_that_cannot_be_swept_is_refused_before_any_cell_runs(tmp_path, args, words):
    (tmp_path / "mine.py").write_text(MINE)
    out = _matrix(*(a.format(dir=tmp_path) for a in args), "--dry-run", "--out", str(tmp_path / "out"))
    assert out.returncode == 2 and words in out.stderr, out.stderr
    assert not (tmp_path / "out").exists()


def test_tk_sweep_takes_your_build_function(tmp_path):
    """`tk.sweep(model=build)` with the function itself (defined at the top of a file): the same cells as
    `matrix --model`; a function that is not (a lambda) is refused naming the field."""
    import importlib.util

    (tmp_path / "mine.py").write_text(MINE)
    spec = importlib.util.spec_from_file_location("mine_for_sweep", tmp_path / "mine.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = tk.sweep(
        model=module.build,
        out=tmp_path / "out",
        progress=False,
        workers=1,
        bare=False,
        runner=lambda s: tk.run(s.replace(check_numerics=False, measure_memory=False, steady_steps=0)),
    )
    labels = [r.cell.label for r in result.rows]
    assert len(labels) == 7 and labels[0] == f"user:{tmp_path / 'mine.py'}:build | AC none | eager | eager"
    assert {r.classification.label for r in result.rows} <= {"works", "ac_saves_nothing"}
    with pytest.raises(tk.ConfigError, match="sweep.model: .* is not a function defined at the top of a .py file"):
        tk.sweep(model=lambda: None, out=tmp_path / "other", progress=False)


def test_a_bug_bundle_of_a_users_model_runs_from_a_fresh_directory(tmp_path):
    """A Report of a user's model cell, exported: the bundle carries a copy of the model's file and its script,
    copied alone into an empty folder (the original file gone), re-runs it and reproduces the outcome."""
    import shutil
    import subprocess
    import sys

    from toolkit.stacks.user import UserModelConfig

    (tmp_path / "mine.py").write_text(MINE)
    scenario = tk.Scenario(
        stack="user",
        model=UserModelConfig(build=f"{tmp_path / 'mine.py'}:build"),
        ac=tk.ACConfig.of(mode="full"),
        compile=tk.CompileConfig(scope="blocks", backend="aot_eager"),
        measure_memory=False,
        steady_steps=0,
    )
    report = tk.run(scenario)
    assert report.verdict == "ok" and report.transforms.checkpointed == ("trunk.0", "trunk.1", "trunk.2")
    bundle = tk.repro.export(report, tmp_path / "out" / "mine", scenario=scenario)
    assert bundle.model is not None and bundle.model.read_text() == MINE
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    for p in (bundle.script, bundle.model):
        shutil.copy(p, fresh / p.name)
    (tmp_path / "mine.py").unlink()
    done = subprocess.run(
        [sys.executable, str(fresh / bundle.script.name)], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("reproduced"), (
        done.stdout[-2000:] + done.stderr[-2000:]
    )


def test_the_explorer_on_your_model(tmp_path):
    """`tk.explore(build)`: your model beside the stacks' own in 'model from', the toolkit's AC and compile toggled
    over its blocks (both orders), its sizes and what it cannot take disabled or refused naming the field; a run
    checkpoints exactly the blocks `--blocks`-less discovery finds, and exports a bundle that carries its file."""
    (tmp_path / "mine.py").write_text(MINE)
    ex = tk.explore(f"{tmp_path / 'mine.py'}:build")
    c = ex.controls
    assert c["stack"].value == f"user:{tmp_path / 'mine.py'}:build"
    assert c["stack"].label == "your model: mine.py:build"
    assert all(c[name].disabled for name in ("n_layers", "n_experts", "top_k", "dim", "recipe", "fsdp"))
    assert ex.estimate_button.disabled and not ex.run_button.disabled
    c["ac_mode"].value, c["scope"].value, c["order"].value = "full", "blocks", "ac_outside"
    assert not c["order"].disabled
    sc = ex.scenario
    assert sc.stack == "user" and sc.ac.mode == "full" and sc.compile.order == "ac_outside"
    c["ac_mode"].value = "per_submodule"  # names the toolkit's own submodules: refused before running
    assert ex.run_button.disabled and "ACConfig.mode" in ex.status.value
    c["ac_mode"].value, c["order"].value = "full", "auto"
    report = ex.run()
    assert report.ok and report.transforms.checkpointed == ("trunk.0", "trunk.1", "trunk.2")
    # One graph: the three blocks are one class at one shape, so Dynamo's guards pass for each and its code is reused.
    assert report.compile.graphs == 1 and ex.stage_text.startswith("done: works")
    py, _ = ex.export(tmp_path / "bundle" / "mine")
    assert (tmp_path / "bundle" / "mine_model.py").read_text() == MINE and py.exists()
    with pytest.raises(tk.ConfigError, match="UserModelConfig.build: 'nowhere.py' is not a file"):
        tk.explore("nowhere.py:build")
    with pytest.raises(tk.ConfigError, match="UserModelConfig.blocks"):
        tk.explore(f"{tmp_path / 'mine.py'}:build", blocks="NoSuchBlock")
