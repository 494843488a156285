"""The fused norms' row statistics in the orders the product's GEMM no longer runs: summed before the
main loop (`prologue`, STATS_BLOCK a step: the product's order until the commit that moved them into the
loop), or loaded before the loop and summed after it (`early`).

    python lab/fused_norms/stats_order.py prologue examples/qwen3-06b-8b-b4.toml --model draft --pdl end \
        --fusions attn_norm+qkv qkv+rope_kv mlp_norm+gate_up final_norm+lm_head --ledger --json OUT.json

The product (`STATS_IN`, conjugate/kernels/gemm.py) reads them inside its main loop: each K step asks
for the next step's slice of every split's statistics after its weight tile, and sums them after the
loop. Its earlier prologue's offline SASS (sm_90a, llama-3.1-8b's qkv at `sequential`'s tile, sass.py)
showed what that order cost: a loop of 32 scalar loads a thread a step (the row block is 64 rows, 59
of them masked at 5 rows), four steps at a hidden size of 4096, each waiting for its loads and a
shuffle reduction, before the first weight tile was asked for.

* `prologue`: that loop (tile.sum_row_stats) before the product's main loop.
* `early`: the whole row's statistics (up to EARLY_COLS, a hidden size up to 4096) in one load before
  the loop, summed after it. The SASS holds the row block's 256 statistics in 128 registers a thread
  (238 in all, against 120): a wider hidden size fails the check before timing.

This replaces `_accumulate_tile` in the package's GEMM module before anything compiles (every tile
family runs it), then runs benchmarks/verify_kernels.py with the arguments given (each variant
checked before it is timed) and adds `stats_order` to its JSON. Lab code: nothing in `conjugate/`
imports it.
"""
from __future__ import annotations

import sys

import triton
import triton.language as tl

from conjugate.kernels import gemm
from conjugate.kernels.tile import sum_row_stats
from verify_run import run_verify_kernels

ORDERS = ("prologue", "early")
ORDER = tl.constexpr("prologue")  # set by patch() before anything compiles
EARLY_COLS = tl.constexpr(256)  # statistics an early load reads: a hidden size up to 256 x 16 = 4096
_product_accumulate = gemm._accumulate_tile


@triton.jit
def _accumulate_tile_ordered(pid, x_ptr, w_ptr, w2_ptr, stats_ptr,
                             M, N, K, stride_x, stride_w, stride_stats, blk_stride, blk_pairs, tail_start,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                             SPLIT_K: tl.constexpr, NORM: tl.constexpr, STATS_IN: tl.constexpr,
                             TWO_ACC: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """gemm._accumulate_tile with its STATS_IN sum in ORDER, before or around the product's main loop run
    without it; every other tile as the product runs it."""
    stats_in: tl.constexpr = NORM and STATS_IN
    sumsq = tl.zeros([BLOCK_M], tl.float32)
    stats = tl.zeros([BLOCK_M, EARLY_COLS], tl.float32)
    if stats_in:
        rows = (pid % tl.cdiv(M, BLOCK_M)) * BLOCK_M + tl.arange(0, BLOCK_M)
        if ORDER == "prologue":  # STATS_BLOCK statistics a step, before the first weight tile is asked for
            sumsq = sum_row_stats(stats_ptr, rows, M, K, stride_stats, BLOCK_M)
        else:  # "early": one load now, its sum after the loop
            cols = tl.arange(0, EARLY_COLS)
            stats = tl.load(stats_ptr + rows[:, None] * stride_stats + cols[None, :],
                            mask=(rows[:, None] < M) & (cols[None, :] < tl.cdiv(K, 16)), other=0.0)
    acc, acc2, no_sumsq, offs_m, offs_n, m_blk, split, n_blk, num_n = _product_accumulate(
        pid, x_ptr, w_ptr, w2_ptr, stats_ptr, M, N, K, stride_x, stride_w, stride_stats, blk_stride, blk_pairs,
        tail_start, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, NORM and not stats_in, STATS_IN and not stats_in, TWO_ACC,
        DOT_DTYPE)
    if stats_in and ORDER == "early":
        sumsq = tl.sum(stats, axis=1)
    elif not stats_in:
        sumsq = no_sumsq
    return acc, acc2, sumsq, offs_m, offs_n, m_blk, split, n_blk, num_n


def patch(order: str) -> None:
    """Every GEMM tile family compiled from here on reads its statistics in `order` (one of ORDERS)."""
    global ORDER
    if order not in ORDERS:
        raise ValueError(f"stats order {order!r}: one of {', '.join(ORDERS)}")
    ORDER = tl.constexpr(order)
    gemm._accumulate_tile = _accumulate_tile_ordered


def main() -> int:
    if len(sys.argv) < 3 or sys.argv[1] not in ORDERS:
        print(f"usage: stats_order.py {'|'.join(ORDERS)} VERIFY_KERNELS_ARGS...", file=sys.stderr)
        return 2
    patch(sys.argv[1])
    return run_verify_kernels(sys.argv[2:], ["lab/fused_norms/stats_order.py", sys.argv[1]],
                              {"stats_order": sys.argv[1]})


if __name__ == "__main__":
    sys.exit(main())
