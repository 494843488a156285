"""MCTS: PUCT selection, progressive widening, backpropagation, rebuild from stored rows, and
guided search against random search on a synthetic reward landscape."""
from __future__ import annotations

import math
import random
import statistics

import pytest

from conjugate.search.mcts import MCTS, TreeNode, rebuild


def _root_with_children(priors: list[float], visits: int = 1) -> tuple[TreeNode, list[TreeNode]]:
    root = TreeNode(0, visits=visits, value_sum=float(visits), best=1.0, reward=1.0, closed=True)
    return root, [root.add_child(i + 1, p) for i, p in enumerate(priors)]


def test_puct_picks_the_unvisited_high_prior_child_first():
    root, kids = _root_with_children([0.2, 0.6, 0.2], visits=3)
    assert MCTS().select(root) == [root, kids[1]]


def test_ties_go_to_the_lowest_id():
    root, kids = _root_with_children([0.5, 0.5])
    assert MCTS().select(root)[-1] is kids[0]


def test_visited_child_with_low_reward_loses_to_its_sibling():
    m = MCTS()
    root = TreeNode(0)
    m.backpropagate([root], 1.0)
    good, bad = root.add_child(1, 0.5), root.add_child(2, 0.5)
    m.backpropagate([root, good], 1.2)
    m.backpropagate([root, bad], 0.1)
    root.closed = True
    assert m.score(root, good) > m.score(root, bad)
    assert m.select(root)[-1] is good


def test_consistently_rewarding_branch_gets_more_visits():
    m, root = MCTS(), TreeNode(0)
    m.backpropagate([root], 1.0)
    kids = [root.add_child(1, 0.5), root.add_child(2, 0.5)]
    for kid, r in zip(kids, (1.0, 1.0)):
        m.backpropagate([root, kid], r)
    root.closed = True
    next_id = 3
    for _ in range(40):
        path = m.select(root)
        reward = 1.3 if path[1] is kids[0] else 0.4
        child = path[-1].add_child(next_id, 1.0)
        next_id += 1
        m.backpropagate(path + [child], reward)
    assert kids[0].visits > 2 * kids[1].visits


def test_widening_grows_children_with_visits():
    m, node = MCTS(widen_c=1.0, widen_alpha=0.5), TreeNode(0)
    counts = []
    for visits in (0, 3, 8, 15, 24):
        node.visits = visits
        counts.append(m.max_children(node))
    assert counts == [1, 2, 3, 4, 5]
    node.visits = 3
    node.children = [TreeNode(i, parent=node) for i in (1, 2)]
    assert m.full(node)
    node.visits = 8
    assert not m.full(node) and m.select(node) == [node]


def test_backpropagate_updates_the_path():
    m = MCTS()
    root = TreeNode(0)
    a = root.add_child(1)
    b = a.add_child(2)
    m.backpropagate([root, a, b], 1.5)
    m.backpropagate([root, a], 0.5)
    assert (root.visits, root.value_sum, root.best) == (2, 2.0, 1.5)
    assert (a.visits, a.value_sum, a.best) == (2, 2.0, 1.5)
    assert (b.visits, b.value_sum, b.best) == (1, 1.5, 1.5)
    assert m.max_reward == 1.5 and b.path() == [root, a, b]
    with pytest.raises(ValueError):
        m.backpropagate([root], -1.0)


def test_priors_fill_missing_and_normalize():
    assert MCTS.priors([None, None]) == [0.5, 0.5]
    assert MCTS.priors([0.6, None, 0.2]) == pytest.approx([0.6 / 1.2, 0.4 / 1.2, 0.2 / 1.2])
    assert MCTS.priors([0.0, 0.0]) == [0.5, 0.5]
    assert sum(MCTS.priors([0.9, 0.3, None, 0.05])) == pytest.approx(1.0)


def test_exhausted_subtrees_are_skipped():
    root, kids = _root_with_children([0.9, 0.1])
    kids[0].closed = True  # closed leaf: nothing left below it
    assert MCTS().select(root)[-1] is kids[1]
    kids[1].closed = True
    assert MCTS().select(root) == [root] and root.closed


def _rows(nodes: dict[int, TreeNode]) -> list[dict]:
    return [{"id": n.id, "parent_id": n.parent.id if n.parent else None, "prior": n.prior, "visits": n.visits,
             "value_sum": n.value_sum, "best_reward": n.best, "reward": n.reward, "closed": n.closed}
            for n in nodes.values()]


