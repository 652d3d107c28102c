"""Configs and their records: one base for every config, one versioned table of the rules that keep older records
readable and the cache keys as they were — checked against records an earlier toolkit wrote, not against itself."""

import dataclasses
import importlib
import json
import lzma
import pathlib
from unittest import mock

import pytest

import toolkit as tk
from toolkit import _migrations
from toolkit._config import PlainData
from toolkit.analysis.cells import cell_key
from toolkit.estimation.inputs import BareModel
from toolkit.measurement import Scenario
from toolkit.stacks import get as get_stack
from toolkit.stacks.torchtitan import TorchtitanConfig
from toolkit.stacks.transformers import TransformersConfig
from toolkit.stacks.user import UserModelConfig
from toolkit.transforms.ac import MODES, ACConfig

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = [tk.ModelConfig, tk.CompileConfig, Scenario, TorchtitanConfig, TransformersConfig, UserModelConfig, BareModel]
CONFIGS += [ACConfig, *MODES.values()]
HOOKS = {"_record", "_from_record", "_unset", "RECORD", "RECORD_EXAMPLE"}


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_every_config_has_the_one_base_and_no_copy_of_its_plain_data(cls):
    """replace / to_dict / from_dict are PlainData's; a config writes only its own fields' hooks. The two that stay
    say why: ACConfig.replace builds another mode's class, Scenario.from_dict names a nested config's example."""
    assert issubclass(cls, PlainData)
    own = {"replace", "to_dict", "from_dict"} & set(vars(cls))
    assert own == {"ACConfig": {"replace"}, "Scenario": {"from_dict"}}.get(cls.__name__, set())


_KINDS = {"Report": tk.Report, "Scenario": Scenario, "ModelConfig": tk.ModelConfig}
_KINDS |= {"CompileConfig": tk.CompileConfig, "ACConfig": ACConfig}


@pytest.mark.parametrize("rule", _migrations.MIGRATIONS, ids=lambda m: f"{m.record}-{m.version}")
def test_each_rule_of_the_table_names_real_fields_and_functions_beside_its_record(rule):
    cls = _KINDS[rule.record]
    fields = {f.name for c in ([cls] if cls is not ACConfig else MODES.values()) for f in dataclasses.fields(c)}
    assert set(rule.added + rule.unkeyed) <= fields, set(rule.added + rule.unkeyed) - fields
    home = importlib.import_module(cls.__module__).__name__.rsplit(".", 1)[0]
    for target in filter(None, (rule.upgrade, rule.shape)):
        module, name = target.split(":")
        assert module.startswith(home) and callable(getattr(importlib.import_module(module), name))
    assert rule.why and rule.version >= 2  # version 1 is each record as first written: no rule


def _committed_records():
    """The central list's records: Reports and cache keys written by earlier versions of the toolkit, on three torch
    releases (a record's key is what `cell_key` gave then)."""
    with lzma.open(ROOT / "docs/central-list/results.jsonl.xz", "rt") as f:
        return [json.loads(line) for line in f]


def test_records_an_earlier_toolkit_wrote_read_back_under_the_keys_it_gave_them():
    """Every committed cell's configuration, read with today's configs and written again, gives the key it was stored
    under (one cell of each kind of AC, compile, stack, recipe, FSDP and experts; records from three torch releases)."""
    records, kinds = _committed_records(), {}
    for rec in records:
        c = rec["report"]["scenario"]["config"]
        kind = (c.get("stack"), c.get("recipe"), c.get("fsdp"), c.get("model", {}).get("experts_impl"))
        kinds.setdefault(kind + tuple(json.dumps(c[k], sort_keys=True) for k in ("ac", "compile")), rec)
    seen, mismatched = set(), []
    for rec in kinds.values():
        env = rec["report"]["environment"]
        config = rec["report"]["scenario"]["config"]
        if not get_stack(config.get("stack", "toolkit")).available():
            continue  # a stack's config is read only where its package is (README's stage has no transformers)
        scenario = Scenario.from_dict(config)
        with mock.patch("torch.__version__", env["torch"]):
            if cell_key(scenario, "cuda" if env.get("cuda") else "cpu") != rec["key"]:
                mismatched.append(rec["report"]["scenario"]["name"])
        seen.add((scenario.stack, scenario.ac.mode, str(scenario.compile.scope)))
    assert mismatched == [] and len(records) > 7000 and len(kinds) > 300
    stacks = {s for s, _, _ in seen}
    assert "toolkit" in stacks and ("transformers" in stacks) == get_stack("transformers").available()
    assert {"none", "full", "selective_op", "memory_budget", "remat"} <= {m for _, m, _ in seen}


