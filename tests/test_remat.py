"""torch_remat as an AC mode (torchtitan main's AC) and the torchtitan-main recipe, checked against truths the toolkit
did not compute: outer saved-tensor hooks (`_truth.Truth`), torch_remat's own `is_recomputing()` flag, exact tensor
sizes, and the model's own class `forward` after removal."""

import pytest
import torch
from _helpers import extra, state_diff
from _truth import Truth
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import toolkit as tk
from toolkit.models import local_compile, regions
from toolkit.transforms.naming import has_checkpoint, is_compiled
from toolkit.transforms.record import applied
from toolkit.transforms.remat import plan, region_names
from toolkit.transforms.settings import global_state

remat = extra("torch_remat")

CFG = tk.ModelConfig(experts_impl="masked")
FULL = tk.ACConfig.of(mode="remat")
SELECTIVE = tk.ACConfig.remat_selective()


def truth_bytes(model, tokens):
    with Truth(model) as truth:
        out = model(tokens)
        return truth.bytes(out)


class CountRecompute(TorchDispatchMode):
    """Ops dispatched while torch_remat replays a region (its own flag, not the toolkit's probes)."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if remat.is_recomputing():
            self.ops += 1
        return func(*args, **(kwargs or {}))


def _built(ac, scope="none"):
    torch.manual_seed(0)
    model = tk.build_model(CFG)
    tk.transforms.prepare(
        model, ac=ac, compile=tk.CompileConfig(scope=scope, fullgraph=True) if scope != "none" else None
    )
    return model


def test_regions_are_declared_in_the_model_code_as_torchtitan_main_declares_them():
    """The names main's docs/remat.md gives (`<fqn>.linear`, `<fqn>.grouped_mm`, `<fqn>.inner_attention`, the
    unqualified `routing_decision`, `ffn_residual`, `moe.shared_add`), read off the model's own declarations."""
    main = tk.transforms.get_module(tk.build_model(tk.ModelConfig(layout="torchtitan_main")), "layers.0")
    assert region_names(main) == [
        "ffn_residual",
        "attention.inner_attention",
        "attention.qkv_linear.wqkv.linear",
        "attention.wo.linear",
        "moe.shared_add",
        "routing_decision",
        "moe.router.gate.linear",
        "moe.routed_experts.w13.grouped_mm",
        "moe.routed_experts.w2.grouped_mm",
        "moe.shared_experts.w13.linear",
        "moe.shared_experts.w2.linear",
    ]
    # 0.3.0's inner experts declare w1_EFD + w3_EFD as main's w13 region, so main's patterns apply unchanged.
    grouped = region_names(tk.transforms.get_module(tk.build_model(), "layers.0"))
    assert [n for n in grouped if "routed" in n] == [
        "moe.routed_experts.w13.grouped_mm",
        "moe.routed_experts.w2.grouped_mm",
    ]
    assert {
        "attention.wq.linear",
        "attention.wk.linear",
        "attention.wv.linear",
        "moe.shared_experts.w1.linear",
        "moe.shared_experts.w3.linear",
    } <= set(grouped)
    # Experts without a grouped matmul declare one w13 / w2 region per expert.
    masked = region_names(tk.transforms.get_module(tk.build_model(CFG), "layers.0"))
    assert [n for n in masked if "routed" in n] == [
        f"moe.routed_experts.{w}.expert{e}" for e in range(4) for w in ("w13", "w2")
    ]
    fixed = {"routing_decision", "ffn_residual", "moe.shared_add"}
    assert {n for n, k in plan(main, tk.ACConfig.remat_full()).items() if k} == fixed
    assert {n for n, k in plan(main, SELECTIVE).items() if not k} == {"moe.routed_experts.w13.grouped_mm"}
    # Without a policy every region is the bare call: no torch_remat code runs (the other AC modes see the model
    # as it always was).
    assert not any(regions.active(m) for m in main.modules())


