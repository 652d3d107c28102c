"""Full-size memory estimates without allocating: one training step on fake tensors, eager or compiled, in seconds.

`estimate(scenario)` builds the model under `FakeTensorMode` (shapes, dtypes and strides, no data), applies the
scenario's activation checkpointing and compile (or recipe) with the toolkit's own transforms, runs forward, loss
and backward, and follows every storage an op creates until it dies: what is alive when the forward ends is what
the step keeps for backward (by module, by op), the high-water mark is the peak. With `cuda_rounding` each storage
counts as the CUDA caching allocator rounds it (a multiple of 512 bytes), so the numbers are what
`torch.cuda.max_memory_allocated` would add for the step.

Compiled scopes run the real `torch.compile`: Dynamo traces the fake model, AOTAutograd builds the joint graph and
the backend's own partitioner splits it — aot_eager's min-cut, or inductor's joint-graph passes and min-cut with
inductor's decompositions and recomputable ops — so SAC policies traced into the graph, the memory budget's
knapsack and remat regions are decided as in a real run. aot_eager's graphs then run op by op on fake tensors;
inductor lowers, fuses and plans memory for real, builds no kernel, and its generated wrapper allocates fake
buffers (`compat.inductor_on_fake_tensors`), so what a compiled step allocates and frees is what the estimate
follows. Saved tensors inside a compiled graph are named by the partitioned graph's node (module, op).

Limits, checked before any work: routed experts with static shapes (`grouped_mm`, or `masked`): fake tensors have
no values, so data-dependent split sizes (`for_loop`, `nonzero`, `bincount` counts) cannot be known; a compile
scope that graph-breaks (the experts' stand-in FSDP hook) is refused, and a step whose compile broke or fell back
to eager raises instead of returning the eager graph's numbers. Autograd never sums gradients in place into a
tensor subclass, so where a parameter gets several gradient contributions (the `masked` experts' `w[e]` slices)
the peak comes out a few percent high (3 % at the test size; `grouped_mm` agrees exactly). Attention saves what
the CPU SDPA kernel saves; CUDA's flash / efficient kernels keep a different (smaller) set, and inductor on CUDA
generates Triton kernels with their own fusion — compare with `benchmarks/gpu_validation.py` on a GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import time
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from .. import compat
from .._config import ConfigError, check_bool, check_instance, check_int
from ..compat import TorchDispatchMode, tree_leaves
from ..instrument.capture import capture_warnings
from ..instrument.flops import flops
from ..instrument.probes.base import StepState
from ..instrument.probes.checkpoint_hooks import sac_bypasses_hooks_of
from ..instrument.probes.compiled import CompiledGraphs
from ..instrument.probes.modules import Modules
from ..instrument.records import fmt_bytes
from ..instrument.step import restoring_process_state
from ..measurement.scenario import Scenario
from ..models import ModelConfig, build_model, loss_fn, make_batch
from ..models.moe import experts_attr
from ..transforms import ACConfig, apply_ac, apply_compile
from ..transforms.compile import resolve_scope
from ..transforms.fsdp import apply_fsdp
from ..transforms.lifecycle import reset
from ..transforms.naming import module_names, within
from ..transforms.recipes import apply_recipe
from ..transforms.settings import torch_settings

CUDA_BLOCK = 512
"""The CUDA caching allocator rounds every allocation up to a multiple of this many bytes."""

ESTIMATE_BACKENDS = ("eager", "aot_eager", "aot_eager_decomp_partition", "inductor")
"""Backends whose compiled step the estimate follows on fake tensors (a backend callable is refused)."""
ESTIMATE_RECIPES = ("torchtitan_0_3_0", "torchtitan_0_3_0_full_ac", "torchtitan_main")
"""Recipes whose compile the estimate follows: 0.3.0's whole-block compile, main's local compile."""
# Inductor options that need real kernels (autotuning benchmarks them) or another wrapper language.
_KERNEL_OPTIONS = ("cpp_wrapper", "freezing", "max_autotune", "max_autotune_gemm", "max_autotune_pointwise")

# Shapes of published MoE layers, one block each, from their public configs. Attention is the toolkit's: DeepSeek-V3's
# MLA is multi-head attention of width D here; Llama 4 and Qwen3 have their grouped-query heads (Llama 4's weightless
# QK L2-norm is left out, Qwen3's RMSNorm QK norm is in). Sequence lengths are their pre-training lengths.
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
        n_kv_heads=8,
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
    "qwen3_30b_a3b_layer": ModelConfig(
        n_layers=1,
        dim=2048,
        n_heads=32,
        n_kv_heads=4,
        attention_head_dim=128,
        qk_norm=True,
        ffn_hidden=6144,
        vocab_size=151936,
        seq_len=4096,
        batch=1,
        dtype="bfloat16",
        n_experts=128,
        top_k=8,
        moe_hidden=768,
        n_shared_experts=0,
        score_func="softmax",
        route_norm=True,
        experts_impl="grouped_mm",
    ),
}


@dataclass(frozen=True)
class EstimatedTensor:
    """One storage kept for backward: who made it, its size."""

    module: str
    op: str
    """The op that made it (`aten.mm.default`, as a Report names it), or `input` for a step input."""
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    """Its size as counted (CUDA-rounded when the estimate rounds)."""


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
    saved_tensors: tuple[EstimatedTensor, ...] = ()
    """Every storage in `saved_bytes`, largest first."""
    backend: str = "eager"
    """The compile backend followed ("eager": nothing compiled)."""
    graphs: int = 0
    """Graphs compiled in the step (forward + backward pairs count once)."""
    world_size: int = 1
    """Ranks the model is sharded over (FSDP2, `scenario.fsdp`): every figure is one rank's, with its own batch."""
    reshard_after_forward: bool = True
    unsharded_params_bytes: int = 0
    """FSDP2's gathered parameters still held when the forward ends (units not resharded after their forward: the
    norm and output head, or every block with `reshard_after_forward=False`): counted here, not in `saved_bytes`."""
    grads_bytes: int = 0
    """The gradients when backward ends (one rank's shards under FSDP2), part of `peak_bytes` as they are made."""
    optimizer_bytes: int = 0
    """AdamW's state: two moments like each parameter (`torch.optim.AdamW` makes them with `zeros_like`)."""
    forward_flops: int = 0
    """FLOPs of the forward's matmuls, attention and convolutions (torch's FLOP formulas; pointwise ops are free)."""
    backward_flops: int = 0
    """FLOPs run in backward: the gradients' and any recompute's (recompute is what a setup adds to the same
    step without AC: `tk.plan` reports it)."""
    forward_ops: int = 0
    backward_ops: int = 0
    """aten ops dispatched in the backward (in a compiled region: those its graph runs as ops, not fused kernels)."""
    rng_state_bytes: int = 0
    """The RNG states checkpoints stash for their recompute: host memory, the CPU generator's (5,056 B a stash). Part
    of `saved_bytes` when the estimate is sized for the CPU (`cuda_rounding=False`, as a CPU run counts them); sized
    for CUDA, host memory beside the device figures, counted here only. `peak_bytes` leaves them out."""

    @property
    def per_rank_bytes(self) -> int:
        """What one rank needs in a steady training step: its parameters and AdamW state, held throughout, plus the
        step's high-water mark above them (activations, temporaries, gathered parameters, gradients)."""
        return self.params_bytes + self.optimizer_bytes + self.peak_bytes

    def __str__(self) -> str:
        name = self.scenario.get("name") or "scenario"
        rounding = "CUDA rounding" if self.cuda_rounding else "exact bytes"
        lines = [
            f"estimate {name} ({rounding}): saved {fmt_bytes(self.saved_bytes)}, peak {fmt_bytes(self.peak_bytes)}, "
            f"parameters {fmt_bytes(self.params_bytes)}"
        ]
        if self.world_size > 1 or self.scenario.get("fsdp", "none") != "none":
            lines[0] = (
                f"estimate {name} per rank of {self.world_size} ({rounding}): {fmt_bytes(self.per_rank_bytes)} = "
                f"parameters {fmt_bytes(self.params_bytes)} + AdamW state {fmt_bytes(self.optimizer_bytes)} + step "
                f"peak {fmt_bytes(self.peak_bytes)}; saved {fmt_bytes(self.saved_bytes)}"
            )
        for mod, n in sorted(self.saved_by_module.items(), key=lambda kv: -kv[1])[:8]:
            lines.append(f"  {mod or '(model)':<34} {fmt_bytes(n):>10}")
        if self.rng_state_bytes:
            where = "of it" if not self.cuda_rounding else "besides, not in the device figures"
            lines.append(
                f"  {where}, RNG states stashed for recompute: {fmt_bytes(self.rng_state_bytes)} on the host (the "
                "CPU generator's, 5,056 B a stash; on CUDA a compiled checkpoint stashes the device generator's, 16 B)"
            )
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Estimate":
        from .. import _files

        data = _files.loads(text, "Estimate", "", name="the estimate")
        data["notes"] = tuple(data.get("notes", ()))
        data["saved_tensors"] = tuple(
            EstimatedTensor(**{**t, "shape": tuple(t["shape"])}) for t in data.get("saved_tensors", ())
        )
        return cls(**data)


