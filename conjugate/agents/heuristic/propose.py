"""The heuristic proposer: rule-based plan edits, offline and deterministic.

One module per knob family proposes that family's edits (tiles, fusions, reduce, pdl, streams,
form, cross; repair undoes a failed node's likely cause), reading what the node's result says: its
compiler feedback, per-launch verdicts and time ledger. This module gathers them (`candidates`),
ranks them and keeps the ones that make a plan new to the node (`fresh_filter`).

Each candidate has a base score; the search's edit statistics shift the scores of their kinds (the
knob family: kinds with a positive mean gain rise), a kind already chosen loses a little for the
next pick so the proposals stay diverse, and the final score becomes the proposal's prior. A
random.Random seeded by the proposer's seed, the plan hash and the number of children tried orders
near-equal candidates, so the same context always gives the same proposals and a revisited node
gets new ones.

Every proposal applies to the canonical plan, validates, changes the plan and is not one tried
before. It may still fail expansion (a pinned draft op that no longer fits, say); the evaluator
reports that as an invalid plan, which the search records like any other outcome.
"""
from __future__ import annotations

import copy
import itertools
import json
import math
import random
from pathlib import Path

from conjugate.agents.base import NodeContext, Proposal
from conjugate.agents.heuristic.candidate import Candidate, launch_parts, ledger_of
from conjugate.agents.heuristic.cross import (alignment_edits, gain_edits, headroom_edits, layout_edits,
                                              mixed_edits, pattern_edits, split_edits)
from conjugate.agents.heuristic.form import form_edits
from conjugate.agents.heuristic.fusions import fusion_edits
from conjugate.agents.heuristic.pdl import pdl_edits
from conjugate.agents.heuristic.reduce import reduce_edits
from conjugate.agents.heuristic.repair import repair_edits
from conjugate.agents.heuristic.streamed import streamed_edits
from conjugate.agents.heuristic.streams import sm_limit_edits, streams_edits
from conjugate.agents.heuristic.tile_table import MeasuredTiles, TileTable, load_tile_tables, tiles_for
from conjugate.agents.heuristic.tiles import focus, launch_edits, measured_tile_edits, spill_edits, tile_edits
from conjugate.errors import ConjugateError
from conjugate.evaluate.result import EvalResult, VerdictKind
from conjugate.paths import TILES_FILE
from conjugate.plan.patch import patch_plan
from conjugate.plan.schema import MODEL_KEYS, Plan, validate_plan
from conjugate.roles import Model

_DECAY = 0.85  # score factor per proposal of the same kind already chosen


class HeuristicProposer:
    name = "heuristic"

    def __init__(self, seed: int = 0, tile_tables: tuple[TileTable, ...] | None = None, tiles_file: Path = TILES_FILE):
        """`tile_tables`: measured tiles per GPU model; by default read from `tiles_file` now, so a
        damaged file stops a search before it starts."""
        self.seed = seed
        self.tile_tables = load_tile_tables(tiles_file) if tile_tables is None else tile_tables

    def propose(self, context: NodeContext, n: int) -> list[Proposal]:
        try:
            plan = context.plan if isinstance(context.plan, Plan) else validate_plan(context.plan)
        except ConjugateError:
            return []
        rng = random.Random(f"{self.seed}:{context.plan_hash}:{len(context.tried)}")
        return [Proposal(cand.patch, cand.rationale, cand.kind, prior)
                for cand, prior in itertools.islice(self.ordered(plan, context, rng), n)]

    def measured(self, context: NodeContext) -> MeasuredTiles | None:
        """The measured tiles of the GPU model the node is evaluated on (and of its chip's others)."""
        return tiles_for(context.device, self.tile_tables)

    def ordered(self, plan: Plan, context: NodeContext, rng: random.Random):
        """(candidate, prior) pairs, the most promising first: base scores shifted by the edit statistics;
        only candidates that make a plan new to this node, each plan once (fresh_filter)."""
        found = candidates(plan, context.result, context.sms, rng, context.workload, self.measured(context))
        ranked = _ranked(found, context.edit_stats, fresh_filter(plan, context.tried))
        return ((c, round(min(1.0, max(0.05, s)), 3)) for c, s in ranked)


def fresh_filter(plan: Plan, tried: list[dict]):
    """A predicate on candidates, true once per plan made: false for a candidate that fails to apply,
    changes nothing (or only tiles no launch reads: _unused_tiles_only), makes a plan tried from this
    node or one an earlier true candidate made.
    Identical edits are common (a spill repair named once per spilling launch of one kind: 539
    candidates, 104 plans on a qwen3-0.6b draft); ranked as they come, each copy would take a turn
    and decay its kind's later candidates out of the proposals. Asked lazily, in ranked order, so
    only the candidates looked at are patched."""
    seen = {plan.hash} | _tried_hashes(plan, tried)
    patches: set[str] = set()  # an edit seen before makes the same plan: no need to patch it again

    def fresh(cand: Candidate) -> bool:
        patch = json.dumps(cand.patch, sort_keys=True)
        if patch in patches:
            return False
        patches.add(patch)
        try:
            made = patch_plan(plan, cand.patch)
        except ConjugateError:
            return False
        if made.hash in seen or _unused_tiles_only(plan, made):
            return False
        seen.add(made.hash)
        return True

    return fresh


