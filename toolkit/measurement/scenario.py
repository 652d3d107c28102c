"""`Scenario`: everything needed to rebuild and measure one training step, on any stack, validated up front."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, cast

from .._config import (
    MAX_RANKS,
    MAX_STEADY_STEPS,
    ConfigError,
    PlainData,
    check_bool,
    check_choice,
    check_int,
    check_known,
    check_text,
)
from ..models import ModelConfig, build_model
from ..stacks import STACKS, Stack, StackConfig, get
from ..stacks.torchtitan import TorchtitanConfig
from ..transforms import ACConfig, CompileConfig
from ..transforms.compile import BACKENDS, SCOPES, check_ac_compile
from ..transforms.fsdp import FSDP_MODES, FsdpMode
from ..transforms.lifecycle import prepare, reset
from ..transforms.recipes import RECIPES


@dataclass(frozen=True, kw_only=True)
class Scenario(PlainData):
    """Everything needed to rebuild and measure one training step."""

    stack: str = "toolkit"
    """Whose model and transforms (`toolkit.stacks`): "toolkit" (its torchtitan-shaped model, its AC / compile /
    recipes), "torchtitan" (torchtitan 0.3.0's own model from `torchtitan`, and its own `FullAC` / `SelectiveAC`,
    `apply_compile` and `apply_fsdp_to_decoder`, in the order its `parallelize_*` uses; an optional extra) or
    "transformers" (Hugging Face transformers' own model from `model`, its own activation checkpointing and
    `Module.compile`; an optional extra)."""
    model: Any = field(default_factory=ModelConfig)
    """The model to build: a `ModelConfig` (stack "toolkit") or a `TransformersConfig` (stack "transformers", whose
    default it becomes when left at `ModelConfig()`)."""
    torchtitan: TorchtitanConfig | None = None
    """torchtitan's model to build (stack "torchtitan"; default `TorchtitanConfig()`, a tiny Qwen3-MoE)."""
    ac: ACConfig = field(default_factory=ACConfig.of)
    """Activation checkpointing to apply (ignored when `recipe` is set)."""
    compile: CompileConfig = field(default_factory=CompileConfig)
    """What to compile (ignored when `recipe` is set)."""
    recipe: str | None = None
    """A name from `toolkit.transforms.RECIPES`, applied instead of `ac` + `compile`."""
    recipe_backend: str = "aot_eager"
    """Compile backend the recipe uses."""
    name: str = ""
    """A label shown in reports and tables."""
    device: str | None = None
    """Overrides `model.device` when set."""
    seed: int | None = None
    """Overrides `model.seed` when set."""
    check_numerics: bool = True
    """Compare loss and gradients with the same model run eagerly without AC."""
    measure_memory: bool = True
    """Run one extra step to measure peak memory (profiler replay on CPU, allocator stats on CUDA)."""
    steady_steps: int = 2
    """Extra un-instrumented steps timed for the steady-state step time (0 skips them)."""
    memory_snapshot: str | None = None
    """CUDA only: write an allocator snapshot (for PyTorch's memory viewer) to this path."""
    fsdp: FsdpMode = "none"
    """Real FSDP2 after AC and compile: "none", "blocks" (torchtitan 0.3.0's units: embeddings, norm + head,
    each block, the root) or "blocks+experts" (the MoE's routed experts a unit of their own first, as in PR
    #2052's era: C4). On the default process group, or a 1-rank gloo group on 127.0.0.1 made for the run."""
    ep: int = 1
    """Expert-parallel degree (stack "torchtitan" only): the routed experts sharded over `ep` ranks with
    torchtitan's all-to-all token dispatcher, through its own `parallelize_qwen3` / `parallelize_deepseekv3`
    (which applies its AC, compile and FSDP2 as well, so `fsdp` is "blocks"). Needs `ep` ranks:
    `tk.run_distributed(scenario, nproc=ep)` or `python -m toolkit run --nproc ep`."""
    instrument: bool = True
    """False runs the step bare, with none of the toolkit's probes (no dispatch mode, saved-tensor hooks or
    patches): only the outcome, the graphs and breaks Dynamo counts, and the gradients are measured — to check
    whether a failure reproduces without the instrument (the matrix reruns every failing cell so)."""

    def __post_init__(self) -> None:
        own = "Scenario"
        check_choice(own, "stack", self.stack, STACKS)
        check_choice(own, "fsdp", self.fsdp, FSDP_MODES)
        check_int(own, "ep", self.ep, 1, MAX_RANKS, "ranks on one machine")
        st = self.stack_impl
        if st.config_field == "model" and st.config_type is not ModelConfig and self.model == ModelConfig():
            object.__setattr__(self, "model", st.config_type())  # the stack's default model
        if self.torchtitan is not None and st.config_field != "torchtitan":
            raise ConfigError(
                own,
                "torchtitan",
                "a torchtitan model config only applies to stack='torchtitan'.",
                "pass stack='torchtitan', or drop torchtitan=... and set model=ModelConfig(...).",
            )
        model_type = st.config_type if st.config_field == "model" else ModelConfig
        for name, cls in (("model", model_type), ("ac", ACConfig), ("compile", CompileConfig)):
            if not isinstance(getattr(self, name), cls):
                raise ConfigError(
                    own,
                    name,
                    f"is a {type(getattr(self, name)).__name__}, not a {cls.__name__}.",
                    f"pass {cls.__name__}(...).",
                )
        for name in ("check_numerics", "measure_memory", "instrument"):
            check_bool(own, name, getattr(self, name))
        st.check(self)
        check_text(own, "name", self.name)
        if not isinstance(self.recipe_backend, str):
            raise ConfigError(own, "recipe_backend", f"{self.recipe_backend!r} is not a string.", "pass it as text.")
        for name in ("recipe", "device", "memory_snapshot"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise ConfigError(
                    own, name, f"{getattr(self, name)!r} is not a string.", f"pass {name} as text, or None."
                )
        if self.recipe is not None:
            if self.recipe not in RECIPES:
                raise ConfigError(
                    own, "recipe", f"{self.recipe!r} is not a recipe.", f"use one of {', '.join(RECIPES)}."
                )
            why = RECIPES[self.recipe].missing()
            if why:
                raise ConfigError(own, "recipe", f"{self.recipe!r} {why}", "install it, or pick another recipe.")
            if self.ac != ACConfig.of() or self.compile != CompileConfig():
                raise ConfigError(
                    own,
                    "recipe",
                    "a recipe applies its own AC and compile, but ac/compile were set too.",
                    "drop ac/compile, or drop recipe.",
                )
            if self.recipe_backend not in BACKENDS:
                raise ConfigError(
                    own,
                    "recipe_backend",
                    f"{self.recipe_backend!r} is not a backend.",
                    f"use one of {', '.join(BACKENDS)}.",
                )
        elif self.recipe_backend != "aot_eager":
            raise ConfigError(
                own,
                "recipe_backend",
                f"{self.recipe_backend!r} is the backend of a recipe, and no recipe is set: it would be ignored.",
                "set recipe=..., or pick the backend with compile=CompileConfig(scope=..., backend=...).",
            )
        check_ac_compile(self.ac, self.compile)
        check_int(own, "steady_steps", self.steady_steps, 0, MAX_STEADY_STEPS, "timing steps after the measured one")
        device = self.config.device  # validates device/seed overrides
        if self.memory_snapshot is not None and not str(device).startswith("cuda"):
            raise ConfigError(
                own,
                "memory_snapshot",
                f"CUDA allocator snapshots need a CUDA device; this scenario runs on {device!r}, so no snapshot "
                "would be written.",
                "drop memory_snapshot (the Report's memory section is measured on CPU too), or run on device='cuda'.",
            )

    @property
    def torchtitan_config(self) -> TorchtitanConfig:
        """torchtitan's model to build (stack "torchtitan"): `torchtitan`, or the default `TorchtitanConfig()`."""
        return self.torchtitan if self.torchtitan is not None else TorchtitanConfig()

    @property
    def stack_impl(self) -> Stack:
        """The stack's code (`toolkit.stacks.get(self.stack)`)."""
        return get(self.stack)

    @property
    def config(self) -> Any:
        """The stack's model config, with this scenario's device / seed overrides."""
        return self.torchtitan_config if self.stack_impl.config_field == "torchtitan" else self.model_config

    @property
    def model_config(self) -> Any:
        changes: dict[str, Any] = {}
        if self.device is not None:
            changes["device"] = self.device
        if self.seed is not None:
            changes["seed"] = self.seed
        return self.model.replace(**changes) if changes else self.model

    @property
    def label(self) -> str:
        return self.name or self.stack_impl.label(self)

    def _record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"stack": self.stack}
        field_name = self.stack_impl.config_field
        if field_name != "model":
            out[field_name] = self.config.to_dict()
        return {
            **out,
            "fsdp": self.fsdp,
            "ep": self.ep,
            "instrument": self.instrument,
            "model": self.model.to_dict(),
            "ac": self.ac.to_dict(),
            "compile": self.compile.to_dict(),
            "recipe": self.recipe,
            "recipe_backend": self.recipe_backend,
            "name": self.name,
            "device": self.device,
            "seed": self.seed,
            "check_numerics": self.check_numerics,
            "measure_memory": self.measure_memory,
            "steady_steps": self.steady_steps,
            "memory_snapshot": self.memory_snapshot,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Scenario:
        if not isinstance(data, dict):  # said with an example of this record's nested configs
            raise ConfigError(
                "Scenario",
                "",
                f"the JSON holds a {_json_type(data)}, not an object of Scenario fields.",
                'write an object such as {"ac": {"mode": "full"}, "compile": {"scope": "blocks"}} '
                "(Scenario.to_json() writes one).",
            )
        return cast(Scenario, super().from_dict(data))

    @classmethod
    def _from_record(cls, data: dict[str, Any]) -> Scenario:
        check_known(cls, data)
        check_choice("Scenario", "stack", data.get("stack", "toolkit"), STACKS)
        st = get(data.get("stack", "toolkit"))
        model_type = st.config_type if st.config_field == "model" else ModelConfig
        subs: tuple[tuple[str, type[StackConfig] | type[ACConfig] | type[CompileConfig]], ...] = (
            ("model", model_type),
            ("ac", ACConfig),
            ("compile", CompileConfig),
        )
        for name, sub in subs:
            if name not in data:
                continue
            value = data[name]
            if not isinstance(value, dict):
                example = {"model": '{"n_layers": 4}', "ac": '{"mode": "full"}', "compile": '{"scope": "blocks"}'}[name]
                if name == "compile" and value in SCOPES:  # `"compile": "blocks"` meant the scope
                    example = json.dumps({"scope": value})
                elif name == "ac" and isinstance(value, str):
                    example = json.dumps({"mode": value})
                what = "null" if value is None else f"the {_json_type(value)} {json.dumps(value)}"
                raise ConfigError(
                    "Scenario",
                    name,
                    f"is {what}, not an object of {sub.__name__} fields.",
                    f'write "{name}": {example}, or leave "{name}" out for the default '
                    f"{'ACConfig.of' if name == 'ac' else sub.__name__}().",
                )
            data[name] = sub.from_dict(value)
        if st.config_field != "model" and isinstance(data.get(st.config_field), dict):
            data[st.config_field] = st.config_type.from_dict(data[st.config_field])
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "Scenario":
        from .. import _files

        return cls.from_dict(_files.loads(text, "Scenario", "", name="the scenario"))


def _json_type(value: Any) -> str:
    return {list: "list", str: "string", bool: "boolean", int: "number", float: "number", type(None): "null"}.get(
        type(value), type(value).__name__
    )


def check_structure(scenario: Scenario) -> None:
    """Raise ConfigError for what only the model's structure can tell (a scope the model lacks, an order the
    wrappers cannot give) — by building a 2-block model and applying the transforms, without running anything."""
    if scenario.recipe or scenario.stack != "toolkit":
        return
    import warnings

    # Two blocks tell what the structure allows, but as many as every layer_every-th block needs to exist.
    every = getattr(scenario.ac, "layer_every", 1)
    n = min(max(2, every), scenario.model.n_layers)
    model = build_model(scenario.model_config.replace(n_layers=n, device="cpu"))
    with warnings.catch_warnings():
        # What applying the transforms would warn about belongs to the run's Report, not to this check.
        warnings.simplefilter("ignore")
        prepare(model, ac=scenario.ac, compile=scenario.compile)
    reset(model, dynamo=False)
