"""`apply_compile(model, CompileConfig)`: torch.compile on a chosen scope, its order relative to AC made explicit."""

from __future__ import annotations

import dataclasses
import re
import typing
import warnings
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Literal, cast

import torch
from torch import nn

from .. import compat
from .._config import ConfigError, PlainData, check_bool, check_choice, check_known, refuse_callables, to_dict
from ..models.moe import EXPERTS_ATTRS, experts_attr
from .ac import ac_region_of
from .containers import block_container, blocks
from .naming import get_slot, has_compiled, is_checkpoint_wrapper, named_modules, unwrap, within, wrapped_child
from .record import applied, forget, record
from .settings import check_memory_budget

Scope = Literal["none", "model", "blocks", "attention", "moe", "experts", "router", "shared_experts", "feed_forward"]
SCOPES: tuple[str, ...] = typing.get_args(Scope)
BACKENDS: tuple[str, ...] = ("eager", "aot_eager", "aot_eager_decomp_partition", "inductor")
COMPILE_OUTSIDE, AC_OUTSIDE = "compile(AC(x))", "AC(compile(x))"


@dataclass(frozen=True, kw_only=True)
class CompileConfig(PlainData):
    """What to compile and how."""

    RECORD_EXAMPLE: ClassVar[str] = '{"scope": "blocks", "backend": "aot_eager"}'

    scope: Scope | tuple[str, ...] = "none"
    """"none", "model", "blocks" (each `layers.i`), "attention", "moe", "experts" (`moe.routed_experts`, or the
    2025 layout's `moe.experts`), "router", "shared_experts", "feed_forward" (each such submodule of every block
    that has one), or a tuple of canonical module names."""
    backend: str | Callable = "aot_eager"
    """"eager", "aot_eager" (AOTAutograd's partition without code generation, ~1 s per graph on CPU: it saves
    what inductor saves under full AC and SAC, but not always without AC — 750336 vs 783104 B on one model),
    "aot_eager_decomp_partition", "inductor", or a backend callable."""
    fullgraph: bool = False
    """Error on a graph break instead of splitting the graph (in torch 2.13 it also captures `.tolist()`)."""
    dynamic: bool | None = None
    """torch.compile's `dynamic`: None (automatic), True or False."""
    capture_scalar_outputs: bool = False
    """Dynamo config: trace `.item()`/`.tolist()` into the graph instead of breaking (torchtitan sets it)."""
    capture_dynamic_output_shape_ops: bool = False
    """Dynamo config: trace ops like `nonzero`/`bincount` whose output shape depends on data."""
    skip_fwd_side_effects_in_bwd_under_checkpoint: bool = False
    """Dynamo config torchtitan sets: accept that a compiled backward does not replay forward side effects."""
    order: Literal["compile_outside", "ac_outside"] | None = None
    """Where a compile target meets an AC wrapper: "compile_outside" = compile(AC(x)) (torchtitan's order),
    "ac_outside" = AC(compile(x)). None takes what the scope implies (compile(AC(x)) where both are possible);
    an explicit value the structure cannot give is an error."""
    method: Literal["module_compile", "torch_compile", "forward"] = "module_compile"
    """"module_compile": in-place `Module.compile()` (type and names unchanged, torchtitan since PR #2688);
    "torch_compile": replace the module by `torch.compile(module)` (an OptimizedModule wrapper); "forward":
    compile the module's `forward` as a function, set on the instance (torchtitan main's `@local_compile`
    functions; the module's call and hooks stay eager — and on torch 2.13 a bare builtin module such as
    `nn.RMSNorm` compiles this way where `Module.compile(fullgraph=True)` finds no frame, C26)."""
    inductor_options: tuple[tuple[str, Any], ...] = ()
    """Inductor config overrides passed as torch.compile `options` (inductor backend only); a dict is accepted."""
    functions: tuple[str, ...] = ()
    """The model's functions to compile on their own, by name, as torchtitan main's `@local_compile` regions
    (`LocalCompileConfig.regions`): "swiglu" (every SwiGLU activation, with main's 16 recompiles), "cos_sin_rope"
    (RoPE), "loss". Each becomes `torch.compile(fn, fullgraph=True, backend=...)`; needs fullgraph=True (main
    refuses False) and may go with scope="none" (main's trainer compiles nothing else). Process-wide while
    applied, as main binds them, until `remove_compile`."""
    name_regions: bool = False
    """Pass each target's canonical name as torch.compile's `name` (where torch has it), so SAC policies and
    logs can tell compiled regions apart. Off by default: under inductor on torch 2.13 a distinct name per
    block makes identical blocks compile one graph each instead of sharing one (measured: 2 graphs vs 1)."""

    def __post_init__(self) -> None:
        own = "CompileConfig"
        if isinstance(self.scope, str):
            check_choice(own, "scope", self.scope, SCOPES)
        elif isinstance(self.scope, (tuple, list)):
            if not self.scope or not all(isinstance(s, str) for s in self.scope):
                raise ConfigError(
                    own,
                    "scope",
                    f"{self.scope!r} is not a non-empty tuple of module names.",
                    "pass e.g. ('layers.0.moe.routed_experts',) or a named scope like 'blocks'.",
                )
            object.__setattr__(self, "scope", tuple(self.scope))
        else:
            raise ConfigError(
                own,
                "scope",
                f"{self.scope!r} has the wrong type.",
                f"pass one of {', '.join(SCOPES)} or a tuple of module names.",
            )
        if isinstance(self.backend, str):
            check_choice(own, "backend", self.backend, BACKENDS)
        elif not callable(self.backend):
            raise ConfigError(
                own,
                "backend",
                f"{self.backend!r} is neither a backend name nor callable.",
                f"pass one of {', '.join(BACKENDS)}.",
            )
        if not (self.dynamic is None or isinstance(self.dynamic, bool)):  # 0 == False, but 0 is not a bool
            raise ConfigError(own, "dynamic", f"{self.dynamic!r} is not None/True/False.", "pass None, True or False.")
        for name in (
            "fullgraph",
            "capture_scalar_outputs",
            "capture_dynamic_output_shape_ops",
            "skip_fwd_side_effects_in_bwd_under_checkpoint",
            "name_regions",
        ):
            check_bool(own, name, getattr(self, name))
        check_choice(own, "order", self.order, (None, "compile_outside", "ac_outside"))
        check_choice(own, "method", self.method, ("module_compile", "torch_compile", "forward"))
        object.__setattr__(self, "inductor_options", _options(self.inductor_options))
        self._check_functions()
        if self.inductor_options and self.backend != "inductor":
            raise ConfigError(
                own,
                "inductor_options",
                f"options only apply to the inductor backend, not {self.backend!r}.",
                "use backend='inductor' or drop inductor_options.",
            )
        if not self.enabled:
            # Nothing is compiled, so a backend, fullgraph or any other option would be silently ignored.
            default = _DEFAULT_FIELDS
            for name, value in ((f.name, getattr(self, f.name)) for f in dataclasses.fields(self)):
                if name not in ("scope", "functions") and value != default[name]:
                    raise ConfigError(
                        own,
                        name,
                        f"{name}={value!r} means nothing with scope='none' and no functions: nothing is compiled.",
                        "pass a scope (e.g. scope='blocks') or functions, or drop it "
                        "(CompileConfig.of(scope, **options) drops the options when scope is 'none').",
                    )

    def _check_functions(self) -> None:
        from ..models import local_compile

        own, fns = "CompileConfig", self.functions
        if isinstance(fns, str) or not isinstance(fns, (tuple, list)) or not all(isinstance(f, str) for f in fns):
            raise ConfigError(
                own,
                "functions",
                f"{fns!r} is not a tuple of function names.",
                f"pass e.g. ('swiglu', 'cos_sin_rope', 'loss') from {', '.join(local_compile.names())}.",
            )
        unknown = [f for f in fns if f not in local_compile.names()]
        if unknown:
            raise ConfigError(
                own,
                "functions",
                f"{unknown} name no local compile function of the toolkit's models.",
                f"use names from {', '.join(local_compile.names())}.",
            )
        if fns and not self.fullgraph:
            raise ConfigError(
                own,
                "fullgraph",
                "local compile functions are compiled whole: torchtitan main's local_compile refuses fullgraph=False.",
                "pass fullgraph=True.",
            )
        object.__setattr__(self, "functions", tuple(fns))

    @classmethod
    def of(cls, scope: Any, **options: Any) -> "CompileConfig":
        """The config compiling `scope` with `options`, or the default config when `scope` is "none" (nothing is
        compiled, so the options would mean nothing): what a control or a matrix cell with a scope axis needs."""
        return cls() if scope == "none" else cls(scope=scope, **options)

    @property
    def enabled(self) -> bool:
        return self.scope != "none" or bool(self.functions)

    @property
    def backend_name(self) -> str:
        return self.backend if isinstance(self.backend, str) else getattr(self.backend, "__name__", "custom")

    def _record(self) -> dict[str, Any]:
        return to_dict(self) | {"inductor_options": dict(self.inductor_options)}

    @classmethod
    def _from_record(cls, data: dict[str, Any]) -> CompileConfig:
        check_known(cls, data)
        refuse_callables(cls, data)
        for key in ("scope", "functions"):
            if isinstance(data.get(key), list):
                data[key] = tuple(data[key])
        if isinstance(data.get("inductor_options"), dict):
            data["inductor_options"] = tuple(sorted(data["inductor_options"].items()))
        return cls(**data)


