"""What this torch has: every private torch API the toolkit uses, feature-detected when first asked for.

Each feature names where it lives, what the toolkit sees through it, and what a Report cannot see without it. When a
torch release lacks one (or changed it beyond what the detection accepts), `missing()` lists it and the measurement
layer turns it into a Report `blind_spots` line — never a silent zero. Detection imports Dynamo and AOTAutograd,
which a command that measures nothing never loads, so each feature is detected on first look; `refresh()` detects
them all again (tests use it after removing an API on purpose).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from .._extras import EXTRAS

CHECKED_ON = ("2.13.0", "2.14.1", "2.15.0")
"""torch releases every feature here was checked on (CI runs the suite on the newest, what can differ on the rest)."""


@dataclass(frozen=True)
class Feature:
    """One private torch API the toolkit depends on."""

    name: str
    """Short key, e.g. "aot_partition"."""
    api: str
    """Where it lives, e.g. "torch._functorch._aot_autograd.graph_compile._partition_joint_graph_into_fw_bw"."""
    sees: str
    """What the toolkit sees through it."""
    without: str
    """What a Report cannot see when it is missing (the `blind_spots` line)."""
    available: bool = False
    detail: str = ""
    """Why it is missing, when it is."""


_SPECS: dict[str, tuple[str, str, str]] = {
    "aot_partition": (
        "torch._functorch._aot_autograd.graph_compile._partition_joint_graph_into_fw_bw",
        "which module and op made each tensor a compiled graph saves, and the forward ops its backward recomputes",
        "saved tensors of graphs compiled during the step are attributed to their compiled region only, and forward "
        "ops recomputed inside compiled backward graphs are not counted",
    ),
    "aot_saved_state": (
        "torch._functorch._aot_autograd.runtime_wrappers._AutogradSavedState.save_from_forward",
        "the real tensors each compiled graph saves for backward, and which compiled graphs ran",
        "tensors saved by compiled graphs are seen only through saved-tensor hooks (kind 'autograd', op 'unknown'), "
        "and which compiled graphs ran is unknown (graphs counted from compile events only)",
    ),
    "compiled_fw_graph": (
        "CompiledFunction.compiled_fw (the forward FX graph behind an AOTAutograd function)",
        "module attribution for graphs compiled before the step (a warm model)",
        "saved tensors of graphs compiled before the step are attributed to their compiled region only",
    ),
    "sac_mode": (
        "torch.utils.checkpoint._CachingTorchDispatchMode (its `storage` of cached outputs)",
        "the tensors a selective-checkpoint policy caches for backward",
        "tensors cached by selective checkpointing are counted as kind 'other' instead of 'sac_cache'",
    ),
    "checkpoint_generator": (
        "torch.utils.checkpoint._checkpoint_without_reentrant_generator(_impl)",
        "the inputs a non-reentrant checkpoint holds to re-run its function, and when that re-run happens",
        "inputs held by checkpoint regions are counted as kind 'other', and forward ops re-run by checkpoints whose "
        "modules have no toolkit hooks are not counted as recomputed",
    ),
    "reentrant_checkpoint": (
        "torch.utils.checkpoint.CheckpointFunction.forward(ctx, run_function, preserve_rng_state, *args)",
        "the inputs a reentrant checkpoint (use_reentrant=True, a transformers option) holds, and its re-run",
        "inputs held by reentrant checkpoints are counted as kind 'autograd', and the forward ops they re-run in "
        "backward are not counted as recomputed",
    ),
    "save_on_cpu": (
        "torch.autograd.graph.save_on_cpu (a saved_tensors_hooks whose `pack_hook` copies to the host)",
        "the host copies an offloading checkpoint keeps for backward (transformers' offload=True)",
        "tensors offloaded by save_on_cpu are counted as kind 'other' instead of 'offloaded'",
    ),
    "structured_trace": (
        "torch._logging._internal.trace_log (structured trace events)",
        "graph-break reasons with file:line, recompile reasons and compile times",
        "graph breaks are counted but their reasons and places, recompiles and compile times are not seen",
    ),
    "dynamo_counters": (
        "torch._dynamo.utils.counters",
        "graphs compiled and graph breaks taken during the step",
        "graphs compiled and graph breaks during the step are not counted",
    ),
    "lru_cache": (
        "torch._C._dynamo.eval_frame._set_lru_cache / _debug_get_cache_entry_list",
        "Dynamo's cache-entry LRU switch: read (by probing a private function's cache) and restored",
        "Dynamo's LRU switch cannot be read, so it is neither set for the step nor restored after it",
    ),
    "skip_code": (
        "torch._dynamo.eval_frame.skip_code",
        "keeping Dynamo from tracing the toolkit's own saved-tensor hooks",
        "the toolkit's own hooks may appear as graph breaks",
    ),
    "profiler_allocations": (
        "torch._C._profiler._EventType + kineto_results.experimental_event_tree()",
        "every CPU allocation and free of the memory step (the CPU peak)",
        "CPU peak memory is not measured",
    ),
    "cuda_snapshot": (
        "torch.cuda.memory._record_memory_history / _dump_snapshot",
        "CUDA allocator snapshots for PyTorch's memory viewer",
        "CUDA memory snapshots cannot be written",
    ),
    "fake_tensors": (
        "torch._subclasses.fake_tensor.FakeTensor / functional_tensor.FunctionalTensor",
        "telling real tensors from tracing-time tensors",
        "tracing-time tensors may be mistaken for real storages",
    ),
    "storage_weak_ptr": (
        "torch.UntypedStorage._new_with_weak_ptr",
        "each storage's size at the end of the forward (FSDP frees its all-gathered parameters by resizing to 0)",
        "storages are counted at their size when they were made, which over-counts storages freed by resizing",
    ),
    "fsdp_state": (
        "torch.distributed.fsdp FSDPModule._get_fsdp_state()._fsdp_param_group.fsdp_params",
        "FSDP2's unsharded parameter storages (counted as parameters, not activations)",
        "FSDP2's unsharded parameters are recognised only while registered on their modules",
    ),
    "torch_remat": (
        "torch_remat (PyPI torch-remat >= 0.2: checkpoint, region, current_saved_tensor_info) — not torch, optional",
        "ACConfig.of(mode='remat'), and which saved tensors a torch_remat region keeps (kind 'remat_save')",
        "ACConfig.of(mode='remat') and the torchtitan_main recipe are refused before anything runs (a ConfigError with "
        "toolkit._extras' install line); every other mode measures as usual",
    ),
    "fake_process_group": (
        "torch.testing._internal.distributed.fake_pg.FakeStore and the 'fake' process-group backend",
        "estimates at a world size above 1: FSDP2 shards over N ranks in one process, its collectives no-ops",
        "estimates are sized for one device only (world_size=1): a per-rank estimate is refused",
    ),
    "flop_registry": (
        "torch.utils.flop_counter.flop_registry (FlopCounterMode's per-op FLOP formulas)",
        "the FLOPs of each matmul, attention and convolution an estimate runs, and so each setup's recompute in FLOPs",
        "estimates count no FLOPs: a plan ranks setups by the forward ops they re-run",
    ),
    "storage_placeholder": (
        "torch._C._set_storage_data_ptr_access_error_msg (CUDA builds only)",
        "whether torch_remat can stand in a placeholder for a kept region's output that recompute does not need "
        "(on +cpu builds it cannot: AttributeError in backward, case C31)",
        "on this build torch_remat's placeholders cannot be made (C31): while a model with remat applied is measured, "
        "the toolkit stands in a NaN-filled buffer for a kept output nothing reads in replay (the Report says so in a "
        "note); saved bytes are unchanged",
    ),
    "inductor_on_fake": (
        "torch._inductor: AsyncCompile.cpp_pybinding / cpp, PyCodeCache.load_by_key_path (modules_no_attr) and the "
        "generated wrapper's empty_strided_cpu / reinterpret_tensor / assert_alignment",
        "estimates through inductor: its decompositions, joint-graph passes, partitioner, fusion and memory plan run "
        "for real on fake tensors, its C++ kernels are not built and its wrapper allocates fake buffers",
        "estimates with backend='inductor' are refused (its generated code cannot be run on fake tensors)",
    ),
    "respect_saved_tensors_hooks": (
        "torch.utils.checkpoint.checkpoint(respect_saved_tensors_hooks=...) (torch >= 2.14)",
        "keeping SAC-cached tensors out of the toolkit's own saved-tensor hooks without a FutureWarning",
        "nothing is lost: this torch's checkpoint has no such argument and SAC-cached tensors never reach the "
        "toolkit's saved-tensor hooks (torch 2.13 and older, before the rollout of C42)",
    ),
    "checkpoint_recompute_hook": (
        "torch.utils.checkpoint._recomputation_hook (its pack_hook, which detaches each recomputed tensor)",
        "the checkpoint's own work during recompute (a detach per recomputed tensor), counted apart from forward ops",
        "the checkpoint's own detaches during recompute are counted among the forward ops re-run",
    ),
    "checkpoint_hooks": (
        "torch.utils.checkpoint._checkpoint_hook(frame) / _recomputation_hook(frame_ref, gid) (their pack_hook)",
        "which op, module, shape, dtype and device made each tensor a checkpoint region saves, in the forward and in "
        "the recompute (what a CheckpointError explanation names)",
        "a CheckpointError is explained from its message alone (the position and metadata that diverged), not the "
        "op, module or likely cause",
    ),
    "op_schema": (
        "OpOverload._schema (arguments' alias_info.is_write)",
        "in-place writes to tensors that existed before the step (state a recompute reads changed: a side effect)",
        "in-place state changes inside checkpoint regions are not seen, so a CheckpointError's side-effect cause "
        "cannot be named",
    ),
    "checkpoint_policy_dict": (
        "torch.utils.checkpoint.checkpoint(policy={op or name: CheckpointPolicy}) and torch.utils.checkpoint.name "
        "(pytorch#186277)",
        "ACConfig.of(mode='policy_dict'): SAC from a dict of ops and tensor names",
        # Not a measurement: without the API the mode is refused before anything runs (a ConfigError naming the
        # release; the Explorer does not offer it), so no Report is ever missing a figure for it.
        "ACConfig.of(mode='policy_dict') is refused on this torch (no released torch has the API: 2.13.0, 2.14.1 and "
        "2.15.0 lack it); every other AC mode measures as usual",
    ),
}


@dataclass(frozen=True)
class _Found:
    ok: bool
    detail: str = ""
    value: Any = None


def _find_aot_partition() -> _Found:
    import torch._functorch._aot_autograd.graph_compile as gc

    fn = getattr(gc, "_partition_joint_graph_into_fw_bw", None)
    if fn is None:
        return _Found(False, "graph_compile has no _partition_joint_graph_into_fw_bw")
    if "fw_metadata" not in inspect.signature(fn).parameters:
        return _Found(False, "_partition_joint_graph_into_fw_bw takes no fw_metadata")
    return _Found(True, value=(gc, "_partition_joint_graph_into_fw_bw"))


def _find_aot_saved_state() -> _Found:
    import torch._functorch._aot_autograd.runtime_wrappers as rw

    cls = getattr(rw, "_AutogradSavedState", None)
    if cls is None or not callable(getattr(cls, "save_from_forward", None)):
        return _Found(False, "runtime_wrappers has no _AutogradSavedState.save_from_forward")
    return _Found(True, value=(cls, "save_from_forward"))


def _find_compiled_fw_graph() -> _Found:
    # Checked at use: the path from an autograd ctx to its forward graph (`type(ctx)._forward_cls.compiled_fw`).
    return _Found(hasattr(torch.autograd.function, "BackwardCFunction"), "no BackwardCFunction")


def _find_sac_mode() -> _Found:
    import torch.utils.checkpoint as ckpt

    cls = getattr(ckpt, "_CachingTorchDispatchMode", None)
    if cls is None:
        return _Found(False, "torch.utils.checkpoint has no _CachingTorchDispatchMode")
    if "storage" not in inspect.signature(cls.__init__).parameters:
        return _Found(False, "_CachingTorchDispatchMode.__init__ takes no storage")
    return _Found(True, value=cls)


def _find_checkpoint_generator() -> _Found:
    import torch.utils.checkpoint as ckpt

    # 2.14 calls the `_impl` form (fn, args, kwargs, *, ...); 2.13 the positional generator (fn, ..., *args, **kwargs).
    for name in ("_checkpoint_without_reentrant_generator_impl", "_checkpoint_without_reentrant_generator"):
        fn = getattr(ckpt, name, None)
        if fn is not None:
            params = inspect.signature(fn).parameters
            if "fn" in params:
                return _Found(True, value=(ckpt, name, inspect.signature(fn)))
    return _Found(False, "no _checkpoint_without_reentrant_generator(_impl) taking fn")


def _find_reentrant_checkpoint() -> _Found:
    import torch.utils.checkpoint as ckpt

    cls = getattr(ckpt, "CheckpointFunction", None)
    if cls is None:
        return _Found(False, "no torch.utils.checkpoint.CheckpointFunction")
    params = list(inspect.signature(cls.forward).parameters)
    if params[:3] != ["ctx", "run_function", "preserve_rng_state"]:
        return _Found(
            False, f"CheckpointFunction.forward takes {params}, not (ctx, run_function, preserve_rng_state, ...)"
        )
    return _Found(True, value=cls)


def _find_save_on_cpu() -> _Found:
    from torch.autograd.graph import save_on_cpu

    try:
        hooks = save_on_cpu()
    except Exception as e:  # noqa: BLE001 - any failure means the shape differs
        return _Found(False, f"save_on_cpu() raised {type(e).__name__}: {e}")
    if not callable(getattr(hooks, "pack_hook", None)):
        return _Found(False, "save_on_cpu has no pack_hook attribute")
    return _Found(True, value=save_on_cpu)


def _find_structured_trace() -> _Found:
    try:
        from torch._logging._internal import trace_log
    except ImportError as e:
        return _Found(False, str(e))
    return _Found(isinstance(trace_log, logging.Logger), "trace_log is not a Logger", trace_log)


def _find_dynamo_counters() -> _Found:
    try:
        from torch._dynamo.utils import counters
    except ImportError as e:
        return _Found(False, str(e))
    return _Found(True, value=counters)


def _find_lru_cache() -> _Found:
    ev = torch._C._dynamo.eval_frame
    missing = [n for n in ("_set_lru_cache", "_debug_get_cache_entry_list") if not hasattr(ev, n)]
    return _Found(not missing, f"torch._C._dynamo.eval_frame lacks {', '.join(missing)}")


def _find_skip_code() -> _Found:
    fn = getattr(torch._dynamo.eval_frame, "skip_code", None)
    return _Found(fn is not None, "torch._dynamo.eval_frame has no skip_code", fn)


def _find_profiler_allocations() -> _Found:
    try:
        from torch._C._profiler import _EventType
    except ImportError as e:
        return _Found(False, str(e))
    return _Found(hasattr(_EventType, "Allocation"), "_EventType has no Allocation", _EventType)


def _find_cuda_snapshot() -> _Found:
    mem = torch.cuda.memory
    ok = hasattr(mem, "_record_memory_history") and hasattr(mem, "_dump_snapshot")
    return _Found(ok, "torch.cuda.memory lacks _record_memory_history/_dump_snapshot")


def _find_fake_tensors() -> _Found:
    try:
        from torch._subclasses.fake_tensor import FakeTensor
        from torch._subclasses.functional_tensor import FunctionalTensor
    except ImportError as e:
        return _Found(False, str(e))
    return _Found(True, value=(FakeTensor, FunctionalTensor))


def _find_storage_weak_ptr() -> _Found:
    return _Found(hasattr(torch.UntypedStorage, "_new_with_weak_ptr"), "UntypedStorage has no _new_with_weak_ptr")


def _find_fsdp_state() -> _Found:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError as e:
        return _Found(False, str(e))
    return _Found(hasattr(FSDPModule, "_get_fsdp_state"), "FSDPModule has no _get_fsdp_state", FSDPModule)


_WRAPPER_HELPERS = ("empty_strided_cpu", "reinterpret_tensor", "assert_alignment")


def _find_inductor_on_fake() -> _Found:
    from torch._inductor import async_compile, codecache
    from torch._inductor.codegen import wrapper

    ac, cache = async_compile.AsyncCompile, codecache.PyCodeCache
    missing = [n for n in ("cpp_pybinding", "cpp") if not callable(getattr(ac, n, None))]
    if not isinstance(cache.__dict__.get("load_by_key_path"), classmethod):
        missing.append("PyCodeCache.load_by_key_path (a classmethod)")
    if not isinstance(getattr(cache, "modules_no_attr", None), dict) or not isinstance(
        getattr(cache, "modules", None), list
    ):
        missing.append("PyCodeCache.modules_no_attr / modules")
    header = inspect.getsource(wrapper.PythonWrapperCodegen.write_header)
    missing += [f"wrapper helper {n}" for n in _WRAPPER_HELPERS if f"{n} = torch._C._dynamo.guards." not in header]
    if missing:
        return _Found(False, f"torch._inductor lacks {', '.join(missing)}")
    return _Found(True, value=(ac, cache))


def _find_respect_saved_tensors_hooks() -> _Found:
    from torch.utils.checkpoint import checkpoint

    ok = "respect_saved_tensors_hooks" in inspect.signature(checkpoint).parameters
    return _Found(ok, f"torch {torch.__version__} checkpoint() has no respect_saved_tensors_hooks")


def _torch_original(cls: Any) -> Any:
    """torch's own class where the toolkit has put a subclass of it in its place for a while."""
    return getattr(cls, "_toolkit_original", cls)


