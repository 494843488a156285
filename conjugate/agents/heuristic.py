"""The heuristic proposer: rule-based plan edits, offline and deterministic.

Edits come first from what the node's result says, then from broader local moves:

    measured tiles       each GEMM and attention kind's tile set to the one measured fastest alone
                         for its shape on this GPU model (search/tiles.json, written by
                         benchmarks/kernel_sweep.py), scored by its measured gain over the shipped tile,
                         weighed by the kind's share of the round where the ledger lists it
    time ledger          tile moves for the GEMM and attention kinds that lose most against their
                         bytes' floor (the result's ledger), and the fusions that remove the launches
                         of norm kinds losing most, scored by their share of the loss
    failed node          undo the likely cause: smaller tiles or fewer stages for the part the
                         compile error names, separate operands, no pairing in a failing launch
    interference         keep the draft part out of that target launch (override pair: false) or
                         drop the draft kind from pairs[target kind]
    gain                 pair the same draft kind with similar target kinds, and similar draft kinds
                         with that target kind
    idle multiprocessors target launches with fewer programs than the GPU's SMs (context.sms)
                         take more draft kinds (switching a sequential plan to a cross-model
                         alignment)
    two streams          tile moves for the target's longest GEMMs and the draft's GEMMs, which
                         share the multiprocessors all round; the busier stream (the ledger's)
                         served first (`priority`); giving the streams up ranks lower, and so do
                         the idle-multiprocessor moves (the other stream fills those SMs)
    broader moves        tile-shape local search (halve/double one tile key, the kinds of
                         interfering or under-filled launches first), launch parameters, interleave
                         pattern and ratio, fusions (every fusion the draft lacks in one edit
                         first), alignment, streams, operand layout, how split-K residual GEMMs
                         sum their splits, persistent launches and tile loops, programmatic
                         dependent launch (the draft's and the busier stream's first)

Candidates that make the same plan count once (the first ranked). Each has a base score; the
search's edit statistics shift the scores of their kinds (kinds with a positive mean gain rise), a
kind already chosen loses a little for the next pick so the proposals stay diverse, and the final
score becomes the proposal's prior. A random.Random seeded by the proposer's seed, the plan hash
and the number of children tried orders near-equal candidates, so the same context always gives the
same proposals and a revisited node gets new ones.

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
from dataclasses import dataclass
from pathlib import Path

from conjugate.agents.base import NodeContext, Proposal
from conjugate.agents.heuristic_edits import (LIGHT_TARGETS, NORM_FUSIONS, NORM_FUSIONS_WITH_PDL, SEARCH_KEYS,
                                              Candidate, Launches, enable_pairing, fill_by_kind, gain_edits,
                                              headroom_edits, launch_parts, measured_tile_edits, pdl_edits,
                                              repair_edits, scaled, set_pairs, set_tile, sm_limit_edits, spill_edits,
                                              split_edits, tile_value)
from conjugate.agents.tile_table import TileTable, load_tile_tables, table_for
from conjugate.errors import ConjugateError
from conjugate.paths import TILES_FILE
from conjugate.evaluate.result import EvalResult, KindLoss, LedgerSummary, Verdict, VerdictKind
from conjugate.graph import GEMM_KINDS, KINDS, LAYER_KINDS
from conjugate.plan.expand import MAIN_KINDS, RESIDUAL_GEMMS
from conjugate.plan.patch import patch_plan
from conjugate.plan.schema import BARRIER_SPANS, FUSIONS, MODEL_KEYS, SPANS, Plan, validate_plan
from conjugate.plan.tiles import FAMILY_OF, LAUNCH_BOUNDS
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

    def measured(self, context: NodeContext) -> TileTable | None:
        """The measured tiles of the GPU model the node is evaluated on."""
        return table_for(context.device, self.tile_tables)

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
        if "gate_up+down" in a["fusions"][model] and "gate_up+down" in b["fusions"][model]:
            for d in (a, b):
                d["tiles"][model].pop("down", None)
                d["tiles"][model].get("gate_up", {}).pop("SPLIT_K", None)
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


@dataclass(frozen=True)
class Focus:
    """A model's op kind whose tiles to move first, and why."""
    model: Model
    kind: str
    why: str
    wider: bool  # moves that add programs come first
    score: float


