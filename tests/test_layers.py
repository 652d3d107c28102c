"""The house's layers, read from the source (not from the toolkit's own account of itself): imports go one way, no
module imports itself round a circle, and `import toolkit` loads no notebook library."""

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PKG = ROOT / "toolkit"

# Each layer may import the ones before it in this list (README's Layout), never one after it.
LAYERS = [
    "_escape",
    "_migrations",
    "_config",
    "_files",
    "_extras",
    "_interrupt",
    "_stamp",
    "compat",
    "models",
    "transforms",
    "instrument",
    "stacks",
    "measurement",
    "estimation",
    "execution",
    "analysis",
    "bugs",
    "notebook",
    "cli",
    "__main__",
]


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        rel = p.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = p
    return out


def _runtime_nodes(tree: ast.AST):
    """Every node of `tree` but the bodies of `if TYPE_CHECKING:` (their `else:` runs)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))


def _imports(name: str, path: pathlib.Path, known: dict[str, pathlib.Path], *, typing: bool = False) -> set[str]:
    """Every toolkit module `name` imports, at the top or inside a function (a deferred import is still one); not the
    names imported under `if TYPE_CHECKING:`, which only the type checker reads, unless `typing`."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree) if typing else _runtime_nodes(tree):
        targets = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" for a in node.names] + [mod]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        for t in targets:
            while t and t not in known and "." in t:
                t = t.rsplit(".", 1)[0]
            if t in known and t != name:
                out.add(t)
                break
    return out


def _graph(*, typing: bool = False) -> dict[str, set[str]]:
    known = _modules()
    return {name: _imports(name, path, known, typing=typing) for name, path in known.items()}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_no_module_imports_itself_round_a_circle():
    graph = _graph()
    index, low, stack, on, circles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert circles == []


def test_imports_go_one_way_down_the_layers():
    graph = _graph()
    wrong = []
    for module, imported in graph.items():
        here = _layer(module)
        if here in ("__init__", "_api", "__main__", "cli"):
            continue  # the package's front door and the command line sit on top of everything
        for other in imported:
            there = _layer(other)
            if there == "__init__" or there == here:
                continue
            if LAYERS.index(there) > LAYERS.index(here):
                wrong.append(f"{module} imports {other}")
    assert wrong == []


def test_the_instrument_imports_only_compat_and_naming():
    """The instrument (probes, the step, its records) can be lifted out whole: it knows torch's private APIs through
    `compat` and module names through `transforms.naming`, and nothing of the Report, the Scenario, the transforms
    or the stacks (the torch settings a step needs are the caller's to pass)."""
    graph = _graph()
    allowed = ("toolkit.compat", "toolkit.transforms.naming", "toolkit.instrument")
    wrong = sorted(
        f"{module} imports {other}"
        for module, imported in graph.items()
        if module.startswith("toolkit.instrument")
        for other in imported
        if not other.startswith(allowed)
    )
    assert wrong == []


def test_the_estimation_reads_a_scenario_without_the_measurement_layer():
    """The estimator reads what it needs of a scenario through its own protocol (`estimation.inputs.ScenarioLike`):
    no module under `toolkit/estimation/` imports `toolkit.measurement` (the Scenario class, the Report), at the top,
    inside a function or under `if TYPE_CHECKING:`, though the layers would allow it."""
    graph = _graph(typing=True)
    estimation = [m for m in graph if m == "toolkit.estimation" or m.startswith("toolkit.estimation.")]
    assert "toolkit.estimation.estimates" in estimation and len(estimation) > 2, estimation
    wrong = sorted(
        f"{module} imports {other}"
        for module in estimation
        for other in graph[module]
        if other == "toolkit.measurement" or other.startswith("toolkit.measurement.")
    )
    assert wrong == []


def test_import_toolkit_loads_no_notebook_library():
    code = (
        "import sys, toolkit\n"
        "toolkit.ModelConfig, toolkit.sweep, toolkit.analysis.catalogue\n"  # the API, imported on first use of a name
        "print(sorted(m for m in ('ipywidgets', 'plotly', 'IPython', 'nbformat') if m in sys.modules))\n"
        "toolkit.explore\n"
        "print(sorted(m for m in ('ipywidgets',) if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[]", "['ipywidgets']"]


