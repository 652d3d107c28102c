"""Re-execute the notebooks in place (all, or those named) and strip widget state, ready to commit for nbval.

python notebooks/execute.py [notebooks/02_full_vs_selective_ac.ipynb notebooks/bugs/C08_lru_recompute_mismatch.ipynb]
"""

import pathlib
import sys

import nbformat
from nbclient import NotebookClient

here = pathlib.Path(__file__).parent
# The kernels import the *installed* toolkit: after `.ci/run` in another clone it points there, and the outputs
# committed here would come from that clone's code.
import toolkit  # noqa: E402

if pathlib.Path(toolkit.__file__).resolve().parents[1] != here.resolve().parent:
    sys.exit(
        f"toolkit is imported from {pathlib.Path(toolkit.__file__).parent}, not this checkout: "
        f'run `pip install -e ".[dev]"` here first.'
    )
paths = [pathlib.Path(p) for p in sys.argv[1:]] or sorted(here.glob("[0-9]*.ipynb")) + sorted(here.glob("bugs/*.ipynb"))
for path in paths:
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)  # timestamps: churn in every diff, compared by nothing
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    print("executed", path)
