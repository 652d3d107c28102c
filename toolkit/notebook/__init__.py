"""The notebook front end: figures with plain-text twins (`display`), the Explorer widget (`widgets`), and `setup_notebook()`."""

from . import display
from .setup import setup_notebook

__all__ = ["display", "setup_notebook"]
