"""Command line: `python -m toolkit demo` trains a small MoE model under several AC/compile setups and prints what changed."""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch


def demo_rows(backend: str = "aot_eager", n_layers: int = 2) -> list[dict]:
    """One row per setup: structure, loss, largest gradient difference from eager no-AC, compiled graphs."""
    from . import compat
    from .measure.numerics import grads as _grads
    from .models import ModelConfig, build_model, make_batch
    from .transforms import ACConfig, CompileConfig, apply_recipe, prepare, reset, train_step
    from .transforms.settings import applied

    cfg = ModelConfig(n_layers=n_layers)
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


def _run_command(args) -> int:
    from ._config import ConfigError
    from .measure import PRESETS, Scenario, preset, run

    if args.list:
        for name, sc in PRESETS.items():
            print(f"{name:28} {sc.replace(name='').label}")
        return 0
    try:
        if args.preset:
            scenario = preset(args.preset)
        else:
            with open(args.config) as f:
                scenario = Scenario.from_json(f.read())
    except (ConfigError, OSError, ValueError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.nproc < 1:
        print(f"error: --nproc must be 1 or more (got {args.nproc})", file=sys.stderr)
        return 2
    if args.nproc > 1:
        from .measure import run_distributed

        merged = run_distributed(scenario, nproc=args.nproc, timeout_s=args.timeout_s or 900)
        print(merged.to_json() if args.json else str(merged))
        return 0 if merged.ok else 1
    report = run(scenario, isolate=args.isolate, timeout_s=args.timeout_s)
    print(report.to_json() if args.json else str(report))
    return 0 if report.ok else 1


def _cases_command(args) -> int:
    from . import bugs
    from .analysis import catalogue

    if not args.check:
        sel = catalogue.filter(cpu=args.cpu, text=args.text)
        print(catalogue.markdown(sel, with_findings=args.findings))
        return 0
    ids = args.check
    if ids == ["all"]:
        ids = [c.id for c in catalogue.cases() if c.signature and _has_script(c.id)]
    status = 0
    for cid in ids:
        try:
            finding = bugs.check(cid)
        except KeyError as e:
            print(f"error: {e.args[0]} (cases with a standalone script: see toolkit/bugs/standalone/)", file=sys.stderr)
            return 2
        except AssertionError as e:
            print(e)
            status = 1
            continue
        print(f"{cid} skipped on this machine (see its script's NEEDS)" if finding is None else finding)
    return status


def _has_script(case_id: str) -> bool:
    from . import bugs

    try:
        bugs.script(case_id)  # finds it by file name or by a script's CASES
    except KeyError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolkit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="train a small MoE under several AC/compile setups and print a report")
    d.add_argument("--backend", default="aot_eager", choices=["eager", "aot_eager", "aot_eager_decomp_partition", "inductor"])
    d.add_argument("--layers", type=int, default=2)
    d.add_argument("--json", action="store_true", help="print JSON instead of a table")
    r = sub.add_parser("run", help="measure one scenario and print its report")
    src = r.add_mutually_exclusive_group(required=True)
    src.add_argument("--preset", help="a named scenario (see --list)")
    src.add_argument("--config", help="a Scenario JSON file (Scenario.to_json())")
    src.add_argument("--list", action="store_true", help="list the presets")
    r.add_argument("--json", action="store_true", help="print the Report as JSON")
    r.add_argument("--isolate", action="store_true", help="run in a subprocess (crashes/hangs become results)")
    r.add_argument("--timeout-s", type=float, default=None, help="with --isolate: give up after this many seconds")
    r.add_argument("--nproc", type=int, default=1,
                   help="run on this many ranks under torchrun (gloo, 127.0.0.1) and print the ranks side by side")
    c = sub.add_parser("cases", help="the catalogue of known cases as markdown, or re-check them on this torch")
    c.add_argument("--cpu", choices=["reproduced", "plausible", "gpu_only"], help="only cases with this CPU status")
    c.add_argument("--text", help="only cases whose title/configuration/symptom/mechanism contain this text")
    c.add_argument("--findings", action="store_true", help="add this machine's recorded verdicts to the torch column")
    c.add_argument("--check", nargs="+", metavar="CASE",
                   help="run the standalone repro of these cases (or 'all') and check their signatures on this torch")
    sub.add_parser("env", help="this torch, and every private torch API the toolkit relies on: available or not")
    sub.add_parser("matrix", help="sweep AC x compile x MoE and write the composability matrix", add_help=False)
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "matrix":
        from .analysis.sweeps import main as matrix_main

        return matrix_main(argv[1:])
    args = parser.parse_args(argv)
    if args.command == "run":
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
        rows = demo_rows(args.backend, args.layers)
        print(json.dumps(rows, indent=2) if args.json else format_rows(rows))
        print(f"\ntorch {torch.__version__}, device cpu; gradients compared with the same model run eagerly without AC.",
              file=sys.stderr if args.json else sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