def test_main_refusals_and_fixed_policies():
    """main's `ActivationRematConfig` / `SelectiveActivationRematConfig` / `FullActivationRematConfig`, their
    defaults and refusals, with main's reasons."""
    assert (SELECTIVE.save_regions, SELECTIVE.recompute_regions) == (("*",), ("*routed_experts.w13.*",))
    assert (SELECTIVE.determinism_check, SELECTIVE.preserve_rng_state) == ("default", False)
    assert tk.ACConfig.remat_full() == FULL == tk.ACConfig.of(mode="remat", save_regions=())
    with pytest.raises(
        tk.ConfigError, match="does not support preserve_rng_state=True. Register a torch_remat RecomputeStateHook"
    ):
        tk.ACConfig.remat_selective(preserve_rng_state=True)
    with pytest.raises(tk.ConfigError, match="does not support the debug option"):
        tk.ACConfig.remat_selective(debug=True)
    with pytest.raises(tk.ConfigError, match="does not support the debug option"):
        tk.ACConfig.of(mode="remat", debug=True)
    assert tk.ACConfig.remat_selective(debug=False) == SELECTIVE  # main's default is accepted
    with pytest.raises(tk.ConfigError, match="SelectiveActivationRematConfig is a fixed policy"):
        tk.ACConfig.remat_selective(recompute_regions=("*w2*",))


@pytest.mark.parametrize("ac", [FULL, SELECTIVE], ids=["full", "selective"])
@pytest.mark.parametrize("scope", ["none", "blocks", "attention"])
def test_saved_bytes_match_outer_hooks_eager_and_compiled(ac, scope):
    model = _built(ac, scope)
    tokens = tk.make_batch(CFG).tokens
    report = tk.measure(model, tokens, cold=True)
    assert report.ok, report.error
    assert report.numerics.grads_match is True
    assert report.saved.total_bytes == truth_bytes(model, tokens)
    if scope == "none":
        assert report.compile.graphs == 0
    else:
        assert report.compile.graphs >= 1 and report.compile.graph_breaks == 0
    tk.transforms.reset(model)


@pytest.mark.parametrize("ac", [FULL, SELECTIVE], ids=["full", "selective"])
def test_eager_recompute_count_matches_remats_own_flag(ac):
    model = _built(ac)
    batch = tk.make_batch(CFG)
    report = tk.measure(model, batch.tokens, loss_fn=lambda out: tk.models.loss_fn(out, batch.labels), reference=None)
    with tk.transforms.torch_settings(
        model
    ):  # the step's settings (on a +cpu build, C31's stand-in) as `measure` ran it
        loss = tk.models.loss_fn(model(batch.tokens), batch.labels)
        with CountRecompute() as counted:
            loss.backward()
    # Everything dispatched during remat's replay is either a forward op re-run or the machinery's own work
    # (checkpoint's detach of each tensor it keeps, the replay of a kept region): the two add up to remat's count.
    assert report.recompute.ops + report.recompute.bookkeeping == counted.ops > 0
    assert report.recompute.ops > 0 and report.recompute.bookkeeping > 0
    # Measured on torch 2.13: 488 ops dispatched in replay under full remat, 498 under main's selective policy on
    # these masked experts; of them 326 and 260 are forward ops re-run (tests/test_recompute.py derives both from the
    # blocks' own forward), the rest bookkeeping — the selective policy skips more compute but rebuilds each input a
    # kept region saved as a view (as_strided / detach / view).
    if torch.__version__.startswith("2.13"):
        assert (report.recompute.ops, counted.ops, ac.save_regions) in ((326, 488, ()), (260, 498, ("*",)))


def test_kept_regions_are_their_own_kind_with_exact_sizes():
    B, S, D = CFG.batch, CFG.seq_len, CFG.dim
    full = tk.measure(_built(FULL), tk.make_batch(CFG).tokens, reference=None)
    sel = tk.measure(_built(SELECTIVE), tk.make_batch(CFG).tokens, reference=None)
    # Each block's input is what its checkpoint holds: B·S·D fp32 per block.
    assert (
        full.saved.by_kind["checkpoint_input"] == sel.saved.by_kind["checkpoint_input"] == CFG.n_layers * B * S * D * 4
    )
    # Full remat keeps only the routing decision; the selective policy keeps every projection's output too.
    assert set(t.module for t in full.saved.tensors if t.kind == "remat_save") == {
        "layers.0.moe.router",
        "layers.1.moe.router",
    }
    wq = [t for t in sel.saved.tensors if t.module == "layers.0.attention.wq" and t.kind == "remat_save"]
    assert sum(t.bytes for t in wq) == B * S * D * 4
    assert sel.saved.by_kind["remat_save"] > 40 * full.saved.by_kind["remat_save"]