def candidates(plan: Plan, result: EvalResult | None, sms: int, rng: random.Random,
               workload: dict | None = None, tiles: TileTable | None = None) -> list[Candidate]:
    """Every candidate edit, result-driven first (unordered beyond their base scores); `sms`: the
    GPU's multiprocessors, which a launch's programs should fill; `workload` (its layer counts and
    k) places pins of mixed plans and, with `tiles` (the GPU model's measured tiles), gives each
    GEMM's shape."""
    parts = launch_parts(result)
    verdicts = result.verdicts if result else ()
    out = [] if result is None else repair_edits(plan, result) if not result.ok else spill_edits(plan, result)
    ledger = result.metrics.ledger if result is not None and result.metrics is not None else None
    out += measured_tile_edits(plan, workload, tiles, ledger)
    out += split_edits(plan, verdicts) + gain_edits(plan, verdicts) + headroom_edits(plan, parts, sms)
    interfering = any(v.verdict is VerdictKind.INTERFERENCE for v in verdicts)
    focus = _ledger_focus(ledger) + _focus(verdicts, parts, sms, plan["streams"] == "two") + _two_stream_focus(plan)
    out += tile_edits(plan, focus, rng) + launch_edits(plan, rng)
    out += pattern_edits(plan, interfering) + fusion_edits(plan, ledger) + alignment_edits(plan)
    out += streams_edits(plan, ledger) + mixed_edits(plan, verdicts, workload) + layout_edits(plan)
    out += reduce_edits(plan) + persist_edits(plan, sms, verdicts, ledger) + pdl_edits(plan, ledger)
    measured = result is not None and not result.modeled  # a model ignores the limit: no use proposing it
    return out + (sm_limit_edits(plan, sms, ledger) if measured else [])


def _loss_shares(ledger: LedgerSummary | None) -> list[tuple[str, str, float, KindLoss]]:
    """(model, op kind, share of the ledger's listed loss, its entry) for every part of every listed kind."""
    if ledger is None:
        return []
    total = sum(max(k.loss_ms, 0.0) for k in ledger.kinds) or 1.0
    return [(model, kind, max(k.loss_ms, 0.0) / total, k) for k in ledger.kinds for model, kind in k.parts
            if model in MODEL_KEYS and kind in FAMILY_OF]


def _ledger_focus(ledger: LedgerSummary | None) -> list[Focus]:
    """The GEMM and attention kinds the ledger says lose most, biggest loss first."""
    return [Focus(Model(model), kind, f"the ledger: {k.kind} runs {k.loss_ms:.2f} ms over its floor at "
                                      f"{k.bandwidth_fraction:.0%} of copy bandwidth", False, 0.5 + 0.25 * share)
            for model, kind, share, k in _loss_shares(ledger) if FAMILY_OF[kind] in SEARCH_KEYS]


def _focus(verdicts: tuple[Verdict, ...], parts: Launches, sms: int, two_streams: bool = False) -> list[Focus]:
    """Parts of interfering launches, then target kinds whose launches leave SMs idle. Under two
    streams the draft's kernels take the idle SMs already, so those rank lower: on the H200, widening
    such target launches of `streams` never gained more than 0.2% in five workloads and mostly lost
    (benchmarks/results/eval_time_h200.json)."""
    out = []
    for v in sorted(verdicts, key=lambda v: v.gain_percent):
        if v.verdict is VerdictKind.INTERFERENCE:
            why = f"launch {v.launch} interferes ({v.gain_percent:+.1f}%)"
            out += [Focus(p.model, p.kind, why, False, 0.66) for p in v.parts]
    fill = fill_by_kind(parts)
    for kind in sorted((k for k, p in fill.items() if p < sms), key=lambda k: fill[k]):
        out.append(Focus(Model.TARGET, kind, f"target {kind} launches fill {fill[kind]} of {sms} SMs", True,
                         0.42 if two_streams else 0.6))
    return [f for f in out if FAMILY_OF[f.kind] in SEARCH_KEYS]


def _two_stream_focus(plan: Plan) -> list[Focus]:
    """Under two streams the phases share the multiprocessors for the whole round: the target's big
    GEMMs set its length, and every draft program takes a multiprocessor from them."""
    if plan["streams"] != "two":
        return []
    out = [Focus(Model.TARGET, k, "two streams: the verify stream's longest GEMMs set the round", False, 0.5)
           for k in ("gate_up", "down", "qkv", "lm_head", "o_proj")]
    return out + [Focus(Model.DRAFT, k, "two streams: draft programs take multiprocessors from the verify stream",
                        False, 0.46) for k in ("qkv", "o_proj", "down", "gate_up", "attn")]


