"""The install story stays true: pyproject and environment.yml agree, README's commands exist, CI runs them."""

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
    wanted = {r.strip() for r in project["dependencies"] + project["optional-dependencies"]["dev"]}
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
    assert body[first_venv + 1 : first_venv + 6] == ["(", *activate, 'eval "$install_cmd"', ")"]
    test = body.index('eval "$test_cmd"')
    show = (
        "python -c \"import torch, sys; print('stage 1: python', sys.version.split()[0], 'torch', torch.__version__)\""
    )
    assert body[test - 4 : test] == ["(", *activate, show]
    # Between the two, only stage 2's venv is started in the background: README's venv is not touched.
    assert not any(".ci-venv-readme" in line for line in body[first_venv + 6 : test - 4])
    assert not any("pip install" in line for line in body[:first_venv]), "nothing may be pip-installed before stage 1"
    assert "--system-site-packages" not in ci


def test_readme_says_what_the_install_pulls_and_how_long_the_tests_take():
    readme = (ROOT / "README.md").read_text()
    top = readme[: readme.index("## What it shows")]
    assert "CUDA build" in top and "GB" in top and "pip install torch==2.13.0 --index-url" in top
    assert re.search(r"about \d+ minutes on 2\s+cores", top) and "python -m pytest -m quick" in top


def test_torch_floor_matches_what_users_have():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "torch>=2.9" in project["dependencies"]


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
        "toolkit/measure/probes/census.py",
        "toolkit/compat.py",
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
