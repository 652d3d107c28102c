"""Every private torch API the toolkit touches, in one place, feature-detected at import.

Every private torch API the toolkit touches, in one place: feature-detected when first needed (detection imports Dynamo
and AOTAutograd, which a command that measures nothing never loads), with the releases it was checked on.

Nothing else in the toolkit reaches into `torch._*`, `torch.utils.checkpoint._*` or AOTAutograd internals. Each
feature below names what the toolkit sees through it; when a torch release lacks one (or changed it beyond what
the detection accepts), `missing()` lists it and the measurement layer turns it into a Report `blind_spots` line
saying what the Report cannot see — never a silent zero. `refresh()` re-runs detection (tests use it after
removing an API on purpose).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Iterator, NamedTuple

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode  # the probes' dispatch tracker base
from torch.utils._pytree import tree_leaves  # a private module, used across the toolkit

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
        "ACConfig(mode='remat'), and which saved tensors a torch_remat region keeps (kind 'remat_save')",
        "ACConfig(mode='remat') and the torchtitan_main recipe are refused before anything runs (a ConfigError with "
        "toolkit._extras' install line); every other mode measures as usual",
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
        "ACConfig(mode='policy_dict'): SAC from a dict of ops and tensor names",
        # Not a measurement: without the API the mode is refused before anything runs (a ConfigError naming the
        # release; the Explorer does not offer it), so no Report is ever missing a figure for it.
        "ACConfig(mode='policy_dict') is refused on this torch (no released torch has the API: 2.13.0, 2.14.1 and "
        "2.15.0 lack it); every other AC mode measures as usual",
    ),
}

# torch_remat's replay of a kept region during recompute (its saved inputs re-derived as views, its outputs
# loaded): remat's own work, not the model's forward. Optional, like torch_remat itself.
_REMAT_REPLAY = ("torch_remat._api", "_replay_save_op")


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
    missing = [
        n
        for n in (
            "checkpoint",
            "region",
            "recompute_needs_tensor",
            "current_saved_tensor_info",
            "SavedTensorKind",
            "RecomputeStateHook",
        )
        if not hasattr(remat, n)
    ]
    if missing:
        return _Found(False, f"torch_remat lacks {', '.join(missing)}")
    return _Found(True, value=remat)


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


# --- accessors used by the layers above ----------------------------------------------------------------------


@contextlib.contextmanager
def patched(owner: Any, name: str, new: Any) -> Iterator[Any]:
    """Replace `owner.name` by `new` for the duration; yields the original."""
    original = getattr(owner, name)
    setattr(owner, name, new)
    try:
        yield original
    finally:
        setattr(owner, name, original)


def aot_partition_target() -> tuple[Any, str] | None:
    f = _found["aot_partition"]
    return f.value if f.ok else None


def aot_saved_state_target() -> tuple[Any, str] | None:
    f = _found["aot_saved_state"]
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
    if not _found["compiled_fw_graph"].ok:
        return None
    fn = getattr(getattr(type(ctx), "_forward_cls", None), "compiled_fw", None)
    return _find_graph_module(fn, depth=0, seen=set())


def compiled_function_of(ctx: Any) -> Any:
    """The AOTAutograd function class behind a forward's ctx."""
    return getattr(type(ctx), "_forward_cls", None)


def backward_graph_of(function_cls: Any) -> torch.fx.GraphModule | None:
    """The backward FX graph of an AOTAutograd function, where the backend kept one and it has been compiled
    (backward compiles lazily: read it after the backward ran)."""
    if not _found["compiled_fw_graph"].ok or function_cls is None:
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
    f = _found["sac_mode"]
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
    f = _found["checkpoint_generator"]
    return f.value if f.ok else None


