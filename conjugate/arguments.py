"""Command-line argument types shared by the commands: a bad value is a one-line usage error (exit 2)
before any work starts. The commands check their output paths themselves (files.check_output): whether
one is safe to write depends on the inputs the command reads."""
from __future__ import annotations

import argparse
from pathlib import Path

from conjugate.errors import ConjugateError
from conjugate.files import check_output, is_file_name


def positive(text: str) -> int:
    """An integer of at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a positive integer")
    return int(text)


def output_file(text: str) -> Path:
    """A file a benchmark script writes after long work (--json): checked first (files.check_output,
    without the inputs), so that no measurement is lost to a path that cannot take it."""
    try:
        check_output("", text)
    except ConjugateError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return Path(text)


def run_name(text: str) -> str:
    """A search run's name, also its default database's file name (runs/<name>.db): 1-100 printable
    characters, no path separator, not starting with a dot."""
    if not is_file_name(text):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a run name: 1-100 printable characters, no '/' or "
                                         "'\\', not starting with '.'")
    return text
