"""`toolkit.compat`: every private torch API in one place, detected on this torch, and nowhere else.

`toolkit.compat`: every private torch API in one place, detected on this torch, and nothing else reaching into torch
internals.
"""

import ast
import inspect
import json
import pathlib
import subprocess
import sys

import pytest
import torch

import toolkit as tk
from toolkit import compat
from toolkit.instrument.probes.checkpoint_hooks import CheckpointCall

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Which private APIs this torch has is the release's own fact.
pytestmark = pytest.mark.per_release


def test_every_feature_is_available_on_the_releases_it_was_checked_on():
    release = torch.__version__.split("+")[0]
    # Whatever a torch lacks must be named, on any release (README's install takes the newest, checked or not): a
    # blind-spot sentence for the Report, never a silent zero.
    for f in compat.FEATURES.values():
        assert f.without and f.api, f.name
    if release not in compat.CHECKED_ON:
        assert f"checked on {', '.join(compat.CHECKED_ON)}" in compat.table()
        return
    # Build- and package-dependent, not release-dependent: the CUDA build's storage placeholder (+cpu wheels lack
    # it, C31) and the optional torch_remat package.
    optional = ("cuda_snapshot", "storage_placeholder", "torch_remat", "checkpoint_policy_dict")
    # checkpoint(policy=dict) (pytorch#186277) is in no release the toolkit was checked on, 2.15.0 included.
    assert not compat.FEATURES["checkpoint_policy_dict"].available
    missing = [f.name for f in compat.FEATURES.values() if not f.available and f.name not in optional]
    assert missing == [] or (missing == ["respect_saved_tensors_hooks"] and release == "2.13.0"), missing
    assert "respect_saved_tensors_hooks" in compat.FEATURES
    assert compat.FEATURES["respect_saved_tensors_hooks"].available == (release != "2.13.0")
    assert compat.FEATURES["storage_placeholder"].available == ("+cpu" not in torch.__version__)


def test_the_feature_table_names_what_each_api_lets_the_toolkit_see():
    text = compat.table()
    assert text.startswith(f"torch {torch.__version__}; checked on 2.13.0, 2.14.1, 2.15.0")
    for f in compat.FEATURES.values():
        assert f.name in text and f.sees and f.api
    sentence = compat.blind_spot("sac_mode")
    assert sentence.startswith("tensors cached by selective checkpointing are counted as kind 'other'")


_PRIVATE_ATTRS = ("_cdata",)
"""Private attributes of torch objects (not reached through `torch.`): a storage's `_cdata` is `compat.storage_key`."""


def test_no_module_but_compat_reaches_into_private_torch():
    """The toolkit's own code (not the torch-only standalone repros) touches `torch._*`, private checkpoint or AOT
    internals only through `toolkit.compat`."""
    offenders = []
    for path in (ROOT / "toolkit").rglob("*.py"):
        if "compat" in path.relative_to(ROOT).parts or "standalone" in path.parts:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            name = None
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "patched" and len(node.args) > 1:
                what = node.args[1]  # a patch's attribute name comes from a compat accessor, never a private literal
                if isinstance(what, ast.Constant) and str(what.value).startswith("_") and what.value != "__init__":
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} patched(..., {what.value!r})")
            if isinstance(node, ast.Attribute) and node.attr in _PRIVATE_ATTRS:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
            if isinstance(node, ast.Attribute):
                name = node.attr
                base = node.value
                chain = [name]
                while isinstance(base, ast.Attribute):
                    chain.append(base.attr)
                    base = base.value
                if (
                    isinstance(base, ast.Name)
                    and base.id == "torch"
                    and any(p.startswith("_") and p not in ("__version__", "_grouped_mm") for p in chain)
                ):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} torch.{'.'.join(reversed(chain))}")
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                mod = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                if mod and mod.startswith("torch") and any(p.startswith("_") for p in mod.split(".")):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} import {mod}")
    assert offenders == [], "\n".join(offenders)


def _fake_2_13(
    fn,
    preserve_rng_state=True,
    context_fn=None,
    determinism_check="default",
    debug=False,
    early_stop=True,
    *args,
    **kwargs,
):
    yield


def _fake_2_14(
    fn,
    args,
    kwargs,
    *,
    preserve_rng_state=True,
    context_fn=None,
    determinism_check="default",
    debug=False,
    early_stop=True,
    respect_saved_tensors_hooks=None,
):
    yield


