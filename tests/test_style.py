"""The tree is formatted and linted with the project's ruff settings (pyproject.toml: line length 120)."""

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _ruff(*args):
    exe = shutil.which("ruff", path=str(pathlib.Path(sys.executable).parent)) or shutil.which("ruff")
    if exe is None:
        pytest.fail('ruff is not installed: pip install -e ".[dev]" brings it')
    return subprocess.run([exe, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_tree_is_formatted():
    out = _ruff("format", "--check", ".")
    assert out.returncode == 0, f"run `ruff format .`:\n{out.stdout[-3000:]}{out.stderr[-1000:]}"


def test_the_tree_passes_the_linter():
    out = _ruff("check", ".")
    assert out.returncode == 0, f"run `ruff check --fix .`:\n{out.stdout[-3000:]}{out.stderr[-1000:]}"