def _options(opts: Any) -> tuple[tuple[str, Any], ...]:
    """`inductor_options` as sorted `(name, value)` pairs: a dict of option names, or pairs already."""
    if isinstance(opts, dict):
        opts = tuple(sorted(opts.items()))
    pairs = opts if isinstance(opts, (tuple, list)) else None
    if pairs is None or not all(
        isinstance(kv, (tuple, list)) and len(kv) == 2 and isinstance(kv[0], str) and kv[0] for kv in pairs
    ):
        raise ConfigError(
            "CompileConfig",
            "inductor_options",
            f"{opts!r} is not a dict of inductor config names to values.",
            'pass e.g. {"max_autotune": True} (JSON: "inductor_options": {"max_autotune": true}).',
        )
    return tuple((k, v) for k, v in pairs)


_DEFAULT_FIELDS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(CompileConfig)}


def check_ac_compile(ac, cfg: CompileConfig) -> None:
    """The AC settings that need compile: refuse a pairing that cannot work, before anything is built or run."""
    if ac is None:
        return
    if ac.mode == "none" and cfg.enabled and cfg.order is not None:
        raise ConfigError(
            "CompileConfig",
            "order",
            f"{cfg.order!r} places compile around or inside AC, and AC is 'none': it would be ignored.",
            "drop order (order=None), or pass an AC mode.",
        )
    check_memory_budget(ac, cfg.enabled)
    if ac.mode == "remat" and cfg.enabled:
        # The scopes that compile a whole block or more (`layers.N`, `layers`, the model), not a part of one.
        outside = cfg.scope in ("model", "blocks") or (
            isinstance(cfg.scope, tuple) and any(re.fullmatch(r"|layers|layers\.[^.]+", s) for s in cfg.scope)
        )
        if outside and ac.preserve_rng_state:
            raise ConfigError(
                "ACConfig",
                "preserve_rng_state",
                "under compile, torch_remat refuses "
                "recompute_state_hooks ('not supported under torch.compile'), and scope "
                f"{cfg.scope!r} compiles the remat checkpoints themselves.",
                "use preserve_rng_state=False, or compile inside the blocks (e.g. scope='attention').",
            )
        if outside and cfg.order == "ac_outside":
            raise ConfigError(
                "CompileConfig",
                "order",
                "torch_remat replaces the block's forward instead of wrapping "
                "it, so a compiled block always compiles its remat checkpoint: compile(AC(x)) only.",
                "pass order=None or 'compile_outside', or compile inside the blocks (scope='attention', "
                "'moe', …), torchtitan main's way.",
            )
    if getattr(ac, "wrap_inductor_compiled_regions", False) and cfg.enabled and cfg.backend != "inductor":
        raise ConfigError(
            "ACConfig",
            "wrap_inductor_compiled_regions",
            f"only inductor makes compiled regions, not backend={cfg.backend_name!r}.",
            "use CompileConfig(backend='inductor') or leave it False.",
        )