class CheckpointCall:
    """One call of the checkpoint generator, whichever form this torch has: the checkpointed `fn`, its inputs,
    and the options; `call(original)` runs the generator with whatever was changed."""

    def __init__(self, sig: inspect.Signature, args: tuple, kwargs: dict):
        # 2.14 `_impl(fn, args, kwargs, *, ...)` takes an explicit tuple/dict, 2.13 `(fn, ..., *args, **kwargs)`:
        # both bind to arguments named fn / args / kwargs. Defaults applied, so `.args` never stops early.
        self.bound = sig.bind(*args, **kwargs)
        self.bound.apply_defaults()

    @property
    def fn(self) -> Any:
        return self.bound.arguments["fn"]

    @fn.setter
    def fn(self, value: Any) -> None:
        self.bound.arguments["fn"] = value

    @property
    def inputs(self) -> tuple[tuple, dict]:
        a = self.bound.arguments
        return tuple(a.get("args", ())), dict(a.get("kwargs", {}))

    def option(self, name: str, default: Any = None) -> Any:
        return self.bound.arguments.get(name, default)

    def has_option(self, name: str) -> bool:
        return name in self.bound.signature.parameters

    def set_option(self, name: str, value: Any) -> None:
        self.bound.arguments[name] = value

    def call(self, original: Callable) -> Any:
        return original(*self.bound.args, **self.bound.kwargs)


class CheckpointObserver:
    """What `observed_checkpoint_hooks` tells: a region's frame made, entered and left in the forward, each tensor it
    packs, then each recompute (a frame and its graph-task id) entered, packing and left; `pack_done` after each
    pack (the hook's own ops, a recompute's `detach`, run in between). The default does nothing."""

    def frame(self, frame: Any) -> None: ...
    def forward_enter(self, frame: Any) -> None: ...
    def forward_exit(self, frame: Any) -> None: ...
    def forward_pack(self, frame: Any, x: torch.Tensor) -> None: ...
    def recompute_enter(self, frame: Any, gid: Any) -> None: ...
    def recompute_exit(self, frame: Any, gid: Any) -> None: ...
    def recompute_pack(self, frame: Any, gid: Any, x: torch.Tensor) -> None: ...
    def pack_done(self) -> None: ...


def _observing_pack(inner: Callable, note: Callable[[torch.Tensor], None], done: Callable[[], None]) -> Callable:
    """`inner` (a checkpoint's pack hook) with `note(x)` before and `done()` after; torch's own attributes on it
    (2.14's `_checkpoint_internal`) carried over, so torch still recognises the hook as a checkpoint's."""

    def pack_hook(x):
        note(x)
        try:
            return inner(x)
        finally:
            done()

    pack_hook.__dict__.update(getattr(inner, "__dict__", {}))
    # Autograd calls pack hooks from inside compiled frames: Dynamo must neither trace this one nor what it calls
    # (torch disables Dynamo on the recompute's own hook for that reason).
    return torch.compiler.disable(pack_hook)


@contextlib.contextmanager
def observed_checkpoint_hooks(observer: CheckpointObserver) -> Iterator[bool]:
    """While active, every non-reentrant checkpoint's saved-tensor hooks tell `observer` what they pack, forward and
    recompute; the hooks themselves run unchanged. Yields False (observing nothing) where this torch lacks them."""
    f = _found["checkpoint_hooks"]
    if not f.ok:
        yield False
        return
    ckpt, forward_cls, recompute_cls = f.value

    class _ForwardHook(forward_cls):
        def __init__(self, frame):
            super().__init__(frame)
            self._toolkit_frame = frame
            observer.frame(frame)
            self.pack_hook = _observing_pack(
                self.pack_hook, lambda x: observer.forward_pack(frame, x), observer.pack_done
            )

        def __enter__(self):
            observer.forward_enter(self._toolkit_frame)
            return super().__enter__()

        def __exit__(self, *exc):
            try:
                return super().__exit__(*exc)
            finally:
                observer.forward_exit(self._toolkit_frame)

    class _RecomputeHook(recompute_cls):
        def __init__(self, target_frame_ref, gid):
            super().__init__(target_frame_ref, gid)
            self._toolkit_ref, self._toolkit_gid = target_frame_ref, gid
            self.pack_hook = _observing_pack(
                self.pack_hook, lambda x: observer.recompute_pack(target_frame_ref(), gid, x), observer.pack_done
            )

        def __enter__(self):
            observer.recompute_enter(self._toolkit_ref(), self._toolkit_gid)
            return super().__enter__()

        def __exit__(self, *exc):
            try:
                return super().__exit__(*exc)
            finally:
                observer.recompute_exit(self._toolkit_ref(), self._toolkit_gid)

    _ForwardHook._toolkit_original, _RecomputeHook._toolkit_original = forward_cls, recompute_cls
    for cls in (_ForwardHook, _RecomputeHook):
        for method in ("__init__", "__enter__", "__exit__"):
            skip_code(getattr(cls, method).__code__)
    with patched(ckpt, "_checkpoint_hook", _ForwardHook), patched(ckpt, "_recomputation_hook", _RecomputeHook):
        yield True


