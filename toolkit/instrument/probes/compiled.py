"""Compiled graphs: what each partition saves (module, op) and recomputes, and what each run saves.

Compiled graphs: what AOTAutograd's partition decided each graph saves (module, op) and recomputes, and the real tensors
each run saves.
"""

from __future__ import annotations

import contextlib
import inspect
import operator
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence, cast

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from ... import compat
from ...transforms.naming import canonical_name, inside
from ..flops import flops
from .base import StepState, dtype_name, is_real

_VIEW_OPS = {
    "view",
    "_unsafe_view",
    "t",
    "transpose",
    "permute",
    "expand",
    "slice",
    "select",
    "unsqueeze",
    "squeeze",
    "alias",
    "reshape",
    "as_strided",
    "detach",
    "_reshape_alias",
    "unflatten",
    "split",
    "split_with_sizes",
    "chunk",
    "unbind",
    "narrow",
}


@dataclass(frozen=True)
class GraphSaved:
    """One tensor a compiled graph saves for backward, as the partitioner decided."""

    module: str
    """Relative to the compiled frame's `self` ("" = the frame itself, or a graph input)."""
    op: str


@dataclass
class GraphRecord:
    region: str
    saved: list[GraphSaved]
    recompute_ops: Counter[str]
    """Forward ops the partitioner placed in the backward graph (recomputed there), per run."""
    recompute_known: bool = True
    recompute_flops: int = 0
    """FLOPs of those recomputed forward ops, per run."""
    forward_flops: int | None = None
    """FLOPs of the forward graph, per run (None: the graph could not be read)."""
    runs: int = 0
    warm: bool | None = False
    """Compiled before the step (None: unknown, the partition was not watched)."""
    function_cls: Any = None
    """The AOTAutograd function, to read its kept backward graph once the backward ran."""
    draws: bool | None = None
    """Its forward graph draws random numbers (dropout, `rand`): an eager reference draws them otherwise. None when
    its forward graph could not be read (a warm inductor graph)."""
    checkpointed: tuple[str, ...] = ()
    """Modules (relative, as `GraphSaved.module`) with forward ops a checkpoint inside the graph tagged: Dynamo's
    `tag_activation_checkpoint` gives each op it traced an `ac_graph_id`, which the partitioner keeps."""
    random_recomputed: tuple[str, ...] = ()
    """Random ops (dropout, `rand`) the partitioner placed in the backward graph: drawn again there, with new numbers
    unless their RNG state is replayed (`rngprims` ops, which this leaves out)."""
    known_graph: bool = True
    """Its forward graph was read (partition or kept graph): `checkpointed` is what it holds, not a guess."""


@dataclass
class CompiledSave:
    ref: StorageWeakRef
    module: str
    op: str
    dtype: str
    shape: tuple[int, ...]
    region: str
    nbytes: int


