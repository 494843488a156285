"""The cross-model plan (conjugate.plan/2): its fields and rules, declared once, and `Plan`.

A plan is compact JSON an LLM can edit: one block per model (`draft`, `target`: tiles, fusions,
split-K reduction, programmatic dependent launch, stream; the draft's also its launch form) and one `cross` block for what the two
share (streams, graph capture, default launch parameters, and the rules that place draft ops into
target launches, with overrides selecting launches by a glob over op ids). The declaration below is
the one source of the checker and of plans/plan.schema.json (`python -m conjugate.plan.json_schema`).
A conjugate.plan/1 plan is converted on read (conjugate/plan/upgrade.py).
"""
from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from conjugate.errors import PlanError
from conjugate.files import check_nesting, read_json
from conjugate.graph import KINDS
from conjugate.plan.blocks import Cross, ModelBlock
from conjugate.plan.fields import Choice, Const, Flag, Integer, IntPair, ListOf, Names, Record, Text
from conjugate.plan.rules import AtMostOne, Needs, Only
from conjugate.plan.tiles import DEFAULT_LAUNCH, DEFAULT_TILES, FAMILY_OF, LAUNCH_BOUNDS, tile_keys
from conjugate.plan.upgrade import SCHEMA, is_v1, upgrade_v1
from conjugate.roles import Model

ALIGNMENTS = ("sequential", "proportional", "greedy")
PATTERNS = ("blocked", "strided", "ratio")
LAYOUTS = ("separate", "packed")
CAPTURES = ("graph", "none")
STREAMS = ("one", "two")
PRIORITIES = ("normal", "high")  # with two streams: "high", the GPU serves this model's stream first
# how a split-K GEMM that adds into the residual stream (o_proj, down) sums its splits: in split
# order by the tile's last split (deterministic), or each split adding its partial atomically (a
# fused MLP, fusion gate_up+down, adds its ffn blocks' shares atomically either way)
REDUCTIONS = ("ordered", "atomic")
# programmatic dependent launch (sm_90+): each launch of the model may start while the kernel before it
# on its stream finishes; its programs wait (griddepcontrol.wait) before touching memory, and let the
# next launch start (griddepcontrol.launch_dependents) at the `start` of their work or at its `end`
PDL_TRIGGERS = ("none", "start", "end")
# with two streams, the SMs one model's stream may use (a CUDA green context); 0: every SM. Hopper
# partitions SMs in groups of 8
SM_LIMIT_STEP, SM_LIMIT_MAX = 8, 1024
FUSIONS = ("attn_norm+qkv", "qkv+rope_kv", "mlp_norm+gate_up", "gate_up+down", "final_norm+lm_head",
           "lm_head+argmax")
# how the draft's k decode steps run: one launch per op (or fused chain) per step, or all of them as
# one persistent launch of the step kernel (conjugate/kernels/step, Hopper; the CPU runs its table
# in torch)
FORMS = ("launches", "step")
# the residual GEMMs a model may run as the streamed kernel (conjugate/kernels/streamed.py, Hopper;
# the CPU emulates it in torch): whole-K weight tiles streamed by TMA, where the op's launch holds it alone
STREAMED_KINDS = ("o_proj", "down")
MATCH_MAX = 200  # characters of an override's glob: globbing costs the square of a pattern's length
MODEL_KEYS = tuple(model.value for model in Model)  # plain strings: the plan stays plain JSON
_HASH_IGNORED = ("name", "description")  # cosmetic: two plans differing only here are the same plan
# model-block fields added after plans were first stored: at these values they leave a plan's hash as it was
_HASH_NEUTRAL = {"form": "launches", "streamed": []}


def _launch_fields() -> dict:
    return {key: Integer(low, high, DEFAULT_LAUNCH[key], power_of_two=key == "num_warps")
            for key, (low, high) in LAUNCH_BOUNDS.items()}


