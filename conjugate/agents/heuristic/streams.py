"""Stream edits: one stream or two; with two, which model's stream the GPU serves first (priority)
and how many SMs the less busy model's stream may use (SM limit).

Priority: the stream the ledger says is busier (the round's critical path), else the draft's chain
of short kernels (facts: priority_draft). SM limit (facts: sms_target): none for streams within
`sms_balanced` of each other; 8-16 SMs fewer than the most that leave the other any when closer
than `sms_wide`, deeper limits first past it, scored by the imbalance. Once limited, 8 SMs fewer
while the limited stream is still the less busy one (ranked high while the other is `sms_go_on` as
busy), 8 more once it is the busier, or no limit. Without a ledger, the target limited at a low
score. Limits are proposed only where rounds are measured: a model of the GPU ignores them.
"""
from __future__ import annotations

from conjugate.agents.facts import figure
from conjugate.agents.heuristic.candidate import Candidate, imbalance
from conjugate.evaluate.result import LedgerSummary
from conjugate.plan.schema import MODEL_KEYS, SM_LIMIT_STEP, Plan
from conjugate.roles import Model


def streams_edits(plan: Plan, ledger: LedgerSummary | None = None) -> list[Candidate]:
    if plan["cross"]["streams"] == "two":
        one = Candidate("streams", [{"op": "replace", "path": "/cross/streams", "value": "one"}] + _stream_defaults(plan),
                        "streams two -> one: no cross-stream joins", 0.25)
        return [one] + priority_edits(plan, ledger)
    if plan["cross"]["alignment"] != "sequential" or any("with" in o for o in plan["cross"]["overrides"]):
        return []
    return [Candidate("streams", [{"op": "replace", "path": "/cross/streams", "value": "two"}],
                      "streams one -> two: the draft phase overlaps the verify pass", 0.45)]


def first_served(plan: Plan) -> str:
    """The model whose stream the GPU serves first, or "none"."""
    return next((m for m in MODEL_KEYS if plan[m]["stream"]["priority"] == "high"), "none")


def _stream_defaults(plan: Plan) -> list[dict]:
    """Operations taking back what only two streams allow: a stream served first, an SM limit."""
    return [{"op": "replace", "path": f"/{m}/stream/{key}", "value": default}
            for m in MODEL_KEYS for key, default in (("priority", "normal"), ("sms", 0))
            if plan[m]["stream"][key] != default]


def _serve_first(choice: str) -> list[dict]:
    return [{"op": "replace", "path": f"/{m}/stream/priority", "value": "high" if m == choice else "normal"}
            for m in MODEL_KEYS]


def priority_edits(plan: Plan, ledger: LedgerSummary | None) -> list[Candidate]:
    busy = ledger.streams if ledger is not None else {}
    first = max(MODEL_KEYS, key=lambda m: busy.get(m, 0.0)) if len(busy) > 1 else Model.DRAFT.value
    why = (f"its stream is busier ({busy[first]:.2f} ms against {min(busy.values()):.2f}): the critical path"
           if len(busy) > 1 else "its chain of short dependent kernels sets the round")
    now, out = first_served(plan), []
    for choice in (first, next(m for m in MODEL_KEYS if m != first), "none"):
        if choice != now:
            reason = f"served first {now} -> {choice}: " + (
                f"the GPU serves the {choice} stream first, {why}" if choice == first else
                "the GPU serves neither stream first" if choice == "none" else
                f"the GPU serves the {choice} stream first")
            out.append(Candidate("streams", _serve_first(choice), reason, 0.5 if choice == first else 0.3))
    return out


def sm_limit_edits(plan: Plan, sms: int, ledger: LedgerSummary | None = None) -> list[Candidate]:
    if plan["cross"]["streams"] != "two" or sms <= 2 * SM_LIMIT_STEP:
        return []
    limited = {m: plan[m]["stream"]["sms"] for m in MODEL_KEYS if plan[m]["stream"]["sms"]}
    if limited:
        (model, now), = limited.items()
        return _moved_limit(model, now, sms, imbalance(ledger))
    shape = imbalance(ledger)
    if shape is None:
        yielding, other, ratio = Model.TARGET.value, Model.DRAFT.value, None
    else:
        other, yielding, ratio = shape
        if ratio < figure("sms_balanced"):
            return []
    top = (sms - 1) // SM_LIMIT_STEP * SM_LIMIT_STEP  # the most SMs that still leave the other some alone
    steps = (1, 2) if ratio is None or ratio < figure("sms_wide") else (3, 4, 2)
    base = 0.3 if ratio is None else round(0.35 + min(0.3, ratio - 1.0), 2)
    out = []
    for rank, n in enumerate(n for n in (top - SM_LIMIT_STEP * i for i in steps) if n >= SM_LIMIT_STEP):
        why = (f"the {yielding}'s stream on {n} of {sms} SMs: the {other}'s kernels have {sms - n} to themselves "
               f"instead of queueing behind the {yielding}'s thread blocks"
               + (f" (its stream {ratio:.2f}x as busy)" if ratio is not None else ""))
        out.append(Candidate("streams", _limit(yielding, n), why, round(base - 0.05 * rank, 2)))
    return out


def _moved_limit(model: str, now: int, sms: int, shape: tuple[str, str, float] | None) -> list[Candidate]:
    """A limited stream: no limit, or one step fewer or more SMs, the step toward balance first."""
    out = [Candidate("streams", _limit(model, 0), f"the {model}'s stream on every SM again", 0.2)]
    ahead = None if shape is None else -SM_LIMIT_STEP if shape[0] != model else SM_LIMIT_STEP
    toward = 0.45 if shape is None or shape[2] < figure("sms_go_on") else 0.6
    for n in (now - SM_LIMIT_STEP, now + SM_LIMIT_STEP):
        if SM_LIMIT_STEP <= n < sms:
            score = 0.25 if ahead is None else toward if n - now == ahead else 0.15
            out.append(Candidate("streams", _limit(model, n), f"the {model}'s stream on {n} SMs (from {now})", score))
    return out


def _limit(model: str, n: int) -> list[dict]:
    return [{"op": "replace", "path": f"/{model}/stream/sms", "value": n}]
