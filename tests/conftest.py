"""Shared test setup: one Inductor cache for the run, and a clean Dynamo state around every test."""

import os
import pathlib

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(pathlib.Path(__file__).resolve().parents[1] / ".inductor-cache"))

import pytest  # noqa: E402
import torch  # noqa: E402

import toolkit as tk  # noqa: E402


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pyproject's addopts): one worker per core this process may use, at most 8 — each worker imports
    torch and runs its own notebook kernels, and past 8 the longest files set the time anyway."""
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


# `python -m pytest -m quick` (README's first check, under 5 minutes on 2 cores): the model, AC, compile and
# measurement core, the CLI, README's own claims and one bug notebook, whole files (the suite's layout).
QUICK = (
    "tests/test_models.py",
    "tests/test_ac.py",
    "tests/test_compile.py",
    "tests/test_measure.py",
    "tests/test_cli.py",
    "tests/test_readme.py",
    "tests/test_packaging.py",
    "tests/test_notebooks.py",
    "notebooks/bugs/C02_graph_break_in_checkpoint.ipynb",
)
_ROOT = pathlib.Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config, items):
    for item in items:
        try:
            rel = item.path.resolve().relative_to(_ROOT).as_posix()
        except ValueError:
            continue
        if rel in QUICK:
            item.add_marker(pytest.mark.quick)


@pytest.fixture(autouse=True)
def _clean_dynamo():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()
    counters.clear()


@pytest.fixture
def moe_cfg():
    return tk.ModelConfig()


@pytest.fixture
def dense_cfg():
    return tk.ModelConfig(
        n_layers=2, dim=32, n_heads=2, ffn_hidden=64, vocab_size=64, seq_len=16, batch=2, moe_layers="none"
    )
