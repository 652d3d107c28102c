"""Global torch state: what the transforms need while a step runs (applied and restored by `torch_settings`), and a snapshot for tests."""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from torch import nn

# torch exposes a setter but no getter for the Dynamo LRU cache switch; we track what we set (default on).
_lru_enabled = True


def set_dynamo_lru_cache(enabled: bool) -> None:
    """Turn Dynamo's most-recently-used cache-entry preference on/off (torchtitan turns it off under AC, C8)."""
    global _lru_enabled
    torch._C._dynamo.eval_frame._set_lru_cache(bool(enabled))
    _lru_enabled = bool(enabled)


def dynamo_lru_cache_enabled() -> bool:
    return _lru_enabled


@dataclass
class Applied:
    """What `apply_ac` / `apply_compile` did to a model (kept on the model as `model._toolkit_applied`)."""

    ac: Any = None
    """The ACConfig applied, or None."""
    ac_wrapped: list[str] = field(default_factory=list)
    """Canonical names of the modules wrapped in a CheckpointWrapper, with the wrapper's kind."""
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

    def copy(self) -> "Applied":
        return dataclasses.replace(self, ac_wrapped=list(self.ac_wrapped), compiled=list(self.compiled),
                                   compile_orders=dict(self.compile_orders), dynamo_config=dict(self.dynamo_config),
                                   functorch_config=dict(self.functorch_config),
                                   inductor_config=dict(self.inductor_config))


def applied(model: nn.Module) -> Applied:
    """The record of transforms on `model` (an empty record if none were applied)."""
    rec = model.__dict__.get("_toolkit_applied")
    if rec is None:
        rec = Applied()
        model.__dict__["_toolkit_applied"] = rec
    return rec


@contextlib.contextmanager
def torch_settings(model: nn.Module | None = None, **extra: Any) -> Iterator[None]:
    """Apply the global torch settings `model`'s transforms need for the duration of a step, then restore them.

    Dynamo, AOTAutograd and Inductor read their configs when a compiled function is first called, and the
    LRU switch is read on every call (the recompute in backward included), so forward *and* backward must
    run inside. `extra` may hold `dynamo_config=…`, `functorch_config=…`, `inductor_config=…` dicts.
    """
    rec = applied(model) if model is not None else Applied()
    if rec.ac is not None and rec.ac.mode == "memory_budget" and not rec.compiled:
        from ._config import ConfigError

        raise ConfigError("ACConfig", "mode", "'memory_budget' only shapes compiled graphs, and nothing is compiled.",
                          "apply_compile(model, CompileConfig(scope='blocks', ...)) or pick another AC mode.")
    dyn = {**rec.dynamo_config, **extra.get("dynamo_config", {})}
    fun = {**rec.functorch_config, **extra.get("functorch_config", {})}
    ind = {**rec.inductor_config, **extra.get("inductor_config", {})}
    with contextlib.ExitStack() as stack:
        if dyn:
            stack.enter_context(torch._dynamo.config.patch(**dyn))
        if fun:
            stack.enter_context(torch._functorch.config.patch(**fun))
        if ind:
            import torch._inductor.config as inductor_config

            stack.enter_context(inductor_config.patch(**ind))
        if rec.disable_lru_cache and _lru_enabled:
            set_dynamo_lru_cache(False)
            stack.callback(set_dynamo_lru_cache, True)
        yield


def global_state() -> dict[str, Any]:
    """A comparable snapshot of the global torch state the toolkit might touch (tests compare before/after)."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    import torch.utils.checkpoint as ckpt

    def cfg(mod) -> dict[str, Any]:
        return {k: repr(v) for k, v in mod.get_config_copy().items()}

    return {
        "dynamo": cfg(torch._dynamo.config),
        "functorch": cfg(functorch_config),
        "inductor": cfg(inductor_config),
        "lru_cache": _lru_enabled,
        "checkpoint_early_stop": ckpt._enable_checkpoint_early_stop,
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "grad_enabled": torch.is_grad_enabled(),
        "default_dtype": str(torch.get_default_dtype()),
        "rng_state": torch.random.get_rng_state().sum().item(),
    }


def reset_compiler() -> None:
    """Forget every compiled graph (`torch._dynamo.reset()`), so the next call compiles afresh."""
    torch._dynamo.reset()
