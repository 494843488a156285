"""Where a round's time goes: per launch and per op kind, its time, bytes and achieved bandwidth
against the device's copy bandwidth, and each stream's busy and idle time, from the GPU's kernel
records of the round replayed from its CUDA graph.

    replays = kernel_records(compiled.run, device, replays=5)        # GPU: torch.profiler's kernels
    ledger = Ledger.of(compiled, graph, replays, copy_gbs=4300.0)
    print(ledger.summary())                                          # a few lines, biggest loss first

One model's phase replayed alone (CompiledRound.phase) has a ledger of its launches only:
`Ledger.of(compiled, graph, replays, copy_gbs, launches=compiled.phase_launches(model))`.

A step launch (the draft's k steps as one persistent kernel) is one record; given its in-kernel
critical path (`step_shares`, a stamped run of its own), its time is split among the ops it runs, as
kinds `draft step qkv`, `draft step attn`, ..., each with the bytes of the graph ops it computes.

A generated kernel is named after its source's digest (`k_<digest>`, codegen.KernelCache), so a
record names its launch's kernel; launches that share a kernel (the same op in every layer) take
that kernel's records in the order they were launched.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Callable

import networkx as nx

from conjugate.compiler.round import CompiledRound
from conjugate.errors import ConjugateError
from conjugate.evaluate.result import KindLoss, LedgerSummary

class LedgerError(ConjugateError):
    """Kernel records that do not match the round's launches."""


@dataclass(frozen=True)
class KernelRecord:
    name: str
    stream: int
    start_us: float
    end_us: float

    @property
    def us(self) -> float:
        return self.end_us - self.start_us


@dataclass(frozen=True)
class LaunchEntry:
    launch: int
    kind: str  # e.g. "target qkv" or, for a shared launch, "target gate_up + draft qkv"
    stream: str  # the plan's stream
    us: float  # median over the replays of its time at the head of its stream (exclusive_us)
    bytes: int  # what its ops must move (the op graph's count)

    @property
    def gbs(self) -> float:
        return self.bytes / (self.us * 1e-6) / 1e9 if self.us else 0.0


@dataclass(frozen=True)
class KindEntry:
    kind: str
    launches: int
    us: float
    bytes: int
    bandwidth_fraction: float  # achieved bandwidth over the copy bandwidth

    @property
    def floor_us(self) -> float:
        """These bytes at the copy bandwidth: what the kind would take at the floor."""
        return self.us * self.bandwidth_fraction


@dataclass(frozen=True)
class StreamEntry:
    stream: int  # the device's stream id, as the records give it
    busy_us: float  # union of its kernels' intervals within the round
    idle_us: float  # the rest of the round


