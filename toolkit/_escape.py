"""One escaper per output kind (the terminal, Markdown, HTML, file names) for any text from a record, file or user.

A character no output may show as itself is one rule (`unsafe`): a control character (a NUL, an ESC colour code, a
newline inside a name), a format character (a right-to-left override that reverses what follows, a zero-width
joiner) or a lone surrogate (which cannot even be encoded to print).
"""

from __future__ import annotations

import html as _html
import re
import unicodedata

UNSAFE = {"Cc": "control", "Cf": "format (invisible or reordering)", "Cs": "lone surrogate"}
"""The Unicode categories no output shows as themselves, each with the name a refusal gives it."""


def unsafe(c: str) -> bool:
    """`c` may not be shown as itself: Unicode category Cc (controls), Cf (format: bidi overrides), Cs (surrogates)."""
    return unicodedata.category(c) in UNSAFE


def terminal(text: str, *, lines: bool = False) -> str:
    """`text` for a terminal line: every unsafe character escaped (`\\x1b`, `\\u202e`, `\\ud800`), the rest as is;
    `lines=True` keeps line breaks (text the toolkit printed over several lines)."""
    keep = "\n" if lines else ""
    return "".join(c if not unsafe(c) or c in keep else _escaped(c) for c in text)


def _escaped(c: str) -> str:
    """`\\x1b`, `\\u202e`, `\\ud800`: how a character no output shows as itself is written out."""
    return c.encode("unicode_escape", "backslashreplace").decode("ascii")


def markdown(text: str) -> str:
    """`text` as inert Markdown, on one line: no unsafe character, HTML escaped (no `<script>`, no `<img onerror>`,
    no `<javascript:…>` autolink), and the characters that make a link, an image, code or a table cell backslashed
    (no `[…](javascript:…)` or `data:` target; a pipe stays in its cell). Emphasis characters are left: they change
    no target and labels hold them (`for_loop`, `compile(AC(x))`)."""
    one_line = " ".join("".join(" " if unsafe(c) else c for c in str(text)).split())
    return re.sub(r"([\\`\[\]|])", r"\\\1", _html.escape(one_line, quote=False))


def html(text: str) -> str:
    """`text` as HTML text or an attribute value: escaped, quotes included, unsafe characters as on a terminal."""
    return _html.escape(terminal(str(text)), quote=True)


def file_name(text: str, default: str) -> str:
    """`text` as one file name inside a folder the toolkit writes into: letters, digits, `.`, `_` and `-` only (runs
    of anything else become one `_`), no leading or trailing `.`, `_` or `-` (so never `..`, a hidden file or an
    option), lower case, at most 60 characters; `default` when nothing is left. A name can never climb out of its
    folder, hide, or differ only by case from another on a case-insensitive disk."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", str(text)).strip("._-")[:60].strip("._-")
    return safe.lower() or default


def terminal_width(default: int) -> int:
    """The terminal's width in columns (`default` when it is not a terminal), between 20 and 1000: COLUMNS is the
    user's to set, to anything, and a table is laid out to what a terminal can hold, not to what it says."""
    import shutil

    return min(max(shutil.get_terminal_size((default, 24)).columns, 20), 1000)


__all__ = ["UNSAFE", "file_name", "html", "markdown", "terminal", "terminal_width", "unsafe"]
