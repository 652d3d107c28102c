"""The truth corpus: each standalone repro is, by its contract, a torch-only model a user could have written. Measured
as a user's model (`tk.measure`, no configuration from the toolkit), it must name its own case, and no unrelated
case, on every release where the catalogue says it reproduces.

The truth here is not the instrument: which case a script reproduces is its own `CASE` / `CASES`, and whether it
reproduces on this release is its `bug()`'s verdict, checked by `cases --check` and recorded in the catalogue.
"""

import ast
import contextlib
import importlib

import pytest
import torch
from _helpers import extra, gloo_world_of_one
from test_bugs import STANDALONE

import toolkit as tk
from toolkit import bugs
from toolkit.analysis import catalogue, signatures
from toolkit.analysis.classification import classify


def _user_models_of(path) -> set[str]:
    """The case ids a script's `user_models()` returns (the keys of its dict literals), read from its source."""
    import re

    fns = [n for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef) and n.name == "user_models"]
    return {
        k.value
        for fn in fns
        for node in ast.walk(fn)
        if isinstance(node, ast.Dict)
        for k in node.keys
        if isinstance(k, ast.Constant) and re.fullmatch(r"C\d+", str(k.value))
    }


def _with_user_models() -> list[str]:
    """The repro scripts that define `user_models()`, read from their source (nothing imported at collection)."""
    return sorted(p.stem for p in STANDALONE.glob("c[0-9][0-9]_*.py") if _user_models_of(p))


def _case_of(name: str) -> str:
    """`c07_sac_around…` → "C7", the case its file is named for."""
    return f"C{int(name[1:3])}"


@contextlib.contextmanager
def _config(settings: dict):
    """torch's config patched as a script's `config` says: dotted names, `torch._functorch.config.NAME` → value."""
    with contextlib.ExitStack() as stack:
        for dotted, value in settings.items():
            module, name = dotted.rsplit(".", 1)
            stack.enter_context(importlib.import_module(module).patch(**{name: value}))
        yield


def _own_cases(module) -> set[str]:
    return {module.CASE, *getattr(module, "CASES", {})}


def test_every_script_with_a_report_signature_is_in_the_corpus_or_says_why_not():
    """A case a step can show (its signature has report keys) has a `user_models()` in its script; the scripts that do
    not yet are named here, so that the list can only shrink."""
    have = set().union(*(_user_models_of(STANDALONE / f"{name}.py") for name in _with_user_models()))
    report_keys = signatures.REPORT_KEYS
    showable = {
        c.id
        for c in catalogue.cases()
        if bugs.has_script(c.id)
        and c.needs == "cpu"
        and c.signature
        and (set(c.signature) | {k for alt in c.signature.get("any_of", []) for k in alt}) & report_keys
    }
    missing = showable - have
    assert missing == NOT_YET, (
        f"new in the corpus: {sorted(NOT_YET - missing)}; new without: {sorted(missing - NOT_YET)}"
    )


NOT_YET = {
    # A step that configured them shows them (the matrix's cells); as a user's model: C9 needs a dispatch mode of the
    # user's own during backward; torch_remat's regions are not observed.
    "C9", "C45", "C46", "C64",
    # C4's signature names the toolkit's torchtitan_2025_09 recipe, which a user's own model measured as it came never
    # carries (C53 is the same failure as a user's model shows it).
    "C4",
}  # fmt: skip


@pytest.mark.parametrize("name", _with_user_models())
def test_a_repro_measured_as_a_users_model_names_its_own_case(name):
    try:
        module = bugs.script(_case_of(name))
    except ModuleNotFoundError as e:
        extra(e.name)  # a transformers script: skips with the install line where transformers is absent
        raise
    release = catalogue.torch_release()
    with contextlib.ExitStack() as stack:
        if getattr(module, "USER_MODELS_NEED", None) == "process_group":
            stack.enter_context(gloo_world_of_one())
        _measure_each(module, release)


def _measure_each(module, release: str) -> None:
    for case_id, spec in module.user_models().items():
        case = catalogue.get(case_id)
        if case.verified.get(release) != "reproduced":
            continue  # fixed, or not yet broken, on this release: nothing to name
        refs = {}
        if "reference" in spec:  # the same model without AC: what a user compares with to see AC save nothing
            torch._dynamo.reset()
            with _config({**spec.get("config", {}), **spec.get("reference_config", {})}):
                refs["none"] = tk.measure(spec["reference"], *spec["inputs"], forward_kwargs=spec.get("kwargs"))
        with _config(spec.get("config", {})):
            torch._dynamo.reset()
            report = tk.measure(
                spec["model"],
                *spec["inputs"],
                forward_kwargs=spec.get("kwargs"),
                cold=True,
                checkpointed=spec.get("meant_checkpointed", ()),
            )
        found = classify(report, refs).cases
        allowed = _own_cases(module) | set(spec.get("also", ()))
        assert case_id in found and set(found) <= allowed, (case_id, found, str(report)[:2000])
