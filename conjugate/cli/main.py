"""`conjugate ...`: the command-line entry point. Bad input ends in one line on stderr and exit 2."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from conjugate.errors import ConjugateError
from conjugate.secrets import scrub


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line (the command's --help has the rest)."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {scrub(message)} (see: {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    from conjugate import __version__
    from conjugate.cli import bench, calibrate, check, generate, models, plan, profile, search, serve, show

    parser = Parser(prog="conjugate", description="Compile the draft and target models of speculative decoding "
                    "together.")
    parser.add_argument("--version", action="version", version=f"conjugate {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (check, models, bench, calibrate, plan, search):
        group.add_command(sub)
    show.add_commands(sub)
    for group in (generate, serve, profile):
        group.add_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status = args.func(args)
    except ConjugateError as e:
        print(f"error: {scrub(str(e))}", file=sys.stderr)
        return 2
    except OSError as e:  # writing outputs: a path that is not a directory, no permission, a full disk
        why = e.strerror or str(e)
        if isinstance(e, FileExistsError) and e.filename and not Path(e.filename).is_dir():
            why = "a file where a folder is needed"  # mkdir over a file, or a file as a parent folder
        print(f"error: {e.filename or ''}: {why}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return status or 0


if __name__ == "__main__":
    sys.exit(main())
