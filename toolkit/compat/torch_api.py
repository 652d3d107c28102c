"""Calling private torch APIs: thin accessors and wrappers, each reading what `features` detected (no patching).

Nothing else in the toolkit reaches into `torch._*`, `torch.utils.checkpoint._*` or AOTAutograd internals; the
patches the toolkit makes to them are in `patches`, each undone when its `with` ends.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from typing import Any, Callable, Iterator, NamedTuple, cast

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: F401 - the probes' dispatch tracker base (compat.X)
from torch.utils._pytree import tree_leaves  # a private module, used across the toolkit

from . import features
from .features import available


def aot_partition_target() -> tuple[Any, str] | None:
    f = features._found["aot_partition"]
    return f.value if f.ok else None


def aot_saved_state_target() -> tuple[Any, str] | None:
    f = features._found["aot_saved_state"]
    return f.value if f.ok else None


def saved_slices(metadata: Any) -> list[slice]:
    """The slices of a compiled forward's outputs that are saved for backward."""
    return [
        metadata.tensors_saved_for_backwards_with_vc_check_slice,
        metadata.tensors_saved_for_backwards_no_vc_check_slice,
    ]


def forward_graph_of(ctx: Any) -> torch.fx.GraphModule | None:
    """The forward FX graph behind an AOTAutograd function's ctx, where the backend kept one (eager / aot_eager
    keep it; inductor keeps only generated code)."""
    if not features._found["compiled_fw_graph"].ok:
        return None
    fn = getattr(getattr(type(ctx), "_forward_cls", None), "compiled_fw", None)
    return _find_graph_module(fn, depth=0, seen=set())


def compiled_function_of(ctx: Any) -> Any:
    """The AOTAutograd function class behind a forward's ctx."""
    return getattr(type(ctx), "_forward_cls", None)


def backward_graph_of(function_cls: Any) -> torch.fx.GraphModule | None:
    """The backward FX graph of an AOTAutograd function, where the backend kept one and it has been compiled
    (backward compiles lazily: read it after the backward ran)."""
    if not features._found["compiled_fw_graph"].ok or function_cls is None:
        return None
    return _find_graph_module(getattr(function_cls, "compiled_bw", None), depth=0, seen=set())


def _find_graph_module(obj: Any, depth: int, seen: set[int]) -> torch.fx.GraphModule | None:
    if obj is None or depth > 6 or id(obj) in seen:
        return None
    seen.add(id(obj))
    if isinstance(obj, torch.fx.GraphModule):
        return obj
    nexts = [getattr(obj, "__self__", None), getattr(obj, "__wrapped__", None)]
    for cell in getattr(obj, "__closure__", None) or ():
        with contextlib.suppress(ValueError):
            nexts.append(cell.cell_contents)
    for n in nexts:
        if n is not None and (callable(n) or isinstance(n, nn.Module)):
            gm = _find_graph_module(n, depth + 1, seen)
            if gm is not None:
                return gm
    return None


def sac_mode_class() -> type | None:
    f = features._found["sac_mode"]
    return f.value if f.ok else None


def sac_storage_tensors(storage: Any) -> Iterator[torch.Tensor]:
    """The tensors a SAC caching mode's storage holds (`{key: {index: pytree of _VersionWrapper}}`)."""
    for entries in list(storage.values()):
        values = entries.values() if isinstance(entries, dict) else entries
        for entry in list(values):
            for leaf in tree_leaves(entry):
                val = getattr(leaf, "val", leaf)
                if isinstance(val, torch.Tensor):
                    yield val


def checkpoint_generator_target() -> tuple[Any, str, inspect.Signature] | None:
    f = features._found["checkpoint_generator"]
    return f.value if f.ok else None


def reentrant_checkpoint_class() -> type | None:
    """torch.utils.checkpoint's `CheckpointFunction` (the reentrant checkpoint), or None where it has another shape."""
    f = features._found["reentrant_checkpoint"]
    return f.value if f.ok else None


