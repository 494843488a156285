"""One home for the files the package ships and the names it knows them by: the plan library,
evaluator profiles, example workloads, the agent's prompts and prices. In a checkout they are the
top-level folders people edit (plans/, evaluators/, examples/, search/); an installed wheel carries
the same files as package data."""
from __future__ import annotations

from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent

PLANS_DIR = _ROOT / "plans"
PLAN_SCHEMA_FILE = PLANS_DIR / "plan.schema.json"
PROFILES_DIR = _ROOT / "evaluators"
EXAMPLES_DIR = _ROOT / "examples"
DEFAULT_WORKLOAD = EXAMPLES_DIR / "tiny.toml"
PROMPTS_DIR = _ROOT / "search" / "prompts"
PRICES_FILE = _ROOT / "search" / "prices.toml"
RUNS_DIR = Path("runs")  # run databases and exports, under the current directory

BASELINE_PLANS = ("sequential", "streams")  # this project's own baselines (conventional is torch's)
SEED_PLANS = ("sequential", "streams", "interleave")  # a search's root and its first children
REWARD_BASELINE = "sequential"  # a plan's reward is its speedup over this baseline


def shipped_plan(name: str) -> Path:
    """A plan of the shipped library by name: plans/<name>.json."""
    return PLANS_DIR / f"{name}.json"