def test_the_instrument_runs_without_the_notebook_stack():
    """The notebook stack (ipywidgets, plotly, jupyterlab) is an extra: with none of it importable a step is measured
    and classified, and the Explorer says which install brings it instead of failing on an import inside."""
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('ipywidgets', 'plotly', 'jupyterlab', 'IPython', 'nbformat'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import toolkit as tk\n"
        "cfg = tk.ModelConfig(n_layers=1)\n"
        "scenario = tk.Scenario(model=cfg, ac=tk.ACConfig.of(mode='full'), check_numerics=False, steady_steps=0)\n"
        "report = tk.run(scenario)\n"
        "print(str(report).splitlines()[0], tk.classify(report).label)\n"
        "try:\n"
        "    tk.explore\n"
        "except ModuleNotFoundError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    first, explorer = out.stdout.strip().split("\n")[-2:]
    assert first == "grouped_mm | AC full | eager: ok works", first
    assert explorer.startswith("toolkit.notebook.widgets needs ipywidgets (not installed") and explorer.endswith(
        'pip install -e ".[notebook]"'
    ), explorer


def test_the_public_face_is_the_names_a_user_calls_each_resolving_once():
    """`toolkit.__all__` is the one list of public names: about 20 a user calls, no subpackage, nothing private. Each
    resolves (`_api`'s imports or the lazy Explorer), and every name `_api` imports is on it, so the two cannot drift.
    A name outside it says where it lives (old code gets its fix), and a layer is still reached as in any package."""
    import toolkit
    from toolkit import _api

    bound = {
        a.asname or a.name
        for node in ast.parse((PKG / "_api.py").read_text()).body
        if isinstance(node, ast.ImportFrom)
        for a in node.names
    }
    assert bound <= set(toolkit.__all__), sorted(bound - set(toolkit.__all__))
    assert len(toolkit.__all__) == len(set(toolkit.__all__)) <= 24
    subpackages = {p.name for p in PKG.iterdir() if (p / "__init__.py").exists() or p.suffix == ".py"}
    for name in toolkit.__all__:
        assert not name.removesuffix(".py").startswith("_") or name == "__version__", name
        assert name not in subpackages and f"{name}.py" not in subpackages, name
        assert getattr(toolkit, name) is not None, name
        if name in bound:
            assert getattr(toolkit, name) is getattr(_api, name), name
    assert toolkit.transforms.prepare is toolkit.transforms.recipes.prepare
    with pytest.raises(AttributeError, match=r"it is toolkit\.transforms\.prepare"):
        toolkit.prepare  # noqa: B018 - the attribute access is what is tested
    with pytest.raises(AttributeError, match=r"it is toolkit\.estimation\.LAYER_SHAPES"):
        toolkit.LAYER_SHAPES  # noqa: B018
    with pytest.raises(AttributeError, match=r"no attribute 'not_a_name'$"):
        toolkit.not_a_name  # noqa: B018


def test_every_tk_name_the_repository_writes_is_on_the_public_face():
    """`tk.<name>` in any code, notebook or page here (README's examples included) is a public name or a layer: a name
    that leaves the face cannot stay in an example that only a run of it would catch."""
    import json
    import re

    import toolkit

    layers = {p.stem for p in PKG.iterdir() if not p.name.startswith("_") and (p.suffix == ".py" or p.is_dir())}
    allowed = set(toolkit.__all__) | layers | {"__file__"}
    tracked = subprocess.run(["git", "ls-files"], capture_output=True, text=True, cwd=ROOT, check=True).stdout.split()
    wrong = []
    for rel in tracked:
        path = ROOT / rel
        if path.suffix == ".ipynb":
            text = "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"])
        elif path.suffix in (".py", ".md"):
            text = path.read_text()
        else:
            continue
        wrong += [f"{rel}: tk.{m}" for m in re.findall(r"(?<![\w.])tk\.(\w+)", text) if m not in allowed]
        # A longer path resolves too, attribute by attribute (`tk.measurement.fmt_bytes`): a name a split moved
        # cannot stay in a notebook that only a run of it would catch.
        for chain in re.findall(r"(?<![\w.])tk((?:\.\w+){2,})", text):
            obj = toolkit
            for part in chain.strip(".").split("."):
                if not hasattr(obj, part):
                    wrong.append(f"{rel}: tk{chain}")
                    break
                obj = getattr(obj, part)
    assert not wrong, sorted(set(wrong))


# A rule written out by hand where its home holds it is how rules drifted into 5 to 17 places: each pattern below is
# allowed only in its home.
_RULE_HOMES = {
    r"\.startswith\([^()]*\+ \"\.\"\)": ("toolkit/transforms/naming.py",),  # a name is this module or inside it
    r"\._cdata\b": ("toolkit/compat/",),  # a storage's identity: compat.storage_key
    r"_LATER|omit_unset|schema 1:": ("toolkit/_migrations.py",),  # what keeps a record readable: the table
}


def test_each_rule_stands_in_its_home_only():
    import re

    found = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if "/standalone/" in rel:
            continue  # torch-only scripts, pasted into upstream issues
        for pattern, homes in _RULE_HOMES.items():
            if rel.startswith(homes):
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(pattern, line):
                    found.append(f"{rel}:{n}: {line.strip()}")
    assert found == [], "\n".join(found)
