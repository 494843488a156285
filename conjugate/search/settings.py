"""A search's settings (stored with its run, read back on a resume) and the evaluator id that keys its
evaluations."""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, fields
from typing import Any

# The largest value each count or amount may take: a run stores its settings and a resume reads them
# back, so a setting past these is a damaged store or a typing slip, not a search anyone runs.
LIMITS: dict[str, float] = {
    "budget": 100_000, "expand_width": 64, "c_puct": 100.0, "behind_margin": 1.0, "deepen_margin": 1.0,
    "best_weight": 1.0, "frontier_width": 10_000, "exploit_every": 100_000, "exploit_last": 1.0,
    "move_memory": 10_000, "warm_start": 100, "stale_after_s": 30 * 86_400.0,
}
AT_LEAST_ONE = ("budget", "expand_width")


@dataclass(frozen=True)
class SearchSettings:
    budget: int = 20  # evaluations in the run, seeds included
    expand_width: int = 3  # edits asked for per expansion
    c_puct: float = 0.7
    behind_margin: float = 0.05  # a branch this far under the best reward is not expanded (mcts.py)
    deepen_margin: float = 0.005  # a node outgained by this much by an open branch is not widened (mcts.py)
    best_weight: float = 1.0  # a branch's value: its best reward (1) or blended with its mean (mcts.py)
    deepen_first: bool = False  # MCTS: once a child gains by deepen_margin, its unmeasured siblings wait
    frontier_width: int = 0  # MCTS: a node none of whose children gained is widened up to this many (0: no cap)
    exploit_every: int = 0  # MCTS: every this many expansions, the run's best open node is widened instead (0: off)
    exploit_last: float = 0.25  # MCTS: over this share of the budget's end, the run's best open node is widened
    move_memory: int = 2  # with MCTS, a move that lost in this many branches is not offered again (moves.py); 0: off
    merge_moves: bool = True  # with move memory, each expansion also offers the run's gains together (moves.py)
    charge_merges: bool = True  # and the moves of a merge that lost join no later merge (moves.py)
    warm_start: int = 2  # best plans of earlier runs seeded (same evaluator; this model family first)
    stale_after_s: float = 1800.0  # a "running" evaluation older than this is taken over
    evaluator_profile: str = ""  # the profile file the run scores with: a resume loads it again
    evaluator_id: str = ""  # its evaluator_id(): the evaluations' key
    base_url: str = ""  # the LLM server the agent used (--base-url), for a resume

    def __post_init__(self) -> None:
        kinds = {"int": int, "float": (int, float), "str": str, "bool": bool}
        for f in fields(self):
            value, kind = getattr(self, f.name), kinds[f.type]
            if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
                raise ValueError(f"search setting {f.name!r} is {value!r}, not of type {f.type}")
            if f.name in LIMITS:
                _check_range(f.name, value)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SearchSettings":
        """The settings a run stored; a field this version does not know is dropped, one it lacks
        takes its default, one of the wrong type or out of range (LIMITS) is refused (ValueError)."""
        known = {f.name for f in fields(cls)}
        # runs stored before these settings: without them (the rest of the tree policy is this version's)
        stored_before = {"behind_margin": 0.0, "move_memory": 0, "deepen_margin": 0.0, "best_weight": 0.5,
                         "merge_moves": False, "charge_merges": False, "exploit_last": 0.0}
        return cls(**(stored_before | {k: v for k, v in data.items() if k in known}))


def _check_range(name: str, value: float) -> None:
    least, most = (1 if name in AT_LEAST_ONE else 0), LIMITS[name]
    if not (math.isfinite(value) and least <= value <= most):
        raise ValueError(f"search setting {name!r} is {value!r}, not a number from {least} to {most:g}")


def evaluator_id(profile) -> str:
    """The profile's name and a digest of its settings: a re-calibrated or edited profile scores
    afresh instead of reusing results of its earlier constants. A measured profile names the GPU it
    measures on (`device`), so its results never stand for another GPU's."""
    settings = {k: v for k, v in profile.to_dict().items() if k != "source" and not (k == "device" and not v)}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return f"{profile.name}@{digest}"
