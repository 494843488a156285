"""Candidate plan edits for the heuristic proposer: reading a node's result, and one generator per
family of edits. Every patch is RFC 6902 over the canonical plan; generators do not validate
(the proposer does) and give each candidate a base score in (0, 1]: higher comes first. What a
result says about launches comes typed from the compiler: parts (PartRef), the failing launch
(CompileFailure), resources (LaunchFeedback) and verdicts."""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from conjugate.agents.tile_table import TileTable, measured_for
from conjugate.compiler.feedback import PartRef
from conjugate.evaluate.result import EvalResult, LedgerSummary, Status, Verdict, VerdictKind
from conjugate.graph import KINDS
from conjugate.plan.schema import BARRIER_SPANS, MODEL_KEYS, SM_LIMIT_STEP, Plan
from conjugate.plan.tiles import DEFAULT_TILES, FAMILY_OF, LAUNCH_BOUNDS, TILE_BOUNDS
from conjugate.roles import Model

LIGHT_TARGETS = ("qkv", "o_proj", "attn_norm", "mlp_norm", "rope_kv")  # small grids, when nothing is measured
DRAFT_ORDER = ("attn", "qkv", "o_proj", "down", "gate_up", "rope_kv", "attn_norm", "mlp_norm", "embed",
               "final_norm", "lm_head", "argmax")  # draft kinds worth placing first: the most work
SEARCH_KEYS = {"gemm": ("BLOCK_N", "BLOCK_K", "SPLIT_K"), "attn": ("BLOCK_N", "SPLIT_KV")}
_OVERRIDE_PATH = re.compile(r"^\$\.overrides\[(\d+)\]")  # a plan error's path naming an override


@dataclass(frozen=True)
class Candidate:
    kind: str  # one of EDIT_KINDS
    patch: list
    rationale: str
    score: float


Launches = dict[int, tuple[PartRef, ...]]  # launch index -> its parts


def launch_parts(result: EvalResult | None) -> Launches:
    """Launch index -> its parts (with their programs), from the compiler feedback of every launch."""
    return {f.launch: f.parts for f in result.feedback} if result else {}


def failed_parts(result: EvalResult) -> tuple[tuple[PartRef, ...], PartRef | None]:
    """(parts a compile failure blames, the head part of its launch); nothing for other failures."""
    failure = result.compile_failure
    if failure is None or not failure.parts:
        return (), None
    return failure.failed, failure.parts[0]


# ---------------------------------------------------------------------------------------------
# patch builders


def allowed(plan: Plan, target_kind: str) -> set[str]:
    partners = plan["pairs"].get(target_kind, [])
    return set(KINDS) if "*" in partners else set(partners)


def set_pairs(plan: Plan, target_kind: str, kinds: set[str]) -> list[dict]:
    if not kinds:
        return [{"op": "remove", "path": f"/pairs/{target_kind}"}] if target_kind in plan["pairs"] else []
    value = ["*"] if kinds >= set(KINDS) else sorted(kinds)
    return [{"op": "add", "path": f"/pairs/{target_kind}", "value": value}]


def enable_pairing(plan: Plan, alignment: str = "proportional") -> list[dict]:
    """Ops that let `pairs` take effect: a cross-model alignment on one stream."""
    if plan["alignment"] != "sequential":
        return []
    ops = [{"op": "replace", "path": "/alignment", "value": alignment}]
    return ops + ([{"op": "replace", "path": "/streams", "value": "one"}] if plan["streams"] == "two" else [])


def tile_value(plan: Plan, model: str, kind: str, key: str) -> int:
    cfg = plan["tiles"][model].get(kind, {})
    return cfg.get(key, DEFAULT_TILES[FAMILY_OF[kind]].get(key, plan["launch"].get(key, 1)))


def set_tile(plan: Plan, model: str, kind: str, key: str, value: int) -> list[dict]:
    if kind in plan["tiles"][model]:
        return [{"op": "add", "path": f"/tiles/{model}/{kind}/{key}", "value": value}]
    return [{"op": "add", "path": f"/tiles/{model}/{kind}", "value": {key: value}}]