def save_on_cpu_class() -> type | None:
    """`torch.autograd.graph.save_on_cpu`, whose instances keep their pack hook as `pack_hook`, or None."""
    f = features._found["save_on_cpu"]
    return f.value if f.ok else None


def draws_random(func: Any, args: tuple, kwargs: dict) -> bool:
    """Does this call draw from torch's global RNG? Ops tagged `nondeterministic_seeded`, unless given a generator
    of their own or a dropout probability of 0 (SDPA and dropout kernels carry the tag for their dropout)."""
    if torch.Tag.nondeterministic_seeded not in (getattr(func, "tags", ()) or ()):
        return False
    if kwargs.get("generator") is not None:
        return False
    schema = getattr(func, "_schema", None) if features._found["op_schema"].ok else None
    if schema is not None:
        for i, a in enumerate(schema.arguments):
            if a.name in ("dropout_p", "p") and a.type.kind() == "FloatType":
                value = args[i] if i < len(args) else kwargs.get(a.name, a.default_value)
                if value == 0:
                    return False
            if a.name == "train" and i < len(args) and args[i] is False:
                return False
            if a.name == "generator" and i < len(args) and args[i] is not None:
                return False
    return True


_written: dict[Any, tuple[Any, ...]] = {}


def written_arguments(func: Any) -> tuple[Any, ...]:
    """The positions (ints) and keyword names (strs) of the arguments an op writes in place (`add_`'s self, an
    `out=`); () for a functional op, or where this torch has no schema to read."""
    out = _written.get(func)
    if out is None:
        out = ()
        schema = getattr(func, "_schema", None) if features._found["op_schema"].ok else None
        if schema is not None:
            written = [
                (i, a.name)
                for i, a in enumerate(schema.arguments)
                if a.alias_info is not None and a.alias_info.is_write
            ]
            out = tuple(i for i, _ in written) + tuple(name for _, name in written)
        _written[func] = out
    return out


@functools.lru_cache(maxsize=None)
def grouped_mm_traces_in(dtype: str) -> bool:
    """Does `torch._grouped_mm`'s meta kernel, what compile traces, accept `dtype` ("float32", "bfloat16")? Asked of
    the kernel itself, on meta tensors: 2.13 and 2.14 accept bfloat16 and float16 only ("Expected mat_a to be
    BFloat16 or supported Float16 matrix", C14); 2.15 validates like the eager kernel and accepts float32 too."""
    dt = getattr(torch, dtype)
    try:
        torch._grouped_mm(
            torch.empty(16, 16, device="meta", dtype=dt),
            torch.empty(2, 16, 16, device="meta", dtype=dt),
            offs=torch.empty(2, device="meta", dtype=torch.int32),
        )
    except RuntimeError:
        return False
    return True


def checkpoint_policy_dict(keys: tuple[str, ...]) -> dict[str, Any]:
    """`checkpoint(policy=...)`'s dict (pytorch#186277) saving `keys` (op names, or names given with
    `torch.utils.checkpoint.name`); what it does not name is recomputed. Only where `checkpoint_policy_dict` is
    available."""
    from torch.utils.checkpoint import CheckpointPolicy

    return {key: CheckpointPolicy.MUST_SAVE for key in keys}


def current_saved_tensors_hooks() -> tuple[Callable, Callable] | None:
    """The innermost saved-tensor hooks a SAC cache would route through (torch >= 2.14), skipping checkpoint's own."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    if top is None:
        return None
    hooks = top(False)
    while hooks is not None and getattr(hooks[0], "_checkpoint_internal", False):
        hooks = getattr(hooks[0], "_user_hooks", None)
    return hooks


def trace_logger() -> logging.Logger | None:
    f = features._found["structured_trace"]
    return f.value if f.ok else None


def dynamo_counters() -> Any | None:
    f = features._found["dynamo_counters"]
    return f.value if f.ok else None


def counters_snapshot() -> dict[str, dict[str, int]]:
    c = dynamo_counters()
    return {} if c is None else {k: dict(v) for k, v in c.items()}


def counters_restore(snapshot: dict[str, dict[str, int]]) -> None:
    c = dynamo_counters()
    if c is None:
        return
    c.clear()
    for k, v in snapshot.items():
        c[k].update(v)


def graphs_compiled(before: dict[str, dict[str, int]]) -> tuple[int, int]:
    """`(unique graphs, graph breaks)` added to Dynamo's counters since `before`."""
    now = counters_snapshot()
    graphs = now.get("stats", {}).get("unique_graphs", 0) - before.get("stats", {}).get("unique_graphs", 0)
    breaks = sum(now.get("graph_break", {}).values()) - sum(before.get("graph_break", {}).values())
    return int(graphs), int(breaks)


