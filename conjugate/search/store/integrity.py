"""One pass over a run's stored rows before `show`, `export`, a resume (report.run_history) or a replay
(runs.replay_records) use them: a damaged row ends in one line naming its table, row and field, before
anything is written, instead of a traceback or an endless walk up a plan tree whose parents loop.

Checked: the run's seed is an integer and its search settings read back (types and ranges), every node's
plan is a JSON object, its edit a JSON Patch (a list of operations with text 'op' and 'path') or null,
its edit kind one of EDIT_KINDS, its counts (depth, visits) non-negative integers and its amounts
(value_sum, prior, best_reward) finite and non-negative; the parents form one tree (no node its own
ancestor, no parent missing from the run, one root); each evaluation read has a known status and a
finite, non-negative reward and latency, a finished one its result, and that result's latency,
baselines' latencies and speedups finite, non-negative numbers (an ok result with its metrics); and on
the branch from the root to the fastest plan that passed, and on every node not settled yet (what a
resume evaluates first), every plan validates and hashes to its node's plan_hash (what an export writes
and a resume builds on): a result is stored under the node's hash, so an edited plan would otherwise
stand for the plan the hash names in every later run."""
from __future__ import annotations

import math
from typing import Any

from conjugate.agents import EDIT_KINDS
from conjugate.errors import ConjugateError
from conjugate.files import shown, shown_json
from conjugate.plan import validate_plan
from conjugate.search.settings import SearchSettings
from conjugate.search.store.schema import EvaluationRecord, NodeRecord
from conjugate.search.store.store import StoreError

EVALUATION_STATUSES = ("running", "done")
DAMAGED = "a damaged store"


def check_run(run: Any, found: list[tuple[NodeRecord, EvaluationRecord | None]]) -> None:
    """`found`: the run's nodes, each with its evaluation (or None), as report.node_evaluations reads
    them. Raises StoreError on the first damaged row; the caller's open_store names the database."""
    _check_settings(run)
    for node, evaluation in found:
        _check_node(node)
        if evaluation is not None:
            _check_evaluation(evaluation)
    nodes = {node.id: node for node, _ in found}
    _check_links(run, nodes)
    _check_best_branch(nodes, found)
    for node, _ in found:
        if node.status == "new":
            _check_plan(node)


def _check_settings(run: Any) -> None:
    """The run's seed an integer (what a resume seeds its agent with) and its stored search settings
    read back (types and ranges: SearchSettings.from_dict)."""
    if not isinstance(run.seed, int) or isinstance(run.seed, bool):
        raise _damaged("runs", run.id, f"field 'seed' is {shown_json(run.seed)}, not an integer")
    if not isinstance(run.settings, dict):
        raise _damaged("runs", run.id, f"field 'settings' is {shown_json(run.settings)}, not a JSON object")
    try:
        SearchSettings.from_dict(run.settings)
    except ValueError as e:
        raise _damaged("runs", run.id, f"field 'settings': {e}") from None


def _damaged(table: str, row: Any, problem: str) -> StoreError:
    return StoreError(f"{table} row {row}: {problem}: {DAMAGED}")