def set_tiles(plan: Plan, model: str, kind: str, values: dict[str, int]) -> list[dict]:
    """Set several keys of one op kind's tile at once (the others kept)."""
    return [{"op": "add", "path": f"/tiles/{model}/{kind}", "value": plan["tiles"][model].get(kind, {}) | values}]


def scaled(plan: Plan, model: str, kind: str, key: str, factor: float) -> int | None:
    """The key's value halved or doubled (num_stages: one down or up), None when out of bounds."""
    low, high = (TILE_BOUNDS[FAMILY_OF[kind]] | LAUNCH_BOUNDS)[key]
    now = tile_value(plan, model, kind, key)
    new = now + (1 if factor > 1 else -1) if key == "num_stages" else int(now * factor)
    return new if low <= new <= high and new != now else None


def unpair_override(op: str) -> list[dict]:
    return [{"op": "add", "path": "/overrides/-", "value": {"match": op, "pair": False}}]


# ---------------------------------------------------------------------------------------------
# edits read from the node's result


def repair_edits(plan: Plan, result: EvalResult) -> list[Candidate]:
    """A failed node: undo the likely cause, the parts the compile failure blames first."""
    text, (parts, head), out = _failure_text(result), failed_parts(result), []
    if "shared memory" in text or "out of resource" in text or "outofresources" in text:
        for p in parts:
            out += shrink(plan, p, head or p, 1.0, f"{p.op} does not fit the GPU's resources")
    if result.status in (Status.INCORRECT, Status.CRASHED, Status.TIMEOUT) or "packed" in text:
        out += _undo_colocation(plan, parts, result.status)
    for n in sorted({int(m.group(1)) for e in result.plan_errors if (m := _OVERRIDE_PATH.match(e))}, reverse=True):
        if n < len(plan["overrides"]):
            out.append(Candidate("override", [{"op": "remove", "path": f"/overrides/{n}"}],
                                 f"override {n} breaks the schedule ({result.status}): remove it", 0.98))
    if "dependency" in text and plan["alignment"] != "sequential":
        out.append(Candidate("alignment", [{"op": "replace", "path": "/alignment", "value": "sequential"}],
                             "the schedule breaks a dependency: fall back to sequential alignment", 0.9))
    if not out:
        for p in parts:
            out += shrink(plan, p, head or p, 0.85, f"{result.status} at {p.op}")
    return out


def _failure_text(result: EvalResult) -> str:
    """What the failure says in words (lower case): its error, plan errors and compile failure's reason."""
    reason = result.compile_failure.reason if result.compile_failure else ""
    return " ".join((result.error, *result.plan_errors, reason)).lower()


def spill_edits(plan: Plan, result: EvalResult) -> list[Candidate]:
    """GPU feedback: launches whose registers spill get smaller tiles or one stage fewer, ranked by
    how many spill (a couple, as a fused norm+gate_up of a small draft showed on the H200, cost little;
    dozens go through local memory in the main loop)."""
    out = []
    for f in result.feedback:
        if f.resources.spills and f.parts:
            why = f"launch {f.launch} spills {f.resources.spills} registers"
            score = 0.5 + min(0.3, f.resources.spills / 100)
            out += [c for p in f.parts for c in shrink(plan, p, f.parts[0], score, why)]
    return out


def shrink(plan: Plan, part: PartRef, head: PartRef, score: float, why: str) -> list[Candidate]:
    """Halve the part's largest tile keys, then one stage fewer for its launch (set on the head
    part, whose tile config carries the launch parameters)."""
    keys = {"gemm": ("BLOCK_K", "BLOCK_N", "BLOCK_M"), "attn": ("BLOCK_N",), "elementwise": ("BLOCK",)}
    keys = sorted(keys[FAMILY_OF[part.kind]], key=lambda k: -tile_value(plan, part.model, part.kind, k))
    out = []
    for i, (p, key) in enumerate([(part, k) for k in keys] + [(head, "num_stages")]):
        new = scaled(plan, p.model, p.kind, key, 0.5)
        if new is not None:
            was = tile_value(plan, p.model, p.kind, key)
            kind = "launch" if key == "num_stages" else "tiles"
            out.append(Candidate(kind, set_tile(plan, p.model, p.kind, key, new),
                                 f"{why}: {p.model} {p.kind} {key} {was} -> {new}", score - 0.02 * i))
    return out


