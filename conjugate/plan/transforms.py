"""Plans rewritten for what a caller needs of the round, whatever the plan chose."""
from __future__ import annotations

from conjugate.plan.schema import Plan, validate_plan
from conjugate.roles import Model

TOKENS_ONLY = "lm_head+argmax"  # the fusion whose lm_head writes tokens and no logits


def keeping_logits(plan: Plan) -> Plan:
    """The plan with `lm_head+argmax` off for both models and the draft's steps as launches (a step
    launch takes its argmax in the kernel), so that both write their logits (sampling reads them);
    the plan itself where neither applies."""
    data = plan.to_dict()
    if not any(TOKENS_ONLY in data[m.value]["fusions"] for m in Model) and data[Model.DRAFT.value]["form"] != "step":
        return plan
    for model in Model:
        data[model.value]["fusions"] = [f for f in data[model.value]["fusions"] if f != TOKENS_ONLY]
    data[Model.DRAFT.value]["form"] = "launches"
    return validate_plan(data, plan.source or None)
