"""The matrix's views: its Markdown, its heatmap with a plain-text twin, its offline HTML page, and the files a sweep's
folder gets (`MatrixViews.write`).

Each renderer is a module of functions over a `MatrixResult` (`markdown`, `heatmap`, `html`; `links` what the
Markdown and the page share); `MatrixViews` gives the result its methods, one line each. The central list's committed
pages have two more (`toolkit.bugs.central_list` calls them): `cells_html`, every cell of several releases as a row of
a page with filters and no plotly, and `svg`, a static picture with a square per cell.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import TYPE_CHECKING, Any

from ... import _files
from . import heatmap, html, markdown
from .heatmap import COLORS, SYMBOLS
from .links import BARE_LINE, CASE_IDS, TRANSFORMERS_LINE, notebooks_href

if TYPE_CHECKING:
    from ..matrix import MatrixResult


class MatrixViews:
    """Views of a `MatrixResult` — its `rows`, `environment`, `others`, `counts()`, `central_list()` and
    `torch_changes()` — kept apart from the result model."""

    def _result(self) -> MatrixResult:
        return self  # type: ignore[return-value]  # a mixin of MatrixResult alone

    def changes_table(self) -> str:
        """Markdown: the cells that classify differently or save different bytes on the other torch releases measured
        (same results.jsonl), each with what it was there and why; "" when no other release was measured."""
        return markdown.changes_table(self._result())

    def recipes_table(self, old: str = "torchtitan_0_3_0", new: str = "torchtitan_main") -> str:
        """Markdown: per block kind, what changes between two recipes (torchtitan 0.3.0 and main by default)."""
        return markdown.recipes_table(self._result(), old, new)

    def cases_table(self, *, notebooks: str | None = "../../notebooks") -> str:
        """Markdown: the list by case, one row per known case the cells show."""
        return markdown.cases_table(self._result(), notebooks=notebooks)

    def backend_table(self) -> str:
        """Markdown: the cells measured with both aot_eager and inductor that classify or save differently."""
        return markdown.backend_table(self._result())

    def table(self) -> str:
        """The central list as markdown: grouped by classification, most severe first."""
        return markdown.table(self._result())

    def heatmap(self) -> Any:
        """A plotly figure: per block kind, classification by AC mode × compile setup (twin: `grid_text()`)."""
        return heatmap.figure(self._result())

    def grid_text(self) -> str:
        """The plain-text twin of `heatmap()`: each panel as a grid of classification symbols."""
        return heatmap.grid_text(self._result())

    def html(self, *, stamp: str = "", notebooks: str | None = None) -> str:
        """A self-contained page: plotly.js embedded (opens offline), the legend, the heatmap, then the central list."""
        return html.page(self._result(), stamp=stamp, notebooks=notebooks)

    def write(self, out: str | os.PathLike[str]) -> dict[str, pathlib.Path]:
        """matrix.json, matrix.md and matrix.html into `out`. The page (plotly, the slow one) is rewritten only when
        what it shows changed: its stamp, a hash of the JSON, the markdown, the views' code and plotly's version, is
        in its head."""
        m = self._result()
        out = pathlib.Path(out)
        out.mkdir(parents=True, exist_ok=True)
        paths = {"json": out / "matrix.json", "md": out / "matrix.md", "html": out / "matrix.html"}
        data = json.dumps(m.to_dict(), indent=1)
        notebooks = notebooks_href(out)
        md = markdown.document(m, notebooks=notebooks)
        # Each written whole or not at all (a full disk leaves the previous file as it was: `_files.WriteFailed`).
        _files.write_text(paths["json"], data)
        _files.write_text(paths["md"], md)
        stamp = html.stamp_of_parts(data, md)
        if html.stamp_of(paths["html"]) != stamp:
            _files.write_text(paths["html"], html.page(m, stamp=stamp, notebooks=notebooks))
        return paths


__all__ = ["MatrixViews", "COLORS", "SYMBOLS", "BARE_LINE", "CASE_IDS", "TRANSFORMERS_LINE", "notebooks_href"]
