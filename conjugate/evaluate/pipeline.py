"""The evaluation pipeline: validate -> compile -> correctness -> timing, stopping at the first
failure. `evaluate` never raises: whatever goes wrong ends up in the EvalResult.

With a `gpu` profile everything is measured in this process (see gpu_session.py): the round is
checked against the reference eagerly and replayed from its CUDA graph, timed on fresh random
inputs, compared with the baselines (measured once per workload, baselines.py) and the floor, and
each multi-part launch gets a measured verdict.

With an `analytical` profile timing is the roofline model's: the result says `modeled`.
Correctness runs the compiled round against the reference (under the Triton interpreter where no
GPU is) for models up to the profile's `max_params`; larger rounds are compiled on shape-only
weights, so their lowering and kernel generation are still checked, and the result says the
numerical check was skipped.
"""
from __future__ import annotations

import re
import time
import traceback
from functools import partial
from pathlib import Path
from typing import Any, Callable

import torch

from conjugate.compiler.round import compile_round
from conjugate.errors import CompileError, PlanError, ScheduleError
from conjugate.evaluate.analytical import AnalyticalModel, model_round
from conjugate.evaluate.correctness import check_round
from conjugate.evaluate.profile import EvaluatorProfile
from conjugate.evaluate.result import EvalResult
from conjugate.graph import build_graph, graph_totals
from conjugate.models import make_round_inputs
from conjugate.models.weights import meta_weights
from conjugate.plan import Plan, expand, load_plan, validate_plan
from conjugate.workload import REPO_ROOT, Workload


class _Stop(Exception):
    """A stage failed; carries the result to return."""

    def __init__(self, result: EvalResult):
        self.result = result


def evaluate(plan: Plan | dict, workload: Workload, profile: EvaluatorProfile, cache_dir: Path | None = None,
             on_stage: Callable[[str], None] | None = None, refresh_baselines: bool = False) -> EvalResult:
    """Score one plan on one workload. Never raises. `on_stage` hears each stage as it starts."""
    runner = _GpuRun if profile.kind == "gpu" else _Run
    run = runner(workload, profile, cache_dir, on_stage or (lambda stage: None))
    run.refresh_baselines = refresh_baselines
    try:
        return run.all(plan)
    except _Stop as stop:
        return stop.result
    except Exception as e:  # a bug or an unforeseen failure: still data, with where it happened
        last = traceback.format_exception_only(type(e), e)[-1].strip()
        return run.result("error", error=f"{last} (in {traceback.extract_tb(e.__traceback__)[-1].name})")


