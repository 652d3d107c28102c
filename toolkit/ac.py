"""`apply_ac(model, ACConfig)`: activation checkpointing applied to `model.layers` the way torchtitan does it, plus its per-op SAC policy."""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Literal, NamedTuple

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper, checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from ._config import ConfigError, check_choice, check_int, from_dict, literal_choices, to_dict
from .naming import get_module, get_slot, named_modules, unwrap
from .state import applied

ACMode = Literal["none", "full", "selective_op", "selective_layer", "per_submodule", "memory_budget", "custom"]

aten = torch.ops.aten


def _has_wrapped_regions_option() -> bool:
    import torch._inductor.config as inductor_config

    return hasattr(inductor_config, "wrap_inductor_compiled_regions")


@dataclass(frozen=True, kw_only=True)
class ACConfig:
    """How to checkpoint activations. Applied per block of `model.layers`, like torchtitan's `apply_ac`."""

    mode: ACMode = "none"
    """"none"; "full" (each block in a non-reentrant `checkpoint_wrapper`); "selective_op" (each block with
    torchtitan's per-op SAC policy); "selective_layer" (every `layer_every`-th block fully checkpointed);
    "per_submodule" (attention and moe/feed_forward wrapped separately, as torchtitan's 2025 FlexAttention
    workaround did); "memory_budget" (no wrapping: the compile partitioner's activation budget); "custom"
    (each block with `policy` or `save_ops`)."""
    preserve_rng_state: bool = True
    """Stash and restore the RNG state around recompute (torchtitan's default since PR #2380)."""
    early_stop: bool = False
    """Stop the recompute once every needed tensor exists (torchtitan hard-codes False: leak C19)."""
    determinism_check: Literal["default", "none"] = "default"
    """"default" compares shape/dtype/device of recomputed tensors with the forward's; "none" skips it."""
    debug: bool = False
    """torch.utils.checkpoint's debug traces; torch refuses it together with a SAC policy (C24)."""
    layer_every: int = 2
    """For "selective_layer": block i is fully checkpointed when (i + 1) % layer_every == 0 (1 = every block)."""
    submodule_ac: Literal["selective", "full"] = "selective"
    """For "per_submodule": the AC each of attention and moe/feed_forward gets."""
    force_recompute_mm_shapes_by_fqns: tuple[str, ...] = ("moe.router.gate",)
    """Name substrings of `nn.Linear` modules whose weight shape is forced to recompute in the per-op policy —
    any matmul with that shape, whichever module it belongs to (torchtitan's rule)."""
    extra_save_ops: tuple[Any, ...] = ()
    """Ops added to the per-op policy's save set, e.g. `torch.ops.aten._grouped_mm.default` (C15)."""
    memory_budget: float = 0.5
    """For "memory_budget": `activation_memory_budget` between 0 (recompute all) and 1 (runtime optimal)."""
    policy: Callable[..., CheckpointPolicy] | None = None
    """For "custom": a SAC policy `(ctx, func, *args, **kwargs) -> CheckpointPolicy`, used as given."""
    save_ops: tuple[Any, ...] | None = None
    """For "custom": ops to save (MUST_SAVE); every other op is recomputed."""
    wrap_inductor_compiled_regions: bool = False
    """Make Inductor-compiled regions one `inductor_compiled_code` op that SAC policies can see (C7); only
    for torch versions that have the option and only with the inductor backend."""

    def __post_init__(self) -> None:
        own = "ACConfig"
        check_choice(own, "mode", self.mode, literal_choices(ACConfig, "mode"))
        check_choice(own, "determinism_check", self.determinism_check, ("default", "none"))
        check_choice(own, "submodule_ac", self.submodule_ac, ("selective", "full"))
        check_int(own, "layer_every", self.layer_every, 1)
        for name in ("preserve_rng_state", "early_stop", "debug", "wrap_inductor_compiled_regions"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(own, name, f"{getattr(self, name)!r} is not a bool.", "pass True or False.")
        if isinstance(self.force_recompute_mm_shapes_by_fqns, str):
            raise ConfigError(own, "force_recompute_mm_shapes_by_fqns", "is a single string, not a tuple.",
                              f"pass ({self.force_recompute_mm_shapes_by_fqns!r},).")
        object.__setattr__(self, "force_recompute_mm_shapes_by_fqns", tuple(self.force_recompute_mm_shapes_by_fqns))
        object.__setattr__(self, "extra_save_ops", tuple(self.extra_save_ops))
        if not isinstance(self.memory_budget, (int, float)) or isinstance(self.memory_budget, bool) \
                or not 0.0 <= self.memory_budget <= 1.0:
            raise ConfigError(own, "memory_budget", f"{self.memory_budget!r} is not between 0 and 1.",
                              "pass e.g. 0.5 (0 = recompute everything, 1 = runtime-optimal).")
        if self.mode == "custom":
            if (self.policy is None) == (self.save_ops is None):
                raise ConfigError(own, "policy", "mode='custom' needs exactly one of policy and save_ops.",
                                  "pass policy=callable or save_ops=(torch.ops.aten.mm.default, ...).")
            if self.policy is not None and not callable(self.policy):
                raise ConfigError(own, "policy", f"{self.policy!r} is not callable.",
                                  "pass a function (ctx, func, *args, **kwargs) -> CheckpointPolicy.")
        elif self.policy is not None or self.save_ops is not None:
            raise ConfigError(own, "mode", f"policy/save_ops are only used by mode='custom', not {self.mode!r}.",
                              "set mode='custom' or drop policy/save_ops.")
        if self.save_ops is not None:
            object.__setattr__(self, "save_ops", tuple(self.save_ops))
        if self.debug and self.uses_sac:
            raise ConfigError(own, "debug", "torch.utils.checkpoint rejects debug=True together with a selective "
                              "policy ('debug=True is incompatible with non-default context_fn', C24).",
                              "use debug=False, or mode='full'.")
        if self.wrap_inductor_compiled_regions and not _has_wrapped_regions_option():
            raise ConfigError(own, "wrap_inductor_compiled_regions",
                              f"torch {torch.__version__} has no inductor option wrap_inductor_compiled_regions.",
                              "upgrade torch (the option arrived with pytorch#167844) or leave it False.")

    @property
    def uses_sac(self) -> bool:
        return self.mode in ("selective_op", "custom") or (self.mode == "per_submodule" and self.submodule_ac == "selective")

    @property
    def wraps(self) -> bool:
        return self.mode not in ("none", "memory_budget")

    def replace(self, **changes) -> "ACConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ACConfig":
        data = dict(data)
        for key in ("extra_save_ops", "save_ops"):
            if data.get(key) is not None:
                data[key] = tuple(op_from_name(n) for n in data[key])
        return from_dict(cls, data)


def op_from_name(name: Any):
    """`'aten.mm.default'` → `torch.ops.aten.mm.default` (ops round-trip through JSON by name)."""
    if not isinstance(name, str):
        return name
    ns, _, rest = name.partition(".")
    packet_name, _, overload = rest.partition(".")
    try:
        packet = getattr(getattr(torch.ops, ns), packet_name)
        return getattr(packet, overload or "default")
    except (AttributeError, RuntimeError):
        raise ConfigError("ACConfig", "save_ops", f"{name!r} is not a torch op.",
                          "use names like 'aten.mm.default'.") from None


# --- torchtitan's per-op SAC policy ---------------------------------------------------------------------


def _expand(packets) -> set[Any]:
    ops = set()
    for p in packets:
        for o in p.overloads():
            ops.add(getattr(p, o))
    return ops


def default_save_ops() -> frozenset[Any]:
    """torchtitan's save set: the partitioner's compute-intensive ops plus SDPA variants, max, linear, topk,
    FlexAttention and the Inductor region op where this torch has them. `_grouped_mm` is not in it (C15)."""
    from torch._functorch.partitioners import get_default_op_list

    ops = _expand(get_default_op_list().compute_intensive_ops)
    for name in ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                 "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
                 "_scaled_dot_product_attention_math", "_scaled_dot_product_fused_attention_overrideable",
                 "max", "linear", "topk", "mm"):
        packet = getattr(aten, name, None)
        if packet is not None:
            ops |= _expand([packet])
    for hop in ("flex_attention", "inductor_compiled_code"):
        if hasattr(torch.ops.higher_order, hop):
            ops.add(getattr(torch.ops.higher_order, hop))
    for ns, name in (("_c10d_functional", "reduce_scatter_tensor"), ("_c10d_functional", "all_to_all_single")):
        try:
            ops |= _expand([getattr(getattr(torch.ops, ns), name)])
        except (AttributeError, RuntimeError):
            pass
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
    from torch.utils._pytree import tree_leaves

    out = getattr(ctx, "op_output", None)
    if out is None:
        return None
    seen, total = set(), 0
    for t in tree_leaves(out):
        if isinstance(t, torch.Tensor):
            try:
                st = t.untyped_storage()
            except Exception:  # fake tensors at trace time
                return None
            if st._cdata not in seen:
                seen.add(st._cdata)
                total += st.nbytes()
    return total


