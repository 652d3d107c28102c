"""A scenario's model, batch and loss built, and its transforms applied, by its stack's own code (`toolkit.stacks`)."""

from __future__ import annotations

from typing import Callable

from torch import nn

from .._config import ConfigError
from ..measurement.scenario import Scenario
from ..stacks import Built


def check_ranks_for_ep(ep: int) -> None:
    """Expert parallel needs a process group of `ep` ranks (or a multiple): refused before anything is built."""
    import torch.distributed as dist

    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if world % ep:
        raise ConfigError(
            "Scenario",
            "ep",
            f"ep={ep} needs {ep} ranks; this process has {world}.",
            f"run it with tk.run_distributed(scenario, nproc={ep}) or `python -m toolkit run --nproc {ep}`.",
        )


def build(scenario: Scenario, *, sharded: bool) -> Built:
    """The model, batch and loss; `sharded=False` builds the unsharded reference (no EP sharding config)."""
    return scenario.stack_impl.build(scenario, sharded=sharded)


def transform(scenario: Scenario, model: nn.Module, stage: Callable[[str], None]) -> dict[str, str]:
    """AC, compile (or a recipe), then FSDP, by the stack's own code in its own order; returns the compile orders
    (compile(AC(x)) / AC(compile(x))) per compile target."""
    return scenario.stack_impl.transform(scenario, model, stage)
