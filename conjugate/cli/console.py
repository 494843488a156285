"""Where the commands print: `out` (stdout) for results, `err` (stderr) for progress of long work."""
from __future__ import annotations

import sys

from rich.console import Console

# no markup: names and paths from files, flags and stores are printed as they are (a "[/]" in one is text)
out = Console(highlight=False, markup=False, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, highlight=False, markup=False, soft_wrap=True)  # a notice stays one line in a log


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def minutes(seconds: float) -> str:
    """A duration as m:ss."""
    whole = int(seconds)
    return f"{whole // 60}:{whole % 60:02d}"
