"""Reading user files with one clear error line for every way that can fail."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from conjugate.errors import ConjugateError


def read_text(path: Path, error: type[ConjugateError], what: str = "file") -> str:
    """The file's text, or `error` naming the path: missing, a directory, unreadable, not UTF-8."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise error(f"{path}: no such {what}") from e
    except IsADirectoryError as e:
        raise error(f"{path}: is a directory, expected a {what}") from e
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from e
    except OSError as e:
        raise error(f"{path}: cannot read ({e.strerror})") from e


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
