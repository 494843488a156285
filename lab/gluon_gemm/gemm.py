"""Lab experiment (not product code; nothing in conjugate/ imports it): a Gluon GEMM for the target
model's verify-phase projections at 64-128 rows on Hopper.

    out[M, N] = x[M, K] @ W[N, K]^T      x, W bf16; fp32 accumulation; bf16 or fp32 output

At M <= 128 the GEMM is bandwidth-bound on an H200, so the kernel's one job is to stream W once at
near copy bandwidth:

* one program owns BLOCK_M (64 or 128, covering all M rows) x BLOCK_N output columns and a slice of K;
* x and W tiles arrive by TMA into a STAGES-deep shared-memory ring, each slot completed on its own
  mbarrier (expect-tx bytes);
* wgmma (warpgroup MMA, asynchronous) reads both operands from shared memory and accumulates fp32 in
  registers; one wgmma is kept in flight, so the slot it frees is refilled while the next one runs;
* where N / BLOCK_N gives fewer programs than the GPU has SMs, K is split over SPLIT_K programs per
  column block and the partial sums are added into an fp32 output with atomics.

    python lab/gluon_gemm/gemm.py --json OUT.json    # on a Hopper GPU: check, time, table, JSON
    python lab/gluon_gemm/gemm.py --offline          # no GPU: compile every shape for sm_90a, read the PTX
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

H200_SMS = 132
COPY_BANDWIDTH = 4.3e12  # bytes/s: the H200's measured device-to-device copy rate the table compares against

# Llama-3.1-8B projections (N, K) and the verify-phase row counts.
SHAPES = {"qkv": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
ROWS = (64, 96, 128)


# --------------------------------------------------------------------------------------------------
# The kernel, one concern per function
# --------------------------------------------------------------------------------------------------

@gluon.jit
def _issue_tile_load(x_desc, w_desc, x_ring, w_ring, ready, slot, k_tile, off_n, BLOCK_K: gl.constexpr):
    """Start the TMA copies of x[:, k] and W[off_n:, k] into ring slot `slot`; its barrier completes
    when both tiles' bytes have landed."""
    bar = ready.index(slot)
    mbarrier.expect(bar, x_desc.block_type.nbytes + w_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(x_desc, [0, k_tile * BLOCK_K], bar, x_ring.index(slot))
    tma.async_copy_global_to_shared(w_desc, [off_n, k_tile * BLOCK_K], bar, w_ring.index(slot))


@gluon.jit
def _ring(x_desc, w_desc, STAGES: gl.constexpr):
    """The ring: STAGES slots of an x tile and a W tile, and one barrier per slot, initialised."""
    x_ring = gl.allocate_shared_memory(x_desc.dtype, [STAGES] + x_desc.block_type.shape, x_desc.layout)
    w_ring = gl.allocate_shared_memory(w_desc.dtype, [STAGES] + w_desc.block_type.shape, w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
    fence_async_shared()  # barrier inits visible to the async proxy (TMA) before the first copy
    return x_ring, w_ring, ready


@gluon.jit
def _k_range(K, pid_k, BLOCK_K: gl.constexpr, SPLIT_K: gl.constexpr):
    """This program's K tiles [first, last): the K tiles dealt as evenly as possible over SPLIT_K."""
    k_tiles = gl.cdiv(K, BLOCK_K)
    first = pid_k * k_tiles // SPLIT_K
    last = (pid_k + 1) * k_tiles // SPLIT_K
    return first, last


@gluon.jit
def _columns_and_k_range(x_desc, w_desc, K, SPLIT_K: gl.constexpr):
    """Program (n, k) of grid (cdiv(N, BLOCK_N), SPLIT_K): (its first output column, its K tiles [first, last))."""
    first, last = _k_range(K, gl.program_id(1), x_desc.block_type.shape[1], SPLIT_K)
    return gl.program_id(0) * w_desc.block_type.shape[0], first, last


@gluon.jit
def _mainloop(x_desc, w_desc, x_ring, w_ring, ready, acc, first, last, off_n,
              BLOCK_K: gl.constexpr, STAGES: gl.constexpr):
    """acc += x[:, first:last] @ W[off_n:, first:last]^T over the ring: STAGES - 1 tile loads ahead of
    the MMA, one wgmma in flight. Returns the finished accumulator."""
    n_tiles = last - first
    # Prologue: fill all but one slot (fewer when this program has fewer tiles).
    for i in gl.static_range(STAGES - 1):
        if i < n_tiles:
            _issue_tile_load(x_desc, w_desc, x_ring, w_ring, ready, i, first + i, off_n, BLOCK_K)

    for i in range(n_tiles):
        slot = i % STAGES
        mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
        # W is stored [N, K]: the transposed view of its tile is the [K, N] operand wgmma wants.
        x_tile, w_tile = x_ring.index(slot), w_ring.index(slot)
        acc = warpgroup_mma(x_tile, w_tile.permute((1, 0)), acc, is_async=True)
        # Keep this wgmma in flight (its tiles stay live through the wait); the previous one is now
        # done, so its slot may be refilled.
        acc, x_tile, w_tile = warpgroup_mma_wait(num_outstanding=1, deps=(acc, x_tile, w_tile))
        refill = i + STAGES - 1
        if refill < n_tiles:
            _issue_tile_load(x_desc, w_desc, x_ring, w_ring, ready, refill % STAGES, first + refill, off_n,
                             BLOCK_K)
    return warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))