def tile_edits(plan: Plan, focus: list[Focus], rng: random.Random) -> list[Candidate]:
    """Halve or double one tile key of one op kind: focused kinds first, then every GEMM and
    attention kind of both models in a seeded random order."""
    out, done = [], set()
    for f in sorted(focus, key=lambda f: -f.score):  # stable: equal scores keep their order
        if (f.model, f.kind) not in done:
            done.add((f.model, f.kind))
            out += _tile_moves(plan, f.model, f.kind, f.why, f.score, f.wider, rng.randrange(6))
    rest = [(m, k) for m in MODEL_KEYS for k in GEMM_KINDS + ("attn",) if (m, k) not in done]
    for m, k in rest:
        out += _tile_moves(plan, m, k, "local tile search", 0.3 + 0.1 * rng.random(), False, rng.randrange(6))
    return out


def _tile_moves(plan: Plan, model: str, kind: str, why: str, score: float, wider: bool, start: int) -> list[Candidate]:
    """Both directions of every searched key, in an order rotated to begin at move `start` (the
    proposer's seeded choice); with `wider`, moves that add programs come before the others. Each
    further move of the kind scores a little less, so several kinds' first moves come before any
    kind's last."""
    moves = []
    for key in SEARCH_KEYS[FAMILY_OF[kind]]:
        for factor in (2.0, 0.5):
            new = scaled(plan, model, kind, key, factor)
            if new is not None:
                more_programs = key != "BLOCK_K" and (factor > 1) == key.startswith("SPLIT")
                moves.append((key, new, 0.03 if wider and more_programs else 0.0))
    if moves:
        start %= len(moves)
        moves = moves[start:] + moves[:start]
        moves.sort(key=lambda m: -m[2])  # stable: the rotation holds within each group
    return [Candidate("tiles", set_tile(plan, model, kind, key, new),
                      f"{why}: {model} {kind} {key} {tile_value(plan, model, kind, key)} -> {new}",
                      score + bonus - 0.01 * j)
            for j, (key, new, bonus) in enumerate(moves)]


def launch_edits(plan: Plan, rng: random.Random) -> list[Candidate]:
    out = []
    for key, factor in (("num_warps", 2.0), ("num_warps", 0.5), ("num_stages", 2.0), ("num_stages", 0.5)):
        now, (low, high) = plan["launch"][key], LAUNCH_BOUNDS[key]
        new = now + (1 if factor > 1 else -1) if key == "num_stages" else int(now * factor)
        if new != now and low <= new <= high:
            out.append(Candidate("launch", [{"op": "replace", "path": f"/launch/{key}", "value": new}],
                                 f"default launch {key} {now} -> {new}", 0.28 + 0.04 * rng.random()))
    return out


def pattern_edits(plan: Plan, interfering: bool) -> list[Candidate]:
    """Other interleave patterns and ratios; only meaningful where launches are shared."""
    if plan["alignment"] == "sequential":
        return []
    now, (t, d) = plan["interleave"]["pattern"], plan["interleave"]["ratio"]
    options = [(p, [1, 1]) for p in ("blocked", "strided") if p != now]
    options += [("ratio", r) for r in ([2 * t, d], [t, 2 * d]) if max(r) <= 64] if now == "ratio" else [
        ("ratio", [2, 1]), ("ratio", [1, 2])]
    score = 0.5 if interfering else 0.4
    why = "shared launches interfere" if interfering else "reshape how shared launches split their programs"
    return [Candidate("pattern", [{"op": "replace", "path": "/interleave", "value": {"pattern": p, "ratio": r}}],
                      f"{why}: interleave {now} -> {p}" + (f" {r[0]}:{r[1]}" if p == "ratio" else ""), score)
            for p, r in options]


# fusions that made rounds slower on the H200 wherever measured (benchmarks/README.md, "The fused MLP")
MEASURED_SLOWER = {"gate_up+down": "one launch fewer, but on the H200 rounds ran 0.3-3.3% slower with it"}


