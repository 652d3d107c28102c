"""Shared test setup: one Inductor cache for the run, and a clean Dynamo state around every test."""

import ast
import functools
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
    "tests/test_gates.py",  # the property-based search of every gate
    "tests/test_central_list.py",
)
_ROOT = pathlib.Path(__file__).resolve().parents[1]

# Files of a minute or more on 2 cores (a `--durations` run on torch 2.14.1), heaviest first. `--dist loadfile`
# hands whole files to the workers in collection order, so these go first: the run ends on small files, with both
# workers busy to the end, instead of on one worker still running notebook 05's sweep while the other waits.
HEAVY_FIRST = (
    "tests/test_estimate.py",
    "tests/test_plan.py",
    "notebooks/07_full_size_estimates.ipynb",
    "notebooks/04_order_matters.ipynb",
    "notebooks/05_composability_matrix.ipynb",
    "tests/test_measure.py",
    "tests/test_matrix.py",
    "tests/test_fsdp.py",
    "tests/test_sweeps.py",
    "tests/test_bad_input.py",
    "tests/test_compile.py",
    "notebooks/bugs/C41_knapsack_solver_exceeds_cap.ipynb",
    "notebooks/bugs/C52_compiled_autograd_eager_checkpoint.ipynb",
    "tests/test_readme.py",
    "notebooks/02_full_vs_selective_ac.ipynb",
    "notebooks/06_memory_budget.ipynb",
)


def _relative(item) -> str | None:
    try:
        return item.path.resolve().relative_to(_ROOT).as_posix()
    except ValueError:
        return None


# The optional packages CI's README stage has not installed: `-m extras` runs what needs or branches on them, on
# the one release that installs them (.ci/run).
CI_EXTRAS = ("torchtitan", "transformers", "submitit", "ray", "tlparse", "litgpt")


def _reads_release(node) -> bool:
    """The code reads which torch release runs it: `torch.__version__`, `torch_release()`, `compat.CHECKED_ON`, or
    `tk.bugs.expected(...)` (the catalogue's verdict for this release)."""
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and n.attr in ("__version__", "CHECKED_ON"):
            if n.attr == "CHECKED_ON" or getattr(n.value, "id", None) == "torch":
                return True
        if isinstance(n, ast.Name) and n.id == "CHECKED_ON":
            return True
        if isinstance(n, ast.Call) and (getattr(n.func, "id", None) or getattr(n.func, "attr", None)) in (
            "torch_release",
            "expected",
        ):
            return True
    return False


@functools.lru_cache(maxsize=None)
def _rules(path: pathlib.Path) -> dict:
    """What a test file's code says about itself, read from its source: the optional packages it asks for or
    branches on (`extra("...")`, `available("...")`, `find_spec("...")`) and whether it reads the torch release.
    Key None for module-level code (the whole file), a test function's name for the code inside it; each value is
    `(extras, reads_release)`."""
    found: dict = {}
    tree = ast.parse(path.read_text())

    def calls(node) -> set:
        return {
            c.args[0].value
            for c in ast.walk(node)
            if isinstance(c, ast.Call)
            and (getattr(c.func, "id", None) or getattr(c.func, "attr", None)) in ("extra", "available", "find_spec")
            and c.args
            and isinstance(c.args[0], ast.Constant)
        }

    module_extras: set = set()
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found[stmt.name] = (calls(stmt), _reads_release(stmt))
        elif not isinstance(stmt, ast.ClassDef):
            module_extras |= calls(stmt)
    found[None] = (module_extras, False)
    return found