class _Run:
    def __init__(self, workload: Workload, profile: EvaluatorProfile, cache_dir: Path | None,
                 on_stage: Callable[[str], None]):
        self.workload, self.profile, self.cache_dir, self.on_stage = workload, profile, cache_dir, on_stage
        self.start = time.perf_counter()
        self.plan_hash = ""
        self.enter("validate")

    def enter(self, stage: str) -> None:
        self.stage = stage
        self.on_stage(stage)

    def result(self, status: str, **fields: Any) -> EvalResult:
        return EvalResult(plan_hash=self.plan_hash, workload=self.workload.name, evaluator=self.profile.name,
                          stage=self.stage, status=status, modeled=self.profile.kind != "gpu",
                          wall_s=round(time.perf_counter() - self.start, 3), **fields)

    def validated(self, raw: Plan | dict, graph) -> tuple[Plan, Any]:
        try:
            plan = raw if isinstance(raw, Plan) else validate_plan(raw, "plan")
            self.plan_hash = plan.hash
            return plan, expand(plan, self.workload, graph)
        except (PlanError, ScheduleError) as e:
            raise _Stop(self.result("invalid", error=str(e), feedback=[{"errors": getattr(e, "errors", [str(e)])}]))

    def all(self, raw: Plan | dict) -> EvalResult:
        w = self.workload
        graph = build_graph(w)
        plan, schedule = self.validated(raw, graph)
        self.enter("compile")
        checked = w.draft.num_params() + w.target.num_params() <= self.profile.max_check_params
        weights = self._real_weights() if checked else (meta_weights(w.draft, w.torch_dtype),
                                                        meta_weights(w.target, w.torch_dtype))
        try:
            compiled = compile_round(plan, w, weights[0], weights[1], cache_dir=self.cache_dir, schedule=schedule)
        except CompileError as e:
            raise _Stop(self.result("compile_error", error=str(e), feedback=[e.to_dict()]))
        artifacts = {"kernels": str(compiled.source_dir)}
        self.enter("correctness")
        checks = self._check(compiled, weights) if checked else {
            "skipped": f"{w.draft.num_params() + w.target.num_params():.3g} parameters: over the interpreter's "
                       f"limit of {self.profile.max_check_params:.3g} in {self.profile.source}"}
        if not checks.get("ok", True):
            raise _Stop(self.result("incorrect", checks=checks, artifacts=artifacts, error="; ".join(checks["problems"])))
        self.enter("timing")
        return self.result("ok", metrics=self._timing(graph, schedule, compiled), checks=checks,
                           verdicts=self._verdicts, feedback=compiled.feedback(), artifacts=artifacts)

    def _real_weights(self):
        device = "cuda" if torch.cuda.is_available() else "cpu"  # kernels need GPU tensors where a GPU is
        return self.workload.weights("draft", device), self.workload.weights("target", device)

    def _check(self, compiled, weights) -> dict:
        w = self.workload
        inputs = make_round_inputs(weights[0], weights[1], k=w.k, draft_batch=w.draft_batch,
                                   target_batch=w.target_batch, context=w.context, seed=w.seed, kv_init=w.kv_init)
        compiled.load(inputs)
        compiled.bufs.poison()
        compiled.run()
        return check_round(weights[0], weights[1], inputs, compiled.outputs(), w.dtype).to_dict()

    def _timing(self, graph, schedule, compiled) -> dict:
        model = AnalyticalModel(self.profile.model)
        latency_ms, estimates = model_round(model, graph, schedule, _programs(compiled))
        self._verdicts = [{**e.verdict(), "ops": [p.label for p in launch.parts],
                           "programs": [p.programs for p in launch.parts]}
                          for e, launch in zip(estimates, compiled.launches) if len(e.alone_us) > 1]
        nbytes = graph_totals(graph)["bytes"]
        floor_ms = nbytes / (self.profile.model.bandwidth_gbs * 1e9) * 1e3
        baselines = self._modeled_baselines(model, graph)
        return {"latency_ms": latency_ms, "floor_ms": floor_ms, "floor_ratio": latency_ms / floor_ms,
                "bandwidth_gbs": nbytes / (latency_ms * 1e-3) / 1e9, "launches": len(schedule.launches),
                "gpu": self.profile.model.gpu, "baselines": baselines,
                "speedups": {n: b["latency_ms"] / latency_ms for n, b in baselines.items()}}

    def _modeled_baselines(self, model: AnalyticalModel, graph) -> dict[str, dict]:
        """The sequential and streams plans, modeled the same way (conventional needs a GPU)."""
        key = repr((self.workload.to_dict(), self.profile.to_dict()))
        if key not in _MODELED_BASELINES:
            w, out = self.workload, {}
            for name in ("sequential", "streams"):
                plan = load_plan(REPO_ROOT / "plans" / f"{name}.json")
                compiled = compile_round(plan, w, meta_weights(w.draft, w.torch_dtype),
                                         meta_weights(w.target, w.torch_dtype), cache_dir=self.cache_dir)
                ms, _ = model_round(model, graph, compiled.schedule, _programs(compiled))
                out[name] = {"status": "ok", "latency_ms": ms, "modeled": True}
            _MODELED_BASELINES.clear()
            _MODELED_BASELINES[key] = out
        return _MODELED_BASELINES[key]


def _names_device(wanted: str, device: str) -> bool:
    """Whether a profile's `device` ("H200"; "" for any) names this GPU ("NVIDIA H200"): whole words
    only, so "H20" is not an H200."""
    if not wanted:
        return True
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(wanted)}(?![A-Za-z0-9])", device, re.IGNORECASE) is not None