def _undo_colocation(plan: Plan, parts: tuple[PartRef, ...], status: Status) -> list[Candidate]:
    out = []
    if plan["operand_layout"] == "packed":
        out.append(Candidate("layout", [{"op": "replace", "path": "/operand_layout", "value": "separate"}],
                             f"{status} with packed operands: go back to separate weight buffers", 0.97))
    for t in [p for p in parts if p.model is Model.TARGET][:1]:
        if any(p.model is Model.DRAFT for p in parts):
            out.append(Candidate("override", unpair_override(t.op),
                                 f"{status} in the shared launch of {t.op}: keep draft work out of it", 0.95))
    for p in parts:
        key = {"gemm": "SPLIT_K", "attn": "SPLIT_KV"}.get(FAMILY_OF[p.kind])
        new = scaled(plan, p.model, p.kind, key, 0.5) if key else None
        if new is not None:
            out.append(Candidate("tiles", set_tile(plan, p.model, p.kind, key, new),
                                 f"{status} around {p.op}: fewer split partial sums ({key} -> {new})", 0.9))
    return out


def split_edits(plan: Plan, verdicts: tuple[Verdict, ...]) -> list[Candidate]:
    """Interfering shared launches, grouped by (target kind, draft kind), worst first: drop the draft
    kind from pairs[target kind] (first when several launches interfere), or keep the draft part
    out of the worst launch with an override. Then launches that beat their parts back to back but
    lose to them launched at once on two streams: keep the draft part out of the worst."""
    groups: dict[tuple[str, str], list[tuple[float, PartRef, int]]] = {}
    for v in verdicts:
        t, d = _pair(v.parts)
        if v.verdict is VerdictKind.INTERFERENCE and t is not None and d is not None:
            groups.setdefault((t.kind, d.kind), []).append((v.gain_percent, t, v.launch))
    out = _overlap_losses(plan, verdicts)
    for (t_kind, d_kind), hits in sorted(groups.items(), key=lambda g: min(g[1], key=lambda h: h[0])[0])[:3]:
        gain, t, launch = min(hits, key=lambda h: h[0])
        many = len(hits) > 1
        out.append(Candidate("override", unpair_override(t.op),
                             f"launch {launch} interferes ({gain:+.1f}%): keep draft {d_kind} out of {t.op}",
                             0.88 if many else 0.92))
        if d_kind in allowed(plan, t_kind):
            count = f"{len(hits)} launches, worst {gain:+.1f}%" if many else f"{gain:+.1f}%"
            out.append(Candidate("pairs", set_pairs(plan, t_kind, allowed(plan, t_kind) - {d_kind}),
                                 f"target {t_kind} launches interfere ({count}): stop pairing draft {d_kind} "
                                 f"with {t_kind}", 0.92 if many else 0.9))
    return out


def _overlap_losses(plan: Plan, verdicts: tuple[Verdict, ...], limit: int = 3) -> list[Candidate]:
    """(A pinned launch is not among them: `pair: false` does not undo a pin; mixed_edits unpins.)"""
    losing = sorted((v for v in verdicts if v.verdict is not VerdictKind.INTERFERENCE
                     and v.overlap_verdict is VerdictKind.INTERFERENCE), key=lambda v: v.overlap_gain_percent)
    pinned = [o["match"] for o in plan["overrides"] if "with" in o]
    out = []
    for v in losing[:limit]:
        t, d = _pair(v.parts)
        if t is not None and d is not None and not any(fnmatch.fnmatchcase(t.op, m) for m in pinned):
            out.append(Candidate("override", unpair_override(t.op),
                                 f"launch {v.launch} beats its parts back to back ({v.gain_percent:+.1f}%) but loses "
                                 f"to them on two streams ({v.overlap_gain_percent:+.1f}%): keep draft {d.kind} "
                                 f"out of {t.op}", 0.6))
    return out