def resolve_scope(model: nn.Module, scope: Scope | tuple[str, ...]) -> list[str]:
    """Canonical names of the modules a scope compiles (the root model is "")."""
    if scope == "none":
        return []
    if scope == "model":
        return [""]
    if isinstance(scope, tuple):
        known = {n for n, _ in named_modules(model)}
        for name in scope:
            if name not in known:
                close = sorted(k for k in known if k and (name.split(".")[-1] in k))[:5]
                raise ConfigError(
                    "CompileConfig",
                    "scope",
                    f"no module named {name!r} in the model.",
                    f"use canonical names such as {', '.join(close) or 'layers.0.attention'}.",
                )
        return list(scope)
    names = []
    prefix = block_container(model)[0]
    for key, block in blocks(model):
        base = f"{prefix}.{key}"
        if scope == "blocks":
            names.append(base)
        elif scope in ("attention", "feed_forward", "moe"):
            if isinstance(getattr(block, scope, None), nn.Module):
                names.append(f"{base}.{scope}")
        else:  # experts, router, shared_experts live under moe
            moe = getattr(block, "moe", None)
            # "experts" are torchtitan 0.3.0's `routed_experts` (dispatch + inner experts), or 2025's `experts`.
            child = next(
                (
                    c
                    for c in ((scope,) if scope != "experts" else EXPERTS_ATTRS)
                    if isinstance(moe, nn.Module) and isinstance(getattr(unwrap(moe), c, None), nn.Module)
                ),
                None,
            )
            if child is not None:
                names.append(f"{base}.moe.{child}")
    if not names:
        raise ConfigError(
            "CompileConfig",
            "scope",
            f"scope {scope!r} matches no module of this model.",
            "pick a scope the model has (dense models have no 'moe'/'experts'; all-MoE models no 'feed_forward').",
        )
    return names


