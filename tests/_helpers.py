"""Small helpers the tests share (kept out of conftest.py: notebooks/ has a conftest module of its own)."""

import contextlib
import os
import shutil

import pytest

import toolkit as tk


def grads(model):
    return {
        tk.transforms.canonical_name(n): p.grad.detach().clone()
        for n, p in model.named_parameters()
        if p.grad is not None
    }


def graph_count():
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def break_count():
    from torch._dynamo.utils import counters

    return int(sum(counters["graph_break"].values()))


def synthetic_matrix():
    """A MatrixResult with one cell of every classification, built from hand-made Reports (nothing runs): for the
    heatmap, the page and its browser test. Returns `(result, {classification: cell})`."""
    from toolkit.analysis.cells import Cell
    from toolkit.analysis.matrix import MatrixResult, Row
    from toolkit.measurement.report import (
        CompileInfo,
        ErrorInfo,
        GraphBreak,
        Memory,
        Numerics,
        Report,
        Saved,
        ScenarioRecord,
    )

    def report(cell, *, outcome="ok", saved=100_000, compiled=None, grads_match=True, error=None, **compile_info):
        record = ScenarioRecord(
            name=cell.label,
            recipe=cell.recipe,
            ac_mode="recipe" if cell.recipe else cell.ac,
            compile_scope=cell.scope,
            backend=cell.backend,
        )
        requested = compiled if compiled is not None else (cell.scope != "none" or bool(cell.recipe))
        return Report(
            outcome=outcome,
            scenario=record,
            error=error,
            saved=Saved(total_bytes=saved),
            compile=CompileInfo(
                requested=requested, graphs=compile_info.pop("graphs", 1 if requested else 0), **compile_info
            ),
            memory=Memory(peak_bytes=4 * saved, held_after_forward_bytes=saved, method="synthetic"),
            numerics=Numerics(
                loss=5.0,
                reference_loss=5.0,
                loss_diff=0.0,
                max_grad_diff=0.0 if grads_match else 0.1,
                worst_param="layers.0.moe.router.gate.weight",
                grads_match=grads_match,
                reference="eager without AC",
            ),
        )

    brk = GraphBreak(reason="Data dependent operator", file="toolkit/models/moe.py", line=96)
    cells = {
        "works": Cell("moe:for_loop", "none", "blocks", True),
        "grads_differ": Cell("moe:for_loop", "full"),
        "crashed": Cell("moe:for_loop", "full", "attention", True),
        "timeout": Cell("moe:for_loop", "selective_op", "attention"),
        "error": Cell("moe:for_loop", recipe="torchtitan_2025_09"),
        "fell_back_to_eager": Cell("moe:for_loop", "full", "blocks"),
        "sac_not_applied": Cell("moe:for_loop", "selective_op", "blocks", True),
        "ac_saves_nothing": Cell("dense", "full"),
        "recompiles": Cell("moe:for_loop", "none", "blocks"),
        "graph_breaks": Cell("moe:for_loop", "none", "attention"),
    }
    extra = {
        "dense_none": Cell("dense"),
        "moe_none": Cell("moe:for_loop"),
        "full_ref": Cell("moe:for_loop", "full", "blocks", True),
        "recipe_ok": Cell("moe:for_loop", recipe="torchtitan_0_3_0"),
    }
    reports = {
        "works": report(cells["works"], saved=200_000),
        "grads_differ": report(cells["grads_differ"], saved=50_000, grads_match=False),
        "crashed": report(
            cells["crashed"], outcome="crashed", error=ErrorInfo("crashed", "worker died: SIGABRT", "forward")
        ),
        "timeout": report(
            cells["timeout"], outcome="timeout", error=ErrorInfo("timeout", "no result within 15 s", "forward")
        ),
        "error": report(
            cells["error"],
            outcome="error",
            error=ErrorInfo(
                "torch._dynamo.exc.Unsupported", "Skip calling `torch.compiler.disable()`d function", "forward"
            ),
        ),
        "fell_back_to_eager": report(
            cells["fell_back_to_eager"],
            graphs=0,
            graph_breaks=1,
            breaks=(brk,),
            fell_back_to_eager=True,
            regions_without_graphs=("layers.0", "layers.1"),
            eager_checkpoints=("layers.0", "layers.1"),  # the checkpoints inside them ran eagerly: C2's observation
            orders={"layers.0": "compile(AC(x))", "layers.1": "compile(AC(x))"},
        ),
        "sac_not_applied": report(cells["sac_not_applied"], saved=60_000),
        "ac_saves_nothing": report(cells["ac_saves_nothing"], saved=120_000),
        "recompiles": report(
            cells["recompiles"],
            graphs=4,
            graph_breaks=1,
            breaks=(brk,),
            recompiles=("tensor 'L['x']' size mismatch at index 0",),
        ),
        "graph_breaks": report(cells["graph_breaks"], graphs=2, graph_breaks=1, breaks=(brk,)),
        "dense_none": report(extra["dense_none"], saved=120_000),
        "moe_none": report(extra["moe_none"], saved=200_000),
        "full_ref": report(extra["full_ref"], saved=60_000),
        "recipe_ok": report(extra["recipe_ok"], saved=90_000),
    }
    every = {**cells, **extra}
    rows = [Row(key=name, cell=every[name], report=reports[name]) for name in every]
    result = MatrixResult(rows, environment={"torch": "2.13.0", "device": "cpu"})
    return result, cells


