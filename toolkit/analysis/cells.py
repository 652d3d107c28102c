"""The matrix's grid: its cells (block × AC × scope × order × backend, recipes), their scenarios and keys.

The matrix's grid: one cell per block kind × AC mode × compile scope × order × backend (and the recipes), what `run`
measures for each, and its cache key. The other stacks' grids are `grids.py`'s, and their blocks' names `blocks.py`'s.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, cast

import torch

from .. import _migrations, compat
from .._config import ConfigError
from ..measurement import Scenario, check_structure
from ..models import ModelConfig
from ..stacks import get
from ..transforms import ACConfig, CompileConfig
from ..transforms.recipes import RECIPES
from .blocks import config_of, stack_of

if TYPE_CHECKING:
    from ..models.config import ExpertsImpl

BLOCKS = ("dense", "moe:for_loop", "moe:grouped_mm", "moe:masked", "moe:nonzero")
# The torch_remat AC modes of a cell: "remat" (full recompute, routing kept) and torchtitan main's selective policy.
REMAT_ACS = ("remat", "remat_selective")
# Randomness under recompute: the dense model with residual dropout, and the AC setups that restore the RNG for the
# recompute or do not ("_no_rng": preserve_rng_state=False; "remat" is torch_remat's own default, False;
# "remat_rng": the toolkit's RecomputeStateHook restoring it).
DROPOUT_BLOCK = "dense:dropout"
OFFLOAD = "+offload"
"""A cell's `ac` suffix: the mode with offload=True ("full+offload")."""
RANDOM_ACS = ("none", "full", "full_no_rng", "selective_op", "memory_budget", "remat", "remat_rng")


@dataclass(frozen=True)
class Cell:
    """One point of the matrix; `scenario()` turns it into something `run` measures."""

    block: str = "moe:for_loop"
    ac: str = "none"
    scope: str = "none"
    fullgraph: bool = False
    order: str | None = None
    backend: str = "aot_eager"
    recipe: str | None = None
    fsdp: str = "none"
    """FSDP2 (`Scenario.fsdp`): "none", "blocks" or "blocks+experts", on one gloo rank."""
    bare: bool = False
    """The same cell run bare, with none of the toolkit's probes (`Scenario.instrument=False`): the sweep reruns every
    failing cell so, to tell a failure of the stack from one the instrument caused."""

    @property
    def stack(self) -> str:
        """Whose model and transforms: the stack whose block prefix this is (`titan:FAMILY` → "torchtitan",
        `hf:FAMILY[:EXPERTS]` → "transformers"), else "toolkit"."""
        return stack_of(self.block)

    def model_config(self) -> ModelConfig:
        """The block kind's model; a recipe cell's as the recipe needs it (`Recipe.model_config`)."""
        # Else a "moe:IMPL" block: ModelConfig checks IMPL.
        model = (
            ModelConfig(moe_layers="none")
            if self.block == "dense"
            else ModelConfig(moe_layers="none", residual_dropout=0.1)
            if self.block == DROPOUT_BLOCK
            else ModelConfig(experts_impl=cast("ExpertsImpl", self.block.split(":", 1)[1]))
        )
        return RECIPES[self.recipe].model_config(model, fsdp=self.fsdp) if self.recipe else model

    def scenario(self) -> Scenario:
        if self.bare:
            return (
                dataclasses.replace(self, bare=False)
                .scenario()
                .replace(name=self.label, instrument=False, measure_memory=False, steady_steps=0)
            )
        common: dict[str, Any] = dict(name=self.label, steady_steps=1, fsdp=self.fsdp)
        # "MODE+offload": the mode with each checkpoint call inside save_on_cpu (transformers' offload=True).
        mode, offload = self.ac.removesuffix(OFFLOAD), self.ac.endswith(OFFLOAD)
        if self.stack != "toolkit":  # another stack's own model, its own AC modes and compile
            comp = CompileConfig.of(self.scope, backend=self.backend, fullgraph=self.fullgraph, order=self.order)
            ac = ACConfig.of(mode=mode, memory_budget=0.3) if mode == "memory_budget" else ACConfig.of(mode=mode)
            return Scenario(
                stack=self.stack,
                **{get(self.stack).config_field: config_of(self.block)},
                ac=ac.replace(offload=True) if offload else ac,
                compile=comp,
                **common,
            )
        if self.recipe:
            return Scenario(model=self.model_config(), recipe=self.recipe, recipe_backend=self.backend, **common)
        ac = (
            ACConfig.of(mode=mode, memory_budget=0.3)
            if mode == "memory_budget"
            else ACConfig.remat_selective()
            if mode == "remat_selective"
            else ACConfig.of(mode="full", preserve_rng_state=False)
            if mode == "full_no_rng"
            else ACConfig.of(mode="remat", preserve_rng_state=True)
            if mode == "remat_rng"
            else ACConfig.of(mode=mode)
        )
        ac = ac.replace(offload=True) if offload else ac
        comp = CompileConfig.of(self.scope, backend=self.backend, fullgraph=self.fullgraph, order=self.order)
        return Scenario(model=self.model_config(), ac=ac, compile=comp, **common)

    @property
    def compile_label(self) -> str:
        sharded = f" + FSDP {self.fsdp}" if self.fsdp != "none" else ""
        if self.recipe:
            return f"recipe {self.recipe}{sharded}"
        if self.scope == "none":
            return "eager" + sharded
        extra = [
            x for x in ("fullgraph" if self.fullgraph else "", "AC outside" if self.order == "ac_outside" else "") if x
        ]
        return self.scope + (f" ({', '.join(extra)})" if extra else "") + sharded

    @property
    def label(self) -> str:
        bare = " | bare" if self.bare else ""
        if self.recipe:
            return f"{self.block} | {self.compile_label} | {self.backend}{bare}"
        backend = self.backend if self.scope != "none" else "eager"
        return f"{self.block} | AC {self.ac} | {self.compile_label} | {backend}{bare}"

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if not self.bare:
            del out["bare"]  # records written before bare reruns existed look the same
        return out


