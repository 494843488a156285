"""Helpers shared by several tile families: the row statistics a fused RMSNorm reads.

A residual GEMM that holds finished rows stores, per row, the sum of squares of each STATS_CHUNK
columns it wrote (`store_row_stats`); the next GEMM's fused norm reads those few values a row
instead of re-reading the whole row (inside its main loop, gemm.py), as does the fused MLP's prologue
before its loop (`sum_row_stats`).
"""
import triton
import triton.language as tl

STATS_CHUNK = tl.constexpr(16)  # columns of x per row statistic
STATS_BLOCK = tl.constexpr(64)  # row statistics summed per step by sum_row_stats


@triton.jit
def sum_row_stats(stats_ptr, offs_m, M, width, stride_stats, BLOCK_M: tl.constexpr):
    """Per row of offs_m [BLOCK_M], the sum of squares of its `width` columns, from their statistics."""
    sumsq = tl.zeros([BLOCK_M], tl.float32)
    for c0 in range(0, tl.cdiv(width, STATS_CHUNK), STATS_BLOCK):
        cols = c0 + tl.arange(0, STATS_BLOCK)
        ok = (offs_m[:, None] < M) & (cols[None, :] < tl.cdiv(width, STATS_CHUNK))
        sumsq += tl.sum(tl.load(stats_ptr + offs_m[:, None] * stride_stats + cols[None, :], mask=ok, other=0.0),
                        axis=1)
    return sumsq


@triton.jit
def store_row_stats(new, out_mask, offs_m, n_blk, M, N, stats_ptr, stride_stats, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr):
    """Per row of the finished tile `new` [BLOCK_M, BLOCK_N], the sum of squares of each STATS_CHUNK
    columns: the next norm's statistics."""
    CHUNKS: tl.constexpr = BLOCK_N // STATS_CHUNK
    sq = tl.where(out_mask, new * new, 0.0)
    part = tl.sum(tl.reshape(sq, [BLOCK_M, CHUNKS, STATS_CHUNK]), axis=2)  # [BLOCK_M, CHUNKS]
    cols = n_blk * CHUNKS + tl.arange(0, CHUNKS)
    ok = (offs_m[:, None] < M) & (cols[None, :] < tl.cdiv(N, STATS_CHUNK))
    tl.store(stats_ptr + offs_m[:, None] * stride_stats + cols[None, :], part, mask=ok)
