"""The measured evaluator: every stage on this process's GPU. The round is checked against the
reference eagerly and replayed from its CUDA graph, timed on fresh random inputs, compared with the
baselines (measured once per workload, baselines.py) and the floor, and each multi-part launch
gets a measured verdict.

A verdict compares one shared launch with the sum of its parts' solo launches, each timed in a CUDA
graph of `calls` back-to-back launches with the L2 cache flushed before each (its weights come from
memory, as in a round); `Verdict.judge` applies the one verdict rule. It also compares the shared
launch with its parts launched at once, each on a stream of its own (what two streams would make of
them, less the fork and join that a round pays once, not per launch, measured once per plan with
two one-element kernels): a shared launch may beat its parts back to back and still lose to them
overlapped. Launches built from the same
kernels with the same grids (the same op in every layer) are timed once and reported together.
"""
from __future__ import annotations

import re
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch

from conjugate.compiler.buffers import PreparedWeights
from conjugate.compiler.round import CompiledRound
from conjugate.evaluate.baselines.measure import carried_baselines, enter_torch_graph_state, measure_baselines
from conjugate.evaluate.correctness import ReferenceChecker, tolerance_for
from conjugate.evaluate.harness import Timed, speedups
from conjugate.evaluate.evaluators import EvaluatorProfile
from conjugate.evaluate.ledger import Ledger, LedgerError, kernel_records, step_shares
from conjugate.evaluate.result import Baseline, LedgerSummary, Metrics, Verdict
from conjugate.evaluate.rounds import checked_run, round_inputs
from conjugate.evaluate.session import EvaluationSession, RoundSetup
from conjugate.evaluate.timing import (concurrently, fork_join_us, l2_flush_bytes, median_known_within,
                                       time_per_call, time_round)
from conjugate.graph import build_graph, graph_totals
from conjugate.roles import Model
from conjugate.workload import Workload


class MeasuredHarness:
    modeled = False

    def __init__(self, profile: EvaluatorProfile, cache_dir: Path | None, session: EvaluationSession):
        self.profile, self.cache_dir, self.session = profile, cache_dir, session
        self.baselines_wanted = profile.timing.baselines

    def unavailable(self) -> str:
        p = self.profile
        if not torch.cuda.is_available():
            return (f"evaluator {p.name!r} measures on a GPU and this machine has no CUDA device; "
                    "use --evaluator analytical")
        device = torch.cuda.get_device_name()
        if not names_device(p.device, device):
            return (f"{p.source}: field 'device' is {p.device!r} and this GPU is {device!r}: measure with a "
                    "profile for it (a copy of this one with its own name and device)")
        return ""

    def prepare(self, workload: Workload) -> RoundSetup:
        w, device = workload, torch.device("cuda")
        draft, target = w.weights(Model.DRAFT, device), w.weights(Model.TARGET, device)
        inputs = round_inputs(w, draft, target)
        check = ReferenceChecker(draft, target, inputs, w.dtype, tolerance_for(w.dtype, self.profile.tolerances))
        return RoundSetup(w, build_graph(w), (PreparedWeights(draft), PreparedWeights(target)), inputs,
                          timing_inputs=round_inputs(w, draft, target, w.seed + 1), check=check)

    def ready(self, compiled: CompiledRound, setup: RoundSetup) -> None:
        compiled.load(setup.inputs)
        compiled.warmup()  # every kernel compiled (resources recorded) before anything is checked

    def check(self, compiled: CompiledRound, setup: RoundSetup) -> dict:
        checks = {"eager": checked_run(compiled, setup.inputs, setup.check).to_dict()}
        if checks["eager"]["ok"]:
            compiled.prepare()  # the whole round in one CUDA graph when the plan says capture: graph
            checks["replayed"] = checked_run(compiled, setup.inputs, setup.check, graph=True).to_dict()
        checks["ok"] = all(c["ok"] for c in checks.values())
        return checks

    def time(self, compiled: CompiledRound, setup: RoundSetup) -> Timed:
        t = self.profile.timing
        started = time.perf_counter()
        enough = median_known_within(t.replays_within_pct) if t.replays_within_pct > 0 else None
        timing = time_round(compiled.run, partial(compiled.load, setup.timing_inputs), t.replays, t.warmup, enough)
        timed_at = time.perf_counter()
        known = self.session.launch_times(self.profile.kind) if t.reuse_verdicts else None
        verdicts = launch_verdicts(compiled, t.verdict_calls, known)
        judged_at = time.perf_counter()
        ledger = self.ledger(compiled, setup) if t.ledger_replays else None
        seconds = {"replays": timed_at - started, "verdicts": judged_at - timed_at,
                   "ledger": time.perf_counter() - judged_at}
        return Timed(timing.median_ms, verdicts, len(compiled.schedule.launches), timing.p20_ms, timing.p80_ms,
                     timing.replays, seconds, ledger)

    def ledger(self, compiled: CompiledRound, setup: RoundSetup) -> LedgerSummary | None:
        """The round's time ledger from its kernel records, condensed, a step launch's time divided
        among its ops; None where the records do not match the launches or the profiler fails (the
        round is timed all the same: the ledger only informs the agents)."""
        rates = self.session.device_rates(compiled.device)
        try:
            records = kernel_records(compiled.run, compiled.device, self.profile.timing.ledger_replays)
        except (LedgerError, RuntimeError):  # records that do not split per replay; the profiler's own errors
            return None
        try:
            inside = step_shares(compiled)
        except Exception:  # noqa: BLE001  the step launch's stamped run (its own compile): the ledger keeps it whole
            inside = None
        try:
            return Ledger.of(compiled, setup.graph, records, rates["copy_bandwidth_gbs"], inside=inside).condensed()
        except LedgerError:
            return None

    def baselines(self, setup: RoundSetup, names: tuple[str, ...]) -> dict[str, Baseline]:
        if not names:
            return {}
        profile = replace(self.profile, timing=replace(self.profile.timing, baselines=names))
        return measure_baselines(setup, profile, self.cache_dir)

    def carried(self, carried: dict, workload: Workload) -> dict[str, Baseline]:
        kept = carried_baselines(carried, torch.cuda.get_device_name(), workload, self.baselines_wanted)
        if kept:  # timed beside baselines it did not build: in the state building them leaves
            enter_torch_graph_state(torch.device("cuda"))
        return kept

    def metrics(self, timed: Timed, setup: RoundSetup, baselines: dict[str, Baseline]) -> Metrics:
        device, floor = torch.device("cuda"), self.floor(setup)
        latency = timed.latency_ms
        return Metrics(latency_ms=latency, floor_ratio=latency / floor["floor_ms"],
                       bandwidth_gbs=floor["bytes"] / (latency * 1e-3) / 1e9, launches=timed.launches,
                       device=torch.cuda.get_device_name(device),
                       sms=torch.cuda.get_device_properties(device).multi_processor_count, baselines=baselines,
                       speedups=speedups(baselines, latency), p20_ms=timed.p20_ms, p80_ms=timed.p80_ms,
                       replays=timed.replays, ledger=timed.ledger, **floor)

    def floor(self, setup: RoundSetup) -> dict:
        """The round's floor: its bytes at copy bandwidth, its FLOPs at the matmul rate, whichever is longer."""
        totals, rates = graph_totals(setup.graph), self.session.device_rates(torch.device("cuda"))
        memory_ms = totals["bytes"] / (rates["copy_bandwidth_gbs"] * 1e9) * 1e3
        compute_ms = totals["flops"] / (rates["matmul_tflops"] * 1e12) * 1e3
        return {"floor_ms": max(memory_ms, compute_ms), "floor_memory_ms": memory_ms, "floor_compute_ms": compute_ms,
                "bytes": totals["bytes"], "flops": totals["flops"], **rates}