def _backend(scenario: Scenario) -> str:
    """The backend the step compiles with ("eager" when nothing is compiled)."""
    if scenario.recipe is not None:
        return scenario.recipe_backend
    return scenario.compile.backend_name if scenario.compile.enabled else "eager"


def check(scenario: Scenario) -> list[str]:
    """Raise ConfigError for what fake tensors cannot run; return the notes that apply to the rest."""
    own = "estimate"
    m = scenario.model
    c = scenario.compile
    if scenario.stack != "toolkit":
        raise ConfigError(
            own,
            "stack",
            "estimates build the toolkit's model on fake devices, without torchtitan's or transformers' code.",
            "pass stack='toolkit'; measure the others with tk.run.",
        )
    if scenario.ep != 1:
        raise ConfigError(
            own,
            "ep",
            "expert parallelism's all-to-all splits tokens by data-dependent counts, which fake tensors cannot know.",
            "pass ep=1 (FSDP2 alone); measure expert parallelism with tk.run_distributed.",
        )
    if scenario.recipe is not None and scenario.recipe not in ESTIMATE_RECIPES:
        raise ConfigError(
            own,
            "recipe",
            f"recipe {scenario.recipe!r} replays a 2025 torchtitan whose compile graph-breaks or needs the FSDP hook.",
            f"use one of {', '.join(ESTIMATE_RECIPES)}, or its AC and compile as ac=/compile=.",
        )
    backend = _backend(scenario)
    field_name = "recipe_backend" if scenario.recipe is not None else "compile.backend"
    if c.enabled and not isinstance(c.backend, str):
        raise ConfigError(
            own,
            "compile.backend",
            "a backend callable compiles in ways the estimate cannot follow on fake tensors.",
            f"use one of {', '.join(ESTIMATE_BACKENDS)}.",
        )
    if backend not in ESTIMATE_BACKENDS:
        raise ConfigError(own, field_name, f"{backend!r} is not a backend the estimate follows.", "use aot_eager.")
    if backend == "inductor" and not compat.available("inductor_on_fake"):
        raise ConfigError(own, field_name, compat.blind_spot("inductor_on_fake"), "use backend='aot_eager'.")
    bad = [k for k, _ in c.inductor_options if k in _KERNEL_OPTIONS or k.startswith(("max_autotune", "benchmark"))]
    if bad:
        raise ConfigError(
            own,
            "compile.inductor_options",
            f"{', '.join(bad)} need(s) real kernels (autotuning runs them) or a C++ wrapper, not fake tensors.",
            "drop them: the estimate follows inductor's default code generation.",
        )
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
        if m.experts_untraceable:
            raise ConfigError(
                own,
                "model.dtype",
                f"torch._grouped_mm's meta kernel accepts no {m.dtype} on torch {torch.__version__} (C14; 2.15 does).",
                "use ModelConfig(dtype='bfloat16') or experts_impl='masked'.",
            )
        if m.experts_graph_break and c.enabled and _compiles_experts(scenario):
            raise ConfigError(
                own,
                "model.experts_graph_break",
                f"compile scope {c.scope!r} covers the routed experts, whose stand-in FSDP hook breaks the graph.",
                "drop experts_graph_break, or compile a scope that leaves the experts eager (e.g. 'attention').",
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
    if backend == "inductor":
        notes.append(
            "inductor: its CPU (C++) lowering, fusion and memory plan, kernels not built; on CUDA Triton fuses "
            "differently, so temporaries and the peak may differ (saved tensors follow the same partition)"
        )
    elif backend != "eager":
        notes.append(f"{backend}: AOTAutograd's partition, graphs run op by op on fake tensors")
    return notes


def _compiles_experts(scenario: Scenario) -> bool:
    """The scenario's compile scope traces a block's routed experts (read off a meta model: no memory)."""
    model = build_model(scenario.model.replace(device="meta"))
    experts = [f"layers.{i}.moe.{experts_attr(scenario.model.layout)}" for i in scenario.model.moe_layer_ids]
    targets = resolve_scope(model, scenario.compile.scope)
    return any(within(e, t) for t in targets for e in experts)


@dataclass
class _Storage:
    ref: StorageWeakRef
    nbytes: int
    module: str
    op: str
    dtype: str
    shape: tuple[int, ...]


class _Live(TorchDispatchMode):
    """Follows every storage an op creates, by module and op, and the high-water mark of what is alive."""

    # Without these, Dynamo skips every frame run under the mode (compile silently off, C9) and inductor's
    # `run_and_save_rng_state` raises (see probes/tracker.py).
    supports_higher_order_operators = True

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __init__(self, round_to: int, state: StepState, known: set[int]):
        super().__init__()
        self.round_to, self.state, self.known = round_to, state, known  # known: parameters, buffers, inputs
        self.live: dict[int, _Storage] = {}
        self.total = self.peak = 0
        self.fake = compat.not_real_tensor_types()
        # When a storage dies, without looking at every storage after every op (that scan made a deep model's
        # estimate quadratic in its layers: 40 layers took 40 s). Each op's output tensors are counted per storage
        # and watched (`weakref.finalize`: a fake tensor's Python object lives as long as the tensor, autograd's
        # saved copies included); a storage whose last watched tensor is gone is a suspect, gone for real once
        # its weak reference expires (an unwatched view may still hold it), which is checked after every op.
        self.holders: dict[int, int] = {}
        self.suspects: set[int] = set()
        self.flops: Counter = Counter()
        self.ops: Counter = Counter()
        self.rng: dict[int, _Storage] = {}
        """The RNG states stashed for a recompute: real CPU tensors among the fake ones (a compiled checkpoint's
        `run_and_save_rng_state`, an eager one's `torch.get_rng_state`), host memory, kept apart from the peak."""

    def size(self, nbytes: int) -> int:
        return -(-nbytes // self.round_to) * self.round_to if self.round_to > 1 else nbytes

    def sweep(self) -> None:
        """Forget the storages found dead: the suspects whose weak reference expired."""
        for key in [k for k in self.suspects if self.live[k].ref.expired()]:
            self.suspects.discard(key)
            self.holders.pop(key, None)
            self.total -= self.live.pop(key).nbytes

    def sweep_all(self) -> None:
        """Every storage checked (the end of the forward, before what is alive is read as what is saved)."""
        self.suspects.update(k for k, s in self.live.items() if s.ref.expired())
        self.sweep()

    def _released(self, key: int) -> None:
        n = self.holders.get(key)
        if n is None:
            return
        if n > 1:
            self.holders[key] = n - 1
        elif key in self.live:
            self.holders[key] = 0
            self.suspects.add(key)

    def stash(self, t: torch.Tensor, op: str) -> None:
        """An RNG state a checkpoint stashed (its exact size: host memory, no device rounding)."""
        st = t.untyped_storage()
        ref = StorageWeakRef(st)
        if ref.cdata not in self.rng:
            self.rng[ref.cdata] = _Storage(ref, st.nbytes(), self.state.module(), op, "uint8", tuple(t.shape))

    def add(self, t: torch.Tensor, op: str) -> None:
        if not isinstance(t, self.fake):
            if t.dtype == torch.uint8 and self.state.phase == "forward":
                self.stash(t, op)  # a real tensor among fake ones: the RNG state a compiled checkpoint stashes
            return
        st = t.untyped_storage()
        ref = StorageWeakRef(st)
        key = ref.cdata
        if key in self.known or not st.nbytes():
            return
        if key not in self.live:
            n = self.size(st.nbytes())
            self.live[key] = _Storage(
                ref, n, self.state.module(), op, str(t.dtype).replace("torch.", ""), tuple(t.shape)
            )
            self.total += n
            self.holders[key] = 0
        self.holders[key] += 1
        self.suspects.discard(key)
        weakref.finalize(t, self._released, key)

    def resized(self, st: torch.UntypedStorage) -> None:
        """A storage resized in place (FSDP2 frees a gathered parameter to 0 bytes and refills it)."""
        ref = StorageWeakRef(st)
        key, n = ref.cdata, self.size(st.nbytes())
        entry = self.live.get(key)
        if entry is not None:
            self.total += n - entry.nbytes
            entry.nbytes = n
        elif n and key not in self.known:
            self.live[key] = _Storage(ref, n, self.state.module(), "resize_", "uint8", (st.nbytes(),))
            self.total += n
            self.holders[key] = 0
            self.suspects.add(key)  # no tensor of it is watched: checked by its weak reference
        self.peak = max(self.peak, self.total)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.state.phase in ("forward", "backward"):
            self.ops[self.state.phase] += 1
            self.flops[self.state.phase] += flops(func, args, kwargs or {}, out) or 0
        self.sweep()
        op = None
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.add(t, op or (op := str(func)))
        self.peak = max(self.peak, self.total)
        return out


class _CompiledSaves(CompiledGraphs):
    """The probes' partition watch, on fake tensors: each storage a compiled forward saves is renamed after the
    partitioned graph's node that made it (module relative to the compiled region, op)."""

    def __init__(self, state: StepState, known_modules: set[str], live: _Live):
        super().__init__(state, known_modules)
        self.live = live

    def on_save(self, saved_state: Any, ctx: Any, fw_outs: Any) -> None:
        if self.state.phase != "forward":
            return  # AC(compile(x)): the compiled forward re-runs in backward; its saves die with the recompute
        meta = saved_state.metadata
        region = self.state.region()
        self.region_compiled_runs[region] += 1
        self.graphs_run.add(id(meta))
        rec = self.records.get(id(meta))
        saved = [t for sl in compat.saved_slices(meta) for t in fw_outs[sl]]
        for i, t in enumerate(saved):
            if not isinstance(t, torch.Tensor):
                continue
            gs = rec.saved[i] if rec is not None and i < len(rec.saved) else None
            entry = self.live.live.get(StorageWeakRef(t.untyped_storage()).cdata)
            if entry is None or gs is None or gs.op == "input":
                continue  # a graph input keeps the eager op that made it
            entry.module, entry.op = self.resolve(region, gs.module), gs.op


def _transform(scenario: Scenario, model: nn.Module, mesh: Any, reshard_after_forward: bool) -> None:
    if scenario.recipe is not None:
        apply_recipe(model, scenario.recipe, backend=scenario.recipe_backend)
    else:
        apply_ac(model, scenario.ac)
        apply_compile(model, scenario.compile)
    if mesh is not None:
        apply_fsdp(model, scenario.fsdp, mesh=mesh, reshard_after_forward=reshard_after_forward)


MAX_WORLD_SIZE = 1 << 20


def check_world(scenario: Scenario, world_size: int, reshard_after_forward: bool) -> None:
    """Raise ConfigError, before any work, for a world size the estimate cannot shard over."""
    import torch.distributed as dist

    check_int("estimate", "world_size", world_size, 1, MAX_WORLD_SIZE, "ranks")
    check_bool("estimate", "reshard_after_forward", reshard_after_forward)
    if world_size > 1 and scenario.fsdp == "none":
        raise ConfigError(
            "estimate",
            "fsdp",
            f"world_size={world_size} with fsdp='none' would hold the whole model on every rank.",
            "pass a Scenario with fsdp='blocks' (or 'blocks+experts') to shard it with FSDP2.",
        )
    if scenario.fsdp == "none":
        return
    if not compat.available("fake_process_group"):
        raise ConfigError("estimate", "fsdp", compat.blind_spot("fake_process_group"), "estimate with fsdp='none'.")
    if dist.is_available() and dist.is_initialized():
        raise ConfigError(
            "estimate",
            "world_size",
            "a process group is already initialized here; the estimate shards over a fake one of its own.",
            "estimate outside torchrun, before init_process_group (or after destroy_process_group).",
        )


def estimate(
    scenario: Scenario | ModelConfig,
    *,
    ac: ACConfig | None = None,
    cuda_rounding: bool = True,
    world_size: int = 1,
    reshard_after_forward: bool = True,
) -> Estimate:
    """Measure one training step of `scenario` (or a ModelConfig with `ac`, or the name of one of `LAYER_SHAPES`) on
    fake tensors; see the module doc. With `scenario.fsdp` set, one rank of `world_size`: FSDP2 shards the model over
    a fake process group in this process (each rank runs the scenario's batch)."""
    if isinstance(scenario, str) and scenario in LAYER_SHAPES:
        scenario = LAYER_SHAPES[scenario]
    check_instance(
        "estimate",
        "scenario",
        scenario,
        (Scenario, ModelConfig),
        f"pass a Scenario, a ModelConfig, or a name of tk.estimation.LAYER_SHAPES ({', '.join(LAYER_SHAPES)}).",
    )
    check_bool("estimate", "cuda_rounding", cuda_rounding)
    if ac is not None:
        check_instance("estimate", "ac", ac, ACConfig, "pass tk.ACConfig.of(mode=...), or None.")
    if isinstance(scenario, ModelConfig):
        scenario = Scenario(model=scenario, ac=ac or ACConfig.of(), name="estimate")
    elif ac is not None:
        scenario = dataclasses.replace(scenario, ac=ac)
    notes = check(scenario)
    check_world(scenario, world_size, reshard_after_forward)
    t0 = time.perf_counter()
    sink: list[str] = []
    # A compiled estimate forgets Dynamo's graphs before and after, as tk.run does: a graph compiled on fake tensors
    # (inductor's without kernels) must never serve a real step of the same model code, nor a real one this step.
    compiled = _backend(scenario) != "eager" or scenario.compile.enabled
    with restoring_process_state(reset_dynamo=compiled), capture_warnings(sink), compat.unmade_weak_refs_tolerated():
        if scenario.fsdp == "none":
            est = _step(scenario, cuda_rounding, notes, None, True)
        else:
            with compat.fake_process_group(world_size) as mesh:
                est = _step(scenario, cuda_rounding, notes, mesh, reshard_after_forward)
    return dataclasses.replace(est, seconds=round(time.perf_counter() - t0, 3))


def _step(
    scenario: Scenario, cuda_rounding: bool, notes: list[str], mesh: Any, reshard_after_forward: bool
) -> Estimate:
    FakeTensorMode = compat.fake_tensor_mode_class()
    cfg = scenario.model.replace(device="cpu")
    backend = _backend(scenario)
    # Built on the meta device (no init: trunc_normal_ needs values), then given fake CPU storages.
    model = build_model(cfg.replace(device="meta"))
    batch = make_batch(cfg)
    state = StepState()
    with contextlib.ExitStack() as stack:
        fake = stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
        model.to_empty(device="cpu")
        tokens, labels = (fake.from_tensor(t) for t in batch)
        _transform(scenario, model, mesh, reshard_after_forward)
        stack.callback(reset, model, dynamo=False)
        # After the transforms: over the CPU-build stand-in that a remat transform puts in (it would allocate).
        stack.enter_context(compat.remat_placeholders_on_fake(fake))
        if backend == "inductor":
            stack.enter_context(compat.inductor_on_fake_tensors())
        batch_keys = {StorageWeakRef(t.untyped_storage()).cdata for t in (tokens, labels)}
        # Under FSDP2 a parameter is a DTensor: what the rank holds is its local shard.
        held = [compat.local_tensor(t) for t in [*model.parameters(), *model.buffers()]]
        known = batch_keys | {StorageWeakRef(t.untyped_storage()).cdata for t in held}
        live = _Live(CUDA_BLOCK if cuda_rounding else 1, state, known)
        params_bytes = sum(live.size(compat.local_tensor(p).untyped_storage().nbytes()) for p in model.parameters())
        graphs = _CompiledSaves(state, set(module_names(model).values()), live)
        modules = Modules(model, state)
        inputs: dict[int, _Storage] = {}

        def pack(t):
            # Tensors that existed before the step (the token ids) are saved too, e.g. by the embedding.
            st = t.untyped_storage()
            ref = StorageWeakRef(st)
            if ref.cdata in batch_keys and ref.cdata not in inputs:
                inputs[ref.cdata] = _Storage(
                    ref, live.size(st.nbytes()), state.module(), "input", str(t.dtype).replace("torch.", ""), t.shape
                )
            return t

        compat.skip_code(pack.__code__)
        stack.enter_context(graphs.patches())
        stack.enter_context(modules.hooks())
        stack.enter_context(torch_settings(model))
        real_get_rng_state = torch.get_rng_state

        def get_rng_state(*args, **kwargs):  # an eager checkpoint's stash (not an op: no dispatch mode sees it)
            out = real_get_rng_state(*args, **kwargs)
            if state.phase == "forward":
                live.stash(out, "torch.get_rng_state")
            return out

        stack.enter_context(compat.patched(torch, "get_rng_state", get_rng_state))
        real_resize = torch.UntypedStorage.resize_

        def resize_(storage, *args, **kwargs):  # FSDP2 frees and refills its gathered parameters by resizing
            out = real_resize(storage, *args, **kwargs)
            live.resized(storage)
            return out

        # Both run as Python, never traced: Dynamo tracing one would make its weak references symbolically.
        compat.skip_code(get_rng_state.__code__)
        compat.skip_code(resize_.__code__)
        stack.enter_context(compat.patched(torch.UntypedStorage, "resize_", resize_))
        counted = compat.counters_snapshot()
        with live, torch.autograd.graph.saved_tensors_hooks(pack, _identity), sac_bypasses_hooks_of(pack):
            state.phase = "forward"
            out = model(tokens)
            gc.collect()  # a reference cycle is not kept for backward
            live.sweep_all()
            out_key = StorageWeakRef(out.untyped_storage()).cdata
            rng = {k: v for k, v in live.rng.items() if not v.ref.expired()}
            gathered = {StorageWeakRef(t.untyped_storage()).cdata for t in compat.fsdp_unsharded_parameters(model)[0]}
            unsharded = sum(v.nbytes for k, v in live.live.items() if k in gathered)
            saved = {**{k: v for k, v in live.live.items() if k != out_key and k not in gathered}, **inputs}
            if not cuda_rounding:
                # Sized for the CPU the stashes are the same memory as the rest; sized for CUDA they are host memory
                # beside the device figures, said apart (`rng_state_bytes`).
                saved.update(rng)
            state.phase = "backward"
            loss = loss_fn(out, labels)
            del out
            loss.backward()
            state.phase = "idle"
            # Under FSDP2 the gradients' shards are views of one reduce-scatter buffer per unit: counted once.
            grads = {
                StorageWeakRef(g.untyped_storage()).cdata: g.untyped_storage().nbytes()
                for g in (compat.local_tensor(p.grad) for p in model.parameters() if p.grad is not None)
            }
            grads_bytes = sum(live.size(n) for n in grads.values())
        compiled, breaks = compat.graphs_compiled(counted)
        _check_compiled(scenario, backend, modules, graphs, compiled, breaks)
        notes += [compat.blind_spot(name) for name in sorted(graphs.blind)] + graphs.failures
    by_module: Counter = Counter()
    by_op: Counter = Counter()
    for s in saved.values():
        by_module[s.module] += s.nbytes
        by_op[s.op] += s.nbytes
    tensors = sorted(
        (EstimatedTensor(s.module, s.op, s.dtype, tuple(s.shape), s.nbytes) for s in saved.values()),
        key=lambda t: (-t.nbytes, t.module, t.op),
    )
    return Estimate(
        scenario={**scenario.to_dict(), "name": scenario.label},
        saved_bytes=sum(by_module.values()),
        saved_by_module=dict(sorted(by_module.items())),
        saved_by_op=dict(sorted(by_op.items())),
        peak_bytes=live.peak,
        params_bytes=params_bytes,
        cuda_rounding=cuda_rounding,
        notes=tuple(notes),
        saved_tensors=tuple(tensors),
        backend=backend,
        graphs=compiled,
        rng_state_bytes=sum(s.nbytes for s in rng.values()),
        world_size=mesh.size() if mesh is not None else 1,
        reshard_after_forward=reshard_after_forward,
        unsharded_params_bytes=unsharded,
        grads_bytes=grads_bytes,
        optimizer_bytes=2 * params_bytes,
        forward_flops=live.flops["forward"],
        backward_flops=live.flops["backward"],
        forward_ops=live.ops["forward"],
        backward_ops=live.ops["backward"],
    )


def _check_compiled(
    scenario: Scenario, backend: str, modules: Modules, graphs: _CompiledSaves, compiled: int, breaks: int
) -> None:
    """A compiled step that broke its graph or ran a region eagerly is an error, never the eager graph's numbers."""
    if backend == "eager" and not (scenario.compile.enabled or scenario.recipe):
        return
    if breaks:
        raise ConfigError(
            "estimate",
            "compile.scope",
            f"the compiled step took {breaks} graph break(s); the estimate follows whole graphs only.",
            "compile a scope without graph breaks (check it with tk.run), or pass fullgraph=True to see where.",
        )
    ran = modules.ran_forward()
    eager = sorted(n for n in ran if graphs.region_compiled_runs[n] == 0) if backend != "eager" else []
    if compiled == 0 or eager:
        raise ConfigError(
            "estimate",
            "compile.scope",
            f"compile fell back to eager ({', '.join(eager) or 'no graph compiled'}).",
            "compile a scope Dynamo can trace (tk.run shows why it fell back).",
        )


def _identity(t):
    return t


compat.skip_code(_identity.__code__)
