"""Every patch the toolkit makes to torch (or torch_remat) internals, each a context manager undone when it ends.

Nothing here outlives the `with` that made it: inductor without kernels (estimates), checkpoints run as plain calls
(the gradient reference), Dynamo's LRU switch watched and put back, torch_remat's placeholders stood in for (a +cpu
build's C31, and fake tensors). `patched` is the one primitive; the probes' own patches use it too.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch

from . import features
from .features import blind_spot
from .torch_api import (
    LRU_BLOCKS,
    LruWatch,
    checkpoint_generator_target,
    compiler_configs,
    disable_current_modes,
    fake_tensor,
    lru_setter_target,
    remat,
    storage_weak_ref,
)


@contextlib.contextmanager
def patched(owner: Any, name: str, new: Any) -> Iterator[Any]:
    """Replace `owner.name` by `new` for the duration; yields the original."""
    original = getattr(owner, name)
    setattr(owner, name, new)
    try:
        yield original
    finally:
        setattr(owner, name, original)


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
    f = features._found["inductor_on_fake"]
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


# --- Dynamo's LRU switch -------------------------------------------------------------------------------------


@contextlib.contextmanager
def lru_cache_restored(entry: bool | None) -> Iterator[None]:
    """For the block, torch's LRU setter is watched (how torchtitan and users call it, through its module): the
    switch as set inside is known without an experiment (`torch_api.lru_cache_enabled`), and at the end, if the
    block set it, it is put back to `entry` (the switch as read before the block; None: unknown, left as is). The
    setter is torch's own again when the block ends."""
    owner, name = lru_setter_target()
    if not features._found["lru_cache"].ok:
        yield
        return
    original = getattr(owner, name)
    watch = LruWatch(entry)

    def set_lru_cache(enabled: bool) -> None:
        original(enabled)
        watch.value, watch.changed = bool(enabled), True

    LRU_BLOCKS.append(watch)
    try:
        with patched(owner, name, set_lru_cache):
            yield
    finally:
        LRU_BLOCKS.remove(watch)
        if watch.changed and entry is not None and watch.value != entry:
            original(entry)  # through an enclosing block's watcher, if any: it sees the switch put back


# --- torch_remat's placeholders -------------------------------------------------------------------------------


# A kept region's output that nothing reads in replay comes back from torch_remat as a storage-free placeholder,
# poisoned with `torch._C._set_storage_data_ptr_access_error_msg` — which CPU-only torch builds lack (C31), so on them
# every remat block with a kept trailing add (torchtitan main's `ffn_residual`) fails in backward. While a step of a
# model with the toolkit's remat runs on such a build (`remat_placeholders()`, entered by `torch_settings`),
# torch_remat 0.2.2's placeholder functions are stood in for: the placeholder is a real, NaN-filled buffer (made in
# backward, freed right after; nothing the forward holds changes) that `is_placeholder` still recognises, so a wrong
# read shows up as NaN gradients instead of an error. Builds that have the helper are left alone.


class _StandIns:
    """The storages of the placeholders made while stand-ins are on (weakly: a freed storage's address can come back
    for another tensor), so that `is_placeholder` recognises them."""

    def __init__(self) -> None:
        self.storages: dict[int, Any] = {}

    def remember(self, t: torch.Tensor) -> None:
        for key in [k for k, r in self.storages.items() if r.expired()]:
            del self.storages[key]
        self.storages[t.untyped_storage()._cdata] = storage_weak_ref(t.untyped_storage())

    def is_placeholder(self, tensor: torch.Tensor) -> bool:
        try:
            ref = self.storages.get(tensor.untyped_storage()._cdata)
        except (RuntimeError, NotImplementedError):  # tensors without a storage (fake, functional) are no placeholder
            return False
        return ref is not None and not ref.expired()


def _remat_placeholder_targets(make: Callable | None, is_placeholder: Callable | None) -> list[tuple[Any, str, Any]]:
    """torch_remat (0.2.2)'s three placeholder functions, each paired with its stand-in: `make` for the maker and
    `is_placeholder` for both `_is_placeholder`s (the one in `_api` and the one `_view` imported)."""
    import importlib

    api, view = importlib.import_module("torch_remat._api"), importlib.import_module("torch_remat._view")
    return [
        (api, "_make_placeholder_tensor", make),
        (api, "_is_placeholder", is_placeholder),
        (view, "_is_placeholder", is_placeholder),
    ]


