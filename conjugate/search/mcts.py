"""Monte Carlo tree search over the plan tree: PUCT selection with progressive widening.

Each node is a plan; its children are edits a proposer suggested. A search step selects a path
from the root, expands its last node with a few new children, evaluates them and backpropagates
each child's reward along the path. Rewards are non-negative (speedup ratios; failures are 0).

    max_children(n) = ceil(widen_c * (visits(n) + 1) ** widen_alpha)
    score(p, c)     = Q(p, c) + c_puct * prior(c) * sqrt(max(1, visits(p))) / (1 + visits(c))
    value(c)        = (1 - best_weight) * mean(c) + best_weight * best(c)
    Q(p, c)         = 1/2 + 1/2 * (value(c) - reward(p)) / (largest sibling value - reward(p))  a gain
                      1/2 - 1/2 * (reward(p) - value(c)) / (reward(p) - least sibling value)  a loss
                      (each scale at least deepen_margin * reward(p): noise stays near 1/2)

Value blends the subtree's mean reward with its best one: the search wants the best plan, not the
best average, and a branch whose edits often fail (reward 0) may still hold it. The search uses the
best alone (SearchSettings.best_weight 1): an edit that fails where it is made (up to two plans in
a 40-evaluation run on the H200) says nothing of the branch's speed, yet one failure among four
plans cuts the mean by a quarter, far more than the few percent a branch's plans differ by. Q scales
it against the parent's own reward, gains and losses apart (as MuZero scales between the least and
largest values seen, but per node): the edits of one plan differ by a few percent, a range that a
scale from 0 to the largest reward would squeeze to a few hundredths of Q, where the priors' term
decides alone. Measured on the H200 (llama-1b-8b-b8, 2026-12-02), that is how a search spent its
budget on a child that gained 0.5% while its sibling that gained 3.8% waited. Gains and losses are
scaled apart so that one edit far slower (a tile edit measured 32% slower than its parent on
llama-3b-8b-b4-ctx2k) does not squeeze its siblings' gains of a percent or two together again. A
child whose subtree never passed (best 0) has Q 0 and stretches no scale.

Clearly behind (`behind_margin`, a fraction of the best reward): a branch whose best reward so far
is that far under the run's best is not descended into while a sibling branch that is not behind
can be, and a node whose own reward is behind gets no new children while one of its branches is
still in the running. A small budget goes where the measurements point; a behind branch comes
back only when nothing else is open (and a run with margin 0 never prunes).

Deepen past a gain (`deepen_margin`): a node one of whose open branches holds a plan faster than the
node by more than the margin gets no new child; the new edits go below the gain instead. Plan edits
mostly commute (the draft's atomic split-K sums gain before or after a tile change), so an edit
tried beside a gain would have to be made again below it to combine with it. For the same reason a
node none of whose children gained (the frontier) is widened whatever its visits, rather than
descended into a child that lost, until it holds `frontier_width` children (0: no cap); then it is
widened by visits like any node, and the search descends into its best child. Without the cap a node
whose edits each gain a little less than the margin (llama-3b-8b-b4-ctx2k on the H200: seven of its
21 children gained 0.01-0.34% over it) took the second half of a 40-evaluation run, while greedy
hill-climbing chained such gains. On the surrogate (benchmarks/README.md) a cap of six moved nothing
beyond the seeds' spread, so the search leaves it off (SearchSettings.frontier_width 0). A node
whose gaining branches are exhausted is widened by visits as before. Greedy hill-climbing widens
only the single best node; MCTS keeps every branch in play and descends by PUCT, where a gaining
branch has the highest Q (a loser with a high prior may still be chosen: exploration).

First-play urgency: a child not visited yet takes its parent's own reward as its value, so a fresh
child counts as no gain: it is tried before a sibling that lost, after one that gained, unless its
prior says otherwise. The exploration term uses sqrt(max(1, visits)) so priors order the children of
a node visited once or never.
Everything here is in memory and deterministic: ties go to the lowest node id.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(eq=False)
class TreeNode:
    id: int
    parent: TreeNode | None = field(default=None, repr=False)
    prior: float = 1.0
    visits: int = 0
    value_sum: float = 0.0
    best: float = 0.0  # the largest reward backpropagated through this node
    children: list[TreeNode] = field(default_factory=list, repr=False)
    reward: float | None = None  # this node's own evaluation; None: not evaluated
    closed: bool = False  # the proposer had nothing more to offer

    @property
    def mean(self) -> float:
        return self.value_sum / self.visits if self.visits else 0.0

    def add_child(self, node_id: int, prior: float = 1.0) -> TreeNode:
        child = TreeNode(node_id, parent=self, prior=prior)
        self.children.append(child)
        return child

    def path(self) -> list[TreeNode]:
        """Root ... self."""
        nodes, seen, node = [], set(), self
        while node is not None:
            if node.id in seen:  # parents that loop (a stored tree is checked before: search/store/integrity.py)
                raise ValueError(f"node {node.id} is its own ancestor")
            seen.add(node.id)
            nodes.append(node)
            node = node.parent
        return nodes[::-1]


def is_open(node: TreeNode) -> bool:
    """Whether the node or anything below it may still be expanded."""
    stack = [node]
    while stack:
        n = stack.pop()
        if not n.closed:
            return True
        stack.extend(n.children)
    return False


class MCTS:
    def __init__(self, c_puct: float = 1.4, widen_alpha: float = 0.5, widen_c: float = 1.0,
                 best_weight: float = 0.5, behind_margin: float = 0.0, deepen_margin: float = 0.0,
                 frontier_width: int = 0):
        self.c_puct, self.widen_alpha, self.widen_c = c_puct, widen_alpha, widen_c
        self.best_weight, self.behind_margin, self.deepen_margin = best_weight, behind_margin, deepen_margin
        self.frontier_width = frontier_width
        self.max_reward = 0.0  # the behind margin's reference; select() also refreshes it from the root's best

    def max_children(self, node: TreeNode) -> int:
        return math.ceil(self.widen_c * (node.visits + 1) ** self.widen_alpha)

    def full(self, node: TreeNode) -> bool:
        """No new child for `node` now: closed, outgained by one of its branches that is still open
        (deepen_margin), widened enough for its visits (unless no branch gained: deepen_margin, up to
        frontier_width children), or
        behind itself while one of its branches is still in the running."""
        if node.closed:
            return True
        gained = self._gained(node)
        if any(is_open(c) for c in gained):
            return True
        frontier = (not gained and self.deepen_margin > 0 and node.reward is not None  # widened whatever its visits
                    and not 0 < self.frontier_width <= len(node.children))
        if not frontier and len(node.children) >= self.max_children(node):
            return True
        return self._behind(node.reward) and any(is_open(c) and not self.pruned(c) for c in node.children)

    def _gained(self, node: TreeNode) -> list[TreeNode]:
        """The children whose branch holds a plan faster than the node by more than deepen_margin."""
        if self.deepen_margin <= 0 or node.reward is None:
            return []
        return [c for c in node.children if c.visits and c.best > node.reward * (1 + self.deepen_margin)]

    def _behind(self, reward: float | None) -> bool:
        return (self.behind_margin > 0 and reward is not None and self.max_reward > 0
                and reward < (1 - self.behind_margin) * self.max_reward)

    def pruned(self, node: TreeNode) -> bool:
        """A branch measured (visited) whose best reward is clearly behind the run's best."""
        return node.visits > 0 and self._behind(node.best)

    def value(self, node: TreeNode) -> float:
        return (1 - self.best_weight) * node.mean + self.best_weight * node.best

    def q(self, parent: TreeNode, child: TreeNode) -> float:
        """The child's value scaled against its parent's reward: gains from 1/2 (none) to 1 (the
        largest among its measured siblings), losses from 1/2 down to 0 (the largest loss). Neither
        scale is shorter than deepen_margin of the reward, so a gain or loss within the noise stays
        near 1/2."""
        own = parent.reward if parent.reward is not None else self.value(parent)
        if child.visits and child.best <= 0:
            return 0.0
        value = self.value(child) if child.visits else own  # first-play urgency: no gain over the parent
        values = [self.value(c) for c in parent.children if c.visits and c.best > 0]
        floor = max(1e-12, self.deepen_margin * own)
        if value >= own:
            return 0.5 + 0.5 * (value - own) / max(floor, max(values + [own]) - own)
        return 0.5 - 0.5 * (own - value) / max(floor, own - min(values + [value]))

    def score(self, parent: TreeNode, child: TreeNode) -> float:
        q = self.q(parent, child)
        explore = self.c_puct * child.prior * math.sqrt(max(1, parent.visits)) / (1 + child.visits)
        return q + explore

    def select(self, root: TreeNode) -> list[TreeNode]:
        """The path from the root to the first node that may still be expanded. Closed subtrees
        with nothing left to expand are skipped; if the whole tree is such, the path is [root]
        and root.closed tells the caller the search is exhausted."""
        self.max_reward = max(self.max_reward, root.best)
        path = [root]
        node = root
        while self.full(node):
            candidates = [c for c in node.children if is_open(c)]
            candidates = [c for c in candidates if not self.pruned(c)] or candidates
            if not candidates:
                return path
            node = max(candidates, key=lambda c: (self.score(node, c), -c.id))
            path.append(node)
        return path

    def backpropagate(self, path: list[TreeNode], reward: float) -> None:
        if reward < 0:
            raise ValueError(f"rewards are non-negative, got {reward}")
        self.max_reward = max(self.max_reward, reward)
        for node in path:
            node.visits += 1
            node.value_sum += reward
            node.best = max(node.best, reward)

    @staticmethod
    def priors(raw: list[float | None]) -> list[float]:
        """Missing priors take the mean of the given ones (all missing: uniform); then sum to 1."""
        given = [max(0.0, p) for p in raw if p is not None]
        fill = sum(given) / len(given) if given and sum(given) > 0 else 1.0
        values = [fill if p is None else max(0.0, p) for p in raw]
        total = sum(values)
        return [v / total for v in values] if total > 0 else [1.0 / len(raw)] * len(raw)


def rebuild(rows: list[dict]) -> dict[int, TreeNode]:
    """Nodes from stored rows (id, parent_id, prior, visits, value_sum, best_reward, reward, closed),
    linked into a tree with children in id order, so a run resumes exactly where it stopped.
    Missing or null statistics read as a fresh node's (best_reward is null until a backup)."""
    nodes = {r["id"]: TreeNode(r["id"], prior=1.0 if r.get("prior") is None else r["prior"],
                               visits=r.get("visits") or 0, value_sum=r.get("value_sum") or 0.0,
                               best=r.get("best_reward") or 0.0, reward=r.get("reward"), closed=bool(r.get("closed")))
             for r in rows}
    for r in sorted(rows, key=lambda r: r["id"]):
        parent_id = r["parent_id"]
        if parent_id is None:
            continue
        if parent_id not in nodes:
            raise ValueError(f"node {r['id']}: parent {parent_id} is not among the rows")
        nodes[r["id"]].parent = nodes[parent_id]
        nodes[parent_id].children.append(nodes[r["id"]])
    return nodes