# Debian's Chromium, driven by Playwright (no Playwright browser download).
CHROMIUM = [
    os.environ.get("TOOLKIT_CHROMIUM", ""),
    "/usr/bin/chromium",
    "/usr/lib/chromium/chromium",
    shutil.which("chromium") or "",
    shutil.which("chromium-browser") or "",
]


def extra(module: str):
    """The optional package `module`, or a skip that says which `pip install` turns the test on."""
    from toolkit.stacks import reason

    return pytest.importorskip(module, reason=reason(module))


def need(what: str):
    """Skip where a browser-test dependency is missing; in CI (which installs them) fail instead."""
    if os.environ.get("CI"):
        pytest.fail(f"{what} is missing in CI; .ci/run installs it")
    how = (
        "apt-get install chromium (Debian's, which Playwright drives; README: the browser test is optional)"
        if what == "chromium"
        else 'pip install -e ".[dev]"'
    )
    pytest.skip(f"{what} is not installed: {how} turns the browser test on")


def playwright_and_chromium():
    """`(sync_playwright, chromium_path)`, or skip (fail in CI) naming what is missing."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        need("playwright")
    chromium = next((c for c in CHROMIUM if c and os.path.exists(c)), None)
    if chromium is None:
        need("chromium")
    return sync_playwright, chromium


def state_diff(before: dict, after: dict) -> dict:
    """What differs between two `tk.transforms.global_state()` snapshots, key by key (readable where `==` shows
    `...`)."""
    out = {}
    for section in sorted(set(before) | set(after)):
        a, b = before.get(section), after.get(section)
        if isinstance(a, dict) and isinstance(b, dict):
            keys = {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}
            if keys:
                out[section] = keys
        elif a != b:
            out[section] = (a, b)
    return out


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (the only address a test talks to)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def gloo_world_of_one():
    """A 1-rank gloo process group on 127.0.0.1 for the block, the test's own (FSDP2 needs one to shard)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def write_rank_rows(out: str, rows: list) -> None:
    """A torchrun rank's rows as `rank{R}.json` in `out` (what tests/distributed/*.py hand back to their test)."""
    import json
    import pathlib

    import torch.distributed as dist

    data = {"rank": dist.get_rank(), "world": dist.get_world_size(), "rows": rows}
    pathlib.Path(out, f"rank{dist.get_rank()}.json").write_text(json.dumps(data))
