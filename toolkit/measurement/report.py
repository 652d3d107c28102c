"""`Report`: what one measured step showed, as frozen dataclasses with JSON and a plain-text twin.

`Report`: everything one measured training step showed, as frozen dataclasses with a JSON contract and a plain-text
twin.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from .._config import ConfigError, check_object
from .._escape import terminal
from ..instrument.records import (  # the instrument's records, which a Report holds
    GraphBreak,
    Memory,
    Numerics,
    SavedTensor,
    fmt_bytes,
    fmt_measured_bytes,
)
from ..transforms.naming import within

if typing.TYPE_CHECKING:
    from .scenario import Scenario

SCHEMA_VERSION = 2
Outcome = Literal["ok", "error", "crashed", "timeout"]
SEVERITY = (
    "grads_differ",
    "crashed",
    "timeout",
    "error",
    "fell_back_to_eager",
    "module_left_unwrapped",
    "sac_not_applied",
    "ac_saves_nothing",
    "recompiles",
    "graph_breaks",
    "works",
)
"""Every verdict a step can get, most severe first: the one order line 1, `classify` and the matrix read."""
OUTCOMES: tuple[str, ...] = typing.get_args(Outcome)
INPUT_WARNING = "InputWarning: "
"""How a captured `_config.InputWarning` starts in `Report.warnings` (`f"{category}: {message}"`)."""


def _recipe_ac_mode(recipe: str) -> str:
    """The AC mode a recipe applies ("recipe" for a name this toolkit does not know)."""
    from ..transforms.recipes import RECIPES

    return RECIPES[recipe].ac_mode if recipe in RECIPES else "recipe"


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
            object.__setattr__(self, "ac_mode", _recipe_ac_mode(self.recipe))

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
            ac_mode=_recipe_ac_mode(scenario.recipe) if scenario.recipe else scenario.ac.mode,
            compile_scope="recipe" if scenario.recipe else scope,
            backend=scenario.recipe_backend if scenario.recipe else (c.backend_name if c.enabled else "eager"),
            stack=scenario.stack,
            fsdp=scenario.fsdp,
            ep=scenario.ep,
            config=d,
        )

    def to_scenario(self) -> Scenario:
        """The Scenario this record came from (ConfigError for a user's module or a config holding callables)."""
        from .._config import ConfigError
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


def _names(names: tuple[str, ...], n: int = 6) -> str:
    """`layers.0, layers.1 …`: the first `n` canonical names ("" is the model)."""
    return ", ".join(x or "<model>" for x in names[:n]) + (" …" if len(names) > n else "")


def _fell_back_text(c: CompileInfo) -> str:
    """`compile requested, but layers.0, layers.1 ran eagerly (0 graphs)`; for checkpoints Dynamo gave up inside a
    region whose graphs otherwise ran: `… these checkpointed layers ran eagerly, outside the graph: model.layers.0`."""
    parts = []
    # A checkpoint inside a region that had no graph at all is said by that region's name already.
    inside = tuple(e for e in c.eager_checkpoints if not any(within(e, r) for r in c.regions_without_graphs))
    if c.regions_without_graphs or not inside:
        parts.append(f"{_names(c.regions_without_graphs) or 'every region'} ran eagerly")
    if inside:
        parts.append(
            f"these checkpointed layers ran eagerly, outside the graph: {_names(inside)} (a graph break inside each "
            "checkpoint)"
        )
    return f"compile requested, but {'; '.join(parts)} ({c.graphs} graphs)"


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
EXPLAINED = ("CheckpointError explained:", "CheckpointError likely cause:")
"""How the warnings a CheckpointError explanation puts first begin."""


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
        """`(label, why)` of each silent failure this Report shows on its own, most severe first: gradients that
        differ from the reference (a recompute that drew new random numbers always does), compile that fell back to
        eager, a memory budget that no partitioner read. The one rule `classify` and the summary's first line both
        read (the failures that need reference runs, a policy with no effect, are `classify`'s)."""
        if not self.ok:
            return ()
        out = []
        n, redrawn = self.numerics, self.recompute.redrawn
        if redrawn or (n.compared and not n.grads_match):
            why = []
            if redrawn:
                why.append(
                    f"recompute re-drew random numbers: {', '.join(redrawn[:3])}" + (" …" if len(redrawn) > 3 else "")
                )
            if n.compared and not n.grads_match:
                why.append(f"max |dgrad| {n.grad_diff_text} in {n.worst_param} vs {n.reference or 'the reference'}")
            out.append(("grads_differ", "; ".join(why)))
        c = self.compile
        if c.fell_back_to_eager:
            out.append(("fell_back_to_eager", _fell_back_text(c)))
        if c.memory_budget is not None and c.aot_autograd is False:
            # No partitioner read the budget: what it asked to recompute is saved (C66), whoever set it.
            out.append(
                (
                    "ac_saves_nothing",
                    f"activation_memory_budget {c.memory_budget:g} was set, but the graphs compiled without "
                    "AOTAutograd (the `eager` backend): no partitioner reads the budget, so nothing is recomputed",
                )
            )
        unwrapped = self.transforms.left_unwrapped
        if unwrapped:
            names = ", ".join(unwrapped[:6]) + (" …" if len(unwrapped) > 6 else "")
            out.append(
                (
                    "module_left_unwrapped",
                    f"AC was asked to checkpoint {names}, but {'it' if len(unwrapped) == 1 else 'they'} ran with no "
                    f"checkpoint around {'it' if len(unwrapped) == 1 else 'them'}",
                )
            )
        return tuple(sorted(out, key=lambda f: SEVERITY.index(f[0])))

    @property
    def verdict(self) -> str:
        """The first line's word: the outcome when the step did not end ("error", "crashed", "timeout"), else the most
        severe silent failure it shows, else "ok"."""
        if not self.ok:
            return self.outcome
        silent = self.silent_failures
        return silent[0][0] if silent else "ok"

    def to_dict(self) -> dict[str, Any]:
        return typing.cast("dict[str, Any]", _plain(self))  # a dataclass is written as a dict

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **({"indent": 2} | kwargs))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Report":
        """Rebuild from `to_dict` output: a record that is not one (no outcome, an unknown outcome, no saved or
        environment section, a schema newer than this toolkit's) is a ConfigError naming the field, never a Report
        that reads as ok with zeros."""
        check_object("Report", data, '{"outcome": "ok", "saved": {...}, ...} as Report.to_json() writes it')
        for key in ("outcome", "saved", "environment"):
            if key not in data:
                raise ConfigError(
                    "Report", key, "is missing: this is not a Report record.", "pass Report.to_json()'s output."
                )
        if data["outcome"] not in OUTCOMES:
            raise ConfigError(
                "Report",
                "outcome",
                f"{data['outcome']!r} is not one of {', '.join(OUTCOMES)}.",
                "pass a Report record.",
            )
        version = data.get("schema_version", 1)
        if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= SCHEMA_VERSION:
            raise ConfigError(
                "Report",
                "schema_version",
                f"{version!r} is not a schema this toolkit reads (1 to {SCHEMA_VERSION}).",
                "read it with the toolkit that wrote it, or measure again.",
            )
        for key in ("saved", "environment"):
            if not isinstance(data[key], dict):
                raise ConfigError("Report", key, f"is {data[key]!r}, not an object.", "pass a Report record.")
        if data["outcome"] != "ok" and not isinstance(data.get("error"), dict):
            raise ConfigError(
                "Report",
                "error",
                f"is {data.get('error')!r}, but outcome {data['outcome']!r} needs the error it ended on.",
                "pass a Report record as Report.to_json() writes it.",
            )
        data = dict(data)
        scen = data.get("scenario")
        if isinstance(scen, dict) and "measured" not in scen and "config" not in scen:
            data["scenario"] = _legacy_scenario(scen)  # schema 1: the Scenario dict itself
        return typing.cast("Report", _build(cls, data))  # not None: data is a dict

    @classmethod
    def from_json(cls, text: str) -> "Report":
        from .. import _files

        return cls.from_dict(_files.loads(text, "Report", "", name="the report"))

    def __str__(self) -> str:
        return format_report(self)


