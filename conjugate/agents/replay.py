"""The replay proposer: proposes exactly the edits a recorded run made, in the order it made them.

Each record is {"parent_hash", "patch", "rationale", "kind", "proposer", "prior"}. Asked to expand
a node, it returns the recorded edits of that node's plan that it has not returned yet, at most n of
them, with the priors the search gave them, so replaying a run's records through the same search
reproduces the run's tree. Records do not say which edits came in one expansion: where the recorded
run expanded one node several times with fewer than n edits, a replay can group them differently
and the trees part from there (long runs).
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
        return [Proposal(patch=r["patch"], rationale=r.get("rationale", ""), kind=r.get("kind") or "other",
                         prior=r.get("prior")) for r in taken]
