"""Recipes: AC + compile applied the way torchtitan did at a point in time (our code, from its documented
behaviour)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, cast

import torch
from torch import nn

from .._config import ConfigError
from .._extras import missing
from ..models import ModelConfig
from ..models.moe import EXPERTS_ATTRS
from .ac import ACConfig, PerSubmoduleAC, apply_ac, record_ac, remove_ac
from .compile import (
    AC_OUTSIDE,
    COMPILE_OUTSIDE,
    CompileConfig,
    apply_compile,
    record_compile,
)
from .containers import blocks
from .lifecycle import prepare
from .naming import has_checkpoint, has_compiled, inside, is_checkpoint_wrapper, unwrap, within
from .record import applied, record


@dataclass(frozen=True)
class Recipe:
    """A named way of applying AC and compile together, as a project did it at some point — and what it needs of
    the model and the environment, said once here for the matrix, the Explorer and the presets (`model_config`).
    `run` measures a Scenario's model as given: a recipe on another layout is the user's experiment, not refused."""

    name: str
    summary: str
    apply: Callable[..., nn.Module]
    ac_mode: str
    """The AC mode the recipe applies (`ACConfig.mode`): what a Report's `scenario.ac_mode` says, so that catalogue
    signatures keyed on AC modes (C45, C46 on remat) match recipe runs too."""
    release: str | None = None
    """The torchtitan release the recipe claims to be; its real code is then the fidelity test's reference.
    None for historical recipes rebuilt from PRs, with no release to compare with."""
    layout: str = "torchtitan_0_3_0"
    """The model layout of the recipe's era (`ModelConfig.layout`)."""
    needs: tuple[str, ...] = ()
    """Optional packages the recipe uses (`toolkit._extras`)."""
    stand_in_fsdp_hook: bool = False
    """The recipe's failure needs FSDP's hook on the experts (PR #2052): without real FSDP2 the model gets the
    FSDP-like graph-breaking hook in its place (`ModelConfig.experts_graph_break`)."""

    def __call__(self, model: nn.Module, *, backend: str = "aot_eager") -> nn.Module:
        return self.apply(model, backend=backend)

    def __repr__(self) -> str:
        return f"Recipe({self.name!r}: {self.summary})"

    def model_config(self, model: ModelConfig, *, fsdp: str = "none") -> ModelConfig:
        """The model this recipe runs on, made from `model`: its era's layout; in the 2025 layout `grouped_mm`
        experts in bfloat16, the only dtype that layout's grouped GEMM compiles in on CPU (C14; 0.3.0's experts cast
        themselves); the stand-in FSDP hook unless real FSDP2 (`fsdp`) puts its own hook there."""
        changes: dict = {"layout": self.layout, "experts_graph_break": self.stand_in_fsdp_hook and fsdp == "none"}
        if model.has_moe and model.experts_impl == "grouped_mm" and self.layout == "torchtitan_2025":
            changes["dtype"] = "bfloat16"
        return model.replace(**changes)

    def missing(self) -> str | None:
        """Why the recipe cannot run here (an optional package missing, with its install line), or None."""
        return missing(self.needs)


def _sac(mode: str = "selective_op") -> ACConfig:
    return ACConfig.of(mode=mode, preserve_rng_state=False)


def _start(model: nn.Module, name: str) -> None:
    rec = applied(model)
    if rec.ac is not None or rec.compile is not None or has_checkpoint(model) or has_compiled(model):
        raise RuntimeError(
            f"recipe {name!r} needs a model without AC or compile; call toolkit.transforms.reset(model) first."
        )
    blocks(model)  # a model without `layers` is refused here, naming the field


