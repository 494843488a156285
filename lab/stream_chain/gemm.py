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
import tempfile
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[2]))  # the product, from a checkout without an install
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
def pipelined_compute_partition(w_ring, x_ring, ready, empty, y_ptr, M, N, first, last, K_STEPS,
                                MPAD: gl.constexpr, STAGES: gl.constexpr, WARPS: gl.constexpr):
    """compute_partition with the tensor cores kept fed: WARPS = 8 gives two warpgroups (64 W rows
    each), and one wgmma stays in flight while the next slot's is issued; a slot is released once the
    wgmma after it has been issued and it has retired. A tile's share is its own inner loop, so the
    accumulator crosses no runtime branch while a wgmma is in flight."""
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                         instr_shape=[16, MPAD, 16])
    it = first
    while it < last:
        tile = it // K_STEPS
        stop = gl.minimum(last, (tile + 1) * K_STEPS)
        acc = gl.zeros((SLOT_ROWS, MPAD), dtype=gl.float32, layout=acc_layout)
        for j in range(it, stop):
            s, phase = _slot(j - first, STAGES)
            mbarrier.wait(ready.index(s), phase)
            acc = warpgroup_mma(w_ring.index(s), x_ring.index(s).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
            if j > it:  # the wgmma on the slot before has retired
                prev, _ = _slot(j - 1 - first, STAGES)
                mbarrier.arrive(empty.index(prev), count=1)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        last_slot, _ = _slot(stop - 1 - first, STAGES)
        mbarrier.arrive(empty.index(last_slot), count=1)
        _add_tile(y_ptr, acc, M, N, tile * SLOT_ROWS)
        it = stop


@gluon.jit
def stream_gemm_kernel(w_desc, x_desc, y_ptr, M, N, K, STAGES: gl.constexpr, PIPELINED: gl.constexpr = False,
                       WARPS: gl.constexpr = 4):
    """Persistent, one program per SM; y (fp32) starts at zero. PIPELINED: pipelined_compute_partition
    (launch with num_warps=WARPS), else compute_partition."""
    MPAD: gl.constexpr = x_desc.block_type.shape[0]
    K_STEPS = K // BK
    total = gl.cdiv(N, SLOT_ROWS) * K_STEPS
    programs = gl.num_programs(0)
    first = gl.program_id(0) * total // programs
    last = (gl.program_id(0) + 1) * total // programs
    w_ring = gl.allocate_shared_memory(w_desc.dtype, [STAGES, SLOT_ROWS, BK], w_desc.layout)
    x_ring = gl.allocate_shared_memory(x_desc.dtype, [STAGES, MPAD, BK], x_desc.layout)
    ready, empty = ring_barriers(STAGES)
    loader_args = (w_desc, x_desc, w_ring, x_ring, ready, empty, first, last, K_STEPS, STAGES)
    if PIPELINED:
        gl.warp_specialize([(pipelined_compute_partition, (w_ring, x_ring, ready, empty, y_ptr, M, N, first, last,
                                                           K_STEPS, MPAD, STAGES, WARPS)),
                            (load_partition, loader_args)], [1], [40])
    else:
        gl.warp_specialize([(compute_partition, (w_ring, x_ring, ready, empty, y_ptr, M, N, first, last, K_STEPS,
                                                 MPAD, STAGES)), (load_partition, loader_args)], [1], [40])


# Owned tiles: 64 weight rows a tile with the whole K, dealt round-robin to the programs, each tile's
# rows written once (no fp32 y to zero, no atomics). 8 warps at MPAD 128 split the x rows between two
# warpgroups. The epilogue is the product's: STORE (bf16 y), RESIDUAL (y, the fp32 residual stream,
# += x W^T) or SILU_MUL (y = silu(x W^T) * (x W2^T), a W tile and a W2 tile in each slot).
OWNED_ROWS = 64
STORE, RESIDUAL, SILU_MUL = 0, 1, 2


@gluon.jit
def owned_load_partition(w_desc, w2_desc, x_desc, w_ring, w2_ring, x_ring, ready, empty, n_tiles, K_STEPS,
                         STAGES: gl.constexpr, EPILOGUE: gl.constexpr, ROW_BLOCKS: gl.constexpr):
    nbytes: gl.constexpr = (w_desc.block_type.nbytes * (2 if EPILOGUE == 2 else 1) + x_desc.block_type.nbytes)
    c = 0
    for item in range(gl.program_id(0), n_tiles * ROW_BLOCKS, gl.num_programs(0)):
        tile = item // ROW_BLOCKS
        x_row = (item % ROW_BLOCKS) * x_desc.block_type.shape[0]
        for k in range(K_STEPS):
            s, phase = _slot(c, STAGES)
            mbarrier.wait(empty.index(s), phase ^ 1)
            mbarrier.expect(ready.index(s), nbytes)
            row = tile * w_desc.block_type.shape[0]
            tma.async_copy_global_to_shared(w_desc, [row, k * BK], ready.index(s), w_ring.index(s))
            if EPILOGUE == 2:
                tma.async_copy_global_to_shared(w2_desc, [row, k * BK], ready.index(s), w2_ring.index(s))
            tma.async_copy_global_to_shared(x_desc, [x_row, k * BK], ready.index(s), x_ring.index(s))
            c += 1


@gluon.jit
def _owned_epilogue(acc, acc2, y_ptr, M, N, tile, x_row, TILE: gl.constexpr, EPILOGUE: gl.constexpr):
    """y[x_row + m, tile * TILE + r] from acc[r, m] (and acc2's, SILU_MUL)."""
    r = tile * TILE + gl.arange(0, TILE, layout=gl.SliceLayout(1, acc.type.layout))
    m = x_row + gl.arange(0, acc.shape[1], layout=gl.SliceLayout(0, acc.type.layout))
    ptrs = y_ptr + m[None, :] * N + r[:, None]
    mask = (m < M)[None, :] & (r < N)[:, None]
    if EPILOGUE == 1:
        gl.store(ptrs, gl.load(ptrs, mask=mask, other=0.0) + acc, mask=mask)
    elif EPILOGUE == 2:
        gl.store(ptrs, (acc / (1.0 + gl.exp(-acc)) * acc2).to(y_ptr.dtype.element_ty), mask=mask)
    else:
        gl.store(ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def owned_compute_partition(w_ring, w2_ring, x_ring, ready, empty, y_ptr, M, N, n_tiles, K_STEPS,
                            TILE: gl.constexpr, MPAD: gl.constexpr, STAGES: gl.constexpr, WARPS: gl.constexpr,
                            EPILOGUE: gl.constexpr, ROW_BLOCKS: gl.constexpr):
    wg: gl.constexpr = WARPS // 4  # warpgroups side by side over the x rows
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, wg],
                                                         instr_shape=[16, MPAD // wg, 16])
    c = 0
    for item in range(gl.program_id(0), n_tiles * ROW_BLOCKS, gl.num_programs(0)):
        tile = item // ROW_BLOCKS
        acc = gl.zeros((TILE, MPAD), dtype=gl.float32, layout=acc_layout)
        acc2 = gl.zeros((TILE, MPAD), dtype=gl.float32, layout=acc_layout)
        for k in range(K_STEPS):
            s, phase = _slot(c + k, STAGES)
            mbarrier.wait(ready.index(s), phase)
            x_t = x_ring.index(s).permute((1, 0))
            acc = warpgroup_mma(w_ring.index(s), x_t, acc, is_async=True)
            if EPILOGUE == 2:
                acc2 = warpgroup_mma(w2_ring.index(s), x_t, acc2, is_async=True)
                acc, acc2 = warpgroup_mma_wait(num_outstanding=2, deps=(acc, acc2))
            else:
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
            if k > 0:  # the wgmma(s) on the slot before have retired
                prev, _ = _slot(c + k - 1, STAGES)
                mbarrier.arrive(empty.index(prev), count=1)
        acc, acc2 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc2))
        last_slot, _ = _slot(c + K_STEPS - 1, STAGES)
        mbarrier.arrive(empty.index(last_slot), count=1)
        _owned_epilogue(acc, acc2, y_ptr, M, N, tile, (item % ROW_BLOCKS) * MPAD, TILE, EPILOGUE)
        c += K_STEPS


