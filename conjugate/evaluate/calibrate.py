"""Fit the analytical evaluator's constants to recorded GPU measurements.

A case is one measured round: a plan on a workload with its median latency. Each plan is lowered
on shape-only weights (programs per part), so fitting needs no GPU. The fit is a coordinate
descent on the mean squared log ratio of modeled to measured latency over the bandwidth
efficiencies, the launch overhead, the co-location penalty and the stream overlap.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import networkx as nx

from conjugate.compiler.round import compile_round
from conjugate.evaluate.analytical import AnalyticalModel, launch_programs, model_round
from conjugate.evaluate.evaluators import ModelConstants, ProfileError
from conjugate.files import is_file_name, read_json, shown
from conjugate.graph import build_graph
from conjugate.models.weights import meta_weights
from conjugate.plan import Schedule, expand
from conjugate.plan.schema import Plan
from conjugate.workload import Workload

_BOUNDS = {"gemm": (0.05, 1.0), "attn": (0.05, 1.0), "elementwise": (0.01, 1.0), "launch_overhead_us": (0.0, 20.0),
           "colocation_penalty": (0.0, 1.0), "streams_overlap": (0.0, 1.0)}


@dataclass(frozen=True)
class Case:
    name: str
    graph: nx.DiGraph
    schedule: Schedule
    programs: list[list[int]]
    measured_ms: float


def measured_rounds(source: Path) -> list[tuple[str, str, float]]:
    """(workload, plan, median ms) of every measured round of a compiler_rounds result file; a file
    of another shape, or a latency that is not a positive number, raises ProfileError naming it."""
    measured = read_json(source, ProfileError, "measured-rounds file")
    try:
        rows = [(w["workload"], p["plan"], p["median_ms"]) for w in measured["workloads"] for p in w["plans"]
                if "median_ms" in p]
    except (KeyError, TypeError) as e:
        raise ProfileError(f"{source}: not a measured-rounds file (workloads[].plans[].median_ms): {e}") from e
    for workload, plan, ms in rows:
        if not (is_file_name(workload) and is_file_name(plan)):  # read as examples/<workload>.toml, plans/<plan>.json
            raise ProfileError(f"{source}: fields 'workload' and 'plan' should be names (no path), got "
                               f"{shown(workload)} and {shown(plan)}")
        if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not 0 < ms < math.inf:
            raise ProfileError(f"{source}: field 'median_ms' of {shown(plan)} on {shown(workload)} should be "
                               f"a positive number of milliseconds, got {shown(ms)}")
    if not rows:
        raise ProfileError(f"{source}: no measured round to fit to")
    return rows


def make_case(plan: Plan, workload: Workload, measured_ms: float, cache_dir: Path) -> Case:
    graph = build_graph(workload)
    schedule = expand(plan, workload, graph)
    compiled = compile_round(plan, workload, meta_weights(workload.draft, workload.torch_dtype),
                             meta_weights(workload.target, workload.torch_dtype), cache_dir=cache_dir,
                             schedule=schedule, graph=graph)
    return Case(f"{workload.name}/{plan.name}", graph, schedule, launch_programs(compiled), measured_ms)


def _with(constants: ModelConstants, key: str, value: float) -> ModelConstants:
    if key in constants.efficiency:
        return replace(constants, efficiency=constants.efficiency | {key: value})
    return replace(constants, **{key: value})


def _get(constants: ModelConstants, key: str) -> float:
    return constants.efficiency[key] if key in constants.efficiency else getattr(constants, key)


def loss(constants: ModelConstants, cases: list[Case]) -> float:
    model = AnalyticalModel(constants)
    return sum(math.log(model_round(model, c.graph, c.schedule, c.programs)[0] / c.measured_ms) ** 2
               for c in cases) / len(cases)


def fit(constants: ModelConstants, cases: list[Case], rounds: int = 6) -> ModelConstants:
    """Coordinate descent: each constant in turn moves to the best of a few multiplicative steps."""
    best = loss(constants, cases)
    for step in (0.5, 0.25, 0.1, 0.05, 0.02, 0.01)[:rounds]:
        for key, (low, high) in _BOUNDS.items():
            current = _get(constants, key)
            for candidate in (current * (1 - step), current * (1 + step), current + step * (high - low) / 10,
                              current - step * (high - low) / 10):
                candidate = min(high, max(low, candidate))
                trial = _with(constants, key, candidate)
                trial_loss = loss(trial, cases)
                if trial_loss < best:
                    constants, best = trial, trial_loss
    return constants


def profile_text(constants: ModelConstants, source: str, fitted_loss: float, max_params: int) -> str:
    """An evaluator profile (TOML) holding fitted constants."""
    c = constants
    return f'''# The analytical evaluator: scores plans where no GPU is, with a roofline model per launch.
# Every result it gives is marked modeled, not measured.
# Constants fitted by `conjugate calibrate` to {source}
# (mean squared log error of modeled against measured round latency: {fitted_loss:.4f}).
name = "analytical"
kind = "analytical"
description = "Roofline per launch with wave quantization and a co-location term; constants fitted to the H200."
time_limit_s = 600

[correctness]
# Run the compiled round against the reference under the Triton interpreter when both models
# together have at most this many parameters (the tiny test models); larger ones are not checked.
max_params = {max_params}

[model]
gpu = "{c.gpu}"
bandwidth_gbs = {c.bandwidth_gbs:g}
matmul_tflops = {c.matmul_tflops:g}
sms = {c.sms}
programs_per_sm = {c.programs_per_sm}
launch_overhead_us = {c.launch_overhead_us:.3f}
colocation_penalty = {c.colocation_penalty:.3f}
streams_overlap = {c.streams_overlap:.3f}

# Fraction of the copy bandwidth an op family reaches alone at full occupancy.
[model.efficiency]
gemm = {c.efficiency["gemm"]:.3f}
attn = {c.efficiency["attn"]:.3f}
elementwise = {c.efficiency["elementwise"]:.3f}
# not fitted (no step rounds among them): kept as given, from benchmarks/results/draft_step_h100.json
step = {c.efficiency["step"]:.3f}
'''


def ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    result = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            result[order[k]] = (i + j) / 2  # ties share their mean rank
        i = j + 1
    return result


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation (ties share their mean rank); nan when either side is constant
    or there are no values."""
    if not a:
        return float("nan")
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    var = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return cov / var if var else float("nan")