def test_apply_and_remove_leave_the_model_as_built():
    model = tk.build_model(CFG)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    tk.apply_ac(model, SELECTIVE)
    rec = applied(model)
    # Only the blocks' forwards are replaced; the regions are the model's own code, configured in place.
    assert rec.ac_wrapped == rec.ac_patched == ["layers.0", "layers.1"]
    assert all(regions.active(m) for m in tk.transforms.get_module(model, "layers.0").modules())
    assert has_checkpoint(model)  # seen without any CheckpointWrapper
    assert [n for n, _ in tk.transforms.named_modules(model)] == [
        n for n, _ in tk.transforms.named_modules(tk.build_model(CFG))
    ]
    with pytest.raises(RuntimeError, match="already applied"):
        tk.apply_ac(model, FULL)
    tk.transforms.remove_ac(model)
    assert not any("forward" in m.__dict__ or regions.active(m) for m in model.modules())
    assert not has_checkpoint(model) and applied(model).empty
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_hand_applied_remat_is_refused_not_replaced():
    model = tk.build_model(CFG)
    block = tk.transforms.get_module(model, "layers.1")
    block.forward = remat.checkpoint(region_name="mine")(block.forward)
    with pytest.raises(RuntimeError, match="layers.1 already has its own `forward`"):
        tk.apply_ac(model, FULL)
    assert "forward" not in tk.transforms.get_module(model, "layers.0").__dict__  # nothing left half-applied
    assert applied(model).empty


def test_bad_remat_options_are_refused_before_anything_runs():
    with pytest.raises(tk.ConfigError, match="save_regions.*single string"):
        tk.ACConfig.of(mode="remat", save_regions="attention.*")
    with pytest.raises(tk.ConfigError, match="save_regions.*only used by"):
        tk.ACConfig.of(mode="full", save_regions=("*",))
    with pytest.raises(tk.ConfigError, match="early_stop"):
        tk.ACConfig.of(mode="remat", early_stop=True)
    with pytest.raises(tk.ConfigError, match="'attention.wx' names no region.*attention.wq.linear"):
        tk.apply_ac(tk.build_model(CFG), tk.ACConfig.of(mode="remat", save_regions=("attention.wx",)))
    with pytest.raises(tk.ConfigError, match="preserve_rng_state.*recompute_state_hooks"):
        tk.transforms.prepare(
            tk.build_model(CFG),
            ac=tk.ACConfig.of(mode="remat", preserve_rng_state=True),
            compile=tk.CompileConfig(scope="blocks"),
        )
    with pytest.raises(tk.ConfigError, match="order.*compile\\(AC\\(x\\)\\) only"):
        tk.transforms.prepare(
            tk.build_model(CFG), ac=FULL, compile=tk.CompileConfig(scope="blocks", order="ac_outside")
        )
    # Defaults as torch_remat has them; the replace() of another mode drops them.
    # main's ActivationRematConfig defaults (determinism_check "default", where torch_remat's own is "none").
    assert (FULL.preserve_rng_state, FULL.determinism_check, FULL.save_regions) == (False, "default", ())
    assert FULL.replace(mode="full") == tk.ACConfig.of(mode="full")
    assert tk.ACConfig.from_dict(SELECTIVE.to_dict()) == SELECTIVE


class Dropping(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(
            [nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.5), nn.Linear(16, 16)) for _ in range(2)]
        )

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return x


