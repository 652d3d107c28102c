"""Models with randomness: a benign compile RNG difference is never a mismatch, a recompute that draws new random
numbers always is one and is named, and the verdict leads every summary (issue 37)."""

import subprocess
import sys

import pytest
import torch
from _helpers import extra
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

import toolkit as tk
from toolkit.analysis.classification import classify

DROPOUT = tk.ModelConfig(moe_layers="none", residual_dropout=0.1)
QUIET = dict(measure_memory=False, steady_steps=0)


class Outer(nn.Module):
    """Linear → ReLU → Dropout(0.5) → Linear, as a user writes it."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.block = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 16))

    def forward(self, x):
        return self.block(x)


def _torch_grads(model: nn.Module, x: torch.Tensor, seed: int = 7) -> list[torch.Tensor]:
    """The gradients of one step of `model`, by torch alone (the test's own truth)."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    model(x).float().pow(2).mean().backward()
    out = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return out


def test_a_compiled_model_with_dropout_is_no_mismatch():
    """Compiled dropout draws its numbers otherwise than eager: benign, so the gradients are not compared (the first
    line is "ok"), where they used to read MISMATCH; dropout at p=0 is compared as always."""
    x = torch.randn(8, 16)
    report = tk.measure(torch.compile(Outer(), backend="aot_eager_decomp_partition"), x)
    assert report.verdict == "ok" and report.numerics.grads_match is None
    assert "draws random numbers inside compiled code" in report.numerics.reference
    assert str(report).splitlines()[0] == "OptimizedModule: ok" and classify(report).label == "works"
    calm = Outer()
    calm.block[2].p = 0.0
    assert tk.measure(torch.compile(calm, backend="aot_eager_decomp_partition"), x).numerics.grads_match is True


@pytest.mark.parametrize("preserve", [False, True])
def test_a_recompute_that_redraws_leads_the_first_line(preserve):
    """An eager checkpoint without the RNG restored draws a new mask in its recompute: the first line says so
    (grads_differ, naming the op), `verdict` and the classification agree, and torch alone sees the same
    gradients differ; with the RNG restored, nothing is drawn again and the step matches."""
    x = torch.randn(8, 16)
    model = Outer()
    model.block = checkpoint_wrapper(model.block, preserve_rng_state=preserve)
    plain = Outer()
    differ = any(not torch.allclose(a, b) for a, b in zip(_torch_grads(model, x), _torch_grads(plain, x)))
    assert differ is (not preserve)  # the truth, from torch itself
    report = tk.measure(model, x)
    first = str(report).splitlines()[0]
    if preserve:
        assert report.verdict == "ok" and report.recompute.redrawn == () and first == "Outer: ok"
        return
    assert report.verdict == "grads_differ" and report.ok  # it ran; it is still a silent failure
    assert report.recompute.redrawn == ("block.2 (aten.bernoulli_.float)",)
    assert first.startswith("Outer: grads_differ [silent failure] — recompute re-drew random numbers: block.2")
    cl = classify(report)
    assert cl.label == "grads_differ" and "C61" in cl.cases


def test_the_matrix_tells_preserved_redrawn_and_benign_randomness_apart():
    """The dense model with residual dropout: compile's own RNG is compared with the same compile without AC
    (works), a compiled recompute saves the mask (works), a memory budget recomputes dropout in the compiled
    backward (C60), an eager recompute without the RNG draws again (C61)."""
    compiled = tk.CompileConfig(scope="blocks", fullgraph=True)
    runs = {
        name: tk.run(tk.Scenario(model=DROPOUT, ac=ac, compile=comp, **QUIET))
        for name, ac, comp in (
            ("compiled full", tk.ACConfig.of(mode="full"), compiled),
            ("compiled full, RNG not kept", tk.ACConfig.of(mode="full", preserve_rng_state=False), compiled),
            ("budget", tk.ACConfig.of(mode="memory_budget", memory_budget=0.3), compiled),
            ("eager full, RNG not kept", tk.ACConfig.of(mode="full", preserve_rng_state=False), tk.CompileConfig()),
            ("compiled, no AC", tk.ACConfig.of(), compiled),
        )
    }
    got = {name: (classify(r).label, classify(r).cases) for name, r in runs.items()}
    assert got["compiled full"][0] == got["compiled full, RNG not kept"][0] == "works"
    assert runs["compiled full"].numerics.reference.startswith("compiled the same way without AC")
    assert got["budget"] == ("grads_differ", ("C60",))
    assert runs["budget"].recompute.redrawn == ("the compiled backward of layers.0 (aten.native_dropout.default)",)
    assert runs["budget"].numerics.loss_diff == 0  # the same forward: only the backward drew again
    assert got["eager full, RNG not kept"] == ("grads_differ", ("C61",))
    assert got["compiled, no AC"][0] == "works" and runs["compiled, no AC"].numerics.grads_match is None


def test_torchtitan_mains_remat_without_its_hook_redraws_and_with_it_does_not():
    extra("torch_remat")
    got = {
        keep: tk.run(tk.Scenario(model=DROPOUT, ac=tk.ACConfig.of(mode="remat", preserve_rng_state=keep), **QUIET))
        for keep in (False, True)
    }
    assert classify(got[False]).cases == ("C61",) and got[False].recompute.redrawn
    assert got[True].verdict == "ok" and got[True].numerics.grads_match is True and not got[True].recompute.redrawn


def test_dropout_off_changes_nothing_a_model_did():
    """The new options are left out of the record while off (stored results keep their keys) and add no op."""
    assert "residual_dropout" not in tk.ModelConfig().to_dict() and not tk.ModelConfig().draws_random
    assert DROPOUT.draws_random and DROPOUT.to_dict()["residual_dropout"] == 0.1
    with pytest.raises(tk.ConfigError, match="residual_dropout"):
        tk.ModelConfig(residual_dropout=1.0)


def test_run_strict_exits_3_on_a_redraw(tmp_path):
    sc = tk.Scenario(model=DROPOUT, ac=tk.ACConfig.of(mode="full", preserve_rng_state=False), **QUIET)
    path = tmp_path / "sc.json"
    path.write_text(sc.to_json())
    out = subprocess.run(
        [sys.executable, "-m", "toolkit", "run", "--config", str(path), "--strict", "--no-refs"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 3, out.stderr
    assert "grads_differ [silent failure] — recompute re-drew random numbers" in out.stdout.splitlines()[0]


@pytest.mark.parametrize("compiled,dropout", [(False, 0.0), (True, 0.0), (True, 0.1)])
def test_an_estimate_counts_the_rng_state_a_checkpoint_stashes(compiled, dropout):
    """What the real step keeps, the stashed RNG state included (a CPU generator's 5,056 B per block: host memory,
    said so), byte for byte against the measured Report; with dropout in the blocks every release stashes it."""
    cfg = tk.ModelConfig(n_layers=2, dim=128, residual_dropout=dropout)
    comp = tk.CompileConfig(scope="blocks", fullgraph=True) if compiled else tk.CompileConfig()
    sc = tk.Scenario(model=cfg, ac=tk.ACConfig.of(mode="full"), compile=comp, check_numerics=False, **QUIET)
    est, real = tk.estimate(sc, cuda_rounding=False), tk.run(sc)
    stash = "run_and_save_rng_state" if compiled else "torch.get_rng_state"
    # Stashes: one per checkpointed block, except that torch 2.14 compiles it away where the block draws no random
    # numbers; with dropout the compiled graph also stashes one per random op it replays (two residual dropouts a
    # block), on every release.
    per_block = 0 if compiled and not torch.__version__.startswith("2.13") else 1
    per_dropout = 2 if compiled and dropout else 0
    stash_bytes = 2 * (per_block + per_dropout) * torch.get_rng_state().nbytes
    assert est.rng_state_bytes == stash_bytes == real.saved.by_op.get(stash, 0)
    assert est.saved_bytes == real.saved.total_bytes
    if stash_bytes:
        assert "of it, RNG states stashed for recompute" in str(est) and "on the host" in str(est)
    # Sized for CUDA the stashes are host memory: said apart, not in the device figures.
    cuda = tk.estimate(sc)
    assert cuda.rng_state_bytes == stash_bytes and stash not in cuda.saved_by_op
    assert ("besides, not in the device figures" in str(cuda)) is bool(stash_bytes)


def test_a_nan_gradient_reads_as_not_finite_and_survives_a_json_round_trip():
    """A sweep died classifying `moe:nonzero | remat_selective | moe | eager`, whose gradients were NaN: the NaN
    difference came back from the worker as null. The summary now names it, and the verdict stays grads_differ."""
    import math

    from toolkit.analysis.classification import classify
    from toolkit.instrument.numerics import compare
    from toolkit.measurement.report import Report

    ref = {"w": torch.ones(3)}
    n = compare(1.0, {"w": torch.tensor([1.0, float("nan"), 1.0])}, 1.0, ref, torch.float32, "eager without AC")
    assert n.grads_match is False and math.isnan(n.max_grad_diff) and n.worst_param == "w"
    for report in (Report(outcome="ok", numerics=n), Report.from_json(Report(outcome="ok", numerics=n).to_json())):
        assert report.numerics.grad_diff_text == "not finite (a gradient is NaN or inf)"
        assert classify(report).label == "grads_differ"
        assert "max |dgrad| not finite" in str(report)
