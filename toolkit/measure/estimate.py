"""Full-size memory estimates without allocating: one training step on fake tensors, saved bytes per module and peak.

`estimate(scenario)` builds the model under `FakeTensorMode` (shapes, dtypes and strides, no data), applies the
scenario's activation checkpointing, runs forward, loss and backward, and follows every storage an op creates
until it dies: what is alive when the forward ends is what the step keeps for backward (by module, by op), the
high-water mark is the peak. With `cuda_rounding` each storage counts as the CUDA caching allocator rounds it (a
multiple of 512 bytes), so the numbers are what `torch.cuda.max_memory_allocated` would add for the step.

Limits, checked before any work: no compile (fake tensors run the eager graph — `compile(AC(x))` with full AC saves
the same; per-op SAC and memory budgets need the compiled run), and routed experts with static shapes
(`grouped_mm`, or `masked`): fake tensors have no values, so data-dependent split sizes (`for_loop`,
`nonzero`, `bincount` counts) cannot be known. Autograd never sums gradients in place into a tensor subclass, so
where a parameter gets several gradient contributions (the `masked` experts' `w[e]` slices) the peak comes out a
few percent high (3 % at the test size; `grouped_mm` agrees exactly). Attention saves what the CPU SDPA kernel saves;
CUDA's flash / efficient kernels keep a different (smaller) set — compare with `benchmarks/gpu_validation.py` on a GPU.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from .. import compat
from .._config import ConfigError
from ..compat import TorchDispatchMode, tree_leaves
from ..models import ModelConfig, build_model, loss_fn, make_batch
from ..transforms import ACConfig, apply_ac
from ..transforms.naming import module_names
from .report import fmt_bytes
from .scenario import Scenario

CUDA_BLOCK = 512
"""The CUDA caching allocator rounds every allocation up to a multiple of this many bytes."""

# Shapes of published MoE layers (one block; attention stays the toolkit's multi-head attention, not MLA / GQA).
LAYER_SHAPES: dict[str, ModelConfig] = {
    "deepseek_v3_layer": ModelConfig(
        n_layers=1,
        dim=7168,
        n_heads=128,
        ffn_hidden=18432,
        vocab_size=129280,
        seq_len=4096,
        batch=1,
        dtype="bfloat16",
        n_experts=256,
        top_k=8,
        moe_hidden=2048,
        n_shared_experts=1,
        score_func="sigmoid",
        route_norm=True,
        route_scale=2.5,
        experts_impl="grouped_mm",
    ),
    "llama4_scout_layer": ModelConfig(
        n_layers=1,
        dim=5120,
        n_heads=40,
        ffn_hidden=16384,
        vocab_size=202048,
        seq_len=8192,
        batch=1,
        dtype="bfloat16",
        n_experts=16,
        top_k=1,
        moe_hidden=8192,
        n_shared_experts=1,
        score_func="sigmoid",
        experts_impl="grouped_mm",
    ),
}


@dataclass(frozen=True)
class Estimate:
    """What one training step needs, measured on fake tensors (plain data; JSON round-trip)."""

    scenario: dict[str, Any] = field(default_factory=dict)
    saved_bytes: int = 0
    """Alive when the forward ends, beyond parameters, buffers, inputs and the output: kept for backward."""
    saved_by_module: dict[str, int] = field(default_factory=dict)
    saved_by_op: dict[str, int] = field(default_factory=dict)
    peak_bytes: int = 0
    """High-water mark above the step's start (activations, temporaries, gradients)."""
    params_bytes: int = 0
    cuda_rounding: bool = True
    seconds: float = 0.0
    notes: tuple[str, ...] = ()

    def __str__(self) -> str:
        name = self.scenario.get("name") or "scenario"
        rounding = "CUDA rounding" if self.cuda_rounding else "exact bytes"
        lines = [
            f"estimate {name} ({rounding}): saved {fmt_bytes(self.saved_bytes)}, peak {fmt_bytes(self.peak_bytes)}, "
            f"parameters {fmt_bytes(self.params_bytes)}"
        ]
        for mod, n in sorted(self.saved_by_module.items(), key=lambda kv: -kv[1])[:8]:
            lines.append(f"  {mod or '(model)':<34} {fmt_bytes(n):>10}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Estimate":
        data = json.loads(text)
        data["notes"] = tuple(data.get("notes", ()))
        return cls(**data)


def check(scenario: Scenario) -> list[str]:
    """Raise ConfigError for what fake tensors cannot run; return the notes that apply to the rest."""
    own = "estimate"
    m = scenario.model
    if scenario.recipe is not None:
        raise ConfigError(
            own,
            "recipe",
            f"recipe {scenario.recipe!r} compiles; estimates run the eager graph.",
            "estimate the recipe's AC without compile (e.g. ACConfig(mode='selective_op')).",
        )
    if scenario.compile.scope != "none":
        raise ConfigError(
            own,
            "compile",
            "estimates run the eager graph on fake tensors, not a compiled one.",
            "pass CompileConfig() (full AC saves the same compiled or not); measure compiled runs with tk.run.",
        )
    if scenario.ac.mode == "memory_budget":
        raise ConfigError(own, "ac.mode", "a memory budget only acts in compiled graphs.", "use tk.run for it.")
    if m.has_moe:
        if m.experts_impl in ("for_loop", "nonzero"):
            raise ConfigError(
                own,
                "model.experts_impl",
                f"{m.experts_impl!r} experts split tokens by data-dependent counts, which fake tensors cannot know.",
                "use experts_impl='grouped_mm' or 'masked'.",
            )
        if m.token_count == "bincount":
            raise ConfigError(
                own,
                "model.token_count",
                "bincount has a data-dependent output shape.",
                "use token_count='scatter' (torchtitan) or 'histc'.",
            )
        if m.experts_impl == "grouped_mm" and m.dtype != "bfloat16" and m.layout == "torchtitan_2025":
            raise ConfigError(
                own,
                "model.dtype",
                "torch._grouped_mm's meta kernel accepts only bfloat16 on CPU (C14).",
                "use ModelConfig(dtype='bfloat16') or experts_impl='masked'.",
            )
    if m.attention == "flex":
        raise ConfigError(
            own,
            "model.attention",
            "FlexAttention cannot run its backward on CPU fake tensors.",
            "use attention='sdpa'.",
        )
    notes = [
        "attention saves what CPU SDPA saves; CUDA flash/efficient kernels keep less",
        "RMSNorm runs the CPU composite (fp32 intermediates in a bf16 model); CUDA's fused kernel keeps less",
    ]
    if m.has_moe:
        notes.append(f"routed experts: {m.experts_impl}, static shapes (every token copy is computed, T·K rows)")
    return notes


class _Live(TorchDispatchMode):
    """Follows every storage an op creates, by module and op, and the high-water mark of what is alive."""

    def __init__(self, round_to: int, stack: list[str], known: set[int]):
        super().__init__()
        self.round_to, self.stack, self.known = round_to, stack, known  # known: parameters, buffers, inputs
        self.live: dict[Any, tuple[StorageWeakRef, int, str, str]] = {}
        self.total = self.peak = 0

    def size(self, nbytes: int) -> int:
        return -(-nbytes // self.round_to) * self.round_to if self.round_to > 1 else nbytes

    def sweep(self) -> None:
        for key in [k for k, (ref, *_rest) in self.live.items() if ref.expired()]:
            self.total -= self.live.pop(key)[1]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.sweep()
        op = func.overloadpacket.__name__
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                ref = StorageWeakRef(st)
                if ref.cdata not in self.live and ref.cdata not in self.known and st.nbytes():
                    n = self.size(st.nbytes())
                    self.live[ref.cdata] = (ref, n, self.stack[-1] if self.stack else "", f"aten.{op}")
                    self.total += n
        self.peak = max(self.peak, self.total)
        return out


def estimate(scenario: Scenario | ModelConfig, *, ac: ACConfig | None = None, cuda_rounding: bool = True) -> Estimate:
    """Measure one training step of `scenario` (or a ModelConfig with `ac`) on fake tensors; see the module doc."""
    FakeTensorMode = compat.fake_tensor_mode_class()
    if isinstance(scenario, ModelConfig):
        scenario = Scenario(model=scenario, ac=ac or ACConfig(), name="estimate")
    elif ac is not None:
        scenario = dataclasses.replace(scenario, ac=ac)
    notes = check(scenario)
    t0 = time.perf_counter()
    cfg = scenario.model.replace(device="cpu")
    stack: list[str] = []
    # Built on the meta device (no init: trunc_normal_ needs values), then given fake CPU storages.
    model = build_model(cfg.replace(device="meta"))
    batch = make_batch(cfg)
    with FakeTensorMode(allow_non_fake_inputs=True) as fake:
        model.to_empty(device="cpu")
        batch = type(batch)(*(fake.from_tensor(t) for t in batch))
        apply_ac(model, scenario.ac)
        names = module_names(model)

        def enter(m, args):
            stack.append(names.get(id(m), stack[-1] if stack else ""))

        def leave(m, args, out):
            if stack:
                stack.pop()

        hooks = [
            nn.modules.module.register_module_forward_pre_hook(enter),
            nn.modules.module.register_module_forward_hook(leave, always_call=True),
        ]
        try:
            batch_keys = {StorageWeakRef(t.untyped_storage()).cdata for t in batch}
            known = batch_keys | {
                StorageWeakRef(t.untyped_storage()).cdata for t in [*model.parameters(), *model.buffers()]
            }
            params_bytes = sum(p.untyped_storage().nbytes() for p in model.parameters())
            live = _Live(CUDA_BLOCK if cuda_rounding else 1, stack, known)
            inputs: dict[int, tuple[StorageWeakRef, int, str, str]] = {}

            def pack(t):
                # Tensors that existed before the step (the token ids) are saved too, e.g. by the embedding.
                st = t.untyped_storage()
                ref = StorageWeakRef(st)
                if ref.cdata in batch_keys and ref.cdata not in inputs:
                    inputs[ref.cdata] = (ref, live.size(st.nbytes()), stack[-1] if stack else "", "input")
                return t

            with live, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), compat.sac_bypasses_hooks_of(pack):
                out = model(batch.tokens)
                live.sweep()
                out_key = StorageWeakRef(out.untyped_storage()).cdata
                saved = {**{k: v for k, v in live.live.items() if k != out_key}, **inputs}
                loss = loss_fn(out, batch.labels)
                del out
                loss.backward()
        finally:
            for h in hooks:
                h.remove()
    by_module: Counter = Counter()
    by_op: Counter = Counter()
    for _ref, n, mod, op in saved.values():
        by_module[mod] += n
        by_op[op] += n
    return Estimate(
        scenario={**scenario.to_dict(), "name": scenario.label},
        saved_bytes=sum(by_module.values()),
        saved_by_module=dict(sorted(by_module.items())),
        saved_by_op=dict(sorted(by_op.items())),
        peak_bytes=live.peak,
        params_bytes=params_bytes,
        cuda_rounding=cuda_rounding,
        seconds=round(time.perf_counter() - t0, 3),
        notes=tuple(notes),
    )
