"""An independent truth for saved bytes, computed without the toolkit: outer saved-tensor hooks + checkpoint inputs +
RNG stashes + SAC caches, parameters and buffers excluded, each storage at its size at the end of the forward."""

from __future__ import annotations

import contextlib

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._pytree import tree_leaves


def _size_now(ref: StorageWeakRef) -> int:
    if ref.expired():
        return 0
    return torch.UntypedStorage._new_with_weak_ptr(ref.cdata).nbytes()


class Truth:
    """`with Truth(model) as truth: out = model(x)` then `truth.bytes(out)` (call at the end of the forward).

    - storages packed by an outer `saved_tensors_hooks` (autograd's and compiled graphs' saves);
    - inputs of checkpoint regions: CheckpointWrapper forward pre-hooks, plus `held` for function-form checkpoints;
    - RNG states stashed by checkpoints (`torch.get_rng_state` called during the forward);
    - tensors cached by SAC policies (`sac_storages`: the caching modes' storage dicts, e.g. from
      `patch_sac_contexts`);
    minus parameters and buffers (a DTensor's local shard) and the step's output.
    """

    def __init__(self, model: torch.nn.Module, held=()):
        self.model = model
        self.refs: dict[int, StorageWeakRef] = {}
        self.sac_storages: list = []
        self.held = list(held)
        self._stack = contextlib.ExitStack()

    def _add(self, t) -> None:
        if isinstance(t, torch.Tensor) and not t.is_meta and not torch.compiler.is_compiling():
            try:
                st = t.untyped_storage()
                ref = StorageWeakRef(st)
            except (RuntimeError, NotImplementedError):  # tracing-time tensors (fake, functional) have no storage
                return
            self.refs.setdefault(st._cdata, ref)

    def __enter__(self) -> "Truth":
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

        def pack(t):
            self._add(t)
            return t

        real_get_rng_state = torch.get_rng_state

        def get_rng_state(*a, **k):
            out = real_get_rng_state(*a, **k)
            self._add(out)
            return out

        self._stack.enter_context(torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t))
        torch.get_rng_state = get_rng_state
        self._stack.callback(setattr, torch, "get_rng_state", real_get_rng_state)

        def hold_inputs(mod, args):
            for t in tree_leaves(args):
                self._add(t)  # returns None: the inputs reach the forward unchanged

        for m in self.model.modules():
            if isinstance(m, CheckpointWrapper):
                self._stack.callback(m.register_forward_pre_hook(hold_inputs).remove)
        for t in self.held:
            self._add(t)
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def params_bytes(self) -> int:
        """Parameter and buffer storages the forward saved for backward (at their size now)."""
        params = {}
        for p in [*self.model.parameters(), *self.model.buffers()]:
            p = p.to_local() if hasattr(p, "to_local") else p
            params[p.untyped_storage()._cdata] = p
        return sum(_size_now(ref) for key, ref in self.refs.items() if key in params)

    def bytes(self, output=None) -> int:
        for storage in self.sac_storages:
            for entries in storage.values():
                for entry in entries.values() if isinstance(entries, dict) else entries:
                    for leaf in tree_leaves(entry):
                        self._add(getattr(leaf, "val", None))
        excluded = set()
        for p in [*self.model.parameters(), *self.model.buffers()]:
            p = p.to_local() if hasattr(p, "to_local") else p
            excluded.add(p.untyped_storage()._cdata)
        for t in tree_leaves(output):
            if isinstance(t, torch.Tensor):
                excluded.add(t.untyped_storage()._cdata)
        return sum(_size_now(ref) for key, ref in self.refs.items() if key not in excluded)


@contextlib.contextmanager
def patch_sac_contexts(truth: Truth, *owners):
    """Wrap `create_selective_checkpoint_contexts` where `owners` (modules) call it, collecting each caching mode's
    storage into `truth.sac_storages`."""
    originals = []
    for owner in owners:
        original = owner.create_selective_checkpoint_contexts

        def wrapped(*a, _original=original, **k):
            fwd, rec = _original(*a, **k)
            if not torch.compiler.is_compiling():  # under compile the SAC "cache" is a tracing artifact
                truth.sac_storages.append(fwd.storage)
            return fwd, rec

        originals.append((owner, original))
        owner.create_selective_checkpoint_contexts = wrapped
    try:
        yield
    finally:
        for owner, original in originals:
            owner.create_selective_checkpoint_contexts = original
