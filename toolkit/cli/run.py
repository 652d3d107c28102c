"""`python -m toolkit run`: measure one scenario (a preset or a Scenario JSON file) and print its classification
first, then its report."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .common import EXIT_FAILED, EXIT_OK, EXIT_SILENT, EXIT_USAGE, Rule, UsageError, load_scenario, say_error

INERT: tuple[Rule, ...] = (
    (
        lambda a: a.list,
        ("json", "isolate", "timeout_s", "strict", "no_refs", "nproc"),
        "--list runs nothing",
        "drop {opt}",
    ),
    (
        lambda a: a.nproc > 1,
        ("isolate", "strict", "no_refs"),
        "--nproc runs each rank in a process of its own and prints the ranks' merged report, with no reference "
        "runs and no classification",
        "drop {opt}, or run on one rank",
    ),
)


_RUN_EPILOG = """\
exit codes:
  0  the step ran (with --strict: and no silent failure was found)
  1  the step failed: error, crashed or timeout
  2  bad input (an unknown preset, an unreadable or invalid --config, --timeout-s without --isolate)
  3  --strict and a silent failure: any classification other than works, error, crashed, timeout

The first line is the classification: NAME: LABEL — why; known cases. For an AC scenario `run` also measures the
same setup without AC (and, for a selective mode, with full AC), which sac_not_applied and ac_saves_nothing need;
--no-refs skips them."""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    from .._config import MAX_RANKS, arg_type, check_int, check_seconds

    r: argparse.ArgumentParser = sub.add_parser(
        "run",
        description="Measure one training step of a scenario and classify it.",
        epilog=_RUN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = r.add_mutually_exclusive_group(required=True)
    src.add_argument("--preset", metavar="NAME", help="a named scenario (--list shows them)")
    src.add_argument("--config", metavar="FILE", help="a Scenario JSON file (what Scenario.to_json() writes)")
    src.add_argument("--list", action="store_true", help="list the presets and exit")
    r.add_argument(
        "--json", action="store_true", help="print the Report as JSON on stdout (the classification goes to stderr)"
    )
    r.add_argument(
        "--isolate", action="store_true", help="run in a subprocess, so that a crash or a hang comes back as a result"
    )
    r.add_argument(
        "--timeout-s",
        type=arg_type(lambda v: check_seconds("run", "timeout_s", v), example="--timeout-s 600"),
        default=None,
        metavar="SECONDS",
        help="with --isolate or --nproc: give up after this many seconds (a positive number)",
    )
    r.add_argument(
        "--strict",
        action="store_true",
        help="exit 3 when the run is a silent failure (fell_back_to_eager, sac_not_applied, grads_differ, ...)",
    )
    r.add_argument(
        "--no-refs",
        action="store_true",
        help="skip the reference runs without AC / with full AC (sac_not_applied, ac_saves_nothing "
        "are then not checked)",
    )
    r.add_argument(
        "--nproc",
        type=arg_type(lambda v: check_int("run", "nproc", v, 1, MAX_RANKS, "ranks on one machine"), convert=int),
        default=1,
        metavar="N",
        help="run on N ranks under torchrun (gloo, 127.0.0.1) and print the ranks side by side",
    )
    return r


def command(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from .._config import ConfigError
    from ..analysis.classification import SILENT, classify, describe, headline, reference_scenarios
    from ..execution import run
    from ..measurement import PRESETS

    if args.timeout_s is not None and not args.isolate and args.nproc == 1:
        # The same rule as tk.run(timeout_s=..., isolate=False), said in the CLI's own words.
        args.parser.error(
            "--timeout-s needs --isolate: only a subprocess can be stopped when the time is up. "
            "Fix: add --isolate, or drop --timeout-s."
        )
    if args.list:
        for name, sc in PRESETS.items():
            print(f"{name:28} {sc.replace(name='').label}")
        return EXIT_OK
    try:
        scenario = load_scenario(args)
    except (UsageError, ConfigError) as e:
        say_error(e)
        return EXIT_USAGE
    if args.nproc > 1:
        from ..execution import run_distributed

        merged = run_distributed(scenario, nproc=args.nproc, timeout_s=args.timeout_s or 900)
        print(merged.to_json() if args.json else str(merged))
        return EXIT_OK if merged.ok else EXIT_FAILED
    report = run(scenario, isolate=args.isolate, timeout_s=args.timeout_s)
    refs = {}
    if report.ok and not args.no_refs:
        # sac_not_applied and ac_saves_nothing are only visible against the same setup without AC / with full AC.
        refs = {
            key: run(ref, isolate=args.isolate, timeout_s=args.timeout_s)
            for key, ref in reference_scenarios(scenario).items()
        }
    cl = classify(report, refs)
    if args.json:
        print(report.to_json())
        # stdout stays one Report (Report.from_json reads it); the classification leads on stderr.
        print(headline(report, cl), file=sys.stderr)
        print(json.dumps({"classification": asdict(cl)}), file=sys.stderr)
    else:
        print(describe(report, cl, references=False if args.no_refs else None))
    if not report.ok:
        return EXIT_FAILED
    return EXIT_SILENT if args.strict and cl.label in SILENT else EXIT_OK
