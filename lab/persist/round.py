"""CompiledRound: a plan's schedule lowered to generated Triton kernels over device buffers.

    compiled = compile_round(plan, workload, draft_weights, target_weights)
    compiled.load(inputs); compiled.run(); outputs = compiled.outputs()

`run()` replays the CUDA graph once `capture()` made it (callers capture when the plan says
`capture: graph`, see `prepare()`), else launches the kernels one by one: on the current stream, or with `streams: two` each model on a
stream of its own, forked from and joined back to the current one. Graphs are captured on a side
stream of their own (two graphs captured on the default capture stream hung when replayed
concurrently on the H200).
"""
from __future__ import annotations

import hashlib
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import networkx as nx
import torch

from conjugate.compiler.buffers import PreparedWeights, RoundBuffers
from conjugate.compiler.codegen import (NO_PDL, Dispatch, KernelCache, Pdl, kernel_args, kernel_source, persistent_source,
                                        ticket_source)
from conjugate.compiler.feedback import CompileFailure, LaunchFeedback, PartRef, Resources
from conjugate.compiler.gemm import preload_before_barrier, preload_before_wait
from conjugate.compiler.lower import lower_part
from conjugate.compiler.packed import pack_launch
from conjugate.compiler.persist import (ASSUMED_L2_BYTES, PREFETCH_L2_SHARE, resident_programs, sync_words,
                                        ticket_words)
from conjugate.compiler.resources import check_shared_memory
from conjugate.compiler.sm_limit import SmLimitUnavailable, limited_stream
from conjugate.compiler.tile import INTERPRETING, PartCall
from conjugate.errors import CompileError
from conjugate.graph import build_graph
from conjugate.models.reference import KVCache, RoundInputs, RoundOutputs
from conjugate.models.weights import ModelWeights
from conjugate.plan.expand import Launch, Schedule, expand
from conjugate.plan.schema import Plan
from conjugate.roles import Model
from conjugate.workload import Workload


def default_cache_dir() -> Path:
    return Path(os.environ.get("CONJUGATE_CACHE", Path.home() / ".cache" / "conjugate")) / "kernels"


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "triton-interpreter"


@dataclass
class CompiledLaunch:
    index: int
    kernel: Any  # the generated @triton.jit function
    digest: str  # its source hash: the file k_<digest>.py
    grid: int
    args: list
    constexprs: dict
    num_warps: int
    num_stages: int
    stream: str
    parts: list[PartCall]
    resources: Resources = Resources()  # the compiler's report (GPU only)
    sync: Any = None  # a persistent launch's barrier counters (persist.py); None for a tile loop
    persistent: bool = False  # programs take the tiles in turn on a grid of their own size (`grid`)
    pdl: bool = False  # launched as a programmatic dependent launch (its kernel waits for the one before)
    tickets: bool = False  # a persistent launch whose tiles are taken in dependency order (no residency needed)

    @classmethod
    def build(cls, index: int, parts: list[PartCall], cache: KernelCache, *, dispatch: Dispatch | None = None,
              packed: bool = False, num_warps: int = 4, num_stages: int = 2, stream: str = "main",
              pdl: Pdl = NO_PDL) -> "CompiledLaunch":
        """The generated kernel of `parts` (loaded through `cache`), bound to their buffers."""
        kernel, digest = cache.load(kernel_source(parts, dispatch, packed, pdl))
        args, constexprs = kernel_args(parts, dispatch)
        return cls(index, kernel, digest, sum(p.programs for p in parts), args, constexprs, num_warps, num_stages,
                   stream, list(parts), pdl=pdl.on)

    @classmethod
    def build_persistent(cls, index: int, parts: list[PartCall], cache: KernelCache, programs: int,
                         device: torch.device, *, prefetch: frozenset[int] = frozenset(), num_warps: int = 4,
                         num_stages: int = 2, stream: str = "main", pdl: Pdl = NO_PDL) -> "CompiledLaunch":
        """`parts` in sequence on `programs` programs (persist.py), with the counters it needs;
        `prefetch`: the parts whose weights are asked for ahead of their barrier (none under the
        interpreter, which has no L2 and no inline PTX)."""
        sync = torch.zeros(sync_words(len(parts) - 1), dtype=torch.int32, device=device) if len(parts) > 1 else None
        kernel, digest = cache.load(persistent_source(parts, frozenset() if INTERPRETING else prefetch, pdl))
        args, constexprs = kernel_args(parts, None, sync)
        return cls(index, kernel, digest, programs, args, constexprs, num_warps, num_stages, stream, list(parts),
                   sync=sync, persistent=True, pdl=pdl.on)

    @classmethod
    def build_tickets(cls, index: int, parts: list[PartCall], cache: KernelCache, programs: int,
                      device: torch.device, *, prefetch: frozenset[int] = frozenset(), num_warps: int = 4,
                      num_stages: int = 2, stream: str = "main") -> "CompiledLaunch":
        """`parts` in dependency order (persist.py): `programs` programs taking tickets, 0 for one program
        per tile; `prefetch`: the parts whose tiles ask L2 for their weights before they wait (none
        under the interpreter)."""
        tiles = sum(p.programs for p in parts)
        sync = torch.zeros(ticket_words(len(parts)), dtype=torch.int32, device=device)
        one_each = programs in (0, tiles)
        source = ticket_source(parts, frozenset() if INTERPRETING else prefetch, one_each)
        kernel, digest = cache.load(source)
        args, constexprs = kernel_args(parts, None, sync)
        return cls(index, kernel, digest, tiles if one_each else min(programs, tiles), args, constexprs, num_warps,
                   num_stages, stream, list(parts), sync=sync, persistent=True, tickets=True)

    def __call__(self) -> None:
        self.kernel[(self.grid,)](*self.args, **self.constexprs, num_warps=self.num_warps, num_stages=self.num_stages,
                                  launch_pdl=self.pdl)

    def warmup(self) -> None:
        """Compile without running and record the compiler's resource report."""
        compiled = self.kernel.warmup(*self.args, **self.constexprs, grid=(self.grid,), num_warps=self.num_warps,
                                      num_stages=self.num_stages, launch_pdl=self.pdl)
        compiled._init_handles()  # loads the module; fills in the register and spill counts
        self.resources = Resources(compiled.n_regs, compiled.n_spills, compiled.metadata.shared)