@gluon.jit
def _store_tile(out_ptr, acc, M, N, stride_om, off_n, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                SPLIT_K: gl.constexpr):
    """Write the accumulator's valid rows (M may be less than BLOCK_M): a plain store cast to out's
    dtype, or, when K is split, an fp32 atomic add of this program's partial sum."""
    rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc.type.layout))
    cols = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, acc.type.layout))
    offsets = rows[:, None] * stride_om + cols[None, :]
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    if SPLIT_K == 1:
        gl.store(out_ptr + offsets, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        gl.atomic_add(out_ptr + offsets, acc, mask=mask, sem="relaxed")


@gluon.jit
def gemm_kernel(x_desc, w_desc, out_ptr, M, N, K, stride_om,  #
                SPLIT_K: gl.constexpr, STAGES: gl.constexpr, INSTR_N: gl.constexpr, num_warps: gl.constexpr):
    """Grid (cdiv(N, BLOCK_N), SPLIT_K): program (n, k) owns out[:, n*BLOCK_N:(n+1)*BLOCK_N] and the
    k-th share of K. All M rows (<= BLOCK_M) are one tile; rows past M are TMA's zero fill."""
    BLOCK_M: gl.constexpr = x_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = w_desc.block_type.shape[0]
    off_n, first, last = _columns_and_k_range(x_desc, w_desc, K, SPLIT_K)
    x_ring, w_ring, ready = _ring(x_desc, w_desc, STAGES)

    # wgmma accumulator: four warps stacked along M (one warpgroup), instruction [16, INSTR_N, 16].
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, INSTR_N, 16])
    acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=acc_layout)
    acc = _mainloop(x_desc, w_desc, x_ring, w_ring, ready, acc, first, last, off_n, BLOCK_K, STAGES)

    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))
    _store_tile(out_ptr, acc, M, N, stride_om, off_n, BLOCK_M, BLOCK_N, SPLIT_K)


@gluon.jit
def _add_partial(out_ptr, acc, M, N, stride_om, off_n, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """Add one partial sum of a column block into the fp32 out (zeroed before the launch)."""
    rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc.type.layout))
    cols = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, acc.type.layout))
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    gl.atomic_add(out_ptr + rows[:, None] * stride_om + cols[None, :], acc, mask=mask, sem="relaxed")