def _compile_children_1895(model: nn.Module, backend: str, see_through: bool = False) -> tuple[list[str], list]:
    """torchtitan PR #1895's `apply_compile` rule, including its `isinstance(child, MoE)` test
    (`see_through=True` applies the fix: test the module under any wrapper)."""
    targets, undo = [], []
    layers = cast(nn.Module, unwrap(model).layers)  # the ModuleDict of blocks (`_start` checked it is there)
    for key, transformer_block in list(layers.named_children()):
        block = unwrap(transformer_block)
        if getattr(block, "moe_enabled", False):
            # #1895 unwraps a block-level CheckpointWrapper but not submodule-level ones.
            inner = (
                cast(nn.Module, transformer_block._checkpoint_wrapped_module)  # the module a CheckpointWrapper wraps
                if is_checkpoint_wrapper(transformer_block)
                else transformer_block
            )
            for attr, child in list(inner.named_children()):
                moe = unwrap(child) if see_through else child
                if _is_moe(moe):
                    for moe_attr, moe_child in list(moe.named_children()):
                        if moe_attr in EXPERTS_ATTRS:
                            continue  # the experts stay eager: FSDP's hooks must not be traced
                        # torch.compile of a Module returns an OptimizedModule (a Module); its stub says Callable.
                        moe.register_module(
                            moe_attr, cast(nn.Module, torch.compile(moe_child, backend=backend, fullgraph=True))
                        )
                        undo.append(("wrapper", (moe, moe_attr, moe_child)))
                        targets.append(f"layers.{key}.{attr}.{moe_attr}")
                else:
                    # A CheckpointWrapper(MoE) lands here: the whole MoE is compiled with fullgraph=True (C4).
                    inner.register_module(attr, cast(nn.Module, torch.compile(child, backend=backend, fullgraph=True)))
                    undo.append(("wrapper", (inner, attr, child)))
                    targets.append(f"layers.{key}.{attr}")
        else:
            layers.register_module(
                key, cast(nn.Module, torch.compile(transformer_block, backend=backend, fullgraph=True))
            )
            undo.append(("wrapper", (layers, key, transformer_block)))
            targets.append(f"layers.{key}")
    return targets, undo


def _is_moe(m: nn.Module) -> bool:
    """#1895's `isinstance(child, MoE)`: the toolkit's MoE, or any class called MoE (torchtitan's own)."""
    return any(cls.__name__ == "MoE" for cls in type(m).__mro__)


def torchtitan_2025_09(model: nn.Module, *, backend: str = "aot_eager", see_through: bool = False) -> nn.Module:
    """torchtitan between PR #1895 (2025-10-29) and PR #2118 (2025-12-08), with the SAC + FlexAttention
    workaround of PR #1683 (2025-09-24) active — the configuration of PR #2052.

    AC (`_apply_op_sac_to_transformer_block_with_flex`, model compile on): in an MoE block `moe` and `attention`
    are each wrapped in SAC and the block stays unwrapped; a dense block gets SAC as a whole. Compile (#1895):
    for an MoE block, unwrap a block-level CheckpointWrapper, then for each child: an `MoE` gets every child
    but `experts` compiled with fullgraph=True; any other child is compiled with fullgraph=True. Because
    `block.moe` is now a CheckpointWrapper, `isinstance(child, MoE)` is False and the whole MoE — experts and
    their FSDP hook included — is compiled with fullgraph=True: with experts that graph-break
    (`ModelConfig(experts_graph_break=True)`) the first forward raises `torch._dynamo.exc.Unsupported`
    (case C4). The workaround applied only with FlexAttention; here its structure is applied whatever
    `attention` is, since that structure is the bug. #2052 (warn and disable compile) was never merged.
    `see_through=True` is the fix that tests `isinstance` on the module under the wrapper: the MoE's router and
    shared experts are then compiled inside its SAC region and the experts stay eager.

    Historical: rebuilt from PRs #1683, #1895 and #2052 and their discussion (no release holds this state to
    compare with); build the model with `layout="torchtitan_2025"` for that era's names.
    """
    name = "torchtitan_2025_09_see_through" if see_through else "torchtitan_2025_09"
    _start(model, name)
    ac_cfg = cast(PerSubmoduleAC, _sac("per_submodule"))  # the config `ACConfig.of(mode="per_submodule")` builds
    wrapped = []
    layers = cast(nn.Module, unwrap(model).layers)  # the ModuleDict of blocks (`_start` checked it is there)
    for key, block in blocks(model):
        if getattr(block, "moe_enabled", False):
            for child in ("moe", "attention"):
                block.register_module(child, ac_cfg.wrap(getattr(block, child), f"layers.{key}.{child}"))
                wrapped.append(f"layers.{key}.{child}")
        else:
            layers.register_module(key, ac_cfg.wrap(block, f"layers.{key}"))
            wrapped.append(f"layers.{key}")
    targets, undo = _compile_children_1895(model, backend, see_through)
    cfg = CompileConfig(
        scope=tuple(targets), backend=backend, fullgraph=True, capture_scalar_outputs=True, method="torch_compile"
    )
    orders = {t: COMPILE_OUTSIDE if t in wrapped else AC_OUTSIDE for t in targets if any(within(t, w) for w in wrapped)}
    rec = record(model)
    record_ac(rec, ac_cfg, wrapped, disable_lru_cache=False)  # the LRU switch went off later (PR #1991)
    record_compile(rec, cfg, targets, orders, undo)
    rec.recipe = name
    return model


