"""A run's first plans: the shipped sequential plan as the root; the shipped streams and interleave
plans and the best plans of earlier runs on this evaluator (warm starts: this model family's first, then
any other's) as its children.

What a run on one model pair carries to a run on another: its best plans, their op ids
translated to the new pair's layers and draft steps.

A plan's rules (alignment, pairs, tiles per op kind, fusions, streams) hold for any pair; only its
overrides name ops by id: `t.l<layer>.<kind>` for the target, `d.s<step>.l<layer>.<kind>` for the
draft. Translation scales a literal layer number to the same depth of the new model (layer 31 of 32
becomes layer 27 of 28) and keeps a draft step inside the new k. A number written with wildcards
(`t.l1?.qkv`) is a glob over whatever layers the new model has and stays as it is. A pin (`with`)
whose draft op the new pair lacks is dropped with its override.
"""
from __future__ import annotations

import copy
import re

import networkx as nx

from conjugate.errors import PlanError
from conjugate.graph import build_graph
from conjugate.paths import SEED_PLANS, shipped_plan
from conjugate.plan import Plan, load_plan, validate_plan
from conjugate.search.context import family_of
from conjugate.search.store import RunRecord, Store
from conjugate.workload import Workload

_TARGET_LAYER = re.compile(r"^(t\.l)(\d+)(?=\.|$)")
_DRAFT_STEP_LAYER = re.compile(r"^(d\.s)(\d+)(\.l)(\d+)(?=\.|$)")
_DRAFT_STEP = re.compile(r"^(d\.s)(\d+)(?=\.|$)")


def scale_layer(layer: int, layers_from: int, layers_to: int) -> int:
    """The layer at the same relative depth of a model with `layers_to` layers."""
    if layers_from <= 1 or layers_to <= 1:
        return min(layer, max(layers_to - 1, 0))
    return min(round(layer * (layers_to - 1) / (layers_from - 1)), layers_to - 1)


def translate_op_pattern(pattern: str, source: dict, target: dict) -> str:
    """An override's op id or glob, from the source workload's pair to the target's (workload dicts)."""
    t_from, t_to = source["target"]["num_layers"], target["target"]["num_layers"]
    d_from, d_to = source["draft"]["num_layers"], target["draft"]["num_layers"]
    last_step = max(int(target["k"]) - 1, 0)
    m = _TARGET_LAYER.match(pattern)
    if m:
        return f"{m[1]}{scale_layer(int(m[2]), t_from, t_to)}{pattern[m.end():]}"
    m = _DRAFT_STEP_LAYER.match(pattern)
    if m:
        return f"{m[1]}{min(int(m[2]), last_step)}{m[3]}{scale_layer(int(m[4]), d_from, d_to)}{pattern[m.end():]}"
    m = _DRAFT_STEP.match(pattern)
    if m:
        return f"{m[1]}{min(int(m[2]), last_step)}{pattern[m.end():]}"
    return pattern


def translate_plan(plan: dict, source: dict, target: dict, graph: nx.DiGraph) -> dict:
    """`plan` (canonical, from a run on `source`) for a run on `target`, whose op graph is `graph`."""
    out = copy.deepcopy(plan)
    overrides = []
    for override in out["cross"]["overrides"]:
        override["match"] = translate_op_pattern(override["match"], source, target)
        if "with" in override:
            override["with"] = translate_op_pattern(override["with"], source, target)
            if override["with"] not in graph:
                continue  # the new pair has no such draft op to pin
        overrides.append(override)
    out["cross"]["overrides"] = overrides
    return out


def same_pair_shape(source: dict, target: dict) -> bool:
    """Whether op ids mean the same ops in both workloads (layer counts and k alike)."""
    return (source["target"]["num_layers"], source["draft"]["num_layers"], source["k"]) == \
        (target["target"]["num_layers"], target["draft"]["num_layers"], target["k"])


def seed(store: Store, run: RunRecord, workload: Workload, warm_start: int) -> list[Plan]:
    """Add the run's root and its seeded children to the store; the plans added, the root first."""
    root = load_plan(shipped_plan(SEED_PLANS[0]))
    root_id, _ = store.add_node(run.id, root.to_dict(), root.hash, None, None,
                                "baseline: draft phase, then verify phase", "seed", "other", 1.0)
    seeds = [(load_plan(shipped_plan(n)), f"shipped plan {n}", "seed") for n in SEED_PLANS[1:]]
    added = [root]
    for plan, why, proposer in seeds + warm_starts(store, run, workload, warm_start):
        store.add_node(run.id, plan.to_dict(), plan.hash, root_id,
                       [{"op": "replace", "path": "", "value": plan.to_dict()}], why, proposer, "other", 1.0)
        added.append(plan)
    return added


def warm_starts(store: Store, run: RunRecord, workload: Workload, wanted: int) -> list[tuple[Plan, str, str]]:
    """The best plans of earlier runs with this evaluator (measured and modeled apart): of this model
    family first, then of any other, their op ids translated to this pair; a plan of an earlier schema
    that no longer validates is left out."""
    family = family_of(run.workload)
    mine = store.best_plans(run.evaluator, family, wanted, exclude_run=run.id)
    others = store.best_plans(run.evaluator, None, 4 * wanted, exclude_run=run.id)
    chosen = [w for w in mine if w["reward"] > 0]  # no failed plan
    chosen += [w for w in others if w["reward"] > 0 and family_of(w["workload"]) != family][:wanted - len(chosen)]
    out, graph = [], None
    for w in chosen[:wanted]:
        plan, why = w["plan"], f"best plan of run {w['run_id']} ({w['workload'].get('name')}): reward {w['reward']:.3f}"
        if not same_pair_shape(w["workload"], run.workload):
            graph = graph or build_graph(workload)
            plan, why = translate_plan(plan, w["workload"], run.workload, graph), why + ", translated to this pair"
        try:  # read from the store (another run's), and translated: validated here
            out.append((validate_plan(plan), why, "warm-start"))
        except PlanError:
            continue
    return out
