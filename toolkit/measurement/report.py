"""`Report`: what one measured step showed, as frozen dataclasses; its JSON is `schema`'s, its text `text`'s and its
verdict `verdict`'s."""

from __future__ import annotations

import json
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from .._config import ConfigError
from .._escape import terminal
from ..instrument.records import (  # the instrument's records, which a Report holds
    GraphBreak,
    Memory,
    Numerics,
    SavedTensor,
)
from ..transforms.naming import within
from .schema import SCHEMA_VERSION, Outcome, plain, read, recipe_ac_mode
from .text import EXPLAINED, format_report
from .verdict import silent_failures, verdict

if typing.TYPE_CHECKING:
    from .scenario import Scenario


@dataclass(frozen=True)
class ScenarioRecord:
    """What was measured: a toolkit Scenario (`tk.run`) or a user's module or callable (`tk.measure`)."""

    name: str = ""
    """The label shown in reports and tables."""
    measured: Literal["scenario", "module"] = "scenario"
    """"scenario" (`tk.run`) or "module" (`tk.measure` on a user's module or callable)."""
    recipe: str | None = None
    ac_mode: str = "none"
    """The ACConfig mode — for a recipe the mode it applies (`Recipe.ac_mode`) — or "unknown" for a user's module."""
    compile_scope: str = "none"
    backend: str = "eager"
    stack: str = "toolkit"
    """A stack of `toolkit.stacks` ("toolkit", "torchtitan", "transformers": whose model and transforms) or "user"
    (`tk.measure`)."""
    fsdp: Literal["none", "blocks", "blocks+experts"] = "none"
    ep: int = 1
    """Expert-parallel degree (torchtitan's own EP)."""
    config: dict[str, Any] = field(default_factory=dict)
    """`Scenario.to_dict()` of a toolkit scenario (empty for a user's module): `to_scenario()` rebuilds it."""

    def __post_init__(self) -> None:
        if self.recipe and self.ac_mode == "recipe":  # written before recipes carried their AC mode
            object.__setattr__(self, "ac_mode", recipe_ac_mode(self.recipe))

    @classmethod
    def of(cls, scenario: Any) -> "ScenarioRecord":
        """The record of a `toolkit.Scenario`."""
        d = {**scenario.to_dict(), "name": scenario.label}
        c = scenario.compile
        scope = c.scope if isinstance(c.scope, str) else ",".join(c.scope)
        return cls(
            name=scenario.label,
            measured="scenario",
            recipe=scenario.recipe,
            ac_mode=recipe_ac_mode(scenario.recipe) if scenario.recipe else scenario.ac.mode,
            compile_scope="recipe" if scenario.recipe else scope,
            backend=scenario.recipe_backend if scenario.recipe else (c.backend_name if c.enabled else "eager"),
            stack=scenario.stack,
            fsdp=scenario.fsdp,
            ep=scenario.ep,
            config=d,
        )

    def to_scenario(self) -> Scenario:
        """The Scenario this record came from (ConfigError for a user's module or a config holding callables)."""
        from .scenario import Scenario

        if self.measured != "scenario" or not self.config:
            raise ConfigError(
                "ScenarioRecord",
                "measured",
                f"{self.name!r} was a user's module, not a Scenario.",
                "pass the Scenario explicitly (e.g. repro.export(report, path, scenario=...)).",
            )
        # A name read from a file is shown, never run: its control characters escaped, as every line shows them.
        return Scenario.from_dict({**self.config, "name": terminal(self.config.get("name", ""))[:200]})


@dataclass(frozen=True)
class Saved:
    tensors: tuple[SavedTensor, ...] = ()
    total_bytes: int = 0
    by_module: dict[str, int] = field(default_factory=dict)
    by_op: dict[str, int] = field(default_factory=dict)
    by_kind: dict[str, int] = field(default_factory=dict)
    params_bytes: int = 0
    """Bytes of parameters and buffers that backward also holds on to (not counted in total_bytes)."""


