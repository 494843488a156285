"""Command-line argument types shared by the commands: a bad value is a one-line usage error (exit 2)
before any work starts. Every integer option has an upper bound. The commands check their output paths
themselves (files.check_output): whether one is safe to write depends on the inputs the command reads."""
from __future__ import annotations

import argparse
import math
import re
from pathlib import Path
from typing import Callable

from conjugate.errors import ConjugateError
from conjugate.files import check_output, is_file_name
from conjugate.paths import EXAMPLES_DIR, PLANS_DIR, PROFILES_DIR

INT64_MAX = 2**63 - 1  # seeds and run ids are stored as signed 64-bit integers
MAX_COUNT = 10**9  # any count a benchmark script takes
MAX_TIME_S = 30 * 86400  # --time: a search longer than a month is resumed, not promised
MAX_TIMEOUT_S = 86400  # one request's timeout


def integer(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high]."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:  # not a number, or past the interpreter's digit limit
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not an integer in [{low}, {high}]")
        return value
    parse.__name__ = "integer"  # argparse names the type in its own messages
    return parse


positive = integer(1, MAX_COUNT)
seed = integer(0, INT64_MAX)
run_id = integer(1, INT64_MAX)


def dollars(text: str) -> float:
    """A non-negative, finite amount of US dollars, at most a million."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0 <= value <= 1e6:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not an amount of US dollars in [0, 1000000]")
    return value


def duration(text: str | None) -> float:
    """'90s', '30m', '2h' or plain seconds -> seconds, at most MAX_TIME_S; a one-line error naming --time."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text or "")
    seconds = float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)] if match else 0
    if not 0 < seconds <= MAX_TIME_S:
        raise ConjugateError(f"--time: {text!r} is not a duration like 90s, 30m or 2h, of at most "
                             f"{MAX_TIME_S // 86400} days")
    return seconds


def seconds_option(text: str, option: str, high: float = MAX_TIMEOUT_S) -> float:
    """A positive, finite number of seconds up to `high`, or a one-line error naming the option."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0 < value <= high:
        raise ConjugateError(f"{option}: {text!r} is not a number of seconds in (0, {high:g}]")
    return value


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


def shipped(folder: Path, suffix: str) -> list[str]:
    """The names of the files of a shipped folder (examples/, evaluators/, plans/), schemas left out."""
    return sorted(p.name.removesuffix(suffix) for p in folder.glob(f"*{suffix}") if not p.name.endswith(".schema.json"))


def shipped_profiles() -> list[str]:
    return shipped(PROFILES_DIR, ".toml")


def _file_or_shipped(text: str, folder: Path, suffix: str, what: str) -> str:
    """A file, or a shipped one by name (<folder>/<name><suffix>): its path. A path (a name with the
    suffix, a folder in it, or a file that exists) is taken as it is; its reader names what is wrong."""
    path = Path(text)
    if path.suffix == suffix or path.exists() or len(path.parts) != 1:
        return text
    names = shipped(folder, suffix)
    if text in names:
        return str(folder / f"{text}{suffix}")
    raise argparse.ArgumentTypeError(f"no {what} file and no shipped {what} named {text[:60]!r}; shipped: "
                                     f"{', '.join(names)}")


def workload_name_or_file(text: str) -> str:
    """A workload file, or a shipped workload by name (examples/<name>.toml)."""
    return _file_or_shipped(text, EXAMPLES_DIR, ".toml", "workload")


def plan_name_or_file(text: str) -> str:
    """A plan file, or a shipped plan by name (plans/<name>.json)."""
    return _file_or_shipped(text, PLANS_DIR, ".json", "plan")


WORKLOAD_HELP = "workload TOML file, or a shipped workload by name"
PLAN_HELP = "plan JSON file, or a shipped plan by name"


def evaluator_help(default: str = "analytical") -> str:
    return (f"evaluator profile: a shipped one ({', '.join(shipped_profiles())}) or a TOML path "
            f"(default: {default})")