def _find_checkpoint_recompute_hook() -> _Found:
    import torch.utils.checkpoint as ckpt

    # While `observed_checkpoint_hooks` is active the module holds its subclass: detect torch's own class.
    cls = _torch_original(getattr(ckpt, "_recomputation_hook", None))
    if cls is None:
        return _Found(False, "torch.utils.checkpoint has no _recomputation_hook")
    if "pack_hook" not in inspect.getsource(cls.__init__):
        return _Found(False, "_recomputation_hook.__init__ defines no pack_hook")
    return _Found(True, "", cls)


def _find_checkpoint_hooks() -> _Found:
    import torch.utils.checkpoint as ckpt

    fwd = _torch_original(getattr(ckpt, "_checkpoint_hook", None))
    rec = _torch_original(getattr(ckpt, "_recomputation_hook", None))
    base = torch.autograd.graph.saved_tensors_hooks
    for cls, params in ((fwd, ["self", "frame"]), (rec, ["self", "target_frame_ref", "gid"])):
        if not (isinstance(cls, type) and issubclass(cls, base)):
            return _Found(False, "torch.utils.checkpoint lacks _checkpoint_hook / _recomputation_hook")
        if list(inspect.signature(cls.__init__).parameters) != params:
            return _Found(False, f"{cls.__name__}.__init__ takes {list(inspect.signature(cls.__init__).parameters)}")
    return _Found(True, value=(ckpt, fwd, rec))