@dataclass(frozen=True)
class Ledger:
    round_us: float  # one replay: first kernel start to last kernel end (median over replays)
    floor_us: float  # the round's bytes at the copy bandwidth
    busy_us: float  # time some kernel ran
    copy_gbs: float
    launches: tuple[LaunchEntry, ...]
    kinds: tuple[KindEntry, ...]  # longest first
    streams: tuple[StreamEntry, ...]
    step_kinds: int = 0  # kinds a step launch's time was divided into (`inside`)

    @property
    def idle_us(self) -> float:
        return self.round_us - self.busy_us

    @classmethod
    def of(cls, compiled: CompiledRound, graph: nx.DiGraph, replays: list[list[KernelRecord]],
           copy_gbs: float, launches: list[int] | None = None,
           inside: dict[int, dict[str, float]] | None = None) -> "Ledger":
        """The ledger of the replays' records: of every launch of the round, or of `launches` alone
        (the indices of what was replayed, a phase) and the bytes of their ops; a step launch's time
        split among its ops by `inside` (launch index -> each table op's share, `step_shares`)."""
        if not replays:
            raise LedgerError("no kernel records: nothing was replayed")
        replayed = list(range(len(compiled.launches))) if launches is None else list(launches)
        matched = [(match_launches(compiled, records, replayed), exclusive_us(records)) for records in replays]
        entries = tuple(_launch_entry(compiled, graph, index, [own[id(m[index])] for m, own in matched])
                        for index in replayed)
        spans = [_span(records) for records in replays]
        middle = sorted(range(len(replays)), key=lambda i: spans[i])[len(replays) // 2]  # the median replay
        records = replays[middle]
        total_bytes = (sum(graph.nodes[n]["op"].bytes for n in graph.nodes) if launches is None
                       else sum(e.bytes for e in entries))
        pieces = _step_pieces(compiled, graph, entries, inside)
        return cls(round_us=spans[middle], floor_us=total_bytes / (copy_gbs * 1e9) * 1e6,
                   busy_us=_union([(r.start_us, r.end_us) for r in records]), copy_gbs=copy_gbs,
                   launches=entries, kinds=_kinds(entries, copy_gbs, pieces), streams=_streams(records, spans[middle]),
                   step_kinds=len({kind for piece in pieces.values() for kind, _, _ in piece}))

    @classmethod
    def modeled(cls, compiled: CompiledRound, graph: nx.DiGraph, launch_us: list[float], round_us: float,
                copy_gbs: float) -> "Ledger":
        """The ledger the analytical model gives: each launch's modeled time, no idle time."""
        launches = tuple(_launch_entry(compiled, graph, index, [us]) for index, us in enumerate(launch_us))
        total_bytes = sum(graph.nodes[n]["op"].bytes for n in graph.nodes)
        return cls(round_us=round_us, floor_us=total_bytes / (copy_gbs * 1e9) * 1e6, busy_us=round_us,
                   copy_gbs=copy_gbs, launches=launches, kinds=_kinds(launches, copy_gbs), streams=())

    def condensed(self, modeled: bool = False, top: int = 8) -> LedgerSummary:
        """What the agents are told: the `top` op kinds losing most against their floor (and as many
        more as a step launch was divided into, so that its ops leave room for the other kinds), and
        each of the plan's streams' busy time."""
        streams: dict[str, float] = defaultdict(float)
        for launch in self.launches:
            streams[str(launch.stream)] += launch.us / 1e3
        losses = sorted(self.kinds, key=lambda k: k.floor_us - k.us)[:top + self.step_kinds]
        return LedgerSummary(self.round_us / 1e3, self.floor_us / 1e3, self.idle_us / 1e3, modeled, dict(streams),
                             tuple(KindLoss(k.kind, k.launches, k.us / 1e3, k.floor_us / 1e3, k.bandwidth_fraction)
                                   for k in losses))

    def summary(self, top: int = 6) -> str:
        """Where the time goes, a few lines: the round against its floor, idle time, then the op kinds
        that lose most against their own bytes' floor."""
        lines = [f"round {self.round_us / 1e3:.2f} ms = {self.round_us / self.floor_us:.2f}x its floor "
                 f"{self.floor_us / 1e3:.2f} ms; GPU idle {self.idle_us / 1e3:.2f} ms; "
                 + ", ".join(f"stream {s.stream} busy {s.busy_us / 1e3:.2f} ms" for s in self.streams)]
        for k in sorted(self.kinds, key=lambda k: k.floor_us - k.us)[:top]:
            lines.append(f"  {k.kind}: {k.us / 1e3:.2f} ms in {k.launches} launches, "
                         f"{k.bandwidth_fraction:.0%} of copy bandwidth (loses {(k.us - k.floor_us) / 1e3:.2f} ms)")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"round_us": self.round_us, "floor_us": self.floor_us, "busy_us": self.busy_us,
                "idle_us": self.idle_us, "copy_gbs": self.copy_gbs,
                "kinds": [asdict(k) | {"floor_us": k.floor_us} for k in self.kinds],
                "streams": [asdict(s) for s in self.streams],
                "launches": [asdict(l) | {"gbs": l.gbs} for l in self.launches]}


