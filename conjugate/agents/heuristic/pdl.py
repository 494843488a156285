"""PDL edits: per model, its launches as programmatic dependent launches (each starts while the
kernel before it ends), released at the end of each program's work or right after its wait, moved,
or off.

The draft's chain first, released at the end first (facts: pdl_draft), and the model whose stream
the ledger says is busier (the critical path) ahead of the other. The start won where the draft's
stream was much busier than the target's and lost where the two were balanced: past the `sms_wide`
ratio the critical model's release at the start comes first, within `sms_balanced` it comes after
the end's. A model holding fused norms (NORM_FUSIONS) is released at the end first whatever the
balance, and moved from the start to the end first (facts: pdl_with_norm_fusions).
"""
from __future__ import annotations

from conjugate.agents.facts import figure, sentence
from conjugate.agents.heuristic.candidate import Candidate, imbalance
from conjugate.agents.heuristic.fusions import NORM_FUSIONS
from conjugate.evaluate.result import LedgerSummary
from conjugate.plan.schema import MODEL_KEYS, Plan
from conjugate.roles import Model

_HOW = {"end": "once its tiles are done", "start": "right after its wait"}


def pdl_edits(plan: Plan, ledger: LedgerSummary | None = None) -> list[Candidate]:
    balanced, wide = figure("sms_balanced"), figure("sms_wide")
    shape = imbalance(ledger)
    critical = shape[0] if shape is not None else Model.DRAFT.value
    ratio = shape[2] if shape is not None else (balanced + wide) / 2  # no ledger: the start as it was
    start_lift = 0.25 if ratio >= wide else -0.1 if ratio < balanced else 0.0
    out = []
    for model in MODEL_KEYS:
        fused = any(f in NORM_FUSIONS for f in plan[model]["fusions"])
        lift = 0.1 if model == critical else 0.0
        base = 0.35 if model == Model.DRAFT.value else 0.2
        now = trigger(plan, model)
        if now == "none":
            start = base + (-0.1 if fused else start_lift if model == critical else 0.0)
            out += [_set(model, "end", base + 0.1 + lift), _set(model, "start", start + lift)]
            continue
        other = "start" if now == "end" else "end"
        to_end = fused and other == "end"
        out.append(_set(model, other, (0.45 if to_end else 0.15 if fused else 0.25) + lift,
                        f" ({sentence('pdl_with_norm_fusions')})" if to_end else ""))
        out.append(Candidate("pdl", _patch(model, "none"),
                             f"{model} launches start only once the kernel before them has ended", 0.2))
    return out


def trigger(plan: Plan, model: str) -> str:
    return plan[model]["pdl"]


def _patch(model: str, value: str) -> list[dict]:
    return [{"op": "replace", "path": f"/{model}/pdl", "value": value}]


def _set(model: str, value: str, score: float, why: str = "") -> Candidate:
    return Candidate("pdl", _patch(model, value),
                     f"{model} launches as programmatic dependent launches: each starts while the kernel before "
                     f"it ends and lets the next one start {_HOW[value]}{why}", score)
