"""SAC policies: torchtitan's per-op policy, save-exactly-these-ops, and a recorder of decisions.

SAC policies: torchtitan's per-op policy (save list, every-other-matmul rule, force-recompute shapes), save-exactly-
these-ops, and a recorder of their decisions.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Callable, Iterator, NamedTuple

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from .. import compat
from .._config import ConfigError
from .naming import named_modules

aten = torch.ops.aten


def _resolve(root: Any, path: str) -> Any | None:
    """An op by dotted path (`"torch_attn._varlen_attn.default"`), or None where this torch / install lacks it."""
    obj = root
    try:
        for part in path.split("."):
            obj = getattr(obj, part)
    except (AttributeError, RuntimeError):
        return None
    return obj


def default_save_ops() -> frozenset[Any]:
    """torchtitan 0.3.0's SAC save set (`activation_checkpoint._get_default_save_ops`), rebuilt op for op: the
    `.default` overload of each of the partitioner's compute-intensive ops; SDPA cudnn / math / fused-overrideable,
    `max`, FlexAttention, `linear`, `topk`, the Inductor region op and torch_attn's varlen attention; and the
    reduce-scatter / all-to-all collectives (DeepEP / HybridEP ones where installed). 22 ops on torch 2.13.
    `_grouped_mm` and CPU's `_scaled_dot_product_flash_attention_for_cpu` are not in it, so both are recomputed
    (C15; on CPU SDPA's output is recomputed)."""
    ops = {packet.default for packet in compat.default_compute_intensive_ops()}
    for root, path in (
        (torch.ops, "aten._scaled_dot_product_cudnn_attention.default"),
        (torch.ops, "aten._scaled_dot_product_attention_math.default"),
        (torch.ops, "aten._scaled_dot_product_fused_attention_overrideable.default"),
        (torch.ops, "aten.max.default"),
        (torch.ops, "higher_order.flex_attention"),
        (torch.ops, "aten.linear.default"),
        (torch.ops, "aten.topk.default"),
        (torch.ops, "higher_order.inductor_compiled_code"),
        (torch.ops, "torch_attn._varlen_attn.default"),
        (torch.ops, "_c10d_functional.reduce_scatter_tensor.default"),
        (torch.ops, "_c10d_functional.all_to_all_single.default"),
        (torch.ops, "deepep.dispatch.default"),
        (torch.ops, "deepep.combine.default"),
        (torch.ops, "hybridep.dispatch.default"),
        (torch.ops, "hybridep.combine.default"),
    ):
        op = _resolve(root, path)
        if op is not None:
            ops.add(op)
    return frozenset(ops)


class PolicyDecision(NamedTuple):
    """One call of a toolkit SAC policy: which op, the matmul RHS shape (for mm/linear) and the decision."""

    op: str
    rhs_shape: tuple[int, ...] | None
    decision: str
    reason: str
    out_bytes: int | None = None
    """Bytes of the op's output storages, where torch shows the policy the output (2.13: `ctx.op_output`)."""


def _out_bytes(ctx) -> int | None:
    from ..compat import tree_leaves

    out = getattr(ctx, "op_output", None)
    if out is None:
        return None
    seen, total = set(), 0
    for t in tree_leaves(out):
        if isinstance(t, torch.Tensor):
            try:
                st = t.untyped_storage()
            except (RuntimeError, NotImplementedError):  # fake and functional tensors at trace time have none
                return None
            key = compat.storage_key(st)
            if key not in seen:
                seen.add(key)
                total += st.nbytes()
    return total


# The logs of the running `record_policy_decisions` blocks of this context (thread, task), innermost last: none
# outside every block, so that a policy records nothing unless a caller asked, and one thread's block never sees
# another's decisions.
_recorders: contextvars.ContextVar[tuple[list[PolicyDecision], ...]] = contextvars.ContextVar(
    "toolkit_policy_recorders", default=()
)


@contextlib.contextmanager
def record_policy_decisions() -> Iterator[list[PolicyDecision]]:
    """Collect every decision the toolkit's SAC policies make while the block runs (forward or trace time)."""
    log: list[PolicyDecision] = []
    token = _recorders.set((*_recorders.get(), log))
    try:
        yield log
    finally:
        _recorders.reset(token)


_MM_OPS = (aten.mm.default, aten.linear.default)


class SelectiveOpPolicy:
    """torchtitan's per-op SAC policy, one instance per checkpoint call (fresh counters).

    Rules, in order: a CUDA→CPU `_to_copy` is saved; a matmul whose RHS shape is a force-recompute shape is
    recomputed; otherwise matmuls are counted and in the save set only odd-numbered ones (1st, 3rd, …) are
    saved; every other op of the save set is saved; everything else is recomputed.
    """

    def __init__(self, save_ops: frozenset[Any], force_recompute_shapes: frozenset[tuple[int, ...]]):
        self.save_ops = save_ops
        self.force_recompute_shapes = force_recompute_shapes
        # Older torch calls the policy again during recompute; separate counters keep the two passes aligned.
        self.mm_count = {"forward": 0, "recompute": 0}

    def __call__(self, ctx, func, *args, **kwargs) -> CheckpointPolicy:
        decision, rhs, reason = self._decide(ctx, func, *args, **kwargs)
        logs = _recorders.get()
        if logs:
            entry = PolicyDecision(str(func), rhs, decision.name, reason, _out_bytes(ctx))
            for log in logs:
                log.append(entry)
        return decision

    def _decide(self, ctx, func, *args, **kwargs):
        if (
            func == aten._to_copy.default
            and args
            and getattr(args[0], "is_cuda", False)
            and str(kwargs.get("device", "")) == "cpu"
        ):
            return CheckpointPolicy.MUST_SAVE, None, "device-to-host copy"
        rhs = None
        if func in _MM_OPS:
            w = args[1]
            rhs = tuple(w.shape) if func == aten.mm.default else (w.shape[1], w.shape[0])
            if rhs in self.force_recompute_shapes:
                return CheckpointPolicy.PREFER_RECOMPUTE, rhs, "force-recompute shape"
            self.mm_count["recompute" if getattr(ctx, "is_recompute", False) else "forward"] += 1
        if func in self.save_ops:
            if func in _MM_OPS:
                n = self.mm_count["recompute" if getattr(ctx, "is_recompute", False) else "forward"]
                if n % 2 == 0:
                    return CheckpointPolicy.PREFER_RECOMPUTE, rhs, f"matmul #{n} (even)"
                return CheckpointPolicy.MUST_SAVE, rhs, f"matmul #{n} (odd)"
            return CheckpointPolicy.MUST_SAVE, rhs, "in save set"
        return CheckpointPolicy.PREFER_RECOMPUTE, rhs, "not in save set"


class SaveOpsPolicy:
    """Save exactly the given ops; recompute everything else."""

    def __init__(self, save_ops: frozenset[Any]):
        self.save_ops = save_ops

    def __call__(self, ctx, func, *args, **kwargs) -> CheckpointPolicy:
        keep = func in self.save_ops
        decision = CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE
        logs = _recorders.get()
        if logs:
            for log in logs:
                log.append(
                    PolicyDecision(
                        str(func), None, decision.name, "in save_ops" if keep else "not in save_ops", _out_bytes(ctx)
                    )
                )
        return decision


def force_recompute_shapes(
    module: nn.Module, fqn_substrings: tuple[str, ...], base_fqn: str = ""
) -> frozenset[tuple[int, ...]]:
    """The matmul RHS shapes `(in, out)` of the `nn.Linear` modules under `module` (a block, named `base_fqn`,
    e.g. "layers.3") whose canonical names contain a substring — collected per block, as torchtitan does, so a
    dense block forces nothing even when an MoE block's router gate shares a shape with its matmuls."""
    shapes = set()
    for name, m in named_modules(module):
        fqn = f"{base_fqn}.{name}" if base_fqn and name else (base_fqn or name)
        if any(s in fqn for s in fqn_substrings):
            if not isinstance(m, nn.Linear):
                raise ConfigError(
                    "ACConfig",
                    "force_recompute_mm_shapes_by_fqns",
                    f"{fqn!r} matches but is a {type(m).__name__}, not nn.Linear.",
                    "list substrings that only match nn.Linear modules (e.g. 'moe.router.gate').",
                )
            shapes.add((m.weight.shape[1], m.weight.shape[0]))
    return frozenset(shapes)


def per_op_context(
    extra_save_ops: tuple[Any, ...], fqn_substrings: tuple[str, ...], module: nn.Module, base_fqn: str = ""
) -> Callable[[], Any]:
    """A `context_fn` for `torch.utils.checkpoint` with torchtitan's per-op policy for `module` (named `base_fqn`):
    a fresh policy per checkpoint call, so its matmul counters start at 0 in every block and every recompute, as
    torchtitan's do."""
    save = default_save_ops() | frozenset(extra_save_ops)
    shapes = force_recompute_shapes(module, fqn_substrings, base_fqn)
    return lambda: create_selective_checkpoint_contexts(SelectiveOpPolicy(save, shapes))


def save_ops_context(save_ops: tuple[Any, ...]) -> Callable[[], Any]:
    """A `context_fn` saving exactly `save_ops`."""
    ops = frozenset(save_ops)
    return lambda: create_selective_checkpoint_contexts(SaveOpsPolicy(ops))


def custom_context(policy: Callable[..., CheckpointPolicy]) -> Callable[[], Any]:
    """A `context_fn` with a user's own policy, used as given."""
    return lambda: create_selective_checkpoint_contexts(policy)
