"""The command line, `python -m toolkit demo|run|cases|env|matrix|lab`: every parser lives here.

Command line: `python -m toolkit demo|run|cases|env|matrix` — the demo table, one measured scenario, the known cases,
this torch's private APIs, the composability sweep.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from .measurement import Scenario


def demo_scenarios(backend: str = "aot_eager", n_layers: int = 2) -> list[tuple[str, "Scenario"]]:
    """The demo's six setups, each a Scenario: eager, full AC, SAC, full AC compiled without and with fullgraph,
    and torchtitan 0.3.0's recipe."""
    from .measurement import Scenario
    from .models import ModelConfig
    from .transforms import ACConfig, CompileConfig

    # The for_loop experts' `.tolist()` is the graph break the demo exists to show (C2): with the default
    # `grouped_mm` experts nothing breaks, and row 4 would look like row 5.
    model = ModelConfig(n_layers=n_layers, experts_impl="for_loop")
    quick = dict(model=model, measure_memory=False, steady_steps=0)
    blocks = dict(scope="blocks", backend=backend)
    return [
        ("no AC, eager", Scenario(**quick)),
        ("full AC, eager", Scenario(ac=ACConfig(mode="full"), **quick)),
        ("selective_op AC, eager", Scenario(ac=ACConfig(mode="selective_op"), **quick)),
        (
            "full AC, compile(AC(block)), fullgraph=False",
            Scenario(ac=ACConfig(mode="full"), compile=CompileConfig(**blocks), **quick),
        ),
        (
            "full AC, compile(AC(block)), fullgraph=True",
            Scenario(ac=ACConfig(mode="full"), compile=CompileConfig(**blocks, fullgraph=True), **quick),
        ),
        ("recipe torchtitan_0_3_0", Scenario(recipe="torchtitan_0_3_0", recipe_backend=backend, **quick)),
    ]


def demo_rows(backend: str = "aot_eager", n_layers: int = 2) -> list[dict]:
    """One row per setup, each measured by `run` like any scenario: outcome, loss, the largest gradient difference
    from the same model eager without AC, graphs, breaks, what was checkpointed and compiled (Report fields)."""
    from .execution import run

    rows = []
    for label, scenario in demo_scenarios(backend, n_layers):
        t0 = time.perf_counter()
        r = run(scenario.replace(name=label))
        n = r.numerics
        row: dict = {"setup": label, "outcome": r.outcome}
        if r.ok:
            row.update(loss=round(n.loss, 6), loss_diff=n.loss_diff, max_grad_diff=n.max_grad_diff)
        else:
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


def format_rows(rows: list[dict]) -> str:
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


# Exit codes of `run` and `matrix` (also in their --help); 130 after Ctrl-C.
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_SILENT, EXIT_NOTHING_MEASURED = 0, 1, 2, 3, 4
EXIT_INTERRUPTED = 130


def _load_scenario(args):
    """The scenario `run` was asked for; a ConfigError or an unreadable file becomes one line naming the file. A
    record's option dropped on the way in (`InputWarning`) is said in one line naming the file."""
    import warnings

    from . import _files
    from ._config import ConfigError, InputWarning
    from .measurement import Scenario, preset

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
            raise _UsageError(f"--config {path}: {e.problem}", fix) from None
        raise _UsageError(f"--config {path}: {e}") from None
    for w in caught:
        if issubclass(w.category, InputWarning):
            print(f"warning: --config {path}: {w.message}", file=sys.stderr)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return scenario


class _UsageError(Exception):
    """Bad input to the CLI: printed as `error: …` with its fix, exit code 2, before any heavy work."""

    def __init__(self, problem: str, fix: str = ""):
        super().__init__(problem + (f" Fix: {fix}" if fix else ""))


def _say_error(problem: object) -> None:
    """The one way the CLI says a refusal: `error: …` on stderr, escaped for the terminal (a refusal may quote what
    the user typed, and that may hold an escape sequence or a bidi override)."""
    from ._escape import terminal

    print(f"error: {terminal(str(problem))}", file=sys.stderr)


