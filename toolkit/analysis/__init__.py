"""Analysis of Reports: classification, the catalogue of known cases, and the composability matrix.

Classification sorts a Report into works / errors / silent failures and names its known cases; the matrix is a grid
(`cells`; the other stacks' `grids`, of the `blocks` they name), its results (`matrix`), views (`views`) and sweeps
(`sweeps`, on the `executors`).
"""

from . import catalogue
from .cells import Cell, full_cells, quick_cells
from .classification import EXPLAIN, SEVERITY, Classification, classify
from .grids import stack_cells, torchtitan_cells
from .matrix import MatrixResult, Row
from .sweeps import sweep

__all__ = [
    "catalogue",
    "EXPLAIN",
    "SEVERITY",
    "Classification",
    "classify",
    "Cell",
    "MatrixResult",
    "Row",
    "full_cells",
    "quick_cells",
    "torchtitan_cells",
    "stack_cells",
    "sweep",
]
