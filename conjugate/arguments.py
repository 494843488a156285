"""Command-line argument types shared by the commands: a bad value is a one-line usage error (exit 2)
before any work starts."""
from __future__ import annotations

import argparse
from pathlib import Path

from conjugate.files import is_file_name


def positive(text: str) -> int:
    """An integer of at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a positive integer")
    return int(text)


def output_file(text: str) -> str:
    """A file to write at the end of a command: checked first, so that no long work is lost to a path
    that cannot take it (its folder missing, or a folder in its place)."""
    path = Path(text).expanduser()
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: a directory, not a file")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: its folder {path.parent} does not exist")
    return text


def run_name(text: str) -> str:
    """A search run's name, also its default database's file name (runs/<name>.db): 1-100 printable
    characters, no path separator, not starting with a dot."""
    if not is_file_name(text):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a run name: 1-100 printable characters, no '/' or "
                                         "'\\', not starting with '.'")
    return text
