"""The command line, `python -m toolkit demo|run|cases|plan|env|matrix|lab`: one module per command.

Each command's module holds its parser (`add_parser`), the options its configurations ignore (`INERT`) and its
`command`; `common` what they share. `matrix` and `lab` read their own arguments: the sweep's parser is built after
its folder's stamp is read, and lab's go to JupyterLab.
"""

from __future__ import annotations

import argparse
import sys

from . import cases, demo, env, plan, run
from .common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NOTHING_MEASURED,
    EXIT_OK,
    EXIT_SILENT,
    EXIT_USAGE,
    Parser,
    UsageError,
    inert,
    once,
    say_error,
)

# The commands the top-level parser reads, in `--help`'s order (matrix and lab parse their own arguments).
COMMANDS = {"demo": demo, "run": run, "cases": cases, "plan": plan, "env": env}

_OVERVIEW = """\
subcommands:
  demo     train a small MoE model under six AC / compile setups and print one table: loss, gradient difference
           from eager without AC, graphs, graph breaks (the silent fallback of case C2 shows as 0 graphs)
  run      measure one scenario (a preset or a Scenario JSON file) and print its classification first —
           works, error, or a silent failure (fell_back_to_eager, sac_not_applied, grads_differ, ...) — then
           its report; --strict exits 3 on a silent failure
  cases    the catalogue of known composability cases {cases} as a terminal table (--markdown for markdown):
           what a repro needs (cpu / gpu / multi-rank), its notebook, the verdict for the installed torch;
           --check re-runs their standalone repros
  plan     will it fit: size about 20 AC x compile setups for one rank of --world-size N (FSDP2) on fake
           tensors, drop those the central list marks broken on this torch, and pick the one that fits --budget
           at the least recompute (FLOPs)
  env      this torch and every private torch API the toolkit relies on: available or not
  matrix   sweep AC x compile x MoE, each cell in its own subprocess, and write matrix.md / .json / .html
           (python -m toolkit matrix --help for its options)
  lab      open the notebooks in JupyterLab with autosave off, so that running one leaves the committed file as
           it is (File > Save still saves); other arguments go to jupyter lab

`python -m toolkit SUBCOMMAND --help` describes each one's options."""


def _parser() -> argparse.ArgumentParser:
    from ..analysis.catalogue import cases as all_cases

    ids = [c.id for c in all_cases()]
    parser = Parser(
        prog="python -m toolkit",
        epilog=_OVERVIEW.format(cases=f"{ids[0]}-{ids[-1]}"),
        description="See how activation checkpointing, torch.compile and MoE compose on a "
        "small torchtitan-shaped model.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # Each subcommand is described once, in _OVERVIEW (argparse's own list wraps them into a narrow column).
    sub = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="{demo,run,cases,plan,env,matrix,lab}",
        help="one of the subcommands below",
    )
    for module in COMMANDS.values():
        # Its own parser goes with the errors found after parsing (their usage line is the command's).
        own = module.add_parser(sub)
        own.set_defaults(parser=own)
    sub.add_parser("matrix", add_help=False)
    sub.add_parser("lab", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command line: one line `error: … Fix: …` and exit 2 for bad input (never a traceback), one line and exit 1
    for a file it could not write (a full disk: the previous file is left whole), 130 after Ctrl-C (the interrupted
    command has already stopped its workers)."""
    from .. import _files, _interrupt
    from .._config import ConfigError

    _interrupt.raise_again()
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (ConfigError, UsageError) as e:
        say_error(e)
        return EXIT_USAGE
    except _files.WriteFailed as e:
        say_error(e.strerror)
        return EXIT_FAILED


def _main(argv: list[str] | None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "matrix":  # its own parser, built after the stamp is checked
        from . import matrix

        return matrix.command(argv[1:])
    if argv and argv[0] == "lab":
        from . import lab

        return lab.command(argv[1:])
    parser = _parser()
    if not argv:  # `python -m toolkit` on its own: what there is to run, not a usage error
        parser.print_help()
        return 0
    args = parser.parse_args(argv)
    module = COMMANDS[args.command]
    once(args.parser, argv[1:])
    inert(module.INERT, args.parser, args, argv[1:])
    return int(module.command(args))


__all__ = [
    "main",
    "EXIT_OK",
    "EXIT_FAILED",
    "EXIT_USAGE",
    "EXIT_SILENT",
    "EXIT_NOTHING_MEASURED",
    "EXIT_INTERRUPTED",
]