def names_device(wanted: str, device: str) -> bool:
    """Whether a profile's `device` ("H200"; "" for any) names this GPU ("NVIDIA H200"): whole words
    only, so "H20" is not an H200."""
    if not wanted:
        return True
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(wanted)}(?![A-Za-z0-9])", device, re.IGNORECASE) is not None


def launch_verdicts(compiled: CompiledRound, calls: int,
                    known: dict[tuple, tuple[float, tuple[float, ...], float]] | None = None) -> tuple[Verdict, ...]:
    """Verdicts of every multi-part launch, one measurement per group of identical launches, most
    interfering first. `known` (the session's, for one workload) holds the times measured for
    launches of earlier plans: a launch built the same way (the same kernel, grids, tiles, warps and
    stages over the same buffers) is not measured again, so an edit costs verdicts only for the
    launches it changed."""
    known = {} if known is None else known
    groups: dict[tuple, list] = {}
    for launch in compiled.launches:
        if len(launch.parts) > 1:
            key = (launch.digest, tuple(p.programs for p in launch.parts), tuple(p.sig.fn for p in launch.parts),
                   launch.num_warps, launch.num_stages, launch.grid)
            groups.setdefault(key, []).append(launch)
    parts = {f.launch: f.parts for f in compiled.feedback()}
    out, device = [], compiled.device
    flush = l2_flush_bytes(device)  # weights come from memory in a round, not from the L2 of the last call
    fork_us = None  # the fork/join's own time, measured once (when needed)
    for key, members in groups.items():
        first = members[0]
        if key not in known:
            fork_us = fork_join_us(device, calls, flush) if fork_us is None else fork_us
            timed = partial(time_per_call, device=device, calls=calls, flush_bytes=flush)
            solos = [compiled.solo(first.index, p) for p in range(len(first.parts))]
            alone = tuple(timed(s) for s in solos)
            # a round forks its two streams once, not once per launch: the fork and join are not counted
            overlap = max(timed(concurrently(solos, device)) - fork_us, max(alone))
            known[key] = timed(first), alone, overlap
        shared, solo, overlap = known[key]
        out.append(Verdict.judge(first.index, parts[first.index], shared, tuple(solo), modeled=False,
                                 overlap_us=overlap, launches=tuple(m.index for m in members),
                                 resources=first.resources))
    return tuple(sorted(out, key=lambda v: v.gain_percent))
