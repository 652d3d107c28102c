"""The census at the end of the forward: every storage held for backward, once, with who and why.

The census at the end of the forward: every storage held for backward, once, at its size now, with who made it and why
it is held.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from torch import nn

from ... import compat
from ...compat import tree_leaves
from ...instrument.records import Kind, SavedTensor
from .base import Held, Produced, is_real
from .compiled import CompiledSave


@dataclass(frozen=True)
class Census:
    tensors: tuple[SavedTensor, ...]
    params_bytes: int
    """Bytes of parameter and buffer storages that backward holds on to (not in `tensors`)."""
    output_saved: bool
    """The step's output is itself saved for backward (then it is not subtracted from held-after-forward)."""
    blind: tuple[str, ...] = ()
    """`toolkit.compat` features the census needed and torch lacked, or sentences saying what it could not see."""


def parameter_storages(model: nn.Module, blind: list[str] | None = None) -> dict[int, int]:
    """`storage key → bytes` of parameters and buffers (a DTensor's local shard; FSDP2's unsharded parameters).
    FSDP2 units whose state could not be read are named in `blind`: their all-gathered parameters would count as
    activations."""
    out: dict[int, int] = {}
    unsharded, unreadable = compat.fsdp_unsharded_parameters(model)
    if unreadable and blind is not None:
        blind.append(
            f"FSDP2's all-gathered parameters of {', '.join(unreadable[:3])}"
            f"{' …' if len(unreadable) > 3 else ''}: their state could not be read, so they may be counted "
            "as saved activations"
        )
    for t in [*model.parameters(), *model.buffers(), *unsharded]:
        t = compat.local_tensor(t)
        if is_real(t):
            st = t.untyped_storage()
            out[compat.storage_key(st)] = st.nbytes()
    return out


def _now(ref: Any, nbytes: int) -> int:
    """A storage's size at the end of the forward: FSDP2 frees its all-gathered parameters with `resize_(0)`."""
    size = compat.storage_nbytes_now(ref.cdata)
    return nbytes if size is None else size


def take(
    model: nn.Module,
    *,
    inputs: Iterable[Any],
    output: Any,
    produced: dict[int, Produced],
    comm_buffers: set[int] | frozenset[int] = frozenset(),
    compiled: dict[int, CompiledSave],
    packed: dict[int, Held],
    packed_keys: set[int],
    held_inputs: dict[int, Held],
    sac_keys: set[int],
    pack_kinds: dict[int, Kind] | None = None,
) -> Census:
    """Every storage held for backward at the end of the forward, once: what the probes recorded of each
    (`produced` by an op, `compiled` graph saves, `packed` by autograd without a producer, `held_inputs` of
    checkpoints, `sac_keys` cached by SAC, `pack_kinds` where a hook other than autograd's packed it: torch_remat's,
    or save_on_cpu's host copies), parameters and the buffers of collectives that nothing else holds (`comm_buffers`)
    excluded."""
    pack_kinds = pack_kinds or {}
    blind: list[str] = []
    params = parameter_storages(model, blind)
    input_keys = {compat.storage_key(t) for t in tree_leaves(list(inputs)) if is_real(t)}
    output_keys = {compat.storage_key(t) for t in tree_leaves(output) if is_real(t)}
    held_params = {k for k in params if k in packed_keys or k in compiled or k in sac_keys}
    rows: dict[int, SavedTensor] = {}

    def add(key: int, module: str, op: str, shape: tuple[int, ...], dtype: str, nbytes: int, kind: Kind) -> None:
        if nbytes > 0:
            rows[key] = SavedTensor(
                module=module,
                op=op,
                shape=tuple(shape),
                dtype=dtype,
                bytes=int(nbytes),
                kind=kind,
                is_input=key in input_keys,
            )

    for key, s in compiled.items():
        if s.ref.expired() or key in params:  # type: ignore[no-untyped-call]  # unannotated in torch
            continue
        module, op = s.module, s.op
        prod = produced.get(key)
        if op in ("compiled", "input") and prod is not None:
            op, module = prod.op, prod.module  # a graph input: attribute it to whoever made it
        elif module == s.region and prod is not None and prod.module.startswith(s.region):
            module = prod.module
        # Inside an eager SAC region the compiled graph's own saves are swallowed by the checkpoint; what stays
        # alive is what the SAC policy cached from the ops the compiled code dispatched.
        add(key, module, op, s.shape, s.dtype, _now(s.ref, s.nbytes), "sac_cache" if key in sac_keys else "compiled")
    for key, prod in produced.items():
        if key in rows or key in params or prod.ref.expired():  # type: ignore[no-untyped-call]  # unannotated in torch
            continue
        if key in output_keys and key not in sac_keys and key not in packed_keys:
            continue  # the step's own output, held by the caller rather than for backward
        kind: Kind = (
            "sac_cache"
            if key in sac_keys
            else "checkpoint_input"
            if key in held_inputs
            else pack_kinds.get(key, "autograd")
            if key in packed_keys
            else "other"
        )
        if kind == "other" and key in comm_buffers:
            # A collective's buffer (FSDP2's flat all-gather output) that nothing of autograd's holds: the process
            # group drops it once its finished work is released, which on gloo can land just after the forward.
            continue
        add(key, prod.module, prod.op, prod.shape, prod.dtype, _now(prod.ref, prod.nbytes), kind)
    for key, h in packed.items():
        # Saved tensors no probe saw being made: the step's inputs, or tensors made before the forward.
        if key in rows or key in params or h.ref.expired():  # type: ignore[no-untyped-call]  # unannotated in torch
            continue
        kind = "checkpoint_input" if key in held_inputs else pack_kinds.get(key, "autograd")
        op = "input" if key in input_keys else "unknown"
        add(key, h.module, op, h.shape, h.dtype, _now(h.ref, h.nbytes), kind)
    for key, h in held_inputs.items():
        # Checkpoint inputs made before the step (a leaf input passed to `checkpoint`): held to re-run the region.
        if key in rows or key in params or h.ref.expired() or key in produced:  # type: ignore[no-untyped-call]
            continue
        op = "input" if key in input_keys else "unknown"
        add(key, h.module, op, h.shape, h.dtype, _now(h.ref, h.nbytes), "checkpoint_input")
    tensors = tuple(sorted(rows.values(), key=lambda t: (t.module, t.op, -t.bytes, t.shape)))
    output_saved = any(k in output_keys for k in rows)
    if not compat.available("storage_weak_ptr"):
        blind.append("storage_weak_ptr")
    if not compat.available("fsdp_state") and any(type(m).__name__.startswith("FSDP") for m in model.modules()):
        blind.append("fsdp_state")
    return Census(tensors, sum(params[k] for k in held_params), output_saved, tuple(blind))
