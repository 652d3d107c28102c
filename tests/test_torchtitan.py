"""torchtitan 0.3.0 in the loop: its real models, its own AC / compile / FSDP2, measured against an independent truth;
the toolkit's recipes and save list checked against that release's own code."""

import pytest
import torch
from _helpers import extra, state_diff
from _truth import CountingBackend, Truth, patch_sac_contexts

import toolkit as tk
from toolkit.stacks import torchtitan as titan
from toolkit.transforms.fsdp import process_group

extra("torchtitan")
import torchtitan.distributed.activation_checkpoint as titan_ac  # noqa: E402

import toolkit.transforms.policies as policies  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore:CPU Autocast only supports"),
    pytest.mark.filterwarnings("ignore:A saved_tensors_hooks context:FutureWarning"),
]


@pytest.fixture(autouse=True)
def _torchtitans_own_changes_put_back():
    """These tests apply torchtitan's own transforms directly, outside `tk.run`, and those change the process on
    purpose (its `apply_compile` turns `capture_scalar_outputs` on, its AC turns Dynamo's LRU off): put back here,
    so the next test in this worker starts clean. What the toolkit itself leaves is asserted inside the tests."""
    from toolkit.instrument.step import restoring_process_state

    with restoring_process_state(reset_dynamo=False):
        yield


FAMILIES = {"qwen3": titan.TorchtitanConfig.qwen3(), "deepseek_v3": titan.TorchtitanConfig.deepseek_v3()}


def truth_of(model, tokens, loss):
    truth = Truth(model)
    with patch_sac_contexts(truth, titan_ac, policies), truth:
        out = model(tokens)
        n = truth.bytes(out)
    return n, out


@pytest.mark.parametrize("fsdp", [False, True], ids=["no_fsdp", "fsdp"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("ac", ["none", "full", "selective_op"])
@pytest.mark.parametrize("family", ["qwen3", "deepseek_v3"])
def test_real_models_saved_bytes_and_graphs_equal_an_independent_truth(family, ac, compiled, fsdp):
    cfg = FAMILIES[family]
    tokens, labels = titan.make_batch(cfg)
    loss = titan.loss_fn(cfg)
    counter = CountingBackend()
    with process_group():
        model = titan.parallelize(
            titan.build(cfg), ac=ac, compile_backend=counter.backend if compiled else None, fsdp=fsdp
        )
        loss(model(tokens), labels).backward()  # a bare step: the graphs a plain training step compiles
        true_graphs = counter.graphs
        torch._dynamo.reset()
        true_bytes, out = truth_of(model, tokens, loss)  # the truth's hooks may compile differently: not counted
        loss(out, labels).backward()
        del out
        torch._dynamo.reset()  # the measured step compiles afresh, counted again
        counter.graphs = 0
        # torchtitan's apply_ac checkpoints every transformer block: each must have run under its checkpoint.
        blocks = tuple(f"layers.{k}" for k, _ in model.layers.named_children()) if ac != "none" else ()
        report = tk.measure(model, tokens, loss_fn=lambda o: loss(o, labels), checkpointed=blocks)
    assert report.ok, report.error
    assert report.transforms.left_unwrapped == () and report.transforms.unplaced == ()
    assert report.saved.total_bytes == true_bytes
    assert "other" not in report.saved.by_kind
    if compiled:
        assert report.compile.graphs == counter.graphs == true_graphs >= 1 and not report.compile.fell_back_to_eager
    # torchtitan's FQNs, unchanged by its wrappers.
    assert any(m.startswith("layers.") and ".moe." in m for m in report.saved.by_module) or ac != "none"


@pytest.mark.parametrize("recipe, ac", [("torchtitan_0_3_0", "selective_op"), ("torchtitan_0_3_0_full_ac", "full")])
@pytest.mark.parametrize("model_kind", ["qwen3", "deepseek_v3", "toolkit"])
def test_recipes_that_claim_0_3_0_match_its_own_code_exactly(recipe, ac, model_kind):
    """The recipe and torchtitan 0.3.0's own FullAC / SelectiveAC + apply_compile on identical models: the same
    structure, the same graphs, the same saved bytes."""
    assert tk.transforms.RECIPES[recipe].release == titan.RELEASE

    def build():
        if model_kind == "toolkit":
            cfg = tk.ModelConfig(moe_layers=(1,), n_layers=3)  # dense and MoE blocks
            batch = tk.make_batch(cfg)
            return tk.build_model(cfg), batch.tokens, lambda o: tk.models.loss_fn(o, batch.labels)
        cfg = FAMILIES[model_kind]
        tokens, labels = titan.make_batch(cfg)
        loss = titan.loss_fn(cfg)
        return titan.build(cfg), tokens, lambda o: loss(o, labels)

    def structure(model):
        return [
            (name, type(m).__name__, getattr(m, "_compiled_call_impl", None) is not None)
            for name, m in model.named_modules()
        ]

    ours, tokens, loss_of = build()
    counter = CountingBackend()
    tk.transforms.apply_recipe(ours, recipe, backend=counter.backend)
    theirs, _, _ = build()
    theirs_counter = CountingBackend()
    titan.parallelize(theirs, ac=ac, compile_backend=theirs_counter.backend)
    assert structure(ours) == structure(theirs)
    mine = tk.measure(ours, tokens, loss_fn=loss_of)
    torch._dynamo.reset()
    real = tk.measure(theirs, tokens, loss_fn=loss_of)
    assert mine.ok and real.ok
    assert counter.graphs == theirs_counter.graphs == mine.compile.graphs == real.compile.graphs >= 1
    assert mine.saved.total_bytes == real.saved.total_bytes
    assert mine.saved.by_module == real.saved.by_module and mine.saved.by_op == real.saved.by_op
    assert mine.recompute.in_compiled_backward == real.recompute.in_compiled_backward


def test_the_save_list_is_torchtitans_op_for_op():
    assert tk.transforms.default_save_ops() == frozenset(titan_ac._get_default_save_ops())


def test_a_torchtitan_scenario_runs_and_leaves_no_global_state_behind():
    """torchtitan turns Dynamo's LRU cache off and two Dynamo flags on for the rest of the process; a toolkit run
    puts them back."""
    before = tk.transforms.global_state()
    scenario = tk.Scenario(
        stack="torchtitan",
        torchtitan=FAMILIES["qwen3"],
        ac=tk.ACConfig.of(mode="selective_op"),
        compile=tk.CompileConfig(scope="blocks", fullgraph=True),
        fsdp="blocks",
        steady_steps=0,
    )
    report = tk.run(scenario)
    assert tk.transforms.global_state() == before, state_diff(before, tk.transforms.global_state())
    assert report.ok and report.numerics.grads_match, report.numerics
    assert report.scenario.stack == "torchtitan" and report.scenario.fsdp == "blocks"
    assert report.compile.orders == {"layers.0": "compile(AC(x))", "layers.1": "compile(AC(x))"}
    assert str(report).startswith(
        "torchtitan qwen3_moe | AC selective_op | compile blocks (aot_eager, fullgraph) | FSDP blocks: ok"
    )
    assert "layers.0.moe.routed_experts.inner_experts" in {
        n for n, _ in tk.transforms.named_modules(titan.build(FAMILIES["qwen3"]))
    }
    assert tk.Scenario.from_json(scenario.to_json()) == scenario


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(recipe="torchtitan_0_3_0"), "Scenario.recipe"),
        (dict(ac=tk.ACConfig.of(mode="per_submodule")), "Scenario.ac"),
        (dict(ac=tk.ACConfig.of(mode="full", preserve_rng_state=False)), "Scenario.ac"),
        (dict(compile=tk.CompileConfig(scope="moe", fullgraph=True)), "Scenario.compile"),
        (dict(compile=tk.CompileConfig(scope="blocks")), "Scenario.compile"),
        (dict(model=tk.ModelConfig(n_layers=4)), "Scenario.model"),
        (dict(fsdp="blocks+experts"), "Scenario.fsdp"),
    ],
)
def test_what_torchtitans_own_transforms_cannot_take_is_refused_up_front(change, field):
    with pytest.raises(tk.ConfigError, match=field.replace(".", r"\.") + ":.*Fix:"):
        tk.Scenario(stack="torchtitan", **change)
    with pytest.raises(tk.ConfigError, match="Scenario.torchtitan"):
        tk.Scenario(torchtitan=FAMILIES["qwen3"])


