"""`apply_ac(model, ACConfig)`: activation checkpointing applied to `model.layers` the way torchtitan does it, plus its per-op SAC policy."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Literal

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy

from .. import compat
from .._config import ConfigError, check_choice, check_int, from_dict, literal_choices, to_dict
from .naming import get_slot, has_checkpoint, is_checkpoint_wrapper, unwrap
from .policies import sac_context_fn
from .settings import applied, forget, record

ACMode = Literal["none", "full", "selective_op", "selective_layer", "per_submodule", "memory_budget", "custom"]

aten = torch.ops.aten


def _has_wrapped_regions_option() -> bool:
    return hasattr(compat.compiler_configs()[2], "wrap_inductor_compiled_regions")


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
    any matmul of that block with that shape, whichever module it belongs to (torchtitan's rule: shapes are
    collected per block)."""
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


# --- applying and removing -------------------------------------------------------------------------------


def _wrap(module: nn.Module, cfg: ACConfig, selective: bool, fqn: str) -> nn.Module:
    """A non-reentrant CheckpointWrapper around `module` (named `fqn`), with the SAC policy if `selective`."""
    kwargs: dict[str, Any] = dict(preserve_rng_state=cfg.preserve_rng_state, determinism_check=cfg.determinism_check,
                                  early_stop=cfg.early_stop, debug=cfg.debug)
    if selective:
        kwargs["context_fn"] = sac_context_fn(cfg, module, fqn)
    return compat.checkpoint_wrapper(module, **kwargs)


def blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """`(key, block)` of `model.layers` (the unit AC and compile work on), blocks unwrapped."""
    root = unwrap(model)
    layers = getattr(root, "layers", None)
    if not isinstance(layers, (nn.ModuleDict, nn.ModuleList)):
        raise ConfigError("model", "layers", f"{type(root).__name__} has no `layers` ModuleDict/ModuleList of blocks.",
                          "build the model with toolkit.build_model, or keep the blocks in `model.layers`.")
    return [(k, unwrap(b)) for k, b in layers.named_children()]


def apply_ac(model: nn.Module, cfg: ACConfig) -> nn.Module:
    """Wrap `model.layers` per `cfg` in place; FQNs stay canonical. Refuses to wrap twice."""
    if not isinstance(cfg, ACConfig):
        raise TypeError(f"apply_ac needs an ACConfig, got {type(cfg).__name__}")
    rec = applied(model)
    if rec.ac is not None or has_checkpoint(model):
        raise RuntimeError("activation checkpointing is already applied to this model "
                           f"({'mode=' + repr(rec.ac.mode) if rec.ac is not None else 'CheckpointWrapper found'}); "
                           "call toolkit.remove_ac(model) first.")
    if rec.compile is not None:
        raise RuntimeError("apply_ac must run before apply_compile (torchtitan's order). For AC(compile(x)) keep "
                           "that order and pass CompileConfig(order='ac_outside'); remove_compile(model) to start over.")
    layer_items = blocks(model)
    layers = unwrap(model).layers
    rec = record(model)
    wrapped: list[str] = []
    if cfg.mode in ("full", "selective_op", "custom"):
        for key, block in layer_items:
            layers.register_module(key, _wrap(block, cfg, cfg.mode != "full", f"layers.{key}"))
            wrapped.append(f"layers.{key}")
    elif cfg.mode == "selective_layer":
        for i, (key, block) in enumerate(layer_items):
            if (i + 1) % cfg.layer_every == 0:
                layers.register_module(key, _wrap(block, cfg, False, f"layers.{key}"))
                wrapped.append(f"layers.{key}")
    elif cfg.mode == "per_submodule":
        for key, block in layer_items:
            for child in ("attention", "moe", "feed_forward"):
                if isinstance(getattr(block, child, None), nn.Module):
                    block.register_module(child, _wrap(getattr(block, child), cfg, cfg.submodule_ac == "selective",
                                                       f"layers.{key}.{child}"))
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
    if rec.empty:
        return model
    if rec.compile is not None:
        raise RuntimeError("call toolkit.remove_compile(model) before remove_ac(model): compiled code may hold the wrappers.")
    for name in rec.ac_wrapped:
        parent, attr, occupant = get_slot(model, name)
        parent.register_module(attr, unwrap(occupant))
    rec.functorch_config.pop("activation_memory_budget", None)
    rec.ac, rec.ac_wrapped, rec.disable_lru_cache = None, [], False
    forget(model)
    return model


def ac_region_of(model: nn.Module, name: str) -> str | None:
    """The AC-wrapped module (canonical name) whose region contains `name` strictly, if any."""
    for w in applied(model).ac_wrapped:
        if name.startswith(w + "."):
            return w
    return None


def checkpointed(model: nn.Module, name: str) -> bool:
    """True when the module called `name` is itself wrapped in a CheckpointWrapper."""
    try:
        _, _, occupant = get_slot(model, name)
    except KeyError:
        return False
    return is_checkpoint_wrapper(occupant)


__all__ = ["ACConfig", "apply_ac", "remove_ac", "blocks", "op_from_name"]
