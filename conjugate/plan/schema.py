"""The cross-model plan: validation, canonical form and hash.

A plan is compact, rule-based JSON that an LLM can edit (plans/plan.schema.json is its JSON
Schema). Rules say how the draft's ops are placed into the target's launches; overrides select
launches by a glob over op ids and change what the rules chose for them (down to one launch's `pdl`).
"""
from __future__ import annotations

import copy
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conjugate.errors import PlanError
from conjugate.files import NAME_MAX, check_nesting, is_shown_name, read_json, shown, shown_json
from conjugate.graph import KINDS
from conjugate.plan.tiles import DEFAULT_LAUNCH, LAUNCH_BOUNDS, is_power_of_two, tile_keys
from conjugate.roles import Model

SCHEMA = "conjugate.plan/1"
ALIGNMENTS = ("sequential", "proportional", "greedy")
PATTERNS = ("blocked", "strided", "ratio")
LAYOUTS = ("separate", "packed")
CAPTURES = ("graph", "none")
STREAMS = ("one", "two")
PRIORITIES = ("none", "draft", "target")  # with two streams: whose stream the GPU serves first
# how a split-K GEMM that adds into the residual stream (o_proj, down) sums its splits: in split
# order by the tile's last split (deterministic), or each split adding its partial atomically (a
# fused MLP, fusion gate_up+down, adds its ffn blocks' shares atomically either way)
REDUCTIONS = ("ordered", "atomic")
# a persistent launch: a model's consecutive launches of one decoder layer (or one decode step) run
# as one launch whose programs take each part's tiles in turn, with a grid-wide barrier between parts;
# span `launch` joins nothing: each launch of the model runs its tiles on a capped grid (a tile loop,
# no barrier), leaving the rest of the GPU to the other stream
SPANS = ("none", "launch", "layer", "step")
BARRIER_SPANS = ("layer", "step")
# how a persistent launch of several parts orders them: `grid`, every program through each part, a
# grid-wide barrier between parts (every program resident); `tickets`, each program takes the next
# tile in dependency order from a counter and waits only for the part before it to be done (no
# program need be resident for another: any grid, an SM limit, the other stream's blocks between)
ORDERS = ("grid", "tickets")
PERSIST_PROGRAMS_MAX = 1024  # 0: as many programs as the GPU holds at once
# programmatic dependent launch (sm_90+): each launch of the model may start while the kernel before it
# on its stream finishes; its programs wait (griddepcontrol.wait) before touching memory, and let the
# next launch start (griddepcontrol.launch_dependents) at the `start` of their work, right after the
# wait, or at its `end`; `prefetch`: before waiting, they ask L2 for their tile's weights
PDL_TRIGGERS = ("none", "start", "end")
PDL_KEYS = ("trigger", "prefetch", "preload")  # preload: GEMM tiles load their first weights before the wait
PDL_AHEAD = ("prefetch", "preload")  # what a launch does ahead of its wait: needs a trigger
AHEAD_WHAT = {"prefetch": "prefetches", "preload": "loads weights"}  # for errors
# with two streams, the SMs one model's stream may use (a CUDA green context); 0: every SM. Hopper
# partitions SMs in groups of 8. One model at most: the other keeps the whole GPU, and so the SMs
# the limited one leaves are the other's alone
SM_LIMIT_STEP, SM_LIMIT_MAX = 8, 1024
FUSIONS = ("attn_norm+qkv", "qkv+rope_kv", "mlp_norm+gate_up", "gate_up+down", "final_norm+lm_head",
           "lm_head+argmax")
MATCH_MAX = 200  # characters of an override's glob
MODEL_KEYS = tuple(model.value for model in Model)  # plain strings: the plan stays plain JSON
_TOP_KEYS = ("schema", "name", "description", "alignment", "pairs", "interleave", "tiles", "fusions",
             "operand_layout", "capture", "streams", "priority", "split_reduce", "persist", "pdl", "sm_limit",
             "launch", "overrides")
_OVERRIDE_KEYS = ("match", "pair", "with", "interleave", "tiles", "launch", "operand_layout", "pdl")
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_+*]{1,40}")  # a key shown in a JSON path as .key, any other as ["key"]
_HASH_IGNORED = ("name", "description")  # cosmetic: two plans differing only here are the same plan
# keys added after plans were first stored: hashed only when set, so earlier plans keep their hashes
_HASH_WHEN_SET = {"priority": "none", "split_reduce": {"draft": "ordered", "target": "ordered"},
                  "persist": {m: {"span": "none", "programs": 0, "prefetch": True} for m in MODEL_KEYS},
                  "pdl": {m: {"trigger": "none", "prefetch": False} for m in MODEL_KEYS},
                  "sm_limit": {m: 0 for m in MODEL_KEYS}}
