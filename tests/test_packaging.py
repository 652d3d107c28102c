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


def test_readme_opens_with_the_two_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```(?:bash|sh)\n(.*?)```", readme, flags=re.S)
    assert len(blocks) >= 2
    main_job, tests = blocks[0].strip(), blocks[1].strip()
    assert "pip install" in main_job and "python -m toolkit" in main_job
    ci = (ROOT / ".ci" / "run").read_text()
    assert tests.splitlines()[-1] in ci, f"CI must call README's test command {tests!r}"


def test_torch_floor_matches_what_users_have():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "torch>=2.9" in project["dependencies"]


def test_wheel_carries_the_catalogue_and_the_standalone_repros(tmp_path):
    import subprocess
    import sys
    import zipfile

    out = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
                          "-q", "-w", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    wheel = next(tmp_path.glob("toolkit-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"toolkit/analysis/catalogue.json", "toolkit/bugs/standalone/c25_policy_reuse_across_compiled_blocks.py",
            "toolkit/bugs/standalone/CONTRACT.md", "toolkit/bugs/__init__.py", "toolkit/bugs/repro.py",
            "toolkit/measure/probes/census.py", "toolkit/compat.py"} <= names