def _pair(parts: tuple[PartRef, ...]) -> tuple[PartRef | None, PartRef | None]:
    t = next((p for p in parts if p.model is Model.TARGET), None)
    return t, next((p for p in parts if p.model is Model.DRAFT), None)


def gain_edits(plan: Plan, verdicts: tuple[Verdict, ...]) -> list[Candidate]:
    """Gaining shared launches: pair the same draft kind with similar target kinds, and vice versa."""
    out, good = [], sorted((v for v in verdicts if v.verdict is VerdictKind.GAIN), key=lambda v: -v.gain_percent)
    for v in good[:3]:
        t, d = _pair(v.parts)
        if t is None or d is None:
            continue
        gain = v.gain_percent
        for other in _similar(t.kind):
            if d.kind not in allowed(plan, other):
                out.append(Candidate("pairs", set_pairs(plan, other, allowed(plan, other) | {d.kind}),
                                     f"draft {d.kind} beside target {t.kind} gains ({gain:+.1f}%): let it join "
                                     f"target {other} launches too", 0.78))
        for other in _similar(d.kind):
            if other not in allowed(plan, t.kind):
                out.append(Candidate("pairs", set_pairs(plan, t.kind, allowed(plan, t.kind) | {other}),
                                     f"target {t.kind} gains beside draft {d.kind} ({gain:+.1f}%): let draft "
                                     f"{other} join it too", 0.75))
    return out


def _similar(kind: str) -> list[str]:
    return [k for k in KINDS if k != kind and FAMILY_OF[k] == FAMILY_OF[kind]]


def fill_by_kind(parts: Launches) -> dict[str, int]:
    """Target kind -> the fewest programs of a launch holding it: a shared launch's parts side by side
    fill it together; a persistent launch's (several parts, one model) run one after another, each
    filling it alone."""
    fill: dict[str, int] = {}
    for launch in parts.values():
        in_sequence = len(launch) > 1 and len({p.model for p in launch}) == 1
        total = sum(p.programs or 0 for p in launch)
        for p in launch:
            if p.model is Model.TARGET and p.programs is not None:
                programs = p.programs if in_sequence else total
                fill[p.kind] = min(fill.get(p.kind, programs), programs)
    return fill


def headroom_edits(plan: Plan, parts: Launches, sms: int) -> list[Candidate]:
    """Target launches that leave some of the GPU's `sms` multiprocessors idle: let any draft unit
    that falls due run inside them, or one more draft kind (a sequential plan switches to a
    cross-model alignment)."""
    fill = fill_by_kind(parts)
    low = sorted((k for k, p in fill.items() if p < sms), key=lambda k: (fill[k], _target_rank(k))) if fill else list(
        LIGHT_TARGETS)
    kind = "alignment" if plan["alignment"] == "sequential" else "pairs"
    score = 0.3 if plan["streams"] == "two" else 0.7 if fill else 0.5  # two streams already share the SMs
    out = []
    for t in low[:4]:
        why = f"target {t} launches " + (f"fill {fill[t]} of {sms} SMs" if fill else "have small grids")
        missing = [d for d in DRAFT_ORDER if d not in allowed(plan, t)]
        if missing:
            out.append(Candidate(kind, enable_pairing(plan) + set_pairs(plan, t, set(KINDS)),
                                 f"{why}: let any draft unit that falls due run inside them", score))
        for d in missing[:2]:
            out.append(Candidate(kind, enable_pairing(plan) + set_pairs(plan, t, allowed(plan, t) | {d}),
                                 f"{why}: let draft {d} work run inside them", score - 0.05))
    return out


def _target_rank(kind: str) -> int:
    return LIGHT_TARGETS.index(kind) if kind in LIGHT_TARGETS else len(LIGHT_TARGETS) + KINDS.index(kind)


# ---------------------------------------------------------------------------------------------
# edits read from measurements of earlier runs


