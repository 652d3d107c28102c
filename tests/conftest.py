"""Shared test setup: one Inductor cache for the run, and a clean Dynamo state around every test."""

import os
import pathlib

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(pathlib.Path(__file__).resolve().parents[1] / ".inductor-cache"))

import pytest  # noqa: E402
import torch  # noqa: E402

import toolkit as tk  # noqa: E402


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
    return tk.ModelConfig(n_layers=2, dim=32, n_heads=2, ffn_hidden=64, vocab_size=64, seq_len=16, batch=2,
                          moe_layers="none")