def _compile_error(launch: Launch, part: int | None, reason: str) -> CompileError:
    """The error of a planned launch that could not be lowered or compiled (`part` None: the whole launch)."""
    return CompileError(CompileFailure(launch.index, part, tuple(PartRef.of(p) for p in launch.parts), reason))


def launch_pdl(launch: Launch, waits: dict[int, tuple[int, ...]], device: torch.device) -> Pdl:
    """A planned launch's programmatic dependent launch: the plan's, for Triton's compiler only (the
    interpreter has none; `meta` buffers: compiled offline), and never for a launch that also waits
    for the other stream's work (a shared launch on two streams: its start must follow that work in
    full, not only the kernel before it on its stream). Its programs prefetch their weights only
    where the whole launch's bytes fit in PREFETCH_L2_SHARE of the L2 cache (a larger launch would
    evict what its first programs read before the rest run)."""
    if launch.pdl == "none" or INTERPRETING or device.type == "cpu" or launch.index in waits:
        return NO_PDL
    return Pdl(launch.pdl, launch.pdl_prefetch and launch.bytes <= PREFETCH_L2_SHARE * l2_bytes(device),
               launch.pdl_preload)


def l2_bytes(device: torch.device) -> int:
    """The GPU's L2 cache (an H100's or H200's where the device cannot say: offline compiles)."""
    if device.type == "cuda":
        return getattr(torch.cuda.get_device_properties(device), "L2_cache_size", ASSUMED_L2_BYTES)
    return ASSUMED_L2_BYTES


def _compile_launch(launch: Launch, graph: nx.DiGraph, bufs: RoundBuffers, cache: KernelCache,
                    pdl: Pdl = NO_PDL) -> CompiledLaunch:
    parts = []
    device = bufs.target.cache.k.device
    for p, part in enumerate(launch.parts):
        try:
            parts.append(lower_part(part, graph, bufs))
            check_shared_memory(parts[-1], launch.num_stages, device)
        except ValueError as e:
            raise _compile_error(launch, p, str(e)) from e
    packed = launch.operand_layout == "packed" and len(parts) == 2 and not launch.persistent
    if packed:
        try:
            parts, packed = pack_launch(launch, parts, graph, bufs)
            check_shared_memory(parts[1], launch.num_stages, device)  # now at the target's tile shape
        except ValueError as e:
            raise _compile_error(launch, 1, str(e)) from e
    if launch.persistent:
        if launch.preload:
            for part in parts[1:]:
                preload_before_barrier(part, launch.num_warps)
        if launch.tickets:
            return CompiledLaunch.build_tickets(launch.index, parts, cache, launch.programs, device,
                                                prefetch=prefetched_parts(launch, graph, device),
                                                num_warps=launch.num_warps, num_stages=launch.num_stages,
                                                stream=launch.stream)
        return CompiledLaunch.build_persistent(launch.index, parts, cache, persistent_programs(launch, parts, device),
                                               device, prefetch=prefetched_parts(launch, graph, device),
                                               num_warps=launch.num_warps, num_stages=launch.num_stages,
                                               stream=launch.stream, pdl=pdl)
    if pdl.preload and not packed:
        preload_weights(parts, launch.num_warps, pdl.trigger == "start")
    dispatch = None
    if len(parts) == 2:
        dispatch = Dispatch.of(launch.pattern, launch.ratio, (parts[0].programs, parts[1].programs))
    return CompiledLaunch.build(launch.index, parts, cache, dispatch=dispatch, packed=packed,
                                num_warps=launch.num_warps, num_stages=launch.num_stages, stream=launch.stream,
                                pdl=pdl)