def measured_tile_edits(plan: Plan, workload: dict | None, table: TileTable | None,
                        ledger: LedgerSummary | None = None) -> list[Candidate]:
    """Each GEMM and attention kind's tile set to the one measured fastest for its shape on this GPU
    model (a table of search/tiles.json), where the plan's tile differs: scored by how much faster
    than the shipped tile it ran alone; with the node's time ledger, by what that gain is worth to the
    round: the kind's time there times the gain, over the round (alone 20-37% faster, such tiles moved
    a two-stream qwen3-06b-8b-b4 round by about 1% on the H200, where the draft's fusions gained 7.5%:
    benchmarks/README.md, "A short search"). Not for a qkv whose model fuses RoPE into it: the sweep
    measured the plain projection, and the fused kernel is another one (one head per tile, two
    weight tiles: a measured tile's stages can overflow shared memory); nor for the gate_up and down
    of a model whose MLP is fused into one launch (compiler/mlp.py), whose tile means another thing."""
    if table is None or not workload:
        return []
    try:
        found = measured_for(table, workload)
    except (KeyError, TypeError, ValueError):  # a context without the models' shapes
        return []
    out = []
    for model, measured in found:
        if all(tile_value(plan, model, measured.kind, k) == v for k, v in measured.tile.items()):
            continue
        if measured.kind == "qkv" and "qkv+rope_kv" in plan["fusions"][model]:
            continue
        if measured.kind in ("gate_up", "down") and "gate_up+down" in plan["fusions"][model]:
            continue
        why = f"measured on this GPU ({table.source}, {table.date}): {model} {measured.describe()}"
        worth = _round_share(ledger, model, measured.kind, measured.gain)
        score = 0.6 + min(0.3, measured.gain) if worth is None else 0.45 + min(0.3, 5 * worth)
        if worth is not None:
            why += f" (the ledger: about {worth:.1%} of the round)"
        out.append(Candidate("tiles", set_tiles(plan, model, measured.kind, measured.tile), why, score))
    return out


def _round_share(ledger: LedgerSummary | None, model: str, kind: str, gain: float) -> float | None:
    """The share of the round a kind's kernels would save at `gain` (their time there times the
    gain, over the round), or None without a ledger that lists the kind alone."""
    if ledger is None or not ledger.round_ms:
        return None
    ms = sum(k.ms for k in ledger.kinds if k.parts == [(str(model), kind)])
    return ms * max(gain, 0.0) / ledger.round_ms if ms else None


# fusions that put a layer's norm in a GEMM's prologue (its row statistics read from the residual GEMM
# before): the ones the measurements below held (final_norm+lm_head runs once a step)
NORM_FUSIONS = ("attn_norm+qkv", "mlp_norm+gate_up")
NORM_FUSIONS_WITH_PDL = ("with fused norms the release at the end measured faster on the H200: qwen3-06b-8b-b4 "
                         "start -> end -2.8%, end -> start +5.9%; llama-3b-8b-b4-ctx2k fusing under the start "
                         "+0.9% to +8.4% in six tries")


PRELOAD_MEASURED = ("measured on the H200: 9% faster than the plain release at the start on a chain of 64 "
                    "small GEMMs, but beside the best plans rounds at best 1.6-3.0% slower on two workloads")