def _unused_tiles_only(plan: Plan, made: Plan) -> bool:
    """Whether `made` differs from `plan` only in tiles that no launch of either reads: under
    gate_up+down (compiler/mlp.py) a model's down tile and its gate_up SPLIT_K. Such an edit would
    spend an evaluation on the same kernels."""
    a, b = copy.deepcopy(plan.to_dict()), copy.deepcopy(made.to_dict())
    for model in MODEL_KEYS:
        if "gate_up+down" in a[model]["fusions"] and "gate_up+down" in b[model]["fusions"]:
            for d in (a, b):
                d[model]["tiles"].pop("down", None)
                d[model]["tiles"].get("gate_up", {}).pop("SPLIT_K", None)
    return a == b


def _tried_hashes(plan: Plan, tried: list[dict]) -> set[str]:
    hashes = set()
    for t in tried:
        try:
            hashes.add(patch_plan(plan, t.get("patch")).hash)
        except (ConjugateError, TypeError, AttributeError):
            continue
    return hashes


def _ranked(cands: list[Candidate], stats: dict, fresh=lambda cand: True):
    """Yield (candidate, score) best first: base score + the kind's statistics bias, decayed by
    how many of the same kind came before (so the list mixes kinds); a candidate `fresh` refuses
    is passed over without a turn."""
    groups: dict[str, list[tuple[float, int, Candidate]]] = {}
    for i, c in enumerate(cands):
        groups.setdefault(c.kind, []).append((c.score + _bias(stats.get(c.kind)), -i, c))
    for g in groups.values():
        g.sort(key=lambda e: (e[0], e[1]), reverse=True)
    taken = {k: 0 for k in groups}  # looked at
    chosen = {k: 0 for k in groups}  # yielded: the decay counts these
    while any(taken[k] < len(g) for k, g in groups.items()):
        kind = max((k for k, g in groups.items() if taken[k] < len(g)),
                   key=lambda k: (groups[k][taken[k]][0] * _DECAY ** chosen[k], groups[k][taken[k]][1]))
        score, _, cand = groups[kind][taken[kind]]
        taken[kind] += 1
        if fresh(cand):
            yield cand, score * _DECAY ** chosen[kind]
            chosen[kind] += 1


def _bias(stat: dict | None) -> float:
    """Up to +-0.3 for a kind's mean gain, trusted more as its count grows."""
    if not stat or not stat.get("n"):
        return 0.0
    n, gain = stat["n"], float(stat.get("mean_gain") or 0.0)
    return 0.3 * math.tanh(gain / 0.02) * n / (n + 3)


def candidates(plan: Plan, result: EvalResult | None, sms: int, rng: random.Random,
               workload: dict | None = None, tiles: MeasuredTiles | None = None) -> list[Candidate]:
    """Every candidate edit of every knob family, result-driven first (unordered beyond their base
    scores); `sms`: the GPU's multiprocessors, which a launch's programs should fill; `workload` (its
    layer counts and k) places pins of mixed plans and, with `tiles` (the GPU model's measured
    tiles), gives each GEMM's shape."""
    parts, ledger = launch_parts(result), ledger_of(result)
    verdicts = result.verdicts if result else ()
    out = [] if result is None else repair_edits(plan, result) if not result.ok else spill_edits(plan, result)
    out += measured_tile_edits(plan, workload, tiles, ledger)
    out += split_edits(plan, verdicts) + gain_edits(plan, verdicts) + headroom_edits(plan, parts, sms)
    out += tile_edits(plan, focus(plan, ledger, verdicts, parts, sms), rng) + launch_edits(plan, rng)
    interfering = any(v.verdict is VerdictKind.INTERFERENCE for v in verdicts)
    out += pattern_edits(plan, interfering) + fusion_edits(plan, ledger) + alignment_edits(plan)
    out += streams_edits(plan, ledger) + mixed_edits(plan, verdicts, workload) + layout_edits(plan)
    out += reduce_edits(plan) + pdl_edits(plan, ledger) + form_edits(plan, workload) + streamed_edits(plan, workload)
    measured = result is not None and not result.modeled  # a model ignores SM limits: no use proposing them
    out += sm_limit_edits(plan, sms, ledger) if measured else []
    return [c for c in out if not _idle_under_step(plan, c)]


_STEP_UNUSED = tuple(f"/{Model.DRAFT.value}/{key}" for key in ("tiles", "fusions", "pdl", "reduce"))


def _idle_under_step(plan: Plan, cand: Candidate) -> bool:
    """Whether `cand` edits what a step launch does not read (the draft's tiles, fusions, pdl and
    reduce), or adds a second stream, beside which the step launch lost (facts:
    form_step_two_streams): a new plan and the same round, or a measured loss."""
    if plan[Model.DRAFT.value]["form"] != "step" or any(op["path"] == f"/{Model.DRAFT.value}/form" for op in cand.patch):
        return False
    return any(op["path"].startswith(_STEP_UNUSED) or (op["path"] == "/cross/streams" and op.get("value") == "two")
               for op in cand.patch)
