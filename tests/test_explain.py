"""A CheckpointError explained: the diverged saved tensor (op, module, metadata both sides) and the right likely cause.

Truth the toolkit did not compute: torch's own CheckpointError message (the position and the metadata that diverged)
and what the models below record of themselves (their token counts per call, the counter they bump).
"""

import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import toolkit as tk
from toolkit import compat
from toolkit.bugs import script
from toolkit.measurement.report import EXPLAINED

_POSITION = re.compile(r"tensor at position (\d+):\s*saved metadata: \{'shape': torch\.Size\(\[([^\]]*)\]\)")
_RECOMPUTED = re.compile(r"recomputed metadata: \{'shape': torch\.Size\(\[([^\]]*)\]\)")

# The figures are torch's own (its CheckpointError message, its checkpoint hooks): they can change with the release.
pytestmark = pytest.mark.per_release

needs_hooks = pytest.mark.skipif(
    not compat.available("checkpoint_hooks"), reason="this torch lacks the checkpoint hooks the probes read"
)


def _shape(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def _torch_says(report) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """The first diverged position and its shapes in the forward and the recompute, as torch's message states them."""
    msg = report.error.message
    m, r = _POSITION.search(msg), _RECOMPUTED.search(msg)
    assert m and r, msg
    return int(m.group(1)), _shape(m.group(2)), _shape(r.group(1))


def _assert_names_torchs_tensor(report) -> None:
    d = report.checkpoint_error
    position, fwd, rec = _torch_says(report)
    assert (d.position, d.forward.shape, d.recompute.shape) == (position, fwd, rec)
    assert (d.forward.dtype, d.forward.device, d.recompute.dtype, d.recompute.device) == ("float32", "cpu") * 2
    # The first warning lines say it, before any other warning.
    assert report.warnings[0].startswith(EXPLAINED[0]) and report.warnings[1].startswith(EXPLAINED[1])
    assert f"saved tensor {position} " in report.warnings[0]


@needs_hooks
def test_near_tie_routing_is_named_routing_with_the_token_counts_the_model_saw():
    c47 = script("C47")
    block = c47.Block()
    report = tk.measure(block, c47.inputs(), reference=None, measure_memory=False)
    assert report.outcome == "error" and report.error.type.endswith("CheckpointError")
    d = report.checkpoint_error
    _assert_names_torchs_tensor(report)
    assert d.cause == "routing_changed", d
    assert (d.region, d.forward.module, d.forward.op) == ("moe", "moe.experts", "aten.mm.default")
    # The model's own record of its two calls (forward, recompute): counts moved by one token.
    forward_counts, recompute_counts = block.moe.counts[-2:]
    assert d.routing.counts_forward == tuple(forward_counts) and d.routing.counts_recompute == tuple(recompute_counts)
    assert (d.routing.module, d.routing.op, d.routing.tokens) == ("moe.router", "aten.topk.default", c47.T)
    assert sum(abs(a - b) for a, b in zip(forward_counts, recompute_counts)) == 2 * d.routing.changed == 2
    assert "routing decisions differ" in report.warnings[1]


@needs_hooks
def test_router_noise_without_rng_restore_is_named_rng_not_preserved():
    noisy = tk.ModelConfig(router_noise=0.5, experts_impl="for_loop")
    ac = tk.ACConfig.of(mode="full", preserve_rng_state=False)
    report = tk.run(tk.Scenario(model=noisy, ac=ac, measure_memory=False, steady_steps=0))
    assert report.outcome == "error" and report.error.type.endswith("CheckpointError")
    _assert_names_torchs_tensor(report)
    d = report.checkpoint_error
    assert d.cause == "rng_not_preserved", d
    assert d.region.startswith("layers.") and d.forward.module.startswith(d.region)
    assert d.routing is not None and d.routing.changed > 0  # the routing changed too, but the RNG is why
    assert any("preserve_rng_state=False" in e for e in d.evidence)
    # Preserving the RNG (the default) passes: the cause named is the one that matters.
    fixed = tk.run(tk.Scenario(model=noisy, ac=tk.ACConfig.of(mode="full"), measure_memory=False, steady_steps=0))
    assert fixed.ok and fixed.checkpoint_error is None


class Counting(nn.Module):
    """Bumps a buffer in place each call and keeps that many rows: the recompute sees the bumped count."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def rows(self, x):
        with torch.no_grad():
            self.calls.add_(1)
        return self.lin(x[: int(self.calls)])

    def forward(self, x):
        return checkpoint(self.rows, x, use_reentrant=False).sum(0)


@needs_hooks
def test_a_buffer_written_in_the_forward_is_named_a_side_effect():
    torch.manual_seed(0)
    model = Counting()
    report = tk.measure(model, torch.randn(8, 16, requires_grad=True), reference=None, measure_memory=False)
    assert report.outcome == "error" and report.error.type.endswith("CheckpointError")
    _assert_names_torchs_tensor(report)
    d = report.checkpoint_error
    assert d.cause == "side_effect", d
    assert (d.forward.shape, d.recompute.shape) == ((1, 16), (2, 16))  # 1 row in the forward, 2 in the recompute
    assert any("calls" in e and "aten.add_.Tensor" in e for e in d.evidence), d.evidence
    assert int(model.calls) == 0  # measure restores the model's buffers


def _mlp(x, w1, w2):
    return F.silu(x @ w1) @ w2


class CompiledInside(nn.Module):
    """A checkpoint around a compiled function of the module's parameters (`AC(compile(f))`): the recompute passes
    the inputs detached, plain Tensors where the forward passed Parameters, so Dynamo's type guard fails there."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.w1 = nn.Parameter(torch.randn(16, 32) * 0.1)
        self.w2 = nn.Parameter(torch.randn(32, 16) * 0.1)
        self.compiled = torch.compile(_mlp, backend="aot_eager")

    def forward(self, x):
        return checkpoint(self.compiled, x, self.w1, self.w2, use_reentrant=False)


@needs_hooks
def test_compiled_forward_eager_recompute_is_named_a_compile_switch():
    x = torch.randn(8, 16, requires_grad=True)
    # At the limit the recompute cannot recompile for its new guard and runs eagerly (C36's signature).
    with torch._dynamo.config.patch(recompile_limit=1):
        report = tk.measure(CompiledInside(), x, reference=None, measure_memory=False)
    assert report.outcome == "error" and report.error.type.endswith("CheckpointError"), report.error
    _assert_names_torchs_tensor(report)
    d = report.checkpoint_error
    assert d.cause == "compile_switch", d
    assert d.forward.op == "compiled graph" and d.recompute.op == "aten.mm.default"
    assert any("guards failed during backward" in e for e in d.evidence), d.evidence
    # With the default limit the recompute compiles a second graph for that guard, which saves other tensors
    # (pytorch#166926): a recompile between the two, compiled on both sides.
    again = tk.measure(CompiledInside(), x, reference=None, measure_memory=False, cold=True)
    _assert_names_torchs_tensor(again)
    d = again.checkpoint_error
    assert d.cause == "compile_switch" and d.forward.op == d.recompute.op == "compiled graph", d
    assert any("expected type of 'w1'" in e for e in d.evidence), d.evidence


def test_without_the_hooks_the_message_still_gives_position_and_metadata(monkeypatch):
    found = dict(compat._found)
    found["checkpoint_hooks"] = compat._Found(False, "hidden for the test")
    monkeypatch.setattr(compat.features, "_found", found)
    c47 = script("C47")
    report = tk.measure(c47.Block(), c47.inputs(), reference=None, measure_memory=False)
    d = report.checkpoint_error
    assert d is not None and d.seen_by == "message" and d.cause == "unknown"
    _assert_names_torchs_tensor(report)


def _no_rng_restore() -> "tk.Scenario":
    return tk.Scenario(
        name="router noise, full AC, no RNG restore",
        model=tk.ModelConfig(router_noise=0.5, experts_impl="for_loop"),
        ac=tk.ACConfig.of(mode="full", preserve_rng_state=False),
        measure_memory=False,
        steady_steps=0,
    )


@needs_hooks
def test_the_cli_says_what_diverged_and_why_in_its_first_lines(tmp_path):
    config = tmp_path / "scenario.json"
    config.write_text(_no_rng_restore().to_json())
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    out = subprocess.run(
        [sys.executable, "-m", "toolkit", "run", "--config", str(config), "--isolate"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 1, out.stderr
    lines = out.stdout.splitlines()
    # Through the isolated child's channel too: the explanation is part of the Report's JSON.
    assert lines[0].startswith("router noise, full AC, no RNG restore: error — CheckpointError at backward: "), lines
    assert "likely cause: RNG not preserved" in lines[0] and " is float32[" in lines[0]
    assert lines[2].startswith("  error at backward: torch.utils.checkpoint.CheckpointError")
    assert lines[3].startswith("  diverged: checkpointed region layers.") and " in the recompute" in lines[3]
    assert lines[4].startswith("  likely cause: RNG not preserved")
    assert lines[5].startswith("  seen: the region draws random numbers (aten.rand_like.default in layers.")


@needs_hooks
def test_the_explorer_shows_it_in_its_status_line_and_summary(monkeypatch):
    from toolkit.notebook import widgets

    report = tk.run(_no_rng_restore())
    monkeypatch.setattr(widgets, "run", lambda *a, **k: report)  # the Explorer has no router-noise control
    ex = widgets.Explorer()
    ex.run()
    assert ex.stage_text.startswith("done: error — CheckpointError at backward: checkpointed region layers.")
    assert "likely cause: RNG not preserved" in ex.stage_text and "#b30000" in ex.stage.value
    assert "likely cause: RNG not preserved" in ex.summary.value and "diverged: checkpointed region" in ex.summary.value
    assert tk.Report.from_json(report.to_json()).checkpoint_error == report.checkpoint_error


@needs_hooks
def test_a_process_that_measured_a_checkpoint_error_exits_cleanly():
    """C59: on torch 2.15.0 a process whose backward raised dies of SIGSEGV at exit (the failed backward's ready nodes
    outlive Python in the thread's autograd queue). The measured step drains them: the process that ran it in-process
    exits with status 0, on every release (the case's own script shows the crash without the drain)."""
    code = (
        "import sys, toolkit as tk\n"
        "r = tk.run(tk.Scenario.from_json(sys.stdin.read()))\n"
        "print(r.outcome, r.error.type.rsplit('.', 1)[-1])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=_no_rng_restore().to_json(),
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        timeout=600,
    )
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    assert out.stdout.split()[-2:] == ["error", "CheckpointError"], out.stdout