def preload_weights(parts: list[PartCall], num_warps: int, release: bool) -> bool:
    """Every part of a programmatic dependent launch loads its first weights into registers, then waits
    for the kernel before in its tile (gemm.preload_before_wait); where one part cannot (not a GEMM, or
    no preload fits), none does and the dispatcher waits for all. Whether they do."""
    before = [dict(p.constexprs) for p in parts]
    done = [preload_before_wait(p, num_warps, release) for p in parts]
    if not all(done):
        for part, constexprs in zip(parts, before):
            part.constexprs = constexprs
    return all(done)


def persistent_programs(launch: Launch, parts: list[PartCall], device: torch.device) -> int:
    """A persistent launch's first grid: one program per SM (the plan's count if smaller), no more
    than its largest part has tiles; 1 under the interpreter, which runs programs one after another.
    Once compiled, `CompiledRound.warmup` grows it to what the GPU holds at once (persist.py)."""
    if INTERPRETING or device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return min(launch.programs or sms, sms, max(p.programs for p in parts))


def prefetched_parts(launch: Launch, graph: nx.DiGraph, device: torch.device) -> frozenset[int]:
    """The parts of a persistent launch whose weights its programs prefetch ahead of their barrier:
    with the plan's `prefetch`, those whose bytes fit in PREFETCH_L2_SHARE of the L2 cache (a
    larger part would evict the one still running)."""
    if not launch.prefetch:
        return frozenset()
    l2 = l2_bytes(device)
    return frozenset(i for i, part in enumerate(launch.parts)
                     if sum(graph.nodes[op]["op"].bytes for op in part.ops) <= PREFETCH_L2_SHARE * l2)


def resident_grid(launch: CompiledLaunch, planned: Launch, device: torch.device) -> int:
    """A compiled persistent launch's grid: the plan's `programs`, else as many as the GPU holds at
    once, no more than its largest part has tiles; a CompileError when the plan asks for more
    programs than can be resident (one would wait for another that never starts). Without the
    compiler's report, one program per SM (always resident when it compiled at all)."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    r = launch.resources
    tiles = max(p.programs for p in launch.parts)
    if r.registers is None or r.shared_bytes is None:
        return min(planned.programs or sms, sms, tiles)
    fits = resident_programs(r.registers, r.shared_bytes, launch.num_warps, sms)
    if (planned.programs > fits and len(planned.parts) > 1) or fits == 0:  # a tile loop waits for no one
        raise _compile_error(planned, None, f"persist programs {planned.programs or 'all that fit'}: the GPU holds "
                                            f"{fits} programs of this kernel at once ({r.registers} registers, "
                                            f"{r.shared_bytes} bytes of shared memory, {launch.num_warps} warps each)")
    return min(planned.programs or fits, tiles)


def cross_stream_waits(launches: tuple[Launch, ...], graph: nx.DiGraph) -> dict[int, tuple[int, ...]]:
    """Launch index -> the launches of other streams it must wait for: for each other stream, the
    last launch holding an op it depends on. With two streams only a launch shared across models
    (a pinned draft op in a target launch) has any: before it, the draft's previous op; after it,
    the draft's next op waits for it."""
    where = {op: launch for launch in launches for op in launch.ops}
    out = {}
    for launch in launches:
        latest: dict[str, int] = {}
        for op in launch.ops:
            for before in graph.predecessors(op):
                other = where[before]
                if other.stream != launch.stream:
                    latest[other.stream] = max(latest.get(other.stream, -1), other.index)
        if latest:
            out[launch.index] = tuple(sorted(latest.values()))
    return out


