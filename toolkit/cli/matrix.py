"""`python -m toolkit matrix`: the composability sweep (its own parser, built after the folder's stamp is read, so
that a settled folder answers without importing torch)."""

from __future__ import annotations

import argparse
import os
import sys

from .common import (
    EXIT_FAILED,
    EXIT_NOTHING_MEASURED,
    EXIT_OK,
    EXIT_USAGE,
    Parser,
    Rule,
    UsageError,
    inert,
    once,
    say_error,
)

INERT: tuple[Rule, ...] = (
    (
        lambda a: a.model is None,
        ("blocks",),
        "--blocks names the blocks of --model's model",
        "pass --model FILE.py:FUNCTION too, or drop {opt}",
    ),
)


EPILOG = """\
exit codes:
  0    the sweep ran and wrote the matrix (its cells may still be errors or silent failures: see the summary)
  2    bad input (options, --out, --merge files), refused before the first cell
  4    no cell produced a measurement: every cell crashed or timed out (the matrix is still written)
  130  interrupted (Ctrl-C); the cells that finished are in results.jsonl, and the next run resumes

Re-running resumes from OUT/results.jsonl: crashed cells run again, and so do timed-out ones — under a longer
--timeout-s always, under the same limit once (--keep-timeouts keeps them)."""


class MatrixParser(Parser):
    executor_options: dict[str, tuple[str, ...]]
    """Each executor's own options, and the executors that read them (from the argument groups)."""


def build_parser() -> MatrixParser:
    from .._config import arg_type, check_int, check_seconds
    from ..analysis import sweeps
    from ..analysis.executors import EXECUTORS
    from ..transforms.compile import BACKENDS

    def count(minimum: int):
        return arg_type(lambda v: check_int("matrix", "count", v, minimum), convert=int)

    parser = MatrixParser(
        prog="python -m toolkit matrix",
        description=sweeps.__doc__.splitlines()[0],
        epilog=EPILOG,
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


def command(argv: list[str]) -> int:
    """`python -m toolkit matrix …`: the sweep, or with --dry-run what it would run. The same command again on a
    folder it left with nothing to run answers from the folder's stamp, without importing torch (`_stamp`)."""
    from .. import _stamp
    from ..stacks import extras

    code = _stamp.replay(argv, extras())
    if code is not None:
        return code
    import re

    from .._config import ConfigError
    from .._escape import terminal
    from .._extras import available, reason
    from ..analysis import store, sweeps
    from ..analysis.cells import left_out as left_out_cells
    from ..analysis.executors import make

    parser = build_parser()
    args = parser.parse_args(argv)
    once(parser, argv)
    inert(INERT, parser, args, argv)
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
        from ..analysis.grids import model_cells
        from ..stacks.user import UserModelConfig, preflight

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
                raise UsageError(f"--executor {args.executor} {reason(args.executor)}")
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
            added, skipped_by_file = store.merge_into(args.out, args.merge)
            for src, lines in skipped_by_file.items():
                print(f"--merge {store.skipped_text(src, lines)}", file=sys.stderr)
            n = sum(len(lines) for lines in skipped_by_file.values())
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
    except (ConfigError, UsageError) as e:
        say_error(e)
        return EXIT_USAGE
    except store.FolderBusy as e:
        say_error(e)
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
