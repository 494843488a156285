"""Command-line argument types shared by the commands: a bad value is a one-line usage error (exit 2)
before any work starts. Output paths are checked by the commands (files.check_output): whether one
is safe to write depends on the inputs the command reads."""
from __future__ import annotations

import argparse

from conjugate.files import is_file_name


def positive(text: str) -> int:
    """An integer of at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a positive integer")
    return int(text)


def run_name(text: str) -> str:
    """A search run's name, also its default database's file name (runs/<name>.db): 1-100 printable
    characters, no path separator, not starting with a dot."""
    if not is_file_name(text):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a run name: 1-100 printable characters, no '/' or "
                                         "'\\', not starting with '.'")
    return text