@pytest.mark.parametrize("form", [_fake_2_13, _fake_2_14])
def test_checkpoint_calls_bind_by_name_in_both_forms(form):
    """The probes never copy a private positional signature: 2.13 calls `(fn, options..., *args, **kwargs)`, 2.14
    `(fn, args, kwargs, *, options...)`; both bind to the same fn / inputs / options."""
    sig = inspect.signature(form)
    x, y = torch.ones(1), torch.zeros(1)
    if form is _fake_2_13:
        call = CheckpointCall(sig, (len, True, None, "default", False, True, x), {"y": y})
    else:
        call = CheckpointCall(sig, (len, (x,), {"y": y}), {"preserve_rng_state": True})
    assert call.fn is len and call.inputs[0][0] is x and call.inputs[1]["y"] is y
    call.fn = abs
    seen = {}

    def original(*args, **kwargs):
        seen["bound"] = sig.bind(*args, **kwargs).arguments
        yield

    list(call.call(original))
    assert seen["bound"]["fn"] is abs and seen["bound"]["args"][0] is x
    assert call.has_option("respect_saved_tensors_hooks") == (form is _fake_2_14)


def test_a_reference_run_turns_function_form_checkpoints_into_plain_calls():
    from torch.utils.checkpoint import checkpoint

    lin = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)

    def weight_saved(disable: bool) -> bool:
        packed = []
        with (
            compat.non_reentrant_checkpoints_disabled() if disable else torch.enable_grad(),
            torch.autograd.graph.saved_tensors_hooks(
                lambda t: packed.append(t.untyped_storage()._cdata) or t, lambda t: t
            ),
        ):
            checkpoint(lin, x, use_reentrant=False).sum().backward()
        return lin.weight.untyped_storage()._cdata in packed

    # A real checkpoint keeps what it saves inside its own hooks; disabled, autograd saves the weight as usual.
    assert not weight_saved(False) and weight_saved(True)


def test_environment_records_cpu_cores_and_threads():
    env = tk.measure(torch.nn.Linear(2, 2), torch.randn(1, 2)).environment
    assert env["threads"] == torch.get_num_threads() and env["cores"] >= 1 and env["cpu"]


def test_no_patch_outlives_the_with_that_made_it():
    """After measuring (`tk.run`, `tk.measure`, `tk.estimate`), stepping a remat model on this build and applying
    and removing every transform, what the toolkit patches inside its `with`s is torch's (and torch_remat's) own
    again: the LRU setter, checkpoint's hook classes and generator, AOTAutograd's partition and saved state,
    inductor's code cache, torch_remat's placeholder and replay functions. In a fresh Python: the suite itself
    watches the LRU setter for its whole session (tests/conftest.py)."""
    script = r"""
import importlib, json, torch, toolkit as tk
import torch.utils.checkpoint as ckpt
from torch._functorch._aot_autograd import graph_compile, runtime_wrappers
from torch._inductor import async_compile, codecache

def owners():
    out = {
        "lru": torch._C._dynamo.eval_frame._set_lru_cache,
        "checkpoint_hook": ckpt._checkpoint_hook,
        "recomputation_hook": ckpt._recomputation_hook,
        "recomputation_init": ckpt._recomputation_hook.__init__,
        "generator": getattr(ckpt, "_checkpoint_without_reentrant_generator_impl", None)
        or ckpt._checkpoint_without_reentrant_generator,
        "partition": graph_compile._partition_joint_graph_into_fw_bw,
        "save_from_forward": runtime_wrappers._AutogradSavedState.save_from_forward,
        "cpp": async_compile.AsyncCompile.cpp,
        "load_by_key_path": codecache.PyCodeCache.__dict__["load_by_key_path"],
        "rng": torch.get_rng_state,
    }
    if tk.compat.available("torch_remat"):
        api, view = importlib.import_module("torch_remat._api"), importlib.import_module("torch_remat._view")
        out.update(make=api._make_placeholder_tensor, api_is=api._is_placeholder, view_is=view._is_placeholder,
                   replay=api._replay_save_op)
    return out

before = owners()
tk.run(tk.Scenario(ac=tk.ACConfig.of(mode="selective_op"), compile=tk.CompileConfig(scope="blocks", fullgraph=True)))
tk.run(tk.Scenario(ac=tk.ACConfig.of(mode="remat")))
lin = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
tk.measure(lin, torch.randn(4, 8))
small = tk.ModelConfig(n_layers=1)
tk.estimate(tk.Scenario(model=small, ac=tk.ACConfig.of(mode="full"),
    compile=tk.CompileConfig(scope="blocks", backend="inductor")))
model = tk.build_model(tk.ModelConfig(n_layers=2))
tk.transforms.prepare(model, ac=tk.ACConfig.of(mode="remat"))
tk.train_step(model, tk.make_batch(model.config))
tk.transforms.reset(model)
after = owners()
print(json.dumps(sorted(k for k in before if before[k] is not after[k])))
"""
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout.strip().splitlines()[-1]) == []
