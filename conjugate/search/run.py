"""The search loop: Monte Carlo tree search over plans, every step persisted in the store.

    seed     the sequential plan is the root; the shipped streams and interleave plans (and the best
             plans of earlier runs on this evaluator: this model family's first, then any other's
             translated to this pair) are its children (seeding.py)
    select   PUCT with priors and progressive widening (mcts.py) picks the node to expand
    expand   the proposer suggests a few edits of it; each new plan becomes a child (a plan already
             in the run is not added again)
    evaluate each new child once a slot of the budget is claimed for it, once per plan, workload and evaluator across every run and process
             sharing the database (store claims); a failed plan scores 0 and its error reaches the
             proposer through the context of later expansions
    backprop the reward (the plan's speedup over the sequential baseline) up its path, in the same
             transaction that marks the node evaluated, so a resumed run never counts it twice

A run killed at any point resumes exactly: the tree's statistics live in the store, a node created
but not yet settled is evaluated (or its finished evaluation reused) first, and an evaluation left
"running" by a dead process is taken over.
"""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Protocol

from conjugate.agents.base import Proposal, Proposer, ProposerUnavailable
from conjugate.errors import ConjugateError, PatchError, PlanError
from conjugate.evaluate.result import EvalResult, Stage
from conjugate.plan import Plan, patch_plan, validate_plan
from conjugate.search.context import ContextBuilder, device_of, family_of
from conjugate.search.mcts import MCTS, TreeNode, rebuild
from conjugate.search.moves import (MERGE_SUFFIX, SEEDED, MoveMemory, carried, merged, move_key, move_memory,
                                    remembered)
from conjugate.search.runs import eval_key, reward_of
from conjugate.search import seeding
from conjugate.search.selection import select
from conjugate.search.settings import SearchSettings, evaluator_id
from conjugate.search.store import NodeRecord, NodeStatus, RunStatus, Store, StoreError, owner_id
from conjugate.secrets import scrub
from conjugate.workload import Workload


class Evaluator(Protocol):
    """IsolatedEvaluator's interface: one plan on one workload file, never raising."""
    profile: Any

    def evaluate(self, plan: Plan, workload_path: str | Path) -> EvalResult: ...


class SetupFailed(ConjugateError):
    """An evaluation failed before its plan was looked at (no GPU, unreadable weights): every plan
    would fail alike, so the search stops instead of recording it as the plan's failure."""