def _find_op_schema() -> _Found:
    arg = torch.ops.aten.add_.Tensor._schema.arguments[0]
    return _Found(bool(arg.alias_info is not None and arg.alias_info.is_write), "add_'s self is not marked written")


def _find_checkpoint_policy_dict() -> _Found:
    import torch.utils.checkpoint as ckpt

    ok = "policy" in inspect.signature(ckpt.checkpoint).parameters and callable(getattr(ckpt, "name", None))
    return _Found(ok, f"torch {torch.__version__} has no checkpoint(policy=...) / torch.utils.checkpoint.name")


def _find_torch_remat() -> _Found:
    import importlib

    remat = importlib.import_module("torch_remat")
    # The one rule for "torch_remat is usable": the API the toolkit calls, listed once with the extra (_extras).
    missing = [n for n in EXTRAS["torch_remat"].api if not hasattr(remat, n)]
    if missing:
        return _Found(False, f"torch_remat lacks {', '.join(missing)}")
    return _Found(True, value=remat)


def _find_fake_process_group() -> _Found:
    import torch.distributed as dist

    if not dist.is_available():
        return _Found(False, "this torch build has no torch.distributed")
    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except ImportError as e:
        return _Found(False, str(e))
    if "fake" not in getattr(dist.Backend, "backend_list", ()):
        return _Found(False, "no 'fake' process-group backend is registered")
    return _Found(True, value=FakeStore)