class _Parser(argparse.ArgumentParser):
    """argparse, with its refusals escaped for the terminal: it echoes the arguments it could not take
    (`unrecognized arguments: …`, `invalid choice: …`), and an argument may hold an escape sequence."""

    def error(self, message: str):
        from ._escape import terminal

        super().error(terminal(message))


def _given(action: argparse.Action, argv: list[str]) -> list[str]:
    """The tokens of `argv` (before a `--`) that give `action`'s option: `--x`, `--x=V`, or its short form."""
    tokens = argv[: argv.index("--")] if "--" in argv else argv
    opts = action.option_strings
    return [t for t in tokens for o in opts if t == o or (o[:2] == "--" and t.startswith(o + "="))]


def _once(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """A single-valued option given twice is refused, naming it (argparse keeps the last one, silently): the one
    check every command's options pass after parsing."""
    many = (argparse._AppendAction, argparse._CountAction, argparse._ExtendAction, argparse._HelpAction)
    for action in parser._actions:
        if not action.option_strings or isinstance(action, many):
            continue
        given = _given(action, argv)
        if len(given) > 1:
            raise _UsageError(
                f"{action.option_strings[-1]} is given {len(given)} times ({', '.join(given)}); only one can hold.",
                "give it once.",
            )


_Rule = tuple[Callable[[argparse.Namespace], bool], tuple[str, ...], str, str]

_INERT: dict[str, tuple[_Rule, ...]] = {
    "run": (
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
    ),
    "cases": (
        (
            lambda a: a.page,
            ("cpu", "needs", "text", "markdown", "findings", "check", "upgrade"),
            "--page prints every case, from the catalogue alone",
            "drop {opt}, or list the cases without --page",
        ),
        (
            lambda a: a.upgrade,
            ("cpu", "needs", "text", "markdown", "findings", "check"),
            "--upgrade prints every release pair, from the catalogue and the committed records",
            "drop {opt}, or list the cases without --upgrade",
        ),
        (
            lambda a: bool(a.check),
            ("cpu", "needs", "text", "markdown", "findings"),
            "--check runs the repros it names; the filters and the table's options shape the listing",
            "drop {opt}, or list the cases without --check",
        ),
    ),
    "matrix": (
        (
            lambda a: a.model is None,
            ("blocks",),
            "--blocks names the blocks of --model's model",
            "pass --model FILE.py:FUNCTION too, or drop {opt}",
        ),
    ),
}
"""For each command, the options that a given configuration ignores: (when, options, why, fix). One given where it would
do nothing is refused, naming why, instead of being dropped without a word."""


def _inert(command: str, parser: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str]) -> None:
    """Refuse an option that does nothing in the configuration given (`_INERT`), naming it and why."""
    by_dest = {a.dest: a for a in parser._actions if a.option_strings}
    for when, dests, why, fix in _INERT.get(command, ()):
        if not when(args):
            continue
        for dest in dests:
            given = _given(by_dest[dest], argv)
            if given:
                opt = given[0].split("=", 1)[0]
                raise _UsageError(f"{opt} would do nothing here: {why}.", fix.format(opt=opt) + ".")


def _run_command(args) -> int:
    from dataclasses import asdict

    from ._config import ConfigError
    from .analysis.classification import SILENT, classify, describe, headline, reference_scenarios
    from .execution import run
    from .measurement import PRESETS

    if args.list:
        for name, sc in PRESETS.items():
            print(f"{name:28} {sc.replace(name='').label}")
        return EXIT_OK
    try:
        scenario = _load_scenario(args)
    except (_UsageError, ConfigError) as e:
        _say_error(e)
        return EXIT_USAGE
    if args.nproc > 1:
        from .execution import run_distributed

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


def _plan_command(args) -> int:
    from ._config import ConfigError, check_bytes
    from .analysis.plan import candidates, plan
    from .estimation.estimates import LAYER_SHAPES
    from .measurement import Scenario

    budget = check_bytes("plan", "budget", args.budget)  # before the model is read or anything sized
    if args.shape is not None:
        scenario = Scenario(model=LAYER_SHAPES[args.shape], name=args.shape)
    else:
        scenario = _load_scenario(args)
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