def draws_random(func: Any, args: tuple, kwargs: dict) -> bool:
    """Does this call draw from torch's global RNG? Ops tagged `nondeterministic_seeded`, unless given a generator
    of their own or a dropout probability of 0 (SDPA and dropout kernels carry the tag for their dropout)."""
    if torch.Tag.nondeterministic_seeded not in (getattr(func, "tags", ()) or ()):
        return False
    if kwargs.get("generator") is not None:
        return False
    schema = getattr(func, "_schema", None) if _found["op_schema"].ok else None
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
        schema = getattr(func, "_schema", None) if _found["op_schema"].ok else None
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


def top_saved_tensors_hooks_are(pack: Callable) -> bool:
    """The innermost saved-tensor hooks a SAC cache would route through (torch >= 2.14) are `pack`'s."""
    hooks = current_saved_tensors_hooks()
    if hooks is None:
        return False
    hook = inspect.unwrap(hooks[0])  # the probes install their pack hook wrapped in torch.compiler.disable
    return getattr(hook, "__func__", hook) is pack


def keep_sac_legacy_under(call: CheckpointCall, pack: Callable) -> None:
    """A SAC region under the toolkit's own saved-tensor hooks (`pack`) keeps torch's legacy behaviour — SAC's
    cache bypasses them — by passing `respect_saved_tensors_hooks=False` explicitly where the caller left None:
    the same behaviour as None, without 2.14's FutureWarning about our hooks (C42)."""
    if (
        call.has_option("respect_saved_tensors_hooks")
        and call.option("respect_saved_tensors_hooks") is None
        and top_saved_tensors_hooks_are(pack)
    ):
        call.set_option("respect_saved_tensors_hooks", False)


@contextlib.contextmanager
def sac_bypasses_hooks_of(pack: Callable) -> Iterator[None]:
    """While active, SAC regions under `pack`'s saved-tensor hooks keep the legacy behaviour explicitly."""
    target = checkpoint_generator_target()
    if target is None or not _found["respect_saved_tensors_hooks"].ok:
        yield
        return
    owner, name, sig = target
    original = getattr(owner, name)

    def generator(*args: Any, **kwargs: Any) -> Any:
        call = CheckpointCall(sig, args, kwargs)
        keep_sac_legacy_under(call, pack)
        return (yield from call.call(original))

    with patched(owner, name, generator):
        yield


@contextlib.contextmanager
def non_reentrant_checkpoints_disabled() -> Iterator[bool]:
    """Every non-reentrant checkpoint runs its function as a plain call (autograd saves everything, nothing is
    recomputed), for a reference run; yields False when this torch's checkpoint cannot be reached."""
    target = checkpoint_generator_target()
    if target is None:
        yield False
        return
    owner, name, _sig = target

    def passthrough(*args: Any, **kwargs: Any) -> Iterator[None]:
        yield

    with patched(owner, name, passthrough):
        yield True


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
    f = _found["structured_trace"]
    return f.value if f.ok else None


def dynamo_counters() -> Any | None:
    f = _found["dynamo_counters"]
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


_to_skip: list[Any] = []


def dynamo_disabled(fn: Callable) -> Callable:
    """`fn` run with Dynamo off, for it and everything it calls (`torch.compiler.disable`): for the probes' hooks that
    autograd calls from inside frames Dynamo is running."""
    return torch.compiler.disable(fn)


def skip_code(code: Any) -> None:
    """Keep Dynamo from tracing `code`, from the next `apply_skips()` on (the probes call it as they start):
    registering imports Dynamo, which importing a module that declares its hooks must not."""
    _to_skip.append(code)


def apply_skips() -> None:
    """Register every code object `skip_code` was given so far."""
    if not _to_skip:
        return
    f = _found["skip_code"]
    while _to_skip:
        code = _to_skip.pop()
        if f.ok:
            f.value(code)


def profiler_event_type() -> Any | None:
    f = _found["profiler_allocations"]
    return f.value if f.ok else None


def not_real_tensor_types() -> tuple[type, ...]:
    f = _found["fake_tensors"]
    return f.value if f.ok else ()


