"""Form edits: the draft's k decode steps as one persistent step launch (`/draft/form: step`), or
back to one launch per op.

The step launch runs the draft's whole dependent chain in one kernel: it beat the draft's launches alone
(facts: form_step, form_step_h200), and it lost beside a target stream, whose kernels wait for the SMs
it holds (facts: form_step_two_streams), and on 40-88 of the SMs too, where the target's traffic slows
its chain (level only for qwen3-0.6b on 64; facts: form_step_draft_sms_h100). So it is proposed for
one-stream plans only. It needs the sequential alignment (no target launch can share it), so the edit
also sets that and drops pins of draft ops into target launches. The kernel takes batches of up to
BATCH_PAD (32) sequences, checked on a GPU at 32 for every family
(`benchmarks/results/step_checks_h100.json`, `step_checks_h200.json`; the evaluator checks each plan
besides); fp16 drafts are left to the launches (it is bf16 on the GPU).
"""
from __future__ import annotations

from conjugate.agents.facts import sentence
from conjugate.agents.heuristic.candidate import Candidate
from conjugate.kernels.step.columns import BATCH_PAD
from conjugate.plan.schema import Plan
from conjugate.roles import Model

DRAFT = Model.DRAFT.value


def form_edits(plan: Plan, workload: dict | None) -> list[Candidate]:
    if plan[DRAFT]["form"] == "step":
        return [Candidate("form", [{"op": "replace", "path": f"/{DRAFT}/form", "value": "launches"}],
                          "the draft's steps as one launch per op again", 0.15)]
    if workload is not None and (workload.get("draft_batch", 1) > BATCH_PAD or workload.get("dtype") == "fp16"):
        return []
    if plan["cross"]["streams"] == "two":  # it holds every SM: the target's stream waits (facts: form_step_two_streams)
        return []
    patch = [{"op": "replace", "path": f"/{DRAFT}/form", "value": "step"}]
    if plan["cross"]["alignment"] != "sequential":
        patch.append({"op": "replace", "path": "/cross/alignment", "value": "sequential"})
    pins = [n for n, o in enumerate(plan["cross"]["overrides"]) if "with" in o]
    patch += [{"op": "remove", "path": f"/cross/overrides/{n}"} for n in reversed(pins)]
    score = 0.45
    return [Candidate("form", patch, f"the draft's k steps as one persistent launch ({sentence('form_step')})",
                      score)]
