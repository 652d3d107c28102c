"""The other stacks' grids: torchtitan's and transformers' models with their own transforms, and a model of yours.

`matrix --stack torchtitan|transformers` sweeps `GRIDS`; `matrix --model FILE.py:FUNCTION` sweeps `model_cells`. The
toolkit's own grid is `cells.quick_cells` / `cells.full_cells`. What each stack offers (its families, its AC modes) is
its module's in `stacks/`; which of them the matrix sweeps, and how, is here.
"""

from __future__ import annotations

from typing import Callable, Iterable

from .._config import ConfigError
from .blocks import block_of, user_block
from .cells import Cell, dedupe


def _torchtitan(backends: tuple[str, ...], quick: bool) -> list[Cell]:
    """Each family × its AC modes × eager or its compile (blocks whole, fullgraph) × without / with its FSDP2; the
    quick grid is the whole grid."""
    from ..stacks.torchtitan import FAMILIES

    cells: list[Cell] = []
    for backend in backends:
        for block in (block_of("torchtitan", family) for family in FAMILIES):
            for ac in ("none", "full", "selective_op"):
                for fsdp in ("none", "blocks"):
                    cells.append(Cell(block, ac, fsdp=fsdp))
                    cells.append(Cell(block, ac, "blocks", True, backend=backend, fsdp=fsdp))
    return cells


TRANSFORMERS_BLOCKS = ("hf:qwen3_moe", "hf:qwen3_moe:eager", "hf:mixtral", "hf:deepseek_v3", "hf:qwen3")
"""transformers' MoE families with their default grouped_mm experts, Qwen3-MoE with the `eager` expert loop too (a
data-dependent count, transformers#47467), and one dense family."""


def _transformers(backends: tuple[str, ...], quick: bool) -> list[Cell]:
    """Its models × its own AC × eager or its users' compiles (the whole model; each decoder layer, also with
    fullgraph). `quick`: Qwen3-MoE and Mixtral, full AC and none. The full grid also has full AC with `offload=True`
    ("full+offload": save_on_cpu around each checkpoint call)."""
    from ..stacks.transformers import AC_MODES

    blocks = ("hf:qwen3_moe", "hf:mixtral") if quick else TRANSFORMERS_BLOCKS
    acs = ("none", "full") if quick else (*AC_MODES, "full+offload")
    cells: list[Cell] = []
    for backend in backends:
        for block in blocks:
            for ac in acs:
                cells.append(Cell(block, ac))
                for scope, fullgraph in (("model", False), ("blocks", False), ("blocks", True)):
                    cells.append(Cell(block, ac, scope, fullgraph, backend=backend))
    return cells


GRIDS: dict[str, Callable[[tuple[str, ...], bool], list[Cell]]] = {
    "torchtitan": _torchtitan,
    "transformers": _transformers,
}
"""The stacks with models of their own that `matrix --stack NAME` sweeps beside the toolkit's: name → its grid
(backends, quick) → cells."""


def stack_cells(stack: str, backends: Iterable[str] = ("aot_eager",), *, quick: bool = False) -> list[Cell]:
    """Another stack's own grid (`GRIDS`): its models with its own transforms. Needs its package."""
    if stack == "user":
        raise ConfigError(
            "sweep", "stack", "'user' sweeps one model of yours.", "pass --model FILE.py:FUNCTION (or tk.sweep(build))."
        )
    return dedupe(GRIDS[stack](tuple(backends), quick))


def torchtitan_cells(backends: Iterable[str] = ("aot_eager",)) -> list[Cell]:
    """torchtitan's own models with its own transforms (`stack="torchtitan"`): each family × its AC modes × eager
    or its compile (blocks whole, fullgraph) × without / with its FSDP2. Needs torchtitan installed."""
    return stack_cells("torchtitan", backends)


def model_cells(
    build: str, blocks: str | None = None, backends: Iterable[str] = ("aot_eager",), *, quick: bool = False
) -> list[Cell]:
    """A user's own model (`matrix --model FILE.py:FUNCTION`, `stacks/user.py`): the toolkit's AC modes × eager, the
    whole model, or each block in both orders (where AC and the blocks meet) × `backends`, on the blocks `blocks`
    names (a class) or finds. `quick`: none and full AC."""
    from ..stacks.user import AC_MODES, UserModelConfig

    block, backends = user_block(UserModelConfig(build=build, blocks=blocks)), tuple(backends)
    cells: list[Cell] = []
    for ac in ("none", "full") if quick else AC_MODES:
        cells.append(Cell(block, ac))
        for backend in backends:
            cells.append(Cell(block, ac, "model", backend=backend))
            for order in (None,) if ac == "none" else ("compile_outside", "ac_outside"):
                cells.append(Cell(block, ac, "blocks", order=order, backend=backend))
    return dedupe(cells)


__all__ = ["GRIDS", "TRANSFORMERS_BLOCKS", "model_cells", "stack_cells", "torchtitan_cells"]
