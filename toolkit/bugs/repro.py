"""Bug bundles: a standalone script + notebook that re-run a scenario and assert what was observed, its environment,
and optionally a `TORCH_TRACE` directory for tlparse.

Nothing a Report or a Scenario holds becomes code: every string goes into the script as a Python literal (`repr`),
into the notebook's markdown escaped, and a scenario's name or torch version only ever as data. A bundle never
replaces a file unless asked (`overwrite=True`).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from dataclasses import dataclass

from .. import _escape, _files
from .._config import ConfigError, check_bool, check_instance, check_seconds
from ..analysis.classification import classify
from ..execution.machine import environment
from ..measurement.report import Report
from ..measurement.scenario import Scenario

SUFFIXES = (".py", ".ipynb", ".env.json")
"""The bundle's files, each `PATH + suffix` (and `PATH.trace`, a directory, with `trace=True`)."""


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
    model: pathlib.Path | None = None
    """A user's model (`stack="user"`): the copy of the file its `build()` lives in, which the script imports from
    beside itself."""

    def names(self) -> list[str]:
        """File names only (stable text for notebooks)."""
        files = (self.script, self.notebook, self.environment, self.trace, self.model)
        return [p.name for p in files if p is not None]


def _stem(report: Report, case: str | None) -> str:
    """A file name for a bundle written into a folder: the case id, else the scenario's name made safe, else
    "repro", through the one file-name escaper."""
    return _escape.file_name(case or report.scenario.name or "", "repro")


def bundle_base(path: str | os.PathLike, report: Report, case: str | None = None) -> pathlib.Path:
    """Where the bundle's files go, `BASE + suffix` each: a path ending in `/` or naming a folder means a bundle
    inside it; a path ending in one of the bundle's own suffixes (`x.py`) names the bundle by that file; any other
    suffix is part of the name (`my.bundle.v2` → `my.bundle.v2.py`, never `my.bundle.py`)."""
    text = os.fspath(path)
    if not isinstance(text, str):
        raise ConfigError(
            "repro.export", "path", f"{path!r} is bytes, not text.", "pass the path as a str or a pathlib.Path."
        )
    if not text.strip():
        raise ConfigError(
            "repro.export", "path", f"{path!r} is empty.", "pass a file name such as 'repro-out/c2', or a folder."
        )
    p = pathlib.Path(text)
    if text.endswith(("/", os.sep)) or p.is_dir():
        return p / _stem(report, case)
    for suffix in SUFFIXES:
        if p.name.endswith(suffix) and len(p.name) > len(suffix):
            return p.with_name(p.name[: -len(suffix)])
    return p


MODEL_SUFFIX = "_model.py"
"""A user's model file, copied beside the bundle (`BASE_model.py`)."""


def _targets(base: pathlib.Path, trace: bool, user_model: bool = False) -> dict[str, pathlib.Path]:
    out = {s: pathlib.Path(f"{base}{s}") for s in SUFFIXES}
    if trace:
        out[".trace"] = pathlib.Path(f"{base}.trace")
    if user_model:
        out[MODEL_SUFFIX] = pathlib.Path(f"{base}{MODEL_SUFFIX}")
    return out


def _user_model_source(scenario: Scenario) -> tuple[pathlib.Path, str] | None:
    """For a user's model (`stack="user"`) given as `FILE.py:FUNCTION`: its file and function, to copy beside the
    bundle; None for another stack. A `MODULE:FUNCTION` one must be importable where the bundle runs (said in it)."""
    if scenario.stack != "user":
        return None
    where, fn = scenario.model.build.rsplit(":", 1)
    if not where.endswith(".py"):
        return None
    path = pathlib.Path(where)
    if not path.is_file():
        raise ConfigError(
            "repro.export", "scenario", f"the model file {where!r} is gone.", "export from where the file is."
        )
    return path, fn


