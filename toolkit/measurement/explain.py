"""Explain a CheckpointError: which saved tensor of which region diverged, and the likely cause, from the probes.

Assembled only from what the probes recorded during the failing step (`probes.checkpoints.FrameRecord`): nothing is
re-run, so measuring changes nothing it measures. Where this torch lacks the checkpoint hooks the probes read, torch's
own message still gives the position and the metadata that diverged (`seen_by="message"`).
"""

from __future__ import annotations

import re
from typing import Any, TypeGuard

import torch

from ..instrument.probes.checkpoints import COMPILED_OP, CheckpointView, FrameRecord, Packed
from ..instrument.probes.tracker import ROUTING_OPS
from .report import CheckpointDivergence, DivergedTensor, RoutingChange


def is_checkpoint_error(err: BaseException | None) -> TypeGuard[torch.utils.checkpoint.CheckpointError]:
    return isinstance(err, torch.utils.checkpoint.CheckpointError)


_META = re.compile(
    r"'shape': torch\.Size\(\[([^\]]*)\]\), 'dtype': torch\.(\w+), 'device': device\(type='(\w+)'(?:, index=(\d+))?\)"
)


def _meta(text: str) -> DivergedTensor | None:
    m = _META.search(text)
    if m is None:
        return None
    shape = tuple(int(x) for x in m.group(1).split(",") if x.strip())
    device = m.group(3) + (f":{m.group(4)}" if m.group(4) else "")
    return DivergedTensor(shape=shape, dtype=m.group(2), device=device)


def _from_message(message: str) -> dict[str, Any]:
    """Position, metadata and counts as torch's CheckpointError message states them (2.13 and 2.14 word them alike)."""
    out: dict[str, Any] = {"positions": [int(p) for p in re.findall(r"tensor at position (\d+)", message)]}
    fwd = re.search(r"saved during forward: (\d+)", message)
    rec = re.search(r"saved during recomputation: (\d+)", message)
    if fwd and rec:
        out["counts"] = (int(fwd.group(1)), int(rec.group(1)))
    m = re.search(
        r"tensor at position \d+:\s*saved metadata: (\{[^\n]*\})\s*recomputed metadata: (\{[^\n]*\})", message
    )
    if m:
        out["forward"], out["recompute"] = _meta(m.group(1)), _meta(m.group(2))
    out["more"] = "trying to save more tensors during recomputation" in message
    return out


def _tensor(p: Packed) -> DivergedTensor:
    return DivergedTensor(op=p.op, module=p.module, shape=p.shape, dtype=p.dtype, device=p.device)


def _same(a: Packed, b: Packed) -> bool:
    return (a.shape, a.dtype, a.device) == (b.shape, b.dtype, b.device)


def _counts(decisions: list[tuple[str, str, torch.Tensor]], ids: torch.Tensor, size: int) -> tuple[int, ...]:
    """Tokens per expert: the region's own count op where it has one of that size, else counted from the ids."""
    for _, op, t in decisions:
        if op not in ROUTING_OPS and t.dim() == 1 and t.numel() == size:
            return tuple(int(v) for v in t.tolist())
    return tuple(int(v) for v in torch.bincount(ids.flatten().long(), minlength=size).tolist())


def _routing(rec: FrameRecord, gid: Any) -> tuple[RoutingChange | None, bool]:
    """The first routing decision that differs between the forward and the recompute (and whether only a count
    changed, the decisions being equal)."""
    fwd, again = rec.routing, rec.routing_recompute.get(gid, [])
    decisions = [(a, b) for a, b in zip(fwd, again) if a[1] in ROUTING_OPS and b[1] in ROUTING_OPS]
    for (module, op, ids_f), (_, _, ids_r) in decisions:
        if ids_f.shape == ids_r.shape and torch.equal(ids_f, ids_r):
            continue
        size = int(max(ids_f.max().item() if ids_f.numel() else 0, ids_r.max().item() if ids_r.numel() else 0)) + 1
        if ids_f.shape == ids_r.shape:
            changed = int((ids_f.sort(-1).values != ids_r.sort(-1).values).reshape(ids_f.shape[0], -1).any(-1).sum())
        else:
            changed = abs(ids_f.shape[0] - ids_r.shape[0])
        return (
            RoutingChange(
                module=module,
                op=op,
                tokens=int(ids_f.shape[0]),
                changed=changed,
                counts_forward=_counts(fwd, ids_f, size),
                counts_recompute=_counts(again, ids_r, size),
            ),
            False,
        )
    counts = [(a, b) for a, b in zip(fwd, again) if a[1] not in ROUTING_OPS]
    for (module, op, c_f), (_, _, c_r) in counts:
        if c_f.shape != c_r.shape or not torch.equal(c_f, c_r):
            return (
                RoutingChange(
                    module=module,
                    op=op,
                    tokens=int(c_f.sum()) if c_f.dim() == 1 else 0,
                    changed=0,
                    counts_forward=tuple(int(v) for v in c_f.flatten().tolist()),
                    counts_recompute=tuple(int(v) for v in c_r.flatten().tolist()),
                ),
                True,
            )
    return None, False


