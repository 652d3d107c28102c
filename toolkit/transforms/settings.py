"""Global torch state: the settings a model's step needs, applied and restored by `torch_settings`, and a snapshot.

What the transforms did to the model (`applied`) says which settings; `global_state()` is the snapshot the tests
compare before and after a measurement.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch import nn

from .. import compat
from .._config import ConfigError
from ..models import local_compile
from .record import Applied, applied


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
