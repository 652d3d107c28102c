"""`results.jsonl`, the sweep's store, and its folder: records read, repaired and merged; one sweep at a time.

`results.jsonl` holds one record per line, `{"key", "cell", "report", "limit_s"}` (and `"timeouts"`, how many
times in a row a timed-out cell did), keyed by scenario, torch version and device (`cells.cell_key`); the last
record of a key wins, and a line that is not a record (torn by `kill -9`, not UTF-8, junk) is skipped and named.
One sweep writes into a folder at a time (a lock: `FolderBusy` names the holder); results from several folders or
machines merge by key, read the same way (`merge_results`, `--merge`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import socket
import sys
import time
from typing import Any, Iterable, NamedTuple

from .. import _files
from .._config import ConfigError, check_int, check_seconds
from ..measurement import Report
from ..measurement.schema import OUTCOMES
from .cells import Cell

RESULTS = "results.jsonl"
LOCK = ".sweep.lock"
OUTPUTS = ("matrix.json", "matrix.md", "matrix.html")
_BEGINS = {
    "matrix.json": b'{\n "environment": ',
    "matrix.md": "# AC × compile × MoE: the central list".encode(),
    "matrix.html": b"<!DOCTYPE html><html><head><meta charset='utf-8'>",
}
"""How each file a sweep writes into its folder begins (with the lock's, below): one that exists, is not empty and
begins otherwise is not a sweep's (a user's own file of that name), and is refused before any cell runs, never cut
or replaced. A results.jsonl is the sweep's when one of its lines is a record (`_sweeps_own`): junk lines in a
sweep's own results are skipped and named, not a reason to refuse it."""
_RECORD_BEGINS = b'{"key": "'


def _sweeps_own(path: pathlib.Path) -> bool:
    """Is `path` missing, empty, or a file a sweep wrote (see `_BEGINS`)? Never blocks: not a regular file is
    'missing' here (the folder's other checks refuse it)."""
    if path.name == RESULTS:
        head = _files.read_head(path, 1)
        if not head:
            return True
        return any(isinstance(raw, bytes) and raw.startswith(_RECORD_BEGINS) for _, raw in _lines(path))
    start = _BEGINS.get(path.name, b"pid " if path.name == LOCK else b"")
    head = _files.read_head(path, len(start))
    return not head or head.startswith(start) or start.startswith(head)  # a torn write is a prefix


# ------------------------------------------------------------------------------------------------ results.jsonl


class Skipped(NamedTuple):
    """A line of a results.jsonl that is not a record: its number (from 1) and why."""

    line: int
    why: str


_CELL_FIELDS = frozenset(f.name for f in dataclasses.fields(Cell))
_CELL_NEEDS = frozenset(("block", "ac", "scope"))  # in every record ever written (later fields have defaults)