@pytest.mark.parametrize("preserve", [False, True])
def test_preserve_rng_state_is_a_recompute_state_hook(preserve):
    """Dropout outside any kept region: without restoring the RNG the replay draws a new mask (wrong gradients,
    silently); with the hook the replay draws the forward's. Compared with the same step run without remat."""

    def grads(ac):
        torch.manual_seed(0)
        model = Dropping()
        if ac is not None:
            tk.apply_ac(model, ac)
        torch.manual_seed(1)
        with tk.transforms.torch_settings(model):
            model(torch.ones(4, 16)).square().sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    plain, rematted = grads(None), grads(tk.ACConfig.of(mode="remat", preserve_rng_state=preserve))
    same = all(torch.equal(a, b) for a, b in zip(plain, rematted))
    assert same is preserve


def test_compiling_inside_a_block_says_which_kept_regions_it_makes_inert():
    with pytest.warns(
        UserWarning, match="kept regions layers.0.attention.inner_attention, layers.0.attention.wq.linear.*plain calls"
    ):
        model = _built(SELECTIVE, "attention")
    report = tk.measure(model, tk.make_batch(CFG).tokens, cold=True, reference=None)
    eager = tk.measure(_built(SELECTIVE), tk.make_batch(CFG).tokens, reference=None)
    # Measured: once attention is compiled, its kept regions keep nothing of their own: wq, wk, wv, wo's outputs
    # (B·S·D fp32 each) and the kernel's output and logsumexp, 2 blocks.
    lost = eager.saved.by_kind["remat_save"] - report.saved.by_kind.get("remat_save", 0)
    B, S, D = CFG.batch, CFG.seq_len, CFG.dim
    assert lost >= 2 * (4 * B * S * D * 4)
    tk.transforms.reset(model)


