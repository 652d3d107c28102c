"""The notebook front end: `display`, the Explorer (`widgets`) and `setup_notebook()`, loaded on use.

The notebook front end: figures with plain-text twins (`display`), the Explorer widget (`widgets`), and
`setup_notebook()`; `display` and `widgets` are imported when first used.
"""

from .setup import setup_notebook

__all__ = ["display", "setup_notebook", "widgets"]


def __getattr__(name: str):
    if name in ("display", "widgets"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
