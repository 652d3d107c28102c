"""How the probes see inside torch's checkpoint: its generator's calls, its pack hooks, its recompute's own work.

Instrumentation, built on what `compat` detects and undone with each `with`: the hooks themselves run unchanged,
an observer is told what they pack in the forward and in each recompute; the recompute machinery's own work (a
`detach` per recomputed tensor, torch_remat's replay of a kept region) is bracketed so that its ops are counted
apart from the forward ops a recompute re-runs; SAC regions under the probes' own saved-tensor hooks keep torch's
legacy behaviour explicitly (no FutureWarning, C42).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Any, Callable, Iterator

import torch

from ... import compat


class CheckpointCall:
    """One call of the checkpoint generator, whichever form this torch has: the checkpointed `fn`, its inputs,
    and the options; `call(original)` runs the generator with whatever was changed."""

    def __init__(self, sig: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]):
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
    def inputs(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        a = self.bound.arguments
        return tuple(a.get("args", ())), dict(a.get("kwargs", {}))

    def option(self, name: str, default: Any = None) -> Any:
        return self.bound.arguments.get(name, default)

    def has_option(self, name: str) -> bool:
        return name in self.bound.signature.parameters

    def set_option(self, name: str, value: Any) -> None:
        self.bound.arguments[name] = value

    def call(self, original: Callable[..., Any]) -> Any:
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


def _observing_pack(
    inner: Callable[..., Any], note: Callable[[torch.Tensor], None], done: Callable[[], None]
) -> Callable[..., Any]:
    """`inner` (a checkpoint's pack hook) with `note(x)` before and `done()` after; torch's own attributes on it
    (2.14's `_checkpoint_internal`) carried over, so torch still recognises the hook as a checkpoint's."""

    def pack_hook(x: torch.Tensor) -> Any:
        note(x)
        try:
            return inner(x)
        finally:
            done()

    pack_hook.__dict__.update(getattr(inner, "__dict__", {}))
    # Autograd calls pack hooks from inside compiled frames: Dynamo must neither trace this one nor what it calls
    # (torch disables Dynamo on the recompute's own hook for that reason). torch leaves `disable` unannotated.
    return torch.compiler.disable(pack_hook)  # type: ignore[no-untyped-call, no-any-return]


@contextlib.contextmanager
def observed_checkpoint_hooks(observer: CheckpointObserver) -> Iterator[bool]:
    """While active, every non-reentrant checkpoint's saved-tensor hooks tell `observer` what they pack, forward and
    recompute; the hooks themselves run unchanged. Yields False (observing nothing) where this torch lacks them."""
    targets = compat.checkpoint_hook_targets()
    if targets is None:
        yield False
        return
    (fwd_owner, fwd_name, forward_cls), (rec_owner, rec_name, recompute_cls) = targets

    # The classes found at run time are the bases: mypy cannot check a subclass of a value.
    class _ForwardHook(forward_cls):  # type: ignore[valid-type, misc]
        def __init__(self, frame: Any) -> None:
            super().__init__(frame)
            self._toolkit_frame = frame
            observer.frame(frame)
            self.pack_hook: Callable[..., Any] = _observing_pack(
                self.pack_hook, lambda x: observer.forward_pack(frame, x), observer.pack_done
            )

        def __enter__(self) -> Any:
            observer.forward_enter(self._toolkit_frame)
            return super().__enter__()

        def __exit__(self, *exc: Any) -> Any:
            try:
                return super().__exit__(*exc)
            finally:
                observer.forward_exit(self._toolkit_frame)

    class _RecomputeHook(recompute_cls):  # type: ignore[valid-type, misc]
        def __init__(self, target_frame_ref: Callable[[], Any], gid: Any) -> None:
            super().__init__(target_frame_ref, gid)
            self._toolkit_ref, self._toolkit_gid = target_frame_ref, gid
            self.pack_hook: Callable[..., Any] = _observing_pack(
                self.pack_hook, lambda x: observer.recompute_pack(target_frame_ref(), gid, x), observer.pack_done
            )

        def __enter__(self) -> Any:
            observer.recompute_enter(self._toolkit_ref(), self._toolkit_gid)
            return super().__enter__()

        def __exit__(self, *exc: Any) -> Any:
            try:
                return super().__exit__(*exc)
            finally:
                observer.recompute_exit(self._toolkit_ref(), self._toolkit_gid)

    _ForwardHook._toolkit_original, _RecomputeHook._toolkit_original = forward_cls, recompute_cls
    for cls in (_ForwardHook, _RecomputeHook):
        for method in ("__init__", "__enter__", "__exit__"):
            compat.skip_code(getattr(cls, method).__code__)
    with compat.patched(fwd_owner, fwd_name, _ForwardHook), compat.patched(rec_owner, rec_name, _RecomputeHook):
        yield True


def top_saved_tensors_hooks_are(pack: Callable[..., Any]) -> bool:
    """The innermost saved-tensor hooks a SAC cache would route through (torch >= 2.14) are `pack`'s."""
    hooks = compat.current_saved_tensors_hooks()
    if hooks is None:
        return False
    hook = inspect.unwrap(hooks[0])  # the probes install their pack hook wrapped in torch.compiler.disable
    return getattr(hook, "__func__", hook) is pack


def keep_sac_legacy_under(call: CheckpointCall, pack: Callable[..., Any]) -> None:
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
def sac_bypasses_hooks_of(pack: Callable[..., Any]) -> Iterator[None]:
    """While active, SAC regions under `pack`'s saved-tensor hooks keep the legacy behaviour explicitly."""
    target = compat.checkpoint_generator_target()
    if target is None or not compat.available("respect_saved_tensors_hooks"):
        yield
        return
    owner, name, sig = target
    original = getattr(owner, name)

    def generator(*args: Any, **kwargs: Any) -> Any:
        call = CheckpointCall(sig, args, kwargs)
        keep_sac_legacy_under(call, pack)
        return (yield from call.call(original))

    with compat.patched(owner, name, generator):
        yield


@contextlib.contextmanager
def recompute_bookkeeping(enter: Callable[[], None], leave: Callable[[], None]) -> Iterator[None]:
    """While active, `enter()` / `leave()` bracket the recompute machinery's own work, so that ops it dispatches can
    be told from the forward ops a recompute re-runs: the pack hook of torch.utils.checkpoint's recompute (a
    `detach` of each recomputed tensor) and torch_remat's replay of a kept region (its saved inputs re-derived as
    views, its outputs loaded). Both patches call the originals unchanged."""

    def bracket(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def inside(*args: Any, **kwargs: Any) -> Any:
            enter()
            try:
                return fn(*args, **kwargs)
            finally:
                leave()

        return inside

    compat.skip_code(
        bracket(lambda: None).__code__
    )  # Dynamo must not trace the bracket (backward may call it under a frame)
    with contextlib.ExitStack() as stack:
        cls: type[Any] | None = compat.recompute_hook_class()
        if cls is not None:
            original_init = cls.__init__

            @functools.wraps(original_init)  # its signature stays the original's: `checkpoint_hooks` detects by it
            def init(self: Any, *args: Any, **kwargs: Any) -> None:
                original_init(self, *args, **kwargs)
                self.pack_hook = bracket(self.pack_hook)

            stack.enter_context(compat.patched(cls, "__init__", init))
        replay = compat.remat_replay_target()
        if replay is not None:
            owner, name = replay
            stack.enter_context(compat.patched(owner, name, bracket(getattr(owner, name))))
        yield
