"""Candidate plan edits for the heuristic proposer: reading a node's result, and one generator per
family of edits. Every patch is RFC 6902 over the canonical plan; generators do not validate
(the proposer does) and give each candidate a base score in (0, 1]: higher comes first."""
from __future__ import annotations

import re
from dataclasses import dataclass

from conjugate.graph import KINDS
from conjugate.plan.schema import Plan
from conjugate.plan.tiles import DEFAULT_TILES, FAMILY_OF, LAUNCH_BOUNDS, TILE_BOUNDS

SMS = 132  # multiprocessors of an H100/H200: a smaller grid leaves some idle
MAIN_KINDS = ("qkv", "gate_up", "lm_head")  # the op a fused unit is named after (as in plan/expand.py)
LIGHT_TARGETS = ("qkv", "o_proj", "attn_norm", "mlp_norm", "rope_kv")  # small grids, when nothing is measured
DRAFT_ORDER = ("attn", "qkv", "o_proj", "down", "gate_up", "rope_kv", "attn_norm", "mlp_norm", "embed",
               "final_norm", "lm_head", "argmax")  # draft kinds worth placing first: the most work
SEARCH_KEYS = {"gemm": ("BLOCK_N", "BLOCK_K", "SPLIT_K"), "attn": ("BLOCK_N", "SPLIT_KV")}
_OP_ID = re.compile(r"\b[dt](?:\.[a-z0-9_]+)+")


@dataclass(frozen=True)
class Candidate:
    kind: str  # one of EDIT_KINDS
    patch: list
    rationale: str
    score: float


@dataclass(frozen=True)
class PartInfo:
    model: str  # "draft" | "target"
    kind: str  # the unit's main op kind
    op: str  # the unit's main op id
    programs: int | None = None


def part_info(label: str, programs: int | None = None) -> PartInfo:
    """A part from its label: op ids joined by '+', e.g. 't.l3.attn_norm+t.l3.qkv'."""
    ops = label.strip().split("+")
    kinds = [o.rsplit(".", 1)[-1] for o in ops]
    kind = next((k for k in kinds if k in MAIN_KINDS), kinds[-1])
    return PartInfo("target" if ops[0].startswith("t.") else "draft", kind, ops[kinds.index(kind)], programs)


def launch_parts(result: dict | None) -> dict[int, list[PartInfo]]:
    """Launch index -> its parts, from the compiler feedback and (GPU) the verdicts' own labels."""
    out: dict[int, list[PartInfo]] = {}
    for entry in (result or {}).get("feedback", []) + (result or {}).get("verdicts", []):
        labels = entry.get("ops")
        if "launch" not in entry or not labels:
            continue
        labels = labels.split(" | ") if isinstance(labels, str) else labels
        programs = entry.get("programs") or [None] * len(labels)
        known = {p.op: p.programs for p in out.get(entry["launch"], [])}
        out[entry["launch"]] = [part_info(lb, pr if pr is not None else known.get(part_info(lb).op))
                                for lb, pr in zip(labels, programs)]
    return out


def failed_parts(result: dict) -> tuple[list[PartInfo], PartInfo | None]:
    """(parts a failure names, the head part of its launch): the compile error's part (or all of
    its launch's parts), else the op ids in the error text (and no head)."""
    for entry in result.get("feedback", []):
        ops = entry.get("ops")
        if ops and "reason" in entry:
            labels = ops.split(" | ") if isinstance(ops, str) else list(ops)
            part = entry.get("part")
            named = [labels[part]] if isinstance(part, int) and 0 <= part < len(labels) else labels
            return [part_info(lb) for lb in named], part_info(labels[0])
    return [part_info(op) for op in dict.fromkeys(_OP_ID.findall(result.get("error", "")))][:4], None


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


def repair_edits(plan: Plan, result: dict) -> list[Candidate]:
    """A failed node: undo the likely cause, named parts first."""
    text = (result.get("error", "") + " " + " ".join(str(f.get("reason", "")) for f in result.get("feedback", [])))
    text, (parts, head), out = text.lower(), failed_parts(result), []
    if "shared memory" in text or "out of resource" in text or "outofresources" in text:
        for p in parts:
            out += shrink(plan, p, head or p, 1.0, f"{p.op} does not fit the GPU's resources")
    if result.get("status") in ("incorrect", "crashed", "timeout") or "packed" in text:
        out += _undo_colocation(plan, parts, result.get("status", "failure"))
    for n in sorted({int(m) for m in re.findall(r"overrides\[(\d+)\]", text)}, reverse=True):
        if n < len(plan["overrides"]):
            out.append(Candidate("override", [{"op": "remove", "path": f"/overrides/{n}"}],
                                 f"override {n} breaks the schedule ({result.get('status')}): remove it", 0.98))
    if "dependency" in text and plan["alignment"] != "sequential":
        out.append(Candidate("alignment", [{"op": "replace", "path": "/alignment", "value": "sequential"}],
                             "the schedule breaks a dependency: fall back to sequential alignment", 0.9))
    if not out:
        for p in parts:
            out += shrink(plan, p, head or p, 0.85, f"{result.get('status')} at {p.op}")
    return out


