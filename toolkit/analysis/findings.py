"""Findings: the verdicts a run recorded on this machine for a torch release the catalogue had no verdict for
(`$TOOLKIT_FINDINGS`), read back beside the catalogue's own."""

from __future__ import annotations

import json
import os
import pathlib
import re

from .._config import ConfigError


def torch_release(version: str | None = None) -> str:
    """`2.13.0+cpu` → `2.13.0`: the key of the `verified` table and of recorded findings."""
    if version is None:
        import torch

        version = torch.__version__
    return version.split("+")[0]


def findings_path() -> pathlib.Path:
    """Where `record` appends findings: `$TOOLKIT_FINDINGS`, else `~/.cache/toolkit/findings.jsonl`; a folder there
    is refused (ConfigError), before anything is read or written."""
    path = pathlib.Path(
        os.environ.get("TOOLKIT_FINDINGS") or pathlib.Path.home() / ".cache" / "toolkit" / "findings.jsonl"
    )
    if path.is_dir():
        raise ConfigError(
            "TOOLKIT_FINDINGS",
            "",
            f"{str(path)!r} is a folder, not a findings file.",
            f"point TOOLKIT_FINDINGS at a file, e.g. {str(path / 'findings.jsonl')!r}, or unset it.",
        )
    return path


def record(finding) -> None:
    """Append a `toolkit.bugs.Finding` whose verdict is new for its torch version (one JSON line)."""
    from .. import _files

    path = findings_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _files.append_line(path, json.dumps(finding.to_json(), sort_keys=True))  # synced; a torn tail is skipped
    except OSError as e:
        raise ConfigError(
            "TOOLKIT_FINDINGS", "", f"cannot write {str(path)!r} ({e.strerror or e}).", "point it at a writable file."
        ) from None


def findings(case_id: str | None = None) -> dict[str, dict[str, str]]:
    """Recorded verdicts: case id → {torch release: "reproduced" / "not reproduced"}; the latest run wins. A torn last
    line (an interrupted append) is skipped; any other line that is not a finding (not UTF-8, not JSON, or without
    its case, torch and verdict) is refused, naming the file and line."""
    from .. import _files

    out: dict[str, dict[str, str]] = {}
    path = findings_path()
    if not path.exists():
        return out
    # A regular file, read up to 64 MiB (a finding is a line of ~100 bytes): a FIFO or /dev/zero is refused, not read.
    lines = _files.read_bytes_capped(path, "TOOLKIT_FINDINGS", "", 64 << 20).splitlines()
    for n, raw in enumerate(lines, 1):
        try:
            f = _files.loads(raw.decode("utf-8"), "TOOLKIT_FINDINGS", "", name=f"line {n}")
        except ConfigError:
            if n == len(lines):
                continue  # the last line, torn by an interrupted append
            f = None
        except UnicodeDecodeError:
            f = None
        if (
            not isinstance(f, dict)
            or not isinstance(f.get("case"), str)
            or not re.fullmatch(r"C\d{1,4}", f["case"])
            or not isinstance(f.get("torch"), str)
            or not re.fullmatch(r"\d{1,3}\.\d{1,3}\.\d{1,3}(\+[\w.]{1,40})?", f["torch"])
            or not isinstance(f.get("reproduced"), bool)
        ):  # the case and the release are shown in tables and Markdown: their form is checked, not only their type
            raise ConfigError(
                "TOOLKIT_FINDINGS",
                "",
                f"{str(path)!r} line {n} holds {raw.decode('utf-8', 'replace')[:60]!r}, not a finding (an object "
                'with "case" like "C12", "torch" like "2.14.1" and "reproduced" true or false).',
                "delete that line (cases --check and the bug notebooks append findings), or point TOOLKIT_FINDINGS "
                "at another file.",
            )
        if case_id is None or f["case"] == case_id:
            release = torch_release(f["torch"])
            out.setdefault(f["case"], {})[release] = "reproduced" if f["reproduced"] else "not reproduced"
    return out