def test_a_field_added_later_is_absent_while_unset_and_read_as_its_default():
    full = ACConfig.of(mode="full").to_dict()
    assert "offload" not in full and full["save_regions"] is full["policy_save"] is None  # these two: only unkeyed
    assert full["layer_every"] is None and full["extra_save_ops"] == []  # every mode's option, as before the modes
    assert ACConfig.of(mode="remat").to_dict()["save_regions"] == []  # remat reads it: written even at its default
    assert _migrations.keyed("ACConfig", full).keys() == full.keys() - {
        "save_regions",
        "recompute_regions",
        "policy_save",
    }
    assert ACConfig.of(mode="full", offload=True).to_dict()["offload"] is True
    assert "n_kv_heads" not in tk.ModelConfig().to_dict() and tk.ModelConfig(n_kv_heads=2).to_dict()["n_kv_heads"] == 2
    assert {"stack", "fsdp", "ep", "instrument"}.isdisjoint(Scenario().to_dict())
    assert Scenario.from_dict({}) == Scenario() and tk.CompileConfig.from_dict({}) == tk.CompileConfig()


def test_a_schema_1_report_reads_as_schema_2():
    """Schema 1 held the Scenario's own dict as `scenario` (the table's Report 2 rule)."""
    report = tk.Report.from_dict(
        {
            "outcome": "ok",
            "saved": {},
            "environment": {},
            "scenario": {"name": "old", "ac": {"mode": "full"}, "compile": {"scope": "blocks"}, "model": {}},
        }
    )
    s = report.scenario
    assert (s.measured, s.ac_mode, s.compile_scope, s.backend, s.name) == (
        "scenario",
        "full",
        "blocks",
        "aot_eager",
        "old",
    )


def test_every_failing_cell_of_the_committed_records_names_a_case_on_each_release():
    """The central list's records predate what the cases are now matched by (packages, AOTAutograd, the activation
    budget, the checkpoints that ran eagerly: the table's Report 3 reads them off each record). Read with today's
    catalogue, every cell that does not work names its case on every release swept — 736 did not before the rule."""
    from toolkit.analysis import store
    from toolkit.analysis.matrix import RECORDS, by_release

    results = by_release(store.read_results(RECORDS)[0])
    assert set(results) == {"2.13.0", "2.14.1", "2.15.0"}
    for release, m in results.items():
        unnamed = [r.cell.label for r in m.rows if r.classification.label != "works" and not r.classification.cases]
        assert unnamed == [], (release, len(unnamed), unnamed[:5])
    named = {cid for r in results["2.15.0"].rows for cid in r.classification.cases}
    assert {"C2", "C18", "C58", "C60", "C62", "C65", "C66", "C67", "C68", "C70"} <= named


def test_a_schema_2_record_has_its_observations_read_off_its_configuration():
    old = {
        "outcome": "error",
        "saved": {},
        "environment": {},
        "schema_version": 2,
        "error": {"type": "RuntimeError", "message": "x", "stage": "backward"},
        "scenario": {
            "measured": "scenario",
            "backend": "eager",
            "config": {"stack": "transformers", "ac": {"mode": "memory_budget", "memory_budget": 0.5}},
        },
        "compile": {"requested": True, "graphs": 0, "fell_back_to_eager": False, "orders": {}},
    }
    r = tk.Report.from_dict(old)
    assert r.packages == ("transformers",) and r.compile.aot_autograd is False and r.compile.memory_budget == 0.5
    assert r.compile.eager_checkpoints == () and r.schema_version == 3
    new = tk.Report.from_dict({**old, "schema_version": 3, "compile": {**old["compile"], "aot_autograd": None}})
    assert new.packages == () and new.compile.aot_autograd is None  # a record of today's schema is read as written