def _tile(kind: str) -> Record:
    defaults = DEFAULT_TILES[FAMILY_OF[kind]] | DEFAULT_LAUNCH
    return Record({key: Integer(low, high, defaults[key], power_of_two=key != "num_stages")
                   for key, (low, high) in tile_keys(kind).items()}, fill=False, ref=f"tile_{FAMILY_OF[kind]}",
                  doc=f"A {FAMILY_OF[kind]} tile config.")


MODEL_TILES = Record({kind: _tile(kind) for kind in KINDS}, fill=False, ref="tiles",
                     doc="Per op kind tile configs; unset keys take the compiler's defaults.")


def _ratio_only_when_used(interleave: dict) -> dict:
    return interleave | {"ratio": interleave["ratio"] if interleave["pattern"] == "ratio" else [1, 1]}


INTERLEAVE = Record({"pattern": Choice(PATTERNS, "strided"),
                     "ratio": IntPair(Integer(1, 64, 1), "[target, draft]")},
                    finish=_ratio_only_when_used, ref="interleave", doc="How a shared launch's programs are split between its parts.")

MODEL_BLOCK = Record({
    "tiles": MODEL_TILES,
    "fusions": Names(FUSIONS, "a fusion", doc="Vertical fusions: consecutive ops run as one part."),
    "reduce": Choice(REDUCTIONS, "ordered", doc="How o_proj and down sum their split-K partials."),
    "pdl": Choice(PDL_TRIGGERS, "none", doc="Programmatic dependent launch: where programs let the next launch start."),
    "stream": Record({
        "priority": Choice(PRIORITIES, "normal", doc="'high': the GPU serves this model's stream first."),
        "sms": Integer(0, SM_LIMIT_MAX, 0, step=SM_LIMIT_STEP, why_step="SMs are partitioned in groups of 8",
                       doc="SMs this model's stream may use; 0: every SM."),
    }, doc="This model's CUDA stream, with two streams."),
    "form": Choice(FORMS, "launches", doc="Draft only. 'step': its k decode steps as one persistent launch "
                                          "(Hopper, bf16, batch <= 32); its tiles, fusions, reduce, pdl unused."),
    "streamed": Names(STREAMED_KINDS, "a residual GEMM kind",
                      doc="Run by the streamed kernel where alone in a launch (Hopper, bf16, <= 128 rows)."),
}, ref="model", doc="One model's choices.")

OVERRIDE = Record({
    "match": Text(max_length=MATCH_MAX, doc="A glob over op ids, such as 't.l*.qkv'."),
    "pair": Flag(doc="Forbid (false) or force (true) pairing in the matching target launches."),
    "with": Text(prefix=f"{Model.DRAFT.short}.", prefix_hint="should name a draft op id, such as 'd.s0.l3.down'",
                 doc="A draft op pinned into the one matching target launch."),
    "interleave": INTERLEAVE,
    "tiles": Record({m: MODEL_TILES for m in MODEL_KEYS}, fill=False),
    "launch": Record(_launch_fields(), fill=False),
    "operand_layout": Choice(LAYOUTS, "separate"),
    "pdl": Choice(PDL_TRIGGERS, "none", doc="The matching launches' trigger."),
}, fill=False, required={"match": "a glob over op ids, such as 't.l*.qkv'"})

CROSS_BLOCK = Record({
    "streams": Choice(STREAMS, "one", doc="'two': each model on its own CUDA stream."),
    "capture": Choice(CAPTURES, "graph", doc="'graph': the round replays as one CUDA graph."),
    "launch": Record(_launch_fields(), doc="Default launch parameters."),
    "alignment": Choice(ALIGNMENTS, "sequential", doc="How draft units are placed along the target's launches."),
    "pairs": Record({kind: Names(KINDS, "an op kind", any="*") for kind in KINDS}, fill=False,
                    doc="Target op kind -> the draft op kinds that may share its launch ('*': any)."),
    "interleave": INTERLEAVE,
    "operand_layout": Choice(LAYOUTS, "separate", doc="'packed': paired GEMM weights in one interleaved buffer."),
    "overrides": ListOf(OVERRIDE, doc="Later ones win."),
}, doc="What the two models share.")