def _cases_command(args) -> int:
    from . import bugs
    from ._escape import terminal_width
    from .analysis import catalogue

    if args.page or args.upgrade:
        from .analysis import store
        from .analysis.matrix import records_path
        from .bugs import central_list

        if args.page:
            print(central_list.page(), end="")
        else:
            path = records_path()
            if not path.is_file():
                raise _UsageError(
                    f"--upgrade reads the central list's committed records, and {str(path)!r} is not there.",
                    "run it from a checkout of the repository (they are docs/central-list/results.jsonl.xz).",
                )
            print(central_list.upgrade_page(store.read_results(path)[0]), end="")
        return 0
    if not args.check:
        sel = catalogue.filter(cpu=args.cpu, text=args.text, needs=args.needs)
        if args.markdown:
            print(catalogue.markdown(sel, with_findings=args.findings))
        else:
            print(catalogue.text(sel, width=terminal_width(100), with_findings=args.findings))
        return 0
    ids = args.check
    if ids == ["all"]:
        ids = [c.id for c in catalogue.cases() if c.signature and bugs.has_script(c.id)]
    unknown = [cid for cid in ids if not bugs.has_script(cid)]
    if unknown:
        _say_error(
            f"no standalone repro for {', '.join(unknown)} (cases with a standalone script: see "
            "toolkit/bugs/standalone/, or `python -m toolkit cases --check all`)"
        )
        return 2
    status = 0
    for cid in ids:
        try:
            finding = bugs.check(cid)
        except AssertionError as e:
            print(e)
            status = 1
            continue
        print(finding)  # a Finding, or "CNN skipped: why" (no GPU; an optional package, with its install line)
    return status


# --- matrix ---------------------------------------------------------------------------------------------------


def _matrix_parser() -> argparse.ArgumentParser:
    from ._config import arg_type, check_int, check_seconds
    from .analysis import sweeps
    from .analysis.executors import EXECUTORS
    from .transforms.compile import BACKENDS

    def count(minimum: int):
        return arg_type(lambda v: check_int("matrix", "count", v, minimum), convert=int)

    parser = _Parser(
        prog="python -m toolkit matrix",
        description=sweeps.__doc__.splitlines()[0],
        epilog=_MATRIX_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="the default sweep (about 40 cells, a minute on a laptop)")
    size.add_argument("--full", action="store_true", help="every combination (hundreds of cells)")
    parser.add_argument("--backend", action="append", choices=BACKENDS, help="repeat for several (default aot_eager)")
    parser.add_argument(
        "--stack",
        choices=sweeps.STACKS,
        action="append",
        help="the toolkit's model (default), torchtitan's own models and transforms "
        "(pip install -e '.[torchtitan]'), transformers' own (pip install -e '.[transformers]'), or all; repeat for "
        "several in one matrix",
    )
    parser.add_argument(
        "--model",
        metavar="FILE.py:FUNCTION",
        help="sweep your own model instead: FUNCTION() returns (model, inputs) or (model, inputs, loss_fn) at a tiny "
        "size (also PKG.MODULE:FUNCTION); the toolkit's AC modes and compiles on its blocks",
    )
    parser.add_argument(
        "--blocks",
        metavar="CLASSNAME",
        help="with --model: the class of its repeated blocks (default: the children of the ModuleList holding the "
        "most parameters, as FSDP's auto-wrap finds them)",
    )
    parser.add_argument("--only", metavar="REGEX", help="only cells whose label matches, e.g. '^dense \\| AC full'")
    parser.add_argument(
        "--timeout-s",
        type=arg_type(lambda v: check_seconds("matrix", "timeout_s", v), example="600"),
        default=600.0,
        help="per cell (default 600)",
    )
    parser.add_argument("--out", default="matrix-out", help="folder for results.jsonl and matrix.json/.md/.html")
    parser.add_argument(
        "--keep-timeouts",
        action="store_true",
        help="keep the cells that timed out under this --timeout-s (or a longer one) as results; by default such "
        "a cell is retried once on the next run (a load spike is not a result), then kept",
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="RESULTS",
        default=[],
        help="first merge these results.jsonl files (from other machines) into OUT, by cell key",
    )
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument(
        "--no-bare",
        action="store_true",
        help="skip the bare reruns (every failing cell run again with none of the probes, to tell a failure of the "
        "stack from one the instrument caused)",
    )
    parser.add_argument("--executor", choices=EXECUTORS, default="local", help="where cells run (default local)")
    loc = parser.add_argument_group("--executor local")
    loc.add_argument("--workers", type=count(1), help="cells side by side (default: 2, or 1 on a 1-core machine)")
    loc.add_argument("--cold", action="store_true", help="a fresh Python per cell instead of the warm fork server")
    sub = parser.add_argument_group("--executor submitit (Slurm; without Slurm, local processes)")
    sub.add_argument("--cluster", choices=["slurm", "local", "debug"], help="default: slurm if sbatch is found")
    sub.add_argument("--partition", help="Slurm partition")
    sub.add_argument("--time-min", type=count(1), default=60, help="time limit per task, minutes (default 60)")
    sub.add_argument("--gpus-per-cell", type=count(0), default=0)
    sub.add_argument("--array-parallelism", type=count(1), default=64, help="array tasks at once (default 64)")
    both = parser.add_argument_group("--executor submitit and ray")
    both.add_argument("--cpus-per-cell", type=count(1), default=None, help="default 2 (submitit), 1 (ray)")
    both.add_argument("--cells-per-job", type=count(1), default=1, help="cells per task, run in turn (default 1)")
    ray = parser.add_argument_group("--executor ray")
    ray.add_argument("--address", help="an existing Ray cluster ('auto', or ray://HEAD:10001); default: start one here")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="check the options, the cells and the --merge files, say how many cells would run "
        "(and how many OUT already holds), then exit without running or writing anything",
    )
    # Which executors read each option, from the groups above: one given to an executor that does not read it is
    # refused (it used to be dropped without a word).
    groups = {loc: ("local",), sub: ("submitit",), both: ("submitit", "ray"), ray: ("ray",)}
    parser.executor_options = {
        opt: readers
        for group, readers in groups.items()
        for action in group._group_actions
        for opt in action.option_strings
    }
    return parser