def test_a_hand_applied_remat_block_is_measured_right():
    """torchtitan main's way, by hand: `block.forward = remat.checkpoint(...)(block.forward)` with SAVE regions."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1, self.w3, self.w2 = (
                nn.Linear(32, 64, bias=False),
                nn.Linear(32, 64, bias=False),
                nn.Linear(64, 32, bias=False),
            )

        def forward(self, x):
            a = remat.region(self.w1, "w1", recompute=False)(x)
            b = remat.region(self.w3, "w3", recompute=False)(x)
            remat.recompute_needs_tensor(a, b)
            return x + self.w2(torch.nn.functional.silu(a) * b)

    torch.manual_seed(0)
    block = Block()
    block.forward = remat.checkpoint(region_name="block")(block.forward)
    x = torch.randn(64, 32)
    report = tk.measure(block, x)
    assert report.ok and report.numerics.grads_match is True
    # The reference is a real copy: the user's block gets no gradients from it, and all of the copy's are compared.
    assert all(p.grad is None for p in block.parameters()) and not report.numerics.missing_grads
    assert report.saved.total_bytes == truth_bytes(block, x)
    # a and b kept by the regions; x held by the checkpoint to replay the block (the step's input, flagged as such).
    assert report.saved.by_kind == {"remat_save": 2 * 64 * 64 * 4, "checkpoint_input": 64 * 32 * 4}
    assert [t.is_input for t in report.saved.tensors if t.kind == "checkpoint_input"] == [True]
    with CountRecompute() as counted:
        block(x).square().mean().backward()
    assert report.recompute.ops + report.recompute.bookkeeping == counted.ops > report.recompute.ops > 0


def test_torchtitan_main_recipe_structure_and_truth():
    torch.manual_seed(0)
    model = tk.build_model(CFG)
    state = global_state()
    tk.transforms.apply_recipe(model, "torchtitan_main")
    rec = applied(model)
    assert rec.recipe == "torchtitan_main" and rec.ac == SELECTIVE
    # main's local compile: SwiGLU (16 recompiles), RoPE and the loss as functions; no module compiled, the
    # plain RMSNorms eager.
    assert rec.compiled == ["swiglu()", "cos_sin_rope()", "loss()"] and rec.compile.scope == "none"
    assert rec.compile.fullgraph and "recompile_limit" not in rec.dynamo_config
    # Bound only while a step of this model runs (torch_settings), never for the process: a second model in the
    # same process calls the reference functions.
    assert local_compile.bound() == () and sorted(rec.local_compiled) == ["cos_sin_rope", "loss", "swiglu"]
    with tk.transforms.torch_settings(model):
        assert local_compile.bound() == ("cos_sin_rope", "loss", "swiglu")
    assert local_compile.bound() == ()
    assert local_compile.options("swiglu") == {"recompile_limit": 16}
    assert not any(is_compiled(m) for m in model.modules())
    tokens = tk.make_batch(CFG).tokens
    report = tk.measure(model, tokens, cold=True)
    assert report.ok and report.numerics.grads_match is True
    assert report.compile.graphs >= 1 and report.compile.graph_breaks == 0 and not report.compile.fell_back_to_eager
    assert report.saved.total_bytes == truth_bytes(model, tokens)
    tk.transforms.reset(model)
    assert local_compile.bound() == ()
    assert global_state() == state, state_diff(state, global_state())


def test_run_reports_the_remat_scenario():
    report = tk.run(tk.Scenario(model=CFG, ac=SELECTIVE))
    assert report.ok and report.scenario.ac_mode == "remat" and report.numerics.grads_match is True
    assert report.saved.by_kind.get("remat_save", 0) > 0
    again = tk.Report.from_json(report.to_json())
    assert again == report


def test_the_explorer_offers_remat_and_the_main_recipe():
    from toolkit.notebook.widgets import Explorer

    ex = Explorer()
    ctl = ex.controls
    assert "remat" in ctl["ac_mode"].options and "torchtitan_main" in [v for _, v in ctl["recipe"].options]
    assert ctl["remat_policy"].disabled
    ctl["ac_mode"].value = "remat"
    assert not ctl["remat_policy"].disabled
    assert ex.build_scenario().ac == FULL
    ctl["remat_policy"].value = "selective"
    assert ex.build_scenario().ac == SELECTIVE
    ctl["recipe"].value = "torchtitan_main"
    assert ctl["remat_policy"].disabled and ex.build_scenario().recipe == "torchtitan_main"


def test_the_matrix_has_remat_cells_and_keeps_the_keys_of_the_others():
    from toolkit.analysis.cells import Cell, cell_key, full_cells, quick_cells

    labels = [c.label for c in full_cells()]
    assert "moe:masked | AC remat_selective | attention | aot_eager" in labels
    assert "moe:masked | recipe torchtitan_main | aot_eager" in labels
    assert not any("remat" in lb and "AC outside" in lb for lb in labels)
    assert "moe:for_loop | recipe torchtitan_main | aot_eager" in [c.label for c in quick_cells()]
    assert Cell("moe:masked", "remat_selective").scenario().ac == SELECTIVE
    # A cell that does not use the new ACConfig fields keeps the key its results were stored under (computed
    # here from the fields of before, without save_regions / recompute_regions / policy_save).
    import hashlib
    import json

    sc = Cell("dense", "full", "blocks", True).scenario()
    data = sc.to_dict()
    for k in ("save_regions", "recompute_regions", "policy_save"):
        data["ac"].pop(k)
    blob = json.dumps({"scenario": data, "torch": torch.__version__, "device": "cpu"}, sort_keys=True)
    assert cell_key(sc) == hashlib.sha256(blob.encode()).hexdigest()[:16]


def _placeholder_functions_are_torch_remats() -> bool:
    """torch_remat's placeholder functions are its own, not the toolkit's C31 stand-ins."""
    import torch_remat._api as api
    import torch_remat._view as view

    fns = (api._make_placeholder_tensor, api._is_placeholder, view._is_placeholder)
    return all(f.__module__.startswith("torch_remat") for f in fns)


def test_the_stand_in_lives_only_while_a_step_runs():
    """On a build without the placeholder helper (C31), `train_step` of a model with the toolkit's remat stands in
    for torch_remat's placeholder functions during the step only: before and after it, and with the model still
    alive, they are torch_remat's own; a CUDA build never stands in."""
    model = tk.build_model(CFG)
    tk.apply_ac(model, FULL)
    seen = []
    original = model.layers["0"].forward

    def forward(*args, **kwargs):
        seen.append(_placeholder_functions_are_torch_remats())
        return original(*args, **kwargs)

    model.layers["0"].forward = forward
    assert _placeholder_functions_are_torch_remats()
    tk.train_step(model, tk.make_batch(CFG))
    assert seen == [tk.compat.available("storage_placeholder")]  # stood in during the step on a +cpu build only
    assert _placeholder_functions_are_torch_remats()
    del model.layers["0"].forward
    tk.transforms.remove_ac(model)


