"""Tile edits: each model's tile shapes per op kind, and the launch parameters every tile defaults to.

    measured tiles   each GEMM and attention kind's tile set to the one measured fastest alone for its
                     shape on this GPU model (search/tiles.json; where its table lacks the shape, on
                     another model of its chip, its gain discounted by the measured transfer cost),
                     scored by its gain over the shipped tile, weighed by the kind's share of the
                     round where the ledger lists it
    focus            halve or double one tile key of the kinds that lose most against their bytes'
                     floor (the ledger), of interfering or under-filled launches, and under two
                     streams of the longest GEMMs; then every GEMM and attention kind, seeded order
    shrink           smaller tiles or one stage fewer for a part that spills or fails to compile
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from conjugate.agents.facts import figure
from conjugate.agents.heuristic.candidate import Candidate, Launches, fill_by_kind, loss_shares
from conjugate.agents.heuristic.tile_table import MeasuredTiles
from conjugate.compiler.feedback import PartRef
from conjugate.evaluate.result import EvalResult, LedgerSummary, Verdict, VerdictKind
from conjugate.graph import GEMM_KINDS
from conjugate.plan.schema import MODEL_KEYS, Plan
from conjugate.plan.tiles import DEFAULT_TILES, FAMILY_OF, LAUNCH_BOUNDS, TILE_BOUNDS
from conjugate.roles import Model

SEARCH_KEYS = {"gemm": ("BLOCK_N", "BLOCK_K", "SPLIT_K"), "attn": ("BLOCK_N", "SPLIT_KV")}
SHRINK_KEYS = {"gemm": ("BLOCK_K", "BLOCK_N", "BLOCK_M"), "attn": ("BLOCK_N",), "elementwise": ("BLOCK",)}


def tile_value(plan: Plan, model: str, kind: str, key: str) -> int:
    cfg = plan[model]["tiles"].get(kind, {})
    return cfg.get(key, DEFAULT_TILES[FAMILY_OF[kind]].get(key, plan["cross"]["launch"].get(key, 1)))


def set_tile(plan: Plan, model: str, kind: str, key: str, value: int) -> list[dict]:
    if kind in plan[model]["tiles"]:
        return [{"op": "add", "path": f"/{model}/tiles/{kind}/{key}", "value": value}]
    return [{"op": "add", "path": f"/{model}/tiles/{kind}", "value": {key: value}}]


def set_tiles(plan: Plan, model: str, kind: str, values: dict[str, int]) -> list[dict]:
    """Set several keys of one op kind's tile at once (the others kept)."""
    return [{"op": "add", "path": f"/{model}/tiles/{kind}", "value": plan[model]["tiles"].get(kind, {}) | values}]


def scaled(plan: Plan, model: str, kind: str, key: str, factor: float) -> int | None:
    """The key's value halved or doubled (num_stages: one down or up), None when out of bounds."""
    low, high = (TILE_BOUNDS[FAMILY_OF[kind]] | LAUNCH_BOUNDS)[key]
    now = tile_value(plan, model, kind, key)
    new = now + (1 if factor > 1 else -1) if key == "num_stages" else int(now * factor)
    return new if low <= new <= high and new != now else None


def shrink(plan: Plan, part: PartRef, head: PartRef, score: float, why: str) -> list[Candidate]:
    """Halve the part's largest tile keys, then one stage fewer for its launch (set on the head
    part, whose tile config carries the launch parameters). A part without tiles (the draft's step
    launch) has none to shrink."""
    if part.kind not in FAMILY_OF or head.kind not in FAMILY_OF:
        return []
    keys = sorted(SHRINK_KEYS[FAMILY_OF[part.kind]], key=lambda k: -tile_value(plan, part.model, part.kind, k))
    out = []
    for i, (p, key) in enumerate([(part, k) for k in keys] + [(head, "num_stages")]):
        new = scaled(plan, p.model, p.kind, key, 0.5)
        if new is not None:
            was = tile_value(plan, p.model, p.kind, key)
            out.append(Candidate("tiles", set_tile(plan, p.model, p.kind, key, new),
                                 f"{why}: {p.model} {p.kind} {key} {was} -> {new}", score - 0.02 * i))
    return out


def spill_edits(plan: Plan, result: EvalResult) -> list[Candidate]:
    """GPU feedback: launches whose registers spill get smaller tiles or one stage fewer, ranked by
    how many spill (a couple cost little; dozens go through local memory in the main loop)."""
    out = []
    for f in result.feedback:
        if f.resources.spills and f.parts:
            why = f"launch {f.launch} spills {f.resources.spills} registers"
            score = 0.5 + min(0.3, f.resources.spills / 100)
            out += [c for p in f.parts for c in shrink(plan, p, f.parts[0], score, why)]
    return out


def launch_edits(plan: Plan, rng: random.Random) -> list[Candidate]:
    """The launch parameters every tile takes unless it sets its own: warps halved or doubled, one
    stage more or fewer."""
    out = []
    for key, factor in (("num_warps", 2.0), ("num_warps", 0.5), ("num_stages", 2.0), ("num_stages", 0.5)):
        now, (low, high) = plan["cross"]["launch"][key], LAUNCH_BOUNDS[key]
        new = now + (1 if factor > 1 else -1) if key == "num_stages" else int(now * factor)
        if new != now and low <= new <= high:
            out.append(Candidate("tiles", [{"op": "replace", "path": f"/cross/launch/{key}", "value": new}],
                                 f"default launch {key} {now} -> {new}", 0.28 + 0.04 * rng.random()))
    return out


