"""The analytical evaluator: a roofline model of a compiled round, for machines without a GPU.

Per part (one op or fused chain of one model, `p` programs):
    time = max(bytes / (bandwidth * efficiency[family]), flops / matmul rate) / fill(p)
    fill(p) = p / (waves * slots), waves = ceil(p / slots), slots = SMs * programs per SM
so a grid smaller than one wave cannot draw the whole bandwidth (wave quantization). A step launch
(the draft's k steps as one persistent launch) is one part of family `step` with no waves: its
efficiency says how near the bandwidth the whole dependent chain runs; it holds every SM, so a round
holding one overlaps no streams. A streamed launch (a residual GEMM by kernels/streamed.py: at most
a program an SM, each streaming its tiles through a deep ring) is a GEMM without waves whose `p`
programs draw min(1, p * programs_per_sm / SMs) of the bandwidth: one such program streams as much as
a wave's slot of tile programs (on an H100 its o_proj at 128 rows, 64 programs, ran within 1.13x of
cuBLAS's time: lab/stream_chain).
A launch costs the launch overhead plus its part; two parts share the launch's slots:
    time = overhead + sum_i(bytes_i / bandwidth_i) / fill(p_0 + p_1) + penalty * min(part times)
One stream runs launches back to back; two streams hide `streams_overlap` of the shorter stream.
A fused chain's bytes are its ops' (a fused MLP's activations included, which it never writes; its
atomic adds into the residual stream cost nothing here): a fusion is seen to save launches alone.
Every number it produces is modeled, not measured.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import networkx as nx

from conjugate.compiler.feedback import PartRef
from conjugate.evaluate.evaluators import ModelConstants
from conjugate.evaluate.result import Verdict
from conjugate.plan.expand import STEP, Launch, Schedule
from conjugate.plan.launch import Step, Streamed
from conjugate.plan.tiles import FAMILY_OF


STREAMED = "streamed"  # the family of a streamed launch's part (costed as a GEMM without waves)


@dataclass(frozen=True)
class PartCost:
    family: str
    bytes: int
    flops: int
    programs: int


@dataclass(frozen=True)
class LaunchEstimate:
    index: int
    stream: str
    us: float
    alone_us: tuple[float, ...]  # each part as a launch of its own (overhead included)
    overlap_us: float | None = None  # the parts launched at once on streams of their own (shared launches)

    def verdict(self, parts: tuple[PartRef, ...]) -> Verdict:
        """Gain, neutral or interference of a shared launch against its parts launched separately."""
        return Verdict.judge(self.index, parts, self.us, self.alone_us, modeled=True, overlap_us=self.overlap_us)


class AnalyticalModel:
    def __init__(self, constants: ModelConstants):
        self.c = constants
        self.slots = constants.sms * constants.programs_per_sm

    def fill(self, programs: int) -> float:
        waves = max(1, math.ceil(programs / self.slots))
        return programs / (waves * self.slots)

    def _memory_us(self, part: PartCost) -> float:
        family = "gemm" if part.family == STREAMED else part.family  # a streamed launch is a GEMM's bytes
        return part.bytes / (self.c.bandwidth_gbs * 1e3 * self.c.efficiency[family])  # GB/s = 1e3 B/us

    def _compute_us(self, part: PartCost) -> float:
        return part.flops / (self.c.matmul_tflops * 1e6)  # TFLOP/s = 1e6 FLOP/us

    def part_us(self, part: PartCost) -> float:
        if part.family == STEP:  # a persistent launch holds its SMs all through: no waves to fill
            return max(self._memory_us(part), self._compute_us(part))
        if part.family == STREAMED:
            share = min(1.0, part.programs * self.c.programs_per_sm / self.c.sms)
            return max(self._memory_us(part), self._compute_us(part)) / share
        return max(self._memory_us(part), self._compute_us(part)) / self.fill(part.programs)

    def launch_us(self, parts: list[PartCost]) -> float:
        if len(parts) == 1:
            return self.c.launch_overhead_us + self.part_us(parts[0])
        alone = [self.part_us(p) for p in parts]
        memory = sum(self._memory_us(p) for p in parts) / self.fill(sum(p.programs for p in parts))
        compute = sum(self._compute_us(p) for p in parts)
        return self.c.launch_overhead_us + max(memory, compute) + self.c.colocation_penalty * min(alone)

    def estimate(self, launch: Launch, parts: list[PartCost]) -> LaunchEstimate:
        alone = tuple(self.launch_us([p]) for p in parts)
        return LaunchEstimate(launch.index, launch.stream, self.launch_us(parts), alone,
                              self.overlap_us(alone) if len(parts) > 1 else None)

    def overlap_us(self, alone: tuple[float, ...]) -> float:
        """Launches on streams of their own, as round_ms overlaps two streams: the longest, plus the
        share of the rest that does not overlap it."""
        return max(alone) + (1 - self.c.streams_overlap) * (sum(alone) - max(alone))

    def round_ms(self, estimates: list[LaunchEstimate], holds_every_sm: bool = False) -> float:
        """`holds_every_sm`: a launch (a step launch) keeps the other stream's kernels off the GPU
        until it ends, so the streams do not overlap."""
        per_stream: dict[str, float] = {}
        for e in estimates:
            per_stream[e.stream] = per_stream.get(e.stream, 0.0) + e.us
        if len(per_stream) == 1 or holds_every_sm:
            return sum(per_stream.values()) / 1e3
        longest, shortest = max(per_stream.values()), min(per_stream.values())
        return (longest + (1 - self.c.streams_overlap) * shortest) / 1e3


def part_costs(graph: nx.DiGraph, launch: Launch, programs: list[int]) -> list[PartCost]:
    """Bytes and FLOPs of each part (from the op graph) with its program count (from lowering)."""
    costs = []
    for part, count in zip(launch.parts, programs):
        ops = [graph.nodes[o]["op"] for o in part.ops]
        family = STREAMED if isinstance(launch.form, Streamed) else FAMILY_OF.get(part.kind, part.kind)
        costs.append(PartCost(family, sum(o.bytes for o in ops), sum(o.flops for o in ops), count))
    return costs


def model_round(model: AnalyticalModel, graph: nx.DiGraph, schedule: Schedule,
                programs: list[list[int]]) -> tuple[float, list[LaunchEstimate]]:
    estimates = [model.estimate(launch, part_costs(graph, launch, counts))
                 for launch, counts in zip(schedule.launches, programs)]
    return model.round_ms(estimates, any(isinstance(l.form, Step) for l in schedule.launches)), estimates


def launch_programs(compiled) -> list[list[int]]:
    """Programs of every part of every launch of a compiled round (what lowering chose)."""
    return [[p.programs for p in launch.parts] for launch in compiled.launches]