def _check_targets(targets: dict[str, pathlib.Path], overwrite: bool) -> None:
    """Refuse before anything is written: a target that is a folder (a file of the bundle) or a file (the trace
    folder) always, an existing one unless `overwrite`."""
    for suffix, p in targets.items():
        wants_dir = suffix == ".trace"
        if p.exists() and p.is_dir() != wants_dir:
            kind = "a folder" if p.is_dir() else "a file"
            raise ConfigError(
                "repro.export",
                "path",
                f"{str(p)!r} is {kind}; the bundle needs it as {'a folder' if wants_dir else 'a file'}.",
                "pass another path.",
            )
        if p.exists() and not overwrite:
            raise ConfigError(
                "repro.export",
                "path",
                f"{str(p)!r} exists; a bundle never replaces a file unasked.",
                "pass overwrite=True to replace the bundle there, or another path.",
            )


def _script(report: Report, scenario: Scenario, case: str | None, model_file: str | None = None) -> tuple[str, str]:
    """The script's setup and its checks. Every value from the report or the scenario is a `repr` literal.
    `model_file`: a user's model copied beside the script, which the scenario's `build` then names."""
    name = _escape.terminal(report.scenario.name) or case or "scenario"
    checks = [f"assert report.outcome == {report.outcome!r}, report"]
    if report.error is not None:
        checks.append(f"assert report.error.type == {report.error.type!r}, report.error")
    if report.ok:
        checks.append(f"assert report.compile.fell_back_to_eager == {report.compile.fell_back_to_eager!r}")
        checks.append(f"assert report.numerics.grads_match == {report.numerics.grads_match!r}")
    if case is not None:
        checks.append(f"assert {case!r} in tk.classify(report).cases, {f'catalogue case {case} not recognised'!r}")
    setup = "\n".join(
        [
            '"""Re-runs a toolkit scenario and asserts what was observed (written by toolkit.repro.export)."""',
            "import platform",
            "",
            "import torch",
            "",
            "import toolkit as tk",
            "",
            f"NAME = {name!r}",
            f"OBSERVED = {{'torch': {str(report.environment.get('torch', '?'))!r}, 'outcome': {report.outcome!r}}}",
            f"SCENARIO = {scenario.to_json()!r}",
            "",
            'print("reproducing", NAME, "| observed with torch", OBSERVED["torch"], ":", OBSERVED["outcome"])',
            'print("torch", torch.__version__, "| python", platform.python_version(), "| cuda", '
            "torch.cuda.is_available())",
            "scenario = tk.Scenario.from_json(SCENARIO)",
            *(
                [
                    f"# Your model, copied beside this script as {model_file} (files it imports from its own folder",
                    "# must sit beside it too): the notebook runs in its own folder, the script from anywhere.",
                    "import os",
                    "",
                    "HERE = os.path.dirname(os.path.abspath(globals().get('__file__', 'notebook')))",
                    "MODEL = os.path.join(HERE, scenario.model.build)",
                    "scenario = scenario.replace(model=scenario.model.replace(build=MODEL))",
                ]
                if model_file
                else []
            ),
            "report = tk.run(scenario)",
            "print(report)",
            "",
        ]
    )
    return setup, "\n".join(checks) + "\nprint('reproduced')\n"