# per model, keys added later still inside those: hashed only when set
_HASH_WHEN_SET_PER_MODEL = {"pdl": {"preload": False}, "persist": {"preload": False, "order": "grid"}}


class _Checker:
    """Walks a plan dict, collecting 'PATH: reason' errors and returning canonical values."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def fail(self, path: str, reason: str) -> None:
        self.errors.append(f"{path}: {reason}")

    def obj(self, value: Any, path: str, keys: tuple[str, ...]) -> dict:
        if not isinstance(value, dict):
            self.fail(path, f"should be an object, got {_kind(value)}")
            return {}
        for key in value:
            if key not in keys:
                self.fail(_member(path, key), f"unknown key; allowed: {', '.join(keys)}")
        return value

    def choice(self, value: Any, path: str, options: tuple[str, ...]) -> Any:
        if value not in options:
            self.fail(path, f"{shown_json(value)} is not one of {', '.join(options)}")
        return value

    def string(self, value: Any, path: str) -> str:
        if not isinstance(value, str):
            self.fail(path, f"should be a string, got {_kind(value)}")
            return ""
        return value

    def name(self, value: Any, path: str) -> str:
        """A plan's name: none (its hash stands for it), or one that tables show as it is."""
        value = self.string(value, path)
        if value and not is_shown_name(value):
            self.fail(path, f"is {shown_json(value)}; 1 to {NAME_MAX} printable characters")
            return ""
        return value

    def integer(self, value: Any, path: str, low: int, high: int, power_of_two: bool = False) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            self.fail(path, f"should be an integer, got {_kind(value)}")
            return low
        if power_of_two and not is_power_of_two(value):
            self.fail(path, f"{value} is not a power of two")
        elif not low <= value <= high:
            self.fail(path, f"{shown(value)} is out of range [{low}, {high}]")
        return value

    def names(self, value: Any, path: str, options: tuple[str, ...], item: str, items: str) -> list[str]:
        """A list of names drawn from `options` ("an op kind", "op kinds"), sorted, without repeats."""
        if not isinstance(value, list):
            self.fail(path, f"should be a list of {items}, got {_kind(value)}")
            return []
        chosen = set()
        for i, v in enumerate(value):
            if isinstance(v, str):  # an object or a list here is an error, not a set member
                chosen.add(self.choice(v, f"{path}[{i}]", options))
            else:
                self.fail(f"{path}[{i}]", f"should be {item} string, got {_kind(v)}")
        return sorted(chosen)

    def kinds(self, value: Any, path: str, allow_any: bool = False) -> list[str]:
        chosen = self.names(value, path, KINDS + (("*",) if allow_any else ()), "an op kind", "op kinds")
        return ["*"] if "*" in chosen else chosen

    def interleave(self, value: Any, path: str) -> dict:
        value = self.obj(value, path, ("pattern", "ratio"))
        pattern = self.choice(value.get("pattern", "strided"), f"{path}.pattern", PATTERNS)
        ratio = value.get("ratio", [1, 1])
        if not (isinstance(ratio, list) and len(ratio) == 2):
            self.fail(f"{path}.ratio", f"should be a list of two integers [target, draft], got {shown_json(ratio)}")
            ratio = [1, 1]
        ratio = [self.integer(r, f"{path}.ratio[{i}]", 1, 64) for i, r in enumerate(ratio)]
        return {"pattern": pattern, "ratio": ratio if pattern == "ratio" else [1, 1]}

    def launch(self, value: Any, path: str) -> dict:
        value = self.obj(value, path, tuple(LAUNCH_BOUNDS))
        return {key: self.integer(v, f"{path}.{key}", *LAUNCH_BOUNDS[key], power_of_two=key == "num_warps")
                for key, v in sorted(value.items()) if key in LAUNCH_BOUNDS}

    def boolean(self, value: Any, path: str) -> bool:
        if not isinstance(value, bool):
            self.fail(path, f"should be a boolean, got {_kind(value)}")
            return False
        return value

    def persist(self, value: Any, path: str) -> dict:
        value = self.obj(value, path, ("span", "programs", "prefetch", "preload", "order"))
        return {"span": self.choice(value.get("span", "none"), f"{path}.span", SPANS),
                "order": self.choice(value.get("order", "grid"), f"{path}.order", ORDERS),
                "programs": self.integer(value.get("programs", 0), f"{path}.programs", 0, PERSIST_PROGRAMS_MAX),
                "prefetch": self.boolean(value.get("prefetch", True), f"{path}.prefetch"),
                "preload": self.boolean(value.get("preload", False), f"{path}.preload")}

    def pdl(self, value: Any, path: str) -> dict:
        value = self.obj(value, path, PDL_KEYS)
        return {"trigger": self.choice(value.get("trigger", "none"), f"{path}.trigger", PDL_TRIGGERS),
                "prefetch": self.boolean(value.get("prefetch", False), f"{path}.prefetch"),
                "preload": self.boolean(value.get("preload", False), f"{path}.preload")}

    def tiles(self, value: Any, path: str) -> dict:
        value = self.obj(value, path, MODEL_KEYS)
        out = {}
        for model in MODEL_KEYS:
            per_kind = self.obj(value.get(model, {}), f"{path}.{model}", KINDS)
            out[model] = {kind: self.tile(cfg, f"{path}.{model}.{kind}", kind)
                          for kind, cfg in sorted(per_kind.items()) if kind in KINDS}
        return out

    def tile(self, value: Any, path: str, kind: str) -> dict:
        bounds = tile_keys(kind)
        value = self.obj(value, path, tuple(bounds))
        return {key: self.integer(v, f"{path}.{key}", *bounds[key], power_of_two=key != "num_stages")
                for key, v in sorted(value.items()) if key in bounds}


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), type(value).__name__ if not isinstance(value, (int, float)) else f"the number {shown(value)}")


