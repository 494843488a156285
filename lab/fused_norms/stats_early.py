"""The fused norms' row statistics loaded before the main loop and summed after it: no wait before the
first weight tile.

    python lab/fused_norms/stats_early.py examples/llama-1b-8b-b1.toml --streamed --pdl start \
        --fusions attn_norm+qkv qkv+rope_kv mlp_norm+gate_up --fused-tiles qkv.SPLIT_K=4 --ledger --json OUT.json

The product's norm prologue (`STATS_IN`, conjugate/kernels/gemm.py) sums a row's statistics
STATS_BLOCK a step before its main loop: each step waits for its load, so at a hidden size of 4096
four dependent L2 round trips pass before the first weight tile is asked for. Here the whole row's
statistics (up to STATS_COLS of them, one per 16 columns: a hidden size up to 4096) are asked for in
one load before the loop and summed only after it, where the epilogue needs them: the wait overlaps
the weights' stream. This replaces `_accumulate_tile` in the package's GEMM module before anything
compiles (every tile family runs it), then runs benchmarks/verify_kernels.py with the arguments given,
which checks each variant against the reference before timing it, and adds `stats_order` to its JSON.
A wider hidden size fails that check (its statistics past STATS_COLS are not read). Lab code: nothing
in `conjugate/` imports it.
"""
from __future__ import annotations

import sys

import triton
import triton.language as tl

from conjugate.kernels import gemm
from verify_run import run_verify_kernels

STATS_COLS = tl.constexpr(256)  # statistics read in one load: a hidden size up to 256 x 16 = 4096
_product_accumulate = gemm._accumulate_tile


@triton.jit
def _accumulate_tile_early(pid, x_ptr, w_ptr, w2_ptr, stats_ptr,
                           M, N, K, stride_x, stride_w, stride_stats, blk_stride, blk_pairs, tail_start,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           SPLIT_K: tl.constexpr, NORM: tl.constexpr, STATS_IN: tl.constexpr,
                           TWO_ACC: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """The product's `_accumulate_tile`, its STATS_IN sum split in two: the load first, the sum last."""
    if NORM and STATS_IN:
        num_m, num_n, m_blk, split, n_blk, k_lo, k_hi = gemm._tile_of(pid, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K,
                                                                      SPLIT_K)
        offs_m = m_blk * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, STATS_COLS)
        stats = tl.load(stats_ptr + offs_m[:, None] * stride_stats + cols[None, :],
                        mask=(offs_m[:, None] < M) & (cols[None, :] < tl.cdiv(K, 16)), other=0.0)
        acc, acc2, _, offs_m, offs_n, m_blk, split, n_blk, num_n = _product_accumulate(
            pid, x_ptr, w_ptr, w2_ptr, stats_ptr, M, N, K, stride_x, stride_w, stride_stats, blk_stride, blk_pairs,
            tail_start, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, False, False, TWO_ACC, DOT_DTYPE)
        sumsq = tl.sum(stats, axis=1)
    else:
        acc, acc2, sumsq, offs_m, offs_n, m_blk, split, n_blk, num_n = _product_accumulate(
            pid, x_ptr, w_ptr, w2_ptr, stats_ptr, M, N, K, stride_x, stride_w, stride_stats, blk_stride, blk_pairs,
            tail_start, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, NORM, STATS_IN, TWO_ACC, DOT_DTYPE)
    return acc, acc2, sumsq, offs_m, offs_n, m_blk, split, n_blk, num_n


def patch() -> None:
    """Every GEMM tile family compiled from here on sums its statistics late."""
    gemm._accumulate_tile = _accumulate_tile_early


def main() -> int:
    if len(sys.argv) < 2:
        print("usage: stats_early.py VERIFY_KERNELS_ARGS...", file=sys.stderr)
        return 2
    patch()
    return run_verify_kernels(sys.argv[1:], ["lab/fused_norms/stats_early.py"], {"stats_order": "early"})


if __name__ == "__main__":
    sys.exit(main())
