"""Text from outside (an LLM's rationale, a stored row) made safe to print on a terminal or in a report."""
from __future__ import annotations


def visible(text: str) -> str:
    """The text on one line: runs of whitespace (newlines included) become one space, and every other
    character that is not printable (escape sequences, control and format characters) is written as
    its escape, e.g. \\x1b, so a terminal shows it instead of obeying it."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in " ".join(str(text).split()))