@gluon.jit
def gemm_stream_k_kernel(x_desc, w_desc, out_ptr, M, N, K, stride_om,  #
                         STAGES: gl.constexpr, INSTR_N: gl.constexpr, num_warps: gl.constexpr):
    """Persistent, one program per SM. The (column block, K tile) steps, column block major, are cut
    into one equal contiguous range per program, so every SM streams the same bytes whatever the
    number of column blocks (no partial wave). The ring runs across column blocks without draining;
    where a program's range leaves a column block, its partial sum is added into the fp32 out."""
    BLOCK_M: gl.constexpr = x_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = w_desc.block_type.shape[0]
    k_tiles = gl.cdiv(K, BLOCK_K)
    total = gl.cdiv(N, BLOCK_N) * k_tiles
    lo = gl.program_id(0) * total // gl.num_programs(0)
    steps = (gl.program_id(0) + 1) * total // gl.num_programs(0) - lo

    x_ring, w_ring, ready = _ring(x_desc, w_desc, STAGES)

    for i in gl.static_range(STAGES - 1):
        if i < steps:
            step = lo + i
            _issue_tile_load(x_desc, w_desc, x_ring, w_ring, ready, i, step % k_tiles, step // k_tiles * BLOCK_N,
                             BLOCK_K)
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, INSTR_N, 16])
    acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=acc_layout)
    for i in range(steps):
        step = lo + i
        slot = i % STAGES
        mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
        x_tile, w_tile = x_ring.index(slot), w_ring.index(slot)
        acc = warpgroup_mma(x_tile, w_tile.permute((1, 0)), acc, is_async=True)
        acc, x_tile, w_tile = warpgroup_mma_wait(num_outstanding=1, deps=(acc, x_tile, w_tile))
        refill = i + STAGES - 1
        if refill < steps:
            ahead = lo + refill
            _issue_tile_load(x_desc, w_desc, x_ring, w_ring, ready, refill % STAGES, ahead % k_tiles,
                             ahead // k_tiles * BLOCK_N, BLOCK_K)
        if (step % k_tiles == k_tiles - 1) | (i == steps - 1):  # the range leaves this column block
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
            _add_partial(out_ptr, acc, M, N, stride_om, step // k_tiles * BLOCK_N, BLOCK_M, BLOCK_N)
            acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=acc_layout)
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))


