"""Command line: `python -m toolkit demo|run|cases|env|matrix` — the demo table, one measured scenario, the known cases, this torch's private APIs, the composability sweep."""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time


def demo_rows(backend: str = "aot_eager", n_layers: int = 2) -> list[dict]:
    """One row per setup: structure, loss, largest gradient difference from eager no-AC, compiled graphs."""
    from . import compat
    from .measure.numerics import grads as _grads
    from .measure.runner import capture_warnings
    from .models import ModelConfig, build_model, make_batch
    from .transforms import ACConfig, CompileConfig, apply_recipe, prepare, reset, train_step
    from .transforms.settings import applied

    # The for_loop experts' `.tolist()` is the graph break the demo exists to show (C2): with the default
    # `grouped_mm` experts nothing breaks, and row 4 would look like row 5.
    cfg = ModelConfig(n_layers=n_layers, experts_impl="for_loop")
    batch = make_batch(cfg)
    ref = build_model(cfg)
    ref_loss = train_step(ref, batch).item()
    ref_grads = _grads(ref)
    setups = [
        ("no AC, eager", dict(ac=ACConfig(), compile=CompileConfig())),
        ("full AC, eager", dict(ac=ACConfig(mode="full"), compile=CompileConfig())),
        ("selective_op AC, eager", dict(ac=ACConfig(mode="selective_op"), compile=CompileConfig())),
        ("full AC, compile(AC(block)), fullgraph=False", dict(ac=ACConfig(mode="full"), compile=CompileConfig(
            scope="blocks", backend=backend))),
        ("full AC, compile(AC(block)), fullgraph=True", dict(ac=ACConfig(mode="full"), compile=CompileConfig(
            scope="blocks", backend=backend, fullgraph=True))),
        ("recipe torchtitan_0_3_0", "torchtitan_0_3_0"),
    ]
    rows = []
    for label, setup in setups:
        compat.reset_dynamo()
        before = compat.counters_snapshot()
        model = build_model(cfg)
        row: dict = {"setup": label}
        t0 = time.perf_counter()
        caught: list[str] = []
        # torch logs warnings such as "Detected that context_fn is passed to torch.utils.checkpoint under
        # torch.compile" to stderr; the demo's output is its table, so they go into the row (shown by --json).
        with capture_warnings(caught):
            try:
                if isinstance(setup, str):
                    apply_recipe(model, setup, backend=backend)
                else:
                    prepare(model, **setup)
                loss = train_step(model, batch).item()
                grads = _grads(model)
                row.update(
                    outcome="ok",
                    loss=round(loss, 6),
                    loss_diff=abs(loss - ref_loss),
                    max_grad_diff=max((grads[k] - ref_grads[k]).abs().max().item() for k in ref_grads),
                )
            except Exception as e:  # a failing setup is a result, not a crash of the demo
                row.update(outcome="error", error=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
        rec = applied(model)
        graphs, breaks = compat.graphs_compiled(before)
        row.update(
            checkpointed=list(rec.ac_wrapped),
            compiled=list(rec.compiled),
            orders=sorted(set(rec.compile_orders.values())),
            graphs=graphs,
            graph_breaks=breaks,
            seconds=round(time.perf_counter() - t0, 2),
            warnings=[w.strip() for w in caught if w.strip()],
        )
        reset(model)
        rows.append(row)
    return rows


def format_rows(rows: list[dict]) -> str:
    lines = [f"{'setup':46} {'outcome':7} {'loss':>9} {'max|dgrad|':>10} {'graphs':>6} {'breaks':>6}  checkpointed / compiled"]
    for r in rows:
        if r["outcome"] == "ok":
            nums = f"{r['loss']:9.4f} {r['max_grad_diff']:10.1e}"
        else:
            nums = f"{'-':>9} {'-':>10}"
        where = f"{len(r['checkpointed'])} wrapped / {len(r['compiled'])} compiled {' '.join(r['orders'])}"
        lines.append(f"{r['setup']:46} {r['outcome']:7} {nums} {r['graphs']:6d} {r['graph_breaks']:6d}  {where}")
        if r["outcome"] != "ok":
            lines.append(f"    {r['error']}")
    return "\n".join(lines)


# Exit codes of `run` (also in its --help).
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_SILENT = 0, 1, 2, 3


def _load_scenario(args):
    """The scenario `run` was asked for; a ConfigError or an unreadable file becomes one line naming the file."""
    from ._config import ConfigError
    from .measure import Scenario, preset

    if args.preset:
        return preset(args.preset)
    path = args.config
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise _UsageError(f"--config {path}: cannot read it ({e.strerror or e}).",
                          "pass the path of a Scenario JSON file (Scenario.to_json() writes one).") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise _UsageError(f"--config {path} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}.",
                          "fix the JSON, or write the file with Scenario.to_json().") from None
    try:
        return Scenario.from_dict(data)
    except ConfigError as e:
        raise _UsageError(f"--config {path}: {e}") from None


class _UsageError(Exception):
    """Bad input to the CLI: printed as `error: …` with its fix, exit code 2, before any heavy work."""

    def __init__(self, problem: str, fix: str = ""):
        super().__init__(problem + (f" Fix: {fix}" if fix else ""))


def _run_command(args) -> int:
    from dataclasses import asdict

    from ._config import ConfigError
    from .analysis.classification import SILENT, classify, describe, headline, reference_scenarios
    from .measure import PRESETS, run

    if args.list:
        for name, sc in PRESETS.items():
            print(f"{name:28} {sc.replace(name='').label}")
        return EXIT_OK
    try:
        scenario = _load_scenario(args)
    except (_UsageError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.nproc < 1:
        print(f"error: --nproc must be 1 or more (got {args.nproc})", file=sys.stderr)
        return EXIT_USAGE
    if args.nproc > 1:
        from .measure import run_distributed

        merged = run_distributed(scenario, nproc=args.nproc, timeout_s=args.timeout_s or 900)
        print(merged.to_json() if args.json else str(merged))
        return EXIT_OK if merged.ok else EXIT_FAILED
    report = run(scenario, isolate=args.isolate, timeout_s=args.timeout_s)
    refs = {}
    if report.ok and not args.no_refs:
        # sac_not_applied and ac_saves_nothing are only visible against the same setup without AC / with full AC.
        refs = {key: run(ref, isolate=args.isolate, timeout_s=args.timeout_s)
                for key, ref in reference_scenarios(scenario).items()}
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


def _positive_seconds(text: str) -> float:
    """argparse type of --timeout-s: a finite number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds (e.g. --timeout-s 600)")
    return value


def _cases_command(args) -> int:
    from . import bugs
    from .analysis import catalogue

    if not args.check:
        sel = catalogue.filter(cpu=args.cpu, text=args.text, needs=args.needs)
        if args.markdown:
            print(catalogue.markdown(sel, with_findings=args.findings))
        else:
            print(catalogue.text(sel, width=shutil.get_terminal_size((100, 24)).columns, with_findings=args.findings))
        return 0
    ids = args.check
    if ids == ["all"]:
        ids = [c.id for c in catalogue.cases() if c.signature and bugs.has_script(c.id)]
    unknown = [cid for cid in ids if not bugs.has_script(cid)]
    if unknown:
        print(f"error: no standalone repro for {', '.join(unknown)} (cases with a standalone script: see "
              "toolkit/bugs/standalone/, or `python -m toolkit cases --check all`)", file=sys.stderr)
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


def _lab_command(extra: list[str]) -> int:
    """`python -m toolkit lab [JUPYTER-LAB-ARGS]`: JupyterLab on the notebooks with autosave off, so that running a
    committed notebook does not rewrite it (File > Save still saves). The other settings are the user's own."""
    import os
    import pathlib
    import subprocess
    import tempfile

    here = pathlib.Path(__file__).resolve().parents[1] / "notebooks"
    # JupyterLab reads overrides.json from its app settings folder: start from the environment's own overrides.
    own = pathlib.Path(sys.prefix) / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    overrides = json.loads(own.read_text()) if own.is_file() else {}
    overrides.setdefault("@jupyterlab/docmanager-extension:plugin", {})["autosave"] = False
    with tempfile.TemporaryDirectory(prefix="toolkit-lab-") as settings:
        (pathlib.Path(settings) / "overrides.json").write_text(json.dumps(overrides, indent=1))
        cmd = [sys.executable, "-m", "jupyterlab", f"--LabApp.app_settings_dir={settings}"]
        if not any(not a.startswith("-") for a in extra) and here.is_dir():
            cmd.append(str(here))
        try:
            return subprocess.call(cmd + extra, env=dict(os.environ))
        except KeyboardInterrupt:
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
  env      this torch and every private torch API the toolkit relies on: available or not
  matrix   sweep AC x compile x MoE, each cell in its own subprocess, and write matrix.md / .json / .html
           (python -m toolkit matrix --help for its options)
  lab      open the notebooks in JupyterLab with autosave off, so that running one leaves the committed file as
           it is (File > Save still saves); other arguments go to jupyter lab

`python -m toolkit SUBCOMMAND --help` describes each one's options."""

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
    from .analysis.catalogue import CPU_STATUSES

    from .analysis.catalogue import cases

    ids = [c.id for c in cases()]
    parser = argparse.ArgumentParser(prog="python -m toolkit", epilog=_OVERVIEW.format(cases=f"{ids[0]}-{ids[-1]}"),
                                     description="See how activation checkpointing, torch.compile and MoE compose on a "
                                                 "small torchtitan-shaped model.",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    # Each subcommand is described once, in _OVERVIEW (argparse's own list wraps them into a narrow column).
    sub = parser.add_subparsers(dest="command", required=True, metavar="{demo,run,cases,env,matrix,lab}",
                                help="one of the subcommands below")
    d = sub.add_parser("demo", description="Train a small MoE model under six AC / compile setups and print one table.")
    d.add_argument("--backend", default="aot_eager", choices=["eager", "aot_eager", "aot_eager_decomp_partition", "inductor"],
                   help="compile backend of the compiled setups (default aot_eager)")
    d.add_argument("--layers", type=int, default=2, help="transformer blocks of the model (default 2)")
    d.add_argument("--json", action="store_true", help="print the rows as JSON (with torch's warnings) instead of a table")
    r = sub.add_parser("run", description="Measure one training step of a scenario and classify it.", epilog=_RUN_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    src = r.add_mutually_exclusive_group(required=True)
    src.add_argument("--preset", metavar="NAME", help="a named scenario (--list shows them)")
    src.add_argument("--config", metavar="FILE", help="a Scenario JSON file (what Scenario.to_json() writes)")
    src.add_argument("--list", action="store_true", help="list the presets and exit")
    r.add_argument("--json", action="store_true",
                   help="print the Report as JSON on stdout (the classification goes to stderr)")
    r.add_argument("--isolate", action="store_true",
                   help="run in a subprocess, so that a crash or a hang comes back as a result")
    r.add_argument("--timeout-s", type=_positive_seconds, default=None, metavar="SECONDS",
                   help="with --isolate or --nproc: give up after this many seconds (a positive number)")
    r.add_argument("--strict", action="store_true",
                   help="exit 3 when the run is a silent failure (fell_back_to_eager, sac_not_applied, grads_differ, ...)")
    r.add_argument("--no-refs", action="store_true",
                   help="skip the reference runs without AC / with full AC (sac_not_applied, ac_saves_nothing "
                        "are then not checked)")
    r.add_argument("--nproc", type=int, default=1, metavar="N",
                   help="run on N ranks under torchrun (gloo, 127.0.0.1) and print the ranks side by side")
    r.set_defaults(run_parser=r)  # its usage line goes with the errors main() finds after parsing
    c = sub.add_parser("cases", description="The catalogue of known AC x compile x MoE cases, or their repros re-run.")
    c.add_argument("--cpu", choices=list(CPU_STATUSES), help="only cases with this CPU status")
    c.add_argument("--needs", choices=["cpu", "gpu", "multi-rank"],
                   help="only cases whose repro needs this: one CPU process, a GPU, or several ranks")
    c.add_argument("--text", help="only cases whose title/configuration/symptom/mechanism contain this text")
    c.add_argument("--findings", action="store_true", help="add this machine's recorded verdicts to the torch column")
    c.add_argument("--markdown", action="store_true",
                   help="print the markdown table (upstream links, notebooks, every release's verdict)")
    c.add_argument("--check", nargs="+", metavar="CASE",
                   help="run the standalone repro of these cases (or 'all') and check their signatures on this torch")
    sub.add_parser("env", description="This torch, and every private torch API the toolkit relies on: available or not.")
    sub.add_parser("matrix", add_help=False)
    sub.add_parser("lab", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    if argv is None:
        argv = sys.argv[1:]
    if not argv:  # `python -m toolkit` on its own: what there is to run, not a usage error
        parser.print_help()
        return 0
    if argv and argv[0] == "matrix":
        from .analysis.sweeps import main as matrix_main

        return matrix_main(argv[1:])
    if argv and argv[0] == "lab":
        return _lab_command(argv[1:])
    args = parser.parse_args(argv)
    if args.command == "run":
        if args.timeout_s is not None and not args.isolate and args.nproc == 1:
            # The same rule as tk.run(timeout_s=..., isolate=False), said in the CLI's own words.
            args.run_parser.error("--timeout-s needs --isolate: only a subprocess can be stopped when the time is up. "
                           "Fix: add --isolate, or drop --timeout-s.")
        return _run_command(args)
    if args.command == "cases":
        return _cases_command(args)
    if args.command == "env":
        from . import compat
        from .measure import environment

        print("\n".join(f"{k}: {v}" for k, v in environment().items()))
        print(compat.table())
        return 0
    if args.command == "demo":
        import torch

        rows = demo_rows(args.backend, args.layers)
        print(json.dumps(rows, indent=2) if args.json else format_rows(rows))
        print(f"\ntorch {torch.__version__}, device cpu; gradients compared with the same model run eagerly without AC.",
              file=sys.stderr if args.json else sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
