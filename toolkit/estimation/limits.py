"""What an estimate can follow on fake tensors: a scenario's checks, before any work, and the notes they leave."""

from __future__ import annotations

import torch

from .. import compat
from .._config import ConfigError, check_bool, check_int
from ..models import build_model
from ..models.moe import experts_attr
from ..transforms.compile import resolve_scope
from ..transforms.naming import within
from .inputs import ScenarioLike

ESTIMATE_BACKENDS = ("eager", "aot_eager", "aot_eager_decomp_partition", "inductor")
"""Backends whose compiled step the estimate follows on fake tensors (a backend callable is refused)."""
ESTIMATE_RECIPES = ("torchtitan_0_3_0", "torchtitan_0_3_0_full_ac", "torchtitan_main")
"""Recipes whose compile the estimate follows: 0.3.0's whole-block compile, main's local compile."""
# Inductor options that need real kernels (autotuning benchmarks them) or another wrapper language.
_KERNEL_OPTIONS = ("cpp_wrapper", "freezing", "max_autotune", "max_autotune_gemm", "max_autotune_pointwise")

MAX_WORLD_SIZE = 1 << 20
"""The most ranks an estimate shards over (`world_size`)."""


def step_backend(scenario: ScenarioLike) -> str:
    """The backend the step compiles with ("eager" when nothing is compiled)."""
    if scenario.recipe is not None:
        return scenario.recipe_backend
    return scenario.compile.backend_name if scenario.compile.enabled else "eager"


def check(scenario: ScenarioLike) -> list[str]:
    """Raise ConfigError for what fake tensors cannot run; return the notes that apply to the rest."""
    own = "estimate"
    m = scenario.model
    c = scenario.compile
    if scenario.stack != "toolkit":
        raise ConfigError(
            own,
            "stack",
            "estimates build the toolkit's model on fake devices, without torchtitan's or transformers' code.",
            "pass stack='toolkit'; measure the others with tk.run.",
        )
    if scenario.ep != 1:
        raise ConfigError(
            own,
            "ep",
            "expert parallelism's all-to-all splits tokens by data-dependent counts, which fake tensors cannot know.",
            "pass ep=1 (FSDP2 alone); measure expert parallelism with tk.run_distributed.",
        )
    if scenario.recipe is not None and scenario.recipe not in ESTIMATE_RECIPES:
        raise ConfigError(
            own,
            "recipe",
            f"recipe {scenario.recipe!r} replays a 2025 torchtitan whose compile graph-breaks or needs the FSDP hook.",
            f"use one of {', '.join(ESTIMATE_RECIPES)}, or its AC and compile as ac=/compile=.",
        )
    backend = step_backend(scenario)
    field_name = "recipe_backend" if scenario.recipe is not None else "compile.backend"
    if c.enabled and not isinstance(c.backend, str):
        raise ConfigError(
            own,
            "compile.backend",
            "a backend callable compiles in ways the estimate cannot follow on fake tensors.",
            f"use one of {', '.join(ESTIMATE_BACKENDS)}.",
        )
    if backend not in ESTIMATE_BACKENDS:
        raise ConfigError(own, field_name, f"{backend!r} is not a backend the estimate follows.", "use aot_eager.")
    if backend == "inductor" and not compat.available("inductor_on_fake"):
        raise ConfigError(own, field_name, compat.blind_spot("inductor_on_fake"), "use backend='aot_eager'.")
    bad = [k for k, _ in c.inductor_options if k in _KERNEL_OPTIONS or k.startswith(("max_autotune", "benchmark"))]
    if bad:
        raise ConfigError(
            own,
            "compile.inductor_options",
            f"{', '.join(bad)} need(s) real kernels (autotuning runs them) or a C++ wrapper, not fake tensors.",
            "drop them: the estimate follows inductor's default code generation.",
        )
    if m.has_moe:
        if m.experts_impl in ("for_loop", "nonzero"):
            raise ConfigError(
                own,
                "model.experts_impl",
                f"{m.experts_impl!r} experts split tokens by data-dependent counts, which fake tensors cannot know.",
                "use experts_impl='grouped_mm' or 'masked'.",
            )
        if m.token_count == "bincount":
            raise ConfigError(
                own,
                "model.token_count",
                "bincount has a data-dependent output shape.",
                "use token_count='scatter' (torchtitan) or 'histc'.",
            )
        if m.experts_untraceable:
            raise ConfigError(
                own,
                "model.dtype",
                f"torch._grouped_mm's meta kernel accepts no {m.dtype} on torch {torch.__version__} (C14; 2.15 does).",
                "use ModelConfig(dtype='bfloat16') or experts_impl='masked'.",
            )
        if m.experts_graph_break and c.enabled and _compiles_experts(scenario):
            raise ConfigError(
                own,
                "model.experts_graph_break",
                f"compile scope {c.scope!r} covers the routed experts, whose stand-in FSDP hook breaks the graph.",
                "drop experts_graph_break, or compile a scope that leaves the experts eager (e.g. 'attention').",
            )
    if m.attention == "flex":
        raise ConfigError(
            own,
            "model.attention",
            "FlexAttention cannot run its backward on CPU fake tensors.",
            "use attention='sdpa'.",
        )
    notes = [
        "attention saves what CPU SDPA saves; CUDA flash/efficient kernels keep less",
        "RMSNorm runs the CPU composite (fp32 intermediates in a bf16 model); CUDA's fused kernel keeps less",
    ]
    if m.has_moe:
        notes.append(f"routed experts: {m.experts_impl}, static shapes (every token copy is computed, T·K rows)")
    if backend == "inductor":
        notes.append(
            "inductor: its CPU (C++) lowering, fusion and memory plan, kernels not built; on CUDA Triton fuses "
            "differently, so temporaries and the peak may differ (saved tensors follow the same partition)"
        )
    elif backend != "eager":
        notes.append(f"{backend}: AOTAutograd's partition, graphs run op by op on fake tensors")
    return notes


def _compiles_experts(scenario: ScenarioLike) -> bool:
    """The scenario's compile scope traces a block's routed experts (read off a meta model: no memory)."""
    model = build_model(scenario.model.replace(device="meta"))
    experts = [f"layers.{i}.moe.{experts_attr(scenario.model.layout)}" for i in scenario.model.moe_layer_ids]
    targets = resolve_scope(model, scenario.compile.scope)
    return any(within(e, t) for t in targets for e in experts)


def check_world(scenario: ScenarioLike, world_size: int, reshard_after_forward: bool) -> None:
    """Raise ConfigError, before any work, for a world size the estimate cannot shard over."""
    import torch.distributed as dist

    check_int("estimate", "world_size", world_size, 1, MAX_WORLD_SIZE, "ranks")
    check_bool("estimate", "reshard_after_forward", reshard_after_forward)
    if world_size > 1 and scenario.fsdp == "none":
        raise ConfigError(
            "estimate",
            "fsdp",
            f"world_size={world_size} with fsdp='none' would hold the whole model on every rank.",
            "pass a Scenario with fsdp='blocks' (or 'blocks+experts') to shard it with FSDP2.",
        )
    if scenario.fsdp == "none":
        return
    if not compat.available("fake_process_group"):
        raise ConfigError("estimate", "fsdp", compat.blind_spot("fake_process_group"), "estimate with fsdp='none'.")
    if dist.is_available() and dist.is_initialized():
        raise ConfigError(
            "estimate",
            "world_size",
            "a process group is already initialized here; the estimate shards over a fake one of its own.",
            "estimate outside torchrun, before init_process_group (or after destroy_process_group).",
        )