def _matrix_command(argv: list[str]) -> int:
    """`python -m toolkit matrix …`: the sweep, or with --dry-run what it would run. The same command again on a
    folder it left with nothing to run answers from the folder's stamp, without importing torch (`_stamp`)."""
    from . import _stamp
    from .stacks import extras

    code = _stamp.replay(argv, extras())
    if code is not None:
        return code
    import re

    from ._config import ConfigError
    from ._escape import terminal
    from ._extras import available, reason
    from .analysis import store, sweeps
    from .analysis.cells import left_out as left_out_cells
    from .analysis.executors import make

    parser = _matrix_parser()
    args = parser.parse_args(argv)
    _once(parser, argv)
    _inert("matrix", parser, args, argv)
    for given in argv:
        readers = parser.executor_options.get(given.split("=", 1)[0])
        if readers is not None and args.executor not in readers:
            parser.error(
                f"{given.split('=', 1)[0]} is an option of --executor {' or '.join(readers)}; --executor "
                f"{args.executor} would ignore it. Fix: drop it, or pass --executor {readers[0]}."
            )
    if args.workers is None:  # local's option: the cluster executors run each cell as a job of its own
        args.workers = max(1, min(2, os.cpu_count() or 1)) if args.executor == "local" else 1
    backends = args.backend or ["aot_eager"]
    if args.model is not None and args.stack:
        parser.error("--model sweeps your model alone. Fix: drop --stack, or sweep the stacks in another --out.")
    if args.model is not None:
        from .analysis.cells import model_cells
        from .stacks.user import UserModelConfig, preflight

        stacks = ("user",)
        try:
            # The file, the function, what it returns and its blocks, checked once before any cell runs.
            blocks = preflight(UserModelConfig(build=args.model, blocks=args.blocks))
            print(f"--model {args.model}: blocks {blocks}", file=sys.stderr)
            cells = model_cells(args.model, args.blocks, tuple(backends), quick=not args.full)
        except ConfigError as e:
            parser.error(f"--model {args.model}: {e}")
    else:
        try:
            stacks = tuple(args.stack or ["toolkit"])
            cells = sweeps.default_cells(quick=not args.full, backends=tuple(backends), stack=stacks)
        except (ConfigError, ImportError) as e:
            parser.error(f"--stack {' '.join(stacks)}: {e}")
    left_out = left_out_cells() if {"toolkit", "all"} & set(stacks) else []
    for line in left_out:
        print(line, file=sys.stderr)
    if args.only:
        try:
            pattern = re.compile(args.only)
        except re.error as e:
            parser.error(f"--only: {e}")
        cells = [c for c in cells if pattern.search(c.label)]
        if not cells:
            parser.error(
                f"--only {args.only!r} matches no cell of the {'full' if args.full else 'quick'} sweep"
                + "".join(f"; {line}" for line in left_out)
            )
    options: dict = {}
    if args.executor == "submitit":
        options = dict(
            cluster=args.cluster,
            partition=args.partition,
            time_min=args.time_min,
            gpus_per_cell=args.gpus_per_cell,
            cpus_per_cell=args.cpus_per_cell or 2,
            cells_per_job=args.cells_per_job,
            array_parallelism=args.array_parallelism,
        )
    elif args.executor == "ray":
        options = dict(address=args.address, cpus_per_cell=args.cpus_per_cell or 1, cells_per_task=args.cells_per_job)
    try:
        if args.dry_run:
            ex = make(args.executor, workers=args.workers, warm=not args.cold, **options)
            if args.executor in ("submitit", "ray") and not available(args.executor):
                raise _UsageError(f"--executor {args.executor} {reason(args.executor)}")
            merging: list[dict] = []
            for src in args.merge:
                if not os.path.isfile(src):
                    raise ConfigError("matrix", "merge", f"{src!r} is not a file.", "pass results.jsonl files.")
                records, skipped = store.read_results(src)  # read as --merge would, nothing written
                merging.extend(records.values())
                if skipped:
                    print(f"--merge {store.skipped_text(src, skipped)}", file=sys.stderr)
            runnable, pending = sweeps.plan(
                cells, out=args.out, timeout_s=args.timeout_s, retry_timeouts=not args.keep_timeouts, merging=merging
            )
            print(
                f"matrix --dry-run: {len(runnable)} cells ({len(cells) - len(runnable)} invalid combinations left "
                f"out), {len(pending)} to run on {ex.describe()}, {len(runnable) - len(pending)} already in "
                f"{os.path.join(args.out, store.RESULTS)}"
                + (
                    f" once {len(merging)} records from {len(args.merge)} results file(s) are merged in"
                    if args.merge
                    else ""
                )
                + ". Nothing was run."
            )
            for cell in pending:  # what would run, one per line, in the order it would run
                print(f"  {terminal(cell.label)}")
            return 0
        if args.merge:
            added, skipped = store.merge_into(args.out, args.merge)
            for src, lines in skipped.items():
                print(f"--merge {store.skipped_text(src, lines)}", file=sys.stderr)
            n = sum(len(lines) for lines in skipped.values())
            print(
                f"merged {added} records into {os.path.join(args.out, store.RESULTS)}"
                + (f" ({n} line{'s' if n != 1 else ''} skipped: not records)" if n else ""),
                file=sys.stderr,
            )
        _stamp.clear(args.out)
        result = sweeps.sweep(
            cells,
            out=args.out,
            workers=args.workers,
            timeout_s=args.timeout_s,
            progress=not args.no_progress,
            executor=args.executor,
            warm=not args.cold,
            retry_timeouts=not args.keep_timeouts,
            bare=not args.no_bare,
            **options,
        )
    except (ConfigError, _UsageError) as e:
        _say_error(e)
        return EXIT_USAGE
    except store.FolderBusy as e:
        _say_error(e)
        return EXIT_FAILED
    stdout = sweeps.summary_lines(result)
    print(_stamp.render(stdout))
    print(
        f"wrote {os.path.join(args.out, 'matrix.json')}, matrix.md, matrix.html (results in "
        f"{os.path.join(args.out, store.RESULTS)})"
    )
    stderr, code = [], EXIT_OK
    if not sweeps.measured(result):
        stderr.append(
            f"error: no cell produced a measurement: all {len(result.rows)} crashed or timed out (exit "
            f"{EXIT_NOTHING_MEASURED}). Fix: read the reasons above; a longer --timeout-s, or fewer --workers."
        )
        code = EXIT_NOTHING_MEASURED
    for line in stderr:
        print(line, file=sys.stderr)
    if not args.merge and sweeps.settled(
        result, out=args.out, timeout_s=args.timeout_s, retry_timeouts=not args.keep_timeouts, bare=not args.no_bare
    ):
        # The same command prints this again, from the stamp, while nothing it depends on changes.
        _stamp.write(argv, args.out, {"stdout": stdout, "stderr": left_out + stderr, "code": code}, extras())
    return code