def _find_flop_registry() -> _Found:
    try:
        from torch.utils.flop_counter import flop_registry
    except ImportError as e:
        return _Found(False, str(e))
    ok = isinstance(flop_registry, dict) and torch.ops.aten.mm in flop_registry
    return _Found(ok, "torch.utils.flop_counter.flop_registry has no aten.mm", flop_registry)


def _find_storage_placeholder() -> _Found:
    ok = hasattr(torch._C, "_set_storage_data_ptr_access_error_msg")
    return _Found(ok, "" if ok else "this torch build has no storage placeholder helper (CPU-only builds lack it)")


_FINDERS: dict[str, Callable[[], _Found]] = {name: globals()[f"_find_{name}"] for name in _SPECS}


def _detect(name: str) -> _Found:
    try:
        return _FINDERS[name]()
    except Exception as e:  # a detection that itself breaks means the API changed
        return _Found(False, f"{type(e).__name__}: {e}")


class _Detected(dict):
    """name → what detecting that feature found, each detected when first asked for: several detections import
    Dynamo and AOTAutograd (seconds), which `import toolkit` and the commands that measure nothing never need."""

    def __missing__(self, name: str) -> _Found:
        if name not in _SPECS:
            raise KeyError(name)
        found = self[name] = _detect(name)
        return found


