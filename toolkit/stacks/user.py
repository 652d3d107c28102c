"""Your own model behind the `Stack` interface: `build()` from your file or module, the toolkit's AC and compile on
its blocks.

`UserModelConfig(build="path/to/file.py:build")` (or `"package.module:build"`) names a function of no arguments that
returns `(model, inputs)` or `(model, inputs, loss_fn)` at a tiny size: `inputs` a tensor, a tuple of positional
inputs or a dict of keyword inputs; without `loss_fn` the output's own `loss` (transformers' `ModelOutput` given
labels) or its first tensor squared and averaged. The blocks AC and per-block compile work on are the children of
`blocks_of`'s container: the ModuleList whose children are of class `blocks`, or by default the one holding the
most parameters among those whose children are all one class (as FSDP's auto-wrap finds a model's blocks). The
matrix addresses it as `user:SPEC` (`user:SPEC#CLASS` with a class named: `analysis/blocks.py`).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import os
import pathlib
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, cast

from .._config import ConfigError, PlainData, check_choice, check_text
from .base import Built, Stack

if TYPE_CHECKING:
    from importlib.abc import Loader
    from importlib.machinery import ModuleSpec

AC_MODES = ("none", "full", "selective_op", "selective_layer", "memory_budget")
"""The toolkit's AC modes a model it did not build can take (per_submodule and remat name the toolkit's own
submodules and regions)."""
SCOPES = ("none", "model", "blocks")


@dataclass(frozen=True)
class UserModelConfig(PlainData):
    """A model a user builds: where its `build()` is, and which class its blocks are."""

    build: str = ""
    """`path/to/file.py:FUNCTION` or `package.module:FUNCTION`: a function of no arguments returning `(model, inputs)`
    or `(model, inputs, loss_fn)`."""
    blocks: str | None = None
    """The class name of the repeated blocks (`--blocks`); None: found as FSDP's auto-wrap would (`blocks_of`)."""
    seed: int = 0
    """Seeds the RNG around `build()` (its init) and before each measured forward."""
    device: str = "cpu"

    def __post_init__(self) -> None:
        own = "UserModelConfig"
        check_text(own, "build", self.build)
        if self.build:
            _parts(self.build)
        if self.blocks is not None:
            check_text(own, "blocks", self.blocks)
            if not self.blocks.isidentifier():
                raise ConfigError(own, "blocks", f"{self.blocks!r} is not a class name.", "pass e.g. 'DecoderLayer'.")
        check_choice(own, "device", self.device, ("cpu", "cuda"))

    @property
    def label(self) -> str:
        where, fn = self.build.rsplit(":", 1)
        return f"{os.path.basename(where) or where}:{fn}" + (f" [{self.blocks}]" if self.blocks else "")

    def source(self) -> pathlib.Path | None:
        """The file `build` lives in (what a matrix cell's key reads, so that an edit measures again)."""
        where = self.build.rsplit(":", 1)[0]
        if where.endswith(".py"):
            return pathlib.Path(where)
        try:
            spec = importlib.util.find_spec(where)
        except (ImportError, ValueError):
            return None
        return pathlib.Path(spec.origin) if spec is not None and spec.origin else None


def _parts(build: str) -> tuple[str, str]:
    """`FILE.py:FUNCTION` / `MODULE:FUNCTION` → (where, function); a ConfigError naming the field otherwise (an empty
    `--model ''` included)."""
    where, _, name = build.rpartition(":")
    if not where or not name:
        raise ConfigError(
            "UserModelConfig",
            "build",
            f"{build!r} is not FILE.py:FUNCTION or MODULE:FUNCTION.",
            "pass e.g. 'models/mine.py:build' or 'mypkg.models:build'.",
        )
    return where, name


def load(build: str) -> Callable[[], Any]:
    """The function `build` names, imported by path (`file.py:fn`) or as a module (`pkg.mod:fn`); a ConfigError
    naming the field when it cannot be."""
    where, name = _parts(build)
    own = "UserModelConfig"
    try:
        if where.endswith(".py"):
            path = pathlib.Path(where).resolve()
            if not path.is_file():
                raise ConfigError(own, "build", f"{where!r} is not a file.", "pass the path of your model's .py file.")
            mod_name = "_toolkit_user_" + hashlib.sha256(str(path).encode()).hexdigest()[:12]
            module = sys.modules.get(mod_name)
            if module is None:
                # A .py file's location always gives a spec with a loader.
                spec = cast("ModuleSpec", importlib.util.spec_from_file_location(mod_name, path))
                module = importlib.util.module_from_spec(spec)
                sys.modules[mod_name] = module
                try:
                    cast("Loader", spec.loader).exec_module(module)
                except BaseException:
                    sys.modules.pop(mod_name, None)
                    raise
        else:
            module = importlib.import_module(where)
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(
            own, "build", f"importing {where!r} failed: {type(e).__name__}: {e}", "fix the file, or the module path."
        ) from e
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ConfigError(own, "build", f"{where!r} has no function {name!r}.", "name a function of that file.")
    return fn