@dataclass(frozen=True)
class Recompute:
    ops: int = 0
    """Forward ops re-executed eagerly during backward that the probes could see — the model's own ops only: the
    recompute machinery's work is `bookkeeping`."""
    by_op: dict[str, int] = field(default_factory=dict)
    by_module: dict[str, int] = field(default_factory=dict)
    bookkeeping: int = 0
    """Ops the recompute machinery dispatched for itself, not the model's: torch.utils.checkpoint's `detach` of
    each recomputed tensor it keeps, torch_remat's replay of a kept region (its saved inputs re-derived as views)."""
    bookkeeping_by_op: dict[str, int] = field(default_factory=dict)
    compiled_reruns: dict[str, int] = field(default_factory=dict)
    """Compiled regions whose forward ran again during backward (AC(compile(x))), with how often."""
    in_compiled_backward: int = 0
    """Forward ops the partitioner placed in compiled backward graphs (compile(AC(x)) recompute), per step."""
    flops: int = 0
    """FLOPs of the forward ops run again in backward (matmuls, attention, convolutions by torch's formulas;
    pointwise ops are free): an eager recompute's as it runs, a compiled backward graph's from its shapes."""
    forward_flops: int = 0
    """FLOPs of the step's forward, counted alike: the scale `flops` is read against."""
    redrawn: tuple[str, ...] = ()
    """"module (op)" of each random op an eager recompute ran with other random numbers than its forward drew (the
    RNG state not restored: `preserve_rng_state=False`, a policy recomputing dropout): silently wrong gradients."""


@dataclass(frozen=True)
class CompileInfo:
    requested: bool = False
    """Something in the model is compiled (by the toolkit, a recipe or the user)."""
    graphs: int = 0
    """Distinct compiled graphs that ran in the step: compiled now, or before the step (a warm model)."""
    compiled_in_step: int = 0
    """Graphs Dynamo compiled during the measured step (0 for a warm model)."""
    warm_graphs: int = 0
    """Graphs that ran but were compiled before the step."""
    compiled_later: int = 0
    """Graphs Dynamo compiled in the steps after the measured one (the memory and steady steps), counted apart:
    a later step compiled again, which the measured step's figures do not include."""
    memory_budget: float | None = None
    """torch's `activation_memory_budget` in force while the step ran, when below 1 (None: 1, the default), read
    from torch's config whoever set it (the toolkit's memory-budget mode, a user's `config.patch`)."""
    aot_autograd: bool | None = None
    """Whether the graphs Dynamo compiled in the step went through AOTAutograd (`aot_eager`, `inductor`), whoever
    chose the backend; False: a backend that runs Dynamo's graph as traced (`eager`: no partition, so no memory budget,
    and a traced checkpoint runs its higher-order op's eager code); None: no graph was compiled in the step."""
    graph_breaks: int = 0
    breaks: tuple[GraphBreak, ...] = ()
    recompiles: tuple[str, ...] = ()
    fell_back_to_eager: bool = False
    """Compile was requested but some compiled region ran without any graph (e.g. a graph break inside a
    checkpointed block with fullgraph=False: C2)."""
    regions_without_graphs: tuple[str, ...] = ()
    eager_checkpoints: tuple[str, ...] = ()
    """Checkpointed modules whose checkpoint ran eagerly inside a compiled region: Dynamo gave the checkpoint up (a
    graph break inside it, C67) and ran it, and the layer it holds, outside the graph around it. The region may
    still have graphs (whole-model compile), so `regions_without_graphs` does not show it."""
    orders: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Transforms:
    """What the transforms did to the model, by canonical name: the toolkit's own, or what a stack's own code left
    (torchtitan's wrappers, transformers' per-layer flags); for `measure` of a user's module, only what the user
    names in `checkpointed=`."""

    checkpointed: tuple[str, ...] = ()
    """Modules AC was asked to checkpoint: wrapped in a CheckpointWrapper or given a torch_remat checkpoint `forward`
    (the toolkit, torchtitan), flagged by the stack's own switch (transformers), or named in `measure(checkpointed=)`.
    """
    compiled: tuple[str, ...] = ()
    """Compile targets ("" = the whole model)."""
    under_checkpoint: tuple[str, ...] | None = None
    """Modules the measured step's forward ran inside a checkpoint region: entered inside one eagerly, or with ops a
    compiled graph tagged as checkpointed. None when the probes did not watch the step."""
    selective: tuple[str, ...] = ()
    """Checkpoints the step saw begin with a selective policy (a `context_fn`: SAC), whoever set it: what a model the
    toolkit did not configure shows of its AC mode."""
    fsdp_in_compiled: tuple[str, ...] = ()
    """FSDP2 units strictly inside a compiled region, read off the model: Dynamo meets their hooks while tracing the
    region (with fullgraph=True it cannot, C53)."""
    fsdp_in_checkpoint: tuple[str, ...] = ()
    """FSDP2 units strictly inside a checkpointed module: a recompute runs their hooks again (under per-op SAC it
    meets their profiler op, C54)."""
    unresolved: tuple[str, ...] = ()
    """Compiled regions inside which a checkpoint ran around modules the probes cannot name (the `eager` backend runs
    a compiled graph's checkpoints eagerly, where no module hook is; a forward graph that could not be read)."""

    @property
    def left_unwrapped(self) -> tuple[str, ...]:
        """Modules AC was asked to checkpoint (`checkpointed`) that ran without any checkpoint around them or inside
        them: AC silently off there (NVIDIA-NeMo/Automodel#3213's class). Those in `unplaced` are not named:
        unknown is not unwrapped."""
        ran = self.under_checkpoint
        if ran is None:
            return ()
        unplaced = self.unplaced
        return tuple(
            m for m in self.checkpointed if m not in unplaced and not any(within(r, m) or within(m, r) for r in ran)
        )

    @property
    def unplaced(self) -> tuple[str, ...]:
        """Modules AC was asked to checkpoint that sit inside an `unresolved` region: whether they ran under a
        checkpoint is not known (a blind spot, said as one)."""
        return tuple(m for m in self.checkpointed if any(within(m, u) for u in self.unresolved))


