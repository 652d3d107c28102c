"""What the matrix's Markdown and HTML both say and link: the shared sentences, a case's counts, and where a case id
or a notebook links."""

from __future__ import annotations

import os
import pathlib
import re
from typing import TYPE_CHECKING, Any, Callable

from ... import _escape
from .. import catalogue

if TYPE_CHECKING:
    from ..classification import Classification
    from ..matrix import Row

CASE_IDS = (
    "The ids on a cell (and in the known case column) are the catalogued cases its result matches; on a working "
    "cell they name the documented behaviour it reproduces (C1: compile(AC(block)) works; C3: per-child compile)."
)
BARE_LINE = (
    "bare: every failing cell is rerun with none of the toolkit's probes (outcome, graphs and gradients only). yes: "
    "it fails the same way without the instrument; no: the instrument caused it; n/a: a finding about saved bytes, "
    "which only the probes see (the bare run ran as the instrumented one did)."
)

TRANSFORMERS_LINE = (
    "`matrix --stack transformers`: transformers' own models (`hf:FAMILY`, `hf:FAMILY:EXPERTS` for an "
    "`experts_implementation` other than its default), its own activation checkpointing (full = `use_reentrant=False`, "
    "reentrant, selective_op = a per-op SAC `context_fn`, selective_layer = `every_n_layers`) and its users' compiles "
    "(`model.compile()`, `layer.compile()` per decoder layer)."
)


def classified(row: Row) -> Classification:
    """A row's classification: every row of a MatrixResult has one (the result classifies each as it is made)."""
    assert row.classification is not None, row.key
    return row.classification


def case_counts(entry: dict[str, Any]) -> tuple[str, str, str]:
    """A `by_case()` entry's counts as the markdown and the page both show them: cells per classification (most
    first), cells on other releases, the catalogue's verdict per release."""
    by = ", ".join(f"{n} {label}" for label, n in sorted(entry["labels"].items(), key=lambda kv: -kv[1]))
    others = ", ".join(f"{t}: {n}" for t, n in entry["other_releases"].items()) or "-"
    verified = ", ".join(f"{v} on {k}" for k, v in entry["case"].verified.items()) or "-"
    return by, others, verified


def md(text: str) -> str:
    """The catalogue's own text (its titles, statuses and workarounds are Markdown written here) in a table cell:
    pipes and line breaks only. Anything read from a record goes through `_escape.markdown`."""
    return text.replace("|", "\\|").replace("\n", " ")


def notebooks_href(out: str | os.PathLike | None) -> str | None:
    """The notebooks folder as a link from files written into `out`: relative (it survives moving the repository),
    or its file:// address when `out` is None; None when the toolkit was installed without its notebooks."""
    here = pathlib.Path(__file__).resolve().parents[3] / "notebooks"
    if not here.is_dir():
        return None
    if out is None:
        return here.as_uri()
    return pathlib.Path(os.path.relpath(here, pathlib.Path(out).resolve())).as_posix()


def notebook_href(case: catalogue.Case, notebooks: str | None) -> str | None:
    """A case's bug notebook as a link from where `notebooks` is the notebooks folder; None without either."""
    return f"{notebooks}/{case.notebook}" if case.notebook and notebooks else None


def case_href(case_id: str, notebooks: str | None) -> str | None:
    """Where a case id links: its upstream thread, else its bug notebook, else nowhere (None)."""
    case = catalogue.get(case_id)
    return case.links[0] if case.links else notebook_href(case, notebooks)


def a(text: str, href: str | None) -> str:
    return f'<a href="{_escape.html(href)}">{_escape.html(text)}</a>' if href else _escape.html(text)


def linked_ids(escaped: str, href: Callable[[str], str | None]) -> str:
    """`escaped` (already HTML-escaped) with each case id made a link to `href(id)` (None: left as text)."""
    import re

    def link(m: re.Match[str]) -> str:
        target = href(m.group(0))
        return a(m.group(0), target) if target else m.group(0)

    return re.sub(r"(?<![\w/#.-])C\d+\b", link, escaped)


def case_link(case_id: str) -> str:
    case = catalogue.get(case_id)
    return f"[{case_id}]({case.links[0]})" if case.links else case_id