def fusion_edits(plan: Plan, ledger: LedgerSummary | None = None) -> list[Candidate]:
    """Each fusion on or off; a fusion whose absorbed op (the one not named after the unit) the
    ledger lists as losing time ranks by that loss's share. Where the draft lacks two or more, also
    all of them at once, first: most fusions the H200 searches tried on a draft gained, and one
    evaluation then does the work of several (benchmarks/results/eval_time_h200.json); with fused
    norms reading row statistics that one edit took a qwen3-06b-8b-b4 round 7.5% down, the largest
    step of its search (benchmarks/README.md, "A short search"). Not for the
    target, whose large GEMMs can lose by a fused prologue (benchmarks/README.md). A fusion measured
    slower on the H200 (MEASURED_SLOWER) is left out of that edit and offered alone, ranked low."""
    losing = {(model, kind): (share, k) for model, kind, share, k in reversed(_loss_shares(ledger))}
    out = []
    for model in MODEL_KEYS:
        on = plan["fusions"][model]
        missing = [f for f in FUSIONS if f not in on]
        together = [f for f in missing if f not in MEASURED_SLOWER]
        if model == Model.DRAFT.value and len(together) > 1:
            out.append(_all_fusions(plan, model, together, [losing[(model, a)] for a in
                                                            {_absorbed(f) for f in together} if (model, a) in losing]))
        for f in FUSIONS:
            if f in on:
                out.append(Candidate("fusion", [{"op": "remove", "path": f"/fusions/{model}/{on.index(f)}"}],
                                     f"unfuse {f} in the {model}: smaller units pair more easily", 0.25))
                continue
            if f in MEASURED_SLOWER:
                out.append(Candidate("fusion", [{"op": "add", "path": f"/fusions/{model}/-", "value": f}],
                                     f"fuse {f} in the {model}: {MEASURED_SLOWER[f]}", 0.2))
                continue
            why, score = f"fuse {f} in the {model}: one launch fewer each time it runs", 0.4
            absorbed = _absorbed(f)
            if (model, absorbed) in losing:
                share, k = losing[(model, absorbed)]
                why += f" (the ledger: {k.kind} runs {k.loss_ms:.2f} ms over its floor)"
                score += 0.25 * share * _launch_part(k)
            out.append(Candidate("fusion", [{"op": "add", "path": f"/fusions/{model}/-", "value": f}], why, score))
    return out


LAUNCH_FIXED_MS = 0.003  # a launch's start, ramp and tail: 3.2-7.2 us (benchmarks/README.md, kernel_sweep --fit)


def _launch_part(k: KindLoss) -> float:
    """The share of a kind's loss that a fusion removing its launches can win back: at most their
    fixed cost each (all of a norm's microsecond loss; of a long GEMM's, only its launches' starts:
    fusing down into the MLP keeps its weights to stream)."""
    return min(1.0, k.launches * LAUNCH_FIXED_MS / k.loss_ms) if k.loss_ms > 0 else 0.0


PER_STEP_FUSIONS = ("final_norm+", "lm_head+")  # run once per decode step, not per layer


def _all_fusions(plan: Plan, model: str, missing: list[str], lost: list[tuple[float, KindLoss]]) -> Candidate:
    """Every fusion `missing` in one edit; where it fuses a norm into a model whose launches are
    released at the start of their work (`pdl`), they are released at the end instead (NORM_FUSIONS)."""
    per_step = [f for f in missing if f.startswith(PER_STEP_FUSIONS)]
    fewer = f"{len(missing) - len(per_step)} launches fewer per layer" + (f" and {len(per_step)} per step" if per_step else "")
    why = f"fuse {', '.join(missing)} in the {model}: {fewer}"
    if lost:
        why += f" (the ledger: their ops run {sum(k.loss_ms for _, k in lost):.2f} ms over their floor)"
    patch = [{"op": "add", "path": f"/fusions/{model}/-", "value": f} for f in missing]
    if plan["pdl"][model]["trigger"] == "start" and any(f in NORM_FUSIONS for f in missing):
        patch.append({"op": "replace", "path": f"/pdl/{model}/trigger", "value": "end"})
        why += f"; its launches released at the end, not the start ({NORM_FUSIONS_WITH_PDL})"
    return Candidate("fusion", patch, why, 0.6 + 0.25 * sum(share for share, _ in lost))


def _persistent_verdicts(verdicts: tuple[Verdict, ...], model: str) -> list[Verdict]:
    """Verdicts of `model`'s persistent launches (several parts, all of that model), worst first."""
    return sorted((v for v in verdicts if len(v.parts) > 1 and {p.model.value for p in v.parts} == {model}),
                  key=lambda v: v.gain_percent)


