"""The annotations are checked: mypy, with pyproject.toml's settings (its default level over `toolkit/`, strict on
the instrument, the configs and the records), reports nothing."""

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.per_release  # torch's own stubs change between releases: an ignore needed on one is unused on another
def test_mypy_finds_nothing(tmp_path):
    pytest.importorskip("mypy", reason='mypy is not installed: pip install -e ".[dev]" brings it')
    # Its cache in the test's own folder: a run never reads another torch's cache, nor writes into the checkout.
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0 and out.stdout.startswith("Success: no issues found"), out.stdout[-5000:] + out.stderr
