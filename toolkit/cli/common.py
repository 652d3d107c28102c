"""What every command shares: the usage error and how it is said, the parser that escapes its refusals, the checks
run on every command's options (given twice, or given where they would do nothing), and the scenario a command reads."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from ..measurement import Scenario

# Exit codes of `run` and `matrix` (also in their --help); 130 after Ctrl-C.
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_SILENT, EXIT_NOTHING_MEASURED = 0, 1, 2, 3, 4
EXIT_INTERRUPTED = 130


class UsageError(Exception):
    """Bad input to the CLI: printed as `error: …` with its fix, exit code 2, before any heavy work."""

    def __init__(self, problem: str, fix: str = ""):
        super().__init__(problem + (f" Fix: {fix}" if fix else ""))


def say_error(problem: object) -> None:
    """The one way the CLI says a refusal: `error: …` on stderr, escaped for the terminal (a refusal may quote what
    the user typed, and that may hold an escape sequence or a bidi override)."""
    from .._escape import terminal

    print(f"error: {terminal(str(problem))}", file=sys.stderr)


class Parser(argparse.ArgumentParser):
    """argparse, with its refusals escaped for the terminal: it echoes the arguments it could not take
    (`unrecognized arguments: …`, `invalid choice: …`), and an argument may hold an escape sequence."""

    def error(self, message: str):
        from .._escape import terminal

        super().error(terminal(message))


def tokens_of(action: argparse.Action, argv: list[str]) -> list[str]:
    """The tokens of `argv` (before a `--`) that give `action`'s option: `--x`, `--x=V`, or its short form."""
    tokens = argv[: argv.index("--")] if "--" in argv else argv
    opts = action.option_strings
    return [t for t in tokens for o in opts if t == o or (o[:2] == "--" and t.startswith(o + "="))]


def once(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """A single-valued option given twice is refused, naming it (argparse keeps the last one, silently): the one
    check every command's options pass after parsing."""
    many = (argparse._AppendAction, argparse._CountAction, argparse._ExtendAction, argparse._HelpAction)
    for action in parser._actions:
        if not action.option_strings or isinstance(action, many):
            continue
        given = tokens_of(action, argv)
        if len(given) > 1:
            raise UsageError(
                f"{action.option_strings[-1]} is given {len(given)} times ({', '.join(given)}); only one can hold.",
                "give it once.",
            )


Rule = tuple[Callable[[argparse.Namespace], bool], tuple[str, ...], str, str]
"""An option a configuration ignores: (when, options, why, fix). One given where it would do nothing is refused,
naming why, instead of being dropped without a word (each command keeps its own rules: `INERT` in its module)."""


def inert(rules: tuple[Rule, ...], parser: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str]) -> None:
    """Refuse an option that does nothing in the configuration given (`rules`, the command's `INERT`), naming it and
    why."""
    by_dest = {a.dest: a for a in parser._actions if a.option_strings}
    for when, dests, why, fix in rules:
        if not when(args):
            continue
        for dest in dests:
            given = tokens_of(by_dest[dest], argv)
            if given:
                opt = given[0].split("=", 1)[0]
                raise UsageError(f"{opt} would do nothing here: {why}.", fix.format(opt=opt) + ".")


def load_scenario(args: argparse.Namespace) -> Scenario:
    """The scenario `run` was asked for; a ConfigError or an unreadable file becomes one line naming the file. A
    record's option dropped on the way in (`InputWarning`) is said in one line naming the file."""
    import warnings

    from .. import _files
    from .._config import ConfigError, InputWarning
    from ..measurement import Scenario, preset

    if args.preset is not None:
        return preset(args.preset)
    path = args.config
    fix = "pass the path of a Scenario JSON file (Scenario.to_json() writes one)."
    try:
        text = _files.read_capped(path, "run", "--config", name="it")
        data = _files.loads(text, "run", "--config", name="it")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", InputWarning)
            scenario = Scenario.from_dict(data)
    except ConfigError as e:
        if e.owner == "run":  # the file itself: "--config FILE: cannot read it (…)", "… it is not valid JSON: …"
            raise UsageError(f"--config {path}: {e.problem}", fix) from None
        raise UsageError(f"--config {path}: {e}") from None
    for w in caught:
        if issubclass(w.category, InputWarning):
            print(f"warning: --config {path}: {w.message}", file=sys.stderr)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return scenario