@dataclass(frozen=True)
class Distributed:
    rank: int = 0
    world_size: int = 1
    collectives: dict[str, int] = field(default_factory=dict)
    """"phase: op" → calls of the collectives dispatched eagerly (FSDP all-gathers / reduce-scatters, EP
    all-to-alls); those inside compiled graphs are not seen."""


@dataclass(frozen=True)
class Timing:
    build_s: float = 0.0
    apply_s: float = 0.0
    compile_s: float = 0.0
    """Dynamo + backend compile time of the frames compiled in the first step (torch's compilation metrics)."""
    first_step_s: float = 0.0
    """The instrumented first step (compiles; probes on)."""
    first_forward_s: float = 0.0
    first_backward_s: float = 0.0
    steady_step_s: float = 0.0
    """Median of the un-instrumented steady steps."""
    steady_forward_s: float = 0.0
    steady_backward_s: float = 0.0


@dataclass(frozen=True)
class ErrorInfo:
    type: str
    message: str
    stage: str


CAUSES: dict[str, str] = {
    "rng_not_preserved": "RNG not preserved: the region draws random numbers and its recompute draws others",
    "side_effect": "a side effect in the forward: state the region wrote in place was read again by the recompute",
    "compile_switch": "a recompile or a switch between compiled and eager code between the forward and the recompute",
    "routing_changed": "routing decisions differ between the forward and the recompute",
    "token_count_changed": "a token count changed between the forward and the recompute",
    "unknown": "not identified from what the probes saw",
}
"""The likely causes a CheckpointError explanation can name, most specific first (`CheckpointDivergence.cause`)."""


@dataclass(frozen=True)
class DivergedTensor:
    """One side (forward or recompute) of the saved tensor that diverged."""

    op: str = "unknown"
    """The op whose autograd node saved it ("compiled graph" when a compiled graph's runtime did)."""
    module: str = ""
    """Canonical name of the module running when it was saved ("" = the model itself)."""
    shape: tuple[int, ...] = ()
    dtype: str = ""
    device: str = ""

    def text(self) -> str:
        """`float32[30, 64] on cpu`."""
        return f"{self.dtype}[{', '.join(map(str, self.shape))}] on {self.device}"

    def origin(self) -> str:
        """`aten.mm.default in layers.0.moe`."""
        return f"{self.op} in {self.module or '<model>'}"


@dataclass(frozen=True)
class RoutingChange:
    """A routing decision (`topk`) that came out differently in the recompute than in the forward."""

    module: str = ""
    op: str = ""
    tokens: int = 0
    """Rows of the decision (tokens routed)."""
    changed: int = 0
    """Tokens whose set of selected experts differs."""
    counts_forward: tuple[int, ...] = ()
    """Tokens per expert in the forward (a count op's output where the region has one, else from the decision)."""
    counts_recompute: tuple[int, ...] = ()

    def text(self) -> str:
        counts = (
            f"; tokens per expert {list(self.counts_forward)} -> {list(self.counts_recompute)}"
            if self.counts_forward != self.counts_recompute
            else ""
        )
        where = f"{self.module or '<model>'} ({self.op})"
        return f"{self.changed} of {self.tokens} tokens chose other experts in {where}{counts}"


