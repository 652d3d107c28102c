"""`apply_ac(model, ACConfig)`: activation checkpointing applied to `model.layers` the way torchtitan does it (0.3.0's wrappers and per-op SAC policy, or main's torch_remat)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Literal

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy

from .. import compat
from .._config import ConfigError, check_bool, check_choice, check_int, check_object, from_dict, literal_choices, to_dict
from .naming import get_slot, has_checkpoint, is_checkpoint_wrapper, unwrap
from .policies import sac_context_fn
from .settings import applied, forget, record

ACMode = Literal["none", "full", "selective_op", "selective_layer", "per_submodule", "memory_budget", "custom", "remat"]

aten = torch.ops.aten


def _has_wrapped_regions_option() -> bool:
    return hasattr(compat.compiler_configs()[2], "wrap_inductor_compiled_regions")


# Modes that put blocks (or submodules) into a CheckpointWrapper; the wrapper's options mean nothing elsewhere.
WRAPPING_MODES = ("full", "selective_op", "selective_layer", "per_submodule", "custom")

# What each mode-specific option takes when its mode is chosen and it is left unset (None). Also what every
# `to_dict` wrote before options became mode-specific, which `from_dict` therefore accepts for any mode.
MODE_DEFAULTS: dict[str, Any] = {
    "preserve_rng_state": True, "early_stop": False, "determinism_check": "default", "debug": False,
    "layer_every": 2, "submodule_ac": "selective", "force_recompute_mm_shapes_by_fqns": ("moe.router.gate",),
    "memory_budget": 0.5,
}
# mode="remat" reads three of the options too, with torchtitan main's `ActivationRematConfig` defaults
# (distributed/activation_checkpoint.py at 03d9819f3416: determinism_check "default", preserve_rng_state False).
REMAT_DEFAULTS: dict[str, Any] = {"preserve_rng_state": False, "determinism_check": "default",
                                  "save_regions": (), "recompute_regions": ()}

# torchtitan main's fixed policies, unchanged: `SelectiveActivationRematConfig` keeps every declared region but the
# routed experts' w13 grouped projection (its saved activations scale with top-k); `FullActivationRematConfig`
# keeps none but the regions the model code always keeps.
REMAT_SELECTIVE: dict[str, tuple[str, ...]] = {"save_regions": ("*",), "recompute_regions": ("*routed_experts.w13.*",)}
REMAT_FULL: dict[str, tuple[str, ...]] = {"save_regions": (), "recompute_regions": ()}

# main's reasons, word for word, for the two options its remat configs refuse.
REMAT_REFUSED = {
    "preserve_rng_state": ("torch_remat activation checkpointing does not support preserve_rng_state=True. Register "
                           "a torch_remat RecomputeStateHook for random state used in retained regions."),
    "debug": "torch_remat activation checkpointing does not support the debug option.",
}


def mode_default(name: str, mode: str) -> Any:
    """What option `name` takes when `mode` reads it and it is left unset."""
    return REMAT_DEFAULTS[name] if mode == "remat" else MODE_DEFAULTS[name]


@dataclass(frozen=True, kw_only=True)
class ACConfig:
    """How to checkpoint activations. Applied per block of `model.layers`, like torchtitan's `apply_ac`.

    Options that only one mode reads default to None ("not set") and take their default when that mode is
    chosen; setting one for a mode that would ignore it is a ConfigError (`ACConfig(mode="full", layer_every=3)`
    would otherwise wrap every block and say nothing)."""

    mode: ACMode = "none"
    """"none"; "full" (each block in a non-reentrant `checkpoint_wrapper`); "selective_op" (each block with
    torchtitan's per-op SAC policy); "selective_layer" (every `layer_every`-th block fully checkpointed);
    "per_submodule" (attention and moe/feed_forward wrapped separately, as torchtitan's 2025 FlexAttention
    workaround did); "memory_budget" (no wrapping: the compile partitioner's activation budget); "custom"
    (each block with `policy` or `save_ops`); "remat" (torchtitan main's torch_remat: each block's `forward`
    replaced by `torch_remat.checkpoint`, the regions its model code declares kept or recomputed by
    `save_regions` / `recompute_regions`; `pip install torch-remat`)."""
    preserve_rng_state: bool | None = None
    """Modes that wrap: stash and restore the RNG state around recompute (default True, torchtitan's since
    PR #2380). "remat": default False, as in torchtitan main, whose configs (and `remat_selective()` /
    `remat_full()`) refuse True; here True installs the toolkit's own `RecomputeStateHook`, which snapshots torch's
    RNG state at region entry and after every kept region and restores it in recompute (such hooks do not work
    under compile)."""
    early_stop: bool | None = None
    """Modes that wrap: stop the recompute once every needed tensor exists (default False, as torchtitan
    hard-codes: leak C19)."""
    determinism_check: Literal["default", "none"] | None = None
    """Modes that wrap and "remat": "default" compares shape/dtype/device of recomputed tensors with the
    forward's; "none" skips it (default "default", also for remat: torchtitan main's `ActivationRematConfig`
    passes "default" to `torch_remat.checkpoint`, whose own default is "none")."""
    debug: bool | None = None
    """Modes that wrap: torch.utils.checkpoint's debug traces (default False); torch refuses it together with a
    SAC policy (C24)."""
    layer_every: int | None = None
    """"selective_layer" only: block i is fully checkpointed when (i + 1) % layer_every == 0 (default 2; 1 = every
    block)."""
    submodule_ac: Literal["selective", "full"] | None = None
    """"per_submodule" only: the AC each of attention and moe/feed_forward gets (default "selective")."""
    force_recompute_mm_shapes_by_fqns: tuple[str, ...] | None = None
    """The per-op policy only ("selective_op", or "per_submodule" with submodule_ac="selective"): name substrings
    of `nn.Linear` modules whose weight shape is forced to recompute — any matmul with that shape, whichever
    module it belongs to (torchtitan's rule). Default ("moe.router.gate",)."""
    extra_save_ops: tuple[Any, ...] = ()
    """The per-op policy only: ops added to its save set, e.g. `torch.ops.aten._grouped_mm.default` (C15), or
    their names ("aten._grouped_mm.default")."""
    memory_budget: float | None = None
    """"memory_budget" only: `activation_memory_budget` between 0 (recompute all) and 1 (runtime optimal);
    default 0.5."""
    policy: Callable[..., CheckpointPolicy] | None = None
    """"custom" only: a SAC policy `(ctx, func, *args, **kwargs) -> CheckpointPolicy`, used as given."""
    save_ops: tuple[Any, ...] | None = None
    """"custom" only: ops to save (MUST_SAVE); every other op is recomputed."""
    save_regions: tuple[str, ...] | None = None
    """"remat" only: shell-style patterns (fnmatch) of region names, relative to a block, to keep — a kept region
    saves its activations and is skipped in recompute. The regions are those the model's code declares, as
    torchtitan main declares them: `<fqn>.linear` per Linear (`attention.wq.linear`, main's
    `attention.qkv_linear.wqkv.linear`, `moe.router.gate.linear`, `moe.shared_experts.w2.linear` …),
    `<fqn>.grouped_mm` per grouped matmul (`moe.routed_experts.w13.grouped_mm`, `…w2.grouped_mm`),
    `attention.inner_attention`, and `routing_decision`, `ffn_residual`, `moe.shared_add`, which are always kept.
    Default () keeps nothing else: `remat_full()`. `("*",)` keeps every region. A literal name that matches no
    region is refused; a wildcard that matches none is ignored, as in main."""
    recompute_regions: tuple[str, ...] | None = None
    """"remat" only: patterns of regions to recompute even when `save_regions` matches them (they win). torchtitan
    main's selective policy is `ACConfig.remat_selective()`."""
    wrap_inductor_compiled_regions: bool = False
    """Modes that wrap: make Inductor-compiled regions one `inductor_compiled_code` op that SAC policies can see
    (C7); only for torch versions that have the option and only with the inductor backend."""

    def __post_init__(self) -> None:
        own = "ACConfig"
        check_choice(own, "mode", self.mode, literal_choices(ACConfig, "mode"))
        self._check_types()
        # Only now, with every value well-formed: is it meaningful for this mode? Then fill the mode's defaults.
        if self.mode == "remat" and self.debug:
            raise ConfigError(own, "debug", REMAT_REFUSED["debug"], "drop debug (torchtitan main refuses it too).")
        if self.mode == "remat" and self.debug is False:
            object.__setattr__(self, "debug", None)  # main's default, which its remat configs accept
        for name, modes in _option_modes(self.submodule_ac).items():
            if self.mode not in modes and self._is_set(name):
                if name in ("force_recompute_mm_shapes_by_fqns", "extra_save_ops"):
                    users, fix = ("the per-op policy (mode='selective_op', or 'per_submodule' with "
                                  "submodule_ac='selective')", "or use mode='selective_op'")
                elif len(modes) == 1:
                    users, fix = f"mode={modes[0]!r}", f"or set mode={modes[0]!r}"
                else:
                    users, fix = f"the modes that wrap ({', '.join(modes)})", "or pick a mode that wraps"
                setting = f"mode={self.mode!r}"
                if self.mode == "per_submodule":
                    setting += f" with submodule_ac={self.submodule_ac!r}"
                raise ConfigError(own, name, f"is only used by {users}, not {setting}, which would ignore it "
                                  f"({_IGNORED.get(self.mode, 'it never reads it')}).", f"drop {name}, {fix}.")
        if self.mode != "custom" and (self.policy is not None or self.save_ops is not None):
            raise ConfigError(own, "mode", f"policy/save_ops are only used by mode='custom', not {self.mode!r}.",
                              "set mode='custom' or drop policy/save_ops.")
        for name, modes in _option_modes(self.submodule_ac).items():
            if self.mode in modes and getattr(self, name) is None:
                object.__setattr__(self, name, mode_default(name, self.mode))
        if self.mode == "remat" and not compat.available("torch_remat"):
            raise ConfigError(own, "mode", "'remat' needs the torch_remat package, which is not installed.",
                              "pip install torch-remat==0.2.2 (or the toolkit's [remat] extra), or pick another mode.")
        if self.mode == "custom":
            if (self.policy is None) == (self.save_ops is None):
                raise ConfigError(own, "policy", "mode='custom' needs exactly one of policy and save_ops.",
                                  "pass policy=callable or save_ops=(torch.ops.aten.mm.default, ...).")
            if self.policy is not None and not callable(self.policy):
                raise ConfigError(own, "policy", f"{self.policy!r} is not callable.",
                                  "pass a function (ctx, func, *args, **kwargs) -> CheckpointPolicy.")
        if self.debug and self.uses_sac:
            raise ConfigError(own, "debug", "torch.utils.checkpoint rejects debug=True together with a selective "
                              "policy ('debug=True is incompatible with non-default context_fn', C24).",
                              "use debug=False, or mode='full'.")
        if self.wrap_inductor_compiled_regions and not _has_wrapped_regions_option():
            raise ConfigError(own, "wrap_inductor_compiled_regions",
                              f"torch {torch.__version__} has no inductor option wrap_inductor_compiled_regions.",
                              "upgrade torch (the option arrived with pytorch#167844) or leave it False.")

    def _check_types(self) -> None:
        """Each value that is set has the right type and range (whatever the mode)."""
        own = "ACConfig"
        for name in ("preserve_rng_state", "early_stop", "debug"):
            if getattr(self, name) is not None:
                check_bool(own, name, getattr(self, name))
        check_bool(own, "wrap_inductor_compiled_regions", self.wrap_inductor_compiled_regions)
        if self.determinism_check is not None:
            check_choice(own, "determinism_check", self.determinism_check, ("default", "none"))
        if self.submodule_ac is not None:
            check_choice(own, "submodule_ac", self.submodule_ac, literal_choices(ACConfig, "submodule_ac"))
        if self.layer_every is not None:
            check_int(own, "layer_every", self.layer_every, 1)
        fqns = self.force_recompute_mm_shapes_by_fqns
        if isinstance(fqns, str):
            raise ConfigError(own, "force_recompute_mm_shapes_by_fqns", "is a single string, not a tuple.",
                              f"pass ({fqns!r},).")
        if fqns is not None:
            if not isinstance(fqns, (tuple, list)) or not all(isinstance(f, str) for f in fqns):
                raise ConfigError(own, "force_recompute_mm_shapes_by_fqns", f"{fqns!r} is not a tuple of strings.",
                                  "pass e.g. ('moe.router.gate',), or () to force nothing.")
            object.__setattr__(self, "force_recompute_mm_shapes_by_fqns", tuple(fqns))
        for name in ("save_regions", "recompute_regions"):
            patterns = getattr(self, name)
            if isinstance(patterns, str):
                raise ConfigError(own, name, "is a single string, not a tuple of patterns.", f"pass ({patterns!r},).")
            if patterns is not None:
                if not isinstance(patterns, (tuple, list)) or not all(isinstance(p, str) and p for p in patterns):
                    raise ConfigError(own, name, f"{patterns!r} is not a tuple of non-empty strings.",
                                      "pass e.g. ('attention.*', 'moe.shared_experts.*'), or ().")
                object.__setattr__(self, name, tuple(patterns))
        object.__setattr__(self, "extra_save_ops", _ops(own, "extra_save_ops", self.extra_save_ops))
        if self.save_ops is not None:
            object.__setattr__(self, "save_ops", _ops(own, "save_ops", self.save_ops))
        if self.memory_budget is not None:
            m = self.memory_budget
            if isinstance(m, bool) or not isinstance(m, (int, float)) or not 0.0 <= m <= 1.0:  # NaN fails too
                raise ConfigError(own, "memory_budget", f"{m!r} is not between 0 and 1.",
                                  "pass e.g. 0.5 (0 = recompute everything, 1 = runtime-optimal).")

    @classmethod
    def remat_selective(cls, **options: Any) -> "ACConfig":
        """torchtitan main's `SelectiveActivationRematConfig`, unchanged: save `("*",)`, recompute
        `("*routed_experts.w13.*",)` (the routed experts' w13 grouped matmul; w2 and everything else declared is
        kept), determinism check "default", `preserve_rng_state=False`. A fixed policy, as in main."""
        return cls._fixed("SelectiveActivationRematConfig", REMAT_SELECTIVE, options)

    @classmethod
    def remat_full(cls, **options: Any) -> "ACConfig":
        """torchtitan main's `FullActivationRematConfig`: save `()` — every block recomputed but the regions the
        model code always keeps (`routing_decision`, `ffn_residual`, `moe.shared_add`)."""
        return cls._fixed("FullActivationRematConfig", REMAT_FULL, options)

    @classmethod
    def _fixed(cls, owner: str, policy: dict[str, tuple[str, ...]], options: dict[str, Any]) -> "ACConfig":
        for name, why in REMAT_REFUSED.items():
            if options.get(name):
                raise ConfigError(owner, name, why, f"drop {name} (torchtitan main refuses it too).")
        options.pop("debug", None)  # debug=False is main's default: nothing to set
        for name in policy:
            if name in options and tuple(options[name]) != policy[name]:
                raise ConfigError(owner, name, f"{owner} is a fixed policy (torchtitan main's).",
                                  "use ACConfig(mode='remat', save_regions=..., recompute_regions=...) to customize "
                                  "it, as main's ActivationRematConfig.")
        return cls(mode="remat", **{**policy, **options})

    def _is_set(self, name: str) -> bool:
        value = getattr(self, name)
        if name == "wrap_inductor_compiled_regions":
            return value is True
        if name == "extra_save_ops":
            return bool(value)
        return value is not None

    @property
    def uses_sac(self) -> bool:
        return self.mode in ("selective_op", "custom") or (self.mode == "per_submodule" and self.submodule_ac == "selective")

    @property
    def wraps(self) -> bool:
        return self.mode in WRAPPING_MODES

    def replace(self, **changes) -> "ACConfig":
        """A copy with `changes`. Changing the mode drops the options the old mode filled in at their defaults when
        the new mode ignores them or defaults them differently (`ACConfig(mode="full").replace(mode="none") ==
        ACConfig()`, `ACConfig(mode="remat").replace(mode="full") == ACConfig(mode="full")`); a value set on purpose
        stays, and is refused as usual when the new mode would ignore it."""
        if "mode" in changes or "submodule_ac" in changes:
            mode = changes.get("mode", self.mode)
            old = _option_modes(self.submodule_ac)
            for name, modes in _option_modes(changes.get("submodule_ac", self.submodule_ac)).items():
                if name in changes or (name not in MODE_DEFAULTS and name not in REMAT_DEFAULTS):
                    continue
                if self.mode not in old[name] or getattr(self, name) != mode_default(name, self.mode):
                    continue  # not filled in by the old mode: unset, or set on purpose
                if mode in modes and mode_default(name, mode) == mode_default(name, self.mode):
                    continue  # the new mode would fill in the same
                changes[name] = None
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ACConfig":
        """Rebuild from `to_dict` output. Files written before options became mode-specific carry every option at
        its default whatever the mode; such a default is dropped for a mode that ignores it, any other value is
        still an error."""
        check_object("ACConfig", data, '{"mode": "selective_op"}')
        data = dict(data)
        mode = data.get("mode", "none")
        for name, modes in _option_modes(data.get("submodule_ac")).items():
            legacy = MODE_DEFAULTS.get(name, False if name == "wrap_inductor_compiled_regions" else ())
            value = data.get(name)
            if mode not in modes and isinstance(value, list):
                value = tuple(value)
            if name in data and mode not in modes and value == legacy:
                data.pop(name)
        return from_dict(cls, data)


def _option_modes(submodule_ac: str | None) -> dict[str, tuple[str, ...]]:
    """Each mode-specific option → the modes that read it (the per-op policy's two depend on submodule_ac)."""
    per_op = ("selective_op",) + (("per_submodule",) if submodule_ac in (None, "selective") else ())
    checkpointing = WRAPPING_MODES + ("remat",)
    return {"preserve_rng_state": checkpointing, "early_stop": WRAPPING_MODES, "determinism_check": checkpointing,
            "debug": WRAPPING_MODES, "wrap_inductor_compiled_regions": WRAPPING_MODES,
            "save_regions": ("remat",), "recompute_regions": ("remat",),
            "layer_every": ("selective_layer",), "submodule_ac": ("per_submodule",),
            "force_recompute_mm_shapes_by_fqns": per_op, "extra_save_ops": per_op, "memory_budget": ("memory_budget",)}


_IGNORED = {"none": "nothing is checkpointed", "full": "every block is wrapped whole",
            "remat": "torch_remat has no such option",
            "memory_budget": "nothing is wrapped: only the partitioner's budget applies",
            "per_submodule": "submodule_ac='full' wraps each submodule whole, with no policy"}


def _ops(owner: str, field: str, ops: Any) -> tuple[Any, ...]:
    """A tuple of ops a SAC policy can match (`func is op`): names are looked up, anything else is refused."""
    if isinstance(ops, str) or not isinstance(ops, (tuple, list, set, frozenset)):
        raise ConfigError(owner, field, f"{ops!r} is not a tuple of ops.",
                          "pass e.g. (torch.ops.aten.mm.default,) or ('aten.mm.default',).")
    out = []
    for op in ops:
        if isinstance(op, str):
            op = op_from_name(op, owner=owner, field=field)
        kind = compat.op_kind(op)
        if kind == "packet":
            raise ConfigError(owner, field, f"torch.ops.{op} is an overload packet, which a policy's func never equals.",
                              f"name the overload, e.g. torch.ops.{op}.default.")
        if kind is None:
            raise ConfigError(owner, field, f"{op!r} is not a torch op.",
                              "pass ops like torch.ops.aten.mm.default or names like 'aten.mm.default'.")
        out.append(op)
    return tuple(out)


def op_from_name(name: Any, *, owner: str = "ACConfig", field: str = "save_ops"):
    """`'aten.mm.default'` → `torch.ops.aten.mm.default` (ops round-trip through JSON by name)."""
    if not isinstance(name, str):
        return name
    ns, _, rest = name.partition(".")
    packet_name, _, overload = rest.partition(".")
    try:
        packet = getattr(getattr(torch.ops, ns), packet_name)
        return getattr(packet, overload or "default")
    except (AttributeError, RuntimeError, ValueError):
        raise ConfigError(owner, field, f"{name!r} is not a torch op.",
                          "use names like 'aten.mm.default' (namespace.op.overload).") from None


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
    elif cfg.mode == "remat":
        from .remat import apply_remat, check_patterns, region_names

        check_patterns(cfg, {name for _, block in layer_items for name in region_names(block)})
        try:
            for key, block in layer_items:
                rec.ac_patched.extend(apply_remat(block, f"layers.{key}", cfg))
                wrapped.append(f"layers.{key}")
        except Exception:
            _unpatch(model, rec.ac_patched)
            rec.ac_patched = []
            forget(model)
            raise
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
    if rec.ac_patched:
        _unpatch(model, rec.ac_patched)
        rec.ac_patched = []
    else:
        for name in rec.ac_wrapped:
            parent, attr, occupant = get_slot(model, name)
            parent.register_module(attr, unwrap(occupant))
    rec.functorch_config.pop("activation_memory_budget", None)
    rec.ac, rec.ac_wrapped, rec.disable_lru_cache = None, [], False
    forget(model)
    return model


def _unpatch(model: nn.Module, names: list[str]) -> None:
    from .naming import get_module
    from .remat import remove_remat

    for name in names:
        remove_remat(get_module(model, name))


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