def _lab_command(extra: list[str]) -> int:
    """`python -m toolkit lab [JUPYTER-LAB-ARGS]`: JupyterLab on the notebooks with autosave off, so that running a
    committed notebook does not rewrite it (File > Save still saves). The other settings are the user's own."""
    import os
    import pathlib
    import subprocess
    import tempfile

    from . import _files

    here = pathlib.Path(__file__).resolve().parents[1] / "notebooks"
    # JupyterLab reads overrides.json from its app settings folder: start from the environment's own overrides.
    own = pathlib.Path(sys.prefix) / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    overrides = (
        _files.loads(_files.read_capped(own, "lab", "overrides.json"), "lab", "overrides.json") if own.is_file() else {}
    )
    overrides.setdefault("@jupyterlab/docmanager-extension:plugin", {})["autosave"] = False
    with tempfile.TemporaryDirectory(prefix="toolkit-lab-") as settings:
        _files.write_text(pathlib.Path(settings) / "overrides.json", json.dumps(overrides, indent=1))
        cmd = [sys.executable, "-m", "jupyterlab", f"--LabApp.app_settings_dir={settings}"]
        if not any(not a.startswith("-") for a in extra) and here.is_dir():
            cmd.append(str(here))
        from .execution.channel import ends_with_this_process

        # JupyterLab ends with this command, however it ends (a kill -9 left it serving, an orphan): the mechanism
        # the toolkit's own children use, given to a program it does not control.
        proc = subprocess.Popen(cmd + extra, env=dict(os.environ), preexec_fn=ends_with_this_process())
        try:
            return proc.wait()
        except KeyboardInterrupt:
            proc.terminate()
            proc.wait()
            return 130


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

