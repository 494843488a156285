"""Move memory: what an edit did wherever the run has already made it.

One plan edit (a "move": the same JSON patch) is often offered in many branches of one tree, since
edits commute. MCTS values branches, not moves, so a move that lost in one branch is tried again in
the next (measured: search/facts.toml, `moves_repeated`).

The memory keys a move by its patch and keeps its gain (child reward over parent reward, minus one)
each time it was measured. An MCTS search (`SearchSettings.move_memory`) then offers no move that
lost more than LOSS in that many branches already, and scales a remembered move's prior by how it
did elsewhere, so a move that gained in one branch is tried early in the others.

The proposer need not offer that move again where it would help (`moves_carried`), so each
expansion also carries the move that gained most elsewhere (`winners`: a mean gain over WIN) to the
node being expanded, where it applies and is new there.

Nor does any single move carry the small gains (`moves_merged`): an expansion also offers every move
that gained in the run (`gainers`: a mean gain over MERGE_GAIN and no clear loss where it was
measured) applied together, as one plan (`merged`): edits commute, so their gains compose, and one
evaluation tells whether they do here. Where they do not (`merges_charged`), the moves of a merge
that lost (made there or carried) join no later merge (`charge`; a move all of whose operations a
lost merge made counts as one of its moves).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Callable

from conjugate.agents.base import Proposal
from conjugate.errors import PatchError, PlanError
from conjugate.evaluate.result import EvalResult
from conjugate.plan import Plan, patch_plan
from conjugate.search.runs import reward_of
from conjugate.search.store import NodeRecord

LOSS = 0.005  # a loss larger than the spread of repeated measurements (0.1-0.6% in one process)
WIN = 0.01  # a mean gain clearly larger than that spread: worth carrying to other branches
MERGE_GAIN = 0.002  # a mean gain over this (and no loss over LOSS): merged with the run's other gains
PRIOR_SCALE = (0.25, 4.0)  # the most a remembered move's prior is scaled down or up
GAIN_UNIT = 0.02  # a 2% mean gain scales the prior by e
CARRIED = "gained elsewhere in this run, so made here too: "  # a carried move's rationale starts so
MERGE_SUFFIX = "+merge"  # a merge's node is recorded as its proposer's name and this (merged)
SEEDED = ("seed", "warm-start")  # the proposers of a run's first plans, which no move made


def move_key(patch: list[dict]) -> str:
    """The move a patch makes, the same wherever it is applied: its operations, in path order."""
    return json.dumps(sorted(patch, key=lambda op: (op.get("path", ""), op.get("op", ""))), sort_keys=True)


@dataclass(frozen=True)
class Move:
    patch: list[dict]
    kind: str  # its edit kind, as first proposed
    rationale: str  # why it was first proposed
    gain: float  # its mean gain wherever it was measured


@dataclass
class MoveMemory:
    gains: dict[str, list[float]] = field(default_factory=dict)
    made: dict[str, tuple[list[dict], str, str]] = field(default_factory=dict)  # key -> patch, kind, rationale
    in_lost_merge: set[str] = field(default_factory=set)  # moves made by a merge that lost (charge)
    merges: set[str] = field(default_factory=set)  # the moves that are merges of others (the search's record)

    def add(self, patch: list[dict], gain: float, kind: str = "other", rationale: str = "") -> None:
        key = move_key(patch)
        self.gains.setdefault(key, []).append(gain)
        self.made.setdefault(key, (patch, kind, rationale))

    def winners(self) -> list[Move]:
        """The moves whose mean gain is over WIN, the largest first (ties: the first made first)."""
        moves = [Move(*self.made[key], sum(seen) / len(seen)) for key, seen in self.gains.items()]
        return sorted((m for m in moves if m.gain > WIN), key=lambda m: -m.gain)

    def gainers(self) -> list[Move]:
        """The moves whose mean gain is over MERGE_GAIN and that never lost more than LOSS, alone or in
        a merge (charge), the largest gain first (ties: the first made first)."""
        moves = [Move(*self.made[key], sum(seen) / len(seen)) for key, seen in self.gains.items()
                 if min(seen) >= -LOSS and key not in self.in_lost_merge]
        return sorted((m for m in moves if m.gain > MERGE_GAIN), key=lambda m: -m.gain)

    def charge(self, merge: list[dict], gain: float) -> None:
        """What a merge (several moves in one patch) did: where it lost more than LOSS, every move all of
        whose operations it made joins no later merge, since one of them does not combine with the rest
        there and the memory cannot tell which (each may still be proposed or carried alone)."""
        if gain >= -LOSS:
            return
        ops = {json.dumps(op, sort_keys=True) for op in merge}
        for key, (patch, _, _) in self.made.items():
            if key != move_key(merge) and all(json.dumps(op, sort_keys=True) in ops for op in patch):
                self.in_lost_merge.add(key)

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


def touched(patch: list[dict]) -> list[tuple[str, bool]]:
    """The plan paths a patch writes or moves from, each with whether it only appends to a list (`add` at
    `.../-`); a `copy` reads its `from`, which counts as touched too, so that no other patch of a merge
    changes it."""
    out = []
    for op in patch:
        path = op.get("path", "")
        out.append((path[:-2], True) if op.get("op") == "add" and path.endswith("/-") else (path, False))
        if op.get("op") in ("move", "copy") and isinstance(op.get("from"), str):
            out.append((op["from"], False))
    return out


def conflict(a: list[dict], b: list[dict]) -> bool:
    """Whether two patches write the same part of a plan (one path inside or equal to the other), so
    that applying both would undo one; appends to one list never conflict with each other."""
    def inside(p: str, q: str) -> bool:
        return p == q or p.startswith(q + "/")
    return any((inside(p, q) or inside(q, p)) and not (p == q and append_p and append_q)
               for p, append_p in touched(a) for q, append_q in touched(b))


def move_memory(nodes: list[NodeRecord], results: dict[str, EvalResult], charge_merges: bool) -> MoveMemory | None:
    """What each move of the run (`nodes`, `results`: plan hash -> result) did where it was measured,
    or None while no move was measured."""
    hashes = {n.id: n.plan_hash for n in nodes}
    memory, measured = MoveMemory(), []
    for n in nodes:
        if n.parent_id is None or n.proposer in SEEDED or not n.edit:
            continue
        child, parent = results.get(n.plan_hash), results.get(hashes[n.parent_id])
        if child is not None and parent is not None and reward_of(parent) > 0:
            gain = reward_of(child) / reward_of(parent) - 1
            memory.add(n.edit, gain, n.edit_kind, n.rationale)
            measured.append((n.edit, gain))
    memory.merges = {move_key(n.edit) for n in nodes if n.edit and n.proposer.endswith(MERGE_SUFFIX)}
    for patch, gain in measured:  # once every move is known; a merge carried elsewhere is the same move
        if charge_merges and move_key(patch) in memory.merges:
            memory.charge(patch, gain)
    return memory if memory.gains else None


def _top(proposals: list[Proposal]) -> float:
    return max((p.prior for p in proposals if p.prior is not None), default=1.0)


def carried(memory: MoveMemory, plan: Plan, here: set[str], proposals: list[Proposal]) -> list[Proposal]:
    """The proposals, led by the move that gained most elsewhere in the run where it applies to `plan`
    (the node's), changes it, and is neither proposed nor tried here yet (`here`: the hashes of the
    node's plan and its children's)."""
    offered = {move_key(p.patch) for p in proposals}
    for move in memory.winners():
        if move_key(move.patch) in offered:
            continue
        try:
            if patch_plan(plan, move.patch).hash in here | {plan.hash}:
                continue
        except (PatchError, PlanError):
            continue
        made = Proposal(move.patch, f"{CARRIED}{move.rationale}" + memory.note(move.patch), move.kind,
                        memory.prior(move.patch, _top(proposals)))
        return [made] + proposals
    return proposals


def _lineage(node: NodeRecord, nodes: dict[int, NodeRecord]) -> list[list[dict]]:
    """The edits that made `node`, from it up to the root (seeds excluded)."""
    edits = []
    while node is not None:
        edits += [node.edit] if node.edit and node.proposer not in SEEDED else []
        node = nodes.get(node.parent_id)
    return edits


def merged(memory: MoveMemory, parent: NodeRecord, plan: Plan, nodes: dict[int, NodeRecord],
           proposals: list[Proposal]) -> list[Proposal]:
    """The proposals, led by one plan making every move that gained in the run (gainers, the largest
    gain first) that applies to `parent` (its plan `plan`), changes its plan and writes nothing that an
    earlier one or an edit on the node's own path wrote; offered where it holds two moves or more and
    is new to the run (`nodes`: the run's, by id). A proposal making one of its moves alone is dropped
    (the merge holds it). The merge's move is added to memory.merges."""
    lineage = _lineage(parent, nodes)  # a merge adds to them, never undoes one
    together, made, patch = plan, [], []
    for move in memory.gainers():
        if any(conflict(move.patch, m) for m in lineage + [m.patch for m in made]):
            continue
        try:
            after = patch_plan(together, move.patch)
        except (PatchError, PlanError):
            continue
        if after.hash != together.hash:
            together, made, patch = after, made + [move], patch + move.patch
    if len(made) < 2 or together.hash in {n.plan_hash for n in nodes.values()}:
        return proposals
    try:  # the moves one after another made what the patch makes at once: checked, not assumed
        if patch_plan(plan, patch).hash != together.hash:
            return proposals
    except (PatchError, PlanError):
        return proposals
    memory.merges.add(move_key(patch))
    keys = {move_key(m.patch) for m in made}
    gains = ", ".join(f"{m.gain * 100:+.1f}%" for m in made)
    rationale = (f"the {len(made)} moves that gained in this run, together ({gains} where made): "
                 + "; ".join(m.rationale.removeprefix(CARRIED).split(" (elsewhere")[0][:80] for m in made))
    return [Proposal(patch, rationale, made[0].kind, _top(proposals))] + \
        [p for p in proposals if move_key(p.patch) not in keys]


def remembered(proposals: list[Proposal], memory: MoveMemory, times: int,
               skipped: Callable[[Proposal], None]) -> list[Proposal]:
    """The proposals without moves that lost everywhere they were made (`times` times at least; each
    told to `skipped`), the others' priors scaled by how they did elsewhere (best first)."""
    given = [p.prior for p in proposals if p.prior is not None]
    default = sum(given) / len(given) if given else 1.0  # as MCTS.priors fills a missing prior
    kept = []
    for p in proposals:
        if memory.lost_everywhere(p.patch, times):
            skipped(replace(p, rationale=p.rationale + memory.note(p.patch)))
        elif memory.knows(p.patch):  # priors are normalised per expansion: no cap needed
            kept.append(replace(p, prior=memory.prior(p.patch, p.prior if p.prior is not None else default),
                                rationale=p.rationale + memory.note(p.patch)))
        else:
            kept.append(p)
    return sorted(kept, key=lambda p: -(p.prior if p.prior is not None else default))
