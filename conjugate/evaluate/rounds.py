"""A workload's round inputs, and one checked run of a compiled round: the two steps every caller
that runs a round shares (`conjugate check`, both kinds of evaluator, the baselines, the benchmarks).

    inputs = round_inputs(workload, draft, target)               # the workload's seed
    report = checked_run(compiled, inputs, ReferenceChecker(draft, target, inputs, workload.dtype))
"""
from __future__ import annotations

from typing import Callable

import torch

from conjugate.compiler.round import CompiledRound
from conjugate.evaluate.correctness import CheckReport
from conjugate.models.reference import RoundInputs, RoundOutputs, make_round_inputs
from conjugate.models.weights import ModelWeights
from conjugate.workload import Workload

Check = Callable[[RoundOutputs], CheckReport]  # e.g. a ReferenceChecker


def round_inputs(workload: Workload, draft: ModelWeights, target: ModelWeights, seed: int | None = None) -> RoundInputs:
    """The workload's round inputs (its k, batches, context and KV initialisation) over these weights,
    drawn with `seed` (default: the workload's own)."""
    w = workload
    return make_round_inputs(draft, target, k=w.k, draft_batch=w.draft_batch, target_batch=w.target_batch,
                             context=w.context, seed=w.seed if seed is None else seed, kv_init=w.kv_init)


def checked_run(compiled: CompiledRound, inputs: RoundInputs, check: Check, graph: bool = False) -> CheckReport:
    """Load the inputs, poison the outputs, run the round once (replayed from its CUDA graph when
    `graph`, else kernel by kernel) and check what it wrote."""
    compiled.load(inputs)
    compiled.bufs.poison()
    compiled.run() if graph else compiled.run_eager()
    if compiled.device.type == "cuda":
        torch.cuda.synchronize()
    report = check(compiled.outputs())
    spins = compiled.spins_ran_out()
    if spins:  # the step launch's waits stopped waiting: whatever it wrote may have raced
        report.problems.append(f"the draft's step launch: {spins} waits ran out of spins")
        report.ok = False
    return report