def test_rebuild_round_trips_and_resumes_identically():
    landscape = _Landscape()
    m, root, states, _ = _mcts_search(landscape, seed=3, budget=25)
    nodes = {n.id: n for n in _walk(root)}
    rows = _rows(nodes)
    rebuilt = rebuild(list(reversed(rows)))  # parents after children: still linked
    assert _rows(dict(sorted(rebuilt.items()))) == _rows(dict(sorted(nodes.items())))
    assert [c.id for c in rebuilt[0].children] == [c.id for c in root.children]
    fresh = MCTS()  # a new process: the same selection from the stored statistics
    assert [n.id for n in fresh.select(rebuilt[0])] == [n.id for n in m.select(root)]
    with pytest.raises(ValueError):
        rebuild([{**rows[1], "parent_id": 999}])


def _walk(root: TreeNode) -> list[TreeNode]:
    out, stack = [], [root]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children)
    return out


# ---------------------------------------------------------------------------------------------
# guided against random search: integer states in a box, one broad global peak far from the start
# and a narrow deceptive one near it; an agent proposing random neighbour moves whose priors lean,
# 70% of the time, toward the moves that improve the reward.


class _Landscape:
    high, start = 20, (2, 2, 2)
    peak, local = (15, 15, 15), (6, 5, 6)

    def reward(self, x: tuple[int, ...]) -> float:
        d_peak = sum((a - b) ** 2 for a, b in zip(x, self.peak))
        d_local = sum((a - b) ** 2 for a, b in zip(x, self.local))
        return math.exp(-d_peak / (2 * 7.0 ** 2)) + 0.5 * math.exp(-d_local / (2 * 2.0 ** 2))

    def propose(self, x: tuple[int, ...], rng: random.Random, taken: set, n: int = 3) -> list[tuple]:
        moves = [x[:i] + (x[i] + d,) + x[i + 1:] for i in range(len(x)) for d in (-2, -1, 1, 2)
                 if 0 <= x[i] + d <= self.high]
        moves = [y for y in moves if y not in taken]
        rng.shuffle(moves)
        out = []
        for y in moves[:n]:
            better = (self.reward(y) > self.reward(x)) != (rng.random() < 0.3)
            out.append((y, 0.6 if better else 0.4))
        return out


def _mcts_search(land: _Landscape, seed: int, budget: int, make=MCTS):
    rng, m = random.Random(seed), make()
    root, states = TreeNode(0, reward=land.reward(land.start)), {0: land.start}
    m.backpropagate([root], root.reward)
    best = root.reward
    while len(states) < budget:
        path = m.select(root)
        leaf = path[-1]
        moves = land.propose(states[leaf.id], rng, {states[c.id] for c in leaf.children})
        if not moves:
            leaf.closed = True
            continue
        for (state, _), prior in zip(moves, MCTS.priors([p for _, p in moves])):
            if len(states) == budget:
                break
            child = leaf.add_child(len(states), prior)
            states[child.id] = state
            child.reward = land.reward(state)
            best = max(best, child.reward)
            m.backpropagate(path + [child], child.reward)
    return m, root, states, best


def _random_search(land: _Landscape, seed: int, budget: int) -> float:
    rng = random.Random(seed)
    states, taken = [land.start], [set()]
    best = land.reward(land.start)
    while len(states) < budget:
        i = rng.randrange(len(states))  # a uniformly random evaluated node
        for state, _ in land.propose(states[i], rng, taken[i]):
            if len(states) == budget:
                break
            taken[i].add(state)
            states.append(state)
            taken.append(set())
            best = max(best, land.reward(state))
    return best


def search_margin(seeds: range, budget: int = 60, make=MCTS) -> tuple[float, float]:
    """Mean best reward of MCTS and of random search over the seeds, at equal evaluations."""
    land = _Landscape()
    guided = statistics.mean(_mcts_search(land, s, budget, make)[3] for s in seeds)
    blind = statistics.mean(_random_search(land, s, budget) for s in seeds)
    return guided, blind


@pytest.mark.parametrize("first_seed", [0, 1000, 2000])
def test_mcts_beats_random_search_at_equal_evaluations(first_seed):
    guided, blind = search_margin(range(first_seed, first_seed + 48))
    # over 40 disjoint groups of 48 seeds: MCTS about 0.20, random about 0.11, margin 0.051 to 0.125
    assert guided > blind + 0.04, (guided, blind)


# ---------------------------------------------------------------------------------------------
# branches clearly behind: the shape of a search's start (sequential, then streams far ahead of
# interleave), where a small budget used to go to the branches measured behind


