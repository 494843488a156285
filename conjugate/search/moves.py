"""Move memory: what an edit did wherever the run has already made it.

One plan edit (a "move": the same JSON patch) is often offered in many branches of one tree, since
edits commute: the draft's atomic split-K sums before a priority change or after it. MCTS values
branches, not moves, so a move that lost in one branch is tried again in the next. Measured on the
H200 (benchmarks/search/searchers_h200/), heuristic MCTS made the draft's fusion edit six times on
llama-1b-8b-b8 and seven times on llama-3b-8b-b4-ctx2k, 2-10% slower than its parent every time,
while a move that gained (the draft's atomic split-K sums) waited in other branches behind the
proposer's own ranking.

The memory keys a move by its patch and keeps its gain (child reward over parent reward, minus one)
each time it was measured. An MCTS search (`SearchSettings.move_memory`) then offers no move that
lost more than LOSS in that many branches already, and scales a remembered move's prior by how it
did elsewhere, so a move that gained in one branch is tried early in the others.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

LOSS = 0.005  # a loss larger than the spread of repeated measurements (0.1-0.6% in one process)
PRIOR_SCALE = (0.25, 4.0)  # the most a remembered move's prior is scaled down or up
GAIN_UNIT = 0.02  # a 2% mean gain scales the prior by e


def move_key(patch: list[dict]) -> str:
    """The move a patch makes, the same wherever it is applied: its operations, in path order."""
    return json.dumps(sorted(patch, key=lambda op: (op.get("path", ""), op.get("op", ""))), sort_keys=True)


@dataclass
class MoveMemory:
    gains: dict[str, list[float]] = field(default_factory=dict)

    def add(self, patch: list[dict], gain: float) -> None:
        self.gains.setdefault(move_key(patch), []).append(gain)

    def knows(self, patch: list[dict]) -> bool:
        return move_key(patch) in self.gains

    def lost_everywhere(self, patch: list[dict], times: int) -> bool:
        """Measured at least `times` times, and slower than its parent by more than LOSS each time."""
        seen = self.gains.get(move_key(patch), [])
        return times > 0 and len(seen) >= times and max(seen) < -LOSS

    def prior(self, patch: list[dict], prior: float) -> float:
        """The proposer's prior, scaled by the move's mean gain elsewhere in the run (unchanged if new)."""
        seen = self.gains.get(move_key(patch))
        if not seen:
            return prior
        low, high = PRIOR_SCALE
        return prior * min(high, max(low, math.exp(sum(seen) / len(seen) / GAIN_UNIT)))

    def note(self, patch: list[dict]) -> str:
        """A rationale's note on what the move did elsewhere in the run, or ''."""
        seen = self.gains.get(move_key(patch))
        if not seen:
            return ""
        return f" (elsewhere in this run: {sum(seen) / len(seen) * 100:+.1f}% over {len(seen)})"
