"""Will it fit: the AC × compile setup that fits a per-rank memory budget at the least recompute, among those the
central list does not mark broken on the installed torch.

`plan(scenario, budget="80GiB", world_size=64)` sizes each candidate setup (AC mode × compile scope × order ×
backend) with `estimate` on fake tensors, one rank of `world_size` under FSDP2. A setup whose cell of the central
list's sweep (the committed records, `docs/central-list/results.jsonl.xz`) does not work on this torch release is
dropped, named with its cases and why, before anything is sized. The rest are ranked: those that fit by recompute
(the FLOPs a setup runs in backward beyond the same step without AC, then the forward ops it re-runs), then by
memory. Line 1 of `str(plan)` is the verdict: the setup to use, its peak per rank and its recompute.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast

from .. import _files, compat
from .._config import ConfigError, check_bytes, check_instance, check_int
from ..estimation import MAX_WORLD_SIZE, Estimate, estimate
from ..instrument.records import fmt_bytes
from ..measurement.scenario import Scenario
from ..models import ModelConfig
from ..transforms import ACConfig, CompileConfig
from .catalogue import torch_release

if TYPE_CHECKING:
    from ..transforms.compile import Scope

Status = Literal["fits", "over budget", "broken", "not estimable"]


@dataclass(frozen=True)
class Setup:
    """One candidate: an AC mode, a compile scope ("none": eager), the order where both wrap a block, a backend."""

    ac: str = "none"
    scope: str = "none"
    order: str | None = None
    backend: str = "aot_eager"

    @property
    def baseline(self) -> "Setup":
        """The same compile setup without AC: what this setup's recompute is counted against."""
        return Setup("none", self.scope, None, self.backend)

    @property
    def label(self) -> str:
        ac = "no AC" if self.ac == "none" else f"{self.ac} AC"
        if self.scope == "none":
            return f"{ac}, eager"
        order = {"ac_outside": ", AC(compile(x))", "compile_outside": ", compile(AC(x))"}.get(self.order or "", "")
        return f"{ac}, compile {self.scope} ({self.backend}){order}"

    def scenario(self, base: Scenario) -> Scenario:
        ac = ACConfig.of(mode=self.ac)
        # The setup's names, the config's words (CompileConfig checks them at run time).
        order = cast('Literal["compile_outside", "ac_outside"] | None', self.order)
        compile = (
            CompileConfig(scope=cast("Scope", self.scope), backend=self.backend, order=order)
            if self.scope != "none"
            else CompileConfig()
        )
        return base.replace(ac=ac, compile=compile, name=self.label)


PLAN_AC_MODES = ("none", "full", "selective_op", "memory_budget")
PLAN_SCOPES = ("none", "blocks", "model")


def candidates(
    backends: tuple[str, ...] = ("aot_eager", "inductor"),
    ac_modes: tuple[str, ...] = PLAN_AC_MODES,
    scopes: tuple[str, ...] = PLAN_SCOPES,
) -> tuple[Setup, ...]:
    """About 20 setups: AC none / full / per-op SAC / the partitioner's memory budget, eager or compiled per block or
    whole, both orders where compile and AC wrap the same block, on each backend; only the AC modes and compile
    scopes ("none": eager) asked for."""
    return tuple(s for s in _every_candidate(backends) if s.ac in ac_modes and s.scope in scopes)


def _every_candidate(backends: tuple[str, ...]) -> list[Setup]:
    out = [Setup("none"), Setup("full"), Setup("selective_op")]
    for backend in backends:
        for scope in ("blocks", "model"):
            out.append(Setup("none", scope, None, backend))
            for ac in ("full", "selective_op"):
                out.append(Setup(ac, scope, None, backend))
                if scope == "blocks":
                    out.append(Setup(ac, scope, "ac_outside", backend))
            out.append(Setup("memory_budget", scope, None, backend))
    return out


@dataclass(frozen=True)
class PlanRow:
    setup: str
    ac: str
    scope: str
    order: str | None
    backend: str
    status: Status
    per_rank_bytes: int = 0
    peak_bytes: int = 0
    saved_bytes: int = 0
    recompute_flops: int = 0
    """FLOPs run in backward beyond the same compile setup without AC: the recompute's matmuls and attention."""
    recompute_ops: int = 0
    """aten ops run in backward beyond the same compile setup without AC: the forward ops re-run."""
    cases: tuple[str, ...] = ()
    why: str = ""


