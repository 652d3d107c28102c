"""Bug-notebook support: a case's header, a version-aware verdict against its signature, standalone repros.

`verdicts` holds the header and the verdict, `scripts` the standalone repros.

A bug notebook prints `header(case)`, reproduces the case (a `Scenario` run, or a standalone torch-only script from
`toolkit.bugs.standalone`), and calls `confirm(case, report_or_observations)`. `confirm` checks the catalogue signature:
- it matches → the case is reproduced on this torch;
- it does not, and the catalogue says this torch version reproduces it → AssertionError (the repro broke);
- it does not, on a torch the catalogue has no verdict for → "not reproduced on torch X", recorded as a finding
  (`catalogue.findings()`), so a newer torch that fixed the bug turns the notebook into a record, not a failure.
"""

from .scripts import Skipped, check, export, has_script, script, script_name, show
from .verdicts import Finding, confirm, error_line, expected, header, observe

__all__ = [
    "Finding",
    "confirm",
    "error_line",
    "expected",
    "header",
    "observe",
    "Skipped",
    "check",
    "export",
    "has_script",
    "script",
    "script_name",
    "show",
]