@gluon.jit
def _ws_loader(x_desc, w_desc, x_ring, w_ring, ready, empty, first, last, off_n, BLOCK_K: gl.constexpr,
               STAGES: gl.constexpr):
    """The loader warp: every tile of [first, last) into the ring, waiting only for a free slot."""
    for i in range(last - first):
        slot = i % STAGES
        mbarrier.wait(empty.index(slot), ((i // STAGES) & 1) ^ 1)
        _issue_tile_load(x_desc, w_desc, x_ring, w_ring, ready, slot, first + i, off_n, BLOCK_K)


@gluon.jit
def _ws_compute(x_ring, w_ring, ready, empty, out_ptr, M, N, stride_om, first, last, off_n,
                BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, SPLIT_K: gl.constexpr, STAGES: gl.constexpr,
                INSTR_N: gl.constexpr, WARPS: gl.constexpr):
    """The MMA warpgroup: one wgmma in flight; a slot goes back to the loader once the wgmma that
    read it has retired."""
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                         instr_shape=[16, INSTR_N, 16])
    acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=acc_layout)
    for i in range(last - first):
        slot = i % STAGES
        mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
        acc = warpgroup_mma(x_ring.index(slot), w_ring.index(slot).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
        if i > 0:
            mbarrier.arrive(empty.index((i - 1) % STAGES), count=1)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    _store_tile(out_ptr, acc, M, N, stride_om, off_n, BLOCK_M, BLOCK_N, SPLIT_K)


@gluon.jit
def gemm_ws_kernel(x_desc, w_desc, out_ptr, M, N, K, stride_om,  #
                   SPLIT_K: gl.constexpr, STAGES: gl.constexpr, INSTR_N: gl.constexpr, num_warps: gl.constexpr):
    """gemm_kernel's grid and tiles, warp-specialized: a 1-warp loader keeps the ring full while the
    warpgroup multiplies, so the loads in flight never wait on an MMA."""
    TILE_M: gl.constexpr = x_desc.block_type.shape[0]  # constexprs, for the partitions' arguments
    TILE_N: gl.constexpr = w_desc.block_type.shape[0]
    TILE_K: gl.constexpr = x_desc.block_type.shape[1]
    off_n, first, last = _columns_and_k_range(x_desc, w_desc, K, SPLIT_K)
    x_ring, w_ring, ready = _ring(x_desc, w_desc, STAGES)
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(empty.index(s), count=1)
    fence_async_shared()
    gl.warp_specialize([
        (_ws_compute, (x_ring, w_ring, ready, empty, out_ptr, M, N, stride_om, first, last, off_n,
                       TILE_M, TILE_N, SPLIT_K, STAGES, INSTR_N, num_warps)),
        (_ws_loader, (x_desc, w_desc, x_ring, w_ring, ready, empty, first, last, off_n, TILE_K, STAGES)),
    ], [1], [40])


# --------------------------------------------------------------------------------------------------
# Host side: tile choice, descriptors, launch
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Config:
    block_m: int
    block_n: int
    block_k: int
    stages: int
    split_k: int  # 0: the stream-K kernel
    num_warps: int = 4
    warp_specialized: bool = False  # gemm_ws_kernel (a loader warp) instead of gemm_kernel

    def shared_bytes(self) -> int:
        return self.stages * (self.block_m + self.block_n) * self.block_k * 2


def choose_config(M: int, N: int, K: int, block_n: int = 128, block_k: int = 64, stages: int | None = None,
                  split_k: int | None = None, warps_128: int = 4) -> Config:
    """All M rows in one tile (64 or 128); K split so the column blocks times the split fill the SMs
    at most once (never more than a wave: a second partial wave would cost a full K slice's time)."""
    assert M <= 128, "the verify-phase kernel keeps all rows in one tile"
    block_m = 64 if M <= 64 else 128
    n_blocks = triton.cdiv(N, block_n)
    k_tiles = triton.cdiv(K, block_k)
    if split_k is None:
        split_k = max(1, min(H200_SMS // n_blocks, k_tiles))
    if stages is None:
        # As deep as ~200 KB of shared memory allows (Hopper gives a program 227 KB), one program an
        # SM; where there are more column blocks than SMs (gate_up), half that, so two programs share
        # an SM and the grid is one wave, not 1.7.
        budget = 200 * 1024 if n_blocks * split_k <= H200_SMS else 100 * 1024
        stages = max(2, min(8, budget // ((block_m + block_n) * block_k * 2)))
    # 8 warps on a 128-row tile: two warpgroups, 64 rows each, so a 128 x 256 accumulator is 128
    # registers a thread instead of 256
    return Config(block_m, block_n, block_k, stages, split_k, num_warps=warps_128 if block_m == 128 else 4)


def instr_n(cfg: Config) -> int:
    """The widest wgmma N (a multiple of 8, <= 256) dividing BLOCK_N that one warpgroup can cover."""
    n = min(256, cfg.block_n)
    while cfg.block_n % n:
        n -= 8
    return n


def descriptors(x: torch.Tensor, w: torch.Tensor, cfg: Config):
    x_layout = gl.NVMMASharedLayout.get_default_for([cfg.block_m, cfg.block_k], gl.bfloat16)
    w_layout = gl.NVMMASharedLayout.get_default_for([cfg.block_n, cfg.block_k], gl.bfloat16)
    return (TensorDescriptor.from_tensor(x, [cfg.block_m, cfg.block_k], x_layout),
            TensorDescriptor.from_tensor(w, [cfg.block_n, cfg.block_k], w_layout))


def launch_args(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, cfg: Config):
    """(grid, positional args, keyword args) of gemm_kernel for these tensors."""
    M, K = x.shape
    N = w.shape[0]
    x_desc, w_desc = descriptors(x, w, cfg)
    grid = (triton.cdiv(N, cfg.block_n), cfg.split_k)
    args = (x_desc, w_desc, out, M, N, K, out.stride(0))
    kwargs = dict(SPLIT_K=cfg.split_k, STAGES=cfg.stages, INSTR_N=instr_n(cfg), num_warps=cfg.num_warps)
    return grid, args, kwargs


def stream_k_config(M: int, N: int, K: int, block_n: int = 128, block_k: int = 64) -> Config:
    """All M rows in one tile, one program per SM (split_k 0 marks the stream-K form), the ring as deep
    as ~200 KB allows."""
    block_m = 64 if M <= 64 else 128
    return Config(block_m, block_n, block_k, max(2, min(8, 200 * 1024 // ((block_m + block_n) * block_k * 2))), 0)


def stream_k_launch(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, cfg: Config, sms: int):
    """(grid, positional args, keyword args) of gemm_stream_k_kernel: out must be fp32, zeroed first."""
    M, K = x.shape
    x_desc, w_desc = descriptors(x, w, cfg)
    args = (x_desc, w_desc, out, M, w.shape[0], K, out.stride(0))
    return (sms, ), args, dict(STAGES=cfg.stages, INSTR_N=instr_n(cfg), num_warps=cfg.num_warps)


def kernel_launch(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, cfg: Config, sms: int = H200_SMS):
    """(kernel, grid, positional args, keyword args) of cfg's form for these tensors."""
    if cfg.split_k == 0:
        return (gemm_stream_k_kernel, ) + stream_k_launch(x, w, out, cfg, sms)
    return (gemm_ws_kernel if cfg.warp_specialized else gemm_kernel, ) + launch_args(x, w, out, cfg)


def gemm(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, cfg: Config) -> torch.Tensor:
    """out = x @ w.T. With cfg.split_k != 1 (0: stream-K), out must be fp32 (partials are added
    atomically); it is zeroed here, and that memset is part of what is timed."""
    assert x.dtype == w.dtype == torch.bfloat16 and x.is_contiguous() and w.is_contiguous()
    assert cfg.split_k == 1 or out.dtype == torch.float32, "split-K and stream-K add fp32 partials: out must be fp32"
    if cfg.split_k != 1:
        out.zero_()
    kernel, grid, args, kwargs = kernel_launch(x, w, out, cfg, torch.cuda.get_device_properties(x.device).multi_processor_count)
    kernel[grid](*args, **kwargs)
    return out


# --------------------------------------------------------------------------------------------------
# Measurement (GPU)
# --------------------------------------------------------------------------------------------------

def traffic_bytes(M: int, N: int, K: int, out_dtype: torch.dtype) -> int:
    """W + x + out, each once."""
    return N * K * 2 + M * K * 2 + M * N * torch.empty((), dtype=out_dtype).element_size()


def check(name: str, M: int, N: int, K: int, cfg: Config, out_dtype: torch.dtype) -> float:
    """Relative error (max |out - ref| / max |ref|) against an fp32 torch reference, fresh inputs,
    output poisoned with NaN first (a tile never written shows up)."""
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
    out = torch.full((M, N), float("nan"), device="cuda", dtype=out_dtype)
    gemm(x, w, out, cfg)
    torch.cuda.synchronize()
    ref = x.float() @ w.float().T
    err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
    if not err < 1e-2:  # NaN fails too
        raise SystemExit(f"{name} M={M}: relative error {err} (>= 1e-2 or NaN) with {cfg}")
    return err


def time_us(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3


def graph_time_us(calls, replays: int = 15) -> float:
    """Median per-call time of `calls` (each on its own weights, together over 2x L2) captured back to
    back in one CUDA graph: no host launch cost, no descriptor building, as in a compiled round."""
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
    return sorted(times[2:])[replays // 2]


def graph_pair_us(M: int, N: int, K: int, cfg: Config, out_dtype) -> tuple[float, float]:
    """(this kernel, torch.mm) per call in CUDA graphs over rotating weight copies."""
    copies = max(2, -(-200_000_000 // (N * K * 2)))
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    outs = [torch.empty(M, N, device="cuda", dtype=out_dtype) for _ in ws]
    ref_outs = [torch.empty(M, N, device="cuda", dtype=torch.bfloat16) for _ in ws]
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    launches = []
    for w, out in zip(ws, outs):  # descriptors built once, outside the graph
        kernel, grid, args, kwargs = kernel_launch(x, w, out, cfg, sms)
        launches.append(lambda out=out, grid=grid, args=args, kwargs=kwargs, kernel=kernel: (
            out.zero_() if cfg.split_k != 1 else None, kernel[grid](*args, **kwargs)))
    ours = graph_time_us(launches)
    theirs = graph_time_us([lambda w=w, o=o: torch.mm(x, w.T, out=o) for w, o in zip(ws, ref_outs)])
    return ours, theirs


def measure(name: str, M: int, N: int, K: int, cfg: Config, args) -> dict:
    """Check one shape's kernel, time it beside torch.mm, print its row; the row."""
    out_dtype = torch.float32 if cfg.split_k != 1 or args.fp32_out else torch.bfloat16
    err = check(name, M, N, K, cfg, out_dtype)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(M, N, device="cuda", dtype=out_dtype)
    ref_out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    if args.graph:
        us, torch_us = graph_pair_us(M, N, K, cfg, out_dtype)
    else:
        us = time_us(lambda: gemm(x, w, out, cfg))
        torch_us = time_us(lambda: torch.mm(x, w.T, out=ref_out))
    nbytes, torch_bytes = traffic_bytes(M, N, K, out_dtype), traffic_bytes(M, N, K, torch.bfloat16)
    gbs, torch_gbs = nbytes / us * 1e-3, torch_bytes / torch_us * 1e-3
    row = dict(shape=name, M=M, N=N, K=K, config=cfg.__dict__, out_dtype=str(out_dtype), rel_err=err,
               us=us, gbps=gbs, frac=gbs * 1e9 / COPY_BANDWIDTH, torch_us=torch_us, torch_gbps=torch_gbs,
               torch_frac=torch_gbs * 1e9 / COPY_BANDWIDTH, floor_us=nbytes / COPY_BANDWIDTH * 1e6)
    cfg_s = (f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k} s{cfg.stages} k{cfg.split_k} w{cfg.num_warps}"
             f"{' ws' if cfg.warp_specialized else ''}")
    print(f"{name:<9}{M:>5}{N:>7}{K:>7}  {cfg_s:<22}{str(out_dtype)[6:]:>5}{err:>10.2e}"
          f"{us:>10.1f}{gbs:>8.0f}{row['frac']:>6.2f}{torch_us:>10.1f}{torch_gbs:>8.0f}"
          f"{row['torch_frac']:>6.2f}", flush=True)
    return row


def run_gpu(args) -> int:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("error: needs a Hopper GPU (sm_90); use --offline on a machine without one", file=sys.stderr)
        return 2
    rows = []
    header = (f"{'shape':<9}{'M':>5}{'N':>7}{'K':>7}  {'config':<22}{'out':>5}{'err':>10}"
              f"{'gluon us':>10}{'GB/s':>8}{'frac':>6}{'torch us':>10}{'GB/s':>8}{'frac':>6}")
    print(header)
    for name, (N, K) in SHAPES.items():
        for M in ROWS:
            configs = [choose_config(M, N, K, block_n=args.block_n, block_k=args.block_k, stages=args.stages, split_k=args.split_k,
                                     warps_128=args.warps_128)]
            if args.stream_k:
                configs.append(stream_k_config(M, N, K, block_n=args.block_n, block_k=args.block_k))
            if args.ws:
                configs.append(replace(configs[0], warp_specialized=True))
            for cfg in configs:
                rows.append(measure(name, M, N, K, cfg, args))
    if args.json:
        Path(args.json).write_text(json.dumps(dict(
            gpu=torch.cuda.get_device_name(), command=" ".join([sys.executable] + sys.argv),
            triton=triton.__version__, torch=torch.__version__, cuda=torch.version.cuda,
            copy_bandwidth=COPY_BANDWIDTH, timing="cuda graph" if args.graph else "do_bench", rows=rows), indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


# --------------------------------------------------------------------------------------------------
# Offline compile (no GPU): Triton's compiler and bundled ptxas for sm_90a
# --------------------------------------------------------------------------------------------------

def compile_offline(M: int, N: int, K: int, cfg: Config, arch: int = 90):
    """gemm_kernel compiled for GPUTarget('cuda', arch, 32) from CPU tensors of the right shapes (the
    binder only reads dtypes, shapes, strides and alignment). Returns the CompiledKernel."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    out_dtype = torch.float32 if cfg.split_k != 1 else torch.bfloat16
    x = torch.empty(M, K, dtype=torch.bfloat16)
    w = torch.empty(N, K, dtype=torch.bfloat16)
    out = torch.empty(M, N, dtype=out_dtype)
    kernel, _, args, kwargs = kernel_launch(x, w, out, cfg)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    kwargs = {**kwargs, "debug": False}
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    source = GluonASTSource(kernel, signature, constexprs, attrs)
    return triton.compile(source, target=target, options=options.__dict__)


def resources(compiled) -> tuple[int, int]:
    """(registers, local bytes) from the bundled cuobjdump."""
    from triton import knobs
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        usage = subprocess.run([knobs.nvidia.cuobjdump.path, "--dump-resource-usage", str(cubin)],
                               capture_output=True, text=True, check=True).stdout
    return tuple(int(re.search(rf"\b{f}:(\d+)", usage).group(1)) for f in ("REG", "LOCAL"))


def run_offline(args) -> int:
    print(f"triton {triton.__version__}, torch {torch.__version__}: gemm_kernel compiled for cuda:90 (sm_90a), "
          f"no GPU")
    print(f"{'shape':<9}{'M':>5}{'N':>7}{'K':>7}  {'config':<22}{'grid':>9}{'target':>8}{'wgmma':>7}{'TMA':>5}"
          f"{'mbar':>6}{'regs':>6}{'local':>6}{'shared':>8}  floor us @4.3TB/s")
    failed = 0
    for name, (N, K) in SHAPES.items():
        for M, cfg in ((M, cfg) for M in ROWS for cfg in [
                choose_config(M, N, K, block_n=args.block_n, block_k=args.block_k, stages=args.stages, split_k=args.split_k,
                                     warps_128=args.warps_128)]
                + ([stream_k_config(M, N, K, block_n=args.block_n, block_k=args.block_k)] if args.stream_k else [])
                + ([replace(choose_config(M, N, K, block_n=args.block_n, block_k=args.block_k, stages=args.stages, split_k=args.split_k,
                                     warps_128=args.warps_128),
                            warp_specialized=True)] if args.ws else [])):
            cfg_s = f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k} s{cfg.stages} k{cfg.split_k}{' ws' if cfg.warp_specialized else ''}"
            grid = f"{triton.cdiv(N, cfg.block_n)}x{cfg.split_k}" if cfg.split_k else f"{H200_SMS} (stream-K)"
            try:
                compiled = compile_offline(M, N, K, cfg)
            except Exception as e:  # report and go on: one line per failing shape
                inner = e
                while inner.__cause__ is not None:
                    inner = inner.__cause__
                lines = [ln for ln in str(inner).splitlines() if ln.strip(" ^")] or [repr(inner)]
                print(f"{name:<9}{M:>5}{N:>7}{K:>7}  {cfg_s:<22}{grid:>9}  FAILED: {type(e).__name__}: {lines[-1]}")
                failed += 1
                continue
            ptx = compiled.asm["ptx"]
            sm = re.search(r"^\.target\s+(\S+)", ptx, re.M).group(1)
            has_wgmma = "wgmma.mma_async" in ptx
            has_tma = "cp.async.bulk.tensor" in ptx
            has_mbar = "mbarrier.try_wait" in ptx or "mbarrier.wait" in ptx
            regs, local = resources(compiled)
            floor = traffic_bytes(M, N, K, torch.float32 if cfg.split_k != 1 else torch.bfloat16) / COPY_BANDWIDTH
            print(f"{name:<9}{M:>5}{N:>7}{K:>7}  {cfg_s:<22}{grid:>9}{sm:>8}{'yes' if has_wgmma else 'NO':>7}"
                  f"{'yes' if has_tma else 'NO':>5}{'yes' if has_mbar else 'NO':>6}{regs:>6}{local:>6}"
                  f"{compiled.metadata.shared:>8}  {floor * 1e6:.1f}", flush=True)
            if args.dump_ptx and M == ROWS[0]:
                Path(args.dump_ptx).mkdir(parents=True, exist_ok=True)
                (Path(args.dump_ptx) / f"{name}_M{M}.ptx").write_text(ptx)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Gluon (TMA + mbarrier ring + wgmma) GEMM for Llama-3.1-8B "
                                                 "verify-phase projections at 64-128 rows, against torch.mm.")
    parser.add_argument("--json", help="write the measured table here (GPU mode)")
    parser.add_argument("--offline", action="store_true", help="compile for sm_90a without a GPU and read the PTX")
    parser.add_argument("--dump-ptx", help="offline: write each shape's PTX (M=64) into this folder")
    parser.add_argument("--block-n", type=int, default=128)
    parser.add_argument("--block-k", type=int, default=64)
    parser.add_argument("--stages", type=int, default=None, help="ring depth (default: fill ~200 KB)")
    parser.add_argument("--split-k", type=int, default=None, help="default: SMs // column blocks, at least 1")
    parser.add_argument("--warps-128", type=int, default=4, choices=(4, 8),
                        help="warps of a 128-row tile (8: two warpgroups of 64 rows)")
    parser.add_argument("--fp32-out", action="store_true", help="fp32 output even without split-K")
    parser.add_argument("--ws", action="store_true",
                        help="also the warp-specialized kernel (a loader warp), each shape in the same process")
    parser.add_argument("--stream-k", action="store_true",
                        help="also the persistent stream-K kernel, each shape in the same process")
    parser.add_argument("--graph", action="store_true",
                        help="time in CUDA graphs over rotating weight copies (default: do_bench, one launch)")
    args = parser.parse_args(argv)
    return run_offline(args) if args.offline else run_gpu(args)


if __name__ == "__main__":
    if "--offline" in sys.argv:
        os.environ.setdefault("TRITON_INTERPRET", "0")
    sys.exit(main())
