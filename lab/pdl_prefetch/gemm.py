"""Weight-streaming GEMM for decode shapes: out[M, N] = x[M, K] @ w[N, K]^T, M up to a few hundred.

Weights keep the Hugging Face layout [N, K] (row stride `stride_w`); activation rows are fp32 or
the weights' type, cast to DOT_DTYPE at the load.
Program `pid` owns one (M block, split, N block) tile; M blocks vary fastest so the programs that
stream the same weight tile run side by side and share it through L2.

Prologue: NORM scales each row by 1/rms(x) (RMSNorm folded into the GEMM: the norm weight was
multiplied into `w` at compile time). Its sum of squares comes from a pass over the split's part of
each row, or (STATS_IN) from the row statistics the residual GEMM that wrote x left: with STATS_OUT a
RESIDUAL epilogue that holds finished rows (splits summed in order, or, with ATOMIC_SPLIT, the
tile's last split reading the summed rows back) stores, per row, the sum of squares of each
STATS_CHUNK columns it wrote, and the norm prologue sums those (a few per cent of the row's bytes) in
a fixed order instead of every program re-reading its whole rows of x, which made the fused norm
slower than a separate norm launch on the H200. Epilogues (EPILOGUE constexpr):
    STORE     out = acc (+ bias)
    RESIDUAL  out += acc (the residual stream)
    SILU_MUL  out = silu(x @ w^T) * (x @ w2^T): gate and up projections in one tile
With SPLIT_K > 1 each split stores its partial sums in a workspace slot of its own and the tile's
last split adds them up, in split order, and runs the epilogue: deterministic, no float atomics.
With ATOMIC_SPLIT (the RESIDUAL epilogue only, no bias, no norm prologue) each split instead adds
its partial into `out` with a float atomic: no workspace or fix-up step on the critical path, the
sum's rounding order varying from run to run (plan `split_reduce: atomic`); a counter only where it
writes row statistics or a copy of the rows, so that the last split reads the finished rows.
With COPY_OUT a RESIDUAL epilogue also stores the finished rows into `copy` (where row statistics
come from: the rows in hand, or the tile's last split reading them back): the input of a fused MLP
with its norm fused (mlp.py), which must not read the residual stream it adds into.
    ARGMAX    per-tile row max and index to scratch; the last program to finish reduces them to
              one token per row (first index on ties, like torch.argmax); logits are written only
              when WRITE_OUT
    ROPE_KV   the qkv projection with RoPE and the KV-cache write (rope.py's op) in its epilogue:
              a tile is one head, its two halves accumulated apart (acc: the first HEAD_DIM/2
              columns, acc2: the second), so rotate-half pairs meet in registers; bias, Qwen3's
              QK-norm and the rotation follow, then q goes to q_out, k and v into the layer's caches
              at each row's position (lengths read at run time). N counts half-head columns.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dataclasses import dataclass

from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from conjugate.compiler.persist import L2_LINE_BITS, grid_wait, prefetch_l2
from conjugate.compiler.tile import INTERPRETING, PartCall, TileSignature, cdiv, dot_dtype, next_pow2

# The EPILOGUE constexpr's values, as globals the tile functions can read.
EPILOGUE_STORE = tl.constexpr(0)
EPILOGUE_RESIDUAL = tl.constexpr(1)
EPILOGUE_SILU_MUL = tl.constexpr(2)
EPILOGUE_ARGMAX = tl.constexpr(3)
EPILOGUE_ROPE_KV = tl.constexpr(4)
EPILOGUES = {"store": EPILOGUE_STORE.value, "residual": EPILOGUE_RESIDUAL.value,
             "silu_mul": EPILOGUE_SILU_MUL.value, "argmax": EPILOGUE_ARGMAX.value,
             "rope_kv": EPILOGUE_ROPE_KV.value}  # gemm_call's names
# The WAIT constexpr's values, what the tile waits for after loading its first weights (PRELOAD_K): nothing
# (the dispatcher waits, or no one), the kernel before (a programmatic dependent launch), the same and
# then it releases the next launch (the plan's trigger `start`), or every program of its persistent grid
# past the barrier at wait_ptr (persist.grid_wait: the part before is done).
WAIT_NONE = tl.constexpr(0)
WAIT_PDL = tl.constexpr(1)
WAIT_PDL_RELEASE = tl.constexpr(2)
WAIT_GRID = tl.constexpr(3)
_REDUCE_BLOCK = tl.constexpr(128)  # partial maxima reduced per step by the last program
STATS_CHUNK = tl.constexpr(16)  # columns of x per row statistic a residual epilogue writes (STATS_OUT)
STATS_BLOCK = tl.constexpr(64)  # row statistics summed per step by a norm prologue (STATS_IN)


@triton.jit
def _argmax_epilogue(acc, offs_m, offs_n, n_blk, num_n, pid_count, M, N, part_val_ptr, part_idx_ptr, counter_ptr,
                     tok_ptr, stride_tok, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    vals = tl.where(offs_n[None, :] < N, acc, float("-inf"))  # [BLOCK_M, BLOCK_N]
    tile_max = tl.max(vals, axis=1)  # [BLOCK_M]
    tile_idx = tl.argmax(vals, axis=1, tie_break_left=True) + n_blk * BLOCK_N
    row_ok = offs_m < M
    tl.store(part_val_ptr + offs_m * num_n + n_blk, tile_max, mask=row_ok)
    tl.store(part_idx_ptr + offs_m * num_n + n_blk, tile_idx.to(tl.int32), mask=row_ok)
    tl.debug_barrier()  # every thread's partial is stored before the release below
    done = tl.atomic_add(counter_ptr, 1)  # acq_rel: the last program sees every partial
    if done == pid_count - 1:
        for m0 in range(0, M, BLOCK_M):
            rows = m0 + tl.arange(0, BLOCK_M)
            best_val = tl.full([BLOCK_M], float("-inf"), tl.float32)
            best_idx = tl.zeros([BLOCK_M], tl.int32)
            for c0 in range(0, num_n, _REDUCE_BLOCK):
                cols = c0 + tl.arange(0, _REDUCE_BLOCK)
                ok = (rows[:, None] < M) & (cols[None, :] < num_n)
                val = tl.load(part_val_ptr + rows[:, None] * num_n + cols[None, :], mask=ok, other=float("-inf"),
                              cache_modifier=".cg")  # [BLOCK_M, R]
                idx = tl.load(part_idx_ptr + rows[:, None] * num_n + cols[None, :], mask=ok, other=0, cache_modifier=".cg")
                chunk_max = tl.max(val, axis=1)
                chunk_arg = tl.argmax(val, axis=1, tie_break_left=True)
                chunk_idx = tl.sum(tl.where(cols[None, :] == (c0 + chunk_arg)[:, None], idx, 0), axis=1)
                better = chunk_max > best_val  # strict: an earlier tile wins a tie
                best_idx = tl.where(better, chunk_idx, best_idx)
                best_val = tl.where(better, chunk_max, best_val)
            tl.store(tok_ptr + rows * stride_tok, best_idx.to(tl.int64), mask=rows < M)
        tl.atomic_xchg(counter_ptr, 0)  # ready for the next launch


@triton.jit
def _rope_kv_epilogue(acc, acc2, offs_m, head, M, bias_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, cos_ptr, sin_ptr,
                      q_norm_ptr, k_norm_ptr, lengths_ptr, rope_offset, rope_tokens, s_max, stride_q, eps,
                      HAS_BIAS: tl.constexpr, NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
                      HEAD_DIM: tl.constexpr, QK_NORM: tl.constexpr):
    """One head of rows offs_m: acc, acc2 [BLOCK_M, HEAD_DIM/2] its two halves (rope.py's treatment)."""
    HALF: tl.constexpr = HEAD_DIM // 2
    j = tl.arange(0, HALF)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + head * HEAD_DIM + j).to(tl.float32)[None, :]
        acc2 += tl.load(bias_ptr + head * HEAD_DIM + HALF + j).to(tl.float32)[None, :]
    seq = (offs_m // rope_tokens).to(tl.int64)  # cache offsets in int64: a layer's cache may pass 2^31
    pos = tl.load(lengths_ptr + seq, mask=offs_m < M, other=0).to(tl.int32) + rope_offset + offs_m % rope_tokens
    ok = ((offs_m < M) & (pos < s_max))[:, None]  # a length past the cache writes nothing
    cs = pos[:, None] * HEAD_DIM + j[None, :]
    if head >= NUM_HEADS + NUM_KV_HEADS:  # a value head: stored as computed
        dst = ((seq * NUM_KV_HEADS + head - NUM_HEADS - NUM_KV_HEADS) * s_max + pos)[:, None] * HEAD_DIM + j[None, :]
        tl.store(v_cache_ptr + dst, acc.to(v_cache_ptr.dtype.element_ty), mask=ok)
        tl.store(v_cache_ptr + dst + HALF, acc2.to(v_cache_ptr.dtype.element_ty), mask=ok)
    else:
        if QK_NORM:  # both weights loaded, one chosen: no branch on which pointer to read
            rstd = tl.rsqrt((tl.sum(acc * acc, axis=1) + tl.sum(acc2 * acc2, axis=1)) / HEAD_DIM + eps)[:, None]
            is_q = head < NUM_HEADS
            w1 = tl.where(is_q, tl.load(q_norm_ptr + j).to(tl.float32), tl.load(k_norm_ptr + j).to(tl.float32))
            w2 = tl.where(is_q, tl.load(q_norm_ptr + HALF + j).to(tl.float32),
                          tl.load(k_norm_ptr + HALF + j).to(tl.float32))
            acc = acc * rstd * w1[None, :]
            acc2 = acc2 * rstd * w2[None, :]
        y1 = acc * tl.load(cos_ptr + cs, mask=ok, other=0.0) - acc2 * tl.load(sin_ptr + cs, mask=ok, other=0.0)
        y2 = acc2 * tl.load(cos_ptr + cs + HALF, mask=ok, other=0.0) + acc * tl.load(sin_ptr + cs + HALF, mask=ok,
                                                                                      other=0.0)
        if head < NUM_HEADS:
            q_dst = offs_m[:, None] * stride_q + head * HEAD_DIM + j[None, :]  # its own name: int32, dst int64
            tl.store(q_out_ptr + q_dst, y1, mask=ok)
            tl.store(q_out_ptr + q_dst + HALF, y2, mask=ok)
        else:
            dst = ((seq * NUM_KV_HEADS + head - NUM_HEADS) * s_max + pos)[:, None] * HEAD_DIM + j[None, :]
            tl.store(k_cache_ptr + dst, y1.to(k_cache_ptr.dtype.element_ty), mask=ok)
            tl.store(k_cache_ptr + dst + HALF, y2.to(k_cache_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _tile_of(pid, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             SPLIT_K: tl.constexpr):
    """Program pid's tile: (num_m, num_n, m_blk, split, n_blk, k_lo, k_hi), M blocks varying fastest."""
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    m_blk = pid % num_m
    split = (pid // num_m) % SPLIT_K
    n_blk = pid // (num_m * SPLIT_K)
    k_span = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    k_lo = split * k_span
    return num_m, num_n, m_blk, split, n_blk, k_lo, tl.minimum(k_lo + k_span, K)


@triton.jit
def _weights(w_ptr, w_desc, w_offs, w_mask, w_row, k0, W_TMA: tl.constexpr):
    """One [BLOCK_N, BLOCK_K] weight tile: through the tensor memory accelerator from the host-made
    descriptor (W_TMA; rows and columns past the matrix read as zeros, columns past the split's end
    meet zero input columns), else masked pointer loads."""
    if W_TMA:
        return w_desc.load([w_row, k0])
    else:
        return tl.load(w_ptr + w_offs, mask=w_mask, other=0.0)


@triton.jit
def gemm_tile(pid, x_ptr, w_ptr, w2_ptr, bias_ptr, out_ptr, part_val_ptr, part_idx_ptr, counter_ptr, tok_ptr, ws_ptr,
              stats_ptr, copy_ptr, M, N, K, stride_x, stride_w, stride_out, stride_tok, stride_stats, stride_copy, eps,
              blk_stride, blk_pairs, tail_start,
              q_out_ptr, k_cache_ptr, v_cache_ptr, cos_ptr, sin_ptr, q_norm_ptr, k_norm_ptr, lengths_ptr,
              rope_offset, rope_tokens, s_max, stride_q, rope_eps, w_desc, w2_desc, wait_ptr, wait_count,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
              NORM: tl.constexpr, EPILOGUE: tl.constexpr, HAS_BIAS: tl.constexpr, WRITE_OUT: tl.constexpr,
              DOT_DTYPE: tl.constexpr, NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
              HEAD_DIM: tl.constexpr, QK_NORM: tl.constexpr, ATOMIC_SPLIT: tl.constexpr, STATS_OUT: tl.constexpr,
              STATS_IN: tl.constexpr, COPY_OUT: tl.constexpr, W_TMA: tl.constexpr, PRELOAD_K: tl.constexpr,
              WAIT: tl.constexpr):
    TWO_ACC: tl.constexpr = (EPILOGUE == EPILOGUE_SILU_MUL) or (EPILOGUE == EPILOGUE_ROPE_KV)
    num_m, num_n, m_blk, split, n_blk, k_lo, k_hi = _tile_of(pid, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K)

    offs_m = m_blk * BLOCK_M + tl.arange(0, BLOCK_M)
    rows_n = tl.arange(0, BLOCK_N)
    offs_n = n_blk * BLOCK_N + rows_n
    offs_k = tl.arange(0, BLOCK_K)
    # The weight block of rows n_blk*BLOCK_N.. : contiguous in the separate layout (blk_pairs = 0);
    # in the packed layout the first blk_pairs blocks alternate with the other model's.
    w_block = tl.where(n_blk < blk_pairs, n_blk * blk_stride, tail_start + (n_blk - blk_pairs) * BLOCK_N * stride_w)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    if PRELOAD_K > 0:  # the split's first PRELOAD_K weight columns, before the wait (weights never depend on it)
        pre_k = k_lo + tl.arange(0, PRELOAD_K)
        pre_mask = (offs_n[:, None] < N) & (pre_k[None, :] < k_hi)
        pre_offs = w_block + rows_n[:, None] * stride_w + pre_k[None, :]
        w_pre = tl.load(w_ptr + pre_offs, mask=pre_mask, other=0.0)  # [BN, PRELOAD_K], held in registers
        if TWO_ACC:
            w2_pre = tl.load(w2_ptr + pre_offs, mask=pre_mask, other=0.0)
    if WAIT == WAIT_GRID:  # the part before, done by every program of the grid: x is whole
        grid_wait(wait_ptr, wait_count)
    elif WAIT != WAIT_NONE:  # the kernel before this one has ended; its writes (x among them) are visible
        gdc_wait()
        if WAIT == WAIT_PDL_RELEASE:  # the release at the start, after the wait: two launches in flight
            gdc_launch_dependents()
    sumsq = tl.zeros([BLOCK_M], tl.float32)
    if NORM and STATS_IN:  # the row statistics the residual GEMM that wrote x left: every split sums all
        for c0 in range(0, tl.cdiv(K, STATS_CHUNK), STATS_BLOCK):
            cols = c0 + tl.arange(0, STATS_BLOCK)
            ok = (offs_m[:, None] < M) & (cols[None, :] < tl.cdiv(K, STATS_CHUNK))
            sumsq += tl.sum(tl.load(stats_ptr + offs_m[:, None] * stride_stats + cols[None, :], mask=ok, other=0.0),
                            axis=1)
    elif NORM:  # a pre-pass over this split's rows, so the main loop stays the plain, pipelined one
        for k0 in range(k_lo, k_hi, BLOCK_K):
            kk = k0 + offs_k
            x = tl.load(x_ptr + offs_m[:, None] * stride_x + kk[None, :],
                        mask=(offs_m[:, None] < M) & (kk[None, :] < k_hi), other=0.0).to(tl.float32)  # [BM, BK]
            sumsq += tl.sum(x * x, axis=1)
    w_row = w_block // stride_w  # the block's first weight row (W_TMA)
    k_start = k_lo
    if PRELOAD_K > 0:
        x_pre = tl.load(x_ptr + offs_m[:, None] * stride_x + pre_k[None, :],
                        mask=(offs_m[:, None] < M) & (pre_k[None, :] < k_hi), other=0.0)  # [BM, PRELOAD_K]
        acc += tl.dot(x_pre.to(DOT_DTYPE), tl.trans(w_pre.to(DOT_DTYPE)))
        if TWO_ACC:
            acc2 += tl.dot(x_pre.to(DOT_DTYPE), tl.trans(w2_pre.to(DOT_DTYPE)))
        k_start = tl.minimum(k_lo + PRELOAD_K, k_hi)
    for k0 in range(k_start, k_hi, BLOCK_K):
        kk = k0 + offs_k
        x = tl.load(x_ptr + offs_m[:, None] * stride_x + kk[None, :],
                    mask=(offs_m[:, None] < M) & (kk[None, :] < k_hi), other=0.0)  # [BM, BK]
        w_mask = (offs_n[:, None] < N) & (kk[None, :] < k_hi)
        w_offs = w_block + rows_n[:, None] * stride_w + kk[None, :]
        w = _weights(w_ptr, w_desc, w_offs, w_mask, w_row, k0, W_TMA)  # [BN, BK]
        acc += tl.dot(x.to(DOT_DTYPE), tl.trans(w.to(DOT_DTYPE)))  # fp32 accumulate
        if TWO_ACC:
            w2 = _weights(w2_ptr, w2_desc, w_offs, w_mask, w_row, k0, W_TMA)
            acc2 += tl.dot(x.to(DOT_DTYPE), tl.trans(w2.to(DOT_DTYPE)))
    if ATOMIC_SPLIT:  # out += this split's partial, the splits in any order
        out_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        out_ptrs = out_ptr + offs_m[:, None] * stride_out + offs_n[None, :]
        tl.atomic_add(out_ptrs, acc, mask=out_mask, sem="relaxed")
        if STATS_OUT or COPY_OUT:  # the tile's last split (a counter says which) reads the finished rows back
            tile = m_blk * num_n + n_blk
            tl.debug_barrier()  # every thread's adds are issued before the release below
            if tl.atomic_add(counter_ptr + 1 + tile, 1) == SPLIT_K - 1:
                new = tl.load(out_ptrs, mask=out_mask, other=0.0, cache_modifier=".cg")
                if STATS_OUT:
                    _store_row_stats(new, out_mask, offs_m, n_blk, M, N, stats_ptr, stride_stats, BLOCK_M, BLOCK_N)
                if COPY_OUT:
                    _store_copy(new, out_mask, offs_m, offs_n, copy_ptr, stride_copy)
                tl.atomic_xchg(counter_ptr + 1 + tile, 0)  # ready for the next launch
    elif SPLIT_K > 1:
        # Split-K fix-up: each split stores its partials in a slot of its own; the tile's last split
        # (a counter says which) sums the slots in split order and runs the epilogue alone. No
        # floating-point atomics, so the result does not depend on the programs' timing.
        tile = m_blk * num_n + n_blk
        slot = (split * M + offs_m[:, None]) * N + offs_n[None, :]  # ws: [SPLIT_K, M, N]
        ws_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        tl.store(ws_ptr + slot, acc, mask=ws_mask)
        if TWO_ACC:
            tl.store(ws_ptr + SPLIT_K * M * N + slot, acc2, mask=ws_mask)
        if NORM and not STATS_IN:  # with STATS_IN every split has the whole row's sum already
            tl.store(ws_ptr + 2 * SPLIT_K * M * N + (split * num_n + n_blk) * M + offs_m, sumsq, mask=offs_m < M)
        tl.debug_barrier()  # every thread's partials are stored before the release below
        arrived = tl.atomic_add(counter_ptr + 1 + tile, 1)
        if arrived == SPLIT_K - 1:
            acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            acc2 = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            if not STATS_IN:
                sumsq = tl.zeros([BLOCK_M], tl.float32)
            for s in range(SPLIT_K):
                slot = (s * M + offs_m[:, None]) * N + offs_n[None, :]
                acc += tl.load(ws_ptr + slot, mask=ws_mask, other=0.0, cache_modifier=".cg")
                if TWO_ACC:
                    acc2 += tl.load(ws_ptr + SPLIT_K * M * N + slot, mask=ws_mask, other=0.0, cache_modifier=".cg")
                if NORM and not STATS_IN:
                    sumsq += tl.load(ws_ptr + 2 * SPLIT_K * M * N + (s * num_n + n_blk) * M + offs_m,
                                     mask=offs_m < M, other=0.0, cache_modifier=".cg")
            tl.atomic_xchg(counter_ptr + 1 + tile, 0)  # ready for the next launch
            _epilogue(acc, acc2, sumsq, offs_m, offs_n, n_blk, num_n, M, N, K, eps, bias_ptr, out_ptr, stride_out,
                      part_val_ptr, part_idx_ptr, counter_ptr, tok_ptr, stride_tok, q_out_ptr, k_cache_ptr,
                      v_cache_ptr, cos_ptr, sin_ptr, q_norm_ptr, k_norm_ptr, lengths_ptr, rope_offset, rope_tokens,
                      s_max, stride_q, rope_eps, stats_ptr, stride_stats, copy_ptr, stride_copy, BLOCK_M, BLOCK_N, NORM,
                      EPILOGUE, HAS_BIAS, WRITE_OUT, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, QK_NORM, STATS_OUT, COPY_OUT)
    else:
        _epilogue(acc, acc2, sumsq, offs_m, offs_n, n_blk, num_n, M, N, K, eps, bias_ptr, out_ptr, stride_out,
                  part_val_ptr, part_idx_ptr, counter_ptr, tok_ptr, stride_tok, q_out_ptr, k_cache_ptr, v_cache_ptr,
                  cos_ptr, sin_ptr, q_norm_ptr, k_norm_ptr, lengths_ptr, rope_offset, rope_tokens, s_max, stride_q,
                  rope_eps, stats_ptr, stride_stats, copy_ptr, stride_copy, BLOCK_M, BLOCK_N, NORM, EPILOGUE, HAS_BIAS,
                  WRITE_OUT, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, QK_NORM, STATS_OUT, COPY_OUT)


@triton.jit
def gemm_prefetch(pid, x_ptr, w_ptr, w2_ptr, bias_ptr, out_ptr, part_val_ptr, part_idx_ptr, counter_ptr, tok_ptr,
                  ws_ptr, stats_ptr, copy_ptr, M, N, K, stride_x, stride_w, stride_out, stride_tok, stride_stats,
                  stride_copy, eps, blk_stride, blk_pairs, tail_start,
                  q_out_ptr, k_cache_ptr, v_cache_ptr, cos_ptr, sin_ptr, q_norm_ptr, k_norm_ptr, lengths_ptr,
                  rope_offset, rope_tokens, s_max, stride_q, rope_eps, w_desc, w2_desc, wait_ptr, wait_count,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                  NORM: tl.constexpr, EPILOGUE: tl.constexpr, HAS_BIAS: tl.constexpr, WRITE_OUT: tl.constexpr,
                  DOT_DTYPE: tl.constexpr, NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
                  HEAD_DIM: tl.constexpr, QK_NORM: tl.constexpr, ATOMIC_SPLIT: tl.constexpr, STATS_OUT: tl.constexpr,
                  STATS_IN: tl.constexpr, COPY_OUT: tl.constexpr, W_TMA: tl.constexpr, PRELOAD_K: tl.constexpr,
                  WAIT: tl.constexpr):
    """gemm_tile's weight rows and K range for program `pid`, prefetched into L2 (persist.py): one
    request per 128-byte line, out-of-range rows clamped to the block's first. Its parameters are
    gemm_tile's, in order: a persistent launch calls both with one argument list."""
    TWO_ACC: tl.constexpr = (EPILOGUE == EPILOGUE_SILU_MUL) or (EPILOGUE == EPILOGUE_ROPE_KV)
    num_m, num_n, m_blk, split, n_blk, k_lo, k_hi = _tile_of(pid, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K)
    rows_n = tl.arange(0, BLOCK_N)
    rows = tl.where(n_blk * BLOCK_N + rows_n < N, rows_n, 0)
    w_block = tl.where(n_blk < blk_pairs, n_blk * blk_stride, tail_start + (n_blk - blk_pairs) * BLOCK_N * stride_w)
    LINE: tl.constexpr = L2_LINE_BITS // w_ptr.dtype.element_ty.primitive_bitwidth
    if m_blk == 0:  # the M blocks of one weight tile share it: one of them asks
        for k0 in range(k_lo, k_hi, LINE):
            prefetch_l2(w_ptr + w_block + rows * stride_w + k0)
            if TWO_ACC:
                prefetch_l2(w2_ptr + w_block + rows * stride_w + k0)


@triton.jit
def _store_row_stats(new, out_mask, offs_m, n_blk, M, N, stats_ptr, stride_stats, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr):
    """Per row of the finished tile `new`, the sum of squares of each STATS_CHUNK columns: the next
    norm's statistics (STATS_OUT)."""
    CHUNKS: tl.constexpr = BLOCK_N // STATS_CHUNK
    sq = tl.where(out_mask, new * new, 0.0)
    part = tl.sum(tl.reshape(sq, [BLOCK_M, CHUNKS, STATS_CHUNK]), axis=2)  # [BLOCK_M, CHUNKS]
    cols = n_blk * CHUNKS + tl.arange(0, CHUNKS)
    ok = (offs_m[:, None] < M) & (cols[None, :] < tl.cdiv(N, STATS_CHUNK))
    tl.store(stats_ptr + offs_m[:, None] * stride_stats + cols[None, :], part, mask=ok)


@triton.jit
def _store_copy(new, out_mask, offs_m, offs_n, copy_ptr, stride_copy):
    """The finished residual rows, also into `copy_ptr` in its type (COPY_OUT): the input of a fused MLP
    whose norm is fused too (mlp.py), which must not read the residual stream it adds into."""
    tl.store(copy_ptr + offs_m[:, None] * stride_copy + offs_n[None, :], new.to(copy_ptr.dtype.element_ty),
             mask=out_mask)


@triton.jit
def _epilogue(acc, acc2, sumsq, offs_m, offs_n, n_blk, num_n, M, N, K, eps, bias_ptr, out_ptr, stride_out,
              part_val_ptr, part_idx_ptr, counter_ptr, tok_ptr, stride_tok, q_out_ptr, k_cache_ptr, v_cache_ptr,
              cos_ptr, sin_ptr, q_norm_ptr, k_norm_ptr, lengths_ptr, rope_offset, rope_tokens, s_max, stride_q,
              rope_eps, stats_ptr, stride_stats, copy_ptr, stride_copy, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              NORM: tl.constexpr, EPILOGUE: tl.constexpr, HAS_BIAS: tl.constexpr, WRITE_OUT: tl.constexpr,
              NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, QK_NORM: tl.constexpr,
              STATS_OUT: tl.constexpr, COPY_OUT: tl.constexpr):
    if NORM:
        rstd = 1.0 / tl.sqrt(sumsq / K + eps)  # [BLOCK_M]
        acc = acc * rstd[:, None]
        acc2 = acc2 * rstd[:, None]
    if EPILOGUE == EPILOGUE_ROPE_KV:
        _rope_kv_epilogue(acc, acc2, offs_m, n_blk, M, bias_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, cos_ptr, sin_ptr,
                          q_norm_ptr, k_norm_ptr, lengths_ptr, rope_offset, rope_tokens, s_max, stride_q, rope_eps,
                          HAS_BIAS, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, QK_NORM)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        out_ptrs = out_ptr + offs_m[:, None] * stride_out + offs_n[None, :]
        out_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        if EPILOGUE == EPILOGUE_STORE:
            tl.store(out_ptrs, acc, mask=out_mask)
        elif EPILOGUE == EPILOGUE_RESIDUAL:
            new = tl.load(out_ptrs, mask=out_mask, other=0.0) + acc
            tl.store(out_ptrs, new, mask=out_mask)
            if STATS_OUT:
                _store_row_stats(new, out_mask, offs_m, n_blk, M, N, stats_ptr, stride_stats, BLOCK_M, BLOCK_N)
            if COPY_OUT:
                _store_copy(new, out_mask, offs_m, offs_n, copy_ptr, stride_copy)
        elif EPILOGUE == EPILOGUE_SILU_MUL:
            tl.store(out_ptrs, (acc * tl.sigmoid(acc) * acc2).to(out_ptr.dtype.element_ty), mask=out_mask)
        else:  # EPILOGUE_ARGMAX
            if WRITE_OUT:
                tl.store(out_ptrs, acc, mask=out_mask)
            _argmax_epilogue(acc, offs_m, offs_n, n_blk, num_n, tl.cdiv(M, BLOCK_M) * num_n, M, N, part_val_ptr,
                             part_idx_ptr, counter_ptr, tok_ptr, stride_tok, BLOCK_M, BLOCK_N)


SIGNATURE = TileSignature.of(gemm_tile)


@dataclass(frozen=True)
class RopeKV:
    """Where the ROPE_KV epilogue puts a qkv projection's heads (rope.py's op, the same buffers)."""
    q_out: torch.Tensor  # fp32 [rows, num_heads * head_dim]
    k_cache: torch.Tensor  # one layer's [B, num_kv_heads, S_max, head_dim]
    v_cache: torch.Tensor
    cos: torch.Tensor  # fp32 [S_max, head_dim]
    sin: torch.Tensor
    lengths: torch.Tensor  # int64 [B]
    offset: int  # the draft step
    tokens: int  # rows per sequence
    num_heads: int
    num_kv_heads: int
    head_dim: int
    q_norm: torch.Tensor | None = None  # Qwen3's QK-norm weights
    k_norm: torch.Tensor | None = None
    eps: float = 1e-6


def _rope_args(rope: RopeKV | None, dummy: torch.Tensor) -> tuple[dict, dict]:
    """The ROPE_KV epilogue's arguments (dummies, never read, for every other epilogue)."""
    if rope is None:
        return (dict(q_out_ptr=dummy, k_cache_ptr=dummy, v_cache_ptr=dummy, cos_ptr=dummy, sin_ptr=dummy,
                     q_norm_ptr=dummy, k_norm_ptr=dummy, lengths_ptr=dummy, rope_offset=0, rope_tokens=1, s_max=1,
                     stride_q=0, rope_eps=0.0),
                dict(NUM_HEADS=1, NUM_KV_HEADS=1, HEAD_DIM=2, QK_NORM=False))
    qk_norm = rope.q_norm is not None
    return (dict(q_out_ptr=rope.q_out, k_cache_ptr=rope.k_cache, v_cache_ptr=rope.v_cache, cos_ptr=rope.cos,
                 sin_ptr=rope.sin, q_norm_ptr=rope.q_norm if qk_norm else rope.cos,
                 k_norm_ptr=rope.k_norm if qk_norm else rope.cos, lengths_ptr=rope.lengths, rope_offset=rope.offset,
                 rope_tokens=rope.tokens, s_max=rope.k_cache.shape[2], stride_q=rope.q_out.stride(0),
                 rope_eps=float(rope.eps)),
            dict(NUM_HEADS=rope.num_heads, NUM_KV_HEADS=rope.num_kv_heads, HEAD_DIM=rope.head_dim, QK_NORM=qk_norm))


def _check_stats(stats, stats_out: bool, stats_in: bool, rows: int, n: int, k: int, block_n: int, epilogue: str,
                 atomic_split: bool, norm_eps) -> None:
    """ValueError for row statistics a GEMM cannot write or read."""
    if not (stats_out or stats_in):
        return
    width = n if stats_out else k
    if stats is None or stats.dtype != torch.float32 or stats.dim() != 2 or stats.shape[0] < rows \
            or stats.shape[1] < cdiv(width, STATS_CHUNK.value) or stats.stride(1) != 1:
        raise ValueError(f"row statistics need an fp32 [{rows}, {cdiv(width, STATS_CHUNK.value)}] buffer")
    if stats_out and (epilogue != "residual" or block_n % STATS_CHUNK.value):
        raise ValueError(f"row statistics are written by a residual epilogue, BLOCK_N a multiple of "
                         f"{STATS_CHUNK.value}")
    if stats_in and norm_eps is None:
        raise ValueError("row statistics are read by a norm prologue")


PRELOAD_PER_THREAD = 64  # weight elements a thread may hold across the wait (32 registers of bf16 pairs)


def split_span(k: int, block_k: int, split_k: int) -> int:
    """The columns of K one split covers (the last split may have fewer): _tile_of's k_span."""
    return cdiv(cdiv(k, block_k), split_k) * block_k


def _check_preload(preload_k: int, k: int, block_k: int, split_k: int) -> None:
    if preload_k and (preload_k < 16 or preload_k & (preload_k - 1)
                      or preload_k > next_pow2(split_span(k, block_k, split_k))):
        raise ValueError(f"preload of {preload_k} weight columns: a power of two from 16 to the split's "
                         f"{split_span(k, block_k, split_k)} columns (rounded up to a power of two)")


def preload_columns(part: PartCall, num_warps: int) -> int:
    """The weight columns a GEMM tile loads into registers before its wait: the largest power of two
    within one BLOCK_K step and its split's columns that keeps PRELOAD_PER_THREAD elements a thread
    (both weights where the tile has two); 0 where not even 16 fit. One step, so the rest stays in the
    pipelined loop: on the H200 a preload of 512-1024 columns at once was 1.5-2x slower than none
    (benchmarks/dataflow_chain.py), one 128-column step 9% faster."""
    c = part.constexprs
    weights = 2 if c["EPILOGUE"] in (EPILOGUE_SILU_MUL.value, EPILOGUE_ROPE_KV.value) else 1
    budget = PRELOAD_PER_THREAD * 32 * num_warps // (c["BLOCK_N"] * weights)
    most = min(budget, c["BLOCK_K"], split_span(part.args["K"], c["BLOCK_K"], c["SPLIT_K"]))
    cols = 1 << (most.bit_length() - 1) if most > 0 else 0
    return cols if cols >= 16 else 0


def preload_before_wait(part: PartCall, num_warps: int, release: bool) -> bool:
    """Make a GEMM part of a programmatic dependent launch load its first weights into registers, then
    wait for the kernel before itself (PRELOAD_K, WAIT): its weights stream while that kernel
    ends; `release`: it lets the next launch start right after that wait (trigger `start`: released
    before the wait, every later launch of the chain would start at once and hold SMs waiting).
    False (the part unchanged) for other tile families and where no preload fits."""
    return _preload(part, num_warps, WAIT_PDL_RELEASE.value if release else WAIT_PDL.value)


def preload_before_barrier(part: PartCall, num_warps: int) -> bool:
    """Make a GEMM part of a persistent launch (not its first) load its first weights into registers,
    then wait for the grid barrier before it itself (PRELOAD_K, WAIT_GRID; the launch binds wait_ptr
    and wait_count): its weights stream while the grid finishes the part before. False (the part
    unchanged) for other tile families and where no preload fits."""
    return _preload(part, num_warps, WAIT_GRID.value)


def _preload(part: PartCall, num_warps: int, wait: int) -> bool:
    if part.sig.fn != SIGNATURE.fn or not (cols := preload_columns(part, num_warps)):
        return False
    part.constexprs |= {"PRELOAD_K": cols, "WAIT": wait}
    return True


TMA_BOX_MAX = 256  # elements per side of a tensor-memory-accelerator copy
TMA_ALIGN = 16  # bytes: the alignment of its base address and row stride


def _descriptors(w: torch.Tensor, w2: torch.Tensor, block_n: int, block_k: int, tma: bool) -> dict:
    """The w_desc and w2_desc arguments: host-made tensor descriptors of the weights' [BLOCK_N, BLOCK_K]
    tiles, or (no `tma`) the weights themselves, never read. ValueError for weights a descriptor
    cannot describe."""
    if not tma:
        return dict(w_desc=w, w2_desc=w2)
    from triton.tools.tensor_descriptor import TensorDescriptor

    if max(block_n, block_k) > TMA_BOX_MAX:
        raise ValueError(f"TMA weight loads: a tile of {block_n}x{block_k}; at most {TMA_BOX_MAX} a side")
    out = {}
    for name, t in (("w_desc", w), ("w2_desc", w2)):
        size = t.element_size()
        if t.dim() != 2 or t.stride(1) != 1 or (t.stride(0) * size) % TMA_ALIGN or t.data_ptr() % TMA_ALIGN \
                or block_k * size < TMA_ALIGN:
            raise ValueError(f"TMA weight loads need {TMA_ALIGN}-byte aligned rows with unit column stride and "
                             f"BLOCK_K of at least {TMA_ALIGN} bytes; the weights are {tuple(t.shape)} with strides "
                             f"{tuple(t.stride())}, BLOCK_K {block_k}")
        out[name] = TensorDescriptor(t, shape=list(t.shape), strides=[t.stride(0), 1],
                                     block_shape=[block_n, block_k])
    return out


def gemm_call(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, *, rows: int, epilogue: str = "store",
              w2: torch.Tensor | None = None, bias: torch.Tensor | None = None, norm_eps: float | None = None,
              tokens: torch.Tensor | None = None, stride_tok: int = 1, write_out: bool = True,
              block_m: int = 16, block_n: int = 64, block_k: int = 128, split_k: int = 1, label: str = "",
              rope: RopeKV | None = None, atomic_split: bool = False, stats: torch.Tensor | None = None,
              stats_out: bool = False, stats_in: bool = False, copy: torch.Tensor | None = None,
              tma: bool = False, preload_k: int = 0) -> PartCall:
    """Bind one GEMM. x: [rows, K] fp32 or the weights' type; w, w2: [N, K]; out: [rows, N] (row strides free).
    With `rope` (epilogue rope_kv), w is the qkv projection and each tile is one head: block_n is
    taken as head_dim / 2 and `out` is not written. `stats` (fp32 [rows, >= width / STATS_CHUNK]): with
    `stats_out` the residual epilogue writes each row's sums of squares per STATS_CHUNK columns of
    `out` there; with `stats_in` the norm prologue reads them (written for x by the GEMM before)
    instead of a pass over x. `copy` ([rows, N], the residual epilogue's): the finished rows stored there
    too, in its type. `tma`: weight tiles loaded through the tensor memory accelerator (sm_90+; the
    interpreter emulates it) from descriptors made here, instead of masked pointer loads. `preload_k`: the
    split's first columns of weights loaded into registers before anything else (a power of two, at
    least 16); `preload_before_wait` and `preload_before_barrier` also make the tile wait after it."""
    n, k = w.shape
    if epilogue not in EPILOGUES:
        raise ValueError(f"unknown GEMM epilogue {epilogue!r}")
    if (epilogue == "rope_kv") != (rope is not None):
        raise ValueError("the rope_kv epilogue and its RopeKV buffers go together")
    blocks = {}
    if rope is not None:  # one head per tile: its halves as two accumulators (w2: the second halves)
        from conjugate.compiler.rope import check_rope_buffers

        check_rope_buffers(x, rope.q_out, rope.k_cache, rope.v_cache, rope.cos, rope.sin, rope.lengths, rows=rows,
                           tokens=rope.tokens, offset=rope.offset, num_kv_heads=rope.num_kv_heads,
                           head_dim=rope.head_dim, q_norm=rope.q_norm, k_norm=rope.k_norm)
        heads, half = rope.num_heads + 2 * rope.num_kv_heads, rope.head_dim // 2
        if n != heads * rope.head_dim:
            raise ValueError(f"rope_kv: the qkv projection has {n} rows, not {heads} heads of {rope.head_dim}")
        if half < 16 and not INTERPRETING:  # tl.dot's smallest tile side on the GPU
            raise ValueError(f"qkv+rope_kv: head_dim {rope.head_dim} gives half-head tiles of {half} columns; "
                             f"the GPU's dot needs at least 16")
        w2, n, block_n = w[half:], heads * half, half
        blocks = dict(blk_stride=rope.head_dim * w.stride(0), blk_pairs=heads)
    if atomic_split and (epilogue != "residual" or bias is not None or norm_eps is not None):
        raise ValueError("an atomic split-K sum is for the residual epilogue alone (no bias, no norm prologue)")
    atomic_split = atomic_split and split_k > 1  # one split: the plain residual add
    if epilogue == "silu_mul" and w2 is None:
        raise ValueError("the silu_mul epilogue needs w2 (the up projection)")
    if epilogue == "argmax" and tokens is None:
        raise ValueError("the argmax epilogue needs a tokens buffer")
    _check_stats(stats, stats_out, stats_in, rows, n, k, block_n, epilogue, atomic_split, norm_eps)
    if copy is not None and (epilogue != "residual" or copy.dim() != 2 or copy.shape[0] < rows or copy.shape[1] < n
                             or copy.stride(1) != 1):
        raise ValueError(f"a copy of the finished rows is the residual epilogue's, into a [{rows}, {n}] buffer")
    num_m, num_n = cdiv(rows, block_m), cdiv(n, block_n)
    _check_preload(preload_k, k, block_k, split_k)
    ws_size = split_k * (2 * rows * n + num_n * rows) if split_k > 1 and not atomic_split else 1  # acc, acc2, sums
    if max(w.shape[0] * k, ws_size, rows * out.stride(0)) >= 2**31:  # w.shape[0]: all rows (rope: n counts halves)
        raise ValueError(f"GEMM {n}x{k} over {rows} rows (split-K {split_k}): element offsets past 2^31 "
                         f"are not supported")
    dev = w.device
    # counter[0]: programs done (argmax); counter[1 + tile]: splits done per output tile
    counter = torch.zeros(1 + num_m * num_n, dtype=torch.int32, device=dev)
    part_val = torch.empty(rows * num_n if epilogue == "argmax" else 1, dtype=torch.float32, device=dev)
    part_idx = torch.empty(rows * num_n if epilogue == "argmax" else 1, dtype=torch.int32, device=dev)
    ws = torch.empty(ws_size, dtype=torch.float32, device=dev)
    scratch = [counter, part_val, part_idx, ws]
    args = dict(x_ptr=x, w_ptr=w, w2_ptr=w2 if w2 is not None else w, bias_ptr=bias if bias is not None else w,
                out_ptr=out, part_val_ptr=part_val, part_idx_ptr=part_idx, counter_ptr=counter,
                tok_ptr=tokens if tokens is not None else counter, ws_ptr=ws,
                stats_ptr=stats if stats is not None else counter, copy_ptr=copy if copy is not None else counter,
                stride_copy=copy.stride(0) if copy is not None else 0, M=rows, N=n, K=k, stride_x=x.stride(0),
                stride_w=w.stride(0), stride_out=out.stride(0), stride_tok=stride_tok,
                stride_stats=stats.stride(0) if stats is not None else 0,
                eps=float(norm_eps or 0.0), blk_stride=0, blk_pairs=0, tail_start=0) | blocks
    rope_args, rope_constexprs = _rope_args(rope, counter)
    args |= rope_args | _descriptors(w, args["w2_ptr"], block_n, block_k, tma)
    args |= dict(wait_ptr=counter, wait_count=0)  # a persistent launch's barrier, bound there (WAIT_GRID)
    constexprs = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k, NORM=norm_eps is not None,
                      EPILOGUE=EPILOGUES[epilogue], HAS_BIAS=bias is not None, WRITE_OUT=write_out,
                      DOT_DTYPE=dot_dtype(w.dtype), ATOMIC_SPLIT=atomic_split, STATS_OUT=stats_out,
                      STATS_IN=stats_in, COPY_OUT=copy is not None, W_TMA=tma, PRELOAD_K=preload_k,
                      WAIT=WAIT_NONE.value) | rope_constexprs
    programs = num_m * num_n * split_k
    return PartCall(SIGNATURE, args, constexprs, programs, label, scratch)
