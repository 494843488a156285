"""Which node the search expands next. MCTS by default; the search's own baselines pick differently:

    mcts     the tree policy (mcts.py): PUCT over measured rewards and the proposals' priors
    best     hill-climbing: the open node with the best reward (ties: the older node)
    uniform  a uniformly chosen open, evaluated node

A proposer names its selection in `selection` (absent: mcts). `uniform` draws from a random.Random
seeded by the run's seed and the number of evaluations done, so a seed reproduces the search and a
resumed run picks as the uninterrupted one would.
"""
from __future__ import annotations

import random

from conjugate.search.mcts import MCTS, TreeNode

SELECTIONS = ("mcts", "best", "uniform")


def select(how: str, mcts: MCTS, root: TreeNode, tree: dict[int, TreeNode], seed: int, done: int) -> list[TreeNode]:
    """The path from the root to the node to expand; [root] with root.closed when nothing is left."""
    if how == "mcts":
        return mcts.select(root)
    if how not in SELECTIONS:
        raise ValueError(f"selection {how!r}: expected one of {', '.join(SELECTIONS)}")
    candidates = sorted((n for n in tree.values() if not n.closed and n.reward is not None), key=lambda n: n.id)
    if not candidates:
        root.closed = True  # every evaluated node has offered all it had
        return [root]
    if how == "best":
        return max(candidates, key=lambda n: (n.reward, -n.id)).path()
    return random.Random(f"uniform:{seed}:{done}").choice(candidates).path()
