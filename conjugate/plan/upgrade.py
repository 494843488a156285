"""conjugate.plan/1 -> conjugate.plan/2: the top-level knobs regrouped into per-model blocks and a
cross-model block.

    tiles[m], fusions[m], split_reduce[m], pdl[m].trigger, sm_limit[m]   -> m.{tiles, fusions, reduce, pdl, stream.sms}
    priority "draft" | "target"                                        -> that model's stream.priority "high"
    streams, capture, launch, alignment, pairs, interleave,
    operand_layout, overrides (pdl: the trigger alone)                  -> cross.*

Knobs retired for want of a measured win (`persist`, `pdl.prefetch`, `pdl.preload`) are dropped where
they hold their defaults and refused otherwise. Only the shape changes here: values are checked by
the v2 checker afterwards. `upgrade_files` rewrites plan files (`conjugate plan upgrade`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conjugate.errors import PlanError
from conjugate.files import read_json, shown_json, write_atomic
from conjugate.plan.fields import kind_of, member
from conjugate.plan.schema import MODEL_KEYS, SCHEMA, validate_plan

SCHEMA_V1 = "conjugate.plan/1"
_CROSS_KEYS = ("streams", "capture", "launch", "alignment", "pairs", "interleave", "operand_layout")
_PER_MODEL = {"tiles": "tiles", "fusions": "fusions", "split_reduce": "reduce"}  # v1 key -> model block key
_RETIRED_PERSIST = {"span": "none", "order": "grid", "programs": 0, "prefetch": True, "preload": False}
_RETIRED_PDL = {"prefetch": False, "preload": False}
_V1_KEYS = ("schema", "name", "description", "priority", "pdl", "sm_limit", "persist", "overrides",
            *_CROSS_KEYS, *_PER_MODEL)
_PRIORITY_MODELS = ("draft", "target")  # v1 priority values that name a model


def is_v1(raw: Any) -> bool:
    return isinstance(raw, dict) and raw.get("schema") == SCHEMA_V1


def upgrade_v1(raw: dict, source: str | None = None) -> dict:
    """The v2 form of a v1 plan dict (not yet checked); PlanError naming the v1 field for a retired
    knob in use or a block that is not an object."""
    unknown = [k for k in raw if k not in _V1_KEYS]
    if unknown:
        raise PlanError(f"{member('$', unknown[0])}: unknown key; allowed: {', '.join(_V1_KEYS)}", source)
    _refuse_retired(raw, source)
    out: dict = {"schema": SCHEMA} | {k: raw[k] for k in ("name", "description") if k in raw}
    for model in MODEL_KEYS:
        out[model] = _model_block(raw, model, source)
    out["cross"] = {k: raw[k] for k in _CROSS_KEYS if k in raw}
    if "overrides" in raw:
        out["cross"]["overrides"] = _overrides(raw["overrides"])
    return out


def _per_model(raw: dict, key: str, source: str | None) -> dict:
    value = raw.get(key, {})
    if not isinstance(value, dict):
        raise PlanError(f"$.{key}: should be an object, got {kind_of(value)}", source)
    unknown = [k for k in value if k not in MODEL_KEYS]
    if unknown:
        raise PlanError(f"{member(f'$.{key}', unknown[0])}: unknown key; allowed: {', '.join(MODEL_KEYS)}", source)
    return value


def _model_block(raw: dict, model: str, source: str | None) -> dict:
    block = {new: _per_model(raw, old, source)[model] for old, new in _PER_MODEL.items()
             if model in _per_model(raw, old, source)}
    pdl = _per_model(raw, "pdl", source).get(model, {})
    if isinstance(pdl, dict) and "trigger" in pdl:
        block["pdl"] = pdl["trigger"]
    stream = {}
    if raw.get("priority") == model:
        stream["priority"] = "high"
    if model in _per_model(raw, "sm_limit", source):
        stream["sms"] = raw["sm_limit"][model]
    return block | ({"stream": stream} if stream else {})


def _overrides(overrides: Any) -> Any:
    if not isinstance(overrides, list):
        return overrides  # the v2 checker names it
    out = []
    for o in overrides:
        if isinstance(o, dict) and isinstance(o.get("pdl"), dict):
            o = {k: v for k, v in o.items() if k != "pdl"} | ({"pdl": o["pdl"]["trigger"]} if "trigger" in o["pdl"]
                                                                else {})
        out.append(o)
    return out


def _refuse_retired(raw: dict, source: str | None) -> None:
    """A retired knob set away from its default: refused, naming it."""
    if raw.get("priority") not in (None, "none", *_PRIORITY_MODELS):
        raise PlanError(f"$.priority: {shown_json(raw['priority'])} is not one of none, draft, target", source)
    used = []
    for model, persist in _per_model(raw, "persist", source).items():
        used += _set_away(persist, _RETIRED_PERSIST, f"$.persist.{model}", source)
    for model, pdl in _per_model(raw, "pdl", source).items():
        used += _set_away(pdl, _RETIRED_PDL | {"trigger": None}, f"$.pdl.{model}", source, keep=("trigger",))
    for n, o in enumerate(raw.get("overrides", []) if isinstance(raw.get("overrides"), list) else []):
        if isinstance(o, dict) and "pdl" in o:
            used += _set_away(o["pdl"], _RETIRED_PDL | {"trigger": None}, f"$.overrides[{n}].pdl", source,
                                keep=("trigger",))
    if used:
        path, value = used[0]
        raise PlanError(f"{path}: {shown_json(value)}: this knob was retired (no measured win); remove it", source)


def _set_away(value: Any, defaults: dict, path: str, source: str | None,
              keep: tuple[str, ...] = ()) -> list[tuple[str, Any]]:
    """The (path, value) of each key of `value` that is unknown or set away from its default."""
    if not isinstance(value, dict):
        raise PlanError(f"{path}: should be an object, got {kind_of(value)}", source)
    return [(member(path, k), v) for k, v in value.items()
            if k not in keep and (k not in defaults or v != defaults[k] or isinstance(v, bool) != isinstance(defaults[k], bool))]


def upgrade_files(paths: list[Path], out_dir: Path | None) -> list[tuple[Path, Path | None]]:
    """Rewrite v1 plan files as v2: into `out_dir` under their own names, or in place (None). Every
    file is read and checked before any is written; returns (file, written to) pairs, None where a
    file was already v2."""
    done = []
    for path in paths:
        raw = read_json(path, PlanError, "plan file", unique_keys=True)
        if not is_v1(raw):
            validate_plan(raw, str(path))  # a v2 plan is left as it is, but must be one
            done.append((path, None, None))
            continue
        v2 = upgrade_v1(raw, str(path))
        validate_plan(v2, str(path))
        done.append((path, (out_dir / path.name) if out_dir else path, v2))
    for _, target, v2 in done:
        if target is not None:
            target.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(target, json.dumps(v2, indent=2) + "\n")
    return [(path, target) for path, target, _ in done]