def _member(path: str, key: str) -> str:
    """The JSON path of an object's member: `$.tiles.target`, or `$.tiles["odd key"]` for a key that is
    not a plain name (spaces, line breaks, punctuation, or too long to show)."""
    key = str(key)
    return f"{path}.{key}" if _PLAIN_KEY.fullmatch(key) else f"{path}[{shown_json(key)}]"


def _canonical(raw: Any) -> tuple[dict, list[str]]:
    c = _Checker()
    raw = c.obj(raw, "$", _TOP_KEYS)
    if raw.get("schema") != SCHEMA:
        c.fail("$.schema", f"should be {json.dumps(SCHEMA)}, got {shown_json(raw.get('schema'))}")
    plan = {
        "schema": SCHEMA,
        "name": c.name(raw.get("name", ""), "$.name"),
        "description": c.string(raw.get("description", ""), "$.description"),
        "alignment": c.choice(raw.get("alignment", "sequential"), "$.alignment", ALIGNMENTS),
        "interleave": c.interleave(raw.get("interleave", {}), "$.interleave"),
        "tiles": c.tiles(raw.get("tiles", {}), "$.tiles"),
        "operand_layout": c.choice(raw.get("operand_layout", "separate"), "$.operand_layout", LAYOUTS),
        "capture": c.choice(raw.get("capture", "graph"), "$.capture", CAPTURES),
        "streams": c.choice(raw.get("streams", "one"), "$.streams", STREAMS),
        "priority": c.choice(raw.get("priority", "none"), "$.priority", PRIORITIES),
        "launch": DEFAULT_LAUNCH | c.launch(raw.get("launch", {}), "$.launch"),
    }
    reduce = c.obj(raw.get("split_reduce", {}), "$.split_reduce", MODEL_KEYS)
    plan["split_reduce"] = {m: c.choice(reduce.get(m, "ordered"), f"$.split_reduce.{m}", REDUCTIONS) for m in MODEL_KEYS}
    persist = c.obj(raw.get("persist", {}), "$.persist", MODEL_KEYS)
    plan["persist"] = {m: c.persist(persist.get(m, {}), f"$.persist.{m}") for m in MODEL_KEYS}
    pdl = c.obj(raw.get("pdl", {}), "$.pdl", MODEL_KEYS)
    plan["pdl"] = {m: c.pdl(pdl.get(m, {}), f"$.pdl.{m}") for m in MODEL_KEYS}
    limits = c.obj(raw.get("sm_limit", {}), "$.sm_limit", MODEL_KEYS)
    plan["sm_limit"] = {m: c.integer(limits.get(m, 0), f"$.sm_limit.{m}", 0, SM_LIMIT_MAX) for m in MODEL_KEYS}
    pairs = c.obj(raw.get("pairs", {}), "$.pairs", KINDS)
    plan["pairs"] = {k: c.kinds(v, f"$.pairs.{k}", allow_any=True) for k, v in sorted(pairs.items()) if k in KINDS}
    fusions = c.obj(raw.get("fusions", {}), "$.fusions", MODEL_KEYS)
    plan["fusions"] = {m: c.names(fusions.get(m, []), f"$.fusions.{m}", FUSIONS, "a fusion", "fusions")
                       for m in MODEL_KEYS}
    overrides = raw.get("overrides", [])
    if not isinstance(overrides, list):
        c.fail("$.overrides", f"should be a list, got {_kind(overrides)}")
        overrides = []
    plan["overrides"] = [_override(c, o, f"$.overrides[{i}]") for i, o in enumerate(overrides)]
    if plan["priority"] != "none" and plan["streams"] != "two":
        c.fail("$.priority", f"{plan['priority']!r} favours one model's stream, so it needs $.streams 'two'")
    if plan["streams"] == "two" and all(_grid_barriers(plan, m) for m in MODEL_KEYS):
        c.fail("$.persist", "both models persistent with barriers on two streams: each grid could hold part of the "
                            "GPU and wait for programs the other keeps from starting; one stream, at most one "
                            "model with span layer or step, or order 'tickets'")
    for m in MODEL_KEYS:
        if plan["persist"][m]["preload"] and plan["persist"][m]["span"] not in BARRIER_SPANS:
            c.fail(f"$.persist.{m}.preload", f"loads a part's first weights before the grid barrier ahead of it, so "
                                             f"it needs $.persist.{m}.span 'layer' or 'step', not "
                                             f"{plan['persist'][m]['span']!r}")
        if plan["persist"][m]["order"] != "grid" and plan["persist"][m]["span"] not in BARRIER_SPANS:
            c.fail(f"$.persist.{m}.order", f"{plan['persist'][m]['order']!r} orders the parts of a launch that joins "
                                           f"several, so it needs $.persist.{m}.span 'layer' or 'step', not "
                                           f"{plan['persist'][m]['span']!r}")
        if plan["pdl"][m]["trigger"] != "none" and plan["persist"][m]["span"] in BARRIER_SPANS:
            why = ("its barrier needs them all resident" if plan["persist"][m]["order"] == "grid"
                   else "a launch of joined parts waits for the kernel before it once, not in its tiles")
            c.fail(f"$.pdl.{m}.trigger", f"{plan['pdl'][m]['trigger']!r} lets a persistent launch's programs start "
                                         f"while the kernel before it still holds SMs, and {why}: 'none' with "
                                         f"$.persist.{m}.span {plan['persist'][m]['span']!r}")
        for key in PDL_AHEAD:
            if plan["pdl"][m][key] and plan["pdl"][m]["trigger"] == "none":
                c.fail(f"$.pdl.{m}.{key}", f"{AHEAD_WHAT[key]} ahead of the wait of a programmatic dependent "
                                           f"launch, so it needs a trigger other than 'none'")
    limited = [m for m in MODEL_KEYS if plan["sm_limit"][m]]
    for m in limited:
        if plan["sm_limit"][m] % SM_LIMIT_STEP:
            c.fail(f"$.sm_limit.{m}", f"should be a multiple of {SM_LIMIT_STEP} (SMs are partitioned in groups of "
                                      f"{SM_LIMIT_STEP}), got {plan['sm_limit'][m]}")
        elif plan["streams"] != "two":
            c.fail(f"$.sm_limit.{m}", "limits one model's stream to part of the GPU, so it needs $.streams 'two'")
        elif _grid_barriers(plan, m):
            c.fail(f"$.sm_limit.{m}", f"limits a model persistent with barriers ($.persist.{m}.span "
                                      f"{plan['persist'][m]['span']!r}): its grid is sized for every SM, and "
                                      f"programs that never become resident would hold its barrier forever")
    if len(limited) > 1:
        c.fail("$.sm_limit", "limits both models: at most one (the other keeps every SM, and so the SMs left "
                             "over are its own)")
    if plan["streams"] == "two" and plan["alignment"] != "sequential":
        c.fail("$.streams", "'two' runs each model on its own stream, so it needs $.alignment 'sequential' "
                            "(cross-model launches belong to one stream)")
    return plan, c.errors


