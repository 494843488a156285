"""Lab experiment (not product code; nothing in conjugate/ imports it): a dependent chain of the draft
model's decode step as ONE persistent, warp-specialized Gluon kernel, to learn whether weights can
stream at close to copy bandwidth while activations wait on other programs.

The chain is the draft's MLP for B <= 16 rows (Llama-3.2-1B: H=2048, I=8192):

    h = silu(x @ Wg^T) * (x @ Wu^T)        stage 1: I / 64 tasks, one 64-column tile of h each
    y = h @ Wd^T                           stage 2: (H / 128) x S2 tasks, a 128-column tile of y over
                                           one S2-th of I (fp32 atomics add the partial sums)

Each program (one per SM, all co-resident) runs two partitions:

* the **loader** (1 warp) streams every weight tile the program will need, stage 1's then stage 2's,
  by TMA into a ring of shared-memory slots. It waits only for free slots, never on a dependency,
  so stage 2's weights are already arriving while stage 1 is still being finished elsewhere;
* the **compute** partition (one warpgroup) stages activations (x, then the h slice a stage-2 task
  reads) by cp.async into shared memory, runs swap-AB wgmma (W tile [rows, 64] x act^T [64, 16]),
  writes h and publishes each finished stage-1 tile on a per-slice counter (release); a stage-2 task
  first waits for its slice's counter (acquire) with a bounded spin: a wait that runs out records an
  error and goes on, so a wrong schedule is a failed check, never a hung GPU.

    python lab/stream_chain/chain.py --json OUT.json   # Hopper GPU: check, then time beside torch
    python lab/stream_chain/chain.py --offline         # no GPU: compile for sm_90a, read the PTX
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

ROWS_PER_SLOT = 128  # weight rows a ring slot holds: stage 1 puts 64 gate rows over 64 up rows
K_PER_SLOT = 64      # K per slot: 128 bytes of bf16, the TMA box's inner limit under 128-byte swizzle
BATCH_PAD = 16       # batch rows as the wgmma N dimension (B <= 16)
# The same, as the kernel sees them.
SLOT_ROWS = gl.constexpr(ROWS_PER_SLOT)
HALF = gl.constexpr(ROWS_PER_SLOT // 2)
BK = gl.constexpr(K_PER_SLOT)
BPAD = gl.constexpr(BATCH_PAD)
SMEM_BUDGET = 220 * 1024

# Draft MLPs (H, I) this probe runs.
MODELS = {"llama-3.2-1b": (2048, 8192), "llama-3.2-3b": (3072, 8192)}


# --------------------------------------------------------------------------------------------------
# The kernel, one concern per function
# --------------------------------------------------------------------------------------------------

@gluon.jit
def _slot(i, STAGES: gl.constexpr):
    """Ring position of the i-th weight tile: (slot, phase of that slot's barriers)."""
    return i % STAGES, (i // STAGES) & 1


@gluon.jit
def _fill_slot(ring, ready, empty, i, STAGES: gl.constexpr):
    """Wait until slot i is free, arm its ready barrier for a full slot's bytes; return the slot."""
    s, phase = _slot(i, STAGES)
    mbarrier.wait(empty.index(s), phase ^ 1)  # barriers start as if phase 1 had completed
    mbarrier.expect(ready.index(s), SLOT_ROWS * BK * 2)
    return s


@gluon.jit
def load_partition(w1_desc, w2_desc, ring, ready, empty, H: gl.constexpr, I: gl.constexpr, S2: gl.constexpr,
                   STAGES: gl.constexpr):
    """Stream this program's weight tiles, in the order the compute partition consumes them."""
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    i = 0
    for t in range(pid, I // HALF, programs):  # stage 1: gate rows over up rows in one slot
        for kk in range(H // BK):
            s = _fill_slot(ring, ready, empty, i, STAGES)
            slot = ring.index(s)
            tma.async_copy_global_to_shared(w1_desc, [t * HALF, kk * BK], ready.index(s), slot.slice(0, HALF))
            tma.async_copy_global_to_shared(w1_desc, [I + t * HALF, kk * BK], ready.index(s),
                                            slot.slice(HALF, HALF))
            i += 1
    NT2: gl.constexpr = H // SLOT_ROWS
    KR2: gl.constexpr = I // S2
    for t in range(pid, NT2 * S2, programs):  # stage 2: down-projection rows over one slice of I
        for kk in range(KR2 // BK):
            s = _fill_slot(ring, ready, empty, i, STAGES)
            tma.async_copy_global_to_shared(w2_desc, [(t % NT2) * SLOT_ROWS, (t // NT2) * KR2 + kk * BK],
                                            ready.index(s), ring.index(s))
            i += 1


@gluon.jit
def _stage_activations(act, src_ptr, row_stride, B, col0, n_tiles):
    """act[kk] = src[:B, col0 + kk*BK : +BK] for kk < n_tiles (rows past B zero), by cp.async through
    L2 (.cg: another program may have just written src), then made visible to wgmma."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    rows = gl.arange(0, BPAD, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, BK, layout=gl.SliceLayout(0, layout))
    mask = (rows < B)[:, None] & (cols < BK)[None, :]
    for kk in range(n_tiles):
        ptrs = src_ptr + rows[:, None] * row_stride + (col0 + kk * BK + cols)[None, :]
        async_copy.async_copy_global_to_shared(act.index(kk), ptrs, mask=mask, cache_modifier=".cg")
    async_copy.commit_group()
    async_copy.wait_group(0)
    fence_async_shared()
    gl.thread_barrier()


@gluon.jit
def _acquire(counter_ptr, target, error_ptr, spin_limit):
    """Wait (bounded) until counter >= target; on running out, count an error and go on."""
    seen = gl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    spins = 0
    while (seen < target) & (spins < spin_limit):
        seen = gl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
        spins += 1
    if seen < target:
        gl.atomic_add(error_ptr, 1, sem="relaxed", scope="gpu")
    gl.thread_barrier()


@gluon.jit
def _release(counter_ptr):
    """Publish this program's writes (every warp's, ordered by the barrier) to waiting programs."""
    gl.thread_barrier()
    gl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")


@gluon.jit
def _gate_up_tile(ring, ready, empty, act, i, H: gl.constexpr, STAGES: gl.constexpr, acc_layout: gl.constexpr):
    """(x @ Wg_tile^T, x @ Wu_tile^T) transposed: two [64, BPAD] fp32 accumulators over H / BK slots."""
    acc_g = gl.zeros((HALF, BPAD), dtype=gl.float32, layout=acc_layout)
    acc_u = gl.zeros((HALF, BPAD), dtype=gl.float32, layout=acc_layout)
    for kk in range(H // BK):
        s, phase = _slot(i, STAGES)
        mbarrier.wait(ready.index(s), phase)
        slot = ring.index(s)
        x_t = act.index(kk).permute((1, 0))
        acc_g = warpgroup_mma(slot.slice(0, HALF), x_t, acc_g, is_async=True)
        acc_u = warpgroup_mma(slot.slice(HALF, HALF), x_t, acc_u, is_async=True)
        acc_g, acc_u = warpgroup_mma_wait(num_outstanding=0, deps=(acc_g, acc_u))
        mbarrier.arrive(empty.index(s), count=1)
        i += 1
    return acc_g, acc_u, i


@gluon.jit
def _down_tile(ring, ready, empty, act, i, n_tiles, STAGES: gl.constexpr, acc_layout: gl.constexpr):
    """h_slice @ Wd_tile^T transposed: one [128, BPAD] fp32 accumulator over n_tiles slots."""
    acc = gl.zeros((SLOT_ROWS, BPAD), dtype=gl.float32, layout=acc_layout)
    for kk in range(n_tiles):
        s, phase = _slot(i, STAGES)
        mbarrier.wait(ready.index(s), phase)
        acc = warpgroup_mma(ring.index(s), act.index(kk).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(empty.index(s), count=1)
        i += 1
    return acc, i


@gluon.jit
def _store_h(h_ptr, acc_g, acc_u, col0, B, I: gl.constexpr):
    """h[b, col0 + r] = silu(g) * u, from the transposed accumulators (row r, column b)."""
    r = gl.arange(0, HALF, layout=gl.SliceLayout(1, acc_g.type.layout))
    b = gl.arange(0, BPAD, layout=gl.SliceLayout(0, acc_g.type.layout))
    h = acc_g / (1.0 + gl.exp(-acc_g)) * acc_u
    gl.store(h_ptr + b[None, :] * I + (col0 + r)[:, None], h.to(gl.bfloat16), mask=(b < B)[None, :])


@gluon.jit
def _add_y(y_ptr, acc, col0, B, H: gl.constexpr):
    """y[b, col0 + r] += acc[r, b] (fp32 atomics: S2 programs add into each tile)."""
    r = gl.arange(0, SLOT_ROWS, layout=gl.SliceLayout(1, acc.type.layout))
    b = gl.arange(0, BPAD, layout=gl.SliceLayout(0, acc.type.layout))
    gl.atomic_add(y_ptr + b[None, :] * H + (col0 + r)[:, None], acc, mask=(b < B)[None, :], sem="relaxed")


@gluon.jit
def compute_partition(ring, ready, empty, act, x_ptr, h_ptr, y_ptr, counter_ptr, error_ptr, B, spin_limit,
                      H: gl.constexpr, I: gl.constexpr, S2: gl.constexpr, STAGES: gl.constexpr):
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BPAD, 16])
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    KR2: gl.constexpr = I // S2
    NT2: gl.constexpr = H // SLOT_ROWS
    i = 0
    _stage_activations(act, x_ptr, H, B, 0, H // BK)
    for t in range(pid, I // HALF, programs):
        acc_g, acc_u, i = _gate_up_tile(ring, ready, empty, act, i, H, STAGES, acc_layout)
        _store_h(h_ptr, acc_g, acc_u, t * HALF, B, I)
        _release(counter_ptr + (t * HALF) // KR2)
    for t in range(pid, NT2 * S2, programs):
        ks = t // NT2
        _acquire(counter_ptr + ks, KR2 // HALF, error_ptr, spin_limit)
        _stage_activations(act, h_ptr, I, B, ks * KR2, KR2 // BK)
        acc, i = _down_tile(ring, ready, empty, act, i, KR2 // BK, STAGES, acc_layout)
        _add_y(y_ptr, acc, (t % NT2) * SLOT_ROWS, B, H)


@gluon.jit
def mlp_chain_kernel(w1_desc, w2_desc, x_ptr, h_ptr, y_ptr, counter_ptr, error_ptr, B, spin_limit,  #
                     H: gl.constexpr, I: gl.constexpr, S2: gl.constexpr, STAGES: gl.constexpr,
                     KT_MAX: gl.constexpr):
    """Persistent: grid <= SMs, every program co-resident. y (fp32) and the counters start at zero."""
    ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, SLOT_ROWS, BK], w2_desc.layout)
    act_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BPAD, BK], gl.bfloat16)
    act = gl.allocate_shared_memory(gl.bfloat16, [KT_MAX, BPAD, BK], act_layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    fence_async_shared()
    gl.warp_specialize([
        (compute_partition, (ring, ready, empty, act, x_ptr, h_ptr, y_ptr, counter_ptr, error_ptr, B, spin_limit,
                             H, I, S2, STAGES)),
        (load_partition, (w1_desc, w2_desc, ring, ready, empty, H, I, S2, STAGES)),
    ], [1], [40])


# --------------------------------------------------------------------------------------------------
# Host side: the schedule's checks, descriptors, launch
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Schedule:
    H: int
    I: int
    S2: int
    stages: int
    programs: int

    @property
    def kt_max(self) -> int:
        return max(self.H, self.I // self.S2) // K_PER_SLOT

    def shared_bytes(self) -> int:
        return self.stages * ROWS_PER_SLOT * K_PER_SLOT * 2 + self.kt_max * BATCH_PAD * K_PER_SLOT * 2 + self.stages * 16


def plan_schedule(H: int, I: int, sms: int, S2: int | None = None, stages: int | None = None) -> Schedule:
    """The chain's schedule, checked: tile divisibility, one program per SM at most (co-residency is
    what lets a stage-2 wait ever end), and the shared memory it needs."""
    if H % ROWS_PER_SLOT or I % (ROWS_PER_SLOT // 2):
        raise ValueError(f"H={H} must divide by {ROWS_PER_SLOT} and I={I} by {(ROWS_PER_SLOT // 2)}")
    stage1 = I // (ROWS_PER_SLOT // 2)
    if S2 is None:  # as many stage-2 tasks as stage-1 ones, K slices a whole number of 64-column tiles
        S2 = max((s for s in range(1, I // K_PER_SLOT + 1) if I % (s * K_PER_SLOT) == 0 and (H // ROWS_PER_SLOT) * s <= stage1),
                 default=1)
    if I % (S2 * K_PER_SLOT):
        raise ValueError(f"S2={S2} must split I={I} into whole {K_PER_SLOT}-column tiles")
    programs = min(sms, max(stage1, (H // ROWS_PER_SLOT) * S2))
    kt_max = max(H, I // S2) // K_PER_SLOT
    if stages is None:
        stages = min(16, (SMEM_BUDGET - kt_max * BATCH_PAD * K_PER_SLOT * 2) // (ROWS_PER_SLOT * K_PER_SLOT * 2 + 16))
    schedule = Schedule(H, I, S2, stages, programs)
    if stages < 2 or schedule.shared_bytes() > SMEM_BUDGET:
        raise ValueError(f"{schedule} needs {schedule.shared_bytes()} bytes of shared memory (budget "
                         f"{SMEM_BUDGET}) or has fewer than 2 slots")
    return schedule


def launch_args(x, w_gu, w_d, h, y, counters, error, schedule: Schedule, spin_limit: int):
    layout = gl.NVMMASharedLayout.get_default_for([(ROWS_PER_SLOT // 2), K_PER_SLOT], gl.bfloat16)
    w1_desc = TensorDescriptor.from_tensor(w_gu, [(ROWS_PER_SLOT // 2), K_PER_SLOT], layout)
    w2_desc = TensorDescriptor.from_tensor(w_d, [ROWS_PER_SLOT, K_PER_SLOT],
                                           gl.NVMMASharedLayout.get_default_for([ROWS_PER_SLOT, K_PER_SLOT], gl.bfloat16))
    args = (w1_desc, w2_desc, x, h, y, counters, error, x.shape[0], spin_limit)
    kwargs = dict(H=schedule.H, I=schedule.I, S2=schedule.S2, STAGES=schedule.stages, KT_MAX=schedule.kt_max,
                  num_warps=4, maxnreg=168)
    return (schedule.programs, ), args, kwargs


class Chain:
    """One MLP chain's buffers and launch: call() zeroes y and the counters, then runs the kernel."""

    def __init__(self, w_gu, w_d, B: int, schedule: Schedule, spin_limit: int = 1 << 20):
        dev = w_gu.device
        assert B <= BATCH_PAD, f"B={B} > {BATCH_PAD}"
        self.x = torch.zeros(B, schedule.H, device=dev, dtype=torch.bfloat16)
        self.h = torch.empty(B, schedule.I, device=dev, dtype=torch.bfloat16)
        self.y = torch.empty(B, schedule.H, device=dev, dtype=torch.float32)
        self.counters = torch.zeros(schedule.S2, device=dev, dtype=torch.int32)
        self.error = torch.zeros(1, device=dev, dtype=torch.int32)
        self.grid, self.args, self.kwargs = launch_args(self.x, w_gu, w_d, self.h, self.y, self.counters,
                                                        self.error, schedule, spin_limit)

    def __call__(self):
        self.y.zero_()
        self.counters.zero_()
        mlp_chain_kernel[self.grid](*self.args, **self.kwargs)
        return self.y


def torch_chain(x, w_gu, w_d):
    gu = x @ w_gu.T
    I = w_d.shape[1]
    return (torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]) @ w_d.T


def reference(x, w_gu, w_d):
    """fp32 math on the bf16 inputs, h rounded to bf16 as the kernel stores it."""
    I = w_d.shape[1]
    gu = x.float() @ w_gu.float().T
    h = (torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]).to(torch.bfloat16)
    return h.float() @ w_d.float().T


# --------------------------------------------------------------------------------------------------
# Measurement (GPU)
# --------------------------------------------------------------------------------------------------

def weights(H, I, dev):
    w_gu = torch.randn(2 * I, H, device=dev, dtype=torch.bfloat16) / H ** 0.5
    w_d = torch.randn(H, I, device=dev, dtype=torch.bfloat16) / I ** 0.5
    return w_gu, w_d


def graph_time_us(calls, replays: int = 15) -> float:
    """Median time of one call: every call in `calls` (each on its own weights, so nothing repeats
    out of L2) captured back to back in one CUDA graph, replayed; per-call = replay / len(calls)."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for fn in calls:
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for fn in calls:
            fn()
    times = []
    for _ in range(replays + 2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    times = sorted(times[2:])
    return times[len(times) // 2]


def copy_bandwidth() -> float:
    """Bytes/s of a device-to-device copy of 1 GiB (read + write counted), in a graph."""
    src = torch.empty(1 << 29, device="cuda", dtype=torch.float16)
    dst = torch.empty_like(src)
    us = graph_time_us([lambda: dst.copy_(src)])
    return 2 * src.numel() * 2 / (us * 1e-6)


def check(model, H, I, B, schedule) -> float:
    w_gu, w_d = weights(H, I, "cuda")
    chain = Chain(w_gu, w_d, B, schedule)
    chain.x.copy_(torch.randn(B, H, device="cuda", dtype=torch.bfloat16))
    chain.h.fill_(float("nan"))  # a stage-2 read before its stage-1 write shows up as NaN
    y = chain().clone()
    torch.cuda.synchronize()
    ref = reference(chain.x, w_gu, w_d)
    err = ((y - ref).abs().max() / ref.abs().max()).item()
    errors = int(chain.error.item())
    if errors or not err < 2e-2:
        raise SystemExit(f"{model} B={B} {schedule}: relative error {err}, {errors} waits ran out")
    return err


def run_gpu(args) -> int:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("error: needs a Hopper GPU (sm_90); use --offline without one", file=sys.stderr)
        return 2
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: {sms} SMs, copy {bw / 1e9:.0f} GB/s")
    print(f"{'model':<14}{'B':>3}  {'schedule':<24}{'err':>9}{'floor us':>10}{'chain us':>10}{'of floor':>9}"
          f"{'torch us':>10}{'of floor':>9}{'chain/torch':>12}")
    rows = []
    for model in args.models:
        H, I = MODELS[model]
        schedule = plan_schedule(H, I, sms, S2=args.s2, stages=args.stages)
        weight_bytes = (3 * H * I) * 2
        copies = max(2, -(-300_000_000 // weight_bytes))  # > 2x L2 in flight between repeats
        sets = [weights(H, I, "cuda") for _ in range(copies)]
        for B in args.batches:
            err = check(model, H, I, B, schedule)
            chains = [Chain(w_gu, w_d, B, schedule) for w_gu, w_d in sets]
            x = torch.randn(B, H, device="cuda", dtype=torch.bfloat16)
            for c in chains:
                c.x.copy_(x)
            chain_us = graph_time_us(chains)
            errors = sum(int(c.error.item()) for c in chains)
            torch_us = graph_time_us([lambda w=w: torch_chain(x, *w) for w in sets])
            floor_us = weight_bytes / bw * 1e6
            row = dict(model=model, H=H, I=I, B=B, schedule=asdict(schedule), rel_err=err, waits_ran_out=errors,
                       floor_us=floor_us, chain_us=chain_us, torch_us=torch_us)
            rows.append(row)
            sched = f"S2={schedule.S2} st={schedule.stages} P={schedule.programs}"
            print(f"{model:<14}{B:>3}  {sched:<24}{err:>9.1e}{floor_us:>10.1f}{chain_us:>10.1f}"
                  f"{chain_us / floor_us:>9.2f}{torch_us:>10.1f}{torch_us / floor_us:>9.2f}"
                  f"{chain_us / torch_us:>12.2f}" + (f"  ({errors} waits ran out)" if errors else ""), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(dict(
            gpu=torch.cuda.get_device_name(), sms=sms, copy_gbs=bw / 1e9,
            command=" ".join([Path(sys.executable).name] + sys.argv), triton=triton.__version__,
            torch=torch.__version__, cuda=torch.version.cuda, rows=rows), indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


# --------------------------------------------------------------------------------------------------
# Offline compile (no GPU)
# --------------------------------------------------------------------------------------------------

def compile_offline(H: int, I: int, schedule: Schedule, B: int = 8):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    w_gu, w_d = torch.empty(2 * I, H, dtype=torch.bfloat16), torch.empty(H, I, dtype=torch.bfloat16)
    x, h = torch.empty(B, H, dtype=torch.bfloat16), torch.empty(B, I, dtype=torch.bfloat16)
    y = torch.empty(B, H, dtype=torch.float32)
    counters, error = torch.empty(schedule.S2, dtype=torch.int32), torch.empty(1, dtype=torch.int32)
    _, args, kwargs = launch_args(x, w_gu, w_d, h, y, counters, error, schedule, 1 << 20)
    kernel = mlp_chain_kernel
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*args, **{**kwargs, "debug": False})
    options, signature, constexprs, attrs = kernel._pack_args(backend, {**kwargs, "debug": False}, bound,
                                                              specialization, options)
    return triton.compile(GluonASTSource(kernel, signature, constexprs, attrs), target=target,
                          options=options.__dict__)


def run_offline(args) -> int:
    print(f"triton {triton.__version__}: mlp_chain_kernel for cuda:90 (sm_90a), no GPU")
    for model in args.models:
        H, I = MODELS[model]
        schedule = plan_schedule(H, I, 132, S2=args.s2, stages=args.stages)
        compiled = compile_offline(H, I, schedule)
        ptx = compiled.asm["ptx"]
        found = {name: pattern in ptx for name, pattern in (
            ("wgmma", "wgmma.mma_async"), ("tma", "cp.async.bulk.tensor"), ("cp.async", "cp.async.cg"),
            ("mbarrier", "mbarrier.try_wait"), ("acquire", "acquire.gpu"), ("release", "release.gpu"),
            ("setmaxnreg", "setmaxnreg"))}
        sm = re.search(r"^\.target\s+(\S+)", ptx, re.M).group(1)
        print(f"{model}: {schedule}, shared {compiled.metadata.shared} B, target {sm}, "
              + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in found.items()))
        if args.dump_ptx:
            Path(args.dump_ptx).mkdir(parents=True, exist_ok=True)
            (Path(args.dump_ptx) / f"{model}.ptx").write_text(ptx)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="The draft MLP as one persistent warp-specialized Gluon kernel "
                                                 "(weights stream while activations wait), against torch.")
    parser.add_argument("--json")
    parser.add_argument("--offline", action="store_true")
    parser.add_argument("--dump-ptx")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 4, 8, 16])
    parser.add_argument("--s2", type=int, default=None, help="K slices of the down projection")
    parser.add_argument("--stages", type=int, default=None, help="ring slots (default: fill shared memory)")
    args = parser.parse_args(argv)
    return run_offline(args) if args.offline else run_gpu(args)


if __name__ == "__main__":
    if "--offline" in sys.argv:
        os.environ.setdefault("TRITON_INTERPRET", "0")
    sys.exit(main())