def match_launches(compiled: CompiledRound, records: list[KernelRecord],
                   replayed: list[int] | None = None) -> dict[int, KernelRecord]:
    """Launch index -> its kernel record, for one replay's records of every launch (or of the
    `replayed` ones, in launch order): a kernel's records in start order
    meet its launches in launch order. A kernel launched on two streams (a shared tile function, the
    streamed kernel of both models) is first split by stream, where the records tell the streams
    apart: each launch stream's record ids are those of the kernels only it launches, and they must
    be disjoint and cover that kernel's records (a graph replay may run a stream's kernels on ids of
    its own); else start order alone decides, as for one stream."""
    by_name: dict[str, list[KernelRecord]] = defaultdict(list)
    for r in sorted(records, key=lambda r: r.start_us):
        by_name[r.name].append(r)
    kernels = _launches_by_kernel(compiled, replayed)
    ids = _stream_ids(compiled, kernels, by_name)
    out = {}
    for name, launches in kernels.items():
        got = by_name.get(name, [])
        if len(got) != len(launches):
            raise LedgerError(f"kernel {name}: {len(got)} records for {len(launches)} launches in one replay")
        streams = sorted({compiled.launches[i].stream for i in launches})
        split = {s: [i for i in launches if compiled.launches[i].stream == s] for s in streams}
        theirs = {s: [r for r in got if r.stream in ids.get(s, ())] for s in streams}
        if len(streams) > 1 and all(len(theirs[s]) == len(split[s]) for s in streams):
            for s in streams:
                out |= dict(zip(split[s], theirs[s]))
        else:
            out |= dict(zip(launches, got))
    return out


def _stream_ids(compiled: CompiledRound, kernels: dict[str, list[int]],
                by_name: dict[str, list[KernelRecord]]) -> dict[str, set[int]]:
    """Each launch stream's record ids, from the kernels launched on that stream alone; none for a
    stream whose ids another stream's kernels also carry."""
    ids: dict[str, set[int]] = defaultdict(set)
    for name, launches in kernels.items():
        streams = {compiled.launches[i].stream for i in launches}
        if len(streams) == 1:
            ids[streams.pop()] |= {r.stream for r in by_name.get(name, [])}
    return {s: own for s, own in ids.items() if not any(own & other for t, other in ids.items() if t != s)}


def exclusive_us(records: list[KernelRecord]) -> dict[int, float]:
    """Each kernel's time at the head of its stream: from its start, or the end of the kernels before
    it on that stream if later, to its end. Without programmatic dependent launch a stream's kernels
    do not overlap and this is each kernel's duration; with it a kernel starts while the one before
    it runs and waits (`griddepcontrol.wait`), and that waiting is the earlier kernel's time, so a
    stream's kernels sum to its busy time instead of counting the overlap twice. Keyed by id(record)."""
    out, ends = {}, {}
    for r in sorted(records, key=lambda r: (r.start_us, r.end_us)):
        head = max(r.start_us, ends.get(r.stream, r.start_us))
        out[id(r)] = max(0.0, r.end_us - head)
        ends[r.stream] = max(ends.get(r.stream, r.end_us), r.end_us)
    return out


def _launches_by_kernel(compiled: CompiledRound, replayed: list[int] | None = None) -> dict[str, list[int]]:
    out: dict[str, list[int]] = defaultdict(list)
    for index in sorted(replayed) if replayed is not None else range(len(compiled.launches)):  # launch order
        out[compiled.launches[index].record_name].append(index)
    return out


def _launch_entry(compiled: CompiledRound, graph: nx.DiGraph, index: int, us: list[float]) -> LaunchEntry:
    parts = compiled.schedule.launches[index].parts
    kind = " + ".join(f"{p.model} {p.kind}" for p in parts)
    nbytes = sum(graph.nodes[op]["op"].bytes for p in parts for op in p.ops)
    return LaunchEntry(index, kind, compiled.launches[index].stream, statistics.median(us), nbytes)