_MODELED_BASELINES: dict[str, dict] = {}  # one workload's modeled baselines, per process


def _programs(compiled) -> list[list[int]]:
    return [[p.programs for p in launch.parts] for launch in compiled.launches]


class _GpuRun(_Run):
    """Every stage measured on this process's GPU."""

    def all(self, raw: Plan | dict) -> EvalResult:
        from conjugate.evaluate.baselines import measure_baselines
        from conjugate.evaluate.gpu_session import session_for
        from conjugate.evaluate.measured import checked_run, launch_verdicts, time_round

        if not torch.cuda.is_available():
            raise _Stop(self.result("error", error=f"evaluator {self.profile.name!r} measures on a GPU and this "
                                                   "machine has no CUDA device; use --evaluator analytical"))
        device = torch.cuda.get_device_name()
        if not _names_device(self.profile.device, device):
            raise _Stop(self.result("error", error=f"{self.profile.source}: field 'device' is {self.profile.device!r} "
                                                   f"and this GPU is {device!r}: measure with a profile for it "
                                                   "(a copy of this one with its own name and device)"))
        session = session_for(self.workload, self.profile, self.cache_dir)
        plan, schedule = self.validated(raw, session.graph)
        self.enter("compile")
        try:
            compiled = compile_round(plan, self.workload, *session.prepared, cache_dir=self.cache_dir, schedule=schedule)
            compiled.load(session.inputs)
            compiled.warmup()  # every kernel compiled (resources recorded) before anything is checked
        except CompileError as e:
            raise _Stop(self.result("compile_error", error=str(e), feedback=[e.to_dict()]))
        artifacts, feedback = {"kernels": str(compiled.source_dir)}, compiled.feedback()
        self.enter("correctness")
        checks = {"eager": checked_run(compiled, session, graph=False)}
        if checks["eager"]["ok"]:
            compiled.prepare()  # the whole round in one CUDA graph when the plan says capture: graph
            checks["replayed"] = checked_run(compiled, session, graph=True)
        checks["ok"] = all(c["ok"] for c in checks.values())
        if not checks["ok"]:
            problems = [p for c in checks.values() if isinstance(c, dict) for p in c["problems"]]
            raise _Stop(self.result("incorrect", checks=checks, artifacts=artifacts, feedback=feedback,
                                    error="; ".join(problems[:5])))
        self.enter("timing")
        t = self.profile.timing
        timing = time_round(compiled.run, partial(compiled.load, session.timing_inputs), t.replays, t.warmup)
        verdicts = launch_verdicts(compiled, t.verdict_calls)
        del compiled  # its buffers and graph, before the baselines need the memory
        try:
            baselines = measure_baselines(session, self.refresh_baselines)
        except Exception as e:  # the plan's own measurement stands; the speedups say what is missing
            last = traceback.format_exception_only(type(e), e)[-1].strip()
            baselines = {name: {"status": "error", "error": last} for name in self.profile.timing.baselines}
            session.baselines = baselines  # not retried for every plan: --remeasure asks again
        return self.result("ok", metrics=_measured_metrics(timing, session, baselines, len(schedule.launches)),
                           checks=checks, verdicts=verdicts, feedback=feedback, artifacts=artifacts)


def _measured_metrics(timing, session, baselines: dict[str, dict], launches: int) -> dict:
    floor = session.floor()
    latency = timing.median_ms
    return {"latency_ms": latency, "p20_ms": timing.p20_ms, "p80_ms": timing.p80_ms, "replays": timing.replays,
            **floor, "floor_ratio": latency / floor["floor_ms"],
            "bandwidth_gbs": floor["bytes"] / (latency * 1e-3) / 1e9, "launches": launches, "gpu": session.gpu,
            "baselines": {name: {k: b[k] for k in ("status", "latency_ms", "p20_ms", "p80_ms", "error") if k in b}
                          for name, b in baselines.items()},
            "speedups": {name: b["latency_ms"] / latency for name, b in baselines.items() if b.get("latency_ms")}}
