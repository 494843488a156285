"""Form edits: the draft's k decode steps as one persistent step launch (`/draft/form: step`), or
back to one launch per op.

The step launch runs the draft's whole dependent chain in one kernel, so it pays where the draft's
launches are the critical path: it is proposed first where a two-stream ledger says the draft's
stream is the busier one, and behind the other knobs' first edits otherwise. It needs the sequential alignment (no target launch
can share it), so the edit also sets that and drops pins of draft ops into target launches. The
kernel runs batches of up to BATCH_PAD sequences; fp16 drafts are left to the launches (it is bf16
on the GPU).
"""
from __future__ import annotations

from conjugate.agents.facts import sentence
from conjugate.agents.heuristic.candidate import Candidate, imbalance
from conjugate.evaluate.result import LedgerSummary
from conjugate.kernels.step.columns import BATCH_PAD
from conjugate.plan.schema import Plan
from conjugate.roles import Model

DRAFT = Model.DRAFT.value


def form_edits(plan: Plan, workload: dict | None, ledger: LedgerSummary | None = None) -> list[Candidate]:
    if plan[DRAFT]["form"] == "step":
        return [Candidate("form", [{"op": "replace", "path": f"/{DRAFT}/form", "value": "launches"}],
                          "the draft's steps as one launch per op again", 0.15)]
    if workload is not None and (workload.get("draft_batch", 1) > BATCH_PAD or workload.get("dtype") == "fp16"):
        return []
    shape = imbalance(ledger)
    critical = shape is not None and shape[0] == DRAFT
    patch = [{"op": "replace", "path": f"/{DRAFT}/form", "value": "step"}]
    if plan["cross"]["alignment"] != "sequential":
        patch.append({"op": "replace", "path": "/cross/alignment", "value": "sequential"})
    pins = [n for n, o in enumerate(plan["cross"]["overrides"]) if "with" in o]
    patch += [{"op": "remove", "path": f"/cross/overrides/{n}"} for n in reversed(pins)]
    score = 0.55 if critical else 0.3
    return [Candidate("form", patch, f"the draft's k steps as one persistent launch ({sentence('form_step')})",
                      score)]
