"""Analysis of Reports: classification into works / errors / silent failures, the catalogue of known cases, and the composability matrix and its sweeps."""

from . import catalogue
from .classification import EXPLAIN, SEVERITY, Classification, classify
from .matrix import Cell, MatrixResult, full_cells, quick_cells
from .sweeps import sweep

__all__ = ["catalogue", "EXPLAIN", "SEVERITY", "Classification", "classify", "Cell", "MatrixResult", "full_cells",
           "quick_cells", "sweep"]