def explain(err: BaseException, view: CheckpointView | None) -> CheckpointDivergence:
    """The explanation of `err` (a CheckpointError) from what the probes kept of the failing step."""
    msg = _from_message(str(err))
    last = view.last_recompute if view is not None and view.observing else None
    if last is None:
        positions = msg["positions"]
        forward_n, recompute_n = msg.get("counts", (0, 0))
        return CheckpointDivergence(
            position=positions[0] if positions else None,
            diverged=len(positions) or (abs(forward_n - recompute_n) if forward_n else 0),
            saved_forward=forward_n,
            saved_recompute=recompute_n,
            forward=msg.get("forward"),
            recompute=msg.get("recompute"),
            seen_by="message",
        )
    rec, gid = last
    assert view is not None  # `last` is read from it
    fwd, again = rec.forward, rec.recomputes.get(gid, [])
    differing = [i for i, (a, b) in enumerate(zip(fwd, again)) if not _same(a, b)]
    if msg["positions"]:
        position = msg["positions"][0]
    elif differing:
        position = differing[0]
    else:
        position = min(len(fwd), len(again))  # a count mismatch: the first tensor one side has and the other lacks
    diverged = len(differing) + abs(len(fwd) - len(again))
    forward = _tensor(fwd[position]) if position < len(fwd) else None
    recompute = _tensor(again[position]) if position < len(again) else None
    cause, evidence, routing = _cause(rec, gid, view, forward, recompute)
    return CheckpointDivergence(
        region=rec.region,
        position=position,
        diverged=diverged,
        saved_forward=len(fwd),
        saved_recompute=len(again),
        forward=forward,
        recompute=recompute,
        cause=cause,
        evidence=tuple(evidence),
        routing=routing,
    )


def _cause(
    rec: FrameRecord,
    gid: Any,
    view: CheckpointView,
    forward: DivergedTensor | None,
    recompute: DivergedTensor | None,
) -> tuple[str, list[str], RoutingChange | None]:
    """The likely cause, most specific first: RNG, a side effect, a compile switch, then what changed (routing,
    a count); the evidence for each candidate seen, whichever wins."""
    evidence: list[str] = []
    candidates: list[str] = []
    if rec.random_ops:
        module, op = rec.random_ops[0]
        more = f" (+{len(rec.random_ops) - 1} more)" if len(rec.random_ops) > 1 else ""
        if rec.preserve_rng_state is False:
            candidates.append("rng_not_preserved")
            evidence.append(
                f"the region draws random numbers ({op} in {module or '<model>'}{more}) with preserve_rng_state=False, "
                "so its recompute draws different ones"
            )
        else:
            evidence.append(f"the region draws random numbers ({op}{more}), restored for the recompute")
    for module, op, key in rec.reads or [r for other in view.records for r in other.reads]:
        owner = next((r for r in view.records if key in r.mutated), None)
        if owner is None:
            continue
        w_module, w_op = owner.mutated[key]
        name = view.names.get(key, "a tensor made before the step")
        candidates.append("side_effect")
        evidence.append(
            f"the forward wrote {name} in place ({w_op} in {w_module or '<model>'}) and the recompute read it again "
            f"({op} in {module or '<model>'})"
        )
        break
    switched = (
        forward is not None and recompute is not None and (forward.op == COMPILED_OP) != (recompute.op == COMPILED_OP)
    )
    runs_again = rec.compiled_recompute.get(gid, 0)
    if switched:
        assert forward is not None and recompute is not None  # `switched` holds only then
        side, other = (
            ("the forward", "the recompute") if forward.op == COMPILED_OP else ("the recompute", "the forward")
        )
        eager = recompute if forward.op == COMPILED_OP else forward
        candidates.append("compile_switch")
        evidence.append(
            f"{side} saved it from compiled code, {other} from the eager op {eager.op}: the code ran compiled in one "
            "and eagerly in the other (a guard that failed at the recompile limit, or a switch to eager)"
        )
    elif rec.compiled_forward != runs_again and (rec.compiled_forward or runs_again):
        candidates.append("compile_switch")
        evidence.append(f"{rec.compiled_forward} compiled graphs ran in the forward, {runs_again} in the recompute")
    if view.backward_recompiles:
        candidates.append("compile_switch")
        evidence.append(
            f"a compiled frame's guards failed during backward (recompile reason: "
            f"{view.backward_recompiles[0].splitlines()[0][:160]})"
        )
    routing, only_counts = _routing(rec, gid)
    if routing is not None:
        candidates.append("token_count_changed" if only_counts else "routing_changed")
        evidence.append(
            (f"a token count changed: {routing.text()}" if only_counts else f"the routing changed: {routing.text()}")
        )
        if not only_counts and not {"rng_not_preserved", "side_effect", "compile_switch"} & set(candidates):
            evidence.append(
                "nothing random was drawn unrestored, no compiled code switched and no older tensor was written in "
                "place: the router's math is not bit-identical between the two runs where its scores nearly tie "
                "(save the routing decision: a SAC policy that saves aten.topk, or torch_remat's kept routing_decision)"
            )
    order = ("rng_not_preserved", "side_effect", "compile_switch", "routing_changed", "token_count_changed")
    cause = next((c for c in order if c in candidates), "unknown")
    return cause, evidence, routing


__all__ = ["CheckpointView", "explain", "is_checkpoint_error"]