@dataclass(frozen=True)
class Plan:
    """The candidates sized and judged (plain data; JSON round-trip; `str()` is the table, verdict on line 1)."""

    torch: str
    world_size: int
    budget_bytes: int
    scenario: dict[str, Any] = field(default_factory=dict)
    rows: tuple[PlanRow, ...] = ()
    pick: str | None = None
    forward_flops: int = 0
    extrapolated: bool = False
    """The model's blocks are alike: each setup was traced at 2, 3, … blocks and extended to the model's depth by
    the step each figure takes per block (the same step twice in a row)."""
    checked_on: str | None = None
    """The release whose central-list records judged the setups (None: this release is not in them)."""
    seconds: float = 0.0

    def verdict(self) -> str:
        where = f"per rank of {self.world_size}" if self.world_size > 1 else "on one device"
        budget = f"budget {fmt_bytes(self.budget_bytes)} {where}, torch {self.torch}"
        if self.pick is None:
            sized = [r for r in self.rows if r.status == "over budget"]
            least = min(sized, key=lambda r: r.per_rank_bytes, default=None)
            smallest = f"; the smallest is {least.setup}: {fmt_bytes(least.per_rank_bytes)}" if least else ""
            return f"plan: no setup fits ({budget}){smallest}"
        row = next(r for r in self.rows if r.setup == self.pick)
        share = f" ({row.recompute_flops / self.forward_flops:.0%} of the forward)" if self.forward_flops else ""
        return (
            f"plan: use {row.setup} — {fmt_bytes(row.per_rank_bytes)} ({budget}), recompute "
            f"{_fmt_flops(row.recompute_flops)}{share}"
        )

    def __str__(self) -> str:
        lines = [self.verdict()]
        if self.extrapolated:
            lines.append(
                f"  note: {self.scenario.get('model', {}).get('n_layers')} alike blocks: each setup traced at 2, 3, … "
                "blocks and extended by its step per block (the same step twice in a row)"
            )
        if self.checked_on is None:
            lines.append(
                f"  note: torch {self.torch} is not in the central list's records: no setup was checked for known "
                "breakage (run `python -m toolkit matrix` on it to add them)"
            )
        lines.append(f"  {'setup':<46} {'status':<13} {'per rank':>10} {'recompute':>10}  cases / why")
        for r in self.rows:
            sized = r.status in ("fits", "over budget")
            per_rank = fmt_bytes(r.per_rank_bytes) if sized else "-"
            flops = _fmt_flops(r.recompute_flops) if sized else "-"
            why = ", ".join(r.cases) + (": " if r.cases and r.why else "") + r.why
            why = why if len(why) <= 110 else why[:109] + "…"  # whole in the JSON
            lines.append(f"  {r.setup:<46} {r.status:<13} {per_rank:>10} {flops:>10}  {why}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        data = _files.loads(text, "Plan", "", name="the plan")
        rows = tuple(PlanRow(**{**r, "cases": tuple(r["cases"])}) for r in data.pop("rows"))
        return cls(**data, rows=rows)


def _fmt_flops(n: int) -> str:
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} FLOP"


def _block(model: ModelConfig) -> str:
    """The central list's block kind for this model (its sweep's `Cell.block`)."""
    return f"moe:{model.experts_impl}" if model.has_moe else "dense"


@functools.lru_cache(maxsize=1)
def _verdicts(path: str) -> dict[str, dict[tuple, tuple[str, tuple[str, ...], str]]]:
    """The central list's sweep, per torch release: each toolkit cell's (label, cases, explanation), keyed by
    (block, AC mode, scope, order, backend). Read once per process (about 9 s)."""
    from . import store
    from .matrix import by_release

    records, _ = store.read_results(pathlib.Path(path))
    out: dict[str, dict[tuple, tuple[str, tuple[str, ...], str]]] = {}
    for release, result in by_release(records).items():
        for row in result.rows:
            c = row.cell
            if c.stack == "toolkit" and c.recipe is None and c.fsdp == "none" and not c.fullgraph:
                cl = row.classification
                key = (c.block, c.ac, c.scope, c.order, c.backend)
                out.setdefault(release, {})[key] = (cl.label, tuple(cl.cases), cl.explanation)
    return out