_MATRIX_EPILOG = """\
exit codes:
  0    the sweep ran and wrote the matrix (its cells may still be errors or silent failures: see the summary)
  2    bad input (options, --out, --merge files), refused before the first cell
  4    no cell produced a measurement: every cell crashed or timed out (the matrix is still written)
  130  interrupted (Ctrl-C); the cells that finished are in results.jsonl, and the next run resumes

Re-running resumes from OUT/results.jsonl: crashed cells run again, and so do timed-out ones — under a longer
--timeout-s always, under the same limit once (--keep-timeouts keeps them)."""

_RUN_EPILOG = """\
exit codes:
  0  the step ran (with --strict: and no silent failure was found)
  1  the step failed: error, crashed or timeout
  2  bad input (an unknown preset, an unreadable or invalid --config, --timeout-s without --isolate)
  3  --strict and a silent failure: any classification other than works, error, crashed, timeout

The first line is the classification: NAME: LABEL — why; known cases. For an AC scenario `run` also measures the
same setup without AC (and, for a selective mode, with full AC), which sac_not_applied and ac_saves_nothing need;
--no-refs skips them."""


def _parser() -> argparse.ArgumentParser:
    from ._config import MAX_RANKS, arg_type, check_int, check_seconds
    from .analysis.catalogue import CPU_STATUSES, cases
    from .estimation.estimates import LAYER_SHAPES

    ids = [c.id for c in cases()]
    parser = _Parser(
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
    d = sub.add_parser("demo", description="Train a small MoE model under six AC / compile setups and print one table.")
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
    r = sub.add_parser(
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
    r.set_defaults(run_parser=r)  # its usage line goes with the errors main() finds after parsing
    c = sub.add_parser("cases", description="The catalogue of known AC x compile x MoE cases, or their repros re-run.")
    c.add_argument("--cpu", choices=list(CPU_STATUSES), help="only cases with this CPU status")
    c.add_argument(
        "--needs",
        choices=["cpu", "gpu", "multi-rank"],
        help="only cases whose repro needs this: one CPU process, a GPU, or several ranks",
    )
    c.add_argument("--text", help="only cases whose title/configuration/symptom/mechanism contain this text")
    c.add_argument("--findings", action="store_true", help="add this machine's recorded verdicts to the torch column")
    c.add_argument(
        "--markdown",
        action="store_true",
        help="print the markdown table (upstream links, notebooks, every release's verdict)",
    )
    c.add_argument(
        "--page",
        action="store_true",
        help="print the central list as one Markdown page (docs/central-list/README.md): every case by theme, its "
        "verdict on each release, workaround, upstream links and repro",
    )
    c.add_argument(
        "--upgrade",
        action="store_true",
        help="print 'Before you upgrade torch' (docs/central-list/upgrade.md): per release pair, the cases gone and "
        "new, and the swept cells that changed, from the catalogue and the committed records",
    )
    c.add_argument(
        "--check",
        nargs="+",
        metavar="CASE",
        help="run the standalone repro of these cases (or 'all') and check their signatures on this torch",
    )
    p = sub.add_parser(
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
    sub.add_parser(
        "env", description="This torch, and every private torch API the toolkit relies on: available or not."
    )
    sub.add_parser("matrix", add_help=False)
    sub.add_parser("lab", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command line: one line `error: … Fix: …` and exit 2 for bad input (never a traceback), one line and exit 1
    for a file it could not write (a full disk: the previous file is left whole), 130 after Ctrl-C (the interrupted
    command has already stopped its workers)."""
    from . import _files, _interrupt
    from ._config import ConfigError

    _interrupt.raise_again()
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (ConfigError, _UsageError) as e:
        _say_error(e)
        return EXIT_USAGE
    except _files.WriteFailed as e:
        _say_error(e.strerror)
        return EXIT_FAILED


def _main(argv: list[str] | None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "matrix":  # its own parser, built after the stamp is checked
        return _matrix_command(argv[1:])
    if argv and argv[0] == "lab":
        return _lab_command(argv[1:])
    parser = _parser()
    if not argv:  # `python -m toolkit` on its own: what there is to run, not a usage error
        parser.print_help()
        return 0
    args = parser.parse_args(argv)
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    _once(commands.choices[args.command], argv[1:])
    _inert(args.command, commands.choices[args.command], args, argv[1:])
    if args.command == "run":
        if args.timeout_s is not None and not args.isolate and args.nproc == 1:
            # The same rule as tk.run(timeout_s=..., isolate=False), said in the CLI's own words.
            args.run_parser.error(
                "--timeout-s needs --isolate: only a subprocess can be stopped when the time is up. "
                "Fix: add --isolate, or drop --timeout-s."
            )
        return _run_command(args)
    if args.command == "cases":
        return _cases_command(args)
    if args.command == "plan":
        return _plan_command(args)
    if args.command == "env":
        from . import compat
        from ._extras import available
        from .execution import environment
        from .stacks import extras, reason

        print("\n".join(f"{k}: {v}" for k, v in environment().items()))
        print(compat.table())
        print("\n".join(f"optional: {reason(m)}" for m in extras() if not available(m)) or "optional: all installed")
        return 0
    if args.command == "demo":
        import torch

        rows = demo_rows(args.backend, args.layers)
        print(json.dumps(rows, indent=2) if args.json else format_rows(rows))
        print(
            f"\ntorch {torch.__version__}, device cpu; gradients compared with the same model run eagerly without AC.",
            file=sys.stderr if args.json else sys.stdout,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