def spill_edits(plan: Plan, result: dict) -> list[Candidate]:
    """GPU feedback: launches whose registers spill get smaller tiles or one stage fewer."""
    out = []
    for entry in result.get("feedback", []):
        labels = entry.get("ops")
        if entry.get("spills") and isinstance(labels, list) and labels:
            why = f"launch {entry['launch']} spills {entry['spills']} registers"
            out += [c for lb in labels for c in shrink(plan, part_info(lb), part_info(labels[0]), 0.6, why)]
    return out


def shrink(plan: Plan, part: PartInfo, head: PartInfo, score: float, why: str) -> list[Candidate]:
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


def _undo_colocation(plan: Plan, parts: list[PartInfo], status: str) -> list[Candidate]:
    out = []
    if plan["operand_layout"] == "packed":
        out.append(Candidate("layout", [{"op": "replace", "path": "/operand_layout", "value": "separate"}],
                             f"{status} with packed operands: go back to separate weight buffers", 0.97))
    for t in [p for p in parts if p.model == "target"][:1]:
        if any(p.model == "draft" for p in parts):
            out.append(Candidate("override", unpair_override(t.op),
                                 f"{status} in the shared launch of {t.op}: keep draft work out of it", 0.95))
    for p in parts:
        key = {"gemm": "SPLIT_K", "attn": "SPLIT_KV"}.get(FAMILY_OF[p.kind])
        new = scaled(plan, p.model, p.kind, key, 0.5) if key else None
        if new is not None:
            out.append(Candidate("tiles", set_tile(plan, p.model, p.kind, key, new),
                                 f"{status} around {p.op}: fewer split partial sums ({key} -> {new})", 0.9))
    return out


def split_edits(plan: Plan, verdicts: list[dict], parts: dict[int, list[PartInfo]]) -> list[Candidate]:
    """Interfering shared launches, grouped by (target kind, draft kind), worst first: drop the draft
    kind from pairs[target kind] (first when several launches interfere), or keep the draft part
    out of the worst launch with an override."""
    groups: dict[tuple[str, str], list[tuple[float, PartInfo, int]]] = {}
    for v in verdicts:
        t, d = _pair(parts.get(v.get("launch"), []))
        if v.get("verdict") == "interference" and t is not None and d is not None:
            groups.setdefault((t.kind, d.kind), []).append((v.get("gain_percent", 0.0), t, v.get("launch")))
    out = []
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


def _pair(parts: list[PartInfo]) -> tuple[PartInfo | None, PartInfo | None]:
    t = next((p for p in parts if p.model == "target"), None)
    return t, next((p for p in parts if p.model == "draft"), None)


def gain_edits(plan: Plan, verdicts: list[dict], parts: dict[int, list[PartInfo]]) -> list[Candidate]:
    """Gaining shared launches: pair the same draft kind with similar target kinds, and vice versa."""
    out, good = [], sorted((v for v in verdicts if v.get("verdict") == "gain"), key=lambda v: -v.get("gain_percent", 0))
    for v in good[:3]:
        t, d = _pair(parts.get(v.get("launch"), []))
        if t is None or d is None:
            continue
        gain = v.get("gain_percent", 0.0)
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


def fill_by_kind(parts: dict[int, list[PartInfo]]) -> dict[str, int]:
    """Target kind -> the fewest programs of a launch holding it (launch programs, all parts)."""
    fill: dict[str, int] = {}
    for launch in parts.values():
        total = sum(p.programs or 0 for p in launch)
        for p in launch:
            if p.model == "target" and p.programs is not None:
                fill[p.kind] = min(fill.get(p.kind, total), total)
    return fill


def headroom_edits(plan: Plan, parts: dict[int, list[PartInfo]]) -> list[Candidate]:
    """Target launches that leave multiprocessors idle: let any draft unit that falls due run inside
    them, or one more draft kind (a sequential plan switches to a cross-model alignment)."""
    fill = fill_by_kind(parts)
    low = sorted((k for k, p in fill.items() if p < SMS), key=lambda k: (fill[k], _target_rank(k))) if fill else list(
        LIGHT_TARGETS)
    kind = "alignment" if plan["alignment"] == "sequential" else "pairs"
    score = 0.3 if plan["streams"] == "two" else 0.7 if fill else 0.5  # two streams already share the SMs
    out = []
    for t in low[:4]:
        why = f"target {t} launches " + (f"fill {fill[t]} of {SMS} SMs" if fill else "have small grids")
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
