"""Recompute in FLOPs: every Report's recomputed and forward FLOPs against torch's own FlopCounterMode on real steps
that the toolkit does not instrument."""

from __future__ import annotations

import pytest
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import toolkit as tk

CFG = tk.ModelConfig(experts_impl="for_loop", dtype="bfloat16")


def _counted(mode: str, *, math: bool) -> tuple[int, int]:
    """(forward, backward) FLOPs of a real step by FlopCounterMode. In the math attention kernel its matmuls are
    counted; the CPU flash kernel is not in torch's registry, so without `math` attention counts nothing."""
    model = tk.build_model(CFG)
    tk.apply_ac(model, tk.ACConfig.of(mode=mode))
    tokens, labels = tk.make_batch(CFG)
    with sdpa_kernel(SDPBackend.MATH if math else SDPBackend.FLASH_ATTENTION):
        with FlopCounterMode(display=False) as fwd:
            loss = tk.models.loss_fn(model(tokens), labels)
        with FlopCounterMode(display=False) as bwd:
            loss.backward()
    return fwd.get_total_flops(), bwd.get_total_flops()


def _report(mode: str, backend: str | None = None) -> tk.Report:
    compile = tk.CompileConfig(scope="blocks", backend=backend) if backend else tk.CompileConfig()
    scenario = tk.Scenario(
        model=CFG, ac=tk.ACConfig.of(mode=mode), compile=compile, check_numerics=False, steady_steps=0
    )
    return tk.run(scenario)


@pytest.mark.parametrize("backend", [None, "aot_eager", "inductor"])
def test_full_ac_recomputes_the_forward_less_its_head_in_flops(backend):
    """Full AC re-runs every block's forward: backward's extra FLOPs over no AC, counted by torch on real eager steps
    (attention in the math kernel: the same two matmuls the flash formula counts). Compiled, the recompute sits in
    the backward graph, counted from its shapes: the same FLOPs."""
    base, full = _counted("none", math=True), _counted("full", math=True)
    report = _report("full", backend)
    assert report.recompute.forward_flops == full[0] == base[0]
    assert report.recompute.flops == full[1] - base[1] > 0
    assert _report("none", backend).recompute.flops == 0


def test_per_op_sac_recomputes_what_its_policy_does_not_save():
    """torchtitan's per-op policy keeps every other matmul and recomputes attention. torch's counter sees the
    matmuls, and the CPU flash kernel where its registry has it (torch 2.15 does, 2.14 does not): where it does not,
    each block's attention forward adds 4·B·H·L²·Dh (QKᵀ and PV) to what it counts."""
    import torch
    from torch.utils.flop_counter import flop_registry

    base, sac = _counted("none", math=False), _counted("selective_op", math=False)
    counted = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu in flop_registry
    attention = 4 * CFG.batch * CFG.n_heads * CFG.seq_len**2 * (CFG.dim // CFG.n_heads) * CFG.n_layers
    attention = 0 if counted else attention
    report = _report("selective_op")
    assert report.recompute.flops == sac[1] - base[1] + attention
    assert 0 < report.recompute.flops < _report("full").recompute.flops