class _EachReproOnce:
    """Runs after every other collection hook, the `-m` selection included: a case's repro test (tests/test_bugs.py)
    is deselected where a selected bug notebook runs that repro (`runs_repros`, notebooks/conftest.py), so that no
    repro runs twice in one run, whichever tests `-m` kept."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        ran = {case for item in items for m in item.iter_markers("runs_repros") for case in m.args}
        once = [
            item
            for item in items
            if getattr(item, "originalname", None) == REPRO_TEST and item.callspec.params["case_id"] in ran
        ]
        if once:
            config.hook.pytest_deselected(items=once)
            items[:] = [item for item in items if item not in once]


REPRO_TEST = "test_a_standalone_repro_gives_this_releases_verdict"


def pytest_configure(config):
    config.pluginmanager.register(_EachReproOnce(), "each-repro-once")
    # Each xdist worker takes its share of the cores for torch's intra-op threads: by default every worker takes
    # them all, and two workers' OpenMP teams on 2 cores wait on each other (7 % slower, measured on the estimate's
    # tests). Only this process: notebook kernels and the commands a test starts keep torch's default (their
    # committed outputs and the toolkit's own thread rules are what they check).
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        torch.set_num_threads(max(1, cores // workers))


def pytest_collection_modifyitems(config, items):
    # A stable sort: every file's tests (a notebook's cells) keep their order.
    items.sort(key=lambda item: HEAVY_FIRST.index(r) if (r := _relative(item)) in HEAVY_FIRST else len(HEAVY_FIRST))
    for item in items:
        rel = _relative(item)
        if rel is None:
            continue
        if rel in QUICK:
            item.add_marker(pytest.mark.quick)
        # Found from the code itself, so that a new test cannot be left out (notebooks: notebooks/conftest.py):
        # `-m extras`, every test that needs or branches on an extra; `-m per_release`, every
        # test whose figures depend on the torch release — it reads the release (or carries the mark by hand, for
        # figures that are torch's own: its messages, its partitioner) — which CI runs on every supported release.
        if item.path.suffix == ".py":
            rules = _rules(item.path)
            extras, reads = rules.get(getattr(item, "originalname", None), (set(), False))
            extras = extras | rules[None][0]
            if extras & set(CI_EXTRAS):
                item.add_marker(pytest.mark.extras)
            if reads:
                item.add_marker(pytest.mark.per_release)


def _config_modules():
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    return (torch._dynamo.config, functorch_config, inductor_config)


def _stable(value) -> str:
    """A repr that two equal configs share: a set's order depends on how its copy was built."""
    if isinstance(value, (set, frozenset)):
        return "{" + ", ".join(sorted(map(_stable, value))) + "}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_stable(k)}: {_stable(v)}" for k, v in sorted(value.items(), key=repr)) + "}"
    return repr(value)


def _process_state():
    """What a test could leave behind for the next one in its worker, read here rather than by the toolkit: every
    Dynamo / AOTAutograd / Inductor config value (compared by repr) and which of them read as missing, Dynamo's LRU
    switch, grad mode and checkpoint's early stop; and a function that puts them back."""
    import warnings

    import torch.utils.checkpoint as ckpt

    from toolkit import compat

    lru = compat.lru_cache_enabled()  # torch has no getter: read by experiment (None where it cannot be read)
    grad = torch.is_grad_enabled()
    early_stop = getattr(ckpt, "_enable_checkpoint_early_stop", None)
    configs = {mod: mod.save_config() for mod in _config_modules()}
    values = {}
    for mod in configs:
        copy = mod.get_config_copy()
        values.update({f"{mod.__name__}.{k}": _stable(v) for k, v in copy.items()})
        # A config deleted and not set again (what a patch undone the wrong way leaves) keeps its value in the copy
        # but reads as missing: every later compile in the worker then fails on it. Seen only through getattr.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # reading a deprecated key warns
            values[f"{mod.__name__} unreadable"] = repr(sorted(k for k in copy if not hasattr(mod, k)))
    values.update(
        {"dynamo LRU cache": repr(lru), "grad enabled": repr(grad), "checkpoint early stop": repr(early_stop)}
    )

    def put_back() -> None:
        for mod, saved in configs.items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # load_config warns about deprecated keys it sets back
                mod.load_config(saved)
        if lru is not None:
            compat.set_lru_cache(lru)
        torch.set_grad_enabled(grad)
        if early_stop is not None:
            ckpt._enable_checkpoint_early_stop = early_stop

    return values, put_back


@pytest.fixture(scope="session", autouse=True)
def _lru_watched():
    """Dynamo's LRU switch is read by experiment, a compile after every `torch._dynamo.reset()` (~0.1 s): the suite
    watches torch's setter for the whole session instead (`compat.lru_cache_restored`), so that reading it before
    and after each test costs nothing; a test that sets it and does not put it back is still seen."""
    from toolkit import compat

    with compat.lru_cache_restored(compat.lru_cache_enabled()):
        yield


@pytest.fixture(autouse=True)
def _clean_dynamo(request):
    """Forget compiled graphs and counters around every test, and fail a test that changes process state without
    putting it back: one test's leak (torchtitan's own `apply_compile`, called directly, turns
    `capture_scalar_outputs` on for good) failed another test only when xdist ran the two in the same worker."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    before, put_back = _process_state()
    yield
    torch._dynamo.reset()
    counters.clear()
    after, _ = _process_state()
    leaked = {
        k: (before.get(k), after.get(k)) for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k)
    }
    if leaked:
        put_back()  # the next test in this worker starts clean either way
        pytest.fail(f"left process state changed (before, after): {leaked}", pytrace=False)


@pytest.fixture
def moe_cfg():
    return tk.ModelConfig()


@pytest.fixture
def dense_cfg():
    return tk.ModelConfig(
        n_layers=2, dim=32, n_heads=2, ffn_hidden=64, vocab_size=64, seq_len=16, batch=2, moe_layers="none"
    )
