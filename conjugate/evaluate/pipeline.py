"""The evaluation pipeline: build (validate, expand, compile) -> check -> time, stopping at the
first failure. `evaluate` never raises: whatever goes wrong ends up in the EvalResult.

The stages are the same for both kinds of evaluator; a Harness (harness.py) says how the round is
prepared, checked and timed: measured on this GPU (measured.py, profile kind `gpu`) or modeled
by the analytical cost model (modeled.py, kind `analytical`). An EvaluationSession keeps what
later evaluations of the same workload reuse: the prepared round, the baselines, device rates.
"""
from __future__ import annotations

import time
import traceback
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Callable

from conjugate.compiler.feedback import CompileError
from conjugate.compiler.round import CompiledRound, compile_round
from conjugate.errors import PlanError, ScheduleError
from conjugate.evaluate.correctness import REFERENCE_DAMAGED
from conjugate.evaluate.harness import Harness
from conjugate.evaluate.measured import MeasuredHarness
from conjugate.evaluate.modeled import ModeledHarness
from conjugate.evaluate.evaluators import EvaluatorProfile
from conjugate.evaluate.result import Baseline, EvalResult, Stage, Status
from conjugate.evaluate.session import EvaluationSession, RoundSetup
from conjugate.plan import Plan, expand, validate_plan
from conjugate.plan.schema import MODEL_KEYS
from conjugate.workload import Workload


def evaluate(plan: Plan | dict, workload: Workload, profile: EvaluatorProfile, cache_dir: Path | None = None,
             on_stage: Callable[[str], None] | None = None, refresh_baselines: bool = False,
             session: EvaluationSession | None = None, carried_baselines: dict | None = None) -> EvalResult:
    """Score one plan on one workload. Never raises. `on_stage` hears each stage as it starts;
    `session` keeps what later evaluations reuse (a fresh one when not given); `carried_baselines`,
    what an earlier process of a resumed search measured (baselines.carried_baselines), is taken
    where it stands instead of measuring those baselines again (not with `refresh_baselines`)."""
    run = _Run(workload, profile, cache_dir, on_stage or (lambda stage: None))
    session = session or EvaluationSession()
    try:
        return _stages(plan, run, harness_for(profile, cache_dir, session), session, refresh_baselines,
                       carried_baselines)
    except Exception as e:  # a bug or an unforeseen failure: still data, with where it happened
        last = traceback.format_exception_only(type(e), e)[-1].strip()
        return run.result(Status.ERROR, error=f"{last} (in {traceback.extract_tb(e.__traceback__)[-1].name})")


def harness_for(profile: EvaluatorProfile, cache_dir: Path | None, session: EvaluationSession) -> Harness:
    kind = MeasuredHarness if profile.kind == "gpu" else ModeledHarness
    return kind(profile, cache_dir, session)


def _stages(raw: Plan | dict, run: "_Run", harness: Harness, session: EvaluationSession, refresh: bool,
            carried: dict | None = None) -> EvalResult:
    refused = harness.unavailable()
    if refused:
        return run.result(Status.ERROR, error=refused)
    kind, key = run.profile.kind, _setup_key(run.workload, run.profile)
    with run.step("setup"):
        setup = session.setup(kind, key, partial(harness.prepare, run.workload))
    # Baselines first (once per workload): running them slows later rounds on the GPU by up to 4%
    # for the rest of the process (lab/experiments/steadiness.py), so every plan is timed after them.
    with run.step("baselines"):
        baselines = session.baselines(kind, harness.baselines_wanted, refresh,
                                      partial(_baselines, harness, setup, None if refresh else carried))
    run.enter(Stage.VALIDATE)
    compiled = build(raw, setup, harness, run)
    if isinstance(compiled, EvalResult):
        return compiled
    checks = check(compiled, setup, harness, run)
    if isinstance(checks, EvalResult):
        return checks
    run.enter(Stage.TIMING)
    timed = harness.time(compiled, setup)
    run.seconds |= timed.seconds
    return run.result(Status.OK, metrics=harness.metrics(timed, setup, baselines), checks=checks,
                      verdicts=timed.verdicts)