PLAN = Record({
    "schema": Const(SCHEMA),
    "name": Text(shown_name=True),
    "description": Text(),
    **{m: MODEL_BLOCK for m in MODEL_KEYS},
    "cross": CROSS_BLOCK,
}, doc="How one speculative-decoding round (the draft's k decode steps beside the target's verify pass) is "
       "split into launches (semantics: conjugate/plan/expand.py).")

_TWO = ("cross", "streams")
RULES = (
    Only((Model.TARGET.value, "form"), ("launches",), "only the draft's k decode steps run as a step launch (the "
         "target verifies k + 1 tokens a sequence in one pass)"),
    Needs((Model.DRAFT.value, "form"), ("launches",), ("cross", "alignment"), ("sequential",),
          "runs the draft's steps as one launch of its own, which no target launch can share"),
    Needs(_TWO, ("one",), ("cross", "alignment"), ("sequential",),
          "runs each model on its own stream (cross-model launches belong to one stream)"),
    *(Needs((m, "stream", "priority"), ("normal",), _TWO, ("two",), "favours this model's stream")
      for m in MODEL_KEYS),
    *(Needs((m, "stream", "sms"), (0,), _TWO, ("two",), "limits this model's stream to part of the GPU")
      for m in MODEL_KEYS),
    AtMostOne(tuple((m, "stream", "priority") for m in MODEL_KEYS), ("normal",),
              "for both models: at most one model's stream goes first"),
    AtMostOne(tuple((m, "stream", "sms") for m in MODEL_KEYS), (0,),
              "limits both models: at most one (the other keeps every SM, and so the SMs left over are its own)"),
)


def _canonical(raw: Any) -> tuple[dict, list[str]]:
    errors: list[str] = []
    plan = PLAN.check(raw, "$", errors)
    if not errors:  # rules read a well-formed plan
        errors += [e for rule in RULES for e in rule.check(plan)]
    return plan, errors


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

    def model(self, model: Model | str) -> ModelBlock:
        return self._models[Model(model)]

    @cached_property
    def _models(self) -> dict[Model, ModelBlock]:
        return {m: ModelBlock.from_dict(self.data[m.value]) for m in Model}

    @cached_property
    def cross(self) -> Cross:
        return Cross.from_dict(self.data["cross"])

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def to_dict(self) -> dict:
        return copy.deepcopy(self.data)

    def to_json(self) -> str:
        return json.dumps(self.data, indent=2, sort_keys=True) + "\n"


def validate_plan(raw: Any, source: str | None = None) -> Plan:
    """Check a plan dict (a conjugate.plan/1 one is converted first); raises PlanError listing every
    problem as 'JSON path: reason'."""
    check_nesting(raw, source or "plan", PlanError)  # before anything walks it recursively
    raw = upgrade_v1(raw, source) if is_v1(raw) else copy.deepcopy(raw)
    data, errors = _canonical(raw)
    if errors:
        raise PlanError(errors, source)
    return Plan(data, source or "")


def load_plan(path: str | Path) -> Plan:
    path = Path(path)
    return validate_plan(read_json(path, PlanError, "plan file", unique_keys=True), str(path))


def plan_hash(data: dict) -> str:
    """sha256 of the canonical JSON (defaults filled), without the cosmetic name and description."""
    body = {k: v for k, v in data.items() if k not in _HASH_IGNORED}
    for model in MODEL_KEYS:
        if isinstance(body.get(model), dict):
            body[model] = {k: v for k, v in body[model].items() if k not in _HASH_NEUTRAL or v != _HASH_NEUTRAL[k]}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