def through_aot_autograd(before: dict[str, dict[str, int]]) -> bool | None:
    """Whether the graphs Dynamo compiled since `before` went through AOTAutograd (`aot_eager`, `inductor`: a
    partition into forward and backward graphs), read from Dynamo's counters; False: a backend that runs Dynamo's
    graph as traced (`eager`); None when it compiled none."""
    now = counters_snapshot()
    graphs = now.get("stats", {}).get("unique_graphs", 0) - before.get("stats", {}).get("unique_graphs", 0)
    aot = now.get("aot_autograd", {}).get("total", 0) - before.get("aot_autograd", {}).get("total", 0)
    return None if graphs <= 0 else aot > 0


_to_skip: list[Any] = []


def dynamo_disabled(fn: Callable) -> Callable:
    """`fn` run with Dynamo off, for it and everything it calls (`torch.compiler.disable`): for the probes' hooks that
    autograd calls from inside frames Dynamo is running."""
    return torch.compiler.disable(fn)


def traced_as(new: Callable, original: Callable) -> Callable:
    """`new`, a stand-in for the torch function `original`, given `original`'s code identity (file, name, qualified
    name, first line): Dynamo decides by these whether to inline a call or break the graph on it, so a call it meets
    inside a compiled region breaks (or errors under fullgraph) exactly as the original's does, with the same
    message. Without it Dynamo inlines the stand-in and fails on the instrument's own objects instead."""
    code = original.__code__
    new.__code__ = new.__code__.replace(
        co_filename=code.co_filename,
        co_name=code.co_name,
        co_qualname=code.co_qualname,
        co_firstlineno=code.co_firstlineno,
    )
    new.__name__, new.__qualname__, new.__module__ = original.__name__, original.__qualname__, original.__module__
    return new


def skip_code(code: Any) -> None:
    """Keep Dynamo from tracing `code`, from the next `apply_skips()` on (the probes call it as they start):
    registering imports Dynamo, which importing a module that declares its hooks must not."""
    _to_skip.append(code)


def apply_skips() -> None:
    """Register every code object `skip_code` was given so far."""
    if not _to_skip:
        return
    f = features._found["skip_code"]
    while _to_skip:
        code = _to_skip.pop()
        if f.ok:
            f.value(code)


def profiler_event_type() -> Any | None:
    f = features._found["profiler_allocations"]
    return f.value if f.ok else None


def not_real_tensor_types() -> tuple[type, ...]:
    f = features._found["fake_tensors"]
    return f.value if f.ok else ()


def cuda_memory_history(enabled: bool) -> None:
    """Start (max 100000 entries) or stop recording CUDA allocator history for a snapshot."""
    if enabled:
        torch.cuda.memory._record_memory_history(max_entries=100000)
    else:
        torch.cuda.memory._record_memory_history(enabled=None)


def cuda_dump_snapshot(path: str) -> None:
    torch.cuda.memory._dump_snapshot(path)


def dynamo_has_config(name: str) -> bool:
    return hasattr(torch._dynamo.config, name)