def _remat_placeholder_functions_found() -> bool:
    """torch_remat has the placeholder functions the stand-ins replace."""
    return all(hasattr(owner, name) for owner, name, _ in _remat_placeholder_targets(None, None))


def remat_placeholders_needed() -> bool:
    """This build cannot make torch_remat's placeholders (C31) and torch_remat's functions can be stood in for."""
    if remat() is None or features._found["storage_placeholder"].ok:
        return False
    return _remat_placeholder_functions_found()


@contextlib.contextmanager
def _placeholders(make: Callable, is_placeholder: Callable) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for owner, name, new in _remat_placeholder_targets(make, is_placeholder):
            stack.enter_context(patched(owner, name, new))
        yield


@contextlib.contextmanager
def remat_placeholders() -> Iterator[bool]:
    """For the block (a step: forward and backward), on a build that cannot make torch_remat's placeholders (C31),
    a kept region's output that nothing reads in replay is a real, NaN-filled buffer made in backward and freed
    right after (nothing the forward holds changes), which torch_remat's `is_placeholder` still recognises: a wrong
    read shows as NaN gradients instead of an AttributeError. Builds with the helper are left alone. Yields whether
    the stand-ins are on."""
    if not remat_placeholders_needed():
        yield False
        return
    made = _StandIns()

    def make(metadata: Any, message: str, *, requires_grad: bool = False) -> torch.Tensor:
        del message  # it can only be raised by the poisoned storage this build cannot make
        item = torch.empty((), dtype=metadata.dtype).element_size()
        fill = float("nan") if metadata.dtype.is_floating_point else 0
        # Out of sight of any dispatch mode (the probes' op counter among them): a real build makes no ops here.
        with disable_current_modes():
            base = torch.full(
                (max(1, -(-metadata.storage_nbytes // item)),), fill, dtype=metadata.dtype, device=metadata.device
            )
            placeholder = torch.empty(0, dtype=metadata.dtype, device=metadata.device)
            placeholder.set_(base.untyped_storage(), 0, torch.Size(metadata.shape), tuple(metadata.stride))
        made.remember(placeholder)
        if requires_grad:
            placeholder.requires_grad_(True)
        return placeholder

    with _placeholders(make, made.is_placeholder):
        yield True


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
    made = _StandIns()

    def make(metadata: Any, message: str, *, requires_grad: bool = False) -> torch.Tensor:
        del message  # nothing can read a fake tensor's data
        with disable_current_modes():
            # The storage the real output had (views of the placeholder may reach all of it), on meta: no memory.
            meta = torch.empty(0, dtype=metadata.dtype, device="meta")
            storage = torch.UntypedStorage(metadata.storage_nbytes, device="meta")
            meta.set_(storage, 0, torch.Size(metadata.shape), tuple(metadata.stride))
            placeholder = fake_tensor(fake_mode, meta, metadata.device)
        made.remember(placeholder)
        if requires_grad:
            placeholder.requires_grad_(True)
        return placeholder

    with _placeholders(make, made.is_placeholder):
        yield


@contextlib.contextmanager
def unmade_weak_refs_tolerated() -> Iterator[None]:
    """While Dynamo traces a frame that graph-breaks on fake tensors, it makes objects it models (here torch's own
    `StorageWeakRef`) without running their `__init__`, then drops them when the frame's trace is cleaned up: each
    one's `__del__` then prints "Exception ignored … has no attribute '_free_weak_ref'" (with a traceback) though
    nothing went wrong. For the duration, such an unmade one is let go quietly; a made one frees its weak reference
    as torch's own `__del__` does."""
    from torch.multiprocessing.reductions import StorageWeakRef

    own = StorageWeakRef.__del__

    def __del__(self):
        if hasattr(self, "_free_weak_ref"):
            own(self)

    with patched(StorageWeakRef, "__del__", __del__):
        yield