def _check_node(n: NodeRecord) -> None:
    if not isinstance(n.plan, dict):
        raise _damaged("nodes", n.id, f"field 'plan' is {shown_json(n.plan)}, not a JSON object")
    if n.edit is not None and not (isinstance(n.edit, list) and all(
            isinstance(op, dict) and isinstance(op.get("op"), str) and isinstance(op.get("path"), str)
            for op in n.edit)):
        raise _damaged("nodes", n.id, f"field 'edit' is {shown_json(n.edit)}, not a JSON Patch "
                                      "(a list of operations with 'op' and 'path')")
    if n.edit_kind not in EDIT_KINDS:
        raise _damaged("nodes", n.id, f"field 'edit_kind' is {shown(n.edit_kind)}, not one of {', '.join(EDIT_KINDS)}")
    for name in ("depth", "visits"):
        value = getattr(n, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise _damaged("nodes", n.id, f"field {name!r} is {shown(value)}, not a count")
    for name in ("value_sum", "prior", "best_reward"):
        _amount("nodes", n.id, name, getattr(n, name), optional=name == "best_reward")


def _check_evaluation(e: EvaluationRecord) -> None:
    if e.status not in EVALUATION_STATUSES:
        raise _damaged("evaluations", e.id, f"field 'status' is {shown(e.status)}, not one of "
                                            f"{', '.join(EVALUATION_STATUSES)}")
    for name in ("reward", "latency_ms"):
        _amount("evaluations", e.id, name, getattr(e, name), optional=True)
    if e.done and e.result is None:
        raise _damaged("evaluations", e.id, "field 'result' is null for a finished evaluation")
    metrics = e.result.metrics if e.result is not None else None
    if metrics is None:
        if e.done and e.result.status == "ok":
            raise _damaged("evaluations", e.id, "field 'result.metrics' is null for a plan that passed")
        return
    _amount("evaluations", e.id, "result.metrics.latency_ms", metrics.latency_ms, optional=False)
    for name, value in (metrics.speedups or {}).items():
        _amount("evaluations", e.id, f"result.metrics.speedups.{name}", value, optional=False)
    for name, baseline in (metrics.baselines or {}).items():
        _amount("evaluations", e.id, f"result.metrics.baselines.{name}.latency_ms",
                getattr(baseline, "latency_ms", None), optional=True)


def _amount(table: str, row: int, name: str, value: Any, optional: bool) -> None:
    """A finite, non-negative number (or, `optional`, null)."""
    if value is None and optional:
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
        raise _damaged(table, row, f"field {name!r} is {shown(value)}, not a finite non-negative number")


def _check_links(run: Any, nodes: dict[int, NodeRecord]) -> None:
    """Every parent a node of the run, no node its own ancestor, one root."""
    for n in nodes.values():
        if n.parent_id == n.id:
            raise _damaged("nodes", n.id, f"field 'parent_id' is its own id {n.id}: the node is its own ancestor")
        if n.parent_id is not None and n.parent_id not in nodes:
            raise _damaged("nodes", n.id, f"parent {shown(n.parent_id)} does not exist in run {run.id}")
    rooted: set[int] = set()  # nodes whose ancestors end at a root
    for n in nodes.values():
        walked, at = [], n
        while at is not None and at.id not in rooted:
            if at.id in walked:
                loop = walked[walked.index(at.id):] + [at.id]
                raise _damaged("nodes", at.id, "field 'parent_id': the node is its own ancestor (parents "
                                               + " -> ".join(map(str, loop)) + ")")
            walked.append(at.id)
            at = nodes.get(at.parent_id) if at.parent_id is not None else None
        rooted.update(walked)
    roots = [n.id for n in nodes.values() if n.parent_id is None]
    if len(roots) > 1:
        raise _damaged("nodes", roots[1], f"a second root (no parent) beside node {roots[0]}")


def _check_best_branch(nodes: dict[int, NodeRecord], found: list[tuple[NodeRecord, EvaluationRecord | None]]) -> None:
    passed = [(e.result.latency_ms, n.id) for n, e in found
              if e is not None and e.done and e.result is not None and e.result.status == "ok"
              and e.result.latency_ms is not None]
    if not passed:
        return
    at = nodes[min(passed, key=lambda p: p[0])[1]]  # the fastest; ties: the first made (as report.best_of)
    while at is not None:
        _check_plan(at)
        at = nodes[at.parent_id] if at.parent_id is not None else None


def _check_plan(node: NodeRecord) -> None:
    """The node's plan validates and hashes to its plan_hash."""
    try:
        actual = validate_plan(node.plan).hash
    except (ConjugateError, ValueError, TypeError) as e:
        raise _damaged("nodes", node.id, f"field 'plan' is not a valid plan ({e})") from None
    if actual != node.plan_hash:
        raise _damaged("nodes", node.id, f"field 'plan_hash' is not the hash of its plan ({actual[:12]}...)")