def fake_tensor_mode_class() -> type:
    """FakeTensorMode (estimates run a step on fake tensors)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode


def storage_nbytes_now(weak_cdata: int) -> int | None:
    """The current size of the storage behind a weak reference (None when it is gone or unreadable)."""
    if not features._found["storage_weak_ptr"].ok:
        return None
    st = torch.UntypedStorage._new_with_weak_ptr(weak_cdata)
    return None if st is None else st.nbytes()


@contextlib.contextmanager
def fake_process_group(world_size: int) -> Iterator[Any]:
    """A default process group of `world_size` fake ranks in this process (this one rank 0, every collective a
    no-op) and its 1-D CPU device mesh ("fsdp"), for the duration; destroyed after. The mesh is made before any
    FakeTensorMode is entered (it reads its rank map's values). The caller checks that no group exists."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("fake", rank=0, world_size=world_size, store=features._found["fake_process_group"].value())
    try:
        yield init_device_mesh("cpu", (world_size,), mesh_dim_names=("fsdp",))
    finally:
        dist.destroy_process_group()


def flop_formula(func: Any) -> Callable[..., int] | None:
    """torch's FLOP formula for an aten op (`FlopCounterMode`'s registry: matmuls, attention, convolutions), called
    as `formula(*args, **kwargs, out_val=out)`; None for an op it does not count or when the registry is missing."""
    f = features._found["flop_registry"]
    return f.value.get(getattr(func, "_overloadpacket", func)) if f.ok else None


def sdpa_flop_counts() -> tuple[Callable[..., int], Callable[..., int]] | None:
    """torch's attention FLOP counts by shape, `(forward(q, k, v), backward(grad_out, q, k, v))`, for the attention
    kernels its registry does not map (the CPU flash kernel)."""
    if not features._found["flop_registry"].ok:
        return None
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    return sdpa_flop_count, sdpa_backward_flop_count


def fsdp_unsharded_parameters(model: nn.Module) -> tuple[list[torch.Tensor], list[str]]:
    """FSDP2's unsharded parameter tensors of every `fully_shard`-ed module under `model` (none without FSDP2), and
    the names of the FSDP2 units whose state could not be read (the caller says so: those parameters would
    otherwise count as activations)."""
    f = features._found["fsdp_state"]
    if not f.ok:
        return [], []
    out: list[torch.Tensor] = []
    unreadable: list[str] = []
    for name, m in model.named_modules():
        if not isinstance(m, f.value):
            continue
        try:
            state = m._get_fsdp_state()
            # A unit with per-parameter meshes (expert parallel's experts) has several groups: newer torch lists them
            # in `_fsdp_param_groups`, and its singular `_fsdp_param_group` asserts there is only one.
            groups = getattr(state, "_fsdp_param_groups", None)
            if groups is None:
                groups = [state._fsdp_param_group]
        except (AttributeError, RuntimeError, AssertionError) as e:  # the private state changed shape
            unreadable.append(f"{name or 'the model'} ({type(e).__name__})")
            continue
        for p in (p for group in groups if group is not None for p in getattr(group, "fsdp_params", ())):
            for attr in ("_unsharded_param", "_unsharded_inner_tensors"):
                val = getattr(p, attr, None)
                for t in val if isinstance(val, (list, tuple)) else [val]:
                    if isinstance(t, torch.Tensor):
                        out.append(t)
            for t in getattr(p, "all_gather_outputs", None) or ():
                if isinstance(t, torch.Tensor):
                    out.append(t)
    return out, unreadable


def is_fsdp_module(m: nn.Module) -> bool:
    f = features._found["fsdp_state"]
    return f.ok and isinstance(m, f.value)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (its real storage); any other tensor as is."""
    local = getattr(t, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else t


# --- Dynamo's LRU switch -------------------------------------------------------------------------------------


def _lru_probe(x):
    return x + 1


@functools.lru_cache(maxsize=1)
def _lru_probe_fn() -> tuple[Callable, tuple[torch.Tensor, torch.Tensor]]:
    """The probe compiled (no backend work: its graph's own forward) and its two inputs, made once."""
    fn = torch.compile(_lru_probe, backend=lambda gm, example: gm.forward, dynamic=False)
    return fn, (torch.zeros(1), torch.zeros(2))


class LruWatch:
    """One running `patches.lru_cache_restored` block: the switch as the block knows it, and whether it set it."""

    def __init__(self, value: bool | None):
        self.value, self.changed = value, False


# The running `lru_cache_restored` blocks, innermost last (compared by identity); empty outside every block, when
# nothing of torch's is wrapped and the switch is read by experiment.
LRU_BLOCKS: list[LruWatch] = []


def lru_tracked() -> bool | None:
    """The LRU switch as the innermost running `lru_cache_restored` block knows it (None when it does not)."""
    return LRU_BLOCKS[-1].value if LRU_BLOCKS else None


def lru_cache_enabled() -> bool | None:
    """Dynamo's real LRU switch (torch has a setter, no getter), or None when it cannot be read.

    Read by experiment: a private function with two cache entries is called with each input in turn; with LRU on,
    the entry just hit moves to the front (two cache hits, ~0.1 ms). Compiling the probe's two entries costs ~0.1 s,
    again after each `torch._dynamo.reset()` (it forgets them); inside `patches.lru_cache_restored()` the switch as
    that block tracks it answers instead."""
    if not features._found["lru_cache"].ok:
        return None
    tracked = lru_tracked()
    if tracked is not None:
        return tracked
    entries = torch._C._dynamo.eval_frame._debug_get_cache_entry_list
    counted = counters_snapshot()  # compiling the probe must not show in anyone's graph counts
    try:
        fn, (a, b) = _lru_probe_fn()
        with torch.compiler.set_stance("default"), torch._dynamo.config.patch(recompile_limit=8):
            fn(a)
            fn(b)  # both compiled now (after a reset: again)
            fn(a)
            first_after_a = entries(_lru_probe.__code__)[0].code
            fn(b)
            first_after_b = entries(_lru_probe.__code__)[0].code
        return first_after_a is not first_after_b
    except Exception as e:  # noqa: BLE001 - the probe compiles, so any backend error can land here
        # Not silent: None is "cannot be read", which every caller treats as unknown (nothing set, nothing restored)
        # and `python -m toolkit env` shows with the reason.
        features._found["lru_cache"] = features._Found(False, f"the LRU probe failed: {type(e).__name__}: {e}")
        return None
    finally:
        counters_restore(counted)


def set_lru_cache(enabled: bool) -> None:
    if features._found["lru_cache"].ok:
        # Private, and missing from torch's eval_frame.pyi; the `lru_cache` probe found it.
        torch._C._dynamo.eval_frame._set_lru_cache(bool(enabled))  # type: ignore[attr-defined, unused-ignore]  # in the stub from 2.15


def lru_setter_target() -> tuple[Any, str]:
    """Where torch's LRU setter lives, for `patches.lru_cache_restored` to watch it for the length of a block."""
    return torch._C._dynamo.eval_frame, "_set_lru_cache"


def mark_static(t: torch.Tensor, dim: int) -> None:
    """`torch._dynamo.mark_static` while Dynamo traces (torchtitan main's SwiGLU keeps its hidden size static so
    each size gets its own graph); nothing in eager."""
    if torch.compiler.is_compiling():
        torch._dynamo.mark_static(t, dim)


# --- configs and flags ---------------------------------------------------------------------------------------


class CompilerConfigs(NamedTuple):
    """The config modules whose values the toolkit may patch."""

    dynamo: Any
    functorch: Any
    """AOTAutograd's (`torch._functorch.config`)."""
    inductor: Any


def activation_memory_budget() -> float:
    """AOTAutograd's `activation_memory_budget` in force now (1.0, the partitioner's default, where this torch has
    no such setting): what a user's own `config.patch` or the toolkit's memory-budget mode set alike."""
    import torch._functorch.config as functorch_config

    return float(getattr(functorch_config, "activation_memory_budget", 1.0))


def compiler_configs() -> CompilerConfigs:
    """Dynamo's, AOTAutograd's and Inductor's config modules (a tuple of the three, by name)."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    return CompilerConfigs(torch._dynamo.config, functorch_config, inductor_config)


def checkpoint_early_stop() -> Any:
    import torch.utils.checkpoint as ckpt

    return getattr(ckpt, "_enable_checkpoint_early_stop", None)


def set_checkpoint_early_stop(value: Any) -> None:
    import torch.utils.checkpoint as ckpt

    if hasattr(ckpt, "_enable_checkpoint_early_stop"):
        ckpt._enable_checkpoint_early_stop = value


def default_compute_intensive_ops() -> list[Any]:
    """The partitioner's compute-intensive op packets (torchtitan's SAC save list starts from them)."""
    from torch._functorch.partitioners import get_default_op_list

    return list(get_default_op_list().compute_intensive_ops)


def op_kind(obj: Any) -> str | None:
    """ "op" for an op overload (`torch.ops.aten.mm.default`) or a higher-order op (`inductor_compiled_code`): what a
    SAC policy's `func` can be; "packet" for an overload packet (`torch.ops.aten.mm`), which never equals a
    `func`; None for anything else."""
    import torch._ops as ops

    if isinstance(obj, ops.OpOverloadPacket):
        return "packet"
    if isinstance(obj, (ops.OpOverload, ops.HigherOrderOperator)):
        return "op"
    return None


def compile_signature_has(name: str) -> bool:
    return name in inspect.signature(torch.compile).parameters


def reset_dynamo() -> None:
    """Forget every compiled graph (`torch._dynamo.reset()`)."""
    torch._dynamo.reset()


def is_compiling() -> bool:
    return torch.compiler.is_compiling()


def optimized_module_class() -> type:
    from torch._dynamo.eval_frame import OptimizedModule

    return OptimizedModule


def in_place_compiled(m: nn.Module) -> bool:
    """`Module.compile()` was called on `m` (its `_compiled_call_impl` is set)."""
    return getattr(m, "_compiled_call_impl", None) is not None


def wrap_in_place_compiled_call(m: nn.Module, wrap: Callable[[Callable], Callable]) -> Callable[[], None]:
    """Wrap `m`'s in-place compiled call; returns the undo."""
    original = m._compiled_call_impl
    m._compiled_call_impl = wrap(cast(Callable, original))  # set: callers check `in_place_compiled(m)` first

    def undo() -> None:
        m._compiled_call_impl = original

    return undo


def clear_in_place_compile(m: nn.Module) -> None:
    m._compiled_call_impl = None


def forward_compiled(m: nn.Module) -> bool:
    """`m.forward` was replaced on the instance by `torch.compile(m.forward)` (a compiled function, torchtitan main's
    `@local_compile` way); the module's call and hooks stay eager."""
    f = m.__dict__.get("forward")
    return f is not None and getattr(f, "_torchdynamo_orig_callable", None) is not None


def checkpoint_wrapper_classes() -> tuple[type, type]:
    """`(ActivationWrapper, CheckpointWrapper)` from torch.distributed's checkpoint wrapper (a private module path)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import ActivationWrapper, CheckpointWrapper

    return ActivationWrapper, CheckpointWrapper


def checkpoint_wrapper(
    module: nn.Module, *, reentrant: bool = False, offload: bool = False, **kwargs: Any
) -> nn.Module:
    """torch.distributed's `checkpoint_wrapper` around `module`: non-reentrant, or reentrant (`use_reentrant=True`);
    `offload`: each checkpoint call inside `torch.autograd.graph.save_on_cpu`, as transformers' offload=True."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper as wrap

    impl = CheckpointImpl.REENTRANT if reentrant else CheckpointImpl.NO_REENTRANT
    if offload:
        kwargs = {"checkpoint_fn": _offloading_checkpoint, "use_reentrant": reentrant, **kwargs}
    return wrap(module, checkpoint_impl=impl, **kwargs)


def _offloading_checkpoint(function: Any, *args: Any, **kwargs: Any) -> Any:
    """`torch.utils.checkpoint.checkpoint` inside `save_on_cpu`, as transformers' `activation_checkpointing_enable(
    offload=True)` calls it on this machine: `pin_memory=True` with the default device type, which copies each saved
    tensor to the host (pinned where CUDA is available, a plain copy elsewhere)."""
    from torch.autograd.graph import save_on_cpu
    from torch.utils.checkpoint import checkpoint

    with save_on_cpu(pin_memory=True):
        return checkpoint(function, *args, **kwargs)


# --- checkpoint internals the probes observe (patched by them through `patches.patched`, never for good) --------


def checkpoint_hook_targets() -> tuple[tuple[Any, str, type], tuple[Any, str, type]] | None:
    """Where torch.utils.checkpoint keeps its forward and its recompute pack-hook classes, each as `(owner, name,
    torch's class)`, or None where this torch lacks them."""
    f = features._found["checkpoint_hooks"]
    if not f.ok:
        return None
    ckpt, forward_cls, recompute_cls = f.value
    return (ckpt, "_checkpoint_hook", forward_cls), (ckpt, "_recomputation_hook", recompute_cls)


def recompute_hook_class() -> type | None:
    """torch.utils.checkpoint's recompute hook class (its `pack_hook` detaches each recomputed tensor), or None."""
    f = features._found["checkpoint_recompute_hook"]
    return f.value if f.ok else None


# torch_remat's replay of a kept region during recompute (its saved inputs re-derived as views, its outputs
# loaded): remat's own work, not the model's forward. Optional, like torch_remat itself.
_REMAT_REPLAY = ("torch_remat._api", "_replay_save_op")


def remat_replay_target() -> tuple[Any, str] | None:
    """`(torch_remat._api, "_replay_save_op")` where torch_remat is usable and has it, else None."""
    if not available("torch_remat"):
        return None
    import importlib

    owner = importlib.import_module(_REMAT_REPLAY[0])
    return (owner, _REMAT_REPLAY[1]) if hasattr(owner, _REMAT_REPLAY[1]) else None


def disable_current_modes() -> contextlib.AbstractContextManager:
    """Out of sight of every dispatch mode (`torch.utils._python_dispatch._disable_current_modes`)."""
    from torch.utils._python_dispatch import _disable_current_modes

    return _disable_current_modes()


def storage_key(x: torch.Tensor | torch.UntypedStorage) -> int:
    """The identity of the memory a tensor (or a storage) lives in: one key for every view of one storage, the key
    a saved tensor, a held input and an allocation are matched by (torch's private `_cdata` pointer)."""
    return (x.untyped_storage() if isinstance(x, torch.Tensor) else x)._cdata


def storage_weak_ref(storage: Any) -> Any:
    """A weak reference to a storage that says when it is freed (`StorageWeakRef`)."""
    from torch.multiprocessing.reductions import StorageWeakRef

    return StorageWeakRef(storage)


def fake_tensor(fake_mode: Any, meta: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A FakeTensor of `fake_mode` over the meta tensor `meta`, reporting `device`."""
    from torch._subclasses.fake_tensor import FakeTensor

    return FakeTensor(fake_mode, meta, device)


# --- torch_remat (optional; not torch, but its introspection lives here with the rest) ------------------------


def remat() -> Any:
    """The torch_remat module, or None when it is not installed."""
    f = features._found["torch_remat"]
    return f.value if f.ok else None


def remat_saved_kind() -> str | None:
    """Inside a pack hook that torch_remat is running: why it packs the tensor ("checkpoint_input" for a region's
    input, "remat_save" for what a kept region saves or persists); None anywhere else."""
    mod = remat()
    if mod is None:
        return None
    try:
        kind = mod.current_saved_tensor_info().kind
    except RuntimeError:  # not called by torch_remat
        return None
    return "checkpoint_input" if kind.name == "CHECKPOINT_INPUT" else "remat_save"


def remat_recomputing() -> bool:
    """True while torch_remat replays a region in backward."""
    mod = remat()
    return bool(mod is not None and mod.is_recomputing())
