"""The fused norms' row statistics read in another order than the product's prologue: loaded before the
main loop and summed after it (`early`), or read inside it a slice a K step, one step ahead (`loop`).

    python lab/fused_norms/stats_order.py loop examples/llama-1b-8b-b1.toml --streamed --pdl start \
        --fusions attn_norm+qkv qkv+rope_kv mlp_norm+gate_up --fused-tiles qkv.SPLIT_K=4 --ledger --json OUT.json

The product's norm prologue (`STATS_IN`, conjugate/kernels/gemm.py) sums a row's statistics
STATS_BLOCK a step before its main loop. Its offline SASS (sm_90a, llama-3.1-8b's qkv at
`sequential`'s tile) shows what that costs: a loop of 32 scalar loads a thread a step (the row block
is 64 rows, 59 of them masked at 5 rows), four steps at a hidden size of 4096, each waiting for its
loads and a shuffle reduction, before the first weight tile is asked for.

* `early`: the whole row's statistics (up to EARLY_COLS, a hidden size up to 4096) in one load before
  the loop, summed after it. The SASS holds the row block's 256 statistics in 128 registers a thread
  (238 in all, against 120): a wider hidden size fails the check before timing.
* `loop`: each K step also reads the statistics of SPLIT_K slices of BLOCK_K columns (its own and the
  same slice of every other split, so each split sums the whole row), issued a step ahead and added
  a step later (124/128 registers; the weights' loads are issued first). A split with fewer K steps than
  the first (K not a multiple of SPLIT_K x BLOCK_K) reads the slices it did not reach after its loop.

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
from verify_run import run_verify_kernels

ORDERS = ("early", "loop")
ORDER = tl.constexpr("loop")  # set by patch() before anything compiles
EARLY_COLS = tl.constexpr(256)  # statistics an early load reads: a hidden size up to 256 x 16 = 4096
_product_accumulate = gemm._accumulate_tile


@triton.jit
def _stats_slice(stats_ptr, offs_m, k0, k_lo, k_span, M, K, stride_stats, BLOCK_K: tl.constexpr,
                 SPLIT_K: tl.constexpr):
    """[BLOCK_M, SPLIT_K * BLOCK_K / 16]: the statistics of K step k0's slice in every split."""
    PER: tl.constexpr = BLOCK_K // 16
    cc = tl.arange(0, SPLIT_K * PER)
    cols = ((k0 - k_lo) + (cc // PER) * k_span) // 16 + cc % PER
    ok = (offs_m[:, None] < M) & (cols[None, :] < tl.cdiv(K, 16)) & (k0 < k_lo + k_span)
    return tl.load(stats_ptr + offs_m[:, None] * stride_stats + cols[None, :], mask=ok, other=0.0)


@triton.jit
def _main_loop_with_stats(pid, x_ptr, w_ptr, w2_ptr, stats_ptr, M, N, K, stride_x, stride_w, stride_stats,
                          blk_stride, blk_pairs, tail_start, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, TWO_ACC: tl.constexpr,
                          DOT_DTYPE: tl.constexpr):
    """The product's main loop (gemm._accumulate_tile's), each K step also reading a statistics slice."""
    num_m, num_n, m_blk, split, n_blk, k_lo, k_hi = gemm._tile_of(pid, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K)
    k_span = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    offs_m = m_blk * BLOCK_M + tl.arange(0, BLOCK_M)
    rows_n = tl.arange(0, BLOCK_N)
    offs_n = n_blk * BLOCK_N + rows_n
    offs_k = tl.arange(0, BLOCK_K)
    w_block = tl.where(n_blk < blk_pairs, n_blk * blk_stride, tail_start + (n_blk - blk_pairs) * BLOCK_N * stride_w)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    stats_sum = tl.zeros([BLOCK_M, SPLIT_K * (BLOCK_K // 16)], tl.float32)
    ahead = _stats_slice(stats_ptr, offs_m, k_lo, k_lo, k_span, M, K, stride_stats, BLOCK_K, SPLIT_K)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        kk = k0 + offs_k
        x = tl.load(x_ptr + offs_m[:, None] * stride_x + kk[None, :],
                    mask=(offs_m[:, None] < M) & (kk[None, :] < k_hi), other=0.0)
        w_mask = (offs_n[:, None] < N) & (kk[None, :] < k_hi)
        w_offs = w_block + rows_n[:, None] * stride_w + kk[None, :]
        w = tl.load(w_ptr + w_offs, mask=w_mask, other=0.0)
        acc += tl.dot(x.to(DOT_DTYPE), tl.trans(w.to(DOT_DTYPE)))
        if TWO_ACC:
            w2 = tl.load(w2_ptr + w_offs, mask=w_mask, other=0.0)
            acc2 += tl.dot(x.to(DOT_DTYPE), tl.trans(w2.to(DOT_DTYPE)))
        stats_sum += ahead  # the slice asked for a step ago
        ahead = _stats_slice(stats_ptr, offs_m, k0 + BLOCK_K, k_lo, k_span, M, K, stride_stats, BLOCK_K, SPLIT_K)
    stats_sum += ahead  # where this split stopped: nothing when every split takes k_span's steps
    for k0 in range(k_lo + tl.cdiv(k_hi - k_lo, BLOCK_K) * BLOCK_K + BLOCK_K, k_lo + k_span, BLOCK_K):
        stats_sum += _stats_slice(stats_ptr, offs_m, k0, k_lo, k_span, M, K, stride_stats, BLOCK_K, SPLIT_K)
    return acc, acc2, tl.sum(stats_sum, axis=1), offs_m, offs_n, m_blk, split, n_blk, num_n


@triton.jit
def _accumulate_tile_ordered(pid, x_ptr, w_ptr, w2_ptr, stats_ptr,
                             M, N, K, stride_x, stride_w, stride_stats, blk_stride, blk_pairs, tail_start,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                             SPLIT_K: tl.constexpr, NORM: tl.constexpr, STATS_IN: tl.constexpr,
                             TWO_ACC: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """gemm._accumulate_tile with its STATS_IN sum in ORDER; every other tile as the product runs it."""
    if NORM and STATS_IN and ORDER == "loop":
        acc, acc2, sumsq, offs_m, offs_n, m_blk, split, n_blk, num_n = _main_loop_with_stats(
            pid, x_ptr, w_ptr, w2_ptr, stats_ptr, M, N, K, stride_x, stride_w, stride_stats, blk_stride, blk_pairs,
            tail_start, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, TWO_ACC, DOT_DTYPE)
    else:
        early: tl.constexpr = NORM and STATS_IN
        stats = tl.zeros([BLOCK_M, EARLY_COLS], tl.float32)
        if early:  # ORDER "early": one load now, its sum after the product's loop (run without its prologue)
            rows = (pid % tl.cdiv(M, BLOCK_M)) * BLOCK_M + tl.arange(0, BLOCK_M)
            cols = tl.arange(0, EARLY_COLS)
            stats = tl.load(stats_ptr + rows[:, None] * stride_stats + cols[None, :],
                            mask=(rows[:, None] < M) & (cols[None, :] < tl.cdiv(K, 16)), other=0.0)
        acc, acc2, sumsq, offs_m, offs_n, m_blk, split, n_blk, num_n = _product_accumulate(
            pid, x_ptr, w_ptr, w2_ptr, stats_ptr, M, N, K, stride_x, stride_w, stride_stats, blk_stride, blk_pairs,
            tail_start, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, NORM and not early, STATS_IN and not early, TWO_ACC,
            DOT_DTYPE)
        if early:
            sumsq = tl.sum(stats, axis=1)
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
