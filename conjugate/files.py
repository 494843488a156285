"""Reading user files with one clear error line for every way that can fail."""
from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

from conjugate.errors import ConjugateError

MAX_TEXT_CHARS = 16 << 20  # no input the project reads is this large: a model file or a log named by mistake
MAX_NESTING = 32  # objects, lists and tables inside one another; every file the project reads needs a few
SHOWN_CHARS = 60  # a value quoted in an error line is cut to this length


def read_text(path: Path, error: type[ConjugateError], what: str = "file") -> str:
    """The file's text, or `error` naming the path: missing, a directory or not a regular file (a pipe
    would block the reader), unreadable, not UTF-8, too large."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a pipe opens without a writer
        kind = os.fstat(fd).st_mode
        if not stat.S_ISREG(kind):
            os.close(fd)
            if stat.S_ISDIR(kind):
                raise IsADirectoryError(path)
            raise error(f"{path}: not a regular file (a pipe, socket or device), expected a {what}")
        with os.fdopen(fd, encoding="utf-8") as f:
            text = f.read(MAX_TEXT_CHARS + 1)
    except FileNotFoundError as e:
        raise error(f"{path}: no such {what}") from e
    except IsADirectoryError as e:
        raise error(f"{path}: is a directory, expected a {what}") from e
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from e
    except OSError as e:
        raise error(f"{path}: cannot read ({e.strerror})") from e
    if len(text) > MAX_TEXT_CHARS:
        raise error(f"{path}: larger than {MAX_TEXT_CHARS >> 20} MiB, which no {what} is")
    return text


def check_table(table: Any, where: str, fields: tuple[str, ...], texts: tuple[str, ...]) -> dict:
    """A table of a data file checked: an object holding none but `fields`, those in `texts` non-empty
    strings. ConjugateError naming `where` and the field otherwise."""
    if not isinstance(table, dict):
        raise ConjugateError(f"{where}: should be a table, got {shown(table)}")
    for key in table:
        if key not in fields:
            raise ConjugateError(f"{where}: unknown field {key!r}")
    for key in texts:
        if not isinstance(table.get(key), str) or not table[key].strip():
            raise ConjugateError(f"{where}: field {key!r} should be a non-empty string, got {shown(table.get(key))}")
    return table


def read_json(path: Path, error: type[ConjugateError], what: str = "file") -> Any:
    """The file's JSON value (see parse_json)."""
    return parse_json(read_text(path, error, what), path, error)


def read_toml(path: Path, error: type[ConjugateError], what: str = "file") -> dict[str, Any]:
    """The file's TOML tables (see parse_toml)."""
    return parse_toml(read_text(path, error, what), path, error)


def parse_json(text: str, path: Path | str, error: type[ConjugateError]) -> Any:
    """JSON text as Python values; malformed text, nesting past MAX_NESTING or an integer past the
    interpreter's digit limit raise `error` naming the path."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{path}: malformed JSON at line {e.lineno} column {e.colno}: {e.msg}") from e
    except (RecursionError, ValueError) as e:
        raise error(f"{path}: malformed JSON: {_parse_failure(e)}") from e
    check_nesting(value, path, error)
    return value


def parse_toml(text: str, path: Path | str, error: type[ConjugateError]) -> dict[str, Any]:
    """TOML text as Python values, with the checks of parse_json."""
    try:
        value = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise error(f"{path}: malformed TOML: {e}") from e
    except (RecursionError, ValueError) as e:  # an impossible date or time is a ValueError too
        raise error(f"{path}: malformed TOML: {_parse_failure(e)}") from e
    check_nesting(value, path, error)
    return value


def _parse_failure(e: Exception) -> str:
    if isinstance(e, RecursionError):
        return f"nested deeper than {MAX_NESTING} levels"
    if "integer string conversion" in str(e):
        return f"an integer of more than {sys.get_int_max_str_digits()} digits"
    return (str(e).splitlines() or [type(e).__name__])[0]


def check_nesting(value: Any, path: Path | str, error: type[ConjugateError]) -> None:
    """Walks the value without recursion: anything nested deeper than MAX_NESTING is refused, and so
    is a string that cannot be written out (JSON's escapes allow half of a UTF-16 surrogate pair)."""
    pending = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, str):
            _check_encodable(item, path, error)
        elif isinstance(item, (dict, list)):
            if depth >= MAX_NESTING:
                raise error(f"{path}: nested deeper than {MAX_NESTING} levels")
            children = [*item, *item.values()] if isinstance(item, dict) else item
            pending.extend((child, depth + 1) for child in children)


def _check_encodable(text: str, path: Path | str, error: type[ConjugateError]) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise error(f"{path}: the string {shown(text)} holds {e.reason}") from e


def is_file_name(value: Any) -> bool:
    """A name that becomes a file's name in a known folder: 1-100 printable characters, no path
    separator, not starting with a dot (so never '..' or a hidden file)."""
    return isinstance(value, str) and 0 < len(value) <= 100 and value.isprintable() and not (
        "/" in value or "\\" in value or value.startswith("."))


def shown(value: Any, limit: int = SHOWN_CHARS) -> str:
    """repr(value) for an error line, cut to `limit` characters."""
    return _cut(repr(value), limit)


def shown_json(value: Any, limit: int = SHOWN_CHARS) -> str:
    """The value as JSON for an error line, cut to `limit` characters."""
    return _cut(json.dumps(value), limit)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def write_output(path: str | Path, text: str) -> None:
    """Write a file the user named (--json); a failure names it (a full disk says which file)."""
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(path)) from None


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file beside it: a concurrent reader, or a crash,
    never leaves half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
