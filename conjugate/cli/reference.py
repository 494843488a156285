"""docs/cli.md: every `conjugate` command's help, generated from the parser itself.

    python -m conjugate.cli.reference            # rewrite docs/cli.md
    python -m conjugate.cli.reference --check    # exit 1 where it is out of date
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from conjugate.files import write_generated

DOC_FILE = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
HEAD = """# The `conjugate` command

Generated from the parser by `python -m conjugate.cli.reference`; do not edit. Bad input (a file, a
field, an option) ends in one line naming it, on stderr, and exit status 2; a search interrupted with
Ctrl-C stops cleanly and resumes with `conjugate search --resume DB`.
"""


def _subcommands(parser: argparse.ArgumentParser):
    """(name, parser) of each subcommand, depth first, in the order they were added."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield name, sub
                for inner, deeper in _subcommands(sub):
                    yield f"{name} {inner}", deeper


def cli_reference() -> str:
    from conjugate.cli.main import build_parser

    os.environ["COLUMNS"] = "100"  # help wrapped the same on every terminal
    parser = build_parser()
    sections = [HEAD]
    for name, sub in _subcommands(parser):
        sections.append(f"## `conjugate {name}`\n\n```\n{sub.format_help().rstrip()}\n```\n")
    return "\n".join(sections)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conjugate.cli.reference", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether docs/cli.md is current")
    args = parser.parse_args(argv)
    return write_generated(DOC_FILE, cli_reference(), "python -m conjugate.cli.reference", args.check)

if __name__ == "__main__":
    sys.exit(main())
