"""The baselines every plan is compared with, measured on the GPU in the evaluating process:

- `conventional`: each model compiled on its own with torch.compile, each phase captured in a CUDA
  graph, the draft phase then the verify phase;
- `streams`: the same two graphs replayed concurrently on two streams;
- `sequential`: this project's kernels, one model after the other (plans/sequential.json).

Each is checked against the reference before it is timed. The evaluation session keeps them for
its workload; a caller asks for them again with `refresh_baselines`.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

import torch

from conjugate.compiler.round import compile_round
from conjugate.evaluate.conventional import ConventionalRound
from conjugate.evaluate.correctness import CheckReport
from conjugate.evaluate.profile import EvaluatorProfile, TimingSettings
from conjugate.evaluate.result import Baseline
from conjugate.evaluate.rounds import checked_run
from conjugate.evaluate.session import RoundSetup
from conjugate.evaluate.timing import time_round
from conjugate.paths import shipped_plan
from conjugate.plan import load_plan


def measure_baselines(setup: RoundSetup, profile: EvaluatorProfile, cache_dir: Path | None) -> dict[str, Baseline]:
    """name -> Baseline for the profile's baselines, each checked, then timed."""
    wanted, out = profile.timing.baselines, {}
    if {"conventional", "streams"} & set(wanted):
        out |= _conventional(setup, profile.timing)
        torch.cuda.empty_cache()  # the baseline's compiled models and graphs are gone with it
    if "sequential" in wanted:
        out["sequential"] = _sequential(setup, profile.timing, cache_dir)
        torch.cuda.empty_cache()
    return out


def _timed(run, load_fresh, check: CheckReport, timing: TimingSettings) -> Baseline:
    if not check.ok:
        return Baseline("incorrect", error="; ".join(check.problems[:5]))
    measured = time_round(run, load_fresh, timing.replays, timing.warmup)
    return Baseline("ok", measured.median_ms, measured.p20_ms, measured.p80_ms)


def _conventional(setup: RoundSetup, timing: TimingSettings) -> dict[str, Baseline]:
    draft, target = (prepared.weights for prepared in setup.weights)
    rnd = ConventionalRound(draft, target, setup.inputs)
    rnd.capture()  # compiles both models, then captures each phase on its own side stream
    out = {}
    for name, run in (("conventional", rnd.run), ("streams", rnd.run_streams)):
        if name in timing.baselines:
            rnd.load(setup.inputs)
            run()
            torch.cuda.synchronize()
            out[name] = _timed(run, partial(rnd.load, setup.timing_inputs), setup.check(rnd.outputs()), timing)
    return out


def _sequential(setup: RoundSetup, timing: TimingSettings, cache_dir: Path | None) -> Baseline:
    compiled = compile_round(load_plan(shipped_plan("sequential")), setup.workload, *setup.weights,
                             cache_dir=cache_dir)
    compiled.prepare()
    check = checked_run(compiled, setup.inputs, setup.check, graph=True)
    return _timed(compiled.run, partial(compiled.load, setup.timing_inputs), check, timing)