def _start(margin: float) -> tuple[MCTS, TreeNode, TreeNode, TreeNode]:
    m = MCTS(c_puct=0.7, behind_margin=margin)
    root = TreeNode(1, reward=1.0)  # sequential
    m.backpropagate([root], 1.0)
    streams, interleave = root.add_child(2, 0.5), root.add_child(3, 0.5)
    streams.reward, interleave.reward = 1.30, 1.15  # interleave 12% behind streams
    m.backpropagate([root, streams], 1.30)
    m.backpropagate([root, interleave], 1.15)
    return m, root, streams, interleave


def test_a_branch_clearly_behind_is_not_expanded_while_another_is_open():
    m, root, streams, interleave = _start(0.05)
    assert m.pruned(interleave) and not m.pruned(streams) and not m.pruned(root)
    assert m.full(root)  # the root (sequential, behind) gets no new child while streams is open
    for step in range(12):  # streams' subtree grows; neither the root nor interleave is expanded
        path = m.select(root)
        assert path[-1] is not root and interleave not in path
        child = path[-1].add_child(10 + step, 1.0)
        child.reward = 1.28
        m.backpropagate(path + [child], 1.28)
    assert not interleave.children and len(root.children) == 2
    for node in _walk(streams):
        node.closed = True  # streams' branch has nothing left: the search comes back to the rest
    assert m.select(root)[-1] in (root, interleave)


def test_without_a_margin_behind_branches_are_expanded_as_before():
    m, root, streams, interleave = _start(0.0)
    assert not m.pruned(interleave)
    elsewhere = 0
    for step in range(12):
        path = m.select(root)
        elsewhere += streams not in path  # expanded the root or interleave's branch
        child = path[-1].add_child(10 + step, 1.0)
        child.reward = 1.28 if streams in path else 1.1
        m.backpropagate(path + [child], child.reward)
    assert elsewhere >= 3


# ---------------------------------------------------------------------------------------------
# Q scaled between siblings, and deepening past a gain: the first expansion of llama-1b-8b-b8's
# `streams` node on the H200 (2026-12-02), rewards as speedups over `sequential`


def _streams_children(deepen: float = 0.0) -> tuple[MCTS, TreeNode, list[TreeNode]]:
    m = MCTS(c_puct=0.7, behind_margin=0.05, deepen_margin=deepen)
    streams = TreeNode(2, reward=1.251)
    m.backpropagate([streams], 1.251)
    kids = []
    for node_id, prior, reward in ((4, 0.41, 1.257), (5, 0.29, 1.288), (6, 0.29, 1.299)):  # +0.5%, +2.9%, +3.8%
        kid = streams.add_child(node_id, prior)
        kid.reward = reward
        m.backpropagate([streams, kid], reward)
        kids.append(kid)
    return m, streams, kids


def test_q_tells_siblings_a_few_percent_apart_apart():
    m, streams, (small, mid, large) = _streams_children()
    assert m.q(streams, large) == 1.0 and m.q(streams, small) == pytest.approx(0.5 + 0.5 * 0.006 / 0.048)
    assert m.q(streams, mid) == pytest.approx(0.5 + 0.5 * 0.037 / 0.048)
    streams.closed = True
    # the 3.8% gain is expanded next, though its prior is lower than the 0.5% gain's
    assert m.select(streams)[-1] is large
    fresh = streams.add_child(7, 0.5)  # not measured: counts as no gain over its parent
    assert m.q(streams, fresh) == 0.5


def test_q_of_a_failed_or_far_slower_branch_does_not_squeeze_the_gains():
    m, streams, (small, _, large) = _streams_children()
    failed, slow = streams.add_child(8, 0.3), streams.add_child(9, 0.3)
    m.backpropagate([streams, failed], 0.0)
    slow.reward = 0.99  # 26% slower than its parent
    m.backpropagate([streams, slow], 0.99)
    assert m.q(streams, failed) == 0.0 and m.q(streams, slow) == 0.0 and m.q(streams, large) == 1.0
    assert m.q(streams, small) == pytest.approx(0.5 + 0.5 * 0.006 / 0.048)
    half_as_slow = streams.add_child(10, 0.3)
    half_as_slow.reward = (0.99 + 1.251) / 2
    m.backpropagate([streams, half_as_slow], half_as_slow.reward)
    assert m.q(streams, half_as_slow) == pytest.approx(0.25)


def test_a_node_outgained_by_an_open_branch_is_deepened_not_widened():
    m, streams, kids = _streams_children(deepen=0.005)
    streams.visits = 24  # widening alone would allow a fifth child
    assert len(streams.children) < m.max_children(streams)
    assert m.full(streams) and m.select(streams)[-1] is kids[2]
    plain, streams0, _ = _streams_children()
    streams0.visits = 24
    assert not plain.full(streams0) and plain.select(streams0) == [streams0]
    for kid in kids[1:]:  # the gaining branches exhausted: the node is widened again
        kid.closed = True
    assert not m.full(streams) and m.select(streams) == [streams]


