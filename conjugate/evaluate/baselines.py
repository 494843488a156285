"""The baselines every plan is compared with, measured on the GPU in the evaluating process:

- `conventional`: each model compiled on its own with torch.compile, each phase captured in a CUDA
  graph, the draft phase then the verify phase;
- `streams`: the same two graphs replayed concurrently on two streams;
- `sequential`: this project's kernels, one model after the other (plans/sequential.json).

Each is checked against the reference before it is timed. A session measures them once; a caller
asks for them again with `refresh`.
"""
from __future__ import annotations

import time
from functools import partial

import torch

from conjugate.compiler.round import compile_round
from conjugate.evaluate.conventional import ConventionalRound
from conjugate.evaluate.gpu_session import GpuSession
from conjugate.evaluate.measured import checked_run, time_round
from conjugate.plan import load_plan
from conjugate.workload import REPO_ROOT

SEQUENTIAL_PLAN = REPO_ROOT / "plans" / "sequential.json"


def measure_baselines(session: GpuSession, refresh: bool = False) -> dict[str, dict]:
    """name -> {latency_ms, p20_ms, p80_ms, replays, correct, ...} for the profile's baselines."""
    wanted = session.profile.timing.baselines
    if refresh or not set(wanted) <= set(session.baselines):
        session.baselines = {}
        if {"conventional", "streams"} & set(wanted):
            session.baselines |= _conventional(session, wanted)
            torch.cuda.empty_cache()  # the baseline's compiled models and graphs are gone with it
        if "sequential" in wanted:
            session.baselines["sequential"] = _sequential(session)
            torch.cuda.empty_cache()
    return {name: session.baselines[name] for name in wanted}


def _timed(session: GpuSession, run, load_fresh, check: dict, started: float) -> dict:
    if not check["ok"]:
        return {"status": "incorrect", "check": check, "error": "; ".join(check["problems"][:5])}
    t = session.profile.timing
    timing = time_round(run, load_fresh, t.replays, t.warmup)
    return {"status": "ok", "latency_ms": timing.median_ms, **timing.to_dict(), "check": check,
            "wall_s": round(time.perf_counter() - started, 1)}


def _conventional(session: GpuSession, wanted) -> dict[str, dict]:
    started = time.perf_counter()
    rnd = ConventionalRound(session.draft, session.target, session.inputs)
    rnd.capture()  # compiles both models, then captures each phase on its own side stream
    out = {}
    for name, run in (("conventional", rnd.run), ("streams", rnd.run_streams)):
        if name in wanted:
            rnd.load(session.inputs)
            run()
            torch.cuda.synchronize()
            check = session.check(rnd.outputs()).to_dict()
            out[name] = _timed(session, run, partial(rnd.load, session.timing_inputs), check, started)
    return out


def _sequential(session: GpuSession) -> dict:
    started = time.perf_counter()
    compiled = compile_round(load_plan(SEQUENTIAL_PLAN), session.workload, *session.prepared,
                             cache_dir=session.cache_dir)
    compiled.prepare()
    check = checked_run(compiled, session, graph=True)
    return _timed(session, compiled.run, partial(compiled.load, session.timing_inputs), check, started)