def _kinds(launches: tuple[LaunchEntry, ...], copy_gbs: float,
           pieces: dict[int, list[tuple[str, float, int]]] | None = None) -> tuple[KindEntry, ...]:
    """The launches summed by kind; a launch with `pieces` ((kind, us, bytes) each) counts as those."""
    groups: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for launch in launches:
        for kind, us, nbytes in (pieces or {}).get(launch.launch, [(launch.kind, launch.us, launch.bytes)]):
            groups[kind].append((us, nbytes))
    out = []
    for kind, members in groups.items():
        us, nbytes = sum(u for u, _ in members), sum(b for _, b in members)
        achieved = nbytes / (us * 1e-6) / 1e9 if us else 0.0
        out.append(KindEntry(kind, len(members), us, nbytes, achieved / copy_gbs))
    return tuple(sorted(out, key=lambda k: -k.us))


def step_shares(compiled: CompiledRound) -> dict[int, dict[str, float]]:
    """Each step launch's time divided among its ops by its in-kernel critical path (GPU: a stamped
    run of its own on a copy of its cache, CompiledStep.ledger): launch index -> table op -> share."""
    from conjugate.compiler.step.compiled import CompiledStep
    from conjugate.compiler.step.ledger import path_shares

    return {i: path_shares(launch.ledger()) for i, launch in enumerate(compiled.launches)
            if isinstance(launch, CompiledStep)}


def _step_pieces(compiled: CompiledRound, graph: nx.DiGraph, entries: tuple[LaunchEntry, ...],
                 inside: dict[int, dict[str, float]] | None) -> dict[int, list[tuple[str, float, int]]]:
    """A step launch's entry as one piece a table op: `<model> step <op>`, its share of the launch's
    time, the bytes of the graph ops it computes (table.KIND_OPS)."""
    from conjugate.compiler.step.table import KIND_OPS

    out = {}
    for entry in entries:
        shares = (inside or {}).get(entry.launch)
        if not shares:
            continue
        nbytes: dict[tuple[str, str], int] = defaultdict(int)
        for p in compiled.schedule.launches[entry.launch].parts:
            for op in p.ops:
                node = graph.nodes[op]["op"]
                nbytes[(str(p.model), KIND_OPS[node.kind])] += node.bytes
        out[entry.launch] = [(f"{model} step {'lm_head' if op == 'head' else op}", entry.us * shares.get(op, 0.0), n)
                             for (model, op), n in nbytes.items()]
    return out


def _span(records: list[KernelRecord]) -> float:
    return max(r.end_us for r in records) - min(r.start_us for r in records)


def _union(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by the intervals."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def _streams(records: list[KernelRecord], span: float) -> tuple[StreamEntry, ...]:
    by_stream: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for r in records:
        by_stream[r.stream].append((r.start_us, r.end_us))
    return tuple(StreamEntry(s, busy, span - busy) for s, busy in
                 sorted((s, _union(iv)) for s, iv in by_stream.items()))


def kernel_records(run: Callable[[], None], device, replays: int = 5, warmup: int = 3) -> list[list[KernelRecord]]:
    """The CUDA kernels of `replays` calls of `run` (a round's graph replay), one list per call (GPU only)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        run()
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            run()
        torch.cuda.synchronize(device)
    records = sorted((KernelRecord(e.name, int(getattr(e, "device_resource_id", 0) or 0), e.time_range.start,
                                   e.time_range.end)
                      for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda r: r.start_us)
    if not records or len(records) % replays:
        raise LedgerError(f"{len(records)} kernel records for {replays} replays: cannot split them per replay")
    per = len(records) // replays
    return [records[i * per:(i + 1) * per] for i in range(replays)]
