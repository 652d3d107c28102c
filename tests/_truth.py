"""An independent truth for saved bytes, computed without the toolkit: outer saved-tensor hooks + checkpoint inputs +
RNG stashes + SAC caches, parameters and buffers excluded, each storage at its size at the end of the forward."""

from __future__ import annotations

import contextlib
from collections import Counter

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
        self.rng: set[int] = set()
        """Storages of the RNG states stashed in the forward (host memory on a GPU; estimates leave them out)."""
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
            self.rng.add(out.untyped_storage()._cdata)
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

    def bytes(self, output=None, *, rng: bool = True) -> int:
        """Saved bytes; `rng=False` leaves out the stashed RNG states."""
        return sum(self.sizes(output, rng=rng))

    def sizes(self, output=None, *, rng: bool = True) -> list[int]:
        """The size of each saved storage, largest first."""
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
        if not rng:
            excluded |= self.rng
        sizes = [_size_now(ref) for key, ref in self.refs.items() if key not in excluded]
        return sorted((n for n in sizes if n), reverse=True)


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


class CountingBackend:
    """aot_eager with a count of the forward graphs it compiled: an independent graph count."""

    def __init__(self):
        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd
        from torch._functorch.partitioners import min_cut_rematerialization_partition

        self.graphs = 0

        def fw(gm, example_inputs):
            self.graphs += 1
            return make_boxed_func(gm.forward)

        self.backend = aot_autograd(
            fw_compiler=fw,
            bw_compiler=lambda gm, ex: make_boxed_func(gm.forward),
            partition_fn=min_cut_rematerialization_partition,
        )


RNG_EVENT = "truth::rng_state"


def cpu_peaks(step, *, main_thread_only: bool = False) -> tuple[int, int]:
    """`(raw, outliving)`: the high-water mark of one call of `step()` above its start, replayed from the profiler's
    CPU allocation events — every allocation (`raw`), and only those that outlive the aten op that made them
    (`outliving`: no kernel-internal workspace, such as a bf16 GEMM's packing buffers or the CPU flash-attention
    kernels' scratch, which a fake kernel never makes), leaving out RNG states (`torch.get_rng_state`) and Python
    numbers wrapped into 0-dim tensors too (host memory on a GPU). `main_thread_only`: leave out what other threads
    allocate (gloo's worker threads run the collectives on copies of their own; NCCL works in the buffers given)."""

    import gc

    from torch.profiler import ProfilerActivity, profile, record_function

    real_get_rng_state = torch.get_rng_state

    def get_rng_state(*a, **k):
        with record_function(RNG_EVENT):
            return real_get_rng_state(*a, **k)

    gc.collect()
    torch.get_rng_state = get_rng_state
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            step()
    finally:
        torch.get_rng_state = real_get_rng_state
    from torch._C._profiler import _EventType

    allocs = []  # (time, size, ptr, outermost aten op or None, under the RNG event)

    def walk(node, op, rng):
        if node.tag == _EventType.Allocation:
            f = node.extra_fields
            if f.device.type == "cpu":
                allocs.append((node.start_time_ns, f.alloc_size, f.ptr, op, rng, node.start_tid))
            return
        if op is None and node.name.startswith("aten::"):
            op = node
        rng = rng or node.name == RNG_EVENT
        for child in node.children:
            walk(child, op, rng)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root, None, False)
    allocs.sort(key=lambda a: a[0])
    freed_at, open_ = {}, {}
    for t, size, ptr, _op, _rng, _tid in allocs:
        if size > 0:
            open_[ptr] = t
        elif ptr in open_:
            freed_at[(ptr, open_.pop(ptr))] = t

    def replay(skip) -> int:
        live, total, peak = {}, 0, 0
        for t, size, ptr, op, rng, tid in allocs:
            if size > 0:
                if skip(t, size, ptr, op, rng, tid):
                    continue
                live[ptr] = size
                total += size
            elif ptr in live:
                total -= live.pop(ptr)
            peak = max(peak, total)
        return peak

    def inside_op_or_rng(t, size, ptr, op, rng, tid):
        freed = freed_at.get((ptr, t))
        # Outside any op, 8 bytes: a Python number operand (`order_N // top_k`, `scores * scale`) that torch's
        # binding wraps into a 0-dim int64 / float64 CPU tensor before the op; autograd may keep it for backward.
        # Host memory on a GPU, as the RNG states: the estimate, which counts device memory, leaves it out.
        wrapped_number = op is None and size == 8
        return rng or wrapped_number or (op is not None and freed is not None and freed <= op.end_time_ns)

    # The step's own thread: the one that made most of the allocations inside aten ops.
    main = Counter(a[5] for a in allocs if a[3] is not None).most_common(1)[0][0] if allocs else None

    def skipped(t, size, ptr, op, rng, tid):
        return inside_op_or_rng(t, size, ptr, op, rng, tid) or (main_thread_only and tid != main)

    return replay(lambda *a: False), replay(skipped)


@contextlib.contextmanager
def host_copies(truth: Truth, owner, name: str = "save_on_cpu"):
    """`owner.name` (where the code under test finds `torch.autograd.graph.save_on_cpu`) replaced by a subclass that
    adds each host copy its pack hook makes to `truth`: what an offloading checkpoint keeps for backward, which the
    outer hooks never see (save_on_cpu is the innermost saved-tensor hook)."""
    base = getattr(owner, name)

    class Recording(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            pack = self.pack_hook

            def record(t):
                packed = pack(t)
                truth._add(packed[1])
                return packed

            self.pack_hook = record

    setattr(owner, name, Recording)
    try:
        yield
    finally:
        setattr(owner, name, base)
