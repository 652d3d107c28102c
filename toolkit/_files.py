"""The one way the toolkit writes and reads a file: atomically, and within a size it checks first.

A file the toolkit writes is written to a temporary file beside it and renamed over it: a failure (a full disk, a
kill) leaves the previous file whole and no temporary behind, and is said in one line (`WriteFailed`). A file a user
gives (a `--config`, a `results.jsonl`) must be a regular file, is read up to a cap, and its JSON within the
nesting and digit limits Python's parser enforces: each refusal is a ConfigError naming the field and the fix.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pathlib
import stat
import tempfile
from typing import Any, Iterator

from ._config import ConfigError

CONFIG_CAP = 1 << 20
"""A scenario or config file: 1 MiB (a scenario is a few KiB)."""

RECORD_CAP = 64 << 20
"""A record (a Report, one line of a results file) read whole: real ones are tens of KiB."""


def check_folder(owner: str, field: str, value: Any, example: str) -> pathlib.Path:
    """A folder a user names for the toolkit to write into: a non-empty path (`""` would write into the working
    directory), as a Path; a ConfigError naming the field otherwise. `example`: a folder to suggest."""
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value).strip():
        raise ConfigError(
            owner,
            field,
            f"{value!r} names no folder (an empty path would write into the working directory).",
            f"pass a folder, e.g. {example}.",
        )
    return pathlib.Path(value)


class WriteFailed(OSError):
    """A file could not be written; the previous one, if any, is as it was."""


def _reason(e: OSError) -> str:
    return "the disk is full" if e.errno in (errno.ENOSPC, errno.EDQUOT) else (e.strerror or str(e))


@contextlib.contextmanager
def atomic(path: str | os.PathLike, mode: str = "w") -> Iterator[Any]:
    """An open file that becomes `path` when the block ends without an error (fsync, then rename); on any error the
    temporary is removed and `path` is left as it was. An OSError comes out as `WriteFailed`, in one line."""
    path = pathlib.Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp makes the file 0600; the renamed file gets what open() would have given it (the old file's mode, or
        # 0666 less the umask), so a matrix.html stays readable by whoever served the last one.
        with os.fdopen(fd, mode) as f:
            os.fchmod(f.fileno(), _mode_for(path))
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise WriteFailed(
            e.errno, f"could not write {str(path)!r}: {_reason(e)}; the previous file is as it was"
        ) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _mode_for(path: pathlib.Path) -> int:
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        umask = os.umask(0o022)  # the only way to read it; set back at once
        os.umask(umask)
        return 0o666 & ~umask


def write_text(path: str | os.PathLike, text: str) -> None:
    """`path` holds `text`, or (on any failure) what it held before."""
    with atomic(path) as f:
        f.write(text)


def open_own(path: str | os.PathLike, mode: str = "a") -> Any:
    """A file the toolkit keeps and writes in place (a sweep's results and lock, the findings), opened only as the
    regular file it should be, created if missing: never through a symlink (`O_NOFOLLOW`), and never blocking on a
    FIFO (`O_NONBLOCK` until it is known to be a regular file). `mode`: "a" appends, "r+b" rewrites in place (a torn
    tail cut), "r+" reads and rewrites (the lock). Anything else planted there is refused as `WriteFailed`, in one
    line, and nothing outside the folder is touched."""
    flags = {"a": os.O_WRONLY | os.O_APPEND | os.O_CREAT, "r+b": os.O_RDWR, "r+": os.O_RDWR | os.O_CREAT}[mode]
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, _mode_for(pathlib.Path(path)))
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise WriteFailed(
                e.errno,
                f"{str(path)!r} is a symlink; the toolkit does not write through one. Fix: remove it (the file it "
                "points to is untouched)",
            ) from None
        if e.errno == errno.ENXIO:  # a FIFO with no reader, opened to write without blocking
            raise WriteFailed(e.errno, f"{str(path)!r} is a FIFO, not a regular file. Fix: remove it") from None
        raise WriteFailed(e.errno, f"could not open {str(path)!r}: {_reason(e)}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise WriteFailed(errno.EINVAL, f"{str(path)!r} is not a regular file (a FIFO, a device). Fix: remove it")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "r+b" if mode == "r+b" else mode if mode == "a" else "r+")


def append_line(path: str | os.PathLike, line: str) -> None:
    """One line appended and synced (`open_own`: never through a symlink). A failure leaves at most a torn last line,
    which the readers of such files skip and name; it comes out as `WriteFailed`, in one line."""
    try:
        with open_own(path, "a") as f:
            f.write(line.rstrip("\n") + "\n")
            f.flush()
            os.fsync(f.fileno())
    except WriteFailed:
        raise
    except OSError as e:
        raise WriteFailed(e.errno, f"could not append to {str(path)!r}: {_reason(e)}") from None


def read_bytes_capped(
    path: str | os.PathLike, owner: str, field: str, cap: int = CONFIG_CAP, *, name: str = ""
) -> bytes:
    """The bytes of a regular file of at most `cap` bytes, or a ConfigError on `owner.field` saying why not (no such
    file, a FIFO or device — which would block or never end — too large). `name` is how the problem calls the
    file ("it" where the caller names it already; its path by default)."""
    path = pathlib.Path(path)
    name = name or repr(str(path))
    try:
        st = os.stat(path)
    except OSError as e:
        raise ConfigError(
            owner, field, f"cannot read {name} ({e.strerror or e}).", "pass a file that exists."
        ) from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(
            owner, field, f"{name} is not a regular file (a FIFO, a device or a folder).", "pass a regular file."
        )
    if st.st_size > cap:
        raise ConfigError(
            owner, field, f"{name} holds {st.st_size} bytes, over the {cap}-byte cap.", "pass a smaller file."
        )
    try:
        with open(path, "rb") as f:
            raw = f.read(cap + 1)  # a file that grew since the stat is still read no further than the cap
    except OSError as e:
        raise ConfigError(owner, field, f"cannot read {name} ({e.strerror or e}).", "pass a readable file.") from None
    if len(raw) > cap:
        raise ConfigError(owner, field, f"{name} is over the {cap}-byte cap.", "pass a smaller file.")
    return raw


def read_head(path: str | os.PathLike, n: int) -> bytes | None:
    """The first `n` bytes of a file the toolkit wrote before (a page's stamp), or None where there is no such
    regular file: never through a symlink, never blocking on a FIFO planted in its place."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a folder opens too, and reads as an error
        os.close(fd)
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read(n)


def read_capped(path: str | os.PathLike, owner: str, field: str, cap: int = CONFIG_CAP, *, name: str = "") -> str:
    """`read_bytes_capped` as UTF-8 text (a ConfigError where it is not)."""
    raw = read_bytes_capped(path, owner, field, cap, name=name)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            owner,
            field,
            f"{name or repr(str(path))} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}).",
            "pass a JSON file.",
        ) from None


class DuplicateKey(ValueError):
    """A JSON object that gives one key twice."""

    def __init__(self, key: str):
        super().__init__(f"the key {key!r} is given twice")
        self.key = key


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`json.loads`'s `object_pairs_hook` for everything the toolkit reads: a key given twice is refused
    (`DuplicateKey`) instead of the last value winning without a word."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(key)
        out[key] = value
    return out


def loads(text: str, owner: str, field: str, *, name: str = "the text") -> Any:
    """JSON, or a ConfigError on `owner.field`: not JSON, nested too deep, an integer past Python's digit limit."""
    try:
        return json.loads(text, object_pairs_hook=unique_keys)
    except DuplicateKey as e:
        raise ConfigError(
            owner, field, f"{name} gives the key {e.key!r} twice (JSON would keep the last, silently).", "keep one."
        ) from None
    except RecursionError:
        raise ConfigError(owner, field, f"{name} is JSON nested too deep to read.", "write a flat object.") from None
    except json.JSONDecodeError as e:
        raise ConfigError(
            owner, field, f"{name} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}.", "fix the JSON."
        ) from None
    except ValueError as e:  # an integer longer than Python's digit limit (4300)
        raise ConfigError(
            owner, field, f"{name} holds {str(e).splitlines()[0][:120]}", "write smaller numbers."
        ) from None