def _scopes(block: str) -> tuple[str, ...]:
    return (
        ("none", "model", "blocks", "attention", "feed_forward")
        if block == "dense"
        else ("none", "model", "blocks", "attention", "moe", "experts")
    )


def quick_cells(backends: Iterable[str] = ("aot_eager",)) -> list[Cell]:
    """The default sweep: 3 block kinds × 3 AC modes × 4 compile setups, per backend, plus the recipes."""
    cells = []
    for backend in backends:
        for block in ("dense", "moe:for_loop", "moe:masked"):
            for ac in ("none", "full", "selective_op"):
                cells.append(Cell(block, ac))
                for scope, fullgraph in (("blocks", False), ("blocks", True), ("attention", False)):
                    cells.append(Cell(block, ac, scope, fullgraph, backend=backend))
        for recipe in ("torchtitan_2025_09", "torchtitan_2025_12", "torchtitan_0_3_0", "torchtitan_main"):
            if RECIPES[recipe].missing() is None:
                cells.append(Cell("moe:for_loop", recipe=recipe, backend=backend))
    return dedupe(cells)


def full_cells(backends: Iterable[str] = ("aot_eager",)) -> list[Cell]:
    """Every combination the toolkit can build: block kinds × AC modes × scopes × fullgraph × order × backends."""
    cells = []
    for backend in backends:
        for block in BLOCKS:
            for ac in ("none", "full", "selective_op", "selective_layer", "per_submodule", "memory_budget"):
                for scope in _scopes(block):
                    if scope == "none":
                        if ac != "memory_budget":
                            cells.append(Cell(block, ac))
                        continue
                    for fullgraph in (False, True):
                        for order in (None,) if ac in ("none", "memory_budget") else (None, "ac_outside"):
                            cells.append(Cell(block, ac, scope, fullgraph, order, backend))
        # torchtitan main's torch_remat (`pip install torch-remat`): full recompute and its selective policy, eager
        # or compiled whole (compile(remat)) or inside the blocks (torchtitan main's way); no "AC outside" order,
        # since remat replaces the forward instead of wrapping it.
        for ac in REMAT_ACS if compat.available("torch_remat") else ():
            for block in BLOCKS:
                for scope in _scopes(block):
                    for fullgraph in (False,) if scope == "none" else (False, True):
                        cells.append(
                            Cell(block, ac, scope, fullgraph, None, backend) if scope != "none" else Cell(block, ac)
                        )
        for recipe, r in RECIPES.items():
            if r.missing():
                continue
            for block in BLOCKS[1:]:
                cells.append(Cell(block, recipe=recipe, backend=backend))
        # Real FSDP2 (one gloo rank): blocks sharded, and the experts sharded on their own — the layout behind
        # PR #2052 (C4), which the 2025-09 recipe then compiles through.
        for block in ("dense", "moe:masked"):
            for fsdp in ("blocks",) + (("blocks+experts",) if block != "dense" else ()):
                for ac in ("none", "full", "selective_op"):
                    cells.append(Cell(block, ac, fsdp=fsdp))
                    cells.append(Cell(block, ac, "blocks", True, backend=backend, fsdp=fsdp))
        for fsdp in ("blocks", "blocks+experts"):
            cells.append(Cell("moe:for_loop", recipe="torchtitan_2025_09", backend=backend, fsdp=fsdp))
    return dedupe(cells + random_cells(backends))


