"""One home for the files the package ships and the names it knows them by: the plan library,
evaluator profiles, example workloads, the agent's prompts and prices.

They are the top-level folders people edit (plans/, evaluators/, examples/, search/). A wheel (or
`pip install .`) carries them inside the package as conjugate/_data/<folder> (the package-dir
mapping in pyproject.toml); in a checkout, the source tree or an editable install, they are read
where they are, beside the package. Either way they are found from the package's own location
through importlib.resources, never from the current directory."""
from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def _data_root() -> Path:
    """The folder holding plans/, evaluators/, examples/ and search/: the installed package's
    _data/ when it has one (a wheel), otherwise the checkout the package lies in."""
    package = Path(str(files("conjugate")))
    shipped = package / "_data"
    return shipped if shipped.is_dir() else package.parent


DATA_ROOT = _data_root()
PLANS_DIR = DATA_ROOT / "plans"
PLAN_SCHEMA_FILE = PLANS_DIR / "plan.schema.json"
PROFILES_DIR = DATA_ROOT / "evaluators"
EXAMPLES_DIR = DATA_ROOT / "examples"
DEFAULT_WORKLOAD = EXAMPLES_DIR / "tiny.toml"
PROMPTS_DIR = DATA_ROOT / "search" / "prompts"
PRICES_FILE = DATA_ROOT / "search" / "prices.toml"
FACTS_FILE = DATA_ROOT / "search" / "facts.toml"  # measured effects of plan edits per GPU model (agents/facts.py)
TILES_FILE = DATA_ROOT / "search" / "tiles.json"  # GEMM tiles measured fastest per GPU model (agents/heuristic/tile_table.py)
RUNS_DIR = Path("runs")  # run databases and exports, under the current directory

BASELINE_PLANS = ("sequential", "streams")  # this project's own baselines (conventional is torch's)
SEED_PLANS = ("sequential", "streams", "interleave")  # a search's root and its first children
REWARD_BASELINE = "sequential"  # a plan's reward is its speedup over this baseline


def shipped_plan(name: str) -> Path:
    """A plan of the shipped library by name: plans/<name>.json."""
    return PLANS_DIR / f"{name}.json"


def plan_path(name_or_file: str) -> Path:
    """What a `--plan` argument names: a JSON file, or a shipped plan by name."""
    path = Path(name_or_file)
    return path if path.suffix == ".json" or path.exists() else shipped_plan(name_or_file)