def pdl_edits(plan: Plan, ledger: LedgerSummary | None = None) -> list[Candidate]:
    """Per model, programmatic dependent launch (plan `pdl`) on, moved or off. On the H200, beside the
    best plans of two searches (results/knobs_h200.json), the draft's launches released at the end of
    each program's work made the round 2.9% and 1.6% faster, and gained 1.6% and 2.4% as search edits
    on two other workloads; released right after the wait, 5.2% faster on one and 6.8% slower on the
    other; with the weights prefetched first, 5.9% slower on both: so the draft's chain first,
    released at the end first, prefetch last, and the model whose stream the ledger says is busier
    (the critical path) ahead of the other. The start won where the draft's stream was 1.38x as busy
    as the target's and lost where the two were balanced (1.04x): past SM_LIMIT_WIDE the critical
    model's release at the start comes first, within SM_LIMIT_BALANCED it comes after the end's.
    A model holding fused norms (NORM_FUSIONS) is released at the end first whatever the balance, and
    moved from the start to the end first: measured so on two workloads (NORM_FUSIONS_WITH_PDL, the
    searches of benchmarks/search/). Never for a model persistent with barriers (refused); for a
    model whose launches are tile loops only released at the end (released at the start, the next
    loop's programs would wait on the SMs its cap leaves to the other stream). A model's GEMM tiles
    loading their first weights before the wait (`preload`) is offered last (PRELOAD_MEASURED), and
    taken back first."""
    shape = _imbalance(ledger)
    critical = shape[0] if shape is not None else Model.DRAFT.value
    ratio = shape[2] if shape is not None else (SM_LIMIT_BALANCED + SM_LIMIT_WIDE) / 2  # no ledger: start as it was
    start_lift = 0.25 if ratio >= SM_LIMIT_WIDE else -0.1 if ratio < SM_LIMIT_BALANCED else 0.0
    out = []
    for model in (m.value for m in Model):
        now = plan["pdl"][model]
        if plan["persist"][model]["span"] in BARRIER_SPANS:
            continue
        loops = plan["persist"][model]["span"] == "launch"
        fused = any(f in NORM_FUSIONS for f in plan["fusions"][model])  # the release at the end first
        lift = 0.1 if model == critical else 0.0
        base = 0.35 if model == Model.DRAFT.value else 0.2
        path = f"/pdl/{model}"
        if now["trigger"] == "none":
            start = base + (-0.1 if fused else start_lift if model == critical else 0.0)
            for trigger, prefetch, score in (("end", False, base + 0.1), ("start", False, start),
                                             ("end", True, base - 0.2)):
                if loops and trigger == "start":
                    continue
                how = "once its tiles are done" if trigger == "end" else "right after its wait"
                why = (f"{model} launches as programmatic dependent launches: each starts while the kernel "
                       f"before it ends and lets the next one start {how}"
                       + (", asking L2 for its weights before it waits" if prefetch else ""))
                out.append(Candidate("launch", [{"op": "replace", "path": path,
                                                 "value": {"trigger": trigger, "prefetch": prefetch}}],
                                     why, score + lift))
            continue
        other = "start" if now["trigger"] == "end" else "end"
        if not (loops and other == "start"):
            to_end = fused and other == "end"
            out.append(Candidate("launch", [{"op": "replace", "path": f"{path}/trigger", "value": other}],
                                 f"{model} launches release the next one at the {other} of their work"
                                 + (f" ({NORM_FUSIONS_WITH_PDL})" if to_end else ""),
                                 (0.45 if to_end else 0.15 if fused else 0.25) + lift))
        out.append(Candidate("launch", [{"op": "replace", "path": f"{path}/prefetch", "value": not now["prefetch"]}],
                             f"{model} launches {'no longer ' if now['prefetch'] else ''}ask L2 for their weights "
                             f"before waiting for the kernel before them", 0.25 if now["prefetch"] else 0.1))
        if not (loops and not now["preload"]):  # a tile loop waits once, not in its tiles: nothing to load ahead
            out.append(Candidate("launch", [{"op": "replace", "path": f"{path}/preload", "value": not now["preload"]}],
                                 f"{model} GEMM tiles {'no longer ' if now['preload'] else ''}load their first "
                                 f"weight step into registers before waiting for the kernel before them "
                                 f"({PRELOAD_MEASURED})", 0.3 if now["preload"] else 0.05))
        out.append(Candidate("launch", [{"op": "replace", "path": path,
                                         "value": {"trigger": "none", "prefetch": False}}],
                             f"{model} launches start only once the kernel before them has ended", 0.2))
    return out


def _imbalance(ledger: LedgerSummary | None) -> tuple[str, str, float] | None:
    """(busier model, the other, busier stream's busy time over the other's) from a two-stream
    ledger; None without one."""
    busy = ledger.streams if ledger is not None else {}
    if len(busy) != 2 or not set(busy) <= set(MODEL_KEYS) or min(busy.values()) <= 0:
        return None
    busier = max(busy, key=busy.get)
    other = next(m for m in MODEL_KEYS if m != busier)
    return busier, other, busy[busier] / busy[other]


