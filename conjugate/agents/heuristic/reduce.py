"""Reduce edits: how a model's split-K GEMMs into the residual stream (o_proj, down) sum their splits.

Atomically, which takes the fix-up step (a counter, then the last split reading every partial back)
off the chain of dependent kernels, ranked high (facts: reduce_atomic); or back to the ordered,
deterministic sum, ranked low.
"""
from __future__ import annotations

from conjugate.agents.heuristic.candidate import Candidate
from conjugate.plan.expand import RESIDUAL_GEMMS
from conjugate.plan.schema import MODEL_KEYS, Plan
from conjugate.roles import Model


def reduce_edits(plan: Plan) -> list[Candidate]:
    if packs(plan):  # a packed launch runs both models' GEMMs in one tile loop: one sum for both
        other = "ordered" if plan[Model.TARGET.value]["reduce"] == "atomic" else "atomic"
        both = [{"op": "replace", "path": f"/{m}/reduce", "value": other} for m in MODEL_KEYS]
        return [Candidate("reduce", both, f"split-K residual GEMMs of both models (packed) sum {other}",
                          0.4 if other == "atomic" else 0.2)]
    out = []
    for model in MODEL_KEYS:
        path = f"/{model}/reduce"
        splits = {k: plan[model]["tiles"].get(k, {}).get("SPLIT_K", 1) for k in RESIDUAL_GEMMS}
        split = [k for k, n in splits.items() if n > 1]
        if plan[model]["reduce"] == "atomic":
            out.append(Candidate("reduce", [{"op": "replace", "path": path, "value": "ordered"}],
                                 f"{model} split-K sums in split order again: deterministic", 0.2))
        elif split:
            out.append(Candidate("reduce", [{"op": "replace", "path": path, "value": "atomic"}],
                                 f"{model} {' and '.join(split)} add their {max(splits.values())} split-K partials "
                                 f"atomically: no fix-up step in each launch",
                                 0.6 if model == Model.DRAFT.value else 0.5))
    return out


def packs(plan: Plan) -> bool:
    return plan["cross"]["operand_layout"] == "packed" or any(o.get("operand_layout") == "packed" for o in plan["cross"]["overrides"])
