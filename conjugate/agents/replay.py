"""The replay proposer: proposes exactly the edits a recorded run made, in the order it made them.

Each record is {"parent_hash", "patch", "rationale", "kind", "proposer"}. Asked to expand a node,
it returns the recorded edits of that node's plan that it has not returned yet, at most n of them,
so replaying a run's records through the same search reproduces the run's tree.
"""
from __future__ import annotations

from conjugate.agents.base import NodeContext, Proposal


class ReplayProposer:
    name = "replay"

    def __init__(self, records: list[dict]):
        self._by_parent: dict[str, list[dict]] = {}
        for record in records:
            self._by_parent.setdefault(record["parent_hash"], []).append(record)

    def propose(self, context: NodeContext, n: int) -> list[Proposal]:
        pending = self._by_parent.get(context.plan_hash, [])
        taken, self._by_parent[context.plan_hash] = pending[:max(n, 0)], pending[max(n, 0):]
        return [Proposal(patch=r["patch"], rationale=r.get("rationale", ""), kind=r.get("kind") or "other")
                for r in taken]

    def remaining(self) -> int:
        """Recorded edits not returned yet."""
        return sum(len(v) for v in self._by_parent.values())