def stream_priority(schedule: Schedule, model: Model) -> int:
    """The CUDA stream priority of `model`'s stream (lower runs first): -1 for the model the plan
    favours, else 0. A CUDA graph keeps each kernel's priority from the stream it was captured on
    (torch instantiates graphs with per-node priorities)."""
    return -1 if schedule.priority == model.value else 0


class CompiledRound:
    def __init__(self, schedule: Schedule, workload: Workload, bufs: RoundBuffers, launches: list[CompiledLaunch],
                 source_dir: Path, op_graph: nx.DiGraph, kernels: KernelCache):
        self.schedule, self.workload, self.bufs = schedule, workload, bufs
        self.launches, self.source_dir = launches, source_dir
        self._op_graph, self._kernels = op_graph, kernels  # for solo launches
        self.device = bufs.target.cache.k.device
        self.graph: torch.cuda.CUDAGraph | None = None
        self._streams = None
        self.waits = cross_stream_waits(schedule.launches, op_graph)
        self._events: dict[int, torch.cuda.Event] = {}
        self._green: list[object] = []  # the green contexts of SM-limited streams, alive as long as their streams
        if schedule.streams == "two" and self.device.type == "cuda":
            self._streams = {model: self._stream(model) for model in Model}
            self._events = {i: torch.cuda.Event() for waited in self.waits.values() for i in waited}

    def _stream(self, model: Model) -> torch.cuda.Stream:
        """`model`'s stream: on the SMs the plan limits it to (sm_limit.py), else with the plan's priority."""
        sms = dict(self.schedule.sm_limits).get(model.value, 0)
        if not sms:
            return torch.cuda.Stream(self.device, priority=stream_priority(self.schedule, model))
        try:
            context, stream = limited_stream(self.device, sms)
        except SmLimitUnavailable as e:
            first = next(l for l in self.schedule.launches if l.stream == model.value)
            raise _compile_error(first, None, f"sm_limit.{model.value}: {e}") from None
        self._green.append(context)
        return stream

    # -- running ---------------------------------------------------------------------------
    def load(self, inputs: RoundInputs) -> None:
        self.bufs.load(inputs)

    @contextmanager
    def _compiling(self, launch: CompiledLaunch):
        """Triton's compile and resource errors of `launch` (its own exception types) as CompileError."""
        try:
            yield
        except Exception as e:
            if not _is_compile_failure(e):
                raise
            reason = f"{type(e).__name__}: {str(e).strip().splitlines()[-1]}"
            raise _compile_error(self.schedule.launches[launch.index], None, reason) from e

    def _launch_all(self) -> None:
        for launch in self.launches:
            with self._compiling(launch):
                if self._streams:
                    stream = self._streams[launch.stream]
                    for waited in self.waits.get(launch.index, ()):  # the other stream's work it reads
                        stream.wait_event(self._events[waited])
                    with torch.cuda.stream(stream):
                        launch()
                    if launch.index in self._events:
                        self._events[launch.index].record(stream)
                else:
                    launch()

    def run_eager(self) -> None:
        if not self._streams:
            return self._launch_all()
        main = torch.cuda.current_stream(self.device)
        for s in self._streams.values():
            s.wait_stream(main)
        self._launch_all()
        for s in self._streams.values():
            main.wait_stream(s)

    def phase(self, model: Model) -> Callable[[], None]:
        """The launches that run only `model`'s ops, in order: one model's phase of a plan whose launches
        are each one model's (see serving's phase_plan)."""
        launches = [launch for launch in self.launches
                    if all(p.model == model for p in self.schedule.launches[launch.index].parts)]

        def run() -> None:
            for launch in launches:
                launch()
        return run

    def warmup(self) -> None:
        """Compile every kernel (GPU: recording its resources) before anything is timed or captured."""
        if self.device.type == "cuda" and not INTERPRETING:
            for launch in self.launches:
                with self._compiling(launch):
                    launch.warmup()
                if launch.persistent and not launch.tickets:  # as many programs as fit at once, or the plan's
                    launch.grid = resident_grid(launch, self.schedule.launches[launch.index], self.device)
        self.run_eager()

    def capture(self) -> None:
        """Capture the whole round in one CUDA graph, on a side stream of its own."""
        self.warmup()
        graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.graph(graph, stream=side):
            self.run_eager()
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.graph = graph

    def prepare(self) -> None:
        """Ready for timing as the plan says: the whole round in a CUDA graph (`capture: graph`, on a
        GPU), else compiled and warmed up for launches one by one."""
        if self.schedule.capture == "graph" and self.device.type == "cuda":
            self.capture()
        else:
            self.warmup()

    def run(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self.run_eager()

    # -- results ---------------------------------------------------------------------------
    def writes_logits(self, model: Model) -> bool:
        """False where the plan fused argmax into lm_head: that model's logits are never written."""
        return not any(p.model == model and "argmax" in p.fused and "lm_head" in p.fused
                       for launch in self.schedule.launches for p in launch.parts)

    def outputs(self) -> RoundOutputs:
        d, t = self.bufs.draft, self.bufs.target
        k = self.workload.k
        return RoundOutputs(
            draft_tokens=d.tokens_out.clone(),
            draft_logits=d.logits.clone() if self.writes_logits(Model.DRAFT) else None,
            target_logits=t.logits.view(t.batch, k + 1, -1).clone() if self.writes_logits(Model.TARGET) else None,
            target_tokens=t.tokens_out.view(t.batch, k + 1).clone(),
            draft_cache=KVCache(d.cache.k.clone(), d.cache.v.clone()),
            target_cache=KVCache(t.cache.k.clone(), t.cache.v.clone()))

    def solo(self, launch: int, part: int) -> CompiledLaunch:
        """One part of a launch as a launch of its own, lowered as the plan would lower it alone (its own
        tiles; for a packed launch, its own unpacked weights; for a persistent one, the warps and stages
        of the launch it was joined from): what a launch's verdict compares it with."""
        planned = self.schedule.launches[launch]
        call = lower_part(planned.parts[part], self._op_graph, self.bufs)
        warps, stages = planned.part_launch[part] if planned.part_launch else (planned.num_warps, planned.num_stages)
        return CompiledLaunch.build(launch, [call], self._kernels, num_warps=warps, num_stages=stages,
                                    stream=planned.stream)

    def feedback(self) -> tuple[LaunchFeedback, ...]:
        """Per launch: its kernel file, its parts with their programs and (GPU) the compiler's resource report."""
        return tuple(self._feedback(launch) for launch in self.launches)

    def _feedback(self, launch: CompiledLaunch) -> LaunchFeedback:
        planned = self.schedule.launches[launch.index].parts
        parts = tuple(PartRef.of(part, call.programs) for part, call in zip(planned, launch.parts))
        return LaunchFeedback(launch.index, f"k_{launch.digest}.py", parts, launch.resources)


def _is_compile_failure(e: Exception) -> bool:
    module = type(e).__module__ or ""
    return module.startswith("triton") or "OutOfResources" in type(e).__name__


def round_key(plan: Plan, workload: Workload, device: torch.device) -> str:
    body = json.dumps({"plan": plan.hash, "workload": workload.to_dict(), "device": device_name(device)},
                      sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def compile_round(plan: Plan, workload: Workload, draft: ModelWeights | PreparedWeights,
                  target: ModelWeights | PreparedWeights, cache_dir: Path | None = None,
                  schedule: Schedule | None = None) -> CompiledRound:
    """Lower a plan for a workload over the given weights (PreparedWeights share re-layouts between plans)."""
    draft = draft if isinstance(draft, PreparedWeights) else PreparedWeights(draft)
    target = target if isinstance(target, PreparedWeights) else PreparedWeights(target)
    graph = build_graph(workload)
    schedule = schedule or expand(plan, workload, graph)
    bufs = RoundBuffers.allocate(workload, draft, target)
    directory = (cache_dir or default_cache_dir()) / round_key(plan, workload, bufs.target.cache.k.device)
    cache = KernelCache(directory)
    waits, device = cross_stream_waits(schedule.launches, graph), bufs.target.cache.k.device
    pdls = [launch_pdl(launch, waits, device) for launch in schedule.launches]
    launches = [_compile_launch(launch, graph, bufs, cache, pdl) for launch, pdl in zip(schedule.launches, pdls)]
    manifest = {"plan": plan.to_dict(), "workload": workload.name, "launches": [
        {"launch": l.index, "kernel": f"k_{l.digest}.py", "grid": l.grid, "stream": l.stream, "pdl": l.pdl,
         "tickets": l.tickets,
         # as compiled: a prefetch the plan asked for is dropped where the launch outgrows its L2 share
         "pdl_trigger": pdl.trigger, "pdl_prefetch": pdl.prefetch,
         "preload": [p.constexprs.get("PRELOAD_K", 0) for p in l.parts],  # pdl's or persist's
         "parts": [{"ops": p.label, "tile": p.sig.fn, "programs": p.programs} for p in l.parts]}
        for l, pdl in zip(launches, pdls)]}
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return CompiledRound(schedule, workload, bufs, launches, directory, graph, cache)
