"""Evaluation entry points that fail on purpose, for the worker-isolation tests. The worker imports
them by name ("evaluators:hang_in_kernel") with this folder on its PYTHONPATH."""
from __future__ import annotations

import os

import conjugate  # noqa: F401  (selects the interpreter before triton is imported)
import torch
import triton
import triton.language as tl

from conjugate.evaluate.pipeline import evaluate


@triton.jit
def _spin(flag_ptr):
    """Waits for a flag nobody sets: a kernel that hangs."""
    while tl.load(flag_ptr) == 0:
        pass


def hang_in_kernel(plan, workload, profile, cache_dir=None, on_stage=None, **options):
    on_stage("validate")
    on_stage("compile")
    _spin[(1,)](torch.zeros(1, dtype=torch.int32))
    raise AssertionError("unreachable")


def crash_in_correctness(plan, workload, profile, cache_dir=None, on_stage=None, **options):
    for stage in ("validate", "compile", "correctness"):
        on_stage(stage)
    print("illegal memory access (simulated)", flush=True)  # goes to stderr, never into the protocol
    os.abort()


def chatty_then_evaluate(plan, workload, profile, cache_dir=None, on_stage=None, **options):
    for _ in range(2000):  # far more than a pipe buffer of stderr
        print("x" * 100, flush=True)
    return evaluate(plan, workload, profile, cache_dir, on_stage, **options)


def conventional_on_cpu(workload, profile, cache_dir):
    """baselines_apart's child, on the CPU: the conventional round built eagerly over the workload's
    seeded weights, checked against the reference and timed by the clock; its process id left in
    cache_dir/child.pid."""
    import time
    from pathlib import Path

    from conjugate.compiler.buffers import PreparedWeights
    from conjugate.evaluate.baselines.conventional import ConventionalRound, Variant
    from conjugate.evaluate.correctness import ReferenceChecker, tolerance_for
    from conjugate.evaluate.result import Baseline
    from conjugate.evaluate.rounds import round_inputs
    from conjugate.roles import Model

    Path(cache_dir, "child.pid").write_text(str(os.getpid()))
    draft, target = workload.weights(Model.DRAFT, "cpu"), workload.weights(Model.TARGET, "cpu")
    inputs = round_inputs(workload, draft, target)
    check = ReferenceChecker(draft, target, inputs, workload.dtype, tolerance_for(workload.dtype, profile.tolerances))
    eager = Variant.parse("eager-sdpa")
    rnd = ConventionalRound(workload, PreparedWeights(draft), PreparedWeights(target), eager, eager)
    rnd.load(inputs)
    started = time.perf_counter()
    rnd.run()
    ms = (time.perf_counter() - started) * 1e3
    report = check(rnd.outputs())
    status = "ok" if report.ok else "incorrect"
    chosen = {"draft": eager.name, "verify": eager.name}
    return {name: Baseline(status, ms, variants=chosen, error="; ".join(report.problems[:2]))
            for name in ("conventional", "streams")}


def apart_raises(workload, profile, cache_dir):
    raise RuntimeError("CUDA error: no kernel image is available (simulated)")


def apart_sleeps(workload, profile, cache_dir):
    import time
    from pathlib import Path

    Path(cache_dir, "child.pid").write_text(str(os.getpid()))
    time.sleep(60)


def incorrect_every_plan(plan, workload, profile, cache_dir=None, on_stage=None, **options):
    """Every plan evaluated, then reported wrong: a search in which no evaluation succeeds."""
    from dataclasses import replace

    from conjugate.evaluate.result import Stage, Status

    result = evaluate(plan, workload, profile, cache_dir, on_stage, **options)
    return replace(result, status=Status.INCORRECT, stage=Stage.CORRECTNESS, error="wrong on purpose", metrics=None)


def report_carried(plan, workload, profile, cache_dir=None, on_stage=None, **options):
    """No evaluation: the options the worker passed on, as the result's error text."""
    import json

    from conjugate.evaluate.result import EvalResult, Stage, Status

    return EvalResult("", workload.name, profile.name, Stage.SETUP, Status.INVALID, True,
                      error=json.dumps(sorted(options.items()), default=str))