def _grid_barriers(plan: dict, model: str) -> bool:
    """Whether a model's persistent launches join parts behind grid barriers (every program resident)."""
    return plan["persist"][model]["span"] in BARRIER_SPANS and plan["persist"][model]["order"] == "grid"


def _override(c: _Checker, value: Any, path: str) -> dict:
    value = c.obj(value, path, _OVERRIDE_KEYS)
    if "match" not in value:
        c.fail(f"{path}.match", "required: a glob over op ids, such as 't.l*.qkv'")
    out = {"match": c.string(value.get("match", ""), f"{path}.match")}
    if len(out["match"]) > MATCH_MAX:  # globbing costs the square of a pattern's length
        c.fail(f"{path}.match", f"is {len(out['match'])} characters long; at most {MATCH_MAX} (op ids are short)")
    if "pair" in value:
        if not isinstance(value["pair"], bool):
            c.fail(f"{path}.pair", f"should be a boolean, got {_kind(value['pair'])}")
        out["pair"] = value["pair"]
    if "with" in value:
        out["with"] = c.string(value["with"], f"{path}.with")
        if isinstance(value["with"], str) and not out["with"].startswith(f"{Model.DRAFT.short}."):
            c.fail(f"{path}.with", f"{shown_json(out['with'])} should name a draft op id, such as 'd.s0.l3.down'")
    if "interleave" in value:
        out["interleave"] = c.interleave(value["interleave"], f"{path}.interleave")
    if "tiles" in value:
        out["tiles"] = c.tiles(value["tiles"], f"{path}.tiles")
    if "launch" in value:
        out["launch"] = c.launch(value["launch"], f"{path}.launch")
    if "operand_layout" in value:
        out["operand_layout"] = c.choice(value["operand_layout"], f"{path}.operand_layout", LAYOUTS)
    if "pdl" in value:
        out["pdl"] = _override_pdl(c, value["pdl"], f"{path}.pdl")
    return out


