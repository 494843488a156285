"""Cross-model edits: which draft ops run inside which target launches and how.

    alignment        how draft units meet target launches (sequential: none do)
    pairs            which draft kinds a target kind's launches take, from the verdicts of shared
                     launches: interfering pairs dropped, gaining ones widened; target launches that
                     leave SMs idle take more draft kinds
    interleave       how a shared launch splits its programs between its parts
    overrides        a draft op kept out of one target launch, or pinned into one (a mixed plan: two
                     streams with a few shared launches), unpinned where it lost to two streams
    operand layout   separate weight buffers, or both models' weights packed for one tile loop

Shared launches lose to two streams in most measured rounds (facts: streams_over_shared); they are
the design's own mechanism, so they stay in the search, ranked below the edits that keep two streams.
"""
from __future__ import annotations

import fnmatch

from conjugate.agents.heuristic.candidate import Candidate, Launches, fill_by_kind
from conjugate.compiler.feedback import PartRef
from conjugate.evaluate.result import Verdict, VerdictKind
from conjugate.graph import KINDS, LAYER_KINDS
from conjugate.plan.schema import Plan
from conjugate.plan.tiles import FAMILY_OF
from conjugate.roles import Model

LIGHT_TARGETS = ("qkv", "o_proj", "attn_norm", "mlp_norm", "rope_kv")  # small grids, when nothing is measured


DRAFT_ORDER = ("attn", "qkv", "o_proj", "down", "gate_up", "rope_kv", "attn_norm", "mlp_norm", "embed",
               "final_norm", "lm_head", "argmax")  # draft kinds worth placing first: the most work


def allowed(plan: Plan, target_kind: str) -> set[str]:
    partners = plan["cross"]["pairs"].get(target_kind, [])
    return set(KINDS) if "*" in partners else set(partners)


def set_pairs(plan: Plan, target_kind: str, kinds: set[str]) -> list[dict]:
    if not kinds:
        return [{"op": "remove", "path": f"/cross/pairs/{target_kind}"}] if target_kind in plan["cross"]["pairs"] else []
    value = ["*"] if kinds >= set(KINDS) else sorted(kinds)
    return [{"op": "add", "path": f"/cross/pairs/{target_kind}", "value": value}]


def enable_pairing(plan: Plan, alignment: str = "proportional") -> list[dict]:
    """Ops that let `pairs` take effect: a cross-model alignment on one stream."""
    if plan["cross"]["alignment"] != "sequential":
        return []
    ops = [{"op": "replace", "path": "/cross/alignment", "value": alignment}]
    return ops + ([{"op": "replace", "path": "/cross/streams", "value": "one"}] if plan["cross"]["streams"] == "two" else [])


def unpair_override(op: str) -> list[dict]:
    return [{"op": "add", "path": "/cross/overrides/-", "value": {"match": op, "pair": False}}]


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
        out.append(Candidate("cross", unpair_override(t.op),
                             f"launch {launch} interferes ({gain:+.1f}%): keep draft {d_kind} out of {t.op}",
                             0.88 if many else 0.92))
        if d_kind in allowed(plan, t_kind):
            count = f"{len(hits)} launches, worst {gain:+.1f}%" if many else f"{gain:+.1f}%"
            out.append(Candidate("cross", set_pairs(plan, t_kind, allowed(plan, t_kind) - {d_kind}),
                                 f"target {t_kind} launches interfere ({count}): stop pairing draft {d_kind} "
                                 f"with {t_kind}", 0.92 if many else 0.9))
    return out