def verdicts(release: str | None = None) -> dict[tuple, tuple[str, tuple[str, ...], str]] | None:
    """What the central list's sweep found for each toolkit cell on `release` (default: the installed torch's), as
    `{(block, AC mode, scope, order, backend): (label, cases, why)}`; None when the records hold no such release."""
    from .matrix import records_path

    return _verdicts(str(records_path())).get(release or torch_release())


def plan(
    scenario: Scenario | ModelConfig,
    *,
    budget: int | str,
    world_size: int = 1,
    setups: tuple[Setup, ...] | None = None,
    reshard_after_forward: bool = True,
) -> Plan:
    """Size each setup of `setups` (default `candidates()`) for one rank of `world_size` (FSDP2 over its blocks when
    above 1) and pick the one that fits `budget` per rank at the least recompute; see the module doc."""
    check_instance("plan", "scenario", scenario, (Scenario, ModelConfig), "pass a tk.Scenario or a tk.ModelConfig.")
    budget_bytes = check_bytes("plan", "budget", budget)
    check_int("plan", "world_size", world_size, 1, MAX_WORLD_SIZE, "ranks")
    if isinstance(scenario, ModelConfig):
        scenario = Scenario(model=scenario, name="plan")
    if scenario.stack != "toolkit":
        raise ConfigError(
            "plan",
            "scenario",
            f"a plan sizes the toolkit's own model on fake tensors; {scenario.stack}'s code cannot be built there yet.",
            "pass a tk.ModelConfig shaped like your model (toolkit.estimation.LAYER_SHAPES has three), or measure with"
            " tk.run.",
        )
    if world_size > 1 and scenario.fsdp == "none":
        scenario = scenario.replace(fsdp="blocks")
    inductor = compat.available("inductor_on_fake")
    if setups is None:
        setups = candidates(("aot_eager", "inductor") if inductor else ("aot_eager",))
    else:
        check_instance("plan", "setups", setups, tuple, "pass a tuple of toolkit.analysis.plan.Setup(...), or None.")
        for s in setups:
            check_instance(
                "plan",
                "setups",
                s,
                Setup,
                "pass a tuple of toolkit.analysis.plan.Setup(ac=..., scope=..., backend=...).",
            )
    t0 = time.perf_counter()
    release = torch_release()
    known_on = verdicts(release)
    block = _block(scenario.model)
    baselines = {(s.scope, s.backend) for s in setups if s.ac != "none"}
    sized: dict[Setup, _Sized | str] = {}
    broken: dict[Setup, tuple[tuple[str, ...], str]] = {}
    for s in setups:
        known = known_on.get((block, s.ac, s.scope, s.order, s.backend)) if known_on else None
        if known is not None and known[0] != "works":
            broken[s] = (known[1], f"{known[0]}: {known[2]}")
    # Each compile setup's recompute is counted against the same scope and backend without AC: sized first, even
    # when broken. A scope the estimate cannot follow without AC (a graph break, a fallback to eager) it cannot
    # follow with AC either: its AC setups are not compiled again only to be refused.
    todo = [Setup("none", scope, backend=backend) for scope, backend in sorted(baselines)]
    todo += [s for s in setups if s not in broken]
    unfollowed: set[Setup] = set()  # baselines whose compile scope the estimate could not follow
    for s in dict.fromkeys(todo):
        if s.ac != "none" and s.baseline in unfollowed:
            sized[s] = f"as without AC (a checkpoint adds graph breaks, never removes one): {sized[s.baseline]}"
            continue
        try:
            sized[s] = _size(s.scenario(scenario), world_size, reshard_after_forward)
        except ConfigError as e:
            sized[s] = f"{e.problem} Fix: {e.fix}"
            if s.ac == "none" and e.field == "compile.scope":
                unfollowed.add(s)
    rows = [_row(s, sized, broken, budget_bytes) for s in setups]
    fits = sorted(
        (r for r in rows if r.status == "fits"), key=lambda r: (r.recompute_flops, r.recompute_ops, r.per_rank_bytes)
    )
    order = {id(r): i for i, r in enumerate(fits)}
    rank = {"fits": 0, "over budget": 1, "not estimable": 2, "broken": 3}
    rows.sort(key=lambda r: (rank[r.status], order.get(id(r), 0), r.per_rank_bytes))
    forward = next((e.forward_flops for e in sized.values() if isinstance(e, _Sized)), 0)
    short = any(isinstance(e, _Sized) and e.extrapolated_from for e in sized.values())
    return Plan(
        torch=release,
        world_size=world_size,
        budget_bytes=budget_bytes,
        scenario=scenario.to_dict(),
        rows=tuple(rows),
        pick=fits[0].setup if fits else None,
        forward_flops=forward,
        checked_on=release if known_on is not None else None,
        extrapolated=short,
        seconds=round(time.perf_counter() - t0, 1),
    )


