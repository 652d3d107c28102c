"""A sweep folder's up-to-date stamp: `python -m toolkit matrix` run again, unchanged, on a folder that already holds
every result answers from the stamp without importing torch.

A sweep whose every cell is cached still costs seconds, nearly all of it `import torch` (2-3 s on 2 cores). After a
sweep that left nothing to run again, the command line writes `STAMP` into the folder: its arguments, what its
outputs depend on (read with `stat` and `find_spec` only: the toolkit's own files, torch's and the optional
packages' installs, the interpreter, the machine, the visible GPUs, results.jsonl and the outputs), and what it
printed. The same command finds every one of them unchanged and prints that again; any difference, and the sweep
runs as usual and writes the stamp anew.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import socket
import sys
from typing import Any, Iterable

STAMP = ".matrix-stamp.json"
STAMP_CAP = 4 << 20
"""A stamp holds the arguments, a few hundred file states and the summary's lines: tens of KiB."""
REPLAYABLE_CODES = (0, 1, 3, 4)
"""The exit codes a finished `matrix` run ends with (ok, failed cells, silent failures under --strict, nothing
measured): the only ones a stamp replays."""
OUTPUTS = ("results.jsonl", "matrix.json", "matrix.md", "matrix.html")
VERSION = 1


def out_of(argv: list[str]) -> str:
    """The folder `argv` names with `--out` (argparse's default otherwise). An abbreviated option is not read here;
    the stamp's own copy of the arguments then differs, and the sweep runs as usual."""
    out = "matrix-out"
    for i, arg in enumerate(argv):
        if arg == "--out" and i + 1 < len(argv):
            out = argv[i + 1]
        elif arg.startswith("--out="):
            out = arg.split("=", 1)[1]
    return out


def _stat(path: str | os.PathLike | None) -> list[int] | None:
    try:
        st = os.stat(path) if path else None
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns] if st else None


def _install(module: str) -> Any:
    """Where `module` is installed, and its files' state: its `__init__` and, for torch, `version.py` (rewritten by
    every install). None when it is not installed. `find_spec` of a top-level name imports nothing."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    origin = spec.origin or ""
    version = os.path.join(os.path.dirname(origin), "version.py") if origin else None
    return [origin, _stat(origin), _stat(version)]


def _sources() -> list[list[Any]]:
    """The toolkit's own files (code, the catalogue, the standalone repros): a change to any of them may change a
    cell, a classification or a page."""
    root = pathlib.Path(__file__).resolve().parent
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            if name.endswith((".py", ".json")):
                path = os.path.join(folder, name)
                files.append([os.path.relpath(path, root), _stat(path)])
    return files


def _model_file(argv: list[str]) -> list[Any] | None:
    """The file a `--model FILE.py:FUNCTION` (or `MODULE:FUNCTION`) sweep measures, and its state: an edit to the
    user's model measures again. None without --model."""
    for i, arg in enumerate(argv):
        if arg.startswith("--model="):
            spec = arg.partition("=")[2]
        elif arg == "--model" and i + 1 < len(argv):
            spec = argv[i + 1]
        else:
            continue
        where = spec.rsplit(":", 1)[0]
        if where.endswith(".py"):
            return [os.path.abspath(where), _stat(where)]
        try:
            found = importlib.util.find_spec(where)
        except (ImportError, ValueError):
            found = None
        origin = found.origin if found is not None else None
        return [origin, _stat(origin)]
    return None


def inputs(argv: list[str], out: str | os.PathLike, packages: Iterable[str]) -> dict[str, Any]:
    """Everything a sweep's outputs depend on, beside the arguments themselves. `packages`: the optional packages
    whose installed versions count (`toolkit.stacks.extras()`, read by the CLI: the stacks sit above this layer)."""
    folder = pathlib.Path(out)
    return {
        "version": VERSION,
        "argv": [a for a in argv if a != "--no-progress"],
        "out": str(folder.resolve()),
        "cwd": os.getcwd(),
        "python": [sys.executable, sys.version],
        "host": socket.gethostname(),
        "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "torch": _install("torch"),
        "extras": {m: _install(m) for m in sorted(packages)},
        "toolkit": _sources(),
        "model": _model_file(argv),
        "files": {name: _stat(folder / name) for name in OUTPUTS},
    }


def write(argv: list[str], out: str | os.PathLike, printed: dict[str, Any], packages: Iterable[str]) -> None:
    """Stamp `out` after a sweep that leaves nothing to run again: `printed` holds the summary's lines (`stdout`,
    each with whether it is cut to the terminal's width), `stderr` (lines) and `code` (the exit code). A folder
    that cannot take the stamp just goes without it."""
    from . import _files

    try:
        _files.write_text(
            pathlib.Path(out) / STAMP, json.dumps({"inputs": inputs(argv, out, packages), "printed": printed})
        )
    except OSError:  # a full disk, a read-only folder: no stamp (and no temporary left), the next run sweeps again
        clear(out)


def clear(out: str | os.PathLike) -> None:
    """Remove the stamp (a sweep is about to change the folder)."""
    try:
        (pathlib.Path(out) / STAMP).unlink()
    except OSError:
        # None there (the usual case), or one that cannot be removed: harmless either way, since a stamp answers only
        # while the results, outputs, arguments, files and torch it names are what it recorded (`replay`).
        pass


def replay(argv: list[str], packages: Iterable[str]) -> int | None:
    """Print what the stamped sweep printed and return its exit code, when `argv` and everything the outputs depend
    on are unchanged; None otherwise (run the sweep)."""
    if "--merge" in argv or "--dry-run" in argv:
        return None
    from . import _escape, _files

    out = out_of(argv)
    try:
        # Read only as the regular file the toolkit wrote (a FIFO there would block; a huge file is not read): a
        # ConfigError is a ValueError, so anything else there just means "sweep as usual".
        stamp = _files.loads(_files.read_capped(pathlib.Path(out) / STAMP, "stamp", "", STAMP_CAP), "stamp", "")
        if stamp.get("inputs") != inputs(argv, out, packages):
            return None
        printed = stamp["printed"]
        lines = [(str(text), bool(cuts)) for text, cuts in printed["stdout"]]
        stderr, code = [str(line) for line in printed["stderr"]], printed["code"]
        # What is replayed is re-validated: an exit code the matrix command can end with, text made safe for a
        # terminal (a hand-edited stamp's escape sequences are shown, not run).
        if type(code) is not int or code not in REPLAYABLE_CODES:  # not True, not 1.0: an int it can exit with
            return None
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    for line in stderr:
        print(_escape.terminal(line, lines=True), file=sys.stderr)
    print(render([(_escape.terminal(text, lines=True), cuts) for text, cuts in lines]))
    print(
        f"up to date: nothing to run, nothing written; {os.path.join(out, 'matrix.json')}, matrix.md, matrix.html "
        f"and {os.path.join(out, 'results.jsonl')} are as this command left them"
    )
    return code


def render(lines, width: int | None = None) -> str:
    """`(text, cuts)` lines joined, those marked cut to `width` (default the terminal's)."""
    from ._escape import terminal_width

    width = width or terminal_width(120)
    return "\n".join(_cut(text, width) if cuts else text for text, cuts in lines)


def _cut(text: str, width: int) -> str:
    """`text` cut to `width` characters, with an ellipsis."""
    return text if len(text) <= width else text[: max(10, width - 1)] + "…"