def _overlap_losses(plan: Plan, verdicts: tuple[Verdict, ...], limit: int = 3) -> list[Candidate]:
    """(A pinned launch is not among them: `pair: false` does not undo a pin; mixed_edits unpins.)"""
    losing = sorted((v for v in verdicts if v.verdict is not VerdictKind.INTERFERENCE
                     and v.overlap_verdict is VerdictKind.INTERFERENCE), key=lambda v: v.overlap_gain_percent)
    pinned = [o["match"] for o in plan["cross"]["overrides"] if "with" in o]
    out = []
    for v in losing[:limit]:
        t, d = _pair(v.parts)
        if t is not None and d is not None and not any(fnmatch.fnmatchcase(t.op, m) for m in pinned):
            out.append(Candidate("cross", unpair_override(t.op),
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
                out.append(Candidate("cross", set_pairs(plan, other, allowed(plan, other) | {d.kind}),
                                     f"draft {d.kind} beside target {t.kind} gains ({gain:+.1f}%): let it join "
                                     f"target {other} launches too", 0.78))
        for other in _similar(d.kind):
            if other not in allowed(plan, t.kind):
                out.append(Candidate("cross", set_pairs(plan, t.kind, allowed(plan, t.kind) | {other}),
                                     f"target {t.kind} gains beside draft {d.kind} ({gain:+.1f}%): let draft "
                                     f"{other} join it too", 0.75))
    return out


def _similar(kind: str) -> list[str]:
    return [k for k in KINDS if k != kind and FAMILY_OF[k] == FAMILY_OF[kind]]


def headroom_edits(plan: Plan, parts: Launches, sms: int) -> list[Candidate]:
    """Target launches that leave some of the GPU's `sms` multiprocessors idle: let any draft unit
    that falls due run inside them, or one more draft kind (a sequential plan switches to a
    cross-model alignment)."""
    fill = fill_by_kind(parts)
    low = sorted((k for k, p in fill.items() if p < sms), key=lambda k: (fill[k], _target_rank(k))) if fill else list(
        LIGHT_TARGETS)
    score = 0.3 if plan["cross"]["streams"] == "two" else 0.7 if fill else 0.5  # two streams already share the SMs
    out = []
    for t in low[:4]:
        why = f"target {t} launches " + (f"fill {fill[t]} of {sms} SMs" if fill else "have small grids")
        missing = [d for d in DRAFT_ORDER if d not in allowed(plan, t)]
        if missing:
            out.append(Candidate("cross", enable_pairing(plan) + set_pairs(plan, t, set(KINDS)),
                                 f"{why}: let any draft unit that falls due run inside them", score))
        for d in missing[:2]:
            out.append(Candidate("cross", enable_pairing(plan) + set_pairs(plan, t, allowed(plan, t) | {d}),
                                 f"{why}: let draft {d} work run inside them", score - 0.05))
    return out


def _target_rank(kind: str) -> int:
    return LIGHT_TARGETS.index(kind) if kind in LIGHT_TARGETS else len(LIGHT_TARGETS) + KINDS.index(kind)


def pattern_edits(plan: Plan, interfering: bool) -> list[Candidate]:
    """Other interleave patterns and ratios; only meaningful where launches are shared."""
    if plan["cross"]["alignment"] == "sequential":
        return []
    now, (t, d) = plan["cross"]["interleave"]["pattern"], plan["cross"]["interleave"]["ratio"]
    options = [(p, [1, 1]) for p in ("blocked", "strided") if p != now]
    options += [("ratio", r) for r in ([2 * t, d], [t, 2 * d]) if max(r) <= 64] if now == "ratio" else [
        ("ratio", [2, 1]), ("ratio", [1, 2])]
    score = 0.5 if interfering else 0.4
    why = "shared launches interfere" if interfering else "reshape how shared launches split their programs"
    return [Candidate("cross", [{"op": "replace", "path": "/cross/interleave", "value": {"pattern": p, "ratio": r}}],
                      f"{why}: interleave {now} -> {p}" + (f" {r[0]}:{r[1]}" if p == "ratio" else ""), score)
            for p, r in options]


def alignment_edits(plan: Plan) -> list[Candidate]:
    """Other alignments. A two-stream plan gives its streams up for shared launches, so from one
    these rank below the edits that keep them."""
    if plan["cross"]["alignment"] != "sequential":
        other = "greedy" if plan["cross"]["alignment"] == "proportional" else "proportional"
        return [Candidate("cross", [{"op": "replace", "path": "/cross/alignment", "value": other}],
                          f"alignment {plan['cross']['alignment']} -> {other}: draft units meet other target launches", 0.4),
                Candidate("cross", [{"op": "replace", "path": "/cross/alignment", "value": "sequential"}],
                          "alignment -> sequential: no shared launches at all", 0.15)]
    pairs = [] if plan["cross"]["pairs"] else [op for t in LIGHT_TARGETS for op in set_pairs(plan, t, set(KINDS))]
    two = plan["cross"]["streams"] == "two"
    return [Candidate("cross", enable_pairing(plan, a) + pairs,
                      f"alignment sequential -> {a}: draft units ride inside target launches"
                      + (f" ({', '.join(LIGHT_TARGETS)} take any draft kind)" if pairs else "")
                      + (" instead of running on their own stream" if two else ""), score)
            for a, score in (("proportional", 0.3 if two else 0.65), ("greedy", 0.24 if two else 0.5))]


MIXED_PAIRS = (("o_proj", "down"), ("qkv", "attn"), ("o_proj", "attn"), ("qkv", "down"))  # target, draft


def mixed_edits(plan: Plan, verdicts: tuple[Verdict, ...], workload: dict | None) -> list[Candidate]:
    """Two streams with a few shared launches: pin a draft op into the target launch running at the
    same point of its chain (halfway through both phases); from the verdicts of pins already made,
    more pins of a pair that beat its parts on two streams, and the undoing of one that lost."""
    if plan["cross"]["streams"] != "two" or not workload or "k" not in workload:
        return []
    pins = [(n, o) for n, o in enumerate(plan["cross"]["overrides"]) if "with" in o]
    out = []
    for v in verdicts:
        if v.overlap_verdict is None or len(v.parts) != 2:
            continue
        n = next((n for n, o in pins if o["with"] in v.parts[1].ops + v.parts[0].ops), None)
        if n is not None and v.overlap_verdict is VerdictKind.INTERFERENCE:
            out.append(Candidate("cross", [{"op": "remove", "path": f"/cross/overrides/{n}"}],
                                 f"pinned launch {v.launch} loses to its parts on two streams "
                                 f"({v.overlap_gain_percent:+.1f}%): unpin {plan['cross']['overrides'][n]['with']}", 0.7))
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
            out.append(Candidate("cross", [{"op": "add", "path": "/cross/overrides/-",
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
    if plan["cross"]["alignment"] == "sequential":
        return []
    other = "packed" if plan["cross"]["operand_layout"] == "separate" else "separate"
    why = "one tile loop streams both models' weights" if other == "packed" else "each model reads its own weights"
    return [Candidate("cross", [{"op": "replace", "path": "/cross/operand_layout", "value": other}],
                      f"operand layout {plan['cross']['operand_layout']} -> {other}: {why}", 0.35)]