_recorders: list[list[PolicyDecision]] = []


@contextlib.contextmanager
def record_policy_decisions() -> Iterator[list[PolicyDecision]]:
    """Collect every decision the toolkit's SAC policies make while the block runs (forward or trace time)."""
    log: list[PolicyDecision] = []
    _recorders.append(log)
    try:
        yield log
    finally:
        _recorders.remove(log)


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
        if _recorders:
            entry = PolicyDecision(str(func), rhs, decision.name, reason, _out_bytes(ctx))
            for log in _recorders:
                log.append(entry)
        return decision

    def _decide(self, ctx, func, *args, **kwargs):
        if func == aten._to_copy.default and args and getattr(args[0], "is_cuda", False) \
                and str(kwargs.get("device", "")) == "cpu":
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
        if _recorders:
            for log in _recorders:
                log.append(PolicyDecision(str(func), None, decision.name, "in save_ops" if keep else "not in save_ops",
                                          _out_bytes(ctx)))
        return decision


def force_recompute_shapes(model: nn.Module, fqn_substrings: tuple[str, ...]) -> frozenset[tuple[int, ...]]:
    """The matmul RHS shapes `(in, out)` of the `nn.Linear` modules whose canonical names contain a substring."""
    shapes = set()
    for name, m in named_modules(model):
        if any(s in name for s in fqn_substrings):
            if not isinstance(m, nn.Linear):
                raise ConfigError("ACConfig", "force_recompute_mm_shapes_by_fqns",
                                  f"{name!r} matches but is a {type(m).__name__}, not nn.Linear.",
                                  "list substrings that only match nn.Linear modules (e.g. 'moe.router.gate').")
            shapes.add((m.weight.shape[1], m.weight.shape[0]))
    return frozenset(shapes)