class _Features(Mapping):
    """`FEATURES`: name → Feature, read-only, detected on first look (listing them all detects them all)."""

    def __getitem__(self, name: str) -> Feature:
        if name not in _SPECS:
            raise KeyError(name)
        api, sees, without = _SPECS[name]
        found = _found[name]
        return Feature(name, api, sees, without, found.ok, "" if found.ok else found.detail)

    def __iter__(self) -> Iterator[str]:
        return iter(_SPECS)

    def __len__(self) -> int:
        return len(_SPECS)

    def __contains__(self, name: object) -> bool:
        return name in _SPECS


_found: dict[str, _Found] = _Detected()
FEATURES: Mapping[str, Feature] = _Features()


def refresh() -> Mapping[str, Feature]:
    """Detect every feature again, now (after an upgrade in place, or a test removing one on purpose)."""
    _found.clear()
    for name in _SPECS:
        _found[name] = _detect(name)
    return FEATURES


def available(name: str) -> bool:
    return _found[name].ok


# Features whose absence hides nothing from a Report: it refuses a mode before anything runs (torch_remat,
# checkpoint_policy_dict), is said in a Report note of its own (storage_placeholder), or loses nothing (2.13's
# checkpoint has no respect_saved_tensors_hooks to set). Their `without` says so in `table()`'s terms; they are
# never a Report's blind spot.
_NOT_BLIND = frozenset({"torch_remat", "checkpoint_policy_dict", "storage_placeholder", "respect_saved_tensors_hooks"})


def missing() -> tuple[Feature, ...]:
    """Features this torch lacks whose absence a Report must mention (its blind spots)."""
    return tuple(f for f in FEATURES.values() if not f.available and f.name not in _NOT_BLIND)


def blind_spot(name: str) -> str:
    """The sentence a Report shows when feature `name` is missing."""
    f = FEATURES[name]
    return f"{f.without} ({f.api} unavailable on torch {torch.__version__}: {f.detail})"


def table() -> str:
    """Every feature, available or not, as plain text (`python -m toolkit env`)."""
    lines = [f"torch {torch.__version__}; checked on {', '.join(CHECKED_ON)}"]
    for f in FEATURES.values():
        lines.append(
            f"  {'ok ' if f.available else 'MISSING'} {f.name:28} {f.sees}"
            + ("" if f.available else f" — without it: {f.without} ({f.detail})")
        )
    return "\n".join(lines)
