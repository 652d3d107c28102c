"""The notebook front end: `display`, the Explorer (`widgets`; its controls `form` and `controls`, its models
`models`, the work behind its buttons `actions`, what it writes `render`) and `setup_notebook()`, loaded on use.

`display` draws figures with plain-text twins; `display` and `widgets` (ipywidgets, plotly) are imported when first
used, so that the instrument runs without the notebook stack.
"""

from .setup import setup_notebook

__all__ = ["display", "setup_notebook", "widgets"]


# What each front-end module needs beyond the instrument: the `notebook` extra, which README's install brings.
_NEEDS = {"display": ("plotly",), "widgets": ("ipywidgets", "plotly")}


def __getattr__(name: str):
    if name in _NEEDS:
        import importlib

        from .._extras import missing

        why = missing(_NEEDS[name])
        if why is not None:
            raise ModuleNotFoundError(f"toolkit.notebook.{name} {why}")
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