@gluon.jit
def owned_gemm_kernel(w_desc, w2_desc, x_desc, y_ptr, M, N, K, STAGES: gl.constexpr, WARPS: gl.constexpr,
                      EPILOGUE: gl.constexpr, ROW_BLOCKS: gl.constexpr = 1):
    """Persistent over owned items (w2_desc: SILU_MUL's up projection, else w_desc again, unread): a
    weight tile and one of ROW_BLOCKS blocks of x's rows (x's box rows each), the blocks of a tile
    dealt to neighbouring programs so that they read its weights through L2 together."""
    TILE: gl.constexpr = w_desc.block_type.shape[0]
    MPAD: gl.constexpr = x_desc.block_type.shape[0]
    K_STEPS = K // BK
    n_tiles = gl.cdiv(N, TILE)
    w_ring = gl.allocate_shared_memory(w_desc.dtype, [STAGES, TILE, BK], w_desc.layout)
    w2_ring = gl.allocate_shared_memory(w_desc.dtype, [STAGES if EPILOGUE == 2 else 1, TILE, BK], w_desc.layout)
    x_ring = gl.allocate_shared_memory(x_desc.dtype, [STAGES, MPAD, BK], x_desc.layout)
    ready, empty = ring_barriers(STAGES)
    gl.warp_specialize([
        (owned_compute_partition, (w_ring, w2_ring, x_ring, ready, empty, y_ptr, M, N, n_tiles, K_STEPS, TILE, MPAD,
                                   STAGES, WARPS, EPILOGUE, ROW_BLOCKS)),
        (owned_load_partition, (w_desc, w2_desc, x_desc, w_ring, w2_ring, x_ring, ready, empty, n_tiles, K_STEPS,
                                STAGES, EPILOGUE, ROW_BLOCKS)),
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


# The compute forms `--variants` times: (kernel, warps of the compute partition).
VARIANTS = {"serial": ("serial", 4), "pipelined4": ("pipelined", 4), "pipelined8": ("pipelined", 8),
            "owned": ("owned", None), "owned_padded": ("owned", None), "owned_rows64": ("owned", None)}
ROWS64_STAGES = 6  # (64 + 64) x 64 bf16 a slot: 96 KB, two programs an SM


def owned_warps(M: int) -> int:
    return 8 if padded_rows(M) == 128 else 4


def owned_stages(M: int, weights: int = 1) -> int:
    return min(12, SMEM_BUDGET // ((weights * OWNED_ROWS + padded_rows(M)) * K_PER_SLOT * 2))


def launch_args(x, w, y, sms: int, variant: str = "serial", M: int | None = None):
    """Grid, arguments and meta-parameters; M (default x's rows) is the rows that are real, where x
    holds more (a buffer padded to wgmma's N, so no TMA box reaches past it)."""
    M = x.shape[0] if M is None else M
    K = x.shape[1]
    if K % K_PER_SLOT:
        raise ValueError(f"K={K} must divide by {K_PER_SLOT}")
    mpad = padded_rows(M)
    w_desc = TensorDescriptor.from_tensor(
        w, [ROWS_PER_SLOT, K_PER_SLOT], gl.NVMMASharedLayout.get_default_for([ROWS_PER_SLOT, K_PER_SLOT], gl.bfloat16))
    x_desc = TensorDescriptor.from_tensor(
        x, [mpad, K_PER_SLOT], gl.NVMMASharedLayout.get_default_for([mpad, K_PER_SLOT], gl.bfloat16))
    total = triton.cdiv(w.shape[0], ROWS_PER_SLOT) * (K // K_PER_SLOT)
    form, warps = VARIANTS[variant]
    if form == "owned":
        warps = owned_warps(M)
        w_desc = TensorDescriptor.from_tensor(
            w, [OWNED_ROWS, K_PER_SLOT], gl.NVMMASharedLayout.get_default_for([OWNED_ROWS, K_PER_SLOT], gl.bfloat16))
        tiles = triton.cdiv(w.shape[0], OWNED_ROWS)
        if variant == "owned_rows64" and mpad > 64:  # x's rows in blocks of 64, two programs an SM
            x_desc = TensorDescriptor.from_tensor(
                x, [64, K_PER_SLOT], gl.NVMMASharedLayout.get_default_for([64, K_PER_SLOT], gl.bfloat16))
            blocks = mpad // 64
            return (min(2 * sms, tiles * blocks), ), (w_desc, w_desc, x_desc, y, M, w.shape[0], K), dict(
                STAGES=ROWS64_STAGES, WARPS=4, EPILOGUE=STORE, ROW_BLOCKS=blocks, num_warps=4, maxnreg=168)
        return (min(sms, tiles), ), (w_desc, w_desc, x_desc, y, M, w.shape[0], K), dict(
            STAGES=owned_stages(M), WARPS=warps, EPILOGUE=STORE, num_warps=warps, maxnreg=168)
    kwargs = dict(STAGES=ring_stages(M), num_warps=warps, maxnreg=168)
    if form == "pipelined":
        kwargs.update(PIPELINED=True, WARPS=warps)
    return (min(sms, total), ), (w_desc, x_desc, y, M, w.shape[0], K), kwargs


def kernel_of(variant: str):
    return owned_gemm_kernel if VARIANTS[variant][0] == "owned" else stream_gemm_kernel


class StreamGemm:
    """y = x @ w.T into a fp32 y that the call zeroes first (the memset is part of what is timed)."""

    def __init__(self, x, w, sms: int, variant: str = "serial"):
        self.owned = VARIANTS[variant][0] == "owned"  # bf16 y, each element stored once: nothing to zero
        self.y = torch.empty(x.shape[0], w.shape[0], device=x.device,
                             dtype=torch.bfloat16 if self.owned else torch.float32)
        rows = x.shape[0]
        if variant in ("owned_padded", "owned_rows64"):  # x in a buffer of padded_rows(M) rows, the rows past M zero
            x = torch.cat([x, x.new_zeros(padded_rows(rows) - rows, x.shape[1])])
        self.x = x
        self.grid, self.args, self.kwargs = launch_args(x, w, self.y, sms, variant, M=rows)
        self.kernel = kernel_of(variant)

    def __call__(self):
        if not self.owned:
            self.y.zero_()
        self.kernel[self.grid](*self.args, **self.kwargs)
        return self.y


# The product's tl template (conjugate/kernels/gemm.py) beside the Gluon forms: the tile table's tile
# for the shape (nearest rows), and two tiles that won at 128 rows in the sweeps; the fastest counts.
PRODUCT_TILES = ({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 1, "num_warps": 4, "num_stages": 3},
                 {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "SPLIT_K": 2, "num_warps": 4, "num_stages": 5})


def product_tiles(op: str, M: int, N: int, K: int, gpu: str) -> list[dict]:
    from conjugate.agents.heuristic.tile_table import load_tile_tables, table_for

    tables = load_tile_tables()
    own = table_for(gpu, tables)
    found = [t.tile_near(op, (M, N, K)) for t in ([own] if own else []) + [t for t in tables if t is not own]]
    tiles = [f.tile for f in found if f is not None][:1]
    return tiles + [t for t in PRODUCT_TILES if t not in tiles]


class ProductGemm:
    """y = x @ w.T by the product's GEMM launch (store epilogue, bf16 y) at one tile."""

    def __init__(self, x, w, tile: dict, kernels: Path):
        from conjugate.compiler.cache import KernelCache
        from conjugate.compiler.gemm import gemm_call
        from conjugate.compiler.round import CompiledLaunch

        self.y = torch.empty(x.shape[0], w.shape[0], device=x.device, dtype=torch.bfloat16)
        call = gemm_call(x, w, self.y, rows=x.shape[0], block_m=tile["BLOCK_M"], block_n=tile["BLOCK_N"],
                         block_k=tile["BLOCK_K"], split_k=tile["SPLIT_K"])
        self.launch = CompiledLaunch.alone(0, call, KernelCache(kernels), num_warps=tile["num_warps"],
                                           num_stages=tile["num_stages"])

    def __call__(self):
        self.launch()
        return self.y


# The verify pass's four GEMMs with the product's epilogues: (op, epilogue, N, K); gate_up as its pair.
EPILOGUE_OPS = (("qkv", "store", 6144, 4096), ("o_proj", "residual", 4096, 4096),
                ("gate_up", "silu_mul", 14336, 4096), ("down", "residual", 4096, 14336))
EPILOGUE_CODES = {"store": STORE, "residual": RESIDUAL, "silu_mul": SILU_MUL}


def _layout(rows: int):
    return gl.NVMMASharedLayout.get_default_for([rows, K_PER_SLOT], gl.bfloat16)


class OwnedEpilogueGemm:
    """The owned form with a product epilogue over x padded to wgmma's N (rows past M zero)."""

    def __init__(self, x, w, w2, y, epilogue: str, sms: int):
        M, K = x.shape
        if K % K_PER_SLOT:
            raise ValueError(f"K={K} must divide by {K_PER_SLOT}")
        mpad = padded_rows(M)
        self.x = torch.cat([x, x.new_zeros(mpad - M, K)])
        w_desc = TensorDescriptor.from_tensor(w, [OWNED_ROWS, K_PER_SLOT], _layout(OWNED_ROWS))
        w2_desc = TensorDescriptor.from_tensor(w2, [OWNED_ROWS, K_PER_SLOT], _layout(OWNED_ROWS)) if w2 is not None \
            else w_desc
        x_desc = TensorDescriptor.from_tensor(self.x, [mpad, K_PER_SLOT], _layout(mpad))
        warps = owned_warps(M)
        self.grid = (min(sms, triton.cdiv(w.shape[0], OWNED_ROWS)), )
        self.args = (w_desc, w2_desc, x_desc, y, M, w.shape[0], K)
        self.kwargs = dict(STAGES=owned_stages(M, 2 if w2 is not None else 1), WARPS=warps,
                           EPILOGUE=EPILOGUE_CODES[epilogue], num_warps=warps, maxnreg=168)
        self.y = y

    def __call__(self):
        owned_gemm_kernel[self.grid](*self.args, **self.kwargs)
        return self.y


class ProductEpilogueGemm:
    """The product's GEMM launch with the same epilogue at one tile."""

    def __init__(self, x, w, w2, y, epilogue: str, tile: dict, kernels: Path):
        from conjugate.compiler.cache import KernelCache
        from conjugate.compiler.gemm import gemm_call
        from conjugate.compiler.round import CompiledLaunch

        call = gemm_call(x, w, y, rows=x.shape[0], epilogue=epilogue, w2=w2, block_m=tile["BLOCK_M"],
                         block_n=tile["BLOCK_N"], block_k=tile["BLOCK_K"], split_k=tile["SPLIT_K"])
        self.launch = CompiledLaunch.alone(0, call, KernelCache(kernels), num_warps=tile["num_warps"],
                                           num_stages=tile["num_stages"])
        self.y = y

    def __call__(self):
        self.launch()
        return self.y


def epilogue_reference(x, w, w2, start, epilogue: str):
    product = x.float() @ w.float().T
    if epilogue == "residual":
        return start.float() + product
    if epilogue == "silu_mul":
        return torch.nn.functional.silu(product) * (x.float() @ w2.float().T)
    return product


def check_then_time(gemms: dict, ref, what: str, passes: int = 3) -> tuple[dict, dict]:
    """Each variant's first call against `ref` (relative error < 1e-2, else exit naming it), then every
    variant timed in `passes` interleaved passes (CUDA graphs over its calls): (errors, times a pass)."""
    errs = {}
    for variant, calls in gemms.items():
        got = calls[0]().float()
        torch.cuda.synchronize()
        errs[variant] = ((got - ref).abs().max() / ref.abs().max()).item()
        if not errs[variant] < 1e-2:
            raise SystemExit(f"{what} {variant}: relative error {errs[variant]}")
    times = {v: [] for v in gemms}
    for _ in range(passes):
        for variant, calls in gemms.items():
            times[variant].append(graph_time_us(calls))
    return errs, times


def run_epilogues(args, sms: int, bw: float) -> int:
    """Owned tiles against the product's tl GEMM, each with the verify pass's epilogue of its op."""
    kernels = Path(tempfile.mkdtemp(prefix="stream-gemm-kernels-"))
    print(f"{'proj':<9}{'epilogue':>9}{'M':>5}{'variant':>10}{'err':>9}{'us':>8}{'of copy':>8}")
    rows = []
    for op, epilogue, N, K in EPILOGUE_OPS:
        pair = epilogue == "silu_mul"
        copies = max(2, -(-300_000_000 // (N * K * 2 * (2 if pair else 1))))
        ws = [[torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5 for _ in range(2 if pair else 1)]
              for _ in range(copies)]
        for M in args.rows:
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            y_dtype = torch.float32 if epilogue == "residual" else torch.bfloat16
            start = torch.randn(M, N, device="cuda", dtype=y_dtype)
            makers = {"owned": lambda w, y: OwnedEpilogueGemm(x, w[0], w[1] if pair else None, y, epilogue, sms)}
            for i, tile in enumerate(product_tiles(op, M, N, K, torch.cuda.get_device_name())):
                makers[f"product{i}"] = lambda w, y, tile=tile: ProductEpilogueGemm(
                    x, w[0], w[1] if pair else None, y, epilogue, tile, kernels)
            gemms = {variant: [make(w, start.clone()) for w in ws] for variant, make in makers.items()}
            ref = epilogue_reference(x, ws[0][0], ws[0][1] if pair else None, start, epilogue)
            errs, passes = check_then_time(gemms, ref, f"{op} {epilogue} M={M}")
            moved = (N * K * (2 if pair else 1) + M * K) * 2 + M * N * (8 if epilogue == "residual" else 2)
            for variant in gemms:
                us = sorted(passes[variant])[1]
                rows.append(dict(kind="gemm", model="llama-3.1-8b", op=op, epilogue=epilogue, rows=M, N=N, K=K,
                                 variant=variant, rel_err=errs[variant], bytes=moved, us=us, passes_us=passes[variant],
                                 bw_fraction=moved / bw / (us * 1e-6)))
                print(f"{op:<9}{epilogue:>9}{M:>5}{variant:>10}{errs[variant]:>9.1e}{us:>8.1f}"
                      f"{moved / bw / (us * 1e-6):>8.2f}", flush=True)
            write_probe_result(args.json, sms, bw, timing="cuda graph, rotating weights", shapes=rows)
            del gemms
        del ws
        torch.cuda.empty_cache()
    return 0


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
    if args.epilogues:
        return run_epilogues(args, sms, bw)
    kernels = Path(tempfile.mkdtemp(prefix="stream-gemm-kernels-"))  # the product launches' generated modules
    print(f"{'proj':<9}{'M':>4}{'variant':>12}{'err':>9}{'floor us':>10}{'ours us':>9}{'of copy':>8}"
          f"{'torch us':>10}{'of copy':>8}{'ours/torch':>11}")
    rows = []
    for name in args.shapes:
        N, K = SHAPES[name]
        copies = max(2, -(-300_000_000 // (N * K * 2)))
        ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5 for _ in range(copies)]
        for M in args.rows:
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            ref = x.float() @ ws[0].float().T
            gemms = {variant: [StreamGemm(x, w, sms, variant) for w in ws] for variant in args.variants}
            tiles_of = {}
            if args.product:  # each product tile is a variant of its own
                for i, tile in enumerate(product_tiles(name, M, N, K, torch.cuda.get_device_name())):
                    gemms[f"product{i}"] = [ProductGemm(x, w, tile, kernels) for w in ws]
                    tiles_of[f"product{i}"] = tile
            variants = list(gemms)
            outs = [torch.empty(M, N, device="cuda", dtype=torch.bfloat16) for _ in ws]
            gemms["torch"] = [lambda w=w, o=o: torch.mm(x, w.T, out=o) for w, o in zip(ws, outs)]
            errs, passes = check_then_time(gemms, ref, f"{name} M={M}")
            theirs = sorted(passes["torch"])[1]
            floor = traffic_bytes(M, N, K) / bw * 1e6
            for variant in variants:
                ours = sorted(passes[variant])[1]
                row = dict(kind="gemm", model="llama-3.1-8b", op=name, rows=M, N=N, K=K, variant=variant,
                           rel_err=errs[variant], bytes=traffic_bytes(M, N, K), floor_us=floor, us=ours,
                           passes_us=passes[variant], bw_fraction=floor / ours, torch_us=theirs,
                           torch_passes_us=passes["torch"], torch_bw_fraction=floor / theirs,
                           **({"tile": tiles_of[variant]} if variant in tiles_of else
                              {"stages": gemms[variant][0].kwargs["STAGES"], "programs": gemms[variant][0].grid[0]}))
                rows.append(row)
                print(f"{name:<9}{M:>4}{variant:>12}{errs[variant]:>9.1e}{floor:>10.1f}{ours:>9.1f}{floor / ours:>8.2f}"
                      f"{theirs:>10.1f}{floor / theirs:>8.2f}{ours / theirs:>11.2f}", flush=True)
            write_probe_result(args.json, sms, bw, timing="cuda graph, rotating weights", shapes=rows)
            del gemms
        del ws
        torch.cuda.empty_cache()
    return 0


def compile_offline(M: int, N: int, K: int, variant: str = "serial"):
    x, w = torch.empty(M, K, dtype=torch.bfloat16), torch.empty(N, K, dtype=torch.bfloat16)
    y = torch.empty(M, N, dtype=torch.bfloat16 if VARIANTS[variant][0] == "owned" else torch.float32)
    _, args, kwargs = launch_args(x, w, y, 132, variant)
    return compile_for_sm90(kernel_of(variant), args, kwargs), kwargs


def resources(compiled) -> tuple[int, int]:
    """(registers, local bytes): lab/gluon_gemm's reader of the bundled cuobjdump."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("gluon_gemm", Path(__file__).parents[1] / "gluon_gemm" / "gemm.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module.resources(compiled)


def run_offline(args) -> int:
    if args.epilogues:  # the owned form with each op's epilogue
        for (op, epilogue, N, K), M in [(o, m) for o in EPILOGUE_OPS for m in args.rows]:
            pair = epilogue == "silu_mul"
            w = torch.empty(N, K, dtype=torch.bfloat16)
            y = torch.empty(M, N, dtype=torch.float32 if epilogue == "residual" else torch.bfloat16)
            gemm = OwnedEpilogueGemm(torch.empty(M, K, dtype=torch.bfloat16), w, w if pair else None, y, epilogue, 132)
            compiled = compile_for_sm90(owned_gemm_kernel, gemm.args, gemm.kwargs)
            print(f"owned {op:<8}{epilogue:>9} M {M:>3}: stages {gemm.kwargs['STAGES']}, shared "
                  f"{compiled.metadata.shared} B, " + "registers %d, local bytes %d" % resources(compiled))
        return 0
    print(f"triton {triton.__version__}: the stream GEMM's variants for cuda:90 (sm_90a), no GPU")
    for variant, M in [(v, m) for v in args.variants for m in sorted({padded_rows(m) for m in args.rows})]:
        compiled, kwargs = compile_offline(M, *SHAPES["qkv"], variant)
        ptx = compiled.asm["ptx"]
        wgmma = re.search(r"wgmma\.mma_async\.\S+", ptx)
        print(f"{variant:<11} MPAD {M:>3}: stages {kwargs['STAGES']}, shared {compiled.metadata.shared} B, "
              "registers %d, local bytes %d, " % resources(compiled) +
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
    parser.add_argument("--epilogues", action="store_true",
                        help="owned tiles against the product's GEMM, each with its op's epilogue in the verify pass")
    parser.add_argument("--product", action="store_true",
                        help="also the product's tl GEMM at the tile table's tile and two more (product0, 1, ...)")
    parser.add_argument("--variants", nargs="+", default=["serial"], choices=list(VARIANTS),
                        help="compute forms, each checked, then timed in three interleaved passes")
    args = parser.parse_args(argv)
    return run_offline(args) if args.offline else run_gpu(args)


if __name__ == "__main__":
    if "--offline" in sys.argv:
        os.environ.setdefault("TRITON_INTERPRET", "0")
    sys.exit(main())
