"""Measured stages of a GPU evaluation: check a compiled round (eagerly and replayed from its
CUDA graph), time it, and time each multi-part launch against its parts launched separately.

A verdict compares one shared launch with the sum of its parts' solo launches, each timed in a CUDA
graph of `calls` back-to-back launches with the L2 cache flushed before each (its weights come from
memory, as in a round): `gain` when the shared launch is more than 2% faster,
`interference` when more than 2% slower, else `neutral`. Launches built from the same kernels with
the same grids (the same op in every layer) are timed once and reported together.
"""
from __future__ import annotations

import torch

from conjugate.compiler.round import CompiledRound
from conjugate.evaluate.gpu_session import GpuSession
from conjugate.evaluate.timing import Timing, l2_flush_bytes, time_per_call, time_replays

VERDICT_THRESHOLD_PERCENT = 2.0


def checked_run(compiled: CompiledRound, session: GpuSession, graph: bool) -> dict:
    """Run the round once on poisoned outputs (from its CUDA graph when `graph`) and check it."""
    compiled.load(session.inputs)
    compiled.bufs.poison()
    compiled.run() if graph else compiled.run_eager()
    torch.cuda.synchronize()
    return session.check(compiled.outputs()).to_dict()


def time_round(run, load_fresh, replays: int, warmup: int) -> Timing:
    """Load fresh random inputs, then time the round's replays."""
    load_fresh()
    torch.cuda.synchronize()
    return time_replays(run, replays, warmup)


def verdict(kind_ops: list[str], shared_us: float, solo_us: list[float]) -> dict:
    separate = sum(solo_us)
    change = (separate - shared_us) / separate * 100
    kind = ("gain" if change > VERDICT_THRESHOLD_PERCENT else
            "interference" if change < -VERDICT_THRESHOLD_PERCENT else "neutral")
    return {"verdict": kind, "shared_us": round(shared_us, 2), "separate_us": round(separate, 2),
            "parts_us": [round(u, 2) for u in solo_us], "gain_percent": round(change, 1), "ops": kind_ops,
            "modeled": False}


def launch_verdicts(compiled: CompiledRound, calls: int) -> list[dict]:
    """Verdicts of every multi-part launch, one measurement per group of identical launches."""
    groups: dict[tuple, list] = {}
    for launch in compiled.launches:
        if len(launch.parts) > 1:
            key = (launch.digest, tuple(p.programs for p in launch.parts), tuple(p.sig.fn for p in launch.parts),
                   launch.num_warps, launch.num_stages)
            groups.setdefault(key, []).append(launch)
    out, device = [], compiled.device
    flush = l2_flush_bytes(device)  # weights come from memory in a round, not from the L2 of the last call
    for members in groups.values():
        first = members[0]
        shared = time_per_call(first, device, calls, flush_bytes=flush)
        solo = [time_per_call(compiled.solo(first.index, p), device, calls, flush_bytes=flush)
                for p in range(len(first.parts))]
        out.append({"launch": first.index, "launches": [m.index for m in members], **verdict(
            [p.label for p in first.parts], shared, solo), "programs": [p.programs for p in first.parts],
            **first.resources})
    return sorted(out, key=lambda v: v["gain_percent"])