def _covers(target: str, name: str) -> bool:
    return within(name, target)


def _check_grouped_mm(model: nn.Module, targets: list[str]) -> None:
    """The 2025 layout runs `_grouped_mm` in the model's dtype: compiling it in float32 on CPU fails (C14) where the
    kernel's meta function refuses float32 (torch 2.13 and 2.14; 2.15 accepts it). (torchtitan 0.3.0, and the
    toolkit's 0.3.0 layout, cast to bfloat16 inside the experts for exactly this.)"""
    from ..models import ModelConfig

    cfg = getattr(unwrap(model), "config", None)
    if not isinstance(cfg, ModelConfig) or not cfg.experts_untraceable or cfg.device_type not in ("cpu", "meta"):
        return
    for i in cfg.moe_layer_ids:
        experts = f"layers.{i}.moe.{experts_attr(cfg.layout)}"
        hit = next((t for t in targets if _covers(t, experts)), None)
        if hit is not None:
            raise ConfigError(
                "CompileConfig",
                "scope",
                f"compiling {hit or 'the model'!r} traces {experts}, whose torch._grouped_mm meta kernel accepts no "
                f"{cfg.dtype} on torch {torch.__version__} ('Expected inputs of BF16 type', C14; 2.15 does).",
                "use ModelConfig(dtype='bfloat16'), layout='torchtitan_0_3_0' (bfloat16 experts), "
                "another experts_impl, or a scope that leaves the experts eager.",
            )


def _check_order(model: nn.Module, cfg: CompileConfig, targets: list[str]) -> dict[str, str]:
    """Work out compile(AC(x)) vs AC(compile(x)) per target, refusing an explicit order the structure cannot give."""
    rec = applied(model)
    orders: dict[str, str] = {}
    for t in targets:
        region = ac_region_of(model, t) if t else None
        inner_wrappers = [w for w in rec.ac_wrapped if w != t and _covers(t, w)]
        own_wrapper = t in rec.ac_wrapped
        if region is not None:
            if cfg.order == "compile_outside":
                raise ConfigError(
                    "CompileConfig",
                    "order",
                    f"{t!r} lies inside the checkpointed {region!r}, so it can only be AC(compile(x)).",
                    f"pass order='ac_outside' (or None), or compile {region!r} itself (e.g. scope='blocks').",
                )
            orders[t] = AC_OUTSIDE
        elif own_wrapper:
            orders[t] = AC_OUTSIDE if cfg.order == "ac_outside" else COMPILE_OUTSIDE
        elif inner_wrappers:
            if cfg.order == "ac_outside":
                raise ConfigError(
                    "CompileConfig",
                    "order",
                    f"{t or 'the model'!r} contains checkpointed modules "
                    f"({', '.join(inner_wrappers[:3])}), so it can only be compile(AC(x)).",
                    "pass order='compile_outside' (or None), or compile the checkpointed modules "
                    "themselves with order='ac_outside'.",
                )
            orders[t] = COMPILE_OUTSIDE
    return orders