def _record(raw: bytes) -> dict:
    """One line as the record it must be — `{"key", "cell", "report", "limit_s"}` as `sweep` writes it — or
    ValueError saying what it is instead. The one reader of records: resume, `load_results` and `--merge`."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})") from None
    try:
        rec = json.loads(text, object_pairs_hook=_files.unique_keys)
    except _files.DuplicateKey as e:
        raise ValueError(f"not a record: {e}") from None
    except ValueError:
        raise ValueError("not JSON (a torn or foreign line)") from None
    except RecursionError:
        raise ValueError("JSON nested too deep to be a record") from None
    if not isinstance(rec, dict) or not {"key", "cell", "report"} <= set(rec):
        raise ValueError("not a record (an object with key, cell and report)")
    if not isinstance(rec["key"], str) or not rec["key"].strip():
        raise ValueError(f"key {rec['key']!r} is not a cell key (a non-empty string)")
    cell, report = rec["cell"], rec["report"]
    if not isinstance(cell, dict) or not _CELL_NEEDS <= set(cell) <= _CELL_FIELDS:
        raise ValueError("its cell does not hold the fields of a Cell")
    if not isinstance(report, dict) or report.get("outcome") not in OUTCOMES:
        raise ValueError("its report has no outcome")
    if not isinstance(report.get("environment"), dict) or not isinstance(report["environment"].get("torch"), str):
        raise ValueError("its report does not say which torch measured it")
    try:
        check_seconds("record", "limit_s", rec.get("limit_s"))
    except ConfigError as e:
        raise ValueError(f"limit_s {e.problem.rstrip('.')}") from None
    if "timeouts" in rec:
        try:
            check_int("record", "timeouts", rec["timeouts"], 0)
        except ConfigError as e:
            raise ValueError(f"timeouts {e.problem.rstrip('.')}") from None
    try:
        rec["_cell"], rec["_report"] = Cell(**cell), Report.from_dict(report)
    except ConfigError as e:
        raise ValueError(f"its report does not hold what a measurement writes ({str(e)[:160]})") from None
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise ValueError(f"its cell or report cannot be read ({type(e).__name__}: {str(e)[:80]})") from None
    return rec


LINE_CAP = _files.RECORD_CAP
"""The longest line read as a record: a longer one is skipped, never held whole."""


def _lines(p: pathlib.Path) -> Iterable[tuple[int, bytes | str | None]]:
    """(number from 1, the line) for each line of `p`, read a line at a time; None for a line over `LINE_CAP` (its
    bytes are skipped unread); a str, last, where an archive turns unreadable (what it said). A file ending in `.xz`
    is read decompressed (a committed central list's records). A path that is not a regular file (a FIFO, `/dev/zero`
    behind a symlink) is a ConfigError: it could block or never end."""
    import lzma
    import stat

    if not stat.S_ISREG(os.stat(p).st_mode):
        raise ConfigError(
            "results", "path", f"{str(p)!r} is not a regular file (a FIFO, a device).", "pass a results.jsonl file."
        )
    with lzma.open(p, "rb") if p.suffix == ".xz" else open(p, "rb") as f:
        n = 0
        while True:
            try:
                raw = f.readline(LINE_CAP + 1)
            except (lzma.LZMAError, EOFError) as e:  # a truncated or corrupt archive: what was read stands
                yield n + 1, f"the archive ends here, unreadable ({type(e).__name__}: {e}): the rest is not read"
                return
            if not raw:
                return
            n += 1
            if len(raw) > LINE_CAP and not raw.endswith(b"\n"):
                while raw and not raw.endswith(b"\n"):  # the rest of the over-long line, in pieces
                    raw = f.readline(LINE_CAP)
                yield n, None
                continue
            yield n, raw.rstrip(b"\n")


def read_results(path: str | os.PathLike) -> tuple[dict[str, dict], list[Skipped]]:
    """key → the last valid record for it, and every line skipped with why: a torn line (`kill -9` mid-write), an
    undecodable one (not UTF-8), junk that is not a record, one too long to be a record."""
    out: dict[str, dict] = {}
    skipped: list[Skipped] = []
    p = pathlib.Path(path)
    if not p.exists():
        return out, skipped
    for n, raw in _lines(p):
        if raw is None:
            skipped.append(Skipped(n, f"longer than {LINE_CAP >> 20} MiB: not a record"))
            continue
        if isinstance(raw, str):  # what the archive said where it stopped
            skipped.append(Skipped(n, raw))
            continue
        if not raw.strip():
            continue
        try:
            rec = _record(raw)
        except ValueError as e:
            skipped.append(Skipped(n, str(e)))
            continue
        out[rec["key"]] = rec
    return out, skipped


def read_records(path: pathlib.Path) -> dict[str, dict]:
    return read_results(path)[0]


def skipped_text(path: str | os.PathLike, skipped: list[Skipped], limit: int = 5) -> str:
    """`results.jsonl: skipped 3 lines that are not records (line 4: not UTF-8 …; line 9: not JSON …)`."""
    shown = "; ".join(f"line {s.line}: {s.why}" for s in skipped[:limit])
    more = f"; +{len(skipped) - limit} more" if len(skipped) > limit else ""
    n = len(skipped)
    return (
        f"{path}: skipped {n} line{'' if n == 1 else 's'} that {'is' if n == 1 else 'are'} not a record ({shown}{more})"
    )


def load_results(path: str | os.PathLike) -> dict[str, tuple[Cell, Report]]:
    """Finished cells from a results.jsonl, the last record of each key (torn, undecodable and junk lines are
    skipped: `read_results` says which)."""
    return {k: (r["_cell"], r["_report"]) for k, r in read_records(pathlib.Path(path)).items()}


def repair_tail(path: str | os.PathLike) -> str | None:
    """Make sure the next record starts on a line of its own: a torn last line (a crash mid-write) is cut off, a
    whole record missing only its newline gets one. Says what it did, in words (None when nothing needed doing).
    Reads only the file's tail (at most `LINE_CAP` bytes)."""
    p = pathlib.Path(path)
    if not os.path.lexists(p):
        return None
    with _files.open_own(p, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return None
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return None
        start = max(0, size - LINE_CAP)
        f.seek(start)
        tail = f.read()
        cut = start + tail.rfind(b"\n") + 1 if b"\n" in tail else start
        last = tail[cut - start :]
        try:
            json.loads(last)
            f.write(b"\n")
            said = "its last record had no newline: one was added"
        except ValueError:
            f.truncate(cut)  # that cell's record is lost; it runs again
            said = f"its last line was torn (a crash mid-write): {len(last)} bytes cut, that cell runs again"
        f.flush()
        os.fsync(f.fileno())
    return f"{str(p)!r}: {said}"


def replaces(rec: dict, mine: dict | None) -> bool:
    """The one merge rule: a record is taken where the folder has none, or where it has only a crash or a timeout
    and the record is a measured result."""
    if mine is None:
        return True
    unfinished = ("crashed", "timeout")
    return mine["_report"].outcome in unfinished and rec["_report"].outcome not in unfinished


def merge_results(
    sources: Iterable[str | os.PathLike], into: str | os.PathLike, skipped: dict[str, list[Skipped]] | None = None
) -> int:
    """Append to `into` (a results.jsonl) the records of `sources` it lacks, by cell key; a measured result
    replaces a `crashed`/`timeout` one. Each source is read as a sweep reads its own file (`read_results`): the lines
    that are not records are skipped, and listed in `skipped` by source when a dict is given. Returns how many
    records were added."""
    into = pathlib.Path(into)
    have = read_records(into)
    repair_tail(into)
    added = 0
    with _files.open_own(into, "a") as f:
        for src in sources:
            records, bad = read_results(src)
            if skipped is not None and bad:
                skipped[str(src)] = bad
            for key, rec in records.items():
                if not replaces(rec, have.get(key)):
                    continue
                f.write(json.dumps({k: v for k, v in rec.items() if not k.startswith("_")}) + "\n")
                have[key] = rec
                added += 1
        f.flush()
        os.fsync(f.fileno())
    return added


def check_out(out: Any) -> None:
    """An output folder is a non-empty path: `""` would write into the working directory (`wrote /matrix.json`)."""
    _files.check_folder("sweep", "out", out, "out='matrix-out' (--out matrix-out)")


class FolderBusy(RuntimeError):
    """The output folder's lock is held by another sweep: a condition of the moment, not a bad input (the same
    command works once that sweep ends)."""


class Folder:
    """The output folder, checked before any cell runs: a folder (not a file), writable, and this sweep's alone."""

    def __init__(self, out: str | os.PathLike):
        check_out(out)
        self.path = pathlib.Path(out)
        self.results = self.path / RESULTS
        self._lock = None

    def __enter__(self) -> "Folder":
        p = self.path
        if p.exists() and not p.is_dir():
            raise ConfigError(
                "sweep",
                "out",
                f"{str(p)!r} is a file, not a folder.",
                "pass a folder (created if missing), or move the file away.",
            )
        if p.is_symlink() and not p.exists():
            raise ConfigError(
                "sweep",
                "out",
                f"{str(p)!r} is a symlink to {os.readlink(p)!r}, which does not exist.",
                "create the folder it points to, or pass another folder.",
            )
        if self.results.exists() and not self.results.is_file():  # a FIFO or /dev/zero would block or never end
            raise ConfigError(
                "sweep", "out", f"{str(self.results)!r} is not a regular file.", "move it away, or pass another folder."
            )
        for name in (LOCK, RESULTS, *OUTPUTS):  # the folder's own files: never read or written through a symlink
            if (p / name).is_symlink():
                raise ConfigError(
                    "sweep",
                    "out",
                    f"{str(p / name)!r} is a symlink (to {os.readlink(p / name)!r}); the toolkit does not read or "
                    "write its own files through one.",
                    "remove the link (what it points to is left as it is), or pass another folder.",
                )
        for name in (*_BEGINS, RESULTS, LOCK):
            if not _sweeps_own(p / name):
                raise ConfigError(
                    "sweep",
                    "out",
                    f"{str(p / name)!r} exists and is not a sweep's (not as the toolkit writes that file): the sweep "
                    "would append to it, cut it or replace it.",
                    "move it away, or pass another folder.",
                )
        try:
            p.mkdir(parents=True, exist_ok=True)
            lock = _files.open_own(p / LOCK, "r+")  # a symlink planted as the lock is refused, its target untouched
        except OSError as e:
            raise ConfigError(
                "sweep", "out", f"cannot write into {str(p)!r} ({e.strerror or e}).", "pass a folder you can write to."
            ) from None
        import fcntl

        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            who = lock.read().strip() or "another process"
            lock.close()
            raise FolderBusy(
                f"another sweep is writing into {str(p)!r} ({who}). Fix: wait for it to finish, or pass another folder."
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()} on {socket.gethostname()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        lock.flush()
        self._lock = lock
        try:
            with _files.open_own(self.results, "a"):  # created if missing; never through a symlink
                pass
            said = repair_tail(self.results)
            if said:  # a torn line cut is a cell lost: said, as every line the readers skip is
                print(f"matrix: {said}", file=sys.stderr, flush=True)
            for name in OUTPUTS:  # what the sweep writes at the end, checked before the first cell runs
                target = p / name
                if target.is_dir():
                    raise IsADirectoryError(21, "Is a directory", str(target))
                if target.exists() and not os.access(target, os.W_OK):
                    raise PermissionError(13, "Permission denied", str(target))
        except OSError as e:
            self.__exit__()
            where = e.filename or str(self.results)
            raise ConfigError(
                "sweep",
                "out",
                f"cannot write {str(where)!r} ({e.strerror or e}).",
                "move it away, or pass another folder.",
            ) from None
        return self

    def append(self, rec: dict) -> None:
        _files.append_line(self.results, json.dumps(rec))  # a full disk: one line (WriteFailed), a torn line at most

    def __exit__(self, *exc) -> None:
        if self._lock is not None:
            with contextlib.suppress(OSError):
                self._lock.truncate(0)
            self._lock.close()  # closing releases the flock (so does dying: the kernel drops it)
            self._lock = None


def merge_into(out: str | os.PathLike, sources: Iterable[str | os.PathLike]) -> tuple[int, dict[str, list[Skipped]]]:
    """`merge_results` into `out/results.jsonl`, holding the folder's lock as a sweep does; each source must be a
    file. Returns how many records were added, and the lines of each source that were skipped (with why)."""
    sources = list(sources)
    for src in sources:
        if not pathlib.Path(src).is_file():
            raise ConfigError("matrix", "merge", f"{str(src)!r} is not a file.", "pass results.jsonl files.")
    skipped: dict[str, list[Skipped]] = {}
    with Folder(out) as folder:
        return merge_results(sources, folder.results, skipped), skipped