def cuda_memory_history(enabled: bool) -> None:
    """Start (max 100000 entries) or stop recording CUDA allocator history for a snapshot."""
    if enabled:
        torch.cuda.memory._record_memory_history(max_entries=100000)
    else:
        torch.cuda.memory._record_memory_history(enabled=None)


def cuda_dump_snapshot(path: str) -> None:
    torch.cuda.memory._dump_snapshot(path)


class _KernelStub:
    """Stands in for one generated C++ kernel: called with the buffers it would read and write, does nothing."""

    def __init__(self, source_code: str):
        self.source_code = source_code

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None


def _fake_wrapper_helpers(namespace: dict[str, Any]) -> None:
    """The wrapper's allocation helpers call the CPU allocator directly (past the dispatcher): make them dispatch,
    so that under FakeTensorMode they make fake buffers of the same size, stride and dtype."""
    namespace["empty_strided_cpu"] = lambda size, stride, dtype: torch.empty_strided(
        size, stride, dtype=dtype, device="cpu"
    )
    namespace["reinterpret_tensor"] = lambda base, size, stride, offset: base.as_strided(
        size, stride, base.storage_offset() + offset
    )
    namespace["assert_alignment"] = lambda *args, **kwargs: None  # a fake buffer has no address


@contextlib.contextmanager
def inductor_on_fake_tensors() -> Iterator[None]:
    """While active, inductor compiles as always (decompositions, joint-graph passes, partitioner, lowering, fusion,
    memory planning, wrapper code) but builds no kernel: each C++ kernel is a no-op, and the generated wrapper
    (loaded fresh, never cached in or out of `PyCodeCache`) allocates its buffers through the dispatcher. Run on
    fake tensors, a compiled step then allocates and frees exactly the buffers the real one would, with no memory.
    Graph caches are off for the duration (a cached graph would skip the partition the estimate reads)."""
    f = _found["inductor_on_fake"]
    if not f.ok:
        raise RuntimeError(blind_spot("inductor_on_fake"))
    async_compile, cache = f.value
    descriptor = cache.__dict__["load_by_key_path"]
    original = descriptor.__func__

    def load_by_key_path(cls, key, path, linemap=None, attrs=None, *, set_sys_modules=None):
        kept = cls.modules_no_attr, cls.modules
        cls.modules_no_attr, cls.modules = {}, []  # neither reuse a real module nor leave ours for a real run
        try:
            mod = original(cls, key, path, linemap, attrs, set_sys_modules=False)
        finally:
            cls.modules_no_attr, cls.modules = kept
        if "empty_strided_cpu" in mod.__dict__:  # a graph's wrapper (kernels and other modules have none)
            _fake_wrapper_helpers(mod.__dict__)
        return mod

    configs = compiler_configs()
    with contextlib.ExitStack() as stack:
        stack.enter_context(configs.inductor.patch(fx_graph_cache=False, compile_threads=1))
        stack.enter_context(configs.functorch.patch(enable_autograd_cache=False))
        stack.enter_context(patched(async_compile, "cpp_pybinding", lambda self, argtypes, source: _KernelStub(source)))
        stack.enter_context(patched(async_compile, "cpp", lambda self, source: _KernelStub(source)))
        cache.load_by_key_path = classmethod(load_by_key_path)
        stack.callback(setattr, cache, "load_by_key_path", descriptor)
        yield


def dynamo_has_config(name: str) -> bool:
    return hasattr(torch._dynamo.config, name)