def _compile_kwargs(cfg: CompileConfig, model: nn.Module, name: str) -> dict[str, Any]:
    kwargs: dict[str, Any] = dict(backend=cfg.backend, fullgraph=cfg.fullgraph, dynamic=cfg.dynamic)
    options = dict(cfg.inductor_options)
    ac = applied(model).ac
    if cfg.backend == "inductor" and getattr(ac, "wrap_inductor_compiled_regions", False):
        options.setdefault("wrap_inductor_compiled_regions", True)
    if options:
        kwargs["options"] = options
    if cfg.name_regions and compat.compile_signature_has("name"):
        kwargs["name"] = name or "model"
    return kwargs


def apply_compile(model: nn.Module, cfg: CompileConfig) -> nn.Module:
    """Compile `cfg.scope` of `model` in place (FQNs unchanged). Refuses to compile twice."""
    if not isinstance(cfg, CompileConfig):
        raise TypeError(f"apply_compile needs a CompileConfig, got {type(cfg).__name__}")
    rec = applied(model)
    if rec.compile is not None or has_compiled(model):
        raise RuntimeError("this model is already compiled; call toolkit.transforms.remove_compile(model) first.")
    check_ac_compile(rec.ac, cfg)
    targets = resolve_scope(model, cfg.scope)
    _check_grouped_mm(model, targets)
    orders = _check_order(model, cfg, targets)
    if "" in targets and cfg.method != "module_compile":
        raise ConfigError(
            "CompileConfig",
            "method",
            f"scope='model' with {cfg.method!r} would not compile the model in place.",
            "use method='module_compile' for the whole model.",
        )
    _warn_inert_regions(model, targets, orders)
    _warn_nested(targets)
    undo: list[tuple[str, Any]] = []  # what `remove_compile` reverses, per kind (`Applied.compile_undo`)
    functions = {}
    if cfg.functions:
        from ..models import local_compile

        kwargs = {k: v for k, v in _compile_kwargs(cfg, model, "").items() if k not in ("fullgraph", "name")}
        functions = local_compile.compile_functions(cfg.functions, **kwargs)
    for t in targets:
        kwargs = _compile_kwargs(cfg, model, t)
        if t == "":
            obj = model
        else:
            parent, attr, occupant = get_slot(model, t)
            obj = occupant
            if is_checkpoint_wrapper(occupant) and orders.get(t) == AC_OUTSIDE:
                parent, attr, obj = occupant, "_checkpoint_wrapped_module", wrapped_child(occupant)
        if cfg.method == "module_compile":
            obj.compile(**kwargs)
            undo.append(("module", obj))
        elif cfg.method == "forward":
            previous = obj.__dict__.get("forward")
            obj.forward = torch.compile(obj.forward, **kwargs)
            undo.append(("forward", (obj, previous)))
        else:
            # torch.compile of a Module returns an OptimizedModule (a Module); its stub says Callable.
            parent.register_module(attr, cast(nn.Module, torch.compile(obj, **kwargs)))
            undo.append(("wrapper", (parent, attr, obj)))
    record_compile(record(model), cfg, targets + [f"{f}()" for f in cfg.functions], orders, undo, functions)
    return model


def record_compile(
    rec: Any,
    cfg: CompileConfig,
    targets: list[str],
    orders: dict[str, str],
    undo: list,
    functions: dict[str, Any] | None = None,
) -> None:
    """The one place compile is written into a model's record (`rec`, an `Applied`): `apply_compile`'s, and a
    recipe's that compiles by hand the way its era did. `undo` is what `remove_compile` reverses; `orders` maps a
    target touching an AC region to `COMPILE_OUTSIDE` or `AC_OUTSIDE`; `functions`, the model's compiled local
    functions (`torch_settings` binds them while its steps run)."""
    record_dynamo_settings(rec, cfg)
    rec.compile, rec.compiled, rec.compile_orders, rec.compile_undo = cfg, list(targets), dict(orders), list(undo)
    rec.local_compiled = dict(functions or {})


