"""`prepare` applies AC and compile together, checked against each other first; `reset` undoes every transform."""

from __future__ import annotations

from torch import nn

from .._config import check_bool, check_instance
from .ac import ACConfig, apply_ac, remove_ac
from .compile import CompileConfig, apply_compile, check_ac_compile, remove_compile
from .settings import reset_compiler


def prepare(model: nn.Module, *, ac: ACConfig | None = None, compile: CompileConfig | None = None) -> nn.Module:
    """AC first, then compile (torchtitan's order; `compile.order` picks compile(AC) or AC(compile) where they meet).

    Both configs are checked against each other before the model is touched.
    """
    check_instance("prepare", "model", model, nn.Module, "pass the model to transform (an nn.Module).")
    for name, value, kind in (("ac", ac, ACConfig), ("compile", compile, CompileConfig)):
        if value is not None:
            check_instance("prepare", name, value, kind, f"pass tk.{kind.__name__}(...) or None.")
    ac = ac or ACConfig.of()
    compile = compile or CompileConfig()
    check_ac_compile(ac, compile)
    apply_ac(model, ac)
    try:
        apply_compile(model, compile)
    except Exception:
        remove_ac(model)
        raise
    return model


def reset(model: nn.Module, *, dynamo: bool = True) -> nn.Module:
    """Undo every toolkit transform on `model` (compile, then AC) and, by default, `torch._dynamo.reset()`."""
    check_instance("reset", "model", model, nn.Module, "pass the model the transforms were applied to.")
    check_bool("reset", "dynamo", dynamo)
    remove_compile(model)
    remove_ac(model)
    if dynamo:
        reset_compiler()
    return model