def _baselines(harness: Harness, setup: RoundSetup, carried: dict | None = None) -> dict[str, Baseline]:
    """The harness's baselines, those carried from an earlier process taken as they are; if measuring
    the rest fails, each an error: the plan's own measurement stands and its speedups say what is missing."""
    kept: dict[str, Baseline] = {}
    try:
        kept = harness.carried(carried, setup.workload) if carried else {}
        return kept | harness.baselines(setup, tuple(name for name in harness.baselines_wanted if name not in kept))
    except Exception as e:
        last = traceback.format_exception_only(type(e), e)[-1].strip()
        return kept | {name: Baseline("error", error=last) for name in harness.baselines_wanted if name not in kept}


def build(raw: Plan | dict, setup: RoundSetup, harness: Harness, run: "_Run") -> CompiledRound | EvalResult:
    """Validate and expand the plan, then compile it: the compiled round, or the result saying why not."""
    try:
        plan = raw if isinstance(raw, Plan) else validate_plan(raw, "plan")
        run.plan_hash = plan.hash
        schedule = expand(plan, setup.workload, setup.graph)
    except (PlanError, ScheduleError) as e:
        return run.result(Status.INVALID, error=str(e), plan_errors=tuple(getattr(e, "errors", [str(e)])))
    run.enter(Stage.COMPILE)
    try:
        with run.step("compile"):
            compiled = compile_round(plan, setup.workload, *setup.weights, cache_dir=run.cache_dir,
                                     schedule=schedule, graph=setup.graph)
        with run.step("warmup"):
            harness.ready(compiled, setup)
    except CompileError as e:
        return run.result(Status.COMPILE_ERROR, error=str(e), compile_failure=e.failure)
    run.compiled(compiled)
    return compiled


def check(compiled: CompiledRound, setup: RoundSetup, harness: Harness, run: "_Run") -> dict | EvalResult:
    """The correctness report, or the result of an incorrect round."""
    run.enter(Stage.CORRECTNESS)
    with run.step("check"):
        checks = harness.check(compiled, setup)
    if checks.get("ok", True):
        return checks
    reports = [c for c in checks.values() if isinstance(c, dict) and "problems" in c] or [checks]  # eager, replayed
    problems = [p for report in reports for p in report["problems"]]
    damaged = [p for p in problems if p.startswith(tuple(REFERENCE_DAMAGED.format(model=m) for m in MODEL_KEYS))]
    if damaged:  # the weights', not the plan's: every plan would fail alike, and no result is the plan's
        run.enter(Stage.SETUP)
        return run.result(Status.ERROR, checks=checks, error=damaged[0])
    return run.result(Status.INCORRECT, checks=checks, error="; ".join(problems[:5]))


def _setup_key(workload: Workload, profile: EvaluatorProfile) -> str:
    return repr((workload.to_dict(), {k: v for k, v in profile.to_dict().items() if k != "source"}))


class _Run:
    """One evaluation in progress: the stage reached and what is known so far, for its result."""

    def __init__(self, workload: Workload, profile: EvaluatorProfile, cache_dir: Path | None,
                 on_stage: Callable[[str], None]):
        self.workload, self.profile, self.cache_dir, self.on_stage = workload, profile, cache_dir, on_stage
        self.start = time.perf_counter()
        self.plan_hash, self.known = "", {}
        self.seconds: dict[str, float] = {}  # step -> seconds spent in it (result.STEPS)
        self.enter(Stage.SETUP)

    @contextmanager
    def step(self, name: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started

    def enter(self, stage: Stage) -> None:
        self.stage = stage
        self.on_stage(str(stage))

    def compiled(self, compiled: CompiledRound) -> None:
        self.known = {"feedback": tuple(compiled.feedback()), "artifacts": {"kernels": str(compiled.source_dir)}}

    def result(self, status: Status, **fields: Any) -> EvalResult:
        return EvalResult(plan_hash=self.plan_hash, workload=self.workload.name, evaluator=self.profile.name,
                          stage=self.stage, status=status, modeled=self.profile.kind != "gpu",
                          wall_s=round(time.perf_counter() - self.start, 3),
                          seconds={k: round(v, 3) for k, v in self.seconds.items()}, **self.known, **fields)
