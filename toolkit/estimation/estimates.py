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
import time
from collections import Counter
from typing import Any

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from .. import compat
from .._config import ConfigError, check_bool, check_instance
from ..instrument.capture import capture_warnings
from ..instrument.probes.base import StepState
from ..instrument.probes.checkpoint_hooks import sac_bypasses_hooks_of
from ..instrument.probes.modules import Modules
from ..instrument.step import restoring_process_state
from ..models import ModelConfig, build_model, loss_fn, make_batch
from ..transforms import ACConfig, apply_ac, apply_compile
from ..transforms.fsdp import apply_fsdp
from ..transforms.lifecycle import reset
from ..transforms.naming import module_names
from ..transforms.recipes import apply_recipe
from ..transforms.settings import torch_settings
from .accounting import CUDA_BLOCK, CompiledSaves, LiveStorages, Storage
from .inputs import BareModel, ScenarioLike
from .limits import check, check_world, step_backend
from .records import Estimate, EstimatedTensor
from .shapes import LAYER_SHAPES


def estimate(
    scenario: ScenarioLike | ModelConfig,
    *,
    ac: ACConfig | None = None,
    cuda_rounding: bool = True,
    world_size: int = 1,
    reshard_after_forward: bool = True,
) -> Estimate:
    """Measure one training step of `scenario` (a `tk.Scenario`, or a ModelConfig with `ac`, or the name of one of
    `LAYER_SHAPES`) on fake tensors; see the module doc. With `scenario.fsdp` set, one rank of `world_size`: FSDP2
    shards the model over a fake process group in this process (each rank runs the scenario's batch)."""
    if isinstance(scenario, str) and scenario in LAYER_SHAPES:
        scenario = LAYER_SHAPES[scenario]
    check_instance(
        "estimate",
        "scenario",
        scenario,
        (ScenarioLike, ModelConfig),
        f"pass a Scenario, a ModelConfig, or a name of tk.estimation.LAYER_SHAPES ({', '.join(LAYER_SHAPES)}).",
        names="Scenario or ModelConfig",
    )
    check_bool("estimate", "cuda_rounding", cuda_rounding)
    if ac is not None:
        check_instance("estimate", "ac", ac, ACConfig, "pass tk.ACConfig.of(mode=...), or None.")
    if isinstance(scenario, ModelConfig):
        scenario = BareModel(model=scenario, ac=ac or ACConfig.of())
    elif ac is not None:
        scenario = scenario.replace(ac=ac)
    notes = check(scenario)
    check_world(scenario, world_size, reshard_after_forward)
    t0 = time.perf_counter()
    sink: list[str] = []
    # A compiled estimate forgets Dynamo's graphs before and after, as tk.run does: a graph compiled on fake tensors
    # (inductor's without kernels) must never serve a real step of the same model code, nor a real one this step.
    compiled = step_backend(scenario) != "eager" or scenario.compile.enabled
    with restoring_process_state(reset_dynamo=compiled), capture_warnings(sink), compat.unmade_weak_refs_tolerated():
        if scenario.fsdp == "none":
            est = _step(scenario, cuda_rounding, notes, None, True)
        else:
            with compat.fake_process_group(world_size) as mesh:
                est = _step(scenario, cuda_rounding, notes, mesh, reshard_after_forward)
    return dataclasses.replace(est, seconds=round(time.perf_counter() - t0, 3))


def _step(
    scenario: ScenarioLike, cuda_rounding: bool, notes: list[str], mesh: Any, reshard_after_forward: bool
) -> Estimate:
    FakeTensorMode = compat.fake_tensor_mode_class()
    cfg = scenario.model.replace(device="cpu")
    backend = step_backend(scenario)
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
        live = LiveStorages(CUDA_BLOCK if cuda_rounding else 1, state, known)
        params_bytes = sum(live.size(compat.local_tensor(p).untyped_storage().nbytes()) for p in model.parameters())
        graphs = CompiledSaves(state, set(module_names(model).values()), live)
        modules = Modules(model, state)
        inputs: dict[int, Storage] = {}

        def pack(t):
            # Tensors that existed before the step (the token ids) are saved too, e.g. by the embedding.
            st = t.untyped_storage()
            ref = StorageWeakRef(st)
            if ref.cdata in batch_keys and ref.cdata not in inputs:
                inputs[ref.cdata] = Storage(
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


def _transform(scenario: ScenarioLike, model: nn.Module, mesh: Any, reshard_after_forward: bool) -> None:
    if scenario.recipe is not None:
        apply_recipe(model, scenario.recipe, backend=scenario.recipe_backend)
    else:
        apply_ac(model, scenario.ac)
        apply_compile(model, scenario.compile)
    if mesh is not None:
        apply_fsdp(model, scenario.fsdp, mesh=mesh, reshard_after_forward=reshard_after_forward)


def _check_compiled(
    scenario: ScenarioLike, backend: str, modules: Modules, graphs: CompiledSaves, compiled: int, breaks: int
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
