"""The search's own baselines: random edits of random nodes, and hill-climbing from the best node."""
from __future__ import annotations

from dataclasses import replace

import pytest

import conjugate  # noqa: F401  (selects the interpreter before triton is imported)
from conjugate.agents import make_proposer
from conjugate.agents.base import NodeContext
from conjugate.plan import load_plan, patch_plan
from conjugate.search.mcts import MCTS, TreeNode
from conjugate.search.selection import select
from test_search import REPO, TINY, cli, env, search_cli, settled, tree  # noqa: F401  (env: a fixture)


def _tree() -> tuple[TreeNode, dict[int, TreeNode]]:
    """root (1.0) -> a (1.3), b (1.1, closed), c (not evaluated); a -> d (1.2)."""
    root = TreeNode(1, reward=1.0)
    a, b, c = root.add_child(2), root.add_child(3), root.add_child(4)
    a.reward, b.reward, b.closed = 1.3, 1.1, True
    d = a.add_child(5)
    d.reward = 1.2
    return root, {n.id: n for n in (root, a, b, c, d)}


def test_best_selects_the_best_open_evaluated_node():
    root, nodes = _tree()
    assert [n.id for n in select("best", MCTS(), root, nodes, 0, 3)] == [1, 2]
    nodes[2].closed = True
    assert [n.id for n in select("best", MCTS(), root, nodes, 0, 3)] == [1, 2, 5]


def test_uniform_selects_open_evaluated_nodes_evenly_and_reproducibly():
    root, nodes = _tree()
    picks = [select("uniform", MCTS(), root, nodes, 7, done)[-1].id for done in range(300)]
    assert set(picks) == {1, 2, 5}  # never the closed one, never the unevaluated one
    assert min(picks.count(i) for i in (1, 2, 5)) > 60  # about 100 each
    assert picks == [select("uniform", MCTS(), root, nodes, 7, done)[-1].id for done in range(300)]
    assert picks != [select("uniform", MCTS(), root, nodes, 8, done)[-1].id for done in range(300)]


def test_nothing_open_is_exhaustion():
    root, nodes = _tree()
    for n in nodes.values():
        n.closed = n.reward is not None
    assert select("best", MCTS(), root, nodes, 0, 0) == [root] and root.closed
    with pytest.raises(ValueError, match="selection"):
        select("sideways", MCTS(), root, nodes, 0, 0)


def test_random_edits_are_valid_new_and_equally_likely():
    plan = load_plan(REPO / "plans" / "streams.json")
    context = NodeContext(plan.to_dict(), plan.hash, {}, "analytical", "NVIDIA H200", 132)
    proposer = make_proposer("random", seed=3)
    first = proposer.propose(context, 8)
    assert len(first) == 8 and {p.prior for p in first} == {1.0}
    hashes = {patch_plan(plan, p.patch).hash for p in first}
    assert len(hashes) == 8 and plan.hash not in hashes
    assert proposer.propose(context, 8) == first  # deterministic for a seed and context
    assert make_proposer("random", seed=4).propose(context, 8) != first
    tried = [{"patch": p.patch} for p in first]
    again = proposer.propose(replace(context, tried=tried), 8)
    assert not hashes & {patch_plan(plan, p.patch).hash for p in again}  # nothing tried before


@pytest.mark.parametrize("agent", ["random", "greedy"])
def test_each_baseline_runs_stores_resumes_and_exports(env, tmp_path, agent, shared_worker):
    db = tmp_path / f"{agent}.db"
    code, out, err = search_cli(db, env["profile"], 6, "--agent", agent)
    assert code == 0, err
    run, nodes = tree(db)
    assert run.agent == agent and len(settled(nodes)) == 6
    assert {n.proposer for n in nodes if n.depth > 0} <= {"seed", agent} and any(n.proposer == agent for n in nodes)
    code, _, err = cli("search", "--resume", db, "--budget", 8)
    assert code == 0, err
    assert len(settled(tree(db)[1])) == 8 and tree(db)[0].agent == agent
    assert cli("export", db, "--out", tmp_path / "out")[0] == 0
    assert (tmp_path / "out" / "best_plan.json").exists()
