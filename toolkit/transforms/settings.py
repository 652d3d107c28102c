"""Global torch state: what the transforms did to a model, the settings a step needs, a snapshot.

Global torch state: the record of what the transforms did to a model, the settings a step needs (applied and restored by
`torch_settings`), and a snapshot for tests.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from torch import nn

from .. import compat
from .._config import ConfigError, check_bool, check_instance
from ..models import local_compile

_RECORD = "_toolkit_applied"


@dataclass
class Applied:
    """What `apply_ac` / `apply_compile` did to a model (kept on the model as `model._toolkit_applied`)."""

    ac: Any = None
    """The ACConfig applied, or None."""
    ac_wrapped: list[str] = field(default_factory=list)
    """Canonical names of the modules wrapped in a CheckpointWrapper, or given a torch_remat checkpoint `forward`
    (the blocks)."""
    ac_patched: list[str] = field(default_factory=list)
    """Canonical names of the modules whose `forward` torch_remat mode replaced: the blocks (their regions are
    declared in the model code and only configured)."""
    compile: Any = None
    """The CompileConfig applied, or None."""
    compiled: list[str] = field(default_factory=list)
    """Canonical names of the compile targets."""
    compile_orders: dict[str, str] = field(default_factory=dict)
    """Per compile target touching an AC region: 'compile(AC(x))' or 'AC(compile(x))'."""
    recipe: str | None = None
    """Name of the recipe that applied both, if any."""
    dynamo_config: dict[str, Any] = field(default_factory=dict)
    functorch_config: dict[str, Any] = field(default_factory=dict)
    inductor_config: dict[str, Any] = field(default_factory=dict)
    disable_lru_cache: bool = False
    fsdp: str = "none"
    """FSDP2 layout applied by `apply_fsdp` ("none", "blocks", "blocks+experts"); it cannot be undone."""
    compile_undo: list = field(default_factory=list, repr=False)
    """How to undo each compile target: ("module", obj) for in-place compile, ("wrapper", (parent, attr, obj))."""
    local_compiled: dict = field(default_factory=dict, repr=False)
    """This model's compiled local functions (`CompileConfig(functions=...)`), name → compiled function: bound while
    one of its steps runs (`torch_settings`), never for the process."""

    def copy(self) -> "Applied":
        return dataclasses.replace(
            self,
            ac_wrapped=list(self.ac_wrapped),
            ac_patched=list(self.ac_patched),
            compiled=list(self.compiled),
            compile_orders=dict(self.compile_orders),
            dynamo_config=dict(self.dynamo_config),
            functorch_config=dict(self.functorch_config),
            inductor_config=dict(self.inductor_config),
            compile_undo=list(self.compile_undo),
            local_compiled=dict(self.local_compiled),
        )

    @property
    def empty(self) -> bool:
        return self == Applied()


def applied(model: nn.Module) -> Applied:
    """The record of toolkit transforms on `model` (an empty record, not stored, if none were applied)."""
    rec = model.__dict__.get(_RECORD)
    return rec if rec is not None else Applied()


def record(model: nn.Module) -> Applied:
    """The record a transform writes into (created on the model the first time)."""
    rec = model.__dict__.get(_RECORD)
    if rec is None:
        rec = model.__dict__[_RECORD] = Applied()
    return rec


def forget(model: nn.Module) -> None:
    """Drop the record once every transform is undone, so the model is as it was built."""
    rec = model.__dict__.get(_RECORD)
    if rec is not None and rec.empty:
        del model.__dict__[_RECORD]


def check_memory_budget(ac: Any, compile_enabled: bool) -> None:
    """The one home of the rule "a memory budget needs compile"."""
    if ac is not None and ac.mode == "memory_budget" and not compile_enabled:
        raise ConfigError(
            "ACConfig",
            "mode",
            "'memory_budget' only shapes compiled graphs, and nothing is compiled.",
            "pass a CompileConfig with a scope (e.g. scope='blocks'), or another AC mode.",
        )


@contextlib.contextmanager
def torch_settings(model: nn.Module | None = None, **extra: Any) -> Iterator[None]:
    """Apply the global torch settings `model`'s transforms need for the duration of a step, then restore them.

    Dynamo, AOTAutograd and Inductor read their configs when a compiled function is first called, and the
    LRU switch is read on every call (the recompute in backward included), so forward *and* backward must
    run inside. `extra` may hold `dynamo_config=…`, `functorch_config=…`, `inductor_config=…` dicts.
    """
    rec = applied(model) if model is not None else Applied()
    check_memory_budget(rec.ac, bool(rec.compiled))
    dyn = {**rec.dynamo_config, **extra.get("dynamo_config", {})}
    fun = {**rec.functorch_config, **extra.get("functorch_config", {})}
    ind = {**rec.inductor_config, **extra.get("inductor_config", {})}
    dynamo_config, functorch_config, inductor_config = compat.compiler_configs()
    with contextlib.ExitStack() as stack:
        if dyn:
            stack.enter_context(dynamo_config.patch(**dyn))
        if fun:
            stack.enter_context(functorch_config.patch(**fun))
        if ind:
            stack.enter_context(inductor_config.patch(**ind))
        if rec.disable_lru_cache:
            entry = compat.lru_cache_enabled()
            stack.enter_context(compat.lru_cache_restored(entry))
            if entry:
                compat.set_lru_cache(False)
        if remat_stand_ins(model):
            stack.enter_context(compat.remat_placeholders())
        if rec.local_compiled:
            stack.enter_context(local_compile.bound_to(rec.local_compiled))
        yield


def remat_stand_ins(model: nn.Module | None) -> bool:
    """A step of `model` runs with torch_remat's placeholders stood in for: the toolkit's remat is applied to it and
    this build cannot make them (C31, `compat.remat_placeholders`; `torch_settings` enters it for the step)."""
    rec = applied(model) if model is not None else Applied()
    return rec.ac is not None and rec.ac.mode == "remat" and compat.remat_placeholders_needed()


def train_step(model: nn.Module, batch: Any, *, zero_grad: bool = True) -> torch.Tensor:
    """Forward, loss and backward under the torch settings the applied transforms need; returns the detached loss."""
    from ..models import Batch, ModelConfig, loss_fn
    from ..models.transformer import check_tokens

    check_instance("train_step", "model", model, nn.Module, "pass the model (tk.build_model(cfg)).")
    check_instance("train_step", "batch", batch, Batch, "pass tk.make_batch(cfg), a Batch of tokens and labels.")
    check_bool("train_step", "zero_grad", zero_grad)
    cfg = getattr(model, "config", None)
    if isinstance(cfg, ModelConfig) and isinstance(getattr(batch, "tokens", None), torch.Tensor):
        check_tokens(cfg, batch.tokens, "train_step")
    if zero_grad:
        model.zero_grad(set_to_none=True)
    with torch_settings(model):
        loss = loss_fn(model(batch.tokens), batch.labels)
        loss.backward()
    return loss.detach()


def global_state() -> dict[str, Any]:
    """A comparable snapshot of the global torch state the toolkit might touch (tests compare before/after)."""

    def shown(v: Any) -> str:
        # A set's repr follows its hash layout, which a save_config/load_config round trip (every measurement
        # restores the configs that way) can reorder: compare sets as sets. String hashes are salted per
        # process, so comparing reprs failed only in some processes.
        if isinstance(v, (set, frozenset)):
            return f"{type(v).__name__}({sorted(map(repr, v))})"
        return repr(v)

    def cfg(mod) -> dict[str, Any]:
        return {k: shown(v) for k, v in mod.get_config_copy().items()}

    dynamo_config, functorch_config, inductor_config = compat.compiler_configs()
    return {
        "dynamo": cfg(dynamo_config),
        "functorch": cfg(functorch_config),
        "inductor": cfg(inductor_config),
        "lru_cache": compat.lru_cache_enabled(),
        "checkpoint_early_stop": compat.checkpoint_early_stop(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "grad_enabled": torch.is_grad_enabled(),
        "default_dtype": str(torch.get_default_dtype()),
        "rng_state": torch.random.get_rng_state().sum().item(),
    }


def reset_compiler() -> None:
    """Forget every compiled graph (`torch._dynamo.reset()`), so the next call compiles afresh."""
    compat.reset_dynamo()