TITAN_CELLS = [(ac, compiled) for ac in ("none", "full", "selective_op") for compiled in (False, True)]


@pytest.mark.parametrize("ac,compiled", TITAN_CELLS, ids=[f"{a}-{'blocks' if c else 'eager'}" for a, c in TITAN_CELLS])
def test_torchtitan_cells_get_the_same_verdict_and_cases_whoever_built_the_model(ac, compiled):
    """Each kind of cell the torchtitan stack builds (its AC modes × eager / its per-block compile), run by `tk.run`,
    and the same model built by torchtitan's own `apply_ac` / `apply_compile` in the test and measured by `tk.measure`
    (what a torchtitan user's step is): the same verdict, explanation and known cases, the same saved bytes; the
    orders `tk.measure` read off the step are the ones the stack configured."""
    from toolkit.analysis.classification import classify

    cfg = FAMILIES["qwen3"]
    comp = tk.CompileConfig(scope="blocks", fullgraph=True) if compiled else tk.CompileConfig()
    ours = tk.run(
        tk.Scenario(stack="torchtitan", torchtitan=cfg, ac=tk.ACConfig.of(mode=ac), compile=comp, steady_steps=0)
    )
    tokens, labels = titan.make_batch(cfg)
    loss = titan.loss_fn(cfg)
    model = titan.parallelize(titan.build(cfg), ac=ac, compile_backend="aot_eager" if compiled else None)
    theirs = tk.measure(model, tokens, loss_fn=lambda o: loss(o, labels), cold=True)
    a, b = classify(ours), classify(theirs)
    assert (b.label, b.explanation, b.cases) == (a.label, a.explanation, a.cases)
    assert theirs.saved.total_bytes == ours.saved.total_bytes
    assert theirs.compile.orders == ours.compile.orders
    assert theirs.compile.aot_autograd == ours.compile.aot_autograd == (True if compiled else None)