def sac_context_fn(cfg: ACConfig, model: nn.Module) -> Callable[[], Any]:
    """A `context_fn` for `torch.utils.checkpoint` that builds a fresh policy per checkpoint call."""
    if cfg.mode == "custom" and cfg.policy is not None:
        policy = cfg.policy
        return lambda: create_selective_checkpoint_contexts(policy)
    if cfg.mode == "custom":
        ops = frozenset(cfg.save_ops)
        return lambda: create_selective_checkpoint_contexts(SaveOpsPolicy(ops))
    save = default_save_ops() | frozenset(cfg.extra_save_ops)
    shapes = force_recompute_shapes(model, cfg.force_recompute_mm_shapes_by_fqns)
    return lambda: create_selective_checkpoint_contexts(SelectiveOpPolicy(save, shapes))


# --- applying and removing -------------------------------------------------------------------------------


def _wrap(module: nn.Module, cfg: ACConfig, selective: bool, model: nn.Module) -> CheckpointWrapper:
    kwargs: dict[str, Any] = dict(preserve_rng_state=cfg.preserve_rng_state, determinism_check=cfg.determinism_check,
                                  early_stop=cfg.early_stop, debug=cfg.debug)
    if selective:
        kwargs["context_fn"] = sac_context_fn(cfg, model)
    return checkpoint_wrapper(module, **kwargs)


def blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """`(key, block)` of `model.layers` (the unit AC and compile work on), blocks unwrapped."""
    root = unwrap(model)
    layers = getattr(root, "layers", None)
    if not isinstance(layers, (nn.ModuleDict, nn.ModuleList)):
        raise ConfigError("model", "layers", f"{type(root).__name__} has no `layers` ModuleDict/ModuleList of blocks.",
                          "build the model with toolkit.build_model, or keep the blocks in `model.layers`.")
    return [(k, unwrap(b)) for k, b in layers.named_children()]


def _has_checkpoint_wrappers(model: nn.Module) -> bool:
    return any(isinstance(m, CheckpointWrapper) for m in model.modules())


def apply_ac(model: nn.Module, cfg: ACConfig) -> nn.Module:
    """Wrap `model.layers` per `cfg` in place; FQNs stay canonical. Refuses to wrap twice."""
    if not isinstance(cfg, ACConfig):
        raise TypeError(f"apply_ac needs an ACConfig, got {type(cfg).__name__}")
    rec = applied(model)
    if rec.ac is not None or _has_checkpoint_wrappers(model):
        raise RuntimeError("activation checkpointing is already applied to this model "
                           f"({'mode=' + repr(rec.ac.mode) if rec.ac is not None else 'CheckpointWrapper found'}); "
                           "call toolkit.remove_ac(model) first.")
    if rec.compile is not None:
        raise RuntimeError("apply_ac must run before apply_compile (torchtitan's order). For AC(compile(x)) keep "
                           "that order and pass CompileConfig(order='ac_outside'); remove_compile(model) to start over.")
    layer_items = blocks(model)
    layers = unwrap(model).layers
    wrapped: list[str] = []
    if cfg.mode in ("full", "selective_op", "custom"):
        for key, block in layer_items:
            layers.register_module(key, _wrap(block, cfg, cfg.mode != "full", model))
            wrapped.append(f"layers.{key}")
    elif cfg.mode == "selective_layer":
        for i, (key, block) in enumerate(layer_items):
            if (i + 1) % cfg.layer_every == 0:
                layers.register_module(key, _wrap(block, cfg, False, model))
                wrapped.append(f"layers.{key}")
    elif cfg.mode == "per_submodule":
        for key, block in layer_items:
            for child in ("attention", "moe", "feed_forward"):
                if isinstance(getattr(block, child, None), nn.Module):
                    block.register_module(child, _wrap(getattr(block, child), cfg, cfg.submodule_ac == "selective", model))
                    wrapped.append(f"layers.{key}.{child}")
    elif cfg.mode == "memory_budget":
        rec.functorch_config["activation_memory_budget"] = float(cfg.memory_budget)
    if cfg.mode != "none":
        rec.disable_lru_cache = True  # torchtitan disables the LRU cache whenever AC is on (PR #2204, C8).
    rec.ac, rec.ac_wrapped = cfg, wrapped
    return model


def remove_ac(model: nn.Module) -> nn.Module:
    """Undo `apply_ac`: unwrap every CheckpointWrapper and drop the settings it recorded."""
    rec = applied(model)
    if rec.compile is not None:
        raise RuntimeError("call toolkit.remove_compile(model) before remove_ac(model): compiled code may hold the wrappers.")
    for name in rec.ac_wrapped:
        parent, attr, occupant = get_slot(model, name)
        parent.register_module(attr, unwrap(occupant))
    rec.functorch_config.pop("activation_memory_budget", None)
    rec.ac, rec.ac_wrapped, rec.disable_lru_cache = None, [], False
    return model


def ac_region_of(model: nn.Module, name: str) -> str | None:
    """The AC-wrapped module (canonical name) whose region contains `name` strictly, if any."""
    for w in applied(model).ac_wrapped:
        if name.startswith(w + ".") :
            return w
    return None


def checkpointed(model: nn.Module, name: str) -> bool:
    """True when the module called `name` is itself wrapped in a CheckpointWrapper."""
    try:
        _, _, occupant = get_slot(model, name)
    except KeyError:
        return False
    return isinstance(occupant, CheckpointWrapper)


__all__ = ["ACConfig", "apply_ac", "remove_ac", "SelectiveOpPolicy", "SaveOpsPolicy", "PolicyDecision",
           "record_policy_decisions", "default_save_ops", "force_recompute_shapes", "blocks", "get_module"]
