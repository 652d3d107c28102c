"""Bug bundles: a standalone script + notebook that re-run a scenario and assert what was observed, its environment,
and optionally a `TORCH_TRACE` directory for tlparse."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap
from dataclasses import dataclass

from ..analysis.classification import classify
from ..measure.environment import environment
from ..measure.report import Report
from ..measure.scenario import Scenario


@dataclass(frozen=True)
class Bundle:
    """The files `export` wrote."""

    script: pathlib.Path
    """Standalone `.py` (imports torch and toolkit): re-runs the scenario and asserts the observed outcome."""
    notebook: pathlib.Path
    """The same as a notebook."""
    environment: pathlib.Path
    """JSON: the environment of the observed run and of the exporting machine."""
    trace: pathlib.Path | None = None
    """`TORCH_TRACE` directory written by re-running the script (read it with `tlparse`), when asked for."""

    def names(self) -> list[str]:
        """File names only (stable text for notebooks)."""
        return [p.name for p in (self.script, self.notebook, self.environment, self.trace) if p is not None]


def export(
    report: Report,
    path: str | pathlib.Path,
    *,
    scenario: Scenario | None = None,
    case: str | None = None,
    trace: bool = False,
    timeout_s: float = 600,
) -> Bundle:
    """Write `PATH.py`, `PATH.ipynb` and `PATH.env.json` reproducing `report`'s scenario and asserting its outcome
    (and, with `case`, that the catalogue case is recognised). `trace=True` also re-runs the script once with
    `TORCH_TRACE=PATH.trace` so the bundle carries Dynamo/AOT/Inductor structured logs (`pip install tlparse`)."""
    import nbformat

    if case is not None:
        shown = classify(report).cases
        if case not in shown:
            raise ValueError(
                f"case={case!r}: this report does not show {case}'s catalogue signature (it shows "
                f"{', '.join(shown) or 'no catalogued case'}); pass one of those or case=None."
            )
    scenario = scenario if scenario is not None else report.scenario.to_scenario()
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    checks = [f"assert report.outcome == {report.outcome!r}, report"]
    if report.error is not None:
        checks.append(f"assert report.error.type == {report.error.type!r}, report.error")
    if report.ok:
        checks.append(f"assert report.compile.fell_back_to_eager == {report.compile.fell_back_to_eager!r}")
        checks.append(f"assert report.numerics.grads_match == {report.numerics.grads_match!r}")
    if case is not None:
        checks.append(f"assert {case!r} in tk.classify(report).cases, 'catalogue case {case} not recognised'")
    setup = textwrap.dedent(f"""\
        # Reproduces: {report.scenario.name or case or "scenario"}
        # Observed with torch {report.environment.get("torch", "?")}: {report.outcome}
        import platform

        import torch

        import toolkit as tk

        print("torch", torch.__version__, "| python", platform.python_version(), "| cuda", torch.cuda.is_available())
        scenario = tk.Scenario.from_json({json.dumps(scenario.to_json())})
        report = tk.run(scenario)
        print(report)
        """)
    check = "\n".join(checks) + "\nprint('reproduced')\n"
    py = path.with_suffix(".py")
    py.write_text(setup + check)
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        nbformat.v4.new_markdown_cell(
            f"# Repro: {report.scenario.name or case or 'scenario'}\n\n"
            f"Observed outcome: **{report.outcome}** "
            f"(torch {report.environment.get('torch', '?')})."
        ),
        nbformat.v4.new_code_cell(setup.strip()),
        nbformat.v4.new_code_cell(check.strip()),
    ]
    ipynb = path.with_suffix(".ipynb")
    nbformat.write(nb, str(ipynb))
    env = path.with_suffix(".env.json")
    env.write_text(json.dumps({"observed": report.environment, "exported_on": environment()}, indent=2, sort_keys=True))
    trace_dir = None
    if trace:
        trace_dir = path.with_suffix(".trace")
        trace_dir.mkdir(exist_ok=True)
        run_env = {**os.environ, "TORCH_TRACE": str(trace_dir)}
        done = subprocess.run([sys.executable, str(py)], env=run_env, capture_output=True, text=True, timeout=timeout_s)
        (trace_dir / "script-output.txt").write_text(done.stdout + done.stderr)
        if not any(p.name.startswith("dedicated_log_torch_trace") for p in trace_dir.iterdir()):
            raise RuntimeError(
                f"the script ran (exit {done.returncode}) but wrote no TORCH_TRACE log into {trace_dir}; "
                f"is compile requested in this scenario? Output:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
            )
    return Bundle(script=py, notebook=ipynb, environment=env, trace=trace_dir)
