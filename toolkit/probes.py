"""Probes that see what a training step holds for backward through eager AC, SAC caches and compiled graphs, without turning compile off.

How each thing is seen (methods measured in ../shared/research/feasibility.md §2):
- eager ops: a TorchDispatchMode that declares `ignore_compile_internals` (a plain mode silently disables
  compile, C9) records each output storage with the module running it (module hooks outside compiled regions);
  whatever is still alive at the end of the forward is held for backward;
- SAC caches: the storage dict of every selective-checkpoint caching mode created during the step;
- compiled graphs: AOTAutograd's partition (what each graph saves, with `nn_module_stack` and the forward ops
  its backward recomputes) and its runtime save call (the real tensors each invocation saves);
- graph breaks and recompiles: torch's structured trace (the events tlparse reads).
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .naming import canonical_name, is_wrapper, module_names

_VIEW_OPS = {"view", "_unsafe_view", "t", "transpose", "permute", "expand", "slice", "select", "unsqueeze",
             "squeeze", "alias", "reshape", "as_strided", "detach", "_reshape_alias", "unflatten", "split",
             "split_with_sizes", "chunk", "unbind", "narrow"}


_NOT_REAL: tuple[type, ...] | None = None


def _is_real(t: Any) -> bool:
    global _NOT_REAL
    if not isinstance(t, torch.Tensor):
        return False
    if _NOT_REAL is None:
        from torch._subclasses.fake_tensor import FakeTensor
        from torch._subclasses.functional_tensor import FunctionalTensor

        _NOT_REAL = (FakeTensor, FunctionalTensor)
    return not isinstance(t, _NOT_REAL) and not t.is_meta


def _tensors(out: Any) -> list:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)) and all(isinstance(x, torch.Tensor) or x is None for x in out):
        return [x for x in out if x is not None]
    return [x for x in tree_leaves(out) if isinstance(x, torch.Tensor)]


_op_names: dict[Any, str] = {}


def _op_name(func) -> str:
    name = _op_names.get(func)
    if name is None:
        name = _op_names[func] = str(func)
    return name


def _storage_key(t: torch.Tensor) -> tuple[int, StorageWeakRef, int]:
    st = t.untyped_storage()
    return st._cdata, StorageWeakRef(st), st.nbytes()


@dataclass
class Produced:
    ref: StorageWeakRef
    module: str
    op: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int


@dataclass
class GraphSaved:
    """One tensor a compiled graph saves for backward, as the partitioner decided."""

    module: str  # relative to the compiled frame's `self`
    op: str


@dataclass
class GraphRecord:
    region: str
    saved: list[GraphSaved]
    recompute_ops: Counter
    runs: int = 0


@dataclass
class ProbeResult:
    saved: list[dict] = field(default_factory=list)
    params_bytes: int = 0
    recompute_by_op: Counter = field(default_factory=Counter)
    recompute_by_module: Counter = field(default_factory=Counter)
    compiled_reruns: Counter = field(default_factory=Counter)
    in_compiled_backward: int = 0
    breaks: list[tuple[str, str, int]] = field(default_factory=list)
    recompiles: list[str] = field(default_factory=list)
    compile_s: float = 0.0
    regions: list[str] = field(default_factory=list)
    regions_without_graphs: list[str] = field(default_factory=list)


class _Tracker(TorchDispatchMode):
    # Without these two, Dynamo skips every frame run under the mode (compile silently off) and
    # inductor+AC's `run_and_save_rng_state` HOP raises.
    supports_higher_order_operators = True

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __init__(self, probes: "Probes"):
        super().__init__()
        self.p = probes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        p = self.p
        if p.phase == "forward":
            produced = p.produced
            module = None
            for t in _tensors(out):
                if not _is_real(t):
                    continue
                st = t.untyped_storage()
                key = st._cdata
                old = produced.get(key)
                if old is None or old.ref.expired():
                    if module is None:
                        module = p.current_module()
                    produced[key] = Produced(StorageWeakRef(st), module, _op_name(func), tuple(t.shape),
                                             str(t.dtype)[6:], st.nbytes())
        elif p.phase == "backward" and p.stack:
            p.recompute_by_op[_op_name(func)] += 1
            p.recompute_by_module[p.current_module()] += 1
        return out


class _TraceCapture(logging.Handler):
    """Collects torch's structured-trace events (graph-break reasons with user file:line, recompiles)."""

    def __init__(self, probes: "Probes"):
        super().__init__(logging.DEBUG)
        self.p = probes

    def emit(self, record: logging.LogRecord) -> None:
        md = getattr(record, "metadata", None)
        if not isinstance(md, dict):
            return
        if "artifact" in md and md["artifact"].get("name") == "dynamo_graph_break_reason":
            payload = getattr(record, "payload", "") or ""
            m = re.search(r"Graph break in user code at (.*):(\d+)", payload)
            reason = payload.split("Graph Break Reason:", 1)[-1].strip()
            # Keep the operator-level sentence, not the generic "Encountered graph break when ..." preamble.
            lines = [ln.strip() for ln in reason.splitlines() if ln.strip()]
            if lines and lines[0].startswith("Encountered graph break") and len(lines) > 1:
                lines = lines[1:]
            text = "\n".join(lines[:3])
            self.p.breaks.append((text, m.group(1) if m else "?", int(m.group(2)) if m else 0))
        elif "compilation_metrics" in md:
            cm = md["compilation_metrics"]
            if isinstance(cm, dict):
                if cm.get("recompile_reason"):
                    self.p.recompiles.append(str(cm["recompile_reason"]))
                t = cm.get("entire_frame_compile_time_s")
                if isinstance(t, (int, float)):
                    self.p.compile_s += float(t)
        elif "dynamo_output_graph" in md:
            self.p.region_graphs[self.p.current_region()] += 1