PERSIST_PRELOAD_MEASURED = ("on the H200 persistent draft layers' rounds -16%, -2.9%, +0.9% with it on three "
                            "workloads, all still slower than their launches")
TICKETS_MEASURED = ("on the H200 ticket-ordered draft layers made the best plans' rounds 15-23% slower on three "
                    "workloads, each layer alone 4% faster to 39% slower than its parts launched one by one "
                    "(benchmarks/results/tickets_h200.json)")


def persist_edits(plan: Plan, sms: int, verdicts: tuple[Verdict, ...] = (),
                  ledger: LedgerSummary | None = None) -> list[Candidate]:
    """Per model, its launches joined into one persistent launch per layer or per decode step, or
    back to separate launches; a persistent launch on as many programs as fit at once, one per SM,
    or one per SM on half of them (two streams: the other model's kernels keep the rest); prefetch
    on or off. Aimed at the draft first: its chain of short, latency-bound launches is the longer
    stream for small drafts (benchmarks/README.md, floor.py). Whether a grid-wide barrier costs less
    than a launch boundary is for the measurements (the launches' verdicts) to say.
    With two streams, also the target's launches as tile loops (span `launch`): the draft's short
    kernels then find SMs free instead of queueing behind the target's. On three quarters of the SMs,
    or, where the ledger says the draft's stream is the busier one, on the share of them the target's
    busy time needs of the draft's (no fewer than a quarter). Ranked low: on the H200
    (results/knobs_h200.json) the draft's stream did run 12-28% faster beside them, but the target's
    loops on 99 or 66 programs ran 1.5-1.8x longer, and the rounds 10-71% slower."""
    throttle = _target_throttle(ledger, sms) if plan["streams"] == "two" else None
    out = []
    for model in MODEL_KEYS:
        now, draft = plan["persist"][model], model == Model.DRAFT.value
        measured = _persistent_verdicts(verdicts, model)
        worst, best = (measured[0], measured[-1]) if measured else (None, None)
        other = next(m for m in MODEL_KEYS if m != model)
        both = plan["streams"] == "two" and _grid_barriers(plan, other)  # refused: see schema
        tickets = now["order"] == "tickets"
        for span in SPANS:
            # refused with grid barriers: its grid needs every SM; ticket order needs none resident
            limited = plan["sm_limit"][model] and span in BARRIER_SPANS and not tickets
            if span == now["span"] or (both and span in BARRIER_SPANS and not tickets) or (span == "launch" and draft) \
                    or limited:
                continue
            value = now | {"span": span} if span != "none" else {"span": "none", "programs": 0, "prefetch": True}
            if span not in BARRIER_SPANS:  # no barrier to load ahead of, no parts to order
                value = value | {"preload": False, "order": "grid"}
            if span == "launch":
                value = value | {"programs": throttle[0] if throttle else max(1, 3 * sms // 4)}
            elif now["span"] == "launch":
                value = value | {"programs": 0}
            why = {"none": f"the {model}'s launches run separately again",
                   "launch": f"each {model} launch a tile loop on {value['programs']} programs: the other stream's "
                             f"kernels find SMs free",
                   "layer": f"each {model} layer in one persistent launch: grid barriers instead of launch boundaries",
                   "step": f"each {model} decode step in one persistent launch"}[span]
            if span == "launch" and throttle:
                why += f" ({throttle[1]})"
            score = {"none": 0.2, "launch": 0.1 if plan["streams"] == "two" else 0.05,
                     "layer": 0.45 if draft else 0.25, "step": 0.3 if draft else 0.15}[span]
            if worst is not None and worst.verdict is VerdictKind.INTERFERENCE and span == "none":
                why += (f": persistent launch {worst.launch} took {worst.shared_us:.1f} us against "
                        f"{worst.separate_us:.1f} for its parts launched one by one")
                score = 0.7
            elif best is not None and best.verdict is VerdictKind.GAIN and span == "step":
                why += f": persistent launch {best.launch} gained {best.gain_percent:+.1f}% over its parts"
                score = 0.55
            patch = [{"op": "replace", "path": f"/persist/{model}", "value": value}]
            out.append(Candidate("launch", patch, why, score))
        if now["span"] == "none" and draft:  # a draft layer ticket-ordered: last, as measured
            value = {"span": "layer", "order": "tickets", "programs": 0, "prefetch": True, "preload": False}
            patch = [{"op": "replace", "path": f"/persist/{model}", "value": value}]
            if plan["pdl"][model]["trigger"] != "none":  # a joined launch waits for the kernel before once
                patch.append({"op": "replace", "path": f"/pdl/{model}", "value": {"trigger": "none", "prefetch": False}})
            out.append(Candidate("launch", patch,
                                 f"each {model} layer one ticket-ordered launch: its tiles taken in dependency order, "
                                 f"each waiting for the part before, not for a launch boundary ({TICKETS_MEASURED})",
                                 0.12))  # above the tile loops (rounds +10-71%), below the rest
        elif now["span"] in BARRIER_SPANS and not (tickets and (both or plan["sm_limit"][model])):
            order = "grid" if tickets else "tickets"  # back to barriers only where the plan allows them
            out.append(Candidate("launch", [{"op": "replace", "path": f"/persist/{model}/order", "value": order}],
                                 f"{model} persistent launches ordered by {'grid barriers' if tickets else 'tickets'}"
                                 + ("" if tickets else f" ({TICKETS_MEASURED})"), 0.3 if tickets else 0.1))
        if now["span"] == "launch":
            grids = {max(1, sms // 2), sms} | ({throttle[0]} if throttle else set())
            for programs in sorted(grids - {now["programs"]}):
                out.append(Candidate("launch", [{"op": "replace", "path": f"/persist/{model}/programs",
                                                 "value": programs}],
                                     f"{model} tile loops on {programs} programs", 0.25))
        elif now["span"] != "none":
            on = not now["prefetch"]
            wait = "before each tile waits for the part before" if tickets else "while waiting at a barrier"
            out.append(Candidate("launch", [{"op": "replace", "path": f"/persist/{model}/prefetch", "value": on}],
                                 f"{model} persistent launches {'prefetch' if on else 'no longer prefetch'} the next "
                                 f"part's weights {wait}", 0.3 if on else 0.2))
            load = not now["preload"]
            out.append(Candidate("launch", [{"op": "replace", "path": f"/persist/{model}/preload", "value": load}],
                                 f"{model} persistent launches' GEMM tiles {'' if load else 'no longer '}load their "
                                 f"first weight step into registers before the barrier ahead of them "
                                 f"({PERSIST_PRELOAD_MEASURED})",
                                 0.3 if load else 0.2))
            choices = [0] if now["programs"] else [max(1, sms // 2), sms]
            for programs in choices:
                why = {0: f"{model} persistent launches on "
                          f"{'one program per tile' if tickets else 'as many programs as the GPU holds at once'}",
                       sms: f"{model} persistent launches on one program per SM",
                       }.get(programs, f"{model} persistent launches on {programs} programs, one per SM on half the "
                                       f"{sms} SMs: the other stream keeps the rest")
                score = 0.35 if plan["streams"] == "two" and programs == sms // 2 else 0.25
                out.append(Candidate("launch", [{"op": "replace", "path": f"/persist/{model}/programs",
                                                 "value": programs}], why, score))
    return out


def _grid_barriers(plan: Plan, model: str) -> bool:
    """Whether a model's persistent launches wait at grid barriers (every program resident)."""
    return plan["persist"][model]["span"] in BARRIER_SPANS and plan["persist"][model]["order"] == "grid"


def _target_throttle(ledger: LedgerSummary | None, sms: int) -> tuple[int, str] | None:
    """(programs, why) of the target's tile loops where the ledger's draft stream is the busier one:
    the SMs in the proportion of the target's busy time to the draft's, between a quarter and three
    quarters of them."""
    busy = ledger.streams if ledger is not None else {}
    draft, target = busy.get(Model.DRAFT.value, 0.0), busy.get(Model.TARGET.value, 0.0)
    if not (draft > target > 0):
        return None
    programs = min(max(1, 3 * sms // 4), max(1, sms // 4, round(sms * target / draft)))
    lead = (draft - target) / draft
    return programs, (f"the ledger: the draft's stream is busy {draft:.2f} ms against the "
                      f"target's {target:.2f}, so the target has {lead:.0%} to spare")


def reduce_edits(plan: Plan) -> list[Candidate]:
    """Per model whose residual GEMMs (o_proj, down) split K: their splits summed atomically, which
    takes the fix-up step (a counter, then the last split reading every partial back) off the
    chain of dependent kernels; or back to the ordered, deterministic sum. Scored from the H200
    searches (search/facts.toml): atomic sums beat their parent 26 times of 27 in the draft (median
    +3.0%) and 31 of 31 in the target (median +1.0%)."""
    if _packs(plan):  # a packed launch runs both models' GEMMs in one tile loop: one sum for both
        now = plan["split_reduce"][Model.TARGET.value]
        other = "ordered" if now == "atomic" else "atomic"
        both = [{"op": "replace", "path": f"/split_reduce/{m}", "value": other} for m in MODEL_KEYS]
        return [Candidate("launch", both, f"split-K residual GEMMs of both models (packed) sum {other}",
                          0.4 if other == "atomic" else 0.2)]
    out = []
    for model in MODEL_KEYS:
        splits = {k: plan["tiles"][model].get(k, {}).get("SPLIT_K", 1) for k in RESIDUAL_GEMMS}
        split = [k for k, n in splits.items() if n > 1]
        if plan["split_reduce"][model] == "atomic":
            out.append(Candidate("launch", [{"op": "replace", "path": f"/split_reduce/{model}", "value": "ordered"}],
                                 f"{model} split-K sums in split order again: deterministic", 0.2))
        elif split:
            out.append(Candidate("launch", [{"op": "replace", "path": f"/split_reduce/{model}", "value": "atomic"}],
                                 f"{model} {' and '.join(split)} add their {max(splits.values())} split-K partials "
                                 f"atomically: no fix-up step in each launch", 0.6 if model == Model.DRAFT.value
                                 else 0.5))
    return out


def _packs(plan: Plan) -> bool:
    return plan["operand_layout"] == "packed" or any(o.get("operand_layout") == "packed" for o in plan["overrides"])


def _absorbed(fusion: str) -> str:
    """The op whose launches a fusion removes (the one not named after the unit)."""
    return next(k for k in fusion.split("+") if k not in MAIN_KINDS)


def alignment_edits(plan: Plan) -> list[Candidate]:
    """Other alignments. A two-stream plan gives its streams up for shared launches, so from one
    these rank below the edits that keep them."""
    if plan["alignment"] != "sequential":
        other = "greedy" if plan["alignment"] == "proportional" else "proportional"
        return [Candidate("alignment", [{"op": "replace", "path": "/alignment", "value": other}],
                          f"alignment {plan['alignment']} -> {other}: draft units meet other target launches", 0.4),
                Candidate("alignment", [{"op": "replace", "path": "/alignment", "value": "sequential"}],
                          "alignment -> sequential: no shared launches at all", 0.15)]
    pairs = [] if plan["pairs"] else [op for t in LIGHT_TARGETS for op in set_pairs(plan, t, set(KINDS))]
    two = plan["streams"] == "two"
    return [Candidate("alignment", enable_pairing(plan, a) + pairs,
                      f"alignment sequential -> {a}: draft units ride inside target launches"
                      + (f" ({', '.join(LIGHT_TARGETS)} take any draft kind)" if pairs else "")
                      + (" instead of running on their own stream" if two else ""), score)
            for a, score in (("proportional", 0.3 if two else 0.65), ("greedy", 0.24 if two else 0.5))]


def streams_edits(plan: Plan, ledger: LedgerSummary | None = None) -> list[Candidate]:
    """One stream or two; with two, which model's stream the GPU serves first: the one the ledger
    says is busier (the round's critical path), else the draft's chain of short kernels."""
    if plan["streams"] == "two":
        unset = [{"op": "replace", "path": "/priority", "value": "none"}] if plan["priority"] != "none" else []
        out = [Candidate("streams", [{"op": "replace", "path": "/streams", "value": "one"}] + unset,
                         "streams two -> one: no cross-stream joins", 0.25)]
        busy = ledger.streams if ledger is not None else {}
        first = max(MODEL_KEYS, key=lambda m: busy.get(m, 0.0)) if len(busy) > 1 else Model.DRAFT.value
        why = (f"its stream is busier ({busy[first]:.2f} ms against {min(busy.values()):.2f}): the critical path"
               if len(busy) > 1 else "its chain of short dependent kernels sets the round")
        for choice in (first, next(m for m in MODEL_KEYS if m != first), "none"):
            if choice != plan["priority"]:
                reason = f"priority {plan['priority']} -> {choice}: " + (
                    f"the GPU serves the {choice} stream first, {why}" if choice == first else
                    "the GPU serves neither stream first" if choice == "none" else
                    f"the GPU serves the {choice} stream first")
                out.append(Candidate("streams", [{"op": "replace", "path": "/priority", "value": choice}], reason,
                                     0.5 if choice == first else 0.3))
        return out
    if plan["alignment"] != "sequential" or any("with" in o for o in plan["overrides"]):
        return []
    return [Candidate("streams", [{"op": "replace", "path": "/streams", "value": "two"}],
                      "streams one -> two: the draft phase overlaps the verify pass", 0.45)]


MIXED_PAIRS = (("o_proj", "down"), ("qkv", "attn"), ("o_proj", "attn"), ("qkv", "down"))  # target, draft


def mixed_edits(plan: Plan, verdicts: tuple[Verdict, ...], workload: dict | None) -> list[Candidate]:
    """Two streams with a few shared launches: pin a draft op into the target launch running at the
    same point of its chain (halfway through both phases); from the verdicts of pins already made,
    more pins of a pair that beat its parts on two streams, and the undoing of one that lost."""
    if plan["streams"] != "two" or not workload or "k" not in workload:
        return []
    pins = [(n, o) for n, o in enumerate(plan["overrides"]) if "with" in o]
    out = []
    for v in verdicts:
        if v.overlap_verdict is None or len(v.parts) != 2:
            continue
        n = next((n for n, o in pins if o["with"] in v.parts[1].ops + v.parts[0].ops), None)
        if n is not None and v.overlap_verdict is VerdictKind.INTERFERENCE:
            out.append(Candidate("override", [{"op": "remove", "path": f"/overrides/{n}"}],
                                 f"pinned launch {v.launch} loses to its parts on two streams "
                                 f"({v.overlap_gain_percent:+.1f}%): unpin {plan['overrides'][n]['with']}", 0.7))
    gaining = {(v.parts[0].kind, v.parts[1].kind) for v in verdicts
               if v.overlap_verdict is VerdictKind.GAIN and len(v.parts) == 2}
    placed = [(_chain_position(o["match"]), _chain_position(o["with"])) for _, o in pins]
    k, layers_d, layers_t = int(workload["k"]), workload["draft"]["num_layers"], workload["target"]["num_layers"]
    for t_kind, d_kind in sorted(gaining) + [p for p in MIXED_PAIRS if p not in gaining]:
        for share in ((0.25, 0.5, 0.75) if (t_kind, d_kind) in gaining else (0.5,)):
            step, layer = divmod(int(share * k * layers_d), layers_d)
            t_op, d_op = f"t.l{int(share * layers_t)}.{t_kind}", f"d.s{step}.l{layer}.{d_kind}"
            t_at, d_at = _chain_position(t_op), _chain_position(d_op)
            if any(t_at == t or d_at == d or (t_at < t) != (d_at < d) for t, d in placed):
                continue  # a taken op, or a pin crossing one made already (it could not be scheduled)
            why = (f"draft {d_kind} beside target {t_kind} beat two streams: pin {d_op} into {t_op} too"
                   if (t_kind, d_kind) in gaining else
                   f"mixed plan: pin {d_op} into {t_op}, which runs at the same point of its phase "
                   f"({share:.0%}): one shared launch, the rest on two streams")
            out.append(Candidate("override", [{"op": "add", "path": "/overrides/-",
                                               "value": {"match": t_op, "with": d_op}}],
                                 why, 0.55 if (t_kind, d_kind) in gaining else 0.3))
    return out


def _chain_position(op: str) -> tuple:
    """Where an op id (t.l<layer>.<kind>, d.s<step>.l<layer>.<kind>) stands in its model's chain;
    ids of another form (globs, embed, lm_head) come last."""
    parts = op.split(".")
    numbers = tuple(int(p[1:]) for p in parts[1:-1] if p[:1] in "ls" and p[1:].isdigit())
    kind = LAYER_KINDS.index(parts[-1]) if parts[-1] in LAYER_KINDS else len(LAYER_KINDS)
    return numbers + (kind,) if len(numbers) == len(parts) - 2 else (float("inf"),)


def layout_edits(plan: Plan) -> list[Candidate]:
    if plan["alignment"] == "sequential":
        return []
    other = "packed" if plan["operand_layout"] == "separate" else "separate"
    why = "one tile loop streams both models' weights" if other == "packed" else "each model reads its own weights"
    return [Candidate("layout", [{"op": "replace", "path": "/operand_layout", "value": other}],
                      f"operand layout {plan['operand_layout']} -> {other}: {why}", 0.35)]