def test_the_cpu_build_placeholder_error_is_explained():
    """C31 as a user meets it: a kept region's output that nothing marks. A +cpu torch build lacks the helper the
    placeholder needs, and the Report explains the AttributeError; a CUDA build (on a CPU too) builds the
    placeholder, and reading it is torch_remat's own error (C32)."""
    # The C31 stand-in lives only while a step of a model with the toolkit's remat runs: torch_remat's own
    # functions are in place between steps, whatever earlier tests applied.
    assert _placeholder_functions_are_torch_remats()

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

        def forward(self, x):
            h = remat.region(self.a, "a", recompute=False)(x)
            return remat.region(self.b, "b", recompute=False)(h).relu() + x  # h and b's output unmarked

    block = Block()
    block.forward = remat.checkpoint(region_name="block")(block.forward)
    report = tk.measure(block, torch.randn(4, 16), reference=None)
    if tk.compat.available("storage_placeholder"):
        # The placeholder is built; reading it is remat's own, explicit error (C32), not C31's AttributeError.
        assert "is a placeholder for the output of remat.region 'block::b'" in report.error.message, report.error
        assert not any("C31" in w for w in report.warnings)
        return
    assert "_set_storage_data_ptr_access_error_msg" in report.error.message
    assert report.warnings[0].startswith("case C31, a CPU-build limit")
    assert "warning: case C31" in str(report)


def test_the_central_list_compares_the_0_3_0_and_main_recipes():
    from toolkit.analysis.cells import Cell
    from toolkit.analysis.classification import classify
    from toolkit.analysis.matrix import MatrixResult, Row
    from toolkit.instrument.records import fmt_bytes

    rows = []
    for recipe in ("torchtitan_0_3_0", "torchtitan_main"):
        cell = Cell("moe:masked", recipe=recipe)
        report = tk.run(cell.scenario())
        rows.append(Row(recipe, cell, report, classify(report)))
    result = MatrixResult(rows=rows, environment={"torch": torch.__version__})
    text = result.recipes_table()
    assert text.splitlines()[0] == "## Recipes: torchtitan_0_3_0 → torchtitan_main"
    # Bold where the classification changes: main's SwiGLU recompiles once for the shared expert's rows.
    (line,) = [ln for ln in text.splitlines() if ln.startswith(("| moe:masked", "| **moe:masked**"))]
    for r in rows:
        assert f"saved {fmt_bytes(r.report.saved.total_bytes)}" in line


def test_a_remat_checkpoint_that_fails_is_rolled_back(monkeypatch):
    """apply_remat configures a block's regions before torch_remat wraps it: when `remat.checkpoint` raises, the
    regions it configured are bare calls again and nothing is left patched, so the next apply_ac works (it used to
    fail with "already has its own forward")."""
    model = tk.build_model(CFG)
    calls = []
    original = remat.checkpoint

    def refusing(*args, **kwargs):
        calls.append(kwargs.get("region_name"))
        if kwargs.get("region_name") == "layers.1":
            raise RuntimeError("remat refused")
        return original(*args, **kwargs)

    monkeypatch.setattr(remat, "checkpoint", refusing)
    with pytest.raises(RuntimeError, match="remat refused"):
        tk.apply_ac(model, FULL)
    assert calls == ["layers.0", "layers.1"] and tk.transforms.applied(model).empty and not has_checkpoint(model)
    for block in model.layers.values():
        assert "forward" not in block.__dict__
        assert not any(regions.active(m) for m in block.modules())
    assert _placeholder_functions_are_torch_remats()
    monkeypatch.setattr(remat, "checkpoint", original)
    tk.apply_ac(model, FULL)
    assert tk.transforms.applied(model).ac_patched == ["layers.0", "layers.1"]
    tk.transforms.remove_ac(model)