def _legacy_scenario(d: dict[str, Any]) -> dict[str, Any]:
    if d.get("measured") == "user module" or "model" not in d:
        return {"name": d.get("name", ""), "measured": "module", "ac_mode": "unknown"}
    comp = d.get("compile") or {}
    scope = comp.get("scope", "none")
    scope = scope if isinstance(scope, str) else ",".join(scope)
    recipe = d.get("recipe")
    return {
        "name": d.get("name", ""),
        "measured": "scenario",
        "recipe": recipe,
        "ac_mode": _recipe_ac_mode(recipe) if recipe else (d.get("ac") or {}).get("mode", "none"),
        "compile_scope": "recipe" if recipe else scope,
        "backend": d.get("recipe_backend", "aot_eager")
        if recipe
        else (comp.get("backend", "aot_eager") if scope != "none" else "eager"),
        "config": d,
    }


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (tuple, list)):
        return [_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, float) and obj != obj:
        return None  # NaN is not JSON
    return obj


@functools.cache
def _hints(cls: type) -> tuple[dict[str, Any], tuple[dataclasses.Field[Any], ...]]:
    """A Report class's resolved field types and fields, once per class (resolving them is most of reading a
    results.jsonl)."""
    return typing.get_type_hints(cls), dataclasses.fields(cls)


