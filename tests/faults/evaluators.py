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
