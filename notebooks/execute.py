"""Re-execute the notebooks in place (all, or those named), ready to commit for nbval: widget state, timestamps and
what names the machine they ran on (the torch build, the run's environment line) left out.

python notebooks/execute.py [notebooks/02_full_vs_selective_ac.ipynb notebooks/bugs/C08_lru_recompute_mismatch.ipynb]
python notebooks/execute.py --strip [NOTEBOOK ...]   # only strip the machine from the committed outputs
"""

import configparser
import pathlib
import re
import sys

import nbformat

here = pathlib.Path(__file__).parent

BUILD = re.compile(r"\b\d+\.\d+\.\d+\+(cpu|cu\d+|rocm[\d.]*|xpu)\b")
"""A torch build string (2.13.0+cpu, 2.14.1+cu130): the wheel the notebook last ran on."""


def _rules() -> list[tuple[re.Pattern, str]]:
    """The sanitizer's rules for the run's machine, as nbval applies them (notebooks/sanitize.cfg), then any build
    string left: a committed output holds the placeholder nbval compares it as, on every machine."""
    cfg = configparser.RawConfigParser()  # as nbval reads it: "%" is literal
    cfg.read(here / "sanitize.cfg")
    return [(re.compile(cfg[s]["regex"]), cfg[s]["replace"]) for s in ("environment", "torch-version")] + [
        (BUILD, "<BUILD>")
    ]


def _clean(value, rules):
    if isinstance(value, str):
        for pattern, replace in rules:
            value = pattern.sub(replace, value)
        return value
    if isinstance(value, list):
        return [_clean(v, rules) for v in value]
    if isinstance(value, dict):
        return {k: _clean(v, rules) for k, v in value.items()}
    return value


def machine_free(nb) -> None:
    """Every output of `nb` (stream text, each mimetype's data, a plotly figure's JSON) with the machine's torch build
    and environment line replaced by the sanitizer's placeholders."""
    rules = _rules()
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if "text" in out:
                out["text"] = _clean(out["text"], rules)
            if "data" in out:
                out["data"] = _clean(dict(out["data"]), rules)


def _execute(path: pathlib.Path) -> None:
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)  # timestamps: churn in every diff, compared by nothing
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    machine_free(nb)
    nbformat.write(nb, path)


def main(argv: list[str]) -> None:
    strip_only = argv[:1] == ["--strip"]
    args = argv[1:] if strip_only else argv
    paths = [pathlib.Path(p) for p in args] or sorted(here.glob("[0-9]*.ipynb")) + sorted(here.glob("bugs/*.ipynb"))
    if not strip_only:
        # The kernels import the *installed* toolkit: after `.ci/run` in another clone it points there, and the
        # outputs committed here would come from that clone's code.
        import toolkit

        if pathlib.Path(toolkit.__file__).resolve().parents[1] != here.resolve().parent:
            sys.exit(
                f"toolkit is imported from {pathlib.Path(toolkit.__file__).parent}, not this checkout: "
                f'run `pip install -e ".[dev]"` here first.'
            )
    for path in paths:
        if strip_only:
            nb = nbformat.read(path, as_version=4)
            machine_free(nb)
            nbformat.write(nb, path)
            print("stripped", path)
        else:
            _execute(path)
            print("executed", path)


if __name__ == "__main__":
    main(sys.argv[1:])