def torchtitan_2025_12(model: nn.Module, *, backend: str = "aot_eager") -> nn.Module:
    """torchtitan after PR #2118 (2025-12-08) removed the FlexAttention workaround, before PR #2741 (2026-04-14).

    AC: every block wrapped whole with the per-op SAC policy. Compile: PR #1895's rule, which now sees the MoE
    (the block-level wrapper is unwrapped): router and shared experts compiled with fullgraph=True, experts
    eager, attention and norms compiled — all inside the SAC region, i.e. SAC(compile(child)), whose policy can
    only save or recompute each compiled child whole (C7). LRU cache off (PR #1991) and
    `capture_scalar_outputs=True` (PR #1895).

    Historical: rebuilt from PRs #2118, #1895 and #1991 (no release holds this state to compare with).
    """
    _start(model, "torchtitan_2025_12")
    apply_ac(model, _sac("selective_op"))  # the LRU switch off with it (PR #1991)
    rec = record(model)
    targets, undo = _compile_children_1895(model, backend)
    cfg = CompileConfig(
        scope=tuple(targets), backend=backend, fullgraph=True, capture_scalar_outputs=True, method="torch_compile"
    )
    orders = {t: AC_OUTSIDE for t in targets if any(inside(t, w) for w in rec.ac_wrapped)}
    record_compile(rec, cfg, targets, orders, undo)
    rec.recipe = "torchtitan_2025_12"
    return model


def torchtitan_0_3_0(model: nn.Module, *, backend: str = "aot_eager", ac: str = "selective_op") -> nn.Module:
    """torchtitan 0.3.0 (PyPI, 2026-09), as `parallelize_qwen3` / `parallelize_deepseekv3` apply it, checked
    against that release's own code by tests/test_torchtitan.py (same structure, graphs and saved bytes):

    AC (`SelectiveAC`, the trainer's default, or `FullAC` with `ac="full"`): every block of `model.layers`, dense
    or MoE, wrapped whole in a non-reentrant CheckpointWrapper — `preserve_rng_state=True`, `early_stop=False`,
    determinism check "default" — with SAC's save list, every-other-matmul rule and per-block force-recompute
    shapes (`moe.router.gate`); Dynamo's LRU cache off. Compile (`apply_compile`): each block compiled whole in
    place with `Module.compile(fullgraph=True)` — compile(AC(block)) — with `capture_scalar_outputs=True` and
    `skip_fwd_side_effects_in_bwd_under_checkpoint=True`. torchtitan sets those flags and the LRU switch for the
    rest of the process; the toolkit applies them only while a step runs (`torch_settings`).
    """
    name = "torchtitan_0_3_0" if ac == "selective_op" else "torchtitan_0_3_0_full_ac"
    _start(model, name)
    prepare(
        model,
        ac=ACConfig.of(mode=ac, preserve_rng_state=True, early_stop=False),
        compile=CompileConfig(
            scope="blocks",
            backend=backend,
            fullgraph=True,
            capture_scalar_outputs=True,
            skip_fwd_side_effects_in_bwd_under_checkpoint=True,
            order="compile_outside",
        ),
    )
    record(model).recipe = name
    return model


# The torchtitan main commits the `torchtitan_main` recipe and the "torchtitan_main" layout were read at
# (repository pytorch/torchtitan; tests/test_torchtitan_main.py rebuilds main's block from the same files). The names
# are moe.py's; the regions follow the remat design at 03d9819f3416 where moe.py at 00a4c147699f, older remat code,
# differs (outer w13/w2 regions, a bare shared add, a token count that counts the replay): the test's docstring.
MAIN_COMMITS = {
    "distributed/activation_checkpoint.py, protocols/module.py, docs/remat.md": "03d9819f3416",
    "models/common/moe.py": "00a4c147699f",
    "distributed/local_compile.py": "2350f753348e",
}
# main's `@local_compile` regions the toolkit's models have: SwiGLU (16 recompiles), RoPE, the loss. main's
# defaults also name gated_rmsnorm, which only Qwen3.5-style models have; its plain RMSNorm is not compiled.
MAIN_LOCAL_COMPILE = ("swiglu", "cos_sin_rope", "loss")