def built_parts(result: Any, build: str) -> tuple[Any, tuple, dict, Callable | None]:
    """`(model, args, kwargs, loss_fn)` of what `build()` returned, or a ConfigError saying what it must return."""
    from torch import nn

    ok = isinstance(result, tuple) and len(result) in (2, 3) and isinstance(result[0], nn.Module)
    if not ok or (len(result) == 3 and result[2] is not None and not callable(result[2])):
        raise ConfigError(
            "UserModelConfig",
            "build",
            f"{build} returned {type(result).__name__}, not (model, inputs) or (model, inputs, loss_fn).",
            "return the model (an nn.Module), its inputs, and optionally a function output -> scalar loss.",
        )
    inputs = result[1]
    args: tuple[Any, ...]
    if isinstance(inputs, Mapping):
        args, kwargs = (), dict(inputs)
    elif isinstance(inputs, (tuple, list)):
        args, kwargs = tuple(inputs), {}
    else:
        args, kwargs = (inputs,), {}
    return result[0], args, kwargs, result[2] if len(result) == 3 else None


def default_loss(out: Any):
    """The loss of an output when no `loss_fn` is given: a `loss` the output carries (transformers' `ModelOutput`
    when `labels=` were passed, or a dict's "loss"), else its first tensor, squared and averaged (a scalar as is)."""
    import torch

    carried = out.get("loss") if isinstance(out, Mapping) else getattr(out, "loss", None)
    if isinstance(carried, torch.Tensor) and carried.numel() == 1:
        return carried
    out = out[0] if isinstance(out, (tuple, list)) else out
    if not isinstance(out, torch.Tensor):
        raise TypeError(
            f"the output is a {type(out).__name__} with no scalar `loss`; pass loss_fn=... to make a scalar of it "
            "(for a transformers model, pass labels= so that it returns its loss)"
        )
    return out if out.dim() == 0 else out.float().square().mean()


def blocks_of(model: Any, cls_name: str | None) -> str:
    """The canonical name of the container of `model`'s blocks: the ModuleList / ModuleDict whose children are of
    class `cls_name`, or by default the first of `repeated_containers` (the most parameters)."""
    from ..transforms.containers import repeated_containers

    found = repeated_containers(model, cls_name)
    if not found:
        what = f"of class {cls_name!r}" if cls_name else "all of one class"
        raise ConfigError(
            "UserModelConfig",
            "blocks",
            f"{type(model).__name__} has no ModuleList / ModuleDict whose children are {what}.",
            "pass the class name of the repeated blocks (--blocks), kept in an nn.ModuleList.",
        )
    return found[0][0]


def spec_of(build: Any) -> str:
    """`FILE.py:FUNCTION` for `build` given as that text, or as a function defined at the top of a .py file (each
    cell imports it again in its own process, by path)."""
    import inspect

    if isinstance(build, str):
        return build
    name = getattr(build, "__qualname__", "")
    try:
        path = inspect.getsourcefile(build) if callable(build) else None
    except TypeError:
        path = None
    if not path or not path.endswith(".py") or not name.isidentifier():
        raise ConfigError(
            "sweep",
            "model",
            f"{build!r} is not a function defined at the top of a .py file (each cell imports it in a process of its "
            "own).",
            "define build() at module level in a .py file, or pass 'path/to/file.py:build'.",
        )
    return f"{os.path.abspath(path)}:{name}"


def preflight(cfg: UserModelConfig) -> str:
    """Load and call `cfg.build` once and find its blocks: a ConfigError naming the field for a file, a function, a
    return value or blocks that would fail every cell, before any runs. Returns the blocks' names
    (`model.layers.0 … model.layers.N`)."""
    import torch

    from ..transforms.naming import get_module

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = built_parts(load(cfg.build)(), cfg.build)[0]
    container = blocks_of(model, cfg.blocks)
    keys = [key for key, _ in get_module(model, container).named_children()]
    return f"{container}.{keys[0]}" + (f" … {container}.{keys[-1]} ({len(keys)})" if len(keys) > 1 else "")