def random_cells(backends: Iterable[str] = ("aot_eager",)) -> list[Cell]:
    """Randomness under recompute: dropout × the AC setups that restore the RNG for the recompute or do not × eager
    and each block compiled whole. What the classification tells apart: the RNG restored (works), new random numbers
    drawn in a recompute (grads_differ, named: C60 compiled, C61 eager), compiled code drawing otherwise than eager (a
    compiled reference, works)."""
    cells = []
    remat = compat.available("torch_remat")
    for backend in backends:
        for ac in RANDOM_ACS:
            if ac.startswith("remat") and not remat:
                continue
            if ac != "memory_budget":
                cells.append(Cell(DROPOUT_BLOCK, ac))
            cells.append(Cell(DROPOUT_BLOCK, ac, "blocks", True, None, backend))
    return dedupe(cells)


def left_out() -> list[str]:
    """One line per optional package that is not installed and whose cells the toolkit sweeps therefore leave out
    (the sweep says so instead of shrinking without a word)."""
    from .._extras import available
    from ..stacks import reason

    recipes: dict[str, list[str]] = {}
    for name, r in RECIPES.items():
        for module in r.needs:
            if not available(module):
                recipes.setdefault(module, []).append(name)
    if not available("torch_remat"):
        recipes.setdefault("torch_remat", [])
    out = []
    for module, names in recipes.items():
        what = ["the remat cells"] if module == "torch_remat" else []
        what += [f"recipe {n}" for n in names]
        out.append(f"left out: {' and '.join(what)}, which {reason(module)}")
    return out


def dedupe(cells: list[Cell]) -> list[Cell]:
    """`cells` in order, each once (an eager cell comes once per backend)."""
    seen, out = set(), []
    for c in cells:
        if c not in seen:
            seen.add(c)
            out.append(c)
    return out


def valid(cell: Cell) -> str | None:
    """Why a cell cannot be built (an invalid combination), or None. Cheap: builds and transforms, runs nothing."""
    try:
        check_structure(cell.scenario())
    except ConfigError as e:
        return str(e)
    return None


def cell_key(scenario: Scenario, device: str = "cpu") -> str:
    """Cache key: the scenario, the torch version and the device."""
    data = scenario.to_dict()
    if isinstance(data.get("ac"), dict):
        data["ac"] = _migrations.keyed("ACConfig", data["ac"])
    key = {"scenario": data, "torch": torch.__version__, "device": device}
    release = scenario.stack_impl.release()
    if release is not None:  # transformers: another release is another measurement
        key[scenario.stack] = release
    if scenario.stack == "user":  # an edited model is another measurement
        from ..stacks.user import source_digest

        key["source"] = source_digest(scenario.model)
    blob = json.dumps(key, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
