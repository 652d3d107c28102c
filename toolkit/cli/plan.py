"""`python -m toolkit plan`: will it fit — the AC x compile setup that fits a per-rank budget at the least
recompute, among those the central list does not mark broken on this torch."""

from __future__ import annotations

import argparse
from typing import Any

from .common import Rule, load_scenario

INERT: tuple[Rule, ...] = ()


def add_parser(sub: Any) -> argparse.ArgumentParser:
    from .._config import arg_type, check_int
    from ..estimation import LAYER_SHAPES

    p: argparse.ArgumentParser = sub.add_parser(
        "plan",
        description="Will it fit: the AC x compile setup that fits a per-rank memory budget at the least recompute, "
        "among those the central list does not mark broken on this torch (sized on fake tensors).",
    )
    model = p.add_mutually_exclusive_group(required=True)
    model.add_argument("--preset", metavar="NAME", help="a named scenario (run --list shows them)")
    model.add_argument("--config", metavar="FILE", help="a Scenario JSON file (what Scenario.to_json() writes)")
    model.add_argument("--shape", choices=list(LAYER_SHAPES), help="a published MoE layer at full size")
    p.add_argument(
        "--layers",
        type=arg_type(lambda v: check_int("plan", "layers", v, 1, 4096), convert=int, example="--layers 61"),
        default=None,
        metavar="N",
        help="transformer blocks of the model (default: the scenario's or the shape's)",
    )
    p.add_argument("--budget", required=True, metavar="SIZE", help="memory per rank, e.g. 80GiB or '141 GB'")
    p.add_argument(
        "--world-size",
        type=arg_type(lambda v: check_int("plan", "world_size", v, 1, 1 << 20, "ranks"), convert=int),
        default=1,
        metavar="N",
        help="ranks FSDP2 shards the model over (default 1: one device)",
    )
    p.add_argument(
        "--backend",
        nargs="+",
        choices=["aot_eager", "inductor"],
        default=None,
        help="compile backends of the compiled setups (default both, inductor where it runs on fake tensors)",
    )
    p.add_argument(
        "--ac",
        nargs="+",
        choices=["none", "full", "selective_op", "memory_budget"],  # analysis.plan.PLAN_AC_MODES (tested equal)
        default=None,
        help="only these AC modes (default all; memory_budget needs a compile scope)",
    )
    p.add_argument(
        "--scope",
        nargs="+",
        choices=["none", "blocks", "model"],  # analysis.plan.PLAN_SCOPES (tested equal)
        default=None,
        help="only these compile scopes ('none': eager; default all)",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON instead of the table")
    return p


def command(args: argparse.Namespace) -> int:
    from .._config import ConfigError, check_bytes
    from ..analysis.plan import candidates, plan
    from ..estimation import LAYER_SHAPES
    from ..measurement import Scenario

    budget = check_bytes("plan", "budget", args.budget)  # before the model is read or anything sized
    if args.shape is not None:
        scenario = Scenario(model=LAYER_SHAPES[args.shape], name=args.shape)
    else:
        scenario = load_scenario(args)
    if args.layers is not None:
        scenario = scenario.replace(model=scenario.model.replace(n_layers=args.layers))
    # Only the filters given: candidates() holds the defaults.
    asked = {"backends": args.backend, "ac_modes": args.ac, "scopes": args.scope}
    setups = None
    if any(asked.values()):
        setups = candidates(**{k: tuple(v) for k, v in asked.items() if v})
        if not setups:  # e.g. the memory budget asked for eagerly: it is a setting of the compiled graphs only
            raise ConfigError(
                "plan",
                "ac",
                "no candidate setup has these AC modes and compile scopes.",
                "ask for a compile scope beside the memory budget (--scope blocks), or more AC modes.",
            )
    result = plan(scenario, budget=budget, world_size=args.world_size, setups=setups)
    print(result.to_json() if args.json else str(result))
    return 0
