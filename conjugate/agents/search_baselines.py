"""The search's own baselines, to compare the search with at an equal budget:

    random   uniformly random valid edits, drawn from every edit the heuristic knows (unranked, equal
             priors), of a uniformly chosen evaluated node
    greedy   hill-climbing: the heuristic's ranked edits, always of the best evaluated node

Each is a proposer that names its node selection (search/selection.py) in place of MCTS.
"""
from __future__ import annotations

import random

from conjugate.agents.base import NodeContext
from conjugate.agents.heuristic import HeuristicProposer, candidates, fresh_filter
from conjugate.plan.schema import Plan


class RandomProposer(HeuristicProposer):
    name = "random"
    selection = "uniform"

    def ordered(self, plan: Plan, context: NodeContext, rng: random.Random):
        """Every distinct edit the heuristic knows, in a random order, with equal priors."""
        pool = candidates(plan, context.result, context.sms, rng, context.workload, self.measured(context))
        rng.shuffle(pool)
        fresh = fresh_filter(plan, context.tried)
        return ((cand, 1.0) for cand in pool if fresh(cand))


class GreedyProposer(HeuristicProposer):
    name = "greedy"
    selection = "best"