def _override_pdl(c: _Checker, value: Any, path: str) -> dict:
    """An override's `pdl`: the keys it sets of the matching launches' own (the rest stay their model's)."""
    if value == {}:
        c.fail(path, "sets none of 'trigger', 'prefetch', 'preload'")
    value = c.obj(value, path, PDL_KEYS)
    out = {}
    if "trigger" in value:
        out["trigger"] = c.choice(value["trigger"], f"{path}.trigger", PDL_TRIGGERS)
    for key in PDL_AHEAD:
        if key in value:
            out[key] = c.boolean(value[key], f"{path}.{key}")
        if out.get(key) and out.get("trigger") == "none":
            c.fail(f"{path}.{key}", f"{AHEAD_WHAT[key]} ahead of the wait of a programmatic dependent launch, so it "
                                    f"needs a trigger other than 'none'")
    return out



@dataclass(frozen=True)
class Plan:
    """A validated plan. `data` is its canonical dict: defaults filled, sets sorted; `source` says where
    it was read from (a file), for error lines, and takes no part in comparisons."""

    data: dict
    source: str = field(default="", compare=False)

    @property
    def hash(self) -> str:
        return plan_hash(self.data)

    @property
    def name(self) -> str:
        return self.data["name"] or self.hash[:8]

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def to_dict(self) -> dict:
        return copy.deepcopy(self.data)

    def to_json(self) -> str:
        return json.dumps(self.data, indent=2, sort_keys=True) + "\n"


def validate_plan(raw: Any, source: str | None = None) -> Plan:
    """Check a plan dict; raises PlanError listing every problem as 'JSON path: reason'."""
    check_nesting(raw, source or "plan", PlanError)  # before anything walks it recursively
    data, errors = _canonical(copy.deepcopy(raw))
    if errors:
        raise PlanError(errors, source)
    return Plan(data, source or "")


def load_plan(path: str | Path) -> Plan:
    path = Path(path)
    return validate_plan(read_json(path, PlanError, "plan file", unique_keys=True), str(path))


_UNSET = object()


def without_late_defaults(data: dict) -> dict:
    """A canonical plan without the keys added after plans were first stored where they hold their
    defaults (what a plan that never set them means)."""
    out = {}
    for key, value in data.items():
        if key in _HASH_WHEN_SET_PER_MODEL and isinstance(value, dict):
            late = _HASH_WHEN_SET_PER_MODEL[key]
            value = {m: {k: v for k, v in per.items() if late.get(k, _UNSET) != v} if isinstance(per, dict) else per
                     for m, per in value.items()}
        if _HASH_WHEN_SET.get(key, _UNSET) != value:
            out[key] = value
    return out


def plan_hash(data: dict) -> str:
    """sha256 of the canonical JSON, without the cosmetic name and description."""
    body = {k: v for k, v in without_late_defaults(data).items() if k not in _HASH_IGNORED}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