def torchtitan_main(model: nn.Module, *, backend: str = "aot_eager") -> nn.Module:
    """torchtitan main after 0.3.0, as its own files say (commits in `MAIN_COMMITS`; checked against main's code
    by tests/test_torchtitan_main.py: same saved bytes, recompute and graphs, 0 and 1 shared experts):

    AC (`SelectiveActivationRematConfig` applied by `apply_activation_remat`): each block's `forward` replaced by
    `torch_remat.checkpoint(region_name="layers.N", determinism_check="default")`, choosing among the regions the
    model code declares — save `("*",)`, recompute `("*routed_experts.w13.*",)`: every Linear's projection, the
    attention kernel, the router gate, `routing_decision` and the routed `w2` grouped matmul (with its bfloat16
    weight copy) are kept; the routed `w13` grouped matmul and every bare op (norms, RoPE, activation, dispatch,
    combine) are recomputed; the trailing adds `ffn_residual` / `moe.shared_add` are kept and skipped in replay;
    token counting ignores the replay. On the 0.3.0 layout the inner experts declare w1_EFD and w3_EFD as one
    `moe.routed_experts.w13.grouped_mm` region, so the same bytes are saved as with main's fused weights.
    Compile (#4895): no block compile; main's `@local_compile` functions `swiglu` (recompile_limit=16),
    `cos_sin_rope` and `loss`, each with `torch.compile(fullgraph=True)`; plain RMSNorm stays eager.
    """
    _start(model, "torchtitan_main")
    apply_ac(model, ACConfig.remat_selective())
    try:
        apply_compile(model, CompileConfig(functions=MAIN_LOCAL_COMPILE, backend=backend, fullgraph=True))
    except Exception:
        remove_ac(model)
        raise
    record(model).recipe = "torchtitan_main"
    return model


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            "torchtitan_2025_09",
            "per-submodule SAC (flex workaround) + #1895 MoE-aware compile: PR #2052's failure",
            torchtitan_2025_09,
            layout="torchtitan_2025",
            stand_in_fsdp_hook=True,
            ac_mode="per_submodule",
        ),
        Recipe(
            "torchtitan_2025_09_see_through",
            "the 2025-09 recipe with the isinstance test fixed to look under the wrapper",
            lambda model, backend="aot_eager": torchtitan_2025_09(model, backend=backend, see_through=True),
            layout="torchtitan_2025",
            ac_mode="per_submodule",
        ),
        Recipe(
            "torchtitan_2025_12",
            "per-block SAC + #1895 compile of the MoE's children: SAC(compile(child))",
            torchtitan_2025_12,
            layout="torchtitan_2025",
            ac_mode="selective_op",
        ),
        Recipe(
            "torchtitan_0_3_0",
            "torchtitan 0.3.0: per-block SelectiveAC, each block compiled whole with "
            "fullgraph=True: compile(SAC(block))",
            torchtitan_0_3_0,
            release="0.3.0",
            ac_mode="selective_op",
        ),
        Recipe(
            "torchtitan_0_3_0_full_ac",
            "torchtitan 0.3.0 with FullAC: compile(AC(block))",
            lambda model, backend="aot_eager": torchtitan_0_3_0(model, backend=backend, ac="full"),
            release="0.3.0",
            ac_mode="full",
        ),
        Recipe(
            "torchtitan_main",
            "torchtitan main (files at 03d9819f3416 / 00a4c147699f / 2350f753348e): torch_remat "
            "per block choosing among the model's regions (save *, recompute *routed_experts.w13.*), SwiGLU, RoPE "
            "and the loss compiled as local functions with fullgraph=True",
            torchtitan_main,
            needs=("torch_remat",),
            ac_mode="remat",
        ),
    )
}


def apply_recipe(model: nn.Module, name: str, *, backend: str = "aot_eager") -> nn.Module:
    """Apply the recipe called `name` (see `RECIPES`)."""
    if not isinstance(name, str) or name not in RECIPES:
        raise ConfigError("recipe", "name", f"{name!r} is not a recipe.", f"use one of {', '.join(RECIPES)}.")
    why = RECIPES[name].missing()
    if why:
        raise ConfigError("recipe", "name", f"{name!r} {why}", "install it, or pick another recipe.")
    return RECIPES[name](model, backend=backend)