def test_a_node_none_of_whose_children_gained_is_widened_not_left_for_a_loser():
    for deepen, widened in ((0.005, True), (0.0, False)):
        m = MCTS(c_puct=0.7, deepen_margin=deepen)
        best = TreeNode(9, reward=1.40)
        m.backpropagate([best], 1.40)
        for node_id, reward in ((10, 1.36), (11, 1.397), (12, 1.35)):  # -2.9%, -0.2%, -3.6%
            kid = best.add_child(node_id, 1 / 3)
            kid.reward = reward
            m.backpropagate([best, kid], reward)
        assert len(best.children) == m.max_children(best)  # widening by visits alone would stop here
        assert (m.select(best) == [best]) is widened


def test_a_frontier_is_widened_up_to_its_width_then_left_for_its_best_child():
    # llama-3b-8b-b4-ctx2k on the H200: a node whose children each gain a little under the margin
    for width, widened_at_six in ((6, False), (0, True)):
        m = MCTS(c_puct=0.7, deepen_margin=0.005, frontier_width=width)
        node = TreeNode(11, reward=1.2085)
        m.backpropagate([node], 1.2085)
        gains = (0.9999, 1.0006, 1.0001, 0.99, 1.0030, 0.995)  # the best, +0.3%, is under the 0.5% margin
        for i, gain in enumerate(gains[:5]):
            kid = node.add_child(20 + i, 0.2)
            kid.reward = 1.2085 * gain
            m.backpropagate([node, kid], kid.reward)
        assert m.select(node) == [node]  # five children: still widened
        kid = node.add_child(25, 0.2)
        kid.reward = 1.2085 * gains[5]
        m.backpropagate([node, kid], kid.reward)
        assert len(node.children) > m.max_children(node)  # by visits it is full
        assert (m.select(node) == [node]) is widened_at_six
        if not widened_at_six:
            assert m.select(node)[-1].id == 24  # the +0.3% child


def test_with_best_weight_one_a_failed_edit_does_not_demote_the_fastest_branch():
    for weight, chosen in ((1.0, 4), (0.5, 6)):
        m = MCTS(c_puct=0.7, best_weight=weight, deepen_margin=0.005)
        streams = TreeNode(2, reward=1.240)
        m.backpropagate([streams], 1.240)
        kids = {}
        for node_id, prior, reward in ((4, 0.38, 1.382), (5, 0.32, 1.310), (6, 0.30, 1.314)):  # +11%, +6%, +6%
            kids[node_id] = streams.add_child(node_id, prior)
            kids[node_id].reward = reward
            m.backpropagate([streams, kids[node_id]], reward)
        for node_id, reward in ((7, 1.311), (8, 0.0), (9, 1.383)):  # below the +11%: -5%, a failure, +0.1%
            child = kids[4].add_child(node_id, 1 / 3)
            child.reward = reward
            m.backpropagate([streams, kids[4], child], reward)
        assert m.select(streams)[1] is kids[chosen]


def test_with_the_search_settings_mcts_still_beats_random_search():
    from conjugate.search.settings import SearchSettings
    st = SearchSettings()
    guided, blind = search_margin(range(48), make=lambda: MCTS(
        c_puct=st.c_puct, behind_margin=st.behind_margin, deepen_margin=st.deepen_margin, best_weight=st.best_weight,
        frontier_width=st.frontier_width))
    assert guided > blind + 0.2, (guided, blind)


def test_a_gain_or_loss_within_the_noise_stays_near_one_half():
    m = MCTS(deepen_margin=0.005)
    parent = TreeNode(0, reward=1.0)
    m.backpropagate([parent], 1.0)
    up, down = parent.add_child(1), parent.add_child(2)
    for kid, reward in ((up, 1.0001), (down, 0.9999)):
        kid.reward = reward
        m.backpropagate([parent, kid], reward)
    assert m.q(parent, up) == pytest.approx(0.51) and m.q(parent, down) == pytest.approx(0.49)


def test_runs_stored_before_the_settings_resume_without_them():
    from conjugate.search.settings import SearchSettings
    old = SearchSettings.from_dict({"budget": 20})
    assert (old.deepen_margin, old.best_weight, old.behind_margin, old.move_memory) == (0.0, 0.5, 0.0, 0)
    new = SearchSettings()
    assert (new.deepen_margin, new.best_weight) == (0.005, 1.0)
    assert SearchSettings.from_dict(new.to_dict()) == new