def source_digest(cfg: UserModelConfig) -> str:
    """A digest of the file `build` lives in: part of a matrix cell's key, so an edited model measures again."""
    from .. import _files

    path = cfg.source()
    try:
        raw = _files.read_bytes_capped(path, "build", "file", _files.RECORD_CAP) if path is not None else None
    except ConfigError:
        return "unreadable"
    return hashlib.sha256(raw).hexdigest()[:16] if raw is not None else "unknown"


class UserStack:
    """A model the user built, with the toolkit's own AC and compile applied to its blocks."""

    name = "user"
    config_type = UserModelConfig
    config_field = "model"

    def available(self) -> bool:
        return True

    def require(self, owner: str, field: str) -> None:
        return None

    def release(self) -> str | None:
        return None

    def check(self, scenario: Any) -> None:
        own = "Scenario"
        if not isinstance(scenario.model, UserModelConfig) or not scenario.model.build:
            raise ConfigError(
                own,
                "model",
                "stack='user' measures a model your build() returns.",
                "pass model=UserModelConfig(build='path/to/file.py:build').",
            )
        for name, value, fix in (
            ("ep", scenario.ep > 1, "pass ep=1."),
            ("fsdp", scenario.fsdp != "none", "pass fsdp='none' (shard your model in build() and use tk.measure)."),
            ("recipe", scenario.recipe is not None, "drop recipe and pass ac= and compile=."),
        ):
            if value:
                raise ConfigError(own, name, "the user stack applies the toolkit's AC and compile only.", fix)
        if scenario.ac.mode not in AC_MODES:
            raise ConfigError(
                "ACConfig",
                "mode",
                f"{scenario.ac.mode!r} names the toolkit's own submodules or regions.",
                f"pass one of {', '.join(AC_MODES)}.",
            )
        c = scenario.compile
        if c.enabled and not (c.scope in SCOPES or isinstance(c.scope, tuple)):
            raise ConfigError(
                "CompileConfig",
                "scope",
                f"{c.scope!r} names the toolkit's own submodules.",
                "pass 'model', 'blocks' or module names of your model.",
            )

    def step_context(self, scenario: Any) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def build(self, scenario: Any, *, sharded: bool) -> Built:
        import torch

        cfg = scenario.model_config
        fn = load(cfg.build)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            model, args, kwargs, loss = built_parts(fn(), cfg.build)
        from ..transforms.containers import name_blocks

        name_blocks(model, blocks_of(model, cfg.blocks))
        params = next(model.parameters(), None)
        return Built(
            model,
            (args, kwargs),
            lambda m: m(*args, **kwargs),
            loss if loss is not None else default_loss,
            params.device if params is not None else torch.device(cfg.device),
            params.dtype if params is not None else torch.float32,
            cfg.seed + 2,
        )

    def transform(self, scenario: Any, model: Any, stage: Callable[[str], None]) -> dict[str, str]:
        from ..transforms import apply_ac, apply_compile
        from ..transforms.record import applied

        stage("ac")
        apply_ac(model, scenario.ac)
        stage("compile")
        apply_compile(model, scenario.compile)
        return dict(applied(model).compile_orders)

    def called(self, model: Any) -> Any:
        return model

    def applied(self, model: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
        from ..transforms.record import applied

        rec = applied(model)
        return tuple(rec.ac_wrapped), tuple(rec.compiled)

    def undo(self, model: Any) -> None:
        from ..transforms.containers import name_blocks
        from ..transforms.lifecycle import reset

        reset(model, dynamo=False)
        name_blocks(model, None)

    def label(self, scenario: Any) -> str:
        c = scenario.compile
        scope = c.scope if isinstance(c.scope, str) else ",".join(c.scope)
        outside = ", AC outside" if c.order == "ac_outside" else ""
        comp = "eager" if not c.enabled else f"compile {scope} ({c.backend_name}{outside})"
        return f"{scenario.model.label} | AC {scenario.ac.mode} | {comp}"

    def draws_random(self, config: UserModelConfig) -> bool:
        """A dropout module with p > 0 in training mode (built once more to look: its build() is tiny); random
        draws its code makes otherwise are not seen here (a recompute's new draws are found either way)."""
        import torch
        from torch import nn

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            model = built_parts(load(config.build)(), config.build)[0]
        return any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 and m.training for m in model.modules())

    def blocks(self, model: Any) -> list[str]:
        from ..transforms.containers import block_container, blocks

        prefix = block_container(model)[0]
        return [f"{prefix}.{key}" for key, _ in blocks(model)]


STACK: Stack = UserStack()

__all__ = [
    "STACK",
    "UserModelConfig",
    "UserStack",
    "blocks_of",
    "built_parts",
    "default_loss",
    "load",
    "preflight",
    "source_digest",
    "spec_of",
]