@dataclass(frozen=True)
class CheckpointDivergence:
    """Why a `torch.utils.checkpoint.CheckpointError` was raised: which saved tensor of which region diverged between
    the forward and the recompute, and the likely cause, from what the probes saw during the step (nothing re-run)."""

    region: str = ""
    """The checkpointed region (its wrapper's name, or the module that called `checkpoint`; "" = the model)."""
    position: int | None = None
    """Index of the first diverged tensor among those the region saved, as torch's message counts them."""
    diverged: int = 0
    """How many saved tensors differ (a count mismatch included)."""
    saved_forward: int = 0
    """Tensors the region saved in the forward."""
    saved_recompute: int = 0
    """Tensors its recompute saved before the check (0 when only the message was seen)."""
    forward: DivergedTensor | None = None
    recompute: DivergedTensor | None = None
    cause: str = "unknown"
    """A key of `CAUSES`."""
    evidence: tuple[str, ...] = ()
    """What the probes saw that points to the cause, one sentence each."""
    routing: RoutingChange | None = None
    seen_by: Literal["probes", "message"] = "probes"
    """"probes": from what the probes recorded of the region; "message": from torch's error message alone (this
    torch lacks the checkpoint hooks the probes read, or the region was not seen)."""

    def summary(self) -> str:
        """One sentence: where it diverged, with the forward's and the recompute's shape, dtype and device."""
        where = self.region or "<model>"
        count = (
            f"saved {self.saved_forward} tensors in the forward, {self.saved_recompute} in the recompute; "
            if self.saved_recompute and self.saved_recompute != self.saved_forward
            else ""
        )
        if self.position is None or self.forward is None:
            return f"checkpointed region {where}: {count or 'the recompute saved different tensors than the forward'}"
        rec = (
            f"{self.recompute.text()} in the recompute"
            + (f" ({self.recompute.origin()})" if self.recompute.origin() != self.forward.origin() else "")
            if self.recompute is not None
            else "nothing in the recompute"
        )
        return (
            f"checkpointed region {where} {count}saved tensor {self.position} ({self.forward.origin()}) is "
            f"{self.forward.text()} in the forward, {rec}"
        )

    def cause_text(self) -> str:
        return CAUSES.get(self.cause, self.cause) + (f" ({self.routing.text()})" if self.routing else "")

    def warnings(self) -> list[str]:
        """The Report's first warning lines (`EXPLAINED`): the summary and the likely cause."""
        return [f"{EXPLAINED[0]} {self.summary()}", f"{EXPLAINED[1]} {self.cause_text()}"]

    def lines(self) -> list[str]:
        """The explanation as report lines (summary, cause, evidence)."""
        out = [f"diverged: {self.summary()}", f"likely cause: {self.cause_text()}"]
        out += [f"seen: {e}" for e in self.evidence]
        if self.seen_by == "message":
            out.append("seen: torch's error message only (the probes did not see the region's saved tensors)")
        return out


@dataclass(frozen=True)
class Report:
    outcome: Outcome = "ok"
    error: ErrorInfo | None = None
    warnings: tuple[str, ...] = ()
    scenario: ScenarioRecord = field(default_factory=ScenarioRecord)
    environment: dict[str, Any] = field(default_factory=dict)
    saved: Saved = field(default_factory=Saved)
    recompute: Recompute = field(default_factory=Recompute)
    compile: CompileInfo = field(default_factory=CompileInfo)
    memory: Memory = field(default_factory=Memory)
    numerics: Numerics = field(default_factory=Numerics)
    timing: Timing = field(default_factory=Timing)
    blind_spots: tuple[str, ...] = ()
    """What this Report cannot see on this torch (a private API missing or changed), one sentence each."""
    distributed: Distributed = field(default_factory=Distributed)
    transforms: Transforms = field(default_factory=Transforms)
    checkpoint_error: CheckpointDivergence | None = None
    """When the step raised a CheckpointError: which saved tensor diverged and the likely cause."""
    packages: tuple[str, ...] = ()
    """Top-level packages whose classes make up the measured model, torch's left out (`("transformers",)`), read off
    the model whoever built it: what a case about one package's code matches (`catalogue`'s `packages`)."""
    schema_version: int = SCHEMA_VERSION

    @property
    def ok(self) -> bool:
        """The step ran to its end (it may still be a silent failure: `verdict`)."""
        return self.outcome == "ok"

    @property
    def silent_failures(self) -> tuple[tuple[str, str], ...]:
        """`(label, why)` of each silent failure this Report shows on its own, most severe first (`verdict`)."""
        return silent_failures(self)

    @property
    def verdict(self) -> str:
        """The first line's word: the outcome when the step did not end, else its most severe silent failure, else
        "ok" (`verdict.verdict`)."""
        return verdict(self)

    def to_dict(self) -> dict[str, Any]:
        return typing.cast("dict[str, Any]", plain(self))  # a dataclass is written as a dict

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **({"indent": 2} | kwargs))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Report":
        """Rebuild from `to_dict` output; a record that is not one is a ConfigError naming the field (`schema.read`)."""
        return read(cls, data)

    @classmethod
    def from_json(cls, text: str) -> "Report":
        from .. import _files

        return cls.from_dict(_files.loads(text, "Report", "", name="the report"))

    def __str__(self) -> str:
        return format_report(self)
