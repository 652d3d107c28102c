"""Figure builders (checked on fig.data) and their plain-text twins; setup_notebook."""

import pytest
import torch

import toolkit as tk
from toolkit.instrument.records import fmt_bytes
from toolkit.notebook import display

QUICK = dict(check_numerics=False, steady_steps=0)


@pytest.fixture(scope="module")
def reports():
    none = tk.run(tk.Scenario(**QUICK))
    sac = tk.run(tk.Scenario(ac=tk.ACConfig.of(mode="selective_op"), **QUICK))
    brk = tk.run(
        tk.Scenario(
            model=tk.ModelConfig(experts_impl="for_loop"),
            compile=tk.CompileConfig(scope="moe"),
            measure_memory=False,
            **QUICK,
        )
    )
    return none, sac, brk


def test_saved_figure_stacks_kinds_per_module(reports):
    _, sac, _ = reports
    fig = display.saved_figure(sac, by="module", top=50)
    assert {t.name for t in fig.data} == set(sac.saved.by_kind)
    totals = {}
    for trace in fig.data:
        for x, y in zip(trace.x, trace.y):
            totals[x] = totals.get(x, 0) + y * 2**10
    for module, b in sac.saved.by_module.items():
        assert totals[module or "<model>"] == pytest.approx(b)
    assert fig.layout.barmode == "stack"
    by_op = display.saved_figure(sac, by="op")
    assert "aten.mm.default" in set(by_op.data[0].x) | {x for t in by_op.data for x in t.x}
    with pytest.raises(ValueError, match="by="):
        display.saved_figure(sac, by="shape")


def test_text_twins_are_deterministic(reports):
    none, sac, brk = reports
    text = display.saved_text(sac)
    assert text == display.saved_text(tk.Report.from_json(sac.to_json()))
    # SAC recomputes the grouped GEMMs (C15): the routed experts keep nothing; the shared experts' matmuls stay.
    assert "layers.0.moe.shared_experts.w1" in text and "routed_experts" not in text and "sac_cache" in text
    mem = display.memory_text({"no AC": none, "SAC": sac})
    assert mem.splitlines()[0].split() == ["run", "saved", "held", "peak", "recomputed"]
    assert "no AC" in mem and "SAC" in mem
    diff = display.compare_text(none, sac, ("no AC", "SAC"))
    assert "layers.0.moe.routed_experts" in diff and "-" in diff  # kept without AC, not under SAC
    bt = display.breaks_text(brk)
    assert "moe.py:" in bt and "Data dependent operator" in bt and "recompile" in bt
    assert display.breaks_text(none) == "compile not requested"
    assert "<table>" in display.breaks_html(brk)


def test_breaks_html_has_no_empty_table(reports):
    """No break and no recompile: the head line alone, never a where / reason header over nothing."""
    none, sac, _ = reports
    fake = tk.Report.from_dict(
        {**sac.to_dict(), "compile": {**sac.to_dict()["compile"], "requested": True, "graphs": 1}}
    )
    html = display.breaks_html(fake)
    assert html == "<b>1 graphs, 0 graph breaks, 0 recompiles</b>" and "<th>" not in html


def test_compare_figure_shows_both_runs_and_highlights_the_differences(reports):
    none, sac, _ = reports
    fig = display.compare_figure(none, sac, ("no AC", "SAC"))
    by_module = [t for t in fig.data if t.xaxis == "x"]
    memory = [t for t in fig.data if t.xaxis == "x2"]
    assert [t.name for t in by_module] == ["no AC", "SAC"] and [t.name for t in memory] == ["no AC", "SAC"]
    assert list(memory[0].x) == ["saved", "held after forward", "peak"]
    assert memory[1].y[0] == sac.saved.total_bytes / 2**20
    # The modules shown are exactly the text twin's rows, in its order, each with its difference written over it.
    rows = [line.split()[0] for line in display.compare_text(none, sac, ("no AC", "SAC")).splitlines()[5:]]
    assert list(by_module[0].x) == rows and rows
    notes = {a.x: a for a in fig.layout.annotations if a.xref == "x"}
    for m in rows:
        delta = sac.saved.by_module.get(m, 0) - none.saved.by_module.get(m, 0)
        assert notes[m].text == ("+" if delta > 0 else "−") + fmt_bytes(abs(delta))
        assert notes[m].font.color == display.COMPARE_COLORS["more" if delta > 0 else "less"]
    same = display.compare_figure(none, none)
    assert not [t for t in same.data if t.xaxis == "x"][0].x
    assert any(a.text == "no module saves a different amount" for a in same.layout.annotations)


def test_memory_and_recompute_figures(reports):
    none, sac, _ = reports
    fig = display.memory_figure({"no AC": none, "SAC": sac})
    assert [t.name for t in fig.data] == ["saved for backward", "held after forward", "peak"]
    assert list(fig.data[2].x) == ["no AC", "SAC"] and fig.data[2].y[0] == none.memory.peak_bytes / 2**20
    rfig = display.recompute_figure(sac)
    assert sum(rfig.data[0].y) <= sac.recompute.ops and rfig.data[0].y[0] == max(sac.recompute.by_op.values())


def test_setup_notebook_is_idempotent():
    assert tk.setup_notebook(seed=3, autoreload=False) is None
    x = torch.rand(1)
    tk.setup_notebook(seed=3, autoreload=False)
    assert torch.equal(torch.rand(1), x)


def test_recompute_text_says_where_each_run_recomputes(reports):
    """One line per run, the kinds any run saves as columns, and eager / in-graph / rerun recompute apart."""
    none, sac, brk = reports
    text = display.recompute_text({"no AC": none, "SAC": sac, "compiled": brk})
    head, *rows = text.splitlines()
    assert head.split() == [
        "run",
        "saved",
        "autograd",
        "compiled",
        "sac_cache",
        "checkpoint_input",
        "eager",
        "ops",
        "in",
        "graph",
        "bwd",
        "graph",
        "reruns",
        "grads",
    ]
    assert [r.split()[0] for r in rows] == ["no", "SAC", "compiled"]

    def column(row, name):  # right-aligned under its header
        end = head.index(name) + len(name)
        return row[end - 18 : end].strip()

    assert (
        column(rows[1], "sac_cache") == fmt_bytes(sac.saved.by_kind["sac_cache"]) and column(rows[1], "compiled") == "-"
    )
    assert column(rows[2], "compiled") == fmt_bytes(brk.saved.by_kind["compiled"])
    # Eager ops, ops in compiled backward, compiled reruns, grads ("-": numerics not compared here).
    assert rows[1].split()[-4:] == [str(sac.recompute.ops), "0", "0", "-"] and sac.recompute.ops > 0
    assert rows[2].split()[-4:] == [str(brk.recompute.ops), str(brk.recompute.in_compiled_backward), "0", "-"]
    assert text == display.recompute_text({"no AC": tk.Report.from_json(none.to_json()), "SAC": sac, "compiled": brk})
    only_autograd = display.recompute_text({"no AC": none})
    assert (
        only_autograd.splitlines()[0].split()[:3] == ["run", "saved", "autograd"] and "sac_cache" not in only_autograd
    )
