"""Reading user files with one clear error line for every way that can fail."""
from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any, Iterable

from conjugate.errors import ConjugateError

MAX_TEXT_CHARS = 16 << 20  # no input the project reads is this large: a model file or a log named by mistake
MAX_NESTING = 32  # objects, lists and tables inside one another; every file the project reads needs a few
SHOWN_CHARS = 60  # a value quoted in an error line is cut to this length
NAME_MAX = 200  # characters of a name a file gives itself (a workload's, a plan's, an evaluator profile's)


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


def read_json(path: Path, error: type[ConjugateError], what: str = "file", unique_keys: bool = False) -> Any:
    """The file's JSON value (see parse_json)."""
    return parse_json(read_text(path, error, what), path, error, unique_keys)


def read_toml(path: Path, error: type[ConjugateError], what: str = "file") -> dict[str, Any]:
    """The file's TOML tables (see parse_toml)."""
    return parse_toml(read_text(path, error, what), path, error)


def parse_json(text: str, path: Path | str, error: type[ConjugateError], unique_keys: bool = False) -> Any:
    """JSON text as Python values; malformed text, nesting past MAX_NESTING or an integer past the
    interpreter's digit limit raise `error` naming the path, and so, with `unique_keys`, does a key
    given twice in one object (JSON would keep the last silently)."""

    def unique(pairs: list[tuple[str, Any]]) -> dict:
        value = dict(pairs)
        if len(value) < len(pairs):
            seen = set()
            twice = next(key for key, _ in pairs if key in seen or seen.add(key))
            raise error(f"{path}: the key {shown_json(twice)} appears twice in one object")
        return value

    try:
        value = json.loads(text, object_pairs_hook=unique if unique_keys else None)
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


def is_shown_name(value: Any) -> bool:
    """A name that tables, titles, logs and stores show as it is: 1 to NAME_MAX printable characters (no
    control character, so no terminal escape sequence)."""
    return isinstance(value, str) and 0 < len(value) <= NAME_MAX and value.isprintable()


def shown(value: Any, limit: int = SHOWN_CHARS) -> str:
    """repr(value) for an error line, cut to `limit` characters."""
    return _cut(repr(value), limit)


def shown_json(value: Any, limit: int = SHOWN_CHARS) -> str:
    """The value as JSON for an error line, cut to `limit` characters."""
    return _cut(json.dumps(value), limit)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one file: os.path.samefile where both exist (a link or a hard link is
    the file it names), else the resolved paths compared."""
    try:
        if os.path.exists(a) and os.path.exists(b):
            return os.path.samefile(a, b)
        return Path(a).resolve() == Path(b).resolve()
    except (OSError, RuntimeError):  # a symlink loop, a name too long: not shown to be one file
        return False


def check_output(option: str, value: str | Path | None, inputs: Iterable[str | Path | None] = (),
                 files: Iterable[str] | None = None) -> None:
    """An output the user named (`option`, e.g. --json), checked before any work so that none is lost
    to it and no input is overwritten: not empty; a file whose folder exists, and where something is
    there already a regular file or a character device such as /dev/null (a pipe would block the
    writer); with `files`, a folder (or one to make) that the command writes those files into. None of
    the files written may be one of `inputs`. ConjugateError naming the option and the path otherwise."""
    if value is None:
        return
    text = str(value)
    if not text:  # Path("") is the current folder
        raise ConjugateError(f"{option}: an empty path" if option else "an empty path")
    path, where = Path(text), f"{option} {text}" if option else text
    kind = _mode(path, where)
    if files is None:
        if kind is not None and stat.S_ISDIR(kind):
            raise ConjugateError(f"{where}: a directory, not a file")
        if kind is not None and not (stat.S_ISREG(kind) or stat.S_ISCHR(kind)):
            raise ConjugateError(f"{where}: not a regular file (a pipe, socket or device)")
        folder = _mode(path.parent, where)
        if folder is None:
            raise ConjugateError(f"{where}: its folder {path.parent} does not exist")
        if not stat.S_ISDIR(folder):
            raise ConjugateError(f"{where}: {path.parent} is a file, not a folder")
        written = [path]
    else:
        above = path
        while kind is None and above != above.parent:  # up past the folders mkdir would make
            above = above.parent
            kind = _mode(above, where)
        if kind is not None and not stat.S_ISDIR(kind):
            raise ConjugateError(f"{where}: {'a file' if above == path else f'{above} is a file'}, not a folder")
        written = [path / name for name in files]
    for target in written:
        for source in inputs:
            if source is not None and same_file(target, source):
                what = "" if files is None else f"its {target.name} "
                raise ConjugateError(f"{where}: {what}would overwrite {source}, which this command reads")


def _mode(path: Path, where: str) -> int | None:
    """The file type and mode bits of what is at `path` (links followed), None where nothing is."""
    try:
        return os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:  # no permission, a name too long, a symlink loop
        raise ConjugateError(f"{where}: cannot use {path} ({e.strerror})") from None


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


def write_generated(path: Path, text: str, command: str, check: bool) -> int:
    """A file generated from the code (`command` makes it): written, or with `check` only compared with
    the committed one. Returns the exit status: 1 where `check` finds it out of date."""
    if check:
        current = path.exists() and path.read_text(encoding="utf-8") == text
        print(f"{path}: {'current' if current else f'out of date; run {command}'}")
        return 0 if current else 1
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path}")
    return 0