def _build(cls: type, data: Any, where: str = "") -> Any:
    if data is None:
        return None
    where = where or cls.__name__
    if not isinstance(data, dict):
        raise _not_schema(where, data, "an object")
    hints, fields = _hints(cls)
    kwargs = {}
    for f in fields:
        if f.name not in data:
            continue
        kwargs[f.name] = _convert(hints[f.name], data[f.name], f"{where}.{f.name}")
    return cls(**kwargs)


_MAX_COUNT = 1 << 63
"""Every integer a Report holds is a count, a size in bytes, a rank or a line: from 0 to what an int64 holds."""


def _not_schema(where: str, value: Any, what: str) -> ConfigError:
    owner, _, field_ = where.partition(".")
    shown = repr(value) if not isinstance(value, int) or abs(value) < 10**20 else f"a {len(str(value))}-digit number"
    return ConfigError(owner, field_, f"{shown[:80]} is not {what}.", "pass a record as Report.to_json() writes it.")


def _convert(tp: Any, value: Any, where: str) -> Any:
    """`value` read as type `tp`, or a ConfigError naming the field (`Saved.total_bytes`): the one check of a
    Report's schema, so that a record read from a file is what a measurement would have written (a string where bytes
    belong, a negative or 300-digit count, a list where a table belongs, a kind or outcome that is none of its type's
    values are refused, not shown as if measured)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if value is None:
        if tp is float:
            return float("nan")  # NaN is written as null (JSON has no NaN)
        if (origin is typing.Union or origin is types.UnionType) and type(None) in args or tp is Any:
            return None
        raise _not_schema(where, value, "a value (this field is never null in a record)")
    if dataclasses.is_dataclass(tp):
        return _build(typing.cast(type, tp), value, where)  # a field's type: a class, never an instance
    if origin is typing.Union or origin is types.UnionType:
        for a in args:
            if a is type(None):
                continue
            return _convert(a, value, where)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise _not_schema(where, value, "a list")
        inner = args[0] if args else Any
        return tuple(_convert(inner, v, f"{where}[]") for v in value)
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise _not_schema(where, value, "an object")
        return {k: _convert(args[1], v, f"{where}[]") for k, v in value.items()} if args else dict(value)
    if origin is Literal:
        if not any(value == a and type(value) is type(a) for a in args):  # 1 == True, but 1 is no such value
            raise _not_schema(where, value, f"one of {', '.join(map(repr, args))}")
        return value
    if tp is bool and not isinstance(value, bool):
        raise _not_schema(where, value, "true or false")
    if tp is int and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _MAX_COUNT):
        raise _not_schema(where, value, f"a count from 0 to {_MAX_COUNT - 1}")
    if tp is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise _not_schema(where, value, "a number")
    if tp is str and not isinstance(value, str):
        raise _not_schema(where, value, "text")
    return value


# --- plain text -----------------------------------------------------------------------------------------


def _top(d: dict[str, int], n: int = 6) -> str:
    items = sorted(d.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    more = len(d) - len(items)
    return ", ".join(f"{k or '<model>'} {fmt_bytes(v)}" for k, v in items) + (f", +{more} more" if more > 0 else "")


def format_report(r: Report) -> str:
    """A deterministic summary: rounded numbers, no timings, no addresses (what nbval compares)."""
    lines = []
    title = terminal(r.scenario.name) or "scenario"  # a Report read from a file may carry anything
    silent = r.silent_failures
    # The verdict leads: a step that ran to its end with wrong gradients is not "ok" on the first line.
    lines.append(
        f"{title}: {r.outcome}" if not silent else f"{title}: {silent[0][0]} [silent failure] — {silent[0][1]}"
    )
    if r.error is not None:
        lines.append(f"  error at {r.error.stage}: {r.error.type}: {r.error.message.splitlines()[0][:200]}")
    if r.checkpoint_error is not None:
        lines += [f"  {line}" for line in r.checkpoint_error.lines()]
    # An input that ran but did nothing of what it says (InputWarning) leads, before any number it may explain.
    inputs = [w for w in r.warnings if w.startswith(INPUT_WARNING)]
    for w in inputs:
        lines.append(f"  input: {w[len(INPUT_WARNING) :].splitlines()[0][:300]}")
    others = [w for w in _shown_warnings(r) if not w.startswith(INPUT_WARNING)]
    if r.outcome in ("crashed", "timeout") and r.error is None:
        return "\n".join(lines)
    measured = bool(r.saved.tensors) or bool(r.memory.method) or r.numerics.loss is not None
    if not measured:
        if r.compile.requested and r.compile.orders:
            lines.append("  compile orders: " + ", ".join(sorted(set(r.compile.orders.values()))))
        for w in others[:3]:
            lines.append(f"  warning: {w.splitlines()[0][:140]}")
        return "\n".join(lines)
    s = r.saved
    lines.append(
        f"  saved for backward: {fmt_bytes(s.total_bytes)} in {len(s.tensors)} tensors "
        f"(+{fmt_bytes(s.params_bytes)} params/buffers)"
    )
    if s.by_kind:
        lines.append("    by kind: " + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in sorted(s.by_kind.items())))
    if s.by_module:
        lines.append("    by module: " + _top(s.by_module))
    if s.by_op:
        lines.append("    by op: " + _top(s.by_op))
    rc = r.recompute
    rerun = ", ".join(f"{k} x{v}" for k, v in sorted(rc.compiled_reruns.items()))
    lines.append(
        f"  recomputed in backward: {rc.ops} ops"
        + (f" (+{rc.bookkeeping} of the checkpoint's own)" if rc.bookkeeping else "")
        + (f"; compiled regions re-run: {rerun}" if rerun else "")
        + (f"; {rc.in_compiled_backward} forward ops inside compiled backward" if rc.in_compiled_backward else "")
    )
    c = r.compile
    if c.requested:
        warm = f" ({c.warm_graphs} compiled before the step)" if c.warm_graphs else ""
        lines.append(
            f"  compile: {c.graphs} graphs{warm}, {c.graph_breaks} graph breaks, {len(c.recompiles)} recompiles"
            + (
                "; FELL BACK TO EAGER in " + _names((*c.regions_without_graphs, *c.eager_checkpoints), 99)
                if c.fell_back_to_eager
                else ""
            )
        )
        if c.memory_budget is not None:
            lines.append(f"    activation_memory_budget {c.memory_budget:g} (read from torch's config in the step)")
        if c.compiled_later:
            lines.append(f"    a later step compiled {c.compiled_later} more graphs (not counted above)")
        for b in c.breaks[:5]:
            lines.append(f"    break at {b.place}: {b.reason.splitlines()[0][:120]}")
    else:
        lines.append("  compile: not requested")
    m = r.memory
    if m.method:
        lines.append(
            f"  memory ({m.device}, {m.method}): peak {fmt_measured_bytes(m.peak_bytes)}, "
            f"held after forward {fmt_measured_bytes(m.held_after_forward_bytes)}"
        )
    n = r.numerics
    if n.loss is not None:
        if n.compared:
            lines.append(
                f"  numerics: loss {n.loss:.4f}; vs {n.reference or 'the reference'}: |dloss| "
                f"{'-' if n.loss_diff is None else format(n.loss_diff, '.1e')}, "
                f"max |dgrad| {n.grad_diff_text} -> {'match' if n.grads_match else 'MISMATCH'}"
            )
        else:
            lines.append(
                f"  numerics: loss {n.loss:.4f}; gradients not compared" + (f" ({n.reference})" if n.reference else "")
            )
    d = r.distributed
    if d.world_size > 1 or d.collectives:
        calls = ", ".join(f"{k} x{v}" for k, v in d.collectives.items())
        lines.append(f"  rank {d.rank} of {d.world_size}" + (f"; collectives: {calls}" if calls else ""))
    for spot in r.blind_spots:
        lines.append(f"  cannot see: {spot.split(' (', 1)[0]}")
    for w in others[:3]:
        lines.append(f"  warning: {w.splitlines()[0][:140]}")
    return "\n".join(lines)


def _shown_warnings(r: Report) -> list[str]:
    """The warnings the summary lists: a CheckpointError's explanation has its own lines above them."""
    return [w for w in r.warnings if not (r.checkpoint_error is not None and w.startswith(EXPLAINED))]
