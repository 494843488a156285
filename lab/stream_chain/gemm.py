"""Lab experiment (not product code): the streaming of chain.py for one verify-phase GEMM, #49's shapes.

    y[M, N] = x[M, K] @ W[N, K]^T      M <= 128 rows (B x (k+1)), bf16 in, fp32 out

The GEMM is bandwidth-bound at these rows: what counts is streaming W once at copy speed. It is
chain.py's machinery, with the work dealt stream-K style:

* the N x K iteration space (128-row W tiles x 64-column K steps) is cut into one equal, contiguous
  range per program, one program per SM. Every SM streams the same number of bytes whatever N / 128
  is: gate_up's 224 tiles do not fall into 1.7 waves, and qkv's 48 need no split-K factor that
  divides K;
* a 1-warp loader TMA-loads each step's W tile and x tile into one ring slot. It waits only for
  free slots;
* the compute warpgroup runs swap-AB wgmma (W tile [128, 64] x x^T [64, MPAD]) and adds each tile's
  partial into y with fp32 atomics where its range crosses a tile boundary, and at its end.

    python lab/stream_chain/gemm.py --json OUT.json   # Hopper GPU: check, time beside torch.mm in CUDA graphs
    python lab/stream_chain/gemm.py --offline         # no GPU: compile every shape for sm_90a
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

sys.path.insert(0, str(Path(__file__).parent))
from chain import (BK, K_PER_SLOT, ROWS_PER_SLOT, SLOT_ROWS, _slot, compile_for_sm90, graph_time_us,  # noqa: E402
                   hopper_and_copy_rate, ring_barriers, write_probe_result)

SMEM_BUDGET = 200 * 1024
# Llama-3.1-8B's projections (N, K) and verify-phase rows: B x (k+1) from 8 to 128.
SHAPES = {"qkv": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
ROWS = (8, 16, 32, 64, 96, 128)


@gluon.jit
def load_partition(w_desc, x_desc, w_ring, x_ring, ready, empty, first, last, K_STEPS,
                   STAGES: gl.constexpr):
    """Stream steps [first, last) of the N x K iteration space: W tile and x tile into one slot."""
    nbytes: gl.constexpr = w_desc.block_type.nbytes + x_desc.block_type.nbytes
    for it in range(first, last):
        s, phase = _slot(it - first, STAGES)
        mbarrier.wait(empty.index(s), phase ^ 1)
        mbarrier.expect(ready.index(s), nbytes)
        col = (it % K_STEPS) * BK
        tma.async_copy_global_to_shared(w_desc, [(it // K_STEPS) * SLOT_ROWS, col], ready.index(s), w_ring.index(s))
        tma.async_copy_global_to_shared(x_desc, [0, col], ready.index(s), x_ring.index(s))


@gluon.jit
def _add_tile(y_ptr, acc, M, N, row0):
    """y[m, row0 + r] += acc[r, m] (fp32 atomics: a tile split between programs gets one add each)."""
    r = row0 + gl.arange(0, SLOT_ROWS, layout=gl.SliceLayout(1, acc.type.layout))
    m = gl.arange(0, acc.shape[1], layout=gl.SliceLayout(0, acc.type.layout))
    gl.atomic_add(y_ptr + m[None, :] * N + r[:, None], acc, mask=(m < M)[None, :] & (r < N)[:, None], sem="relaxed")


@gluon.jit
def compute_partition(w_ring, x_ring, ready, empty, y_ptr, M, N, first, last, K_STEPS,
                      MPAD: gl.constexpr, STAGES: gl.constexpr):
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, MPAD, 16])
    acc = gl.zeros((SLOT_ROWS, MPAD), dtype=gl.float32, layout=acc_layout)
    for it in range(first, last):
        s, phase = _slot(it - first, STAGES)
        mbarrier.wait(ready.index(s), phase)
        acc = warpgroup_mma(w_ring.index(s), x_ring.index(s).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(empty.index(s), count=1)
        if (it % K_STEPS == K_STEPS - 1) | (it == last - 1):  # this tile's share ends here
            _add_tile(y_ptr, acc, M, N, (it // K_STEPS) * SLOT_ROWS)
            acc = gl.zeros((SLOT_ROWS, MPAD), dtype=gl.float32, layout=acc_layout)


@gluon.jit
def stream_gemm_kernel(w_desc, x_desc, y_ptr, M, N, K, STAGES: gl.constexpr):
    """Persistent, one program per SM; y (fp32) starts at zero."""
    MPAD: gl.constexpr = x_desc.block_type.shape[0]
    K_STEPS = K // BK
    total = gl.cdiv(N, SLOT_ROWS) * K_STEPS
    programs = gl.num_programs(0)
    first = gl.program_id(0) * total // programs
    last = (gl.program_id(0) + 1) * total // programs
    w_ring = gl.allocate_shared_memory(w_desc.dtype, [STAGES, SLOT_ROWS, BK], w_desc.layout)
    x_ring = gl.allocate_shared_memory(x_desc.dtype, [STAGES, MPAD, BK], x_desc.layout)
    ready, empty = ring_barriers(STAGES)
    gl.warp_specialize([
        (compute_partition, (w_ring, x_ring, ready, empty, y_ptr, M, N, first, last, K_STEPS, MPAD, STAGES)),
        (load_partition, (w_desc, x_desc, w_ring, x_ring, ready, empty, first, last, K_STEPS, STAGES)),
    ], [1], [40])


# --------------------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------------------

def padded_rows(M: int) -> int:
    """wgmma's N for M rows: a power of two from 16 to 128 (rows past M are TMA's zero fill)."""
    if not 1 <= M <= 128:
        raise ValueError(f"M={M}: this kernel takes 1 to 128 rows")
    return max(16, triton.next_power_of_2(M))


def ring_stages(M: int) -> int:
    slot = (ROWS_PER_SLOT + padded_rows(M)) * K_PER_SLOT * 2
    return min(12, SMEM_BUDGET // slot)


def launch_args(x, w, y, sms: int):
    M, K = x.shape
    if K % K_PER_SLOT:
        raise ValueError(f"K={K} must divide by {K_PER_SLOT}")
    mpad = padded_rows(M)
    w_desc = TensorDescriptor.from_tensor(
        w, [ROWS_PER_SLOT, K_PER_SLOT], gl.NVMMASharedLayout.get_default_for([ROWS_PER_SLOT, K_PER_SLOT], gl.bfloat16))
    x_desc = TensorDescriptor.from_tensor(
        x, [mpad, K_PER_SLOT], gl.NVMMASharedLayout.get_default_for([mpad, K_PER_SLOT], gl.bfloat16))
    total = triton.cdiv(w.shape[0], ROWS_PER_SLOT) * (K // K_PER_SLOT)
    return (min(sms, total), ), (w_desc, x_desc, y, M, w.shape[0], K), dict(STAGES=ring_stages(M), num_warps=4,
                                                                             maxnreg=168)


class StreamGemm:
    """y = x @ w.T into a fp32 y that the call zeroes first (the memset is part of what is timed)."""

    def __init__(self, x, w, sms: int):
        self.y = torch.empty(x.shape[0], w.shape[0], device=x.device, dtype=torch.float32)
        self.grid, self.args, self.kwargs = launch_args(x, w, self.y, sms)

    def __call__(self):
        self.y.zero_()
        stream_gemm_kernel[self.grid](*self.args, **self.kwargs)
        return self.y


def simulate(x, w, programs: int):
    """The kernel's dealing and flushes in torch on the CPU: each program's range of the N x K steps,
    a tile's partial added where the range leaves the tile or ends. Returns y (fp32)."""
    M, K = x.shape
    N = w.shape[0]
    k_steps = K // K_PER_SLOT
    total = -(-N // ROWS_PER_SLOT) * k_steps
    y = torch.zeros(M, N)
    for pid in range(programs):
        first, last = pid * total // programs, (pid + 1) * total // programs
        acc = torch.zeros(ROWS_PER_SLOT, M)
        for it in range(first, last):
            rows = slice((it // k_steps) * ROWS_PER_SLOT, (it // k_steps + 1) * ROWS_PER_SLOT)
            cols = slice((it % k_steps) * K_PER_SLOT, (it % k_steps + 1) * K_PER_SLOT)
            tile = w[rows, cols].float()
            acc[:tile.shape[0]] += tile @ x[:, cols].float().T
            if it % k_steps == k_steps - 1 or it == last - 1:
                y[:, rows] += acc[:tile.shape[0]].T
                acc = torch.zeros(ROWS_PER_SLOT, M)
    return y


def traffic_bytes(M: int, N: int, K: int) -> int:
    """W, x and a bf16 y, each once: what a GEMM at these rows must move."""
    return (N * K + M * K + M * N) * 2


def run_gpu(args) -> int:
    gpu = hopper_and_copy_rate()
    if gpu is None:
        return 2
    sms, bw = gpu
    print(f"{'proj':<9}{'M':>4}{'N':>7}{'K':>7}{'err':>9}{'floor us':>10}{'ours us':>9}{'of copy':>8}"
          f"{'torch us':>10}{'of copy':>8}{'ours/torch':>11}")
    rows = []
    for name in args.shapes:
        N, K = SHAPES[name]
        copies = max(2, -(-300_000_000 // (N * K * 2)))
        ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5 for _ in range(copies)]
        for M in args.rows:
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            gemms = [StreamGemm(x, w, sms) for w in ws]
            y = gemms[0]().clone()
            torch.cuda.synchronize()
            ref = x.float() @ ws[0].float().T
            err = ((y - ref).abs().max() / ref.abs().max()).item()
            if not err < 1e-2:
                raise SystemExit(f"{name} M={M}: relative error {err}")
            outs = [torch.empty(M, N, device="cuda", dtype=torch.bfloat16) for _ in ws]
            ours = graph_time_us(gemms)
            theirs = graph_time_us([lambda w=w, o=o: torch.mm(x, w.T, out=o) for w, o in zip(ws, outs)])
            floor = traffic_bytes(M, N, K) / bw * 1e6
            row = dict(kind="gemm", model="llama-3.1-8b", op=name, rows=M, N=N, K=K, rel_err=err,
                       bytes=traffic_bytes(M, N, K), floor_us=floor, us=ours, bw_fraction=floor / ours,
                       torch_us=theirs, torch_bw_fraction=floor / theirs, stages=ring_stages(M))
            rows.append(row)
            print(f"{name:<9}{M:>4}{N:>7}{K:>7}{err:>9.1e}{floor:>10.1f}{ours:>9.1f}{floor / ours:>8.2f}"
                  f"{theirs:>10.1f}{floor / theirs:>8.2f}{ours / theirs:>11.2f}", flush=True)
            write_probe_result(args.json, sms, bw, timing="cuda graph, rotating weights", shapes=rows)
        del ws, gemms
        torch.cuda.empty_cache()
    return 0


def compile_offline(M: int, N: int, K: int):
    x, w = torch.empty(M, K, dtype=torch.bfloat16), torch.empty(N, K, dtype=torch.bfloat16)
    _, args, kwargs = launch_args(x, w, torch.empty(M, N, dtype=torch.float32), 132)
    return compile_for_sm90(stream_gemm_kernel, args, kwargs)


def run_offline(args) -> int:
    print(f"triton {triton.__version__}: stream_gemm_kernel for cuda:90 (sm_90a), no GPU")
    for M in sorted({padded_rows(m) for m in args.rows}):
        compiled = compile_offline(M, *SHAPES["qkv"])
        ptx = compiled.asm["ptx"]
        wgmma = re.search(r"wgmma\.mma_async\.\S+", ptx)
        print(f"MPAD {M:>3}: stages {ring_stages(M)}, shared {compiled.metadata.shared} B, "
              f"{wgmma.group(0) if wgmma else 'NO wgmma'}, TMA {'yes' if 'cp.async.bulk.tensor' in ptx else 'NO'}, "
              f"atomics {'yes' if 'atom.global' in ptx or 'red.global' in ptx else 'NO'}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="A verify-phase GEMM streamed stream-K style by a "
                                                 "warp-specialized persistent Gluon kernel, against torch.mm.")
    parser.add_argument("--json")
    parser.add_argument("--offline", action="store_true")
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--rows", nargs="+", type=int, default=list(ROWS))
    args = parser.parse_args(argv)
    return run_offline(args) if args.offline else run_gpu(args)


if __name__ == "__main__":
    if "--offline" in sys.argv:
        os.environ.setdefault("TRITON_INTERPRET", "0")
    sys.exit(main())