@dataclass
class CompiledGraphs:
    state: StepState
    known_modules: set[str]
    records: dict[int, GraphRecord] = field(default_factory=dict)
    saves: dict[int, CompiledSave] = field(default_factory=dict)
    graphs_run: set[int] = field(default_factory=set)
    region_compiled_runs: Counter[str] = field(default_factory=Counter)
    unattributed: int = 0
    """Graphs with neither a seen partition nor a kept forward graph (warm inductor): saves attributed to the region."""
    blind: set[str] = field(default_factory=set)
    failures: list[str] = field(default_factory=list)
    """What this step's probes could not read, one sentence each (a Report's blind spots: never a silent zero)."""

    @contextlib.contextmanager
    def patches(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            # Backends that keep their FX graphs (eager, aot_eager) are read directly when a graph runs; the
            # partition is watched for the others (inductor keeps only generated code).
            target = compat.aot_partition_target()
            if target is not None:
                owner, name = target
                original = getattr(owner, name)
                sig = inspect.signature(original)
                stack.enter_context(compat.patched(owner, name, self._partition_wrapper(original, sig)))
            target = compat.aot_saved_state_target()
            if target is not None:
                owner, name = target
                stack.enter_context(compat.patched(owner, name, self._save_wrapper(getattr(owner, name))))
            else:
                self.blind.add("aot_saved_state")
            yield

    def _partition_wrapper(self, original: Callable[..., Any], sig: inspect.Signature) -> Callable[..., Any]:
        graphs = self

        def partition(*args: Any, **kwargs: Any) -> Any:
            fw, bw, n = original(*args, **kwargs)
            try:
                meta = sig.bind(*args, **kwargs).arguments["fw_metadata"]
                graphs.records[id(meta)] = _graph_record(graphs.state.region(), fw, bw, n)
            except (KeyError, TypeError, AttributeError, IndexError) as e:  # never break the compile we observe
                graphs.failures.append(
                    f"which module and op each tensor a compiled graph saves comes from, and which forward ops its "
                    f"backward recomputes (its partition could not be read: {type(e).__name__}: {e})"
                )
            return fw, bw, n

        return partition

    def _save_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        graphs = self

        def save_from_forward(saved_state: Any, ctx: Any, fw_outs: Any) -> Any:
            try:
                graphs.on_save(saved_state, ctx, fw_outs)
            except (KeyError, TypeError, AttributeError, IndexError, RuntimeError) as e:  # never break the step
                graphs.failures.append(
                    f"the tensors a compiled graph saved in this step (reading them failed: "
                    f"{type(e).__name__}: {e}); saved bytes may be too low"
                )
            graphs.note_checkpoint_run(saved_state, fw_outs)
            return original(saved_state, ctx, fw_outs)

        return save_from_forward

    def note_checkpoint_run(self, saved_state: Any, fw_outs: Any) -> None:
        """A compiled graph ran inside a checkpoint region's forward or recompute: counted on its `FrameRecord`, and
        the storages it is about to save noted, so that the region sees them packed as the graph's (autograd packs
        them when the graph's autograd.Function returns, after the last eager op)."""
        state = self.state
        if state.phase == "forward" and state.frames and state.frames[-1] is not None:
            state.frames[-1].compiled_forward += 1
        elif state.phase == "backward" and state.recomputes and state.recomputes[-1][0] is not None:
            rec, gid = state.recomputes[-1]
            rec.compiled_recompute[gid] = rec.compiled_recompute.get(gid, 0) + 1
        else:
            return
        region = state.region()
        state.compiled_saves = {
            compat.storage_key(t): region
            for sl in compat.saved_slices(saved_state.metadata)
            for t in fw_outs[sl]
            if is_real(t)
        }

    def on_save(self, saved_state: Any, ctx: Any, fw_outs: Any) -> None:
        state = self.state
        if state.phase != "forward":
            return
        meta = saved_state.metadata
        region = state.region()
        if state.frames or state.reentrant:
            # A compiled graph's forward ran inside a checkpoint's forward: AC(compile(x)), also where no module hook
            # saw it enter (a compiled function called by the checkpointed code, C8's expert).
            state.orders.setdefault(region, "AC(compile(x))")
        self.region_compiled_runs[region] += 1
        self.graphs_run.add(id(meta))
        saved = [t for sl in compat.saved_slices(meta) for t in fw_outs[sl]]
        rec = self.records.get(id(meta))
        if rec is None:
            rec = self.records[id(meta)] = self._kept_graph_record(region, ctx, meta)
        rec.runs += 1
        if rec.known_graph:
            state.under_checkpoint.update(self.resolve(region, rel) for rel in rec.checkpointed)
            if rec.checkpointed:  # the graph traced a checkpoint: AC inside the compiled region
                state.orders.setdefault(region, "compile(AC(x))")
        else:
            state.checkpoint_unresolved.add(region)  # its forward graph unread: a checkpoint inside is not seen
        for i, t in enumerate(saved):
            if not is_real(t):
                continue
            st = t.untyped_storage()
            key = compat.storage_key(st)
            gs = rec.saved[i] if i < len(rec.saved) else None
            module = self.resolve(region, gs.module) if gs is not None else region
            op = gs.op if gs is not None else "compiled"
            if key not in self.saves:
                self.saves[key] = CompiledSave(
                    StorageWeakRef(st),  # type: ignore[no-untyped-call]  # unannotated in torch
                    module,
                    op,
                    dtype_name(t),
                    tuple(t.shape),
                    region,
                    st.nbytes(),
                )

    def _kept_graph_record(self, region: str, ctx: Any, meta: Any) -> GraphRecord:
        """A graph whose partition was not seen — compiled before the step (a warm model), or on a torch without the
        partition hook: read the forward graph the backend kept (eager/aot_eager), or attribute to the region."""
        # With the partition watched, a graph without a record was compiled before the step; without it, unknown.
        warm = True if compat.aot_partition_target() is not None else None
        fw = compat.forward_graph_of(ctx)
        if fw is None:
            self.unattributed += 1
            self.blind.add("compiled_fw_graph" if compat.aot_partition_target() is not None else "aot_partition")
            return GraphRecord(region, [], Counter(), recompute_known=False, warm=warm, known_graph=False)
        # The output node's one argument is the sequence of the graph's outputs.
        outs = list(cast("Sequence[Any]", fw.graph.output_node().args[0]))
        saved_nodes = [node for sl in compat.saved_slices(meta) for node in outs[sl]]
        return GraphRecord(
            region,
            [_saved_entry(node) for node in saved_nodes],
            Counter(),
            recompute_known=False,
            warm=warm,
            function_cls=compat.compiled_function_of(ctx),
            forward_flops=_graph_flops(fw),
            draws=bool(_random_in(fw)),
            checkpointed=_checkpointed_in(fw),
        )

    def finish(self) -> None:
        """After the backward: read the kept backward graphs of the graphs whose partition was not seen."""
        for rec in self.records.values():
            if not rec.recompute_known and rec.function_cls is not None:
                bw = compat.backward_graph_of(rec.function_cls)
                if bw is not None:
                    rec.recompute_ops, rec.recompute_known = _recompute_ops(bw), True
                    rec.recompute_flops = _graph_flops(bw, recomputed_only=True)
                    rec.random_recomputed = _random_in(bw)
            rec.function_cls = None

    def resolve(self, region: str, rel: str) -> str:
        # A resumed frame after a graph break (`torch_dynamo_resume_in_forward`) has a submodule as its `self`
        # (the MoE, not the compiled block): its module paths are relative to that, so find the one real name.
        name = _join(region, rel)
        if not rel:
            return name
        known = self.known_modules
        if name in known:
            return name
        under = [n for n in known if inside(n, region) and n.endswith("." + rel)]
        return min(under, key=len) if under else name

    def in_compiled_backward(self) -> int:
        return sum(sum(rec.recompute_ops.values()) * rec.runs for rec in self.records.values())

    def flops(self) -> tuple[int, int]:
        """(forward FLOPs, recomputed FLOPs) of the compiled graphs that ran, each graph's times its runs."""
        fwd = sum((rec.forward_flops or 0) * rec.runs for rec in self.records.values())
        return fwd, sum(rec.recompute_flops * rec.runs for rec in self.records.values())

    def draws(self) -> bool | None:
        """A compiled graph that ran drew random numbers (None: one whose forward graph could not be read may have)."""
        seen = [rec.draws for rec in self.records.values() if rec.runs]
        return True if any(seen) else None if None in seen else False

    def random_recomputed(self) -> list[str]:
        """ "compiled region (op)" of each random op a compiled backward that ran draws again."""
        return [
            f"the compiled backward of {rec.region or '<model>'} ({op})"
            for rec in self.records.values()
            if rec.runs
            for op in rec.random_recomputed
        ]

    def recompute_unknown(self) -> bool:
        return any(not rec.recompute_known for rec in self.records.values() if rec.runs)


def _join(region: str, rel: str) -> str:
    return canonical_name(f"{region}.{rel}" if region and rel else region or rel)


def _rel_module(node: torch.fx.Node) -> str:
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


def _base(node: torch.fx.Node) -> torch.fx.Node:
    while (
        node.op == "call_function"
        and node.args
        and isinstance(node.args[0], torch.fx.Node)
        and (node.target is operator.getitem or getattr(node.target, "__name__", "").split(".")[0] in _VIEW_OPS)
    ):
        node = node.args[0]
    return node


def _saved_entry(node: object) -> GraphSaved:
    if not isinstance(node, torch.fx.Node):
        return GraphSaved("", "compiled")
    base = _base(node)
    if base.op == "placeholder":
        return GraphSaved("", "input")
    return GraphSaved(_rel_module(base) or _rel_module(node), str(base.target))


def _graph_flops(gm: torch.fx.GraphModule, *, recomputed_only: bool = False) -> int:
    """FLOPs of a partitioned graph's ops (of those the partitioner tagged as forward ops placed in a backward graph,
    with `recomputed_only`), from the shapes its nodes carry (`meta["val"]`); an op with data-dependent sizes
    counts nothing (it is never guarded on: the count must not change the compile it reads)."""
    total = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or (recomputed_only and node.meta.get("partitioner_tag") != "is_forward"):
            continue
        out = node.meta.get("val")
        if out is not None:
            args, kwargs = torch.fx.node.map_aggregate((node.args, node.kwargs), _val)
            total += flops(node.target, args, kwargs, out) or 0
    return total


def _val(a: Any) -> Any:
    return a.meta.get("val", a) if isinstance(a, torch.fx.Node) else a


def _recompute_ops(bw: torch.fx.GraphModule) -> Counter[str]:
    recompute: Counter[str] = Counter()
    for node in bw.graph.nodes:
        if node.op == "call_function" and node.meta.get("partitioner_tag") == "is_forward":
            recompute[str(node.target)] += 1
    return recompute


def _checkpointed_in(fw: torch.fx.GraphModule) -> tuple[str, ...]:
    """The modules (relative) whose forward ops in `fw` ran under a checkpoint the graph traced. Only checkpoint's own
    tagging sets `ac_graph_id`; the partitioner also sets `recompute` on ops of its own choosing (MUST_SAVE), so that
    alone says nothing. An op outside any submodule ("") says nothing about which module was wrapped."""
    found = {
        _rel_module(node)
        for node in fw.graph.nodes
        if node.op == "call_function" and node.meta.get("ac_graph_id") is not None
    }
    return tuple(sorted(found - {""}))


def _random_in(gm: torch.fx.GraphModule) -> tuple[str, ...]:
    """The ops of a graph that draw from torch's global RNG (`nondeterministic_seeded`, with a nonzero dropout
    probability). In a backward graph each is a forward op recomputed, drawing new numbers: whether the partitioner
    tagged it as a forward op or not (a budget's recompute is not always tagged), a backward has none of its own."""
    out: list[str] = []
    for node in gm.graph.nodes:
        target = node.target
        if node.op == "call_function" and torch.Tag.nondeterministic_seeded in (getattr(target, "tags", ()) or ()):
            args = [a.meta.get("val", a) if isinstance(a, torch.fx.Node) else a for a in node.args]
            if compat.draws_random(target, tuple(args), dict(node.kwargs)):
                out.append(str(target))
    return tuple(out)


def _graph_record(region: str, fw: torch.fx.GraphModule, bw: torch.fx.GraphModule, n_fwd_outputs: int) -> GraphRecord:
    outs = cast("Sequence[Any]", fw.graph.output_node().args[0])  # the sequence of the graph's outputs
    saved = [
        _saved_entry(node)
        for node in outs[n_fwd_outputs:]
        if isinstance(node, torch.fx.Node) and isinstance(node.meta.get("val"), torch.Tensor)
    ]
    return GraphRecord(
        region,
        saved,
        _recompute_ops(bw),
        recompute_flops=_graph_flops(bw, recomputed_only=True),
        forward_flops=_graph_flops(fw),
        checkpointed=_checkpointed_in(fw),
        draws=bool(_random_in(fw)),
        random_recomputed=_random_in(bw),
    )