SM_LIMIT_BALANCED = 1.1  # busier stream / other under this: no limit proposed (llama-1b-8b-b8, 1.04: +3.8-6.1%)
SM_LIMIT_WIDE = 1.25  # over this: deeper limits first (qwen3-06b-8b-b4, 1.37: 104 SMs -3.8%, 112 -3.3%, 120 -1.6%)
# once limited, the other stream still this much busier: the next step toward balance ranks high. On
# qwen3-06b-8b-b4 every step 120 -> 112 -> 104 -> 96 gained (1.2-2.3%, ratios 1.06-1.10) but, ranked
# below the node's other edits, came one every 8-10 evaluations; 96 -> 88 then lost 0.9-2.8%
SM_LIMIT_GO_ON = 1.05


def sm_limit_edits(plan: Plan, sms: int, ledger: LedgerSummary | None = None) -> list[Candidate]:
    """With two streams, the less busy model's stream on part of the SMs (plan `sm_limit`), so the
    busier one's kernels find SMs of their own. Measured on the H200 beside two best plans
    (results/sm_limit_h200.json, 2026-12-02): with the draft's stream 1.37x as busy as the target's
    (qwen3-06b-8b-b4) the target on 104, 112, 120 of 132 SMs made the round 3.8%, 3.3%, 1.6%
    faster; with the streams balanced (1.04x, llama-1b-8b-b8) 6.1%, 5.2%, 3.8% slower. So no
    limit for streams within SM_LIMIT_BALANCED of each other, 8-16 SMs fewer than the most that
    leave the other any when they are closer than SM_LIMIT_WIDE, deeper limits first past it,
    scored by the imbalance. Once limited, 8 SMs fewer while the limited stream is still the less
    busy one (ranked high while the other is SM_LIMIT_GO_ON as busy), 8 more once it is the busier,
    or no limit. Without a ledger, the target limited at a low score. Never for a model persistent
    with barriers (refused)."""
    if plan["streams"] != "two" or sms <= 2 * SM_LIMIT_STEP:
        return []
    limited = {m: n for m, n in plan["sm_limit"].items() if n}
    shape = _imbalance(ledger)
    if limited:
        (model, now), = limited.items()
        out = [Candidate("launch", [{"op": "replace", "path": f"/sm_limit/{model}", "value": 0}],
                         f"the {model}'s stream on every SM again", 0.2)]
        ahead = None if shape is None else -SM_LIMIT_STEP if shape[0] != model else SM_LIMIT_STEP
        toward = 0.45 if shape is None or shape[2] < SM_LIMIT_GO_ON else 0.6  # the step toward balance
        for n in (now - SM_LIMIT_STEP, now + SM_LIMIT_STEP):
            if SM_LIMIT_STEP <= n < sms:
                score = 0.25 if ahead is None else toward if n - now == ahead else 0.15
                out.append(Candidate("launch", [{"op": "replace", "path": f"/sm_limit/{model}", "value": n}],
                                     f"the {model}'s stream on {n} SMs (from {now})", score))
        return out
    if shape is None:
        yielding, other, ratio = Model.TARGET.value, Model.DRAFT.value, None
    else:
        other, yielding, ratio = shape
        if ratio < SM_LIMIT_BALANCED:
            return []
    persist = plan["persist"][yielding]
    if persist["span"] in BARRIER_SPANS and persist["order"] == "grid":  # refused: its grid is sized for every SM
        return []
    top = (sms - 1) // SM_LIMIT_STEP * SM_LIMIT_STEP  # the most SMs that still leave the other some alone
    steps = (1, 2) if ratio is None or ratio < SM_LIMIT_WIDE else (3, 4, 2)
    base = 0.3 if ratio is None else round(0.35 + min(0.3, ratio - 1.0), 2)
    out = []
    for rank, n in enumerate(n for n in (top - SM_LIMIT_STEP * i for i in steps) if n >= SM_LIMIT_STEP):
        why = (f"the {yielding}'s stream on {n} of {sms} SMs: the {other}'s kernels have {sms - n} to themselves "
               f"instead of queueing behind the {yielding}'s thread blocks"
               + (f" (its stream {ratio:.2f}x as busy)" if ratio is not None else ""))
        out.append(Candidate("launch", [{"op": "replace", "path": f"/sm_limit/{yielding}", "value": n}], why,
                             round(base - 0.05 * rank, 2)))
    return out