def export(
    report: Report,
    path: str | os.PathLike,
    *,
    scenario: Scenario | None = None,
    case: str | None = None,
    trace: bool = False,
    timeout_s: float = 600,
    overwrite: bool = False,
) -> Bundle:
    """Write `PATH.py`, `PATH.ipynb` and `PATH.env.json` reproducing `report`'s scenario and asserting its outcome
    (and, with `case`, that the catalogue case is recognised). `trace=True` also re-runs the script once with
    `TORCH_TRACE=PATH.trace` so the bundle carries Dynamo/AOT/Inductor structured logs (`pip install tlparse`).

    `PATH` ending in `/` or naming a folder writes the bundle inside it (named after `case` or the scenario);
    suffixes are added to `PATH`, never substituted. An existing file is not replaced unless `overwrite=True`
    (ConfigError, before anything is written)."""
    import nbformat

    check_instance("repro.export", "report", report, Report, "pass the Report to reproduce (tk.run(...)).")
    check_bool("repro.export", "overwrite", overwrite)
    check_bool("repro.export", "trace", trace)
    check_seconds("repro.export", "timeout_s", timeout_s)  # before anything is written
    if case is not None:
        shown = classify(report).cases
        if case not in shown:
            raise ValueError(
                f"case={case!r}: this report does not show {case}'s catalogue signature (it shows "
                f"{', '.join(shown) or 'no catalogued case'}); pass one of those or case=None."
            )
    scenario = scenario if scenario is not None else report.scenario.to_scenario()
    source = _user_model_source(scenario)
    targets = _targets(bundle_base(path, report, case), trace, user_model=source is not None)
    _check_targets(targets, overwrite)
    model_copy = targets.get(MODEL_SUFFIX)
    if source is not None:  # the bundle names its own copy, relative to itself
        assert model_copy is not None  # _targets names it for a user model
        scenario = scenario.replace(model=scenario.model.replace(build=f"{model_copy.name}:{source[1]}"))
    py, ipynb, env = targets[".py"], targets[".ipynb"], targets[".env.json"]
    try:
        py.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a file where a folder of the path should be, a read-only place
        raise ConfigError(
            "repro.export",
            "path",
            f"cannot make the folder {str(py.parent)!r} ({e.strerror or e}).",
            "pass another path.",
        ) from None
    setup, check = _script(report, scenario, case, model_copy.name if model_copy is not None else None)
    if source is not None:
        assert model_copy is not None  # as above
        _files.write_text(model_copy, _files.read_capped(source[0], "repro.export", "scenario"))
    _files.write_text(py, setup + check)  # each file whole or not at all
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    title = _escape.terminal(report.scenario.name) or case or "scenario"
    nb.cells = [
        nbformat.v4.new_markdown_cell(
            f"# Repro: {_escape.markdown(title)}\n\n"
            f"Observed outcome: **{_escape.markdown(report.outcome)}** "
            f"(torch {_escape.markdown(report.environment.get('torch', '?'))})."
        ),
        nbformat.v4.new_code_cell(setup.strip()),
        nbformat.v4.new_code_cell(check.strip()),
    ]
    _files.write_text(ipynb, nbformat.writes(nb))
    _files.write_text(
        env, json.dumps({"observed": report.environment, "exported_on": environment()}, indent=2, sort_keys=True)
    )
    trace_dir = None
    if trace:
        trace_dir = targets[".trace"]
        trace_dir.mkdir(exist_ok=True)
        for old in trace_dir.glob("dedicated_log_torch_trace*"):  # overwrite=True: this run's logs only
            old.unlink()
        run_env = {**os.environ, "TORCH_TRACE": str(trace_dir)}
        try:
            done = subprocess.run(
                [sys.executable, str(py)], env=run_env, capture_output=True, text=True, timeout=timeout_s
            )
        except subprocess.TimeoutExpired:
            raise RuntimeError(
                f"the bundle is written, but its script ran past timeout_s={timeout_s:g} s under TORCH_TRACE, so "
                f"{trace_dir} holds no complete trace; export again with a longer timeout_s"
            ) from None
        _files.write_text(trace_dir / "script-output.txt", done.stdout + done.stderr)
        if not any(p.name.startswith("dedicated_log_torch_trace") for p in trace_dir.iterdir()):
            raise RuntimeError(
                f"the script ran (exit {done.returncode}) but wrote no TORCH_TRACE log into {trace_dir}; "
                f"is compile requested in this scenario? Output:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
            )
    return Bundle(script=py, notebook=ipynb, environment=env, trace=trace_dir, model=model_copy)