@dataclass(frozen=True)
class Focus:
    """A model's op kind whose tiles to move first, and why."""
    model: Model
    kind: str
    why: str
    wider: bool  # moves that add programs come first
    score: float


def focus(plan: Plan, ledger: LedgerSummary | None, verdicts: tuple[Verdict, ...], parts: Launches,
          sms: int) -> list[Focus]:
    """Every kind whose tiles to move first: the ledger's, the verdicts', the two streams'."""
    return ledger_focus(ledger) + verdict_focus(verdicts, parts, sms, plan["cross"]["streams"] == "two") + two_stream_focus(plan)


def ledger_focus(ledger: LedgerSummary | None) -> list[Focus]:
    """The GEMM and attention kinds the ledger says lose most, biggest loss first."""
    return [Focus(Model(model), kind, f"the ledger: {k.kind} runs {k.loss_ms:.2f} ms over its floor at "
                                      f"{k.bandwidth_fraction:.0%} of copy bandwidth", False, 0.5 + 0.25 * share)
            for model, kind, share, k in loss_shares(ledger) if FAMILY_OF[kind] in SEARCH_KEYS]


def verdict_focus(verdicts: tuple[Verdict, ...], parts: Launches, sms: int, two_streams: bool = False) -> list[Focus]:
    """Parts of interfering launches, then target kinds whose launches leave SMs idle. Under two
    streams the draft's kernels take the idle SMs already, so those rank lower."""
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


def two_stream_focus(plan: Plan) -> list[Focus]:
    """Under two streams the phases share the multiprocessors for the whole round: the target's big
    GEMMs set its length, and every draft program takes a multiprocessor from them."""
    if plan["cross"]["streams"] != "two":
        return []
    out = [Focus(Model.TARGET, k, "two streams: the verify stream's longest GEMMs set the round", False, 0.5)
           for k in ("gate_up", "down", "qkv", "lm_head", "o_proj")]
    return out + [Focus(Model.DRAFT, k, "two streams: draft programs take multiprocessors from the verify stream",
                        False, 0.46) for k in ("qkv", "o_proj", "down", "gate_up", "attn")]


def tile_edits(plan: Plan, focused: list[Focus], rng: random.Random) -> list[Candidate]:
    """Halve or double one tile key of one op kind: focused kinds first, then every GEMM and
    attention kind of both models in a seeded random order."""
    out, done = [], set()
    for f in sorted(focused, key=lambda f: -f.score):  # stable: equal scores keep their order
        if (f.model, f.kind) not in done:
            done.add((f.model, f.kind))
            out += tile_moves(plan, f.model, f.kind, f.why, f.score, f.wider, rng.randrange(6))
    rest = [(m, k) for m in MODEL_KEYS for k in GEMM_KINDS + ("attn",) if (m, k) not in done]
    for m, k in rest:
        out += tile_moves(plan, m, k, "local tile search", 0.3 + 0.1 * rng.random(), False, rng.randrange(6))
    return out


def tile_moves(plan: Plan, model: str, kind: str, why: str, score: float, wider: bool, start: int) -> list[Candidate]:
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


def measured_tile_edits(plan: Plan, workload: dict | None, tiles: MeasuredTiles | None,
                        ledger: LedgerSummary | None = None) -> list[Candidate]:
    """Each GEMM and attention kind's tile set to the one measured fastest for its shape on this GPU
    model (or, where its table lacks the shape, on another model of its chip, its gain there taken at
    what such tiles lose in transfer: facts tiles_transfer), where the plan's tile differs: scored by
    how much faster than the shipped tile it ran alone; with the node's time ledger, by what that gain
    is worth to the round (the kind's time there times the gain, over the round), where the table's
    tile means the same (takes_table_tile)."""
    if tiles is None or not workload:
        return []
    try:
        found = tiles.found(workload)
    except (KeyError, TypeError, ValueError):  # a context without the models' shapes
        return []
    out = []
    for model, measured, table in found:
        if all(tile_value(plan, model, measured.kind, k) == v for k, v in measured.tile.items()):
            continue
        if not takes_table_tile(plan, model, measured.kind):
            continue
        own = tiles.is_own(table)
        gain = measured.gain if own else 1.0 - (1.0 - measured.gain) * figure("tiles_transfer")
        why = (f"measured on {'this GPU' if own else f'the {table.device}, a GPU of this chip'} "
               f"({table.source}, {table.date}): {model} {measured.describe()}")
        worth = _round_share(ledger, model, measured.kind, gain)
        score = 0.6 + min(0.3, gain) if worth is None else 0.45 + min(0.3, 5 * worth)
        if worth is not None:
            why += f" (the ledger: about {worth:.1%} of the round)"
        out.append(Candidate("tiles", set_tiles(plan, model, measured.kind, measured.tile), why, score))
    return out


def takes_table_tile(plan: Plan, model: Model | str, kind: str) -> bool:
    """Whether a tile a table measured for `kind`'s plain projection means the same in this model:
    not for a qkv fused with RoPE (it runs whole heads), nor for a gate_up or down inside the one-launch
    MLP (their tile means another thing there)."""
    fusions = plan[model]["fusions"]
    return not ((kind == "qkv" and "qkv+rope_kv" in fusions) or (kind in ("gate_up", "down") and "gate_up+down" in fusions))


def _round_share(ledger: LedgerSummary | None, model: str, kind: str, gain: float) -> float | None:
    """The share of the round a kind's kernels would save at `gain`, or None without a ledger that
    lists the kind alone."""
    if ledger is None or not ledger.round_ms:
        return None
    ms = sum(k.ms for k in ledger.kinds if k.parts == [(str(model), kind)])
    return ms * max(gain, 0.0) / ledger.round_ms if ms else None