class Search:
    def __init__(self, store: Store, run_id: int, workload: Workload, workload_path: str, evaluator: Evaluator,
                 proposer: Proposer, settings: SearchSettings, on_event: Callable[[str, dict], None] | None = None):
        self.store, self.run_id, self.workload, self.workload_path = store, run_id, workload, str(workload_path)
        self.evaluator, self.proposer, self.settings = evaluator, proposer, settings
        self.on_event = on_event or (lambda kind, data: None)
        self.run = store.run(run_id)
        self.context = ContextBuilder(store, self.run, *device_of(evaluator.profile))
        self.mcts = MCTS(c_puct=settings.c_puct, behind_margin=settings.behind_margin,
                         deepen_margin=settings.deepen_margin, best_weight=settings.best_weight,
                         frontier_width=settings.frontier_width)
        self.evaluator_id = settings.evaluator_id or evaluator_id(evaluator.profile)
        self.results: dict[str, EvalResult] = {}  # plan hash -> result of this run's settled nodes
        self.plans: dict[str, Plan] = {}  # plan hash -> the plan, validated once in this process
        self.tree: dict[int, TreeNode] = {}
        self.pending: set[int] = set()  # nodes holding a slot of the budget this process claimed, not settled

    @classmethod
    def start(cls, store: Store, name: str, workload: Workload, workload_path: str, evaluator: Evaluator,
              proposer: Proposer, settings: SearchSettings, seed: int, on_event=None) -> "Search":
        data = {**workload.to_dict(), "family": f"{workload.draft.family}->{workload.target.family}"}
        settings = replace(settings, evaluator_id=settings.evaluator_id or evaluator_id(evaluator.profile))
        run_id = store.create_run(name, data, workload_path, evaluator.profile.name, proposer.name, seed,
                                  settings.to_dict())
        try:
            search = cls(store, run_id, workload, workload_path, evaluator, proposer, settings, on_event)
            search.plans.update((p.hash, p) for p in seeding.seed(store, search.run, workload, settings.warm_start))
        except BaseException:  # a run that never started is not left "running"
            store.set_run_status(run_id, RunStatus.STOPPED)
            raise
        return search

    def _plan(self, node: NodeRecord) -> Plan:
        """The node's plan: made in this process, or read from the store and validated once."""
        if node.plan_hash not in self.plans:
            self.plans[node.plan_hash] = validate_plan(node.plan, f"nodes row {node.id}")
        return self.plans[node.plan_hash]

    def _load_tree(self) -> list[NodeRecord]:
        nodes = self.store.nodes(self.run_id)
        for n in nodes:
            found = self.store.evaluation(eval_key(n.plan_hash, self.workload, self.evaluator_id))
            if found is not None and found.done and n.status is not NodeStatus.NEW:
                self.results[n.plan_hash] = found.result
        rows = [{**n.to_dict(), "reward": reward_of(self.results[n.plan_hash]) if n.plan_hash in self.results
                 else None, "closed": n.status is NodeStatus.EXPANDED} for n in nodes]
        self.tree = rebuild(rows)
        return nodes

    # -- the loop --------------------------------------------------------------------------
    def evaluations_done(self) -> int:
        """The run's settled nodes as the store has them: those of earlier sessions (a resumed run) and of
        other processes sharing the run count too. A node is marked expanded only once settled."""
        return self.store.settled_count(self.run_id)

    def _selection(self, done: int) -> str:
        """The proposer's selection; with MCTS and exploit_every N, `best` for one expansion in N (counted
        in evaluations, so a resumed run keeps the rhythm): the run's best open node widened, as
        hill-climbing widens it, between the tree policy's choices; with exploit_last, `best` once that
        share of the budget is all that is left."""
        how = getattr(self.proposer, "selection", "mcts")
        every, width = self.settings.exploit_every, max(1, self.settings.expand_width)
        if how != "mcts":
            return how
        if every > 0 and (done // width) % every == every - 1:
            return "best"
        last = self.settings.exploit_last
        if last > 0 and done >= self.settings.budget - round(self.settings.budget * last):
            return "best"
        return how

    def run_loop(self, deadline: float | None = None) -> str:
        """Search until the budget, the deadline or exhaustion; returns why it stopped."""
        nodes = self._load_tree()
        root_id = min(self.tree)
        for n in nodes:  # resume: what was created but not settled comes first (not siblings left to wait)
            if n.status is NodeStatus.NEW and not self._past(deadline) and not self._waits(n):
                self._evaluate(n)
        while not self._past(deadline):
            if self.store.slots_claimed(self.run_id) >= self.settings.budget:  # the budget is all handed out:
                if not self.pending:  # what is left is other processes' to settle
                    break
                for node_id in sorted(self.pending):  # settle the nodes this process holds slots for
                    self._evaluate(self.store.node(node_id), deadline)
                continue
            root = self.tree[root_id]  # a reload (another process's nodes) replaces the objects
            done = self.evaluations_done()
            path = select(self._selection(done), self.mcts, root, self.tree, self.run.seed, done)
            if path == [root] and root.closed:
                return "exhausted"
            try:
                self._expand(path, deadline)
            except ProposerUnavailable as e:  # no answer: the node stays open for a later session
                return "deadline" if self._past(deadline) else f"the agent did not answer: {e}"
        return "deadline" if self._past(deadline) else "budget"

    @staticmethod
    def _past(deadline: float | None) -> bool:
        return deadline is not None and time.monotonic() >= deadline

    def _expand(self, path: list[TreeNode], deadline: float | None = None) -> None:
        leaf = path[-1]
        nodes = self.store.nodes(self.run_id)  # once per expansion: everything below reads this snapshot
        by_id = {n.id: n for n in nodes}
        record = by_id[leaf.id]
        if record.status is NodeStatus.NEW:  # not settled yet (another process had its evaluation): settle it first
            self._evaluate(record, deadline)
            return
        self.on_event("expand", {"node": leaf.id, "depth": len(path) - 1})
        plan = self._plan(record)
        context = replace(self.context.build(record, plan, self.results, nodes), deadline=deadline)
        memory = self._move_memory(nodes)
        width = self.settings.expand_width
        proposals = self.proposer.propose(context, 2 * width if memory else width)  # room for what memory drops
        if memory:
            proposals = self._remembered(proposals, memory, leaf.id)
            here = {n.plan_hash for n in nodes if n.parent_id == record.id}
            proposals = carried(memory, plan, here, proposals)
            if self.settings.merge_moves:
                proposals = merged(memory, record, plan, by_id, proposals)
        children = self._add_children(record, plan, proposals, limit=width,
                                      merges=memory.merges if memory else set())
        if not children:  # nothing new to offer from here
            leaf.closed = True
            self.store.set_node_status(leaf.id, NodeStatus.EXPANDED)
            return
        for child in children:
            if self._past(deadline) or self._waits(child, {c.id for c in children}):
                return
            if not self._evaluate(child, deadline):
                return  # the budget is spent

    def _waits(self, node: NodeRecord, expansion: set[int] | None = None) -> bool:
        """deepen_first: a new node a sibling of which, made in the same expansion (`expansion`: their
        ids; a resume, which cannot tell, counts those made before it), gained over their parent by
        more than deepen_margin is not evaluated now. MCTS then selects again and, the parent being
        outgained (mcts.py), builds on the gain first; the node stays in the tree (unvisited, its
        prior kept) for when selection comes back to it. Without it, each expansion measured all its
        children before selecting again: after a gain, the other edits of that expansion came first.
        Only that expansion's gain counts: a node widened again beside an older gain measures its
        new edits (they would otherwise all wait, and the next expansion ask for more)."""
        if (not self.settings.deepen_first or node.parent_id is None or node.proposer in SEEDED
                or getattr(self.proposer, "selection", "mcts") != "mcts"):
            return False
        parent = self.tree.get(node.parent_id)
        if parent is None or parent.reward is None or parent.reward <= 0:
            return False
        margin = parent.reward * (1 + self.settings.deepen_margin)
        rivals = [c for c in parent.children if c.id != node.id and (c.id in expansion if expansion is not None
                                                                       else c.id < node.id)]
        return any(c.reward is not None and c.reward > margin for c in rivals)

    def _move_memory(self, nodes: list[NodeRecord]) -> MoveMemory | None:
        """What each move of this run did where it was measured (moves.py), or None when off: MCTS only
        (the search's baselines, random and greedy, stay as they are), and not for a replay (its recorded
        priors and rationales already carry what the memory did)."""
        if (self.settings.move_memory <= 0 or getattr(self.proposer, "selection", "mcts") != "mcts"
                or self.proposer.name == "replay"):
            return None
        return move_memory(nodes, self.results, self.settings.charge_merges)

    def _remembered(self, proposals: list[Proposal], memory: MoveMemory, parent_id: int) -> list[Proposal]:
        def skipped(p: Proposal) -> None:
            self.on_event("skipped", {"node": parent_id, "rationale": p.rationale})
        return remembered(proposals, memory, self.settings.move_memory, skipped)

    def _add_children(self, parent: NodeRecord, plan: Plan, proposals: list[Proposal], limit: int | None = None,
                      merges: set[str] = frozenset()) -> list[NodeRecord]:
        """New children of `parent` (its plan `plan`) from the proposals, at most `limit`; a proposal
        whose move is one of `merges` (move keys) is recorded as the proposer's merge (MERGE_SUFFIX)."""
        priors = MCTS.priors([p.prior for p in proposals]) if proposals else []
        children = []
        for proposal, prior in zip(proposals, priors):
            if limit is not None and len(children) >= limit:
                break
            try:
                child = patch_plan(plan, proposal.patch)
            except (PatchError, PlanError) as e:
                self.on_event("rejected", {"node": parent.id, "error": str(e)})
                continue
            proposer = self.proposer.name + (MERGE_SUFFIX if move_key(proposal.patch) in merges else "")
            node_id, created = self.store.add_node(self.run_id, child.to_dict(), child.hash, parent.id,
                                                   proposal.patch, proposal.rationale, proposer, proposal.kind, prior)
            if created:
                self.plans[child.hash] = child
                self.tree[node_id] = self.tree[parent.id].add_child(node_id, prior)
                children.append(self.store.node(node_id))
        return children

    def _evaluate(self, node: NodeRecord, deadline: float | None = None) -> bool:
        """Evaluate the node and settle it, once a slot of the budget is claimed for it (store.claim_slot,
        shared by every process on the run); False when none is left."""
        if not self.store.claim_slot(self.run_id, node.id, self.settings.budget):
            return False
        self.pending.add(node.id)
        key = eval_key(node.plan_hash, self.workload, self.evaluator_id)
        self.on_event("evaluate", {"node": node.id, "kind": node.edit_kind, "rationale": node.rationale})
        result = self._result(key, node, deadline)
        if result is None:
            return True  # another process is still on it; a later pass (or a resume) settles the node
        self.pending.discard(node.id)
        reward = reward_of(result)
        path = self._tree_node(node).path()
        status = NodeStatus.EVALUATED if result.ok else NodeStatus.FAILED
        settled = self.store.settle(node.id, status, [n.id for n in path], reward)
        if settled:
            self.mcts.backpropagate(path, reward)
            path[-1].reward = reward
            self._learn(node, result, reward)
        self.results[node.plan_hash] = result
        self.on_event("result", {"node": node.id, "result": result, "reward": reward, "settled": settled})
        return True

    def _result(self, key: str, node: NodeRecord, deadline: float | None) -> EvalResult | None:
        if self.store.claim_evaluation(key, node.plan_hash, self.run_id, owner_id(), self.settings.stale_after_s):
            result = self.evaluator.evaluate(self._plan(node), self.workload_path)
            if not result.ok and result.stage is Stage.SETUP:  # the machine's or the workload's, not the plan's
                self.store.release_evaluation(key, owner_id())
                raise SetupFailed(f"{self.workload_path}: the evaluator could not prepare the workload "
                                  f"({result.status}: {scrub(result.error or '')[:300]}); nothing was recorded "
                                  "for the plan")
            try:
                self.store.finish_evaluation(key, result, reward_of(result))
                return result
            except StoreError:  # our claim was taken over and finished by another process: theirs counts
                pass
        wait = self.settings.stale_after_s if deadline is None else max(0.0, min(self.settings.stale_after_s,
                                                                                 deadline - time.monotonic()))
        found = self.store.wait_evaluation(key, wait)
        return found.result if found is not None else None

    def _tree_node(self, node: NodeRecord) -> TreeNode:
        if node.id not in self.tree:  # added by another process sharing the run
            self._load_tree()
        return self.tree[node.id]

    def _learn(self, node: NodeRecord, result: EvalResult, reward: float) -> None:
        """Edit-kind statistics and, for clear wins and losses, a lesson in words; not for a merge, whose
        moves are of several kinds."""
        if node.parent_id is None or node.proposer in SEEDED or node.proposer.endswith(MERGE_SUFFIX):
            return
        parent = self.store.node(node.parent_id)
        parent_result = self.results.get(parent.plan_hash)
        if not parent_result or reward_of(parent_result) <= 0:
            return
        gain = reward / reward_of(parent_result) - 1
        evaluator, family = self.run.evaluator, family_of(self.run.workload)
        self.store.record_edit_outcome(evaluator, family, node.edit_kind, gain, self.run_id)
        if not result.ok:
            text = f"{node.edit_kind} edit failed ({result.status}): {node.rationale} -> {scrub(result.error)[:120]}"
            self.store.add_lesson(evaluator, family, node.edit_kind, text, -1.0, self.run_id)
        elif abs(gain) >= 0.03:
            text = f"{node.rationale}: {gain * 100:+.1f}% on {self.workload.name}"
            self.store.add_lesson(evaluator, family, node.edit_kind, text, gain, self.run_id)
