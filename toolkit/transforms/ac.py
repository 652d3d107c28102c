"""`apply_ac(model, ACConfig.of(mode=...))`: activation checkpointing applied the way torchtitan does it.

`apply_ac(model, ACConfig.of(mode=...))`: activation checkpointing applied to `model.layers` the way torchtitan does it;
one config class per mode, which owns its options and applies itself.

`ACConfig.of(mode="selective_op", ...)` is the one entry point: it builds that mode's own config (`MODES`), a frozen
dataclass holding only the options the mode reads. An option another mode reads is a ConfigError naming that mode.
torchtitan does the same with one `Config` per policy (`FullAC.Config`, `SelectiveAC.Config`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Literal, cast

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy

from .. import compat
from .._config import (
    ConfigError,
    PlainData,
    check_bool,
    check_choice,
    check_int,
    check_number,
    check_strings,
    from_dict,
    warn_input,
)
from .containers import block_container, blocks
from .naming import canonical_name, get_module, get_slot, has_checkpoint, inside, unwrap
from .ops import op_from_name, ops_of
from .policies import custom_context, per_op_context, save_ops_context
from .record import Applied, applied, forget, record
from .remat import REMAT_FULL, REMAT_SELECTIVE

ACMode = Literal[
    "none",
    "full",
    "reentrant",
    "selective_op",
    "selective_layer",
    "per_submodule",
    "memory_budget",
    "custom",
    "remat",
    "policy_dict",
]


# main's reasons, word for word, for the two options its remat configs refuse.
REMAT_REFUSED = {
    "preserve_rng_state": (
        "torch_remat activation checkpointing does not support preserve_rng_state=True. Register "
        "a torch_remat RecomputeStateHook for random state used in retained regions."
    ),
    "debug": "torch_remat activation checkpointing does not support the debug option.",
}


@dataclass(frozen=True, kw_only=True)
class ACConfig(PlainData):
    """How to checkpoint activations, per block of `model.layers` like torchtitan's `apply_ac`.

    `ACConfig.of(mode=..., **options)` builds the mode's own config (`FullAC`, `SelectiveOpAC`, … in `MODES`); the
    classes can be used directly too. Each holds only its mode's options, with their defaults."""

    mode: ACMode = "none"
    """"none"; "full" (each block in a non-reentrant `checkpoint_wrapper`); "selective_op" (each block with
    torchtitan's per-op SAC policy); "reentrant" (each block in a reentrant checkpoint, transformers'
    `use_reentrant=True`); "selective_layer" (every `layer_every`-th block fully checkpointed);
    "per_submodule" (attention and moe/feed_forward wrapped separately, as torchtitan's 2025 FlexAttention
    workaround did); "memory_budget" (no wrapping: the compile partitioner's activation budget); "custom"
    (each block with `policy` or `save_ops`); "remat" (torchtitan main's torch_remat: each block's `forward`
    replaced by `torch_remat.checkpoint`, its regions kept or recomputed by `save_regions` /
    `recompute_regions`; `pip install torch-remat`)."""

    SELECTIVE: ClassVar[bool] = False
    """The mode's blocks get a selective policy that decides op by op (a `context_fn`); `uses_sac` reads it."""
    wraps: ClassVar[bool] = False
    """The mode puts modules into CheckpointWrappers."""
    RECORD: ClassVar[str] = "ACConfig"
    RECORD_EXAMPLE: ClassVar[str] = '{"mode": "selective_op"}'
    IGNORES: ClassVar[str]
    """What the mode leaves alone, said when an option it does not read is refused (each mode's class sets it)."""

    def __init__(self, **options: Any) -> None:
        # Each mode's class is a dataclass with an `__init__` of its own; this one is reached only by calling the
        # family's base itself, which holds no mode's options.
        raise ConfigError(
            "ACConfig",
            "mode",
            "ACConfig is the family of AC configs, not one of them.",
            f"use ACConfig.of(mode={options.get('mode', 'none')!r}, ...) or the mode's own class "
            f"({', '.join(c.__name__ for c in MODES.values())}).",
        )

    @property
    def uses_sac(self) -> bool:
        """A selective policy decides op by op (a `context_fn`) for this config."""
        return self.SELECTIVE

    @staticmethod
    def of(mode: str = "none", **options: Any) -> ACConfig:
        """The config of `mode` with `options`: the family's one entry point by name (`MODES[mode](**options)`). An
        option the mode does not read is a ConfigError naming the modes that read it."""
        check_choice("ACConfig", "mode", mode, tuple(MODES))
        own = MODES[mode]
        for name, value in options.items():
            if name not in own.options():
                _refuse_option(name, own, value)
        return own(**options)

    def __post_init__(self) -> None:
        own = type(self).own_mode()
        if self.mode != own:
            raise ConfigError(
                "ACConfig",
                "mode",
                f"{type(self).__name__} is mode {own!r}, not {self.mode!r}.",
                f"use ACConfig.of(mode={self.mode!r}, ...) instead.",
            )

    @classmethod
    def own_mode(cls) -> str:
        """The mode this class configures (its `mode` field's only value)."""
        return cast(str, cls.__dataclass_fields__["mode"].default)  # each mode's class gives `mode` a default

    @classmethod
    def options(cls) -> tuple[str, ...]:
        """The names of the options this mode reads."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.name != "mode")

    # --- applying ----------------------------------------------------------------------------------------

    def _apply(
        self, model: nn.Module, layer_items: list[tuple[str, nn.Module]], rec: Applied, undo: list[tuple[str, str]]
    ) -> list[str]:
        """Transform `model.layers` in place; each change goes into `undo` as it is made (so a failure half-way
        is rolled back); returns the canonical names of the modules that now checkpoint."""
        return []

    # --- plain data --------------------------------------------------------------------------------------

    def replace(self, **changes: Any) -> "ACConfig":
        """A copy with `changes`. Changing the mode builds the new mode's config and carries over the options
        set to something other than their default (`FullAC(preserve_rng_state=False).replace(mode="selective_op")`
        keeps it); one the new mode does not read is refused as usual."""
        mode = changes.get("mode", self.mode)
        if mode == self.mode:
            return dataclasses.replace(self, **changes)
        default = type(self)()
        carried = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name != "mode" and getattr(self, f.name) != getattr(default, f.name)
        }
        return ACConfig.of(**{**carried, **changes})

    def _unset(self, name: str) -> Any:
        return _record_fields().get(name)  # what the record holds where the mode does not read it

    @classmethod
    def _from_record(cls, data: dict[str, Any]) -> ACConfig:
        return from_dict(MODES[data.get("mode", "none")], data)

    @classmethod
    def remat_selective(cls, **options: Any) -> "RematAC":
        """torchtitan main's `SelectiveActivationRematConfig`, unchanged: save `("*",)`, recompute
        `("*routed_experts.w13.*",)` (the routed experts' w13 grouped matmul; w2 and everything else declared is
        kept), determinism check "default", `preserve_rng_state=False`. A fixed policy, as in main."""
        return _fixed_remat("SelectiveActivationRematConfig", REMAT_SELECTIVE, options)

    @classmethod
    def remat_full(cls, **options: Any) -> "RematAC":
        """torchtitan main's `FullActivationRematConfig`: save `()` — every block recomputed but the regions the
        model code always keeps (`routing_decision`, `ffn_residual`, `moe.shared_add`)."""
        return _fixed_remat("FullActivationRematConfig", REMAT_FULL, options)


def every_option_record(own: dict[str, Any]) -> dict[str, Any]:
    """A mode's record (`_migrations`, ACConfig 2) holds every mode's option, each the mode does not read at its
    "unset" value (null; [] for `extra_save_ops`, false for `wrap_inductor_compiled_regions`), as it was written
    before the modes had classes of their own, so files and matrix cache keys stay valid."""
    return {name: own.get(name, unset) for name, unset in _record_fields().items()} | {"mode": own["mode"]}


def remat_debug_unset(data: dict[str, Any]) -> dict[str, Any]:
    """`debug` can only be False under remat (main's configs refuse True): the remat records written before the modes
    had classes of their own hold null for it (`_migrations`, ACConfig 4), and the remat cells' keys must not change."""
    return data | {"debug": None} if data["mode"] == "remat" else data


def from_every_option_record(data: dict[str, Any]) -> dict[str, Any]:
    """Such a record (or any object of the mode's options) as the mode's class reads it: the options the mode does
    not read must hold their unset value, or the default they had before options became mode-specific (dropped
    with a warning) — anything else is an error naming the field."""
    data = dict(data)
    mode = data.get("mode", "none")
    check_choice("ACConfig", "mode", mode, tuple(MODES))
    own = MODES[mode]
    record = _record_fields()
    for name in list(data):
        value = tuple(data[name]) if isinstance(data[name], list) else data[name]
        if name in own.options() and value is None:
            data.pop(name)  # unset: the mode's default
        elif name not in own.options() and name != "mode" and name in record:
            if value is None or value == () or value == record[name]:
                data.pop(name)  # the record's unset value
            elif value in _defaults(name):
                data.pop(name)
                warn_input(
                    "ACConfig",
                    name,
                    f"{value!r} dropped: mode={mode!r} does not read it (a record written before options became "
                    "mode-specific held every option).",
                    f"remove {name!r} from the record, or set the mode that reads it.",
                )
            else:
                _refuse_option(name, own, value)
    return data


def _fixed_remat(owner: str, policy: dict[str, tuple[str, ...]], options: dict[str, Any]) -> "RematAC":
    """One of main's fixed remat policies: main refuses preserve_rng_state / debug, and its patterns are its own."""
    for name, why in REMAT_REFUSED.items():
        if options.get(name):
            raise ConfigError(owner, name, why, f"drop {name} (torchtitan main refuses it too).")
    for name in policy:
        if name in options and tuple(options[name]) != policy[name]:
            raise ConfigError(
                owner,
                name,
                f"{owner} is a fixed policy (torchtitan main's).",
                "use ACConfig.of(mode='remat', save_regions=..., recompute_regions=...) to customize "
                "it, as main's ActivationRematConfig.",
            )
    return RematAC(**{**policy, **options})


def _refuse_option(name: str, own: type[ACConfig], value: Any) -> None:
    """`ACConfig.of(mode=..., name=value)` where that mode does not read `name`. A value of the wrong type is named as
    such first (whichever mode reads it would refuse it too); a good value is refused naming the modes that read it."""
    if name in ("policy", "save_ops"):
        raise ConfigError(
            "ACConfig",
            "mode",
            f"policy/save_ops are only used by mode='custom', not {own.own_mode()!r}.",
            "set mode='custom' or drop policy/save_ops.",
        )
    readers = [m for m, c in MODES.items() if name in c.options()]
    if not readers:
        raise ConfigError(
            "ACConfig",
            name,
            "is not an option of any AC mode.",
            f"use the options of mode={own.own_mode()!r}: {', '.join(own.options()) or 'none'}.",
        )
    try:  # the reading mode's own check of the value
        MODES[readers[0]](**{name: value})
    except ConfigError as e:
        if e.field == name:
            raise
    if name in ("force_recompute_mm_shapes_by_fqns", "extra_save_ops"):
        users, fix = (
            "the per-op policy (mode='selective_op', or 'per_submodule' with submodule_ac='selective')",
            "or use mode='selective_op'",
        )
    elif len(readers) == 1:
        users, fix = f"mode={readers[0]!r}", f"or set mode={readers[0]!r}"
    else:
        users, fix = f"the modes that wrap ({', '.join(readers)})", "or pick a mode that wraps"
    raise ConfigError(
        "ACConfig",
        name,
        f"is only used by {users}, not mode={own.own_mode()!r}, which would ignore it ({own.IGNORES}).",
        f"drop {name}, {fix}.",
    )


@dataclass(frozen=True, kw_only=True)
class NoAC(ACConfig):
    """Nothing is checkpointed."""

    mode: Literal["none"] = "none"
    IGNORES: ClassVar[str] = "nothing is checkpointed"


@dataclass(frozen=True, kw_only=True)
class Checkpointing(ACConfig):
    """The modes that wrap modules in a non-reentrant `checkpoint_wrapper`, and the options they all read."""

    wraps: ClassVar[bool] = True
    preserve_rng_state: bool = True
    """Stash and restore the RNG state around recompute (torchtitan's default since PR #2380)."""
    early_stop: bool = False
    """Stop the recompute once every needed tensor exists (torchtitan hard-codes False: leak C19)."""
    determinism_check: Literal["default", "none"] = "default"
    """"default" compares shape/dtype/device of recomputed tensors with the forward's; "none" skips it."""
    debug: bool = False
    """torch.utils.checkpoint's debug traces; torch refuses it together with a SAC policy (C24)."""
    wrap_inductor_compiled_regions: bool = dataclasses.field(default=False, metadata={"unset": False})
    """Make Inductor-compiled regions one `inductor_compiled_code` op that SAC policies can see (C7); only for
    torch versions that have the option and only with the inductor backend."""
    offload: bool = dataclasses.field(default=False, metadata={"unset": False})
    """Keep what each checkpoint saves on the host: `torch.autograd.graph.save_on_cpu` around every checkpoint call
    (transformers' `activation_checkpointing_enable(offload=True)`); its host copies read as kind "offloaded"."""

    def __post_init__(self) -> None:
        super().__post_init__()
        own = "ACConfig"
        for name in ("preserve_rng_state", "early_stop", "debug", "wrap_inductor_compiled_regions", "offload"):
            check_bool(own, name, getattr(self, name))
        check_choice(own, "determinism_check", self.determinism_check, ("default", "none"))
        if self.debug and self.uses_sac:
            raise ConfigError(
                own,
                "debug",
                "torch.utils.checkpoint rejects debug=True together with a selective "
                "policy ('debug=True is incompatible with non-default context_fn', C24).",
                "use debug=False, or mode='full'.",
            )
        if self.wrap_inductor_compiled_regions and not hasattr(
            compat.compiler_configs().inductor, "wrap_inductor_compiled_regions"
        ):
            raise ConfigError(
                own,
                "wrap_inductor_compiled_regions",
                f"torch {torch.__version__} has no inductor option wrap_inductor_compiled_regions.",
                "upgrade torch (the option arrived with pytorch#167844) or leave it False.",
            )

    def context_fn(self, module: nn.Module, fqn: str) -> Callable[[], Any] | None:
        """The SAC `context_fn` for `module` (named `fqn`), or None for a plain checkpoint."""
        return None

    def wrap(self, module: nn.Module, fqn: str, *, selective: bool | None = None) -> nn.Module:
        """A non-reentrant CheckpointWrapper around `module` (named `fqn`), with this mode's SAC policy when it has
        one (`selective=False` wraps it plainly)."""
        kwargs: dict[str, Any] = dict(
            preserve_rng_state=self.preserve_rng_state,
            determinism_check=self.determinism_check,
            early_stop=self.early_stop,
            debug=self.debug,
            offload=self.offload,
        )
        context = self.context_fn(module, fqn) if selective is not False else None
        if context is not None:
            kwargs["context_fn"] = context
        return compat.checkpoint_wrapper(module, **kwargs)

    def _apply(self, model, layer_items, rec, undo):
        return _wrap_blocks(self.wrap, model, layer_items, undo)


@dataclass(frozen=True, kw_only=True)
class FullAC(Checkpointing):
    """Each block in a non-reentrant `checkpoint_wrapper` (torchtitan's `FullAC`)."""

    mode: Literal["full"] = "full"
    IGNORES: ClassVar[str] = "every block is wrapped whole"


@dataclass(frozen=True, kw_only=True)
class ReentrantAC(ACConfig):
    """Each block in a reentrant checkpoint (`use_reentrant=True`: torch's old default, and an option of transformers'
    `gradient_checkpointing_enable`): an autograd Function that saves only the block's inputs and re-runs the
    whole block inside its backward. It has no early stop, no determinism check and no selective policy."""

    mode: Literal["reentrant"] = "reentrant"
    IGNORES: ClassVar[str] = "every block is wrapped whole, reentrantly"
    wraps: ClassVar[bool] = True
    preserve_rng_state: bool = True
    """Stash and restore the RNG state around the re-run."""
    offload: bool = dataclasses.field(default=False, metadata={"unset": False})
    """Keep what each checkpoint saves on the host: `torch.autograd.graph.save_on_cpu` around every checkpoint call
    (transformers' `activation_checkpointing_enable(offload=True)`); its host copies read as kind "offloaded"."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_bool("ACConfig", "preserve_rng_state", self.preserve_rng_state)
        check_bool("ACConfig", "offload", self.offload)

    def wrap(self, module: nn.Module, fqn: str, *, selective: bool | None = None) -> nn.Module:
        return compat.checkpoint_wrapper(
            module, reentrant=True, preserve_rng_state=self.preserve_rng_state, offload=self.offload
        )

    def _apply(self, model, layer_items, rec, undo):
        return _wrap_blocks(self.wrap, model, layer_items, undo)


def _wrap_blocks(
    wrap: Callable[[nn.Module, str], nn.Module],
    model: nn.Module,
    items: list[tuple[str, nn.Module]],
    undo: list[tuple[str, str]],
) -> list[str]:
    """Each block replaced by `wrap(block, fqn)`, recorded in `undo` as it goes (the modes that wrap whole blocks, the
    reentrant one among them)."""
    prefix, layers = block_container(model)
    for key, block in items:
        layers.register_module(key, wrap(block, f"{prefix}.{key}"))
        undo.append(("wrapped", f"{prefix}.{key}"))
    return [f"{prefix}.{key}" for key, _ in items]


@dataclass(frozen=True, kw_only=True)
class PerOpPolicy(Checkpointing):
    """The options of torchtitan's per-op SAC policy (its save list, every other matmul, force-recompute shapes)."""

    SELECTIVE: ClassVar[bool] = True
    force_recompute_mm_shapes_by_fqns: tuple[str, ...] | None = ("moe.router.gate",)
    """Name substrings of `nn.Linear` modules whose weight shape is forced to recompute — any matmul with that
    shape, whichever module it belongs to (torchtitan's rule)."""
    extra_save_ops: tuple[Any, ...] = dataclasses.field(default=(), metadata={"unset": []})
    """Ops added to the save set, e.g. `torch.ops.aten._grouped_mm.default` (C15), or their names
    ("aten._grouped_mm.default")."""

    def __post_init__(self) -> None:
        super().__post_init__()
        fqns = check_strings(
            "ACConfig",
            "force_recompute_mm_shapes_by_fqns",
            self.force_recompute_mm_shapes_by_fqns,
            "('moe.router.gate',), or () to force nothing",
            non_empty=False,
        )
        object.__setattr__(self, "force_recompute_mm_shapes_by_fqns", fqns)
        object.__setattr__(self, "extra_save_ops", ops_of("extra_save_ops", self.extra_save_ops))

    def context_fn(self, module, fqn):
        return per_op_context(self.extra_save_ops, self.force_recompute_mm_shapes_by_fqns, module, fqn)

    def _warn_unmatched(self, layer_items: list[tuple[str, nn.Module]]) -> None:
        """A name substring matching no `nn.Linear` of any block forces nothing: warn, unless it is torchtitan's
        default (the router gate, which a dense model has none of)."""
        fqns = self.force_recompute_mm_shapes_by_fqns or ()
        if fqns == PerOpPolicy.__dataclass_fields__["force_recompute_mm_shapes_by_fqns"].default:
            return
        names = [f"layers.{key}.{name}" for key, block in layer_items for name in _linears(block)]
        for s in fqns:
            if not any(s in name for name in names):
                shown = sorted({name.split(".", 2)[-1] for name in names})
                warn_input(
                    "ACConfig",
                    "force_recompute_mm_shapes_by_fqns",
                    f"{s!r} is in the name of no nn.Linear of this model's blocks, so it forces no matmul to "
                    "recompute.",
                    f"use a part of one of their names ({', '.join(shown[:6]) or 'none'}"
                    f"{', …' if len(shown) > 6 else ''}).",
                )

    def _apply(self, model, layer_items, rec, undo):
        self._warn_unmatched(layer_items)
        return super()._apply(model, layer_items, rec, undo)


@dataclass(frozen=True, kw_only=True)
class SelectiveOpAC(PerOpPolicy):
    """Each block with torchtitan's per-op SAC policy (torchtitan 0.3.0's `SelectiveAC`)."""

    mode: Literal["selective_op"] = "selective_op"
    IGNORES: ClassVar[str] = "its blocks get the per-op policy"


@dataclass(frozen=True, kw_only=True)
class SelectiveLayerAC(Checkpointing):
    """Every `layer_every`-th block fully checkpointed."""

    mode: Literal["selective_layer"] = "selective_layer"
    IGNORES: ClassVar[str] = "whole blocks are wrapped"
    layer_every: int = 2
    """Block i is checkpointed when (i + 1) % layer_every == 0 (1 = every block)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("ACConfig", "layer_every", self.layer_every, 1, 4096, "ModelConfig.n_layers' own bound")

    def _apply(self, model, layer_items, rec, undo):
        chosen = [(k, b) for i, (k, b) in enumerate(layer_items) if (i + 1) % self.layer_every == 0]
        if not chosen:  # AC asked for and nothing checkpointed is a silent failure: refused before anything changes
            raise ConfigError(
                "ACConfig",
                "layer_every",
                f"layer_every={self.layer_every} checkpoints none of the model's {len(layer_items)} blocks (it wraps "
                "every layer_every-th).",
                f"pass layer_every <= {len(layer_items)}, or mode='none'.",
            )
        return _wrap_blocks(self.wrap, model, chosen, undo)


@dataclass(frozen=True, kw_only=True)
class PerSubmoduleAC(PerOpPolicy):
    """attention and moe / feed_forward wrapped separately, as torchtitan's 2025 FlexAttention workaround did."""

    mode: Literal["per_submodule"] = "per_submodule"
    IGNORES: ClassVar[str] = "its submodules are wrapped"
    submodule_ac: Literal["selective", "full"] = "selective"
    """The AC each of attention and moe/feed_forward gets: the per-op policy ("selective") or full."""

    def __post_init__(self) -> None:
        check_choice("ACConfig", "submodule_ac", self.submodule_ac, ("selective", "full"))
        if self.submodule_ac == "full":
            for name in ("force_recompute_mm_shapes_by_fqns", "extra_save_ops"):
                if getattr(self, name) not in (PerSubmoduleAC.__dataclass_fields__[name].default, None):
                    raise ConfigError(
                        "ACConfig",
                        name,
                        "is only used by the per-op policy, not mode='per_submodule' "
                        "with submodule_ac='full', which wraps each submodule whole, with no policy.",
                        f"drop {name}, or use submodule_ac='selective'.",
                    )
            object.__setattr__(self, "force_recompute_mm_shapes_by_fqns", ())
        super().__post_init__()
        if self.submodule_ac == "full":
            object.__setattr__(self, "force_recompute_mm_shapes_by_fqns", None)  # read by no policy: unset

    @property
    def uses_sac(self) -> bool:
        return self.submodule_ac == "selective"

    def context_fn(self, module, fqn):
        return super().context_fn(module, fqn) if self.uses_sac else None

    def _apply(self, model, layer_items, rec, undo):
        if self.uses_sac:
            self._warn_unmatched(layer_items)
        wrapped = []
        prefix = block_container(model)[0]
        for key, block in layer_items:
            for child in ("attention", "moe", "feed_forward"):
                if isinstance(getattr(block, child, None), nn.Module):
                    block.register_module(child, self.wrap(getattr(block, child), f"{prefix}.{key}.{child}"))
                    undo.append(("wrapped", f"{prefix}.{key}.{child}"))
                    wrapped.append(f"{prefix}.{key}.{child}")
        return wrapped


@dataclass(frozen=True, kw_only=True)
class CustomAC(Checkpointing):
    """Each block with a SAC policy of your own (`policy`), or saving exactly `save_ops`."""

    mode: Literal["custom"] = "custom"
    IGNORES: ClassVar[str] = "its policy decides"
    SELECTIVE: ClassVar[bool] = True
    policy: Callable[..., CheckpointPolicy] | None = None
    """A SAC policy `(ctx, func, *args, **kwargs) -> CheckpointPolicy`, used as given."""
    save_ops: tuple[Any, ...] | None = None
    """Ops to save (MUST_SAVE); every other op is recomputed."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if (self.policy is None) == (self.save_ops is None):
            raise ConfigError(
                "ACConfig",
                "policy",
                "mode='custom' needs exactly one of policy and save_ops.",
                "pass policy=callable or save_ops=(torch.ops.aten.mm.default, ...).",
            )
        if self.policy is not None and not callable(self.policy):
            raise ConfigError(
                "ACConfig",
                "policy",
                f"{self.policy!r} is not callable.",
                "pass a function (ctx, func, *args, **kwargs) -> CheckpointPolicy.",
            )
        if self.save_ops is not None:
            object.__setattr__(self, "save_ops", ops_of("save_ops", self.save_ops))

    def context_fn(self, module, fqn):
        return custom_context(self.policy) if self.policy is not None else save_ops_context(self.save_ops)


@dataclass(frozen=True, kw_only=True)
class MemoryBudgetAC(ACConfig):
    """No wrapping: the compile partitioner's `activation_memory_budget` (compiled graphs only, C16)."""

    mode: Literal["memory_budget"] = "memory_budget"
    IGNORES: ClassVar[str] = "nothing is wrapped: only the partitioner's budget applies"
    memory_budget: float = 0.5
    """Between 0 (recompute all) and 1 (runtime optimal)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_number(
            "ACConfig",
            "memory_budget",
            self.memory_budget,
            minimum=0,
            maximum=1,
            example="0.5 (0 = recompute everything, 1 = runtime-optimal)",
        )

    def _apply(self, model, layer_items, rec, undo):
        rec.functorch_config["activation_memory_budget"] = float(self.memory_budget)
        undo.append(("budget", ""))
        return []


@dataclass(frozen=True, kw_only=True)
class RematAC(ACConfig):
    """torchtitan main's torch_remat: each block's `forward` becomes `torch_remat.checkpoint`, choosing among the
    regions the model's code declares by name (`toolkit.transforms.remat`)."""

    mode: Literal["remat"] = "remat"
    IGNORES: ClassVar[str] = "torch_remat has no such option"
    save_regions: tuple[str, ...] = ()
    """Shell-style patterns (fnmatch) of region names, relative to a block, to keep — a kept region saves its
    activations and is skipped in recompute. The regions are those the model's code declares, as torchtitan main
    declares them: `<fqn>.linear` per Linear (`attention.wq.linear`, main's `attention.qkv_linear.wqkv.linear`,
    `moe.router.gate.linear`, `moe.shared_experts.w2.linear` …), `<fqn>.grouped_mm` per grouped matmul
    (`moe.routed_experts.w13.grouped_mm`, `…w2.grouped_mm`), `attention.inner_attention`, and `routing_decision`,
    `ffn_residual`, `moe.shared_add`, which are always kept. () keeps nothing else: `remat_full()`. `("*",)` keeps
    every region. A literal name that matches no region is refused; a wildcard that matches none is ignored, as
    in main."""
    recompute_regions: tuple[str, ...] = ()
    """Patterns of regions to recompute even when `save_regions` matches them (they win). torchtitan main's
    selective policy is `ACConfig.remat_selective()`."""
    preserve_rng_state: bool = False
    """Default False, as in torchtitan main, whose configs (and `remat_selective()` / `remat_full()`) refuse True;
    here True installs the toolkit's own `RecomputeStateHook`, which snapshots torch's RNG state at region entry
    and after every kept region and restores it in recompute (such hooks do not work under compile)."""
    determinism_check: Literal["default", "none"] = "default"
    """torch_remat's check of recomputed tensors against the forward's: "default" (torchtitan main's
    `ActivationRematConfig` passes it; torch_remat's own default is "none") or "none"."""
    debug: bool = False
    """main's `ActivationRematConfig.debug`: only False (True is refused with main's reason)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        own = "ACConfig"
        check_bool(own, "preserve_rng_state", self.preserve_rng_state)
        check_bool(own, "debug", self.debug)
        if self.debug:
            raise ConfigError(own, "debug", REMAT_REFUSED["debug"], "drop debug (torchtitan main refuses it too).")
        check_choice(own, "determinism_check", self.determinism_check, ("default", "none"))
        for name in ("save_regions", "recompute_regions"):
            patterns = check_strings(own, name, getattr(self, name), "('attention.*', 'moe.shared_experts.*'), or ()")
            object.__setattr__(self, name, patterns)
        if not compat.available("torch_remat"):
            from .._extras import reason

            raise ConfigError(own, "mode", f"'remat' {reason('torch_remat')}", "install it, or pick another mode.")

    def _apply(self, model, layer_items, rec, undo):
        from .remat import apply_remat, check_patterns, region_names

        check_patterns(self, {name for _, block in layer_items for name in region_names(block)})
        prefix = block_container(model)[0]
        for key, block in layer_items:
            apply_remat(block, f"{prefix}.{key}", self, undo)  # records each forward it replaces, as it goes
        rec.ac_patched = [name for what, name in undo if what == "patched"]
        return [f"{prefix}.{key}" for key, _ in layer_items]


def _linears(block: nn.Module) -> list[str]:
    """Canonical names of the `nn.Linear` modules of a block, relative to it."""
    return [canonical_name(n) for n, m in block.named_modules() if isinstance(m, nn.Linear)]


@dataclass(frozen=True, kw_only=True)
class PolicyDictAC(Checkpointing):
    """Each block checkpointed with torch's dict policy (pytorch#186277): `checkpoint(policy={key: MUST_SAVE})`, the
    keys op names or tensor names given with `torch.utils.checkpoint.name()`, everything else recomputed. Only on a
    torch that has the API (`compat`'s `checkpoint_policy_dict`); elsewhere the config is refused."""

    mode: Literal["policy_dict"] = "policy_dict"
    IGNORES: ClassVar[str] = "its blocks get the dict policy"
    SELECTIVE: ClassVar[bool] = True
    policy_save: tuple[str, ...] = ("aten.mm.default", "aten.topk.default")
    """The policy's MUST_SAVE keys: op names ("aten.mm.default", "aten::mm", the packet "aten.mm") or names given
    with `torch.utils.checkpoint.name(tensor, name)` in the model's code; the rest is recomputed."""

    def __post_init__(self) -> None:
        super().__post_init__()
        keys = check_strings("ACConfig", "policy_save", self.policy_save, "('aten.mm.default', 'router_scores')")
        object.__setattr__(self, "policy_save", keys)
        if not compat.available("checkpoint_policy_dict"):
            raise ConfigError(
                "ACConfig",
                "mode",
                f"'policy_dict' needs torch.utils.checkpoint.checkpoint(policy=...) and torch.utils.checkpoint.name() "
                f"(pytorch#186277); torch {torch.__version__} has neither.",
                "use a torch that includes pytorch#186277 (newer than 2.15.0), or per-op SAC: mode='selective_op', or "
                "mode='custom' with save_ops.",
            )

    def wrap(self, module, fqn, *, selective=None):
        if selective is False:
            return super().wrap(module, fqn, selective=False)
        return compat.checkpoint_wrapper(
            module,
            preserve_rng_state=self.preserve_rng_state,
            determinism_check=self.determinism_check,
            early_stop=self.early_stop,
            policy=compat.checkpoint_policy_dict(self.policy_save),
        )


MODES: dict[str, type[ACConfig]] = {
    c.own_mode(): c
    for c in (
        NoAC,
        FullAC,
        ReentrantAC,
        SelectiveOpAC,
        SelectiveLayerAC,
        PerSubmoduleAC,
        MemoryBudgetAC,
        CustomAC,
        RematAC,
        PolicyDictAC,
    )
}


def _record_fields() -> dict[str, Any]:
    """Every option of every mode → the value the JSON record gives it under a mode that does not read it: null,
    or the field's own `unset` (its metadata) where the record always held a value (`[]`, `false`). Read from the
    dataclasses, in the modes' order."""
    out: dict[str, Any] = {"mode": "none"}
    for config in MODES.values():
        for f in dataclasses.fields(config):
            if f.name != "mode":
                out.setdefault(f.name, f.metadata.get("unset"))
    return out


def _defaults(name: str) -> list[Any]:
    """The defaults option `name` has in the modes that read it: what a record written before options became
    mode-specific may hold for it under any mode."""
    out = []
    for config in MODES.values():
        f = config.__dataclass_fields__.get(name)
        if f is not None and f.default is not dataclasses.MISSING and f.default not in out:
            out.append(f.default)
    return out


# --- applying and removing -------------------------------------------------------------------------------


def apply_ac(model: nn.Module, cfg: ACConfig) -> nn.Module:
    """Checkpoint the model's blocks (`block_container`: `model.layers`, or wherever they are) per `cfg` in place;
    FQNs stay canonical. Refuses to wrap twice; a failure half-way leaves the model as it was."""
    if not isinstance(cfg, ACConfig):
        raise TypeError(f"apply_ac needs an ACConfig, got {type(cfg).__name__}")
    rec = applied(model)
    if rec.ac is not None or has_checkpoint(model):
        raise RuntimeError(
            "activation checkpointing is already applied to this model "
            f"({'mode=' + repr(rec.ac.mode) if rec.ac is not None else 'CheckpointWrapper found'}); "
            "call toolkit.transforms.remove_ac(model) first."
        )
    if rec.compile is not None:
        raise RuntimeError(
            "apply_ac must run before apply_compile (torchtitan's order). For AC(compile(x)) keep "
            "that order and pass CompileConfig(order='ac_outside'); remove_compile(model) to start over."
        )
    layer_items = blocks(model)
    rec = record(model)
    undo: list[tuple[str, str]] = []
    try:
        wrapped = cfg._apply(model, layer_items, rec, undo)
    except BaseException:
        _undo(model, rec, undo)
        forget(model)
        raise
    # torchtitan disables the LRU cache whenever AC is on (PR #2204, C8).
    record_ac(rec, cfg, wrapped, disable_lru_cache=cfg.mode != "none")
    return model


def record_ac(rec: Applied, cfg: ACConfig, wrapped: list[str], *, disable_lru_cache: bool) -> None:
    """The one place AC is written into a model's record: `apply_ac`'s, and a recipe's that wraps by hand the way
    its era did (`remove_ac` reads it back)."""
    rec.ac, rec.ac_wrapped = cfg, list(wrapped)
    if disable_lru_cache:
        rec.disable_lru_cache = True


def remove_ac(model: nn.Module) -> nn.Module:
    """Undo `apply_ac`: unwrap every CheckpointWrapper and drop the settings it recorded."""
    rec = applied(model)
    if rec.empty:
        return model
    if rec.compile is not None:
        raise RuntimeError(
            "call toolkit.transforms.remove_compile(model) before remove_ac(model): compiled code may hold the"
            " wrappers."
        )
    if rec.ac_patched:
        _undo(model, rec, [("patched", name) for name in rec.ac_patched])
    else:
        _undo(model, rec, [("wrapped", name) for name in rec.ac_wrapped])
    rec.functorch_config.pop("activation_memory_budget", None)
    rec.ac, rec.ac_wrapped, rec.ac_patched, rec.disable_lru_cache = None, [], [], False
    forget(model)
    return model


def _undo(model: nn.Module, rec: Applied, undo: list[tuple[str, str]]) -> None:
    """Reverse the changes `_apply` recorded, last first."""
    from .remat import remove_remat

    for what, name in reversed(undo):
        if what == "wrapped":
            parent, attr, occupant = get_slot(model, name)
            parent.register_module(attr, unwrap(occupant))
        elif what == "patched":
            remove_remat(get_module(model, name))
        elif what == "budget":
            rec.functorch_config.pop("activation_memory_budget", None)
    rec.ac_patched = []


def ac_region_of(model: nn.Module, name: str) -> str | None:
    """The AC-wrapped module (canonical name) whose region contains `name` strictly, if any."""
    for w in applied(model).ac_wrapped:
        if inside(name, w):
            return w
    return None


__all__ = [
    "ACConfig",
    "ACMode",
    "MODES",
    "NoAC",
    "Checkpointing",
    "FullAC",
    "PolicyDictAC",
    "PerOpPolicy",
    "SelectiveOpAC",
    "SelectiveLayerAC",
    "PerSubmoduleAC",
    "CustomAC",
    "MemoryBudgetAC",
    "RematAC",
    "apply_ac",
    "remove_ac",
    "blocks",
    "op_from_name",
    "ops_of",
]
