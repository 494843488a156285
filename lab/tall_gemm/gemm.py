"""A GEMM for the rows past the ridge (192-512: the target verifying 6-8 tokens for 32 sequences, 4-8
for 64), shaped the way a compute-bound Hopper matmul is: tall tiles, both operands copied by TMA from
host-made tensor descriptors, each program walking tiles in groups of row blocks (so a weight tile is
read from memory once and from L2 by the row blocks beside it), and, persistent, one program an SM.

    out[M, N] = x[M, K] @ W[N, K]^T        x, W bf16; fp32 accumulation; fp32 out

The product's template (conjugate/kernels/gemm.py) loads by pointer (cp.async), runs one tile a
program with its M blocks adjacent, and at these rows took 1.41x cuBLAS's time at its best of the tall
tiles (benchmarks/results/compute_sweep_h100.json). This asks whether the loads and the walk are the
rest. Plain store epilogue only: the comparison is against cuBLAS on the same operands. Lab code:
nothing in `conjugate/` imports it.
"""
from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl


@dataclass(frozen=True)
class TallTile:
    """One launch form of `tall_gemm`: its tile, its group of row blocks, and whether its programs
    are one an SM walking every tile (persistent) or one a tile."""
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    warps: int
    stages: int
    persistent: bool

    def name(self) -> str:
        form = "persistent" if self.persistent else "one tile a program"
        return (f"{self.block_m}x{self.block_n}x{self.block_k} group {self.group_m}, {self.warps} warps, "
                f"{self.stages} stages, {form}")

    def tiles(self, m: int, n: int) -> int:
        return triton.cdiv(m, self.block_m) * triton.cdiv(n, self.block_n)

    def programs(self, m: int, n: int, sms: int) -> int:
        return min(sms, self.tiles(m, n)) if self.persistent else self.tiles(m, n)


@triton.jit
def _tile_coords(tile, num_m, num_n, GROUP_M: tl.constexpr):
    """Tile number `tile`'s (row block, column block): GROUP_M row blocks take each column block in
    turn before the next column block, so neighbouring tiles share a weight tile."""
    per_group = GROUP_M * num_n
    first_m = (tile // per_group) * GROUP_M
    rows_here = tl.minimum(num_m - first_m, GROUP_M)
    within = tile % per_group
    return first_m + within % rows_here, within // rows_here


@triton.jit
def _tile_product(x_desc, w_desc, m_blk, n_blk, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """x's row block times W's column block over the whole of K, [BLOCK_M, BLOCK_N] fp32 (TMA fills
    what lies past M, N or K with zeros)."""
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = x_desc.load([m_blk * BLOCK_M, k0])  # [BM, BK]
        w = w_desc.load([n_blk * BLOCK_N, k0])  # [BN, BK]
        acc += tl.dot(x.to(DOT_DTYPE), tl.trans(w.to(DOT_DTYPE)))
    return acc


@triton.jit
def _store_tile(acc, out_ptr, m_blk, n_blk, M, N, stride_out, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_m = m_blk * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = n_blk * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(out_ptr + offs_m[:, None] * stride_out + offs_n[None, :], acc,
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def tall_gemm(x_desc, w_desc, out_ptr, M, N, K, stride_out,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
              PROGRAMS: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """Program p computes tiles p, p + PROGRAMS, ... (all of them, PROGRAMS at most the tile count)."""
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), num_m * num_n, PROGRAMS):
        m_blk, n_blk = _tile_coords(tile, num_m, num_n, GROUP_M)
        acc = _tile_product(x_desc, w_desc, m_blk, n_blk, K, BLOCK_M, BLOCK_N, BLOCK_K, DOT_DTYPE)
        _store_tile(acc, out_ptr, m_blk, n_blk, M, N, stride_out, BLOCK_M, BLOCK_N)


def launch(x, w, out, form: TallTile, sms: int):
    """A no-argument call running `tall_gemm` in `form` over x [M, K], w [N, K] into out [M, N]."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from conjugate.compiler.tile import dot_dtype  # the weights' type; fp32 under the interpreter

    (m, k), n = x.shape, w.shape[0]
    x_desc = TensorDescriptor.from_tensor(x, [form.block_m, form.block_k])
    w_desc = TensorDescriptor.from_tensor(w, [form.block_n, form.block_k])
    programs = form.programs(m, n, sms)

    def call() -> None:
        tall_gemm[(programs,)](x_desc, w_desc, out, m, n, k, out.stride(0), BLOCK_M=form.block_m,
                               BLOCK_N=form.block_n, BLOCK_K=form.block_k, GROUP_M=form.group_m,
                               PROGRAMS=programs, DOT_DTYPE=dot_dtype(w.dtype), num_warps=form.warps,
                               num_stages=form.stages)
    return call
