"""The install story stays true: pyproject and environment.yml agree, README's commands exist, CI runs them."""

import ast
import pathlib
import re

import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[ ;]", req.strip(), maxsplit=1)[0].lower()


def _pip_section(text: str) -> list[str]:
    lines, inside = [], False
    for line in text.splitlines():
        if re.match(r"^\s*- pip:\s*$", line):
            inside = True
            continue
        if inside:
            m = re.match(r"^\s{6,}- (.+)$", line)
            if not m:
                break
            lines.append(m.group(1).strip())
    return lines


def test_environment_yml_lists_the_same_packages_as_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = set()
    for r in project["dependencies"] + extras["dev"]:
        r = r.strip()
        own = re.fullmatch(r"toolkit\[(\w+)\]", r)  # dev brings one of the project's own extras: its packages
        wanted |= {x.strip() for x in extras[own.group(1)]} if own else {r}
    env = (ROOT / "environment.yml").read_text()
    pip = _pip_section(env)
    assert "-e .[dev]" in pip
    listed = {r for r in pip if not r.startswith("-")}
    assert listed == wanted, f"environment.yml pip section {sorted(listed)} != pyproject {sorted(wanted)}"
    assert "python=3.11" in env and "conda-forge" in env


def _ci_readme():
    import importlib.util

    spec = importlib.util.spec_from_file_location("ci_readme", ROOT / ".ci" / "readme.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_ci_runs_readmes_two_commands_first_in_a_fresh_venv():
    """CI's first stage is README's route: README's commands as README writes them (read from README.md by
    .ci/readme.py, so changing README changes CI), in a venv made from nothing, before anything else is installed."""
    cmds = _ci_readme().commands()
    assert cmds["install"] == 'pip install -e ".[dev]" && python -m toolkit matrix --out matrix-out'
    assert cmds["test"] == "python -m pytest"
    assert cmds == _ci_readme().commands((ROOT / "README.md").read_text())
    ci = (ROOT / ".ci" / "run").read_text()
    body = [line.strip() for line in ci.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert body.index("install_cmd=$(python3 .ci/readme.py install)") < body.index('eval "$install_cmd"')
    first_venv = body.index("python3 -m venv .ci-venv-readme")
    # A reused checkout is made new first: no kernels compiled, no matrix cells or findings cached by an earlier run.
    assert body[first_venv - 1] == 'rm -rf .ci-venv-readme .inductor-cache-readme matrix-out "$TOOLKIT_FINDINGS"'
    # Nothing installs into the fresh venv between its creation and README's commands.
    activate = ["source .ci-venv-readme/bin/activate", 'export TORCHINDUCTOR_CACHE_DIR="$PWD/.inductor-cache-readme"']
    # With this machine's pip cap lifted (pip reads no config file), README's install gets what the index serves a
    # newcomer; torch is never pinned there.
    lifted = "export PIP_CONFIG_FILE=/dev/null"
    assert body[first_venv + 1 : first_venv + 7] == ["(", *activate, lifted, 'eval "$install_cmd"', ")"]
    test = body.index('eval "$test_cmd"')
    show = (
        "python -c \"import torch, sys; print('stage 1: python', sys.version.split()[0], 'torch', torch.__version__)\""
    )
    assert body[test - 4 : test] == ["(", *activate, show]
    # Between the two, only the older releases' venvs are started in the background: README's venv is not touched.
    assert not any(".ci-venv-readme" in line for line in body[first_venv + 7 : test - 4])
    assert not any("torch==" in line for line in body[first_venv : first_venv + 7])
    # What runs before stage 1 (the older releases' venvs, built from disk while stage 1 downloads) installs into its
    # own venvs with a pip cache of its own, in the background: nothing of stage 1's is shared or warmed.
    before = body[:first_venv]
    pips = [line for line in before if "pip install" in line]
    assert all(".ci-venv-2.1" in line for line in pips), pips
    start, end = before.index("install_old() {"), before.index("(set -e; install_old) >.ci-install-old.log 2>&1 &")
    assert before[start + 1] == 'export PIP_CACHE_DIR="$PWD/.ci-pip-cache-old"'
    assert all(start < before.index(line) < end for line in pips)
    assert "--system-site-packages" not in ci


def test_readme_says_what_the_install_pulls_and_how_long_the_tests_take():
    readme = (ROOT / "README.md").read_text()
    top = readme[: readme.index("## What the main job writes")]
    assert "CUDA build" in top and "GB" in top and "pip install torch==2.13.0 --index-url" in top
    # How long the tests take, said beside the test command itself.
    test_command = top.index("python -m pytest\n")
    assert re.search(r"tests[^\n]*about \d+ minutes on 2\s+cores", top[:test_command]), top[:test_command][-300:]
    assert "python -m pytest -m quick" in top


def test_torch_floor_is_a_release_ci_runs():
    """pyproject accepts what users have, down to the oldest release CI runs: a floor no test ran is a promise."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floor = next(d.split(">=")[1].split()[0] for d in project["dependencies"] if d.startswith("torch>="))
    ci = (ROOT / ".ci" / "run").read_text()
    checked = ast.literal_eval(
        re.search(r"^CHECKED_ON = (\(.*\))$", (ROOT / "toolkit" / "compat" / "features.py").read_text(), re.M)[1]
    )
    oldest, *pinned, _newest = sorted(checked, key=lambda r: tuple(map(int, r.split("."))))
    assert oldest.startswith(floor + ".") or oldest == floor, (floor, oldest)
    # CI pins every checked release but the newest, which README's install gets from the index, unpinned.
    for release in [oldest, *pinned]:
        assert re.search(rf"for v in [^\n]*\b{re.escape(release)}\b", ci), release


def test_wheel_carries_the_catalogue_and_the_standalone_repros(tmp_path):
    import subprocess
    import sys
    import zipfile

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(ROOT),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    wheel = next(tmp_path.glob("toolkit-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {
        "toolkit/analysis/catalogue.json",
        "toolkit/bugs/standalone/c25_policy_reuse_across_compiled_blocks.py",
        "toolkit/bugs/standalone/CONTRACT.md",
        "toolkit/bugs/__init__.py",
        "toolkit/bugs/repro.py",
        "toolkit/instrument/probes/census.py",
        "toolkit/execution/worker.py",
        "toolkit/estimation/estimates.py",
        "toolkit/compat/features.py",
        "toolkit/compat/patches.py",
    } <= names


def test_the_version_reads_without_importing_the_package(tmp_path):
    """pyproject's `version = {attr = "toolkit.__version__"}` is read by setuptools in pip's isolated build env, which
    has no torch: it must be a literal in `toolkit/__init__.py` that setuptools reads statically. Checked by setuptools
    itself on a copy of that one file, in a process where importing torch fails: when the static read fails, setuptools
    imports the package instead, and that fails here as it did on the fresh-clone CI (364fb27)."""
    import shutil
    import subprocess
    import sys

    (tmp_path / "toolkit").mkdir()
    shutil.copy(ROOT / "toolkit" / "__init__.py", tmp_path / "toolkit" / "__init__.py")
    attr = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from setuptools.config.expand import read_attr\n"
        f"print(read_attr({attr!r}, root_dir={str(tmp_path)!r}))"
    )
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    import toolkit

    assert out.stdout.strip() == toolkit.__version__


def _ci_verdicts():
    import importlib.util

    spec = importlib.util.spec_from_file_location("ci_verdicts", ROOT / ".ci" / "verdicts.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_ci_says_in_one_line_when_the_index_serves_a_release_the_catalogue_does_not_know(tmp_path, monkeypatch, capsys):
    """.ci/verdicts.py after a stage's bug notebooks and repro checks: a new release is one line and passes;
    on a known release a verdict that changed is named and fails the stage."""
    import json

    findings = tmp_path / "findings.jsonl"
    monkeypatch.setenv("TOOLKIT_FINDINGS", str(findings))
    lines = [
        {"case": "C14", "torch": "2.99.0+cu140", "reproduced": False, "observed": {}, "catalogued": "unknown"},
        {"case": "C2", "torch": "2.99.0+cu140", "reproduced": True, "observed": {}, "catalogued": "unknown"},
    ]
    findings.write_text("".join(json.dumps(f) + "\n" for f in lines))
    verdicts = _ci_verdicts()
    assert verdicts.main("stage 1", "2.99.0+cu140") == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("stage 1: torch 2.99.0+cu140 is a release the catalogue has no verdicts")
    assert "1 not reproduced (C14), 1 reproduced" in out[0] and "2.13.0, 2.14.1, 2.15.0" in out[0]
    # C26 is fixed on 2.14.1: reproducing it there again is a changed verdict.
    findings.write_text(json.dumps({**lines[1], "case": "C26", "torch": "2.14.1+cu130"}) + "\n")
    assert verdicts.main("torch 2.14.1", "2.14.1+cu130") == 1
    assert "C26 fixed -> reproduced" in capsys.readouterr().out
    findings.write_text("")
    assert verdicts.main("torch 2.14.1", "2.14.1+cu130") == 0
    assert "agrees with the catalogue" in capsys.readouterr().out
