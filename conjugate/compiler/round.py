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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import networkx as nx
import torch

from conjugate.compiler.buffers import PreparedWeights, RoundBuffers
from conjugate.compiler.cache import KernelCache
from conjugate.compiler.codegen import dispatch_of, kernel_args, kernel_source
from conjugate.compiler.device import SmLimitUnavailable, check_shared_memory, limited_stream
from conjugate.compiler.feedback import CompileError, CompileFailure, LaunchFeedback, PartRef, Resources
from conjugate.compiler.lower import lower_part
from conjugate.compiler.packed import pack_calls
from conjugate.compiler.step.compiled import HOPPER_SMS, CompiledStep
from conjugate.compiler.streamed import CompiledStreamed
from conjugate.compiler.tile import INTERPRETING, PartCall
from conjugate.graph import build_graph
from conjugate.models.reference import KVCache, RoundInputs, RoundOutputs
from conjugate.models.weights import ModelWeights
from conjugate.plan.expand import Schedule, expand
from conjugate.plan.launch import Form, Launch, One, Packed, Pdl, Step, Streamed
from conjugate.plan.schema import Plan
from conjugate.plan.transforms import TOKENS_ONLY, keeping_logits
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
    pdl: bool = False  # launched as a programmatic dependent launch (its kernel waits for the one before)

    @classmethod
    def build(cls, index: int, form: Form | None, parts: list[PartCall], cache: KernelCache, *, num_warps: int = 4,
              num_stages: int = 2, stream: str = "main", pdl: Pdl = Pdl.NONE,
              launch_bytes: int = 0) -> "CompiledLaunch":
        """The generated kernel of `form` (None: one part alone) with its parts bound to `parts`, loaded
        through `cache`."""
        kernel, digest = cache.load(kernel_source(form, parts, pdl))
        args, constexprs = kernel_args(parts, dispatch_of(form, parts), launch_bytes)
        return cls(index, kernel, digest, sum(p.programs for p in parts), args, constexprs, num_warps, num_stages,
                   stream, list(parts), pdl=pdl != Pdl.NONE)

    @classmethod
    def alone(cls, index: int, part: PartCall, cache: KernelCache, **launch) -> "CompiledLaunch":
        """One bound part as a launch of its own, planned or not (tests, benchmarks, a launch's solo)."""
        return cls.build(index, None, [part], cache, **launch)

    @property
    def record_name(self) -> str:
        """The kernel's name in the profiler's records: generated kernels are named after their source."""
        return f"k_{self.digest}"

    @property
    def kernel_file(self) -> str:
        return f"k_{self.digest}.py"

    def manifest(self, pdl: str) -> dict:
        """Its entry in the round's manifest.json (`pdl`: the trigger as compiled)."""
        return {"launch": self.index, "kernel": self.kernel_file, "grid": self.grid, "stream": self.stream,
                "pdl_trigger": pdl, "parts": [{"ops": p.label, "tile": p.sig.fn, "programs": p.programs}
                                              for p in self.parts]}

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
    full, not only the kernel before it on its stream)."""
    if INTERPRETING or device.type == "cpu" or launch.index in waits:
        return Pdl.NONE
    return launch.pdl


def _lower_launch(launch: Launch, graph: nx.DiGraph, bufs: RoundBuffers) -> list[PartCall]:
    """The bound calls of a launch's parts, each lowered once: a packed launch's draft part at the
    target's tile shape, then both re-bound to their packed weights."""
    device = bufs.target.cache.k.device
    parts = launch.parts
    if isinstance(launch.form, Packed):  # the homogeneous tile shape
        parts = (parts[0], replace(parts[1], tiles=parts[0].tiles))
    calls = []
    for p, part in enumerate(parts):
        try:
            calls.append(lower_part(part, graph, bufs))
            check_shared_memory(calls[-1], launch.num_stages, device)
        except ValueError as e:
            raise _compile_error(launch, p, str(e)) from e
    if isinstance(launch.form, Packed):
        try:
            calls = pack_calls(calls[0], calls[1], bufs.packed)
        except ValueError as e:
            raise _compile_error(launch, 1, str(e)) from e
    return calls


def _sms(device: torch.device) -> int:
    """The device's SMs; offline (meta buffers, the CPU) an H100's or H200's."""
    return HOPPER_SMS if device.type != "cuda" else torch.cuda.get_device_properties(device).multi_processor_count


def _compile_step(launch: Launch, bufs: RoundBuffers, sm_limits: tuple[tuple[str, int], ...]) -> CompiledStep:
    """A Step launch on the SMs its stream may use (one program each, all co-resident): the draft's
    SM limit, else every SM. On every SM it holds the target's kernels off until it ends, so beside
    a target stream the round runs the two phases one after the other; on only the SMs a limited
    target leaves it was slower still (benchmarks/results/draft_step_h100.json, "co_located")."""
    sms = _sms(bufs.draft.cache.k.device)
    programs = dict(sm_limits).get(Model.DRAFT.value, 0) or sms
    try:
        return CompiledStep.build(launch.index, bufs.draft, programs, launch.stream, sms)
    except ValueError as e:
        raise _compile_error(launch, 0, str(e)) from e


def _compile_streamed(launch: Launch, graph: nx.DiGraph, bufs: RoundBuffers, pdl: Pdl,
                      sm_limits: tuple[tuple[str, int], ...]) -> CompiledStreamed:
    """A Streamed launch: at most a program for each SM its stream may use (its model's SM limit, else
    every SM), `pdl` its trigger as compiled; its programs never wait for each other, so none need be
    co-resident."""
    part = launch.form.part
    model = bufs.model(part.model)
    try:
        return CompiledStreamed.build(launch.index, part, graph.nodes[part.ops[0]]["op"], model, launch.stream,
                                      dict(sm_limits).get(part.model.value, 0) or _sms(model.cache.k.device), pdl)
    except ValueError as e:
        raise _compile_error(launch, 0, str(e)) from e