@dataclass(frozen=True)
class _Sized:
    """The figures a plan ranks by, for one setup: from one estimate, or extrapolated from three short ones."""

    per_rank_bytes: int
    peak_bytes: int
    saved_bytes: int
    forward_flops: int
    backward_flops: int
    backward_ops: int
    extrapolated_from: tuple[int, ...] = ()


_FIGURES = ("per_rank_bytes", "peak_bytes", "saved_bytes", "forward_flops", "backward_flops", "backward_ops")
_DEEPEST = 6
"""The deepest a short trace goes before the plan estimates the model at its full depth instead."""


def _size(scenario: Scenario, world_size: int, reshard_after_forward: bool) -> _Sized:
    """One setup's figures. A model of more than `_DEEPEST` blocks, all alike (every block MoE or none), is traced at
    2, 3, … blocks until every figure grows by the same step twice in a row (identical blocks add the same bytes,
    FLOPs and ops once the peak has settled in its place), then extended by that step to the model's depth: a
    61-block model costs a dozen traced blocks, not 61. Without two equal steps by `_DEEPEST` blocks, the model is
    estimated at its full depth."""
    m = scenario.model

    def at(n: int) -> _Sized:
        est = estimate(
            scenario.replace(model=m.replace(n_layers=n)),
            world_size=world_size,
            reshard_after_forward=reshard_after_forward,
        )
        return _of(est)

    if m.moe_layers not in ("all", "none") or m.n_layers <= _DEEPEST:
        return at(m.n_layers)
    short = [at(2), at(3)]
    while len(short) <= _DEEPEST - 2:
        short.append(at(len(short) + 2))
        a, b, c = short[-3:]
        step = {f: getattr(c, f) - getattr(b, f) for f in _FIGURES}
        if step == {f: getattr(b, f) - getattr(a, f) for f in _FIGURES}:
            extra = m.n_layers - (len(short) + 1)
            depths = tuple(range(2, len(short) + 2))
            return _Sized(**{f: getattr(c, f) + extra * step[f] for f in _FIGURES}, extrapolated_from=depths)
    return at(m.n_layers)


def _of(est: Estimate) -> _Sized:
    return _Sized(**{f: getattr(est, f) for f in _FIGURES})


def _row(s: Setup, sized: dict, broken: dict, budget: int) -> PlanRow:
    common: dict[str, Any] = dict(setup=s.label, ac=s.ac, scope=s.scope, order=s.order, backend=s.backend)
    if s in broken:
        cases, why = broken[s]
        return PlanRow(**common, status="broken", cases=cases, why=why)
    est = sized[s]
    if not isinstance(est, _Sized):
        return PlanRow(**common, status="not estimable", why=est)
    base = sized.get(s.baseline)
    flops = ops = 0
    if isinstance(base, _Sized):
        flops, ops = est.backward_flops - base.backward_flops, est.backward_ops - base.backward_ops
    return PlanRow(
        **common,
        status="fits" if est.per_rank_bytes <= budget else "over budget",
        per_rank_bytes=est.per_rank_bytes,
        peak_bytes=est.peak_bytes,
        saved_bytes=est.saved_bytes,
        recompute_flops=max(flops, 0),
        recompute_ops=max(ops, 0),
    )