def _warn_inert_regions(model: nn.Module, targets: list[str], orders: dict[str, str]) -> None:
    """Compiling a module inside an eager torch_remat checkpoint turns the kept regions inside it into plain calls
    (`torch_remat._compile.compiled_region` passes through outside a compiled checkpoint): they are recomputed like
    the rest. Measured, not guessed: say it where the user will look (a Report's warnings)."""
    rec = applied(model)
    if rec.ac is None or rec.ac.mode != "remat":
        return
    from .remat import kept

    inert = []
    for t in targets:
        block = ac_region_of(model, t) if t else None
        if block is None or orders.get(t) != AC_OUTSIDE:
            continue
        sub = t[len(block) + 1 :]
        module = get_slot(model, t)[2]
        for fqn, m in unwrap(module).named_modules():
            own = getattr(m, "remat_regions", None)
            rel = f"{sub}.{fqn}" if fqn else sub
            for name in own(rel) if callable(own) else []:
                if kept(name, rec.ac.save_regions, rec.ac.recompute_regions):
                    inert.append(f"{block}.{name}")
    if inert:
        warnings.warn(
            f"compiling inside torch_remat checkpoints makes the kept regions {', '.join(inert[:6])}"
            f"{' …' if len(inert) > 6 else ''} plain calls: under compile torch_remat honours "
            "recompute=False only inside a compiled checkpoint, so they are recomputed (compile a module "
            "without kept regions, or the whole block)",
            stacklevel=3,
        )


def _warn_nested(targets: list[str]) -> None:
    """A target inside another target is never compiled on its own: Dynamo inlines it into the outer graph, keeping
    only its fullgraph flag (C76). Its settings are the outer's here (one CompileConfig), so nothing is lost but the
    region a user may think is separate: say so where the user will look."""
    inner = [t for t in targets if any(o != t and _covers(o, t) for o in targets)]
    if inner:
        warnings.warn(
            f"{', '.join(inner[:6])}{' …' if len(inner) > 6 else ''} "
            f"{'lies' if len(inner) == 1 else 'lie'} inside another compiled target: Dynamo inlines "
            f"{'it' if len(inner) == 1 else 'them'} into the outer graph and never compiles "
            f"{'it' if len(inner) == 1 else 'them'} on its own (known case C76); compile either the outer module "
            "or the inner ones",
            stacklevel=3,
        )


def record_dynamo_settings(rec, cfg: CompileConfig) -> None:
    """Note the Dynamo flags `cfg` asks for; `torch_settings` applies them while a step runs."""
    rec.dynamo_config.update(
        capture_scalar_outputs=cfg.capture_scalar_outputs,
        capture_dynamic_output_shape_ops=cfg.capture_dynamic_output_shape_ops,
    )
    if compat.dynamo_has_config("skip_fwd_side_effects_in_bwd_under_checkpoint"):
        rec.dynamo_config["skip_fwd_side_effects_in_bwd_under_checkpoint"] = (
            cfg.skip_fwd_side_effects_in_bwd_under_checkpoint
        )


def remove_compile(model: nn.Module) -> nn.Module:
    """Undo `apply_compile` (the compiled graphs stay in Dynamo's cache until `torch._dynamo.reset()`)."""
    rec = applied(model)
    if rec.empty:
        return model
    for kind, item in reversed(rec.compile_undo):
        if kind == "module":
            compat.clear_in_place_compile(item)
        elif kind == "forward":
            obj, previous = item
            if previous is None:
                obj.__dict__.pop("forward", None)
            else:
                obj.forward = previous
        else:
            parent, attr, obj = item
            parent.register_module(attr, obj)
    for key in (
        "capture_scalar_outputs",
        "capture_dynamic_output_shape_ops",
        "skip_fwd_side_effects_in_bwd_under_checkpoint",
    ):
        rec.dynamo_config.pop(key, None)
    rec.compile, rec.compiled, rec.compile_orders, rec.compile_undo, rec.local_compiled = None, [], {}, [], {}
    forget(model)
    return model


__all__ = ["CompileConfig", "apply_compile", "remove_compile", "resolve_scope", "SCOPES", "BACKENDS"]
