"""`setup_notebook()`: the one setup call every notebook makes (plotly renderer, print options, seeds, quiet logs)."""

from __future__ import annotations

import logging
import os
import warnings

_done = False


class MissingExtra(RuntimeError):
    """A notebook needs an optional package that is not installed: shown as one line, not a traceback."""

    def _render_traceback_(self) -> list[str]:  # IPython shows this instead of the traceback
        return [f"{type(self).__name__}: {self}"]


def setup_notebook(
    *, seed: int = 0, threads: int | None = None, autoreload: bool | None = None, needs: tuple[str, ...] = ()
) -> None:
    """Make a notebook's outputs stable and quiet; safe to call again (idempotent).

    `needs` names the optional packages the notebook uses (`("torch_remat",)`): when one is missing the cell stops
    with one line saying which and how to install it (nbval skips the notebook with the same line).

    - plotly keeps its default renderer (in Jupyter and under nbval that is the plain plotly JSON mimetype,
      deterministic and small; never the "notebook" renderer that embeds plotly.js with random div ids);
    - torch prints 4 decimals; the global RNG is seeded;
    - torch's compile warnings go to the toolkit's Reports, not the cell's stderr;
    - `autoreload` (default: on outside CI) reloads edited toolkit modules in a running kernel.
    Returns nothing, so the cell has no output to compare.
    """
    global _done
    from .._config import check_bool, check_choice, check_int, check_strings
    from ..stacks import extras, missing

    own = "setup_notebook"
    check_int(own, "seed", seed, 0, (1 << 64) - 1, "torch.manual_seed's range")
    if autoreload is not None:
        check_bool(own, "autoreload", autoreload)
    for name in check_strings(own, "needs", needs, "('torch_remat',)"):
        check_choice(own, "needs", name, sorted(extras()))
    if threads is not None:
        from .._config import MAX_THREADS

        check_int(own, "threads", threads, 1, MAX_THREADS, "intra-op threads")
    why = missing(tuple(needs))
    if why:
        raise MissingExtra(f"this notebook {why}")
    import torch

    torch.manual_seed(seed)
    torch.set_printoptions(precision=4, sci_mode=False)
    if threads is not None:
        torch.set_num_threads(threads)
    for category in (DeprecationWarning, FutureWarning):
        warnings.filterwarnings("ignore", category=category, module=r"torch(\..*)?")
    warnings.filterwarnings("ignore", message=".*Failed to initialize NumPy.*")
    logging.getLogger("torch").setLevel(logging.ERROR)
    os.environ.setdefault(
        "TORCHINDUCTOR_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "toolkit-inductor")
    )
    if autoreload is None:
        autoreload = not os.environ.get("CI")
    if autoreload and not _done:
        try:
            from IPython import get_ipython

            ip = get_ipython()
            if ip is not None:  # None outside IPython (a plain script): nothing to reload
                ip.run_line_magic("load_ext", "autoreload")
                ip.run_line_magic("autoreload", "2")
        except ImportError:  # IPython is not installed
            pass
    _done = True
