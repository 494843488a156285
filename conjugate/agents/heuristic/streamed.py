"""Streamed edits: the target's residual GEMMs (o_proj, down) run by the streamed kernel
(`/target/streamed`, kernels/streamed.py), or back to the tile kernel.

The streamed kernel streams each 64-row weight tile with its whole K and adds it into the residual
stream once: the verify phase measured faster with it on every example (fact: streamed_h100), at up
to 128 activation rows a pass (the target verifies batch x (k + 1)); it is proposed there, for bf16
weights on the GPU, and applies where the op's launch holds it alone.
"""
from __future__ import annotations

from conjugate.agents.facts import figure
from conjugate.agents.heuristic.candidate import Candidate
from conjugate.compiler.streamed import KINDS
from conjugate.plan.schema import Plan
from conjugate.roles import Model

TARGET = Model.TARGET.value
MEASURED_ROWS = 128  # the most activation rows a pass its win was measured at (fact streamed_h100)


def streamed_edits(plan: Plan, workload: dict | None) -> list[Candidate]:
    chosen = list(plan[TARGET].get("streamed", []))
    if chosen:
        return [Candidate("streamed", [{"op": "replace", "path": f"/{TARGET}/streamed", "value": []}],
                          "the target's residual GEMMs by the tile kernel again", 0.15)]
    if workload is not None and (workload.get("target_batch", 1) * (workload.get("k", 1) + 1) > MEASURED_ROWS
                                 or workload.get("dtype") == "fp16"):
        return []
    gain = 1 - figure("streamed_h100")  # the verify phase's time saved, geometric mean of the examples
    return [Candidate("streamed", [{"op": "replace", "path": f"/{TARGET}/streamed", "value": sorted(KINDS)}],
                      f"the target's o_proj and down by the streamed kernel (its verify phase {gain:.0%} "
                      "faster on the examples)", 0.35)]