def _compile_launch(launch: Launch, graph: nx.DiGraph, bufs: RoundBuffers, cache: KernelCache,
                    pdl: Pdl = Pdl.NONE, sm_limits: tuple[tuple[str, int], ...] = ()
                    ) -> CompiledLaunch | CompiledStep | CompiledStreamed:
    if isinstance(launch.form, Step):
        return _compile_step(launch, bufs, sm_limits)
    if isinstance(launch.form, Streamed):
        return _compile_streamed(launch, graph, bufs, pdl, sm_limits)
    return CompiledLaunch.build(launch.index, launch.form, _lower_launch(launch, graph, bufs), cache,
                                num_warps=launch.num_warps, num_stages=launch.num_stages, stream=launch.stream,
                                pdl=pdl, launch_bytes=launch.bytes)


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

    def phase_launches(self, model: Model) -> list[int]:
        """The indices of the launches that run only `model`'s ops, in order."""
        return [launch.index for launch in self.launches
                if all(p.model == model for p in self.schedule.launches[launch.index].parts)]

    def phase(self, model: Model) -> Callable[[], None]:
        """The launches that run only `model`'s ops, in order: one model's phase of a plan whose launches
        are each one model's (see serving's phase_plan)."""
        launches = [self.launches[i] for i in self.phase_launches(model)]

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
    def spins_ran_out(self) -> int:
        """Waits of the step launch's last run that hit their spin limit (0 without one)."""
        return sum(launch.spins_ran_out() for launch in self.launches if isinstance(launch, CompiledStep))

    def writes_logits(self, model: Model) -> bool:
        """False where the plan fused argmax into lm_head, or runs the draft as a step launch: that
        model's logits are never written."""
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
        tiles; for a packed launch, its own unpacked weights): what a launch's verdict compares it with."""
        planned = self.schedule.launches[launch]
        call = lower_part(planned.parts[part], self._op_graph, self.bufs)
        return CompiledLaunch.alone(launch, call, self._kernels, num_warps=planned.num_warps,
                                    num_stages=planned.num_stages, stream=planned.stream)

    def feedback(self) -> tuple[LaunchFeedback, ...]:
        """Per launch: its kernel file, its parts with their programs and (GPU) the compiler's resource report."""
        return tuple(self._feedback(launch) for launch in self.launches)

    def _feedback(self, launch: CompiledLaunch) -> LaunchFeedback:
        planned = self.schedule.launches[launch.index].parts
        parts = tuple(PartRef.of(part, call.programs) for part, call in zip(planned, launch.parts))
        return LaunchFeedback(launch.index, launch.kernel_file, parts, launch.resources)


def _is_compile_failure(e: Exception) -> bool:
    module = type(e).__module__ or ""
    return module.startswith("triton") or "OutOfResources" in type(e).__name__


def round_key(plan: Plan, workload: Workload, device: torch.device, sampling: bool = False) -> str:
    """The kernel cache folder of a compiled round: its plan, workload, device and whether it samples
    (the draft's sample part in place of its argmax)."""
    body = {"plan": plan.hash, "workload": workload.to_dict(), "device": device_name(device)}
    body = json.dumps(body | ({"sampling": True} if sampling else {}), sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def compile_round(plan: Plan, workload: Workload, draft: ModelWeights | PreparedWeights,
                  target: ModelWeights | PreparedWeights, cache_dir: Path | None = None,
                  schedule: Schedule | None = None, graph: nx.DiGraph | None = None,
                  sampling: bool = False) -> CompiledRound:
    """Lower a plan for a workload over the given weights (PreparedWeights share re-layouts between plans);
    `graph`: the workload's op graph where the caller has built it already. `sampling`: the draft
    samples its tokens by its buffers' sampling rows (`bufs.draft.sampling`; greedy until set) and
    both models write their logits (the plan's lm_head+argmax fusion off: `keeping_logits`)."""
    draft = draft if isinstance(draft, PreparedWeights) else PreparedWeights(draft)
    target = target if isinstance(target, PreparedWeights) else PreparedWeights(target)
    graph = graph if graph is not None else build_graph(workload)
    plan = keeping_logits(plan) if sampling else plan
    schedule = schedule or expand(plan, workload, graph)
    if sampling and any(isinstance(launch.form, Step) for launch in schedule.launches):
        raise ValueError("sampling reads the draft's logits: the plan's step launch (draft.form \"step\") takes "
                         "the argmax in the kernel; sample with a plan of launches")
    if sampling and any(TOKENS_ONLY in "+".join(p.fused) for launch in schedule.launches for p in launch.parts):
        raise ValueError(f"sampling reads the logits: the schedule given fuses {TOKENS_ONLY}")
    bufs = RoundBuffers.allocate(workload, draft, target, sampling=sampling)
    directory = (cache_dir or default_cache_dir()) / round_key(plan, workload, bufs.target.cache.k.device, sampling)
    cache = KernelCache(directory)
    waits, device = cross_stream_waits(schedule.launches, graph), bufs.target.cache.k.device
    pdls = [launch_pdl(launch, waits, device) for launch in schedule.launches]
    launches = [_compile_launch(launch, graph, bufs, cache, pdl, schedule.sm_limits)
                for launch, pdl in zip(schedule.launches, pdls)]
    # the pdl trigger as compiled: none under the interpreter or after a cross-stream wait
    manifest = {"plan": plan.to_dict(), "workload": workload.name,
                "launches": [l.manifest(str(pdl)) for l, pdl in zip(launches, pdls)]}
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return CompiledRound(schedule, workload, bufs, launches, directory, graph, cache)
