"""`python -m toolkit demo`: a small MoE model under six AC / compile setups, measured by `run`, in one table."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any

from .common import Rule

if TYPE_CHECKING:
    from ..measurement import Scenario

INERT: tuple[Rule, ...] = ()


def demo_scenarios(backend: str = "aot_eager", n_layers: int = 2) -> list[tuple[str, Scenario]]:
    """The demo's six setups, each a Scenario: eager, full AC, SAC, full AC compiled without and with fullgraph,
    and torchtitan 0.3.0's recipe."""
    from ..measurement import Scenario
    from ..models import ModelConfig
    from ..transforms import ACConfig, CompileConfig

    # The for_loop experts' `.tolist()` is the graph break the demo exists to show (C2): with the default
    # `grouped_mm` experts nothing breaks, and row 4 would look like row 5.
    model = ModelConfig(n_layers=n_layers, experts_impl="for_loop")
    quick: dict[str, Any] = dict(model=model, measure_memory=False, steady_steps=0)
    blocks: dict[str, Any] = dict(scope="blocks", backend=backend)
    return [
        ("no AC, eager", Scenario(**quick)),
        ("full AC, eager", Scenario(ac=ACConfig.of(mode="full"), **quick)),
        ("selective_op AC, eager", Scenario(ac=ACConfig.of(mode="selective_op"), **quick)),
        (
            "full AC, compile(AC(block)), fullgraph=False",
            Scenario(ac=ACConfig.of(mode="full"), compile=CompileConfig(**blocks), **quick),
        ),
        (
            "full AC, compile(AC(block)), fullgraph=True",
            Scenario(ac=ACConfig.of(mode="full"), compile=CompileConfig(**blocks, fullgraph=True), **quick),
        ),
        ("recipe torchtitan_0_3_0", Scenario(recipe="torchtitan_0_3_0", recipe_backend=backend, **quick)),
    ]


def demo_rows(backend: str = "aot_eager", n_layers: int = 2) -> list[dict[str, Any]]:
    """One row per setup, each measured by `run` like any scenario: outcome, loss, the largest gradient difference
    from the same model eager without AC, graphs, breaks, what was checkpointed and compiled (Report fields)."""
    from ..execution import run

    rows = []
    for label, scenario in demo_scenarios(backend, n_layers):
        t0 = time.perf_counter()
        r = run(scenario.replace(name=label))
        n = r.numerics
        row: dict[str, Any] = {"setup": label, "outcome": r.outcome}
        if r.ok and n.loss is not None:
            row.update(loss=round(n.loss, 6), loss_diff=n.loss_diff, max_grad_diff=n.max_grad_diff)
        elif r.error is not None:
            row["error"] = f"{r.error.type.rsplit('.', 1)[-1]}: {r.error.message.splitlines()[0][:160]}"
        row.update(
            checkpointed=list(r.transforms.checkpointed),
            compiled=list(r.transforms.compiled),
            orders=sorted(set(r.compile.orders.values())),
            graphs=r.compile.graphs,
            graph_breaks=r.compile.graph_breaks,
            seconds=round(time.perf_counter() - t0, 2),
            warnings=list(r.warnings),
        )
        rows.append(row)
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'setup':46} {'outcome':7} {'loss':>9} {'max|dgrad|':>10} {'graphs':>6} {'breaks':>6}  "
        "checkpointed / compiled"
    ]
    for r in rows:
        if r["outcome"] == "ok":
            diff = r["max_grad_diff"]  # None when not compared, or a NaN gradient after a JSON round trip
            nums = f"{r['loss']:9.4f} {diff if diff is not None else float('nan'):10.1e}"
        else:
            nums = f"{'-':>9} {'-':>10}"
        where = f"{len(r['checkpointed'])} wrapped / {len(r['compiled'])} compiled {' '.join(r['orders'])}".rstrip()
        lines.append(f"{r['setup']:46} {r['outcome']:7} {nums} {r['graphs']:6d} {r['graph_breaks']:6d}  {where}")
        if r["outcome"] != "ok":
            lines.append(f"    {r['error']}")
    return "\n".join(lines)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    from .._config import arg_type, check_int

    d: argparse.ArgumentParser = sub.add_parser(
        "demo", description="Train a small MoE model under six AC / compile setups and print one table."
    )
    d.add_argument(
        "--backend",
        default="aot_eager",
        choices=["eager", "aot_eager", "aot_eager_decomp_partition", "inductor"],
        help="compile backend of the compiled setups (default aot_eager)",
    )
    d.add_argument(
        "--layers",
        type=arg_type(lambda v: check_int("demo", "layers", v, 1, 4096), convert=int, example="--layers 2"),
        default=2,
        help="transformer blocks of the model (default 2)",
    )
    d.add_argument(
        "--json", action="store_true", help="print the rows as JSON (with torch's warnings) instead of a table"
    )
    return d


def command(args: argparse.Namespace) -> int:
    import torch

    rows = demo_rows(args.backend, args.layers)
    print(json.dumps(rows, indent=2) if args.json else format_rows(rows))
    print(
        f"\ntorch {torch.__version__}, device cpu; gradients compared with the same model run eagerly without AC.",
        file=sys.stderr if args.json else sys.stdout,
    )
    return 0