class Probes:
    """Install with `with probes.active(): ...`; set `phase` to "forward"/"backward"; read `collect()`."""

    def __init__(self, model: nn.Module, inputs: tuple = ()):
        self.model = model
        self.names = module_names(model)
        self.inputs = inputs
        self.stack: list[str] = []
        self.region_stack: list[str] = []
        self.phase = "idle"
        self.produced: dict[int, Produced] = {}
        self.sac_storages: list[dict] = []
        self.ckpt_inputs: set[int] = set()
        self.compiled_saved: dict[int, tuple[StorageWeakRef, str, str, str, tuple, str, int]] = {}
        self.packed: dict[int, tuple[StorageWeakRef, str, tuple, str, int]] = {}
        self.packed_keys: set[int] = set()
        self.records: dict[int, GraphRecord] = {}
        self.recompute_by_op: Counter = Counter()
        self.recompute_by_module: Counter = Counter()
        self.compiled_reruns: Counter = Counter()
        self.region_graphs: Counter = Counter()
        self.region_runs: Counter = Counter()
        self.region_compiled_runs: Counter = Counter()
        self.breaks: list[tuple[str, str, int]] = []
        self.recompiles: list[str] = []
        self.compile_s = 0.0
        self.saw_checkpoint = False

    # --- module bookkeeping ---------------------------------------------------------------------------

    def current_module(self) -> str:
        return self.stack[-1] if self.stack else ""

    def current_region(self) -> str:
        return self.region_stack[-1] if self.region_stack else ""

    def _push(self, name: str) -> None:
        # Heal a stale stack (a recompute stopped early skips post-hooks) by popping non-ancestors.
        while self.stack and not (name == self.stack[-1] or name.startswith(self.stack[-1] + ".") or self.stack[-1] == ""):
            self.stack.pop()
        self.stack.append(name)

    def _pop(self, name: str) -> None:
        while self.stack:
            if self.stack.pop() == name:
                break

    def _regions(self) -> dict[str, nn.Module]:
        from torch._dynamo.eval_frame import OptimizedModule

        regions = {}
        for m in self.model.modules():
            if isinstance(m, OptimizedModule) or getattr(m, "_compiled_call_impl", None) is not None:
                regions[self.names[id(m)]] = m
        return regions

    @contextlib.contextmanager
    def _module_hooks(self) -> Iterator[None]:
        from torch._dynamo.eval_frame import OptimizedModule
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

        regions = self._regions()
        self.region_names = sorted(regions)
        handles, restore = [], []

        def inside_region(name: str, m: nn.Module) -> bool:
            return any(r == "" or name == r or name.startswith(r + ".") for r in regions if regions[r] is not m)

        for m in self.model.modules():
            name = self.names[id(m)]
            if isinstance(m, OptimizedModule):
                if inside_region(name, m):
                    continue
                handles.append(m.register_forward_pre_hook(self._region_pre(name)))
                handles.append(m.register_forward_hook(self._region_post(name), always_call=True))
                continue
            if getattr(m, "_compiled_call_impl", None) is not None:
                if inside_region(name, m):
                    continue
                original = m._compiled_call_impl
                m._compiled_call_impl = self._region_call(name, original)
                restore.append((m, original))
                continue
            if inside_region(name, m) or (is_wrapper(m) and not isinstance(m, CheckpointWrapper)):
                continue
            if isinstance(m, CheckpointWrapper):
                handles.append(m.register_forward_pre_hook(lambda mod, args, _n=name: self._ckpt_pre(_n, args)))
                handles.append(m.register_forward_hook(lambda mod, args, out, _n=name: self._pop(_n), always_call=True))
                continue
            handles.append(m.register_forward_pre_hook(lambda mod, args, _n=name: self._push(_n)))
            handles.append(m.register_forward_hook(lambda mod, args, out, _n=name: self._pop(_n), always_call=True))
        try:
            yield
        finally:
            for h in handles:
                h.remove()
            for m, original in restore:
                m._compiled_call_impl = original

    def _region_enter(self, name: str) -> None:
        self._push(name)
        self.region_stack.append(name)
        self.region_runs[(name, self.phase)] += 1
        if self.phase == "backward":
            self.compiled_reruns[name] += 1

    def _region_exit(self, name: str) -> None:
        self._pop(name)
        if self.region_stack and self.region_stack[-1] == name:
            self.region_stack.pop()

    def _region_pre(self, name):
        return lambda mod, args: self._region_enter(name)

    def _region_post(self, name):
        return lambda mod, args, out: self._region_exit(name)

    def _region_call(self, name, fn):
        def call(*args, **kwargs):
            self._region_enter(name)
            try:
                return fn(*args, **kwargs)
            finally:
                self._region_exit(name)
        return call

    def _ckpt_pre(self, name, args):
        self._push(name)
        if self.phase == "forward":
            for t in tree_leaves(args):
                if _is_real(t):
                    self.ckpt_inputs.add(t.untyped_storage()._cdata)

    # --- torch internals we observe (each patch calls the original unchanged) --------------------------

    @contextlib.contextmanager
    def _patches(self) -> Iterator[None]:
        import torch._functorch._aot_autograd.graph_compile as graph_compile
        import torch._functorch._aot_autograd.runtime_wrappers as runtime_wrappers
        import torch.utils.checkpoint as ckpt
        from torch._logging._internal import trace_log

        probes = self
        orig_partition = graph_compile._partition_joint_graph_into_fw_bw
        orig_save = runtime_wrappers._AutogradSavedState.save_from_forward
        orig_sac_init = ckpt._CachingTorchDispatchMode.__init__

        def partition(*args, **kwargs):
            fw, bw, n = orig_partition(*args, **kwargs)
            meta = args[3] if len(args) > 3 else kwargs.get("fw_metadata")
            try:
                probes.records[id(meta)] = _graph_record(probes.current_region(), fw, bw, n)
            except Exception:  # attribution is best effort; never break the compile we observe
                pass
            return fw, bw, n

        def save_from_forward(state, ctx, fw_outs):
            try:
                probes._on_compiled_save(state, fw_outs)
            except Exception:
                pass
            return orig_save(state, ctx, fw_outs)

        def sac_init(mode, policy_fn, storage, *args, **kwargs):
            orig_sac_init(mode, policy_fn, storage, *args, **kwargs)
            if probes.phase == "forward":
                probes.sac_storages.append(storage)

        orig_get_rng_state = torch.get_rng_state

        def get_rng_state():
            # Checkpoint regions stash the RNG state to replay it in recompute; no dispatch mode sees it made.
            state = orig_get_rng_state()
            if probes.phase == "forward":
                key, ref, nbytes = _storage_key(state)
                probes.produced[key] = Produced(ref, probes.current_module(), "torch.get_rng_state", tuple(state.shape),
                                                str(state.dtype).replace("torch.", ""), nbytes)
                probes.ckpt_inputs.add(key)
            return state

        orig_ckpt_gen = ckpt._checkpoint_without_reentrant_generator

        def ckpt_gen(fn, preserve_rng_state=True, context_fn=ckpt.noop_context_fn, determinism_check="default",
                     debug=False, early_stop=True, *args, **kwargs):
            # Any checkpoint, the function form included: its inputs are held to re-run it, and the backward
            # must be watched for recompute.
            if probes.phase == "forward":
                probes.saw_checkpoint = True
                for t in tree_leaves((args, kwargs)):
                    if _is_real(t):
                        probes.ckpt_inputs.add(t.untyped_storage()._cdata)
            return (yield from orig_ckpt_gen(fn, preserve_rng_state, context_fn, determinism_check, debug, early_stop,
                                             *args, **kwargs))

        handler = _TraceCapture(self)
        old_level, old_propagate = trace_log.level, trace_log.propagate
        replaced = [(graph_compile, "_partition_joint_graph_into_fw_bw", partition),
                    (runtime_wrappers._AutogradSavedState, "save_from_forward", save_from_forward),
                    (ckpt._CachingTorchDispatchMode, "__init__", sac_init),
                    (ckpt, "_checkpoint_without_reentrant_generator", ckpt_gen),
                    (torch, "get_rng_state", get_rng_state)]
        originals = [(owner, name, getattr(owner, name)) for owner, name, _ in replaced]
        for owner, name, new in replaced:
            setattr(owner, name, new)
        trace_log.addHandler(handler)
        trace_log.setLevel(logging.DEBUG)
        trace_log.propagate = False
        try:
            # A warm AOTAutograd cache skips the partition we read; the graphs themselves are unchanged.
            with torch._functorch.config.patch(enable_autograd_cache=False):
                yield
        finally:
            for owner, name, original in originals:
                setattr(owner, name, original)
            trace_log.removeHandler(handler)
            trace_log.setLevel(old_level)
            trace_log.propagate = old_propagate

    def _on_compiled_save(self, state, fw_outs) -> None:
        meta = state.metadata
        region = self.current_region()
        if self.phase == "forward":
            self.region_compiled_runs[region] += 1
        rec = self.records.get(id(meta))
        if rec is not None:
            rec.runs += self.phase == "forward"
        if self.phase != "forward":
            return
        saved = list(fw_outs[meta.tensors_saved_for_backwards_with_vc_check_slice]) + \
            list(fw_outs[meta.tensors_saved_for_backwards_no_vc_check_slice])
        for i, t in enumerate(saved):
            if not _is_real(t):
                continue
            key, ref, nbytes = _storage_key(t)
            gs = rec.saved[i] if rec is not None and i < len(rec.saved) else None
            module = self._resolve(region, gs.module) if gs is not None else region
            op = gs.op if gs is not None else "compiled"
            self.compiled_saved.setdefault(key, (ref, module, op, str(t.dtype).replace("torch.", ""),
                                                 tuple(t.shape), region, nbytes))

    def _resolve(self, region: str, rel: str) -> str:
        # A resumed frame after a graph break (`torch_dynamo_resume_in_forward`) has a submodule as its `self`
        # (the MoE, not the compiled block): its module paths are relative to that, so find the one real name.
        name = _join(region, rel)
        if not rel:
            return name
        known = self.__dict__.setdefault("_known", set(self.names.values()))
        if name in known:
            return name
        under = [n for n in known if n.startswith(region + ".") and n.endswith("." + rel)] if region else \
            [n for n in known if n.endswith("." + rel)]
        return min(under, key=len) if under else name

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        # Plain Python hooks: AOTAutograd only inlines GraphModule hooks, so compiled graphs are unchanged.
        if self.phase == "forward":
            st = t.untyped_storage()
            key = st._cdata
            if key not in self.packed_keys:
                self.packed_keys.add(key)
                if key not in self.produced and _is_real(t):  # inputs and tensors made before the step
                    self.packed[key] = (StorageWeakRef(st), self.current_module(), tuple(t.shape), str(t.dtype)[6:],
                                        st.nbytes())
        return t

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Patches, hooks and saved-tensor hooks; the dispatch tracker runs only inside `phase_scope`."""
        with contextlib.ExitStack() as stack:
            stack.enter_context(self._patches())
            stack.enter_context(self._module_hooks())
            stack.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack, _identity))
            yield

    @contextlib.contextmanager
    def phase_scope(self, phase: str) -> Iterator[None]:
        """Run the forward or the backward under the probes. The tracker watches the backward only where
        something can be recomputed (a checkpoint region): elsewhere it would only cost time."""
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

        track = phase == "forward" or self.saw_checkpoint or any(isinstance(m, CheckpointWrapper)
                                                                 for m in self.model.modules())
        self.phase = phase
        try:
            if track:
                with _Tracker(self):
                    yield
            else:
                yield
        finally:
            self.phase = "idle"

    # --- results --------------------------------------------------------------------------------------

    def census(self, exclude: tuple = ()) -> tuple[list[dict], int]:
        """Storages held for backward right now (call at the end of the forward)."""
        param_keys = {}
        for t in list(self.model.parameters()) + list(self.model.buffers()):
            if _is_real(t):
                k, ref, nbytes = _storage_key(t)
                param_keys[k] = nbytes
        input_keys = {t.untyped_storage()._cdata for t in tree_leaves(self.inputs) if _is_real(t)}
        excluded = {t.untyped_storage()._cdata for t in tree_leaves(exclude) if _is_real(t)}
        sac_keys = set()
        for storage in self.sac_storages:
            for entries in list(storage.values()):
                for entry in list(entries.values()):
                    for leaf in tree_leaves(entry):
                        val = getattr(leaf, "val", None)
                        if _is_real(val):
                            sac_keys.add(val.untyped_storage()._cdata)
        out: dict[int, dict] = {}
        params_bytes = 0
        seen_params = set()
        for key, (ref, module, op, dtype, shape, region, nbytes) in self.compiled_saved.items():
            if ref.expired():
                continue
            if key in param_keys:
                if key not in seen_params:
                    seen_params.add(key)
                    params_bytes += nbytes
                continue
            prod = self.produced.get(key)
            if op in ("compiled", "input") and prod is not None:
                op, module = prod.op, prod.module  # a graph input: attribute it to whoever made it
            elif module == region and prod is not None and prod.module.startswith(region):
                module = prod.module
            # Inside an eager SAC region the compiled graph's own saves are swallowed by the checkpoint; what
            # stays alive is what the SAC policy cached from the ops the compiled code dispatched.
            kind = "sac_cache" if key in sac_keys else "compiled"
            out[key] = dict(module=module, op=op, shape=shape, dtype=dtype, bytes=nbytes, kind=kind)
        for key, prod in self.produced.items():
            if key in out or prod.ref.expired():
                continue
            if key in param_keys:
                if key not in seen_params:
                    seen_params.add(key)
                    params_bytes += param_keys[key]
                continue
            if key in excluded and key not in sac_keys and key not in self.packed_keys:
                continue  # the step's own output, held by the caller rather than for backward
            kind = ("sac_cache" if key in sac_keys else "checkpoint_input" if key in self.ckpt_inputs
                    else "autograd" if key in self.packed_keys else "other")
            out[key] = dict(module=prod.module, op=prod.op, shape=prod.shape, dtype=prod.dtype, bytes=prod.nbytes,
                            kind=kind)
        for key, (ref, module, shape, dtype, nbytes) in self.packed.items():
            # Saved tensors no probe saw being made: the step's inputs, or tensors made before the forward.
            if key in out or ref.expired() or key in param_keys:
                continue
            out[key] = dict(module=module, op="input" if key in input_keys else "unknown", shape=shape, dtype=dtype,
                            bytes=nbytes, kind="autograd")
        for key, entry in out.items():
            entry["is_input"] = key in input_keys
            entry["is_output"] = key in excluded
        rows = sorted(out.values(), key=lambda e: (e["module"], e["op"], -e["bytes"], e["shape"]))
        return rows, params_bytes

    def collect(self) -> ProbeResult:
        r = ProbeResult()
        r.recompute_by_op = Counter(self.recompute_by_op)
        r.recompute_by_module = Counter(self.recompute_by_module)
        r.compiled_reruns = Counter(self.compiled_reruns)
        r.in_compiled_backward = sum(sum(rec.recompute_ops.values()) * rec.runs for rec in self.records.values())
        r.breaks = list(self.breaks)
        r.recompiles = list(self.recompiles)
        r.compile_s = self.compile_s
        r.regions = list(getattr(self, "region_names", []))
        ran = {name for (name, phase) in self.region_runs if phase == "forward"}
        r.regions_without_graphs = sorted(n for n in ran if self.region_compiled_runs[n] == 0)
        return r


def _identity(t):
    return t


def _join(region: str, rel: str) -> str:
    return canonical_name(f"{region}.{rel}" if region and rel else region or rel)


def _rel_module(node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    path = re.sub(r"\._modules\[['\"]([^'\"]+)['\"]\]", r".\1", path)
    path = re.sub(r"^L\[['\"]self['\"]\]\.?", "", path)
    path = re.sub(r"^L\[['\"][^'\"]+['\"]\]\.?", "", path)
    path = re.sub(r"\[['\"]?([^'\"\]]+)['\"]?\]", r".\1", path)
    parts = [p for p in path.strip(".").split(".") if p not in ("__dict__", "_modules")]
    return canonical_name(".".join(parts))


def _base(node):
    import operator

    while node.op == "call_function" and node.args and isinstance(node.args[0], torch.fx.Node) and (
            node.target is operator.getitem or getattr(node.target, "__name__", "").split(".")[0] in _VIEW_OPS):
        node = node.args[0]
    return node


def _graph_record(region: str, fw, bw, n_fwd_outputs: int) -> GraphRecord:
    outs = fw.graph.output_node().args[0]
    saved = []
    for node in outs[n_fwd_outputs:]:
        if not isinstance(node, torch.fx.Node) or not isinstance(node.meta.get("val"), torch.Tensor):
            continue
        base = _base(node)
        if base.op == "placeholder":
            saved.append(GraphSaved("", "input"))
        else:
            saved.append(GraphSaved(_rel_module(base) or _rel_module(node), str(base.target)))
    recompute = Counter()
    for node in bw.graph.nodes:
        if node.op == "call_function" and node.meta.get("partitioner_tag") == "is_forward":
            recompute[str(node.target)] += 1
    return GraphRecord(region, saved, recompute)


# Autograd calls the saved-tensor hooks from inside frames Dynamo is running; it then tries to compile the hook's
# own frame, fails on `untyped_storage()` and reports a "graph break" in probes.py. Never trace our own hooks.
for _code in (Probes._pack.__code__, _identity.__code__):
    torch._dynamo.eval_frame.skip_code(_code)

__all__ = ["Probes", "ProbeResult"]
