"""`Scenario`: everything needed to rebuild and measure one training step of the toolkit's model, validated up front."""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from .._config import (
    MAX_RANKS,
    MAX_STEADY_STEPS,
    ConfigError,
    check_bool,
    check_choice,
    check_int,
    check_known,
    check_text,
)
from ..models import ModelConfig, build_model
from ..stacks.torchtitan import TorchtitanConfig
from ..stacks.torchtitan import require as require_torchtitan
from ..transforms import ACConfig, CompileConfig
from ..transforms.compile import BACKENDS, SCOPES, check_ac_compile
from ..transforms.fsdp import FSDP_MODES, FsdpMode
from ..transforms.recipes import RECIPES, prepare, reset

Stack = Literal["toolkit", "torchtitan"]
STACKS: tuple[str, ...] = typing.get_args(Stack)


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """Everything needed to rebuild and measure one training step."""

    stack: Stack = "toolkit"
    """Whose model and transforms: "toolkit" (its torchtitan-shaped model, its AC / compile / recipes) or
    "torchtitan" (torchtitan 0.3.0's own model from `torchtitan`, and its own `FullAC` / `SelectiveAC`,
    `apply_compile` and `apply_fsdp_to_decoder`, in the order its `parallelize_*` uses; an optional extra)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The toolkit's model to build (stack "toolkit")."""
    torchtitan: TorchtitanConfig | None = None
    """torchtitan's model to build (stack "torchtitan"; default `TorchtitanConfig()`, a tiny Qwen3-MoE)."""
    ac: ACConfig = field(default_factory=ACConfig)
    """Activation checkpointing to apply (ignored when `recipe` is set)."""
    compile: CompileConfig = field(default_factory=CompileConfig)
    """What to compile (ignored when `recipe` is set)."""
    recipe: str | None = None
    """A name from `toolkit.RECIPES`, applied instead of `ac` + `compile`."""
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
        if self.ep > 1 and self.stack != "torchtitan":
            raise ConfigError(
                own,
                "ep",
                "expert parallel runs torchtitan's own token dispatcher and parallelize.",
                "pass stack='torchtitan' with ep, or ep=1.",
            )
        if self.ep > 1 and self.fsdp != "blocks":
            raise ConfigError(
                own,
                "ep",
                "torchtitan's parallelize applies FSDP2 together with expert parallel.",
                "pass fsdp='blocks' with ep > 1.",
            )
        if self.stack == "torchtitan":
            self._check_torchtitan()
        elif self.torchtitan is not None:
            raise ConfigError(
                own,
                "torchtitan",
                "a torchtitan model config only applies to stack='torchtitan'.",
                "pass stack='torchtitan', or drop torchtitan=... and set model=ModelConfig(...).",
            )
        for name, cls in (("model", ModelConfig), ("ac", ACConfig), ("compile", CompileConfig)):
            if not isinstance(getattr(self, name), cls):
                raise ConfigError(
                    own,
                    name,
                    f"is a {type(getattr(self, name)).__name__}, not a {cls.__name__}.",
                    f"pass {cls.__name__}(...).",
                )
        for name in ("check_numerics", "measure_memory", "instrument"):
            check_bool(own, name, getattr(self, name))
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
            if self.ac != ACConfig() or self.compile != CompileConfig():
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
        self.model_config  # validates device/seed overrides
        device = self.torchtitan_config.device if self.stack == "torchtitan" else self.model_config.device
        if self.memory_snapshot is not None and not str(device).startswith("cuda"):
            raise ConfigError(
                own,
                "memory_snapshot",
                f"CUDA allocator snapshots need a CUDA device; this scenario runs on {device!r}, so no snapshot "
                "would be written.",
                "drop memory_snapshot (the Report's memory section is measured on CPU too), or run on device='cuda'.",
            )

    def _check_torchtitan(self) -> None:
        own = "Scenario"
        if self.torchtitan is not None and not isinstance(self.torchtitan, TorchtitanConfig):
            raise ConfigError(
                own,
                "torchtitan",
                f"is a {type(self.torchtitan).__name__}, not a TorchtitanConfig.",
                "pass toolkit.stacks.torchtitan.TorchtitanConfig(...).",
            )
        if self.model != ModelConfig() or self.device is not None or self.seed is not None:
            raise ConfigError(
                own,
                "model",
                "stack='torchtitan' builds torchtitan's own model, so the toolkit's "
                "ModelConfig / device / seed would be ignored.",
                "set them on torchtitan=TorchtitanConfig(...).",
            )
        if self.recipe is not None:
            raise ConfigError(
                own,
                "recipe",
                "a recipe is the toolkit's rebuild of torchtitan's transforms; with "
                "stack='torchtitan' its own code applies them.",
                "pass ac=ACConfig(mode=...) and compile=CompileConfig(scope='blocks', fullgraph=True).",
            )
        if self.ac.mode not in ("none", "full", "selective_op") or self.ac != ACConfig(mode=self.ac.mode):
            raise ConfigError(
                own,
                "ac",
                "torchtitan 0.3.0's AC is FullAC ('full') or SelectiveAC ('selective_op') with "
                "its own defaults (torch_remat arrived on main after the release, PR #4497).",
                "pass ACConfig(mode='none' | 'full' | 'selective_op') only; for torchtitan main's "
                "remat use stack='toolkit' with ACConfig(mode='remat') or recipe='torchtitan_main'.",
            )
        c = self.compile
        if c.enabled and (
            c.scope != "blocks"
            or not c.fullgraph
            or c.replace(backend="aot_eager") != CompileConfig(scope="blocks", fullgraph=True)
        ):
            raise ConfigError(
                own,
                "compile",
                "torchtitan's apply_compile compiles each block whole with fullgraph=True; only the backend is yours.",
                "pass CompileConfig(scope='blocks', fullgraph=True, backend=...).",
            )
        if self.fsdp == "blocks+experts":
            raise ConfigError(
                own,
                "fsdp",
                "torchtitan 0.3.0 shards the experts inside each block's unit.",
                "use fsdp='blocks' (its apply_fsdp_to_decoder) or stack='toolkit'.",
            )
        if self.torchtitan_config.n_experts % self.ep:
            raise ConfigError(
                own,
                "ep",
                f"{self.torchtitan_config.n_experts} routed experts do not split over ep={self.ep} ranks.",
                f"pick ep dividing {self.torchtitan_config.n_experts}, or set TorchtitanConfig(n_experts=...).",
            )
        require_torchtitan()

    @property
    def torchtitan_config(self) -> TorchtitanConfig:
        """torchtitan's model to build (stack "torchtitan"): `torchtitan`, or the default `TorchtitanConfig()`."""
        return self.torchtitan if self.torchtitan is not None else TorchtitanConfig()

    @property
    def model_config(self) -> ModelConfig:
        changes = {}
        if self.device is not None:
            changes["device"] = self.device
        if self.seed is not None:
            changes["seed"] = self.seed
        return self.model.replace(**changes) if changes else self.model

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        fsdp = f" | FSDP {self.fsdp}" if self.fsdp != "none" else ""
        fsdp += f" | EP {self.ep}" if self.ep > 1 else ""
        if self.stack == "torchtitan":
            c = self.compile
            comp = "eager" if not c.enabled else f"compile blocks ({c.backend_name}, fullgraph)"
            return f"{self.torchtitan_config.label} | AC {self.ac.mode} | {comp}{fsdp}"
        if self.recipe:
            return f"recipe {self.recipe}{fsdp}"
        c = self.compile
        scope = c.scope if isinstance(c.scope, str) else ",".join(c.scope)
        comp = "eager" if not c.enabled else f"compile {scope} ({c.backend_name}{', fullgraph' if c.fullgraph else ''})"
        return f"{self.model.experts_impl if self.model.has_moe else 'dense'} | AC {self.ac.mode} | {comp}{fsdp}"

    def replace(self, **changes) -> "Scenario":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"stack": self.stack} if self.stack != "toolkit" else {}
        if self.stack == "torchtitan":
            out["torchtitan"] = self.torchtitan_config.to_dict()
        if self.fsdp != "none":
            out["fsdp"] = self.fsdp  # only when set: the cache keys of existing matrix cells stay the same
        if self.ep > 1:
            out["ep"] = self.ep
        if not self.instrument:
            out["instrument"] = False  # only when off: the cache keys of instrumented cells stay the same
        return {
            **out,
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
    def from_dict(cls, data: dict[str, Any]) -> "Scenario":
        if not isinstance(data, dict):
            raise ConfigError(
                "Scenario",
                "",
                f"the JSON holds a {_json_type(data)}, not an object of Scenario fields.",
                'write an object such as {"ac": {"mode": "full"}, "compile": {"scope": "blocks"}} '
                "(Scenario.to_json() writes one).",
            )
        data = dict(data)
        check_known(cls, data)
        for name, sub in (("model", ModelConfig), ("ac", ACConfig), ("compile", CompileConfig)):
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
                    f'write "{name}": {example}, or leave "{name}" out for the default {sub.__name__}().',
                )
            data[name] = sub.from_dict(value)
        if isinstance(data.get("torchtitan"), dict):
            data["torchtitan"] = TorchtitanConfig.from_dict(data["torchtitan"])
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "Scenario":
        return cls.from_dict(json.loads(text))


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