def fake_tensor_mode_class() -> type:
    """FakeTensorMode (estimates run a step on fake tensors)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode


def storage_nbytes_now(weak_cdata: int) -> int | None:
    """The current size of the storage behind a weak reference (None when it is gone or unreadable)."""
    if not _found["storage_weak_ptr"].ok:
        return None
    st = torch.UntypedStorage._new_with_weak_ptr(weak_cdata)
    return None if st is None else st.nbytes()


def fsdp_unsharded_parameters(model: nn.Module) -> tuple[list[torch.Tensor], list[str]]:
    """FSDP2's unsharded parameter tensors of every `fully_shard`-ed module under `model` (none without FSDP2), and
    the names of the FSDP2 units whose state could not be read (the caller says so: those parameters would
    otherwise count as activations)."""
    f = _found["fsdp_state"]
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
    f = _found["fsdp_state"]
    return f.ok and isinstance(m, f.value)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (its real storage); any other tensor as is."""
    local = getattr(t, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else t


# --- Dynamo's LRU switch -------------------------------------------------------------------------------------

_lru_probe_fn = None
_lru_inputs: tuple[torch.Tensor, torch.Tensor] | None = None
_lru_tracked: bool | None = None
"""The switch as last set through `torch._C._dynamo.eval_frame._set_lru_cache` (tracked once read)."""


def _lru_probe(x):
    return x + 1


def _tracking_setter(original: Callable[[bool], None]) -> Callable[[bool], None]:
    def set_lru_cache(enabled: bool) -> None:
        global _lru_tracked
        original(enabled)
        _lru_tracked = bool(enabled)

    set_lru_cache.__wrapped__ = original  # type: ignore[attr-defined]
    return set_lru_cache


def mark_static(t: torch.Tensor, dim: int) -> None:
    """`torch._dynamo.mark_static` while Dynamo traces (torchtitan main's SwiGLU keeps its hidden size static so
    each size gets its own graph); nothing in eager."""
    if torch.compiler.is_compiling():
        torch._dynamo.mark_static(t, dim)


def lru_cache_enabled() -> bool | None:
    """Dynamo's real LRU switch (torch has a setter, no getter), or None when it cannot be read.

    Read by experiment: a private function with two cache entries is called with each input in turn; with LRU on,
    the entry just hit moves to the front (two cache hits, ~0.1 ms). The first read compiles the probe (~0.2 s)
    and from then on every call of `_set_lru_cache` through its module (how torchtitan and users call it) is
    tracked, so after `torch._dynamo.reset()` drops the probe's entries the tracked value answers instead of
    compiling again."""
    global _lru_probe_fn, _lru_inputs, _lru_tracked
    if not _found["lru_cache"].ok:
        return None
    ev = torch._C._dynamo.eval_frame
    entries = ev._debug_get_cache_entry_list
    if _lru_tracked is not None and len(entries(_lru_probe.__code__)) < 2:
        return _lru_tracked
    counted = counters_snapshot()  # compiling the probe must not show in anyone's graph counts
    try:
        if _lru_probe_fn is None:
            _lru_probe_fn = torch.compile(_lru_probe, backend=lambda gm, example: gm.forward, dynamic=False)
            _lru_inputs = (torch.zeros(1), torch.zeros(2))
        a, b = _lru_inputs
        with torch.compiler.set_stance("default"), torch._dynamo.config.patch(recompile_limit=8):
            _lru_probe_fn(a)
            _lru_probe_fn(b)  # both compiled now (the first time only)
            _lru_probe_fn(a)
            first_after_a = entries(_lru_probe.__code__)[0].code
            _lru_probe_fn(b)
            first_after_b = entries(_lru_probe.__code__)[0].code
        _lru_tracked = first_after_a is not first_after_b
        if not hasattr(ev._set_lru_cache, "__wrapped__"):
            ev._set_lru_cache = _tracking_setter(ev._set_lru_cache)
        return _lru_tracked
    except Exception:
        # The probe compiles, so any backend error can land here. What is returned is not stale: either None (never
        # read: unknown) or the value the wrapped setter has tracked through every change since the last read.
        return _lru_tracked
    finally:
        counters_restore(counted)


def set_lru_cache(enabled: bool) -> None:
    if _found["lru_cache"].ok:
        torch._C._dynamo.eval_frame._set_lru_cache(bool(enabled))


# --- configs and flags ---------------------------------------------------------------------------------------


class CompilerConfigs(NamedTuple):
    """The config modules whose values the toolkit may patch."""

    dynamo: Any
    functorch: Any
    """AOTAutograd's (`torch._functorch.config`)."""
    inductor: Any


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
    m._compiled_call_impl = wrap(original)

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


def checkpoint_wrapper(module: nn.Module, **kwargs: Any) -> nn.Module:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper as wrap

    return wrap(module, **kwargs)


__all__ = [
    "CHECKED_ON",
    "Feature",
    "FEATURES",
    "refresh",
    "available",
    "missing",
    "blind_spot",
    "table",
    "tree_leaves",
    "TorchDispatchMode",
]


# --- torch_remat (optional; not torch, but its introspection lives here with the rest) ------------------------


def remat() -> Any:
    """The torch_remat module, or None when it is not installed."""
    f = _found["torch_remat"]
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


# A kept region's output that nothing reads in replay comes back from torch_remat as a storage-free placeholder,
# poisoned with `torch._C._set_storage_data_ptr_access_error_msg` — which CPU-only torch builds lack (C31), so
# on them every remat block with a kept trailing add (torchtitan main's `ffn_residual`) fails in backward. While
# the toolkit's remat mode is applied on such a build, torch_remat 0.2.2's two placeholder functions are stood in
# for: the placeholder is a real, NaN-filled buffer (made in backward, freed right after; nothing the forward
# holds changes) that `is_placeholder` still recognises, so a wrong read shows up as NaN gradients instead of an
# error. Builds that have the helper are left alone.
_placeholder_users = 0
_placeholder_patches: contextlib.ExitStack | None = None  # torch_remat's functions, set back on close
_placeholder_storages: dict[int, Any] = {}


def _stand_in_make_placeholder(metadata: Any, message: str, *, requires_grad: bool = False) -> torch.Tensor:
    from torch.multiprocessing.reductions import StorageWeakRef

    del message  # it can only be raised by the poisoned storage this build cannot make
    for key in [k for k, r in _placeholder_storages.items() if r.expired()]:
        del _placeholder_storages[key]  # a freed storage's address can come back for another tensor
    from torch.utils._python_dispatch import _disable_current_modes

    item = torch.empty((), dtype=metadata.dtype).element_size()
    fill = float("nan") if metadata.dtype.is_floating_point else 0
    # Out of sight of any dispatch mode (the probes' op counter among them): a real build makes no ops here.
    with _disable_current_modes():
        base = torch.full(
            (max(1, -(-metadata.storage_nbytes // item)),), fill, dtype=metadata.dtype, device=metadata.device
        )
        placeholder = torch.empty(0, dtype=metadata.dtype, device=metadata.device)
        placeholder.set_(base.untyped_storage(), 0, torch.Size(metadata.shape), tuple(metadata.stride))
    _placeholder_storages[placeholder.untyped_storage()._cdata] = StorageWeakRef(placeholder.untyped_storage())
    if requires_grad:
        placeholder.requires_grad_(True)
    return placeholder


def _stand_in_is_placeholder(tensor: torch.Tensor) -> bool:
    try:
        ref = _placeholder_storages.get(tensor.untyped_storage()._cdata)
    except (RuntimeError, NotImplementedError):  # tensors without a storage (fake, functional) are no placeholder
        return False
    return ref is not None and not ref.expired()


def remat_placeholders_needed() -> bool:
    """This build cannot make torch_remat's placeholders (C31) and torch_remat's functions can be stood in for."""
    mod = remat()
    if mod is None or _found["storage_placeholder"].ok:
        return False
    return _remat_placeholder_functions_found()


def _remat_placeholder_targets(make: Callable) -> list[tuple[Any, str, Any]]:
    """torch_remat (0.2.2)'s three placeholder functions, each paired with its stand-in: `make` for the maker and
    the stand-in storage check for both `_is_placeholder`s (the one in `_api` and the one `_view` imported)."""
    import importlib

    api, view = importlib.import_module("torch_remat._api"), importlib.import_module("torch_remat._view")
    return [
        (api, "_make_placeholder_tensor", make),
        (api, "_is_placeholder", _stand_in_is_placeholder),
        (view, "_is_placeholder", _stand_in_is_placeholder),
    ]


def _remat_placeholder_functions_found() -> bool:
    """torch_remat has the placeholder functions the stand-ins replace."""
    return all(hasattr(owner, name) for owner, name, _ in _remat_placeholder_targets(_stand_in_make_placeholder))


def _patch_placeholder_functions(make: Callable) -> contextlib.ExitStack:
    """torch_remat's placeholder functions replaced by `make` and the stand-in check until the stack is closed
    (LIFO, so a stand-in entered over another is undone first)."""
    stack = contextlib.ExitStack()
    for owner, name, new in _remat_placeholder_targets(make):
        stack.enter_context(patched(owner, name, new))
    return stack


def remat_placeholders_acquire() -> None:
    """Stand in for torch_remat's placeholders on a build that cannot make them (counted: the first user installs,
    the last `release` restores torch_remat's own functions)."""
    global _placeholder_users, _placeholder_patches
    _placeholder_users += 1
    if _placeholder_users > 1 or not remat_placeholders_needed():
        return
    _placeholder_patches = _patch_placeholder_functions(_stand_in_make_placeholder)


def remat_placeholders_release() -> None:
    global _placeholder_users, _placeholder_patches
    _placeholder_users = max(0, _placeholder_users - 1)
    if _placeholder_users == 0:
        if _placeholder_patches is not None:
            _placeholder_patches.close()
            _placeholder_patches = None
        _placeholder_storages.clear()


@contextlib.contextmanager
def remat_placeholders_on_fake(fake_mode: Any) -> Iterator[None]:
    """While an estimate runs on fake tensors under `fake_mode`: the placeholder torch_remat makes in backward for a
    kept region's output that nothing reads is a fake tensor of its shape and strides, made out of sight of every
    dispatch mode (a real placeholder allocates nothing) and recognised by its storage (a fake storage cannot be
    poisoned). torch_remat's own placeholder sets a real null CPU storage into a fake tensor, which torch 2.14's
    fake tensors refuse ("Attempted to set the storage of a tensor on device "meta" to a storage on different
    device"); the CPU-build stand-in above would allocate the output for real. Without torch_remat: nothing."""
    if remat() is None or not _remat_placeholder_functions_found():
        yield
        return
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import _disable_current_modes

    made: list[int] = []

    def make(metadata: Any, message: str, *, requires_grad: bool = False) -> torch.Tensor:
        del message  # nothing can read a fake tensor's data
        with _disable_current_modes():
            # The storage the real output had (views of the placeholder may reach all of it), on meta: no memory.
            meta = torch.empty(0, dtype=metadata.dtype, device="meta")
            storage = torch.UntypedStorage(metadata.storage_nbytes, device="meta")
            meta.set_(storage, 0, torch.Size(metadata.shape), tuple(metadata.stride))
            placeholder = FakeTensor(fake_mode, meta, metadata.device)
        key = placeholder.untyped_storage()._cdata
        _placeholder_storages[key] = StorageWeakRef(placeholder.untyped_storage())
        made.append(key)
        if requires_grad:
            placeholder.requires_grad_(True)
        return placeholder

    try:
        with _patch_placeholder_functions(make):
            yield
    finally:
        for key in made:
            _placeholder_storages.pop(key, None)


@contextlib.contextmanager
def remat_placeholders() -> Iterator[None]:
    """`remat_placeholders_acquire` for the duration of a block (a hand-written remat model's step)."""
    remat_placeholders_acquire()
    try:
        yield
    finally:
        remat_placeholders_release()


def remat_placeholders_active() -> bool:
    return _placeholder_patches is not None


@contextlib.contextmanager
def recompute_bookkeeping(enter: Callable[[], None], leave: Callable[[], None]) -> Iterator[None]:
    """While active, `enter()` / `leave()` bracket the recompute machinery's own work, so that ops it dispatches can
    be told from the forward ops a recompute re-runs: the pack hook of torch.utils.checkpoint's recompute (a
    `detach` of each recomputed tensor) and torch_remat's replay of a kept region (its saved inputs re-derived as
    views, its outputs loaded). Both patches call the originals unchanged."""

    def bracket(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def inside(*args: Any, **kwargs: Any) -> Any:
            enter()
            try:
                return fn(*args, **kwargs)
            finally:
                leave()

        return inside

    skip_code(bracket(lambda: None).__code__)  # Dynamo must not trace the bracket (backward may call it under a frame)
    with contextlib.ExitStack() as stack:
        f = _found["checkpoint_recompute_hook"]
        if f.ok:
            cls = f.value
            original_init = cls.__init__

            @functools.wraps(original_init)  # its signature stays the original's: `checkpoint_hooks` detects by it
            def init(self: Any, *args: Any, **kwargs: Any) -> None:
                original_init(self, *args, **kwargs)
                self.pack_hook = bracket(self.pack_hook)

            stack.enter_context(patched(cls, "__init__", init))
        if available("torch_remat"):
            import importlib

            api = importlib.import_module(_REMAT_REPLAY[0])
            if hasattr(api, _REMAT_REPLAY[1]):
                stack.enter_context(patched(api, _REMAT_REPLAY[1], bracket(getattr(api, _REMAT_REPLAY[1]))))
        yield
