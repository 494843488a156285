"""Weight-streaming GEMM for decode shapes: out[M, N] = x[M, K] @ w[N, K]^T, M up to a few hundred.

Weights keep the Hugging Face layout [N, K] (row stride `stride_w`); activation rows are fp32 or
the weights' type, cast to DOT_DTYPE at the load. Program `pid` owns one (M block, split, N block)
tile; M blocks vary fastest so the programs that stream the same weight tile run side by side and
share it through L2. Weight block n_blk starts at `_weight_block`: contiguous in the separate
layout (blk_pairs = 0); in the packed layout (compiler/packed.py) the first blk_pairs blocks
alternate with the other model's.

One tile function per epilogue, all over the same main loop (`_accumulate_tile`):

    gemm_tile           out = acc (+ bias)
    gemm_residual_tile  out += acc (the residual stream), optionally writing row statistics
                        (STATS_OUT) and a copy of the finished rows (COPY_OUT) for the next fused norm
    gemm_silu_mul_tile  out = silu(x @ w^T) * (x @ w2^T): gate and up projections in one tile
    gemm_argmax_tile    per-tile row max and index; the last program reduces them to one token per
                        row (first index on ties, like torch.argmax); logits only with WRITE_OUT
    gemm_rope_kv_tile   the qkv projection with RoPE and the KV-cache write: a tile is one head, its
                        two halves accumulated apart (w2 = the second halves), so rotate-half pairs
                        meet in registers; bias, Qwen3's QK-norm and the rotation follow, then q goes
                        to q_out, k and v into the layer's caches (N counts half-head columns)

Norm: NORM scales each row by 1/rms(x) (RMSNorm folded into the GEMM: the norm weight was
multiplied into `w` at compile time). Its sum of squares comes from a pass over the split's part of
each row before the main loop, or (STATS_IN) from the row statistics the residual GEMM that wrote x
left (tile.py), read inside the main loop: each K step also asks for the statistics of the next
step's columns in every split, after its weight tile, so nothing delays the first weight tile and
every split sums the whole row.

Split-K: with SPLIT_K > 1 each split stores its partial sums in a workspace slot of its own and the
tile's last split adds them up, in split order, and runs the epilogue: deterministic, no float
atomics (`_sum_splits`). With ATOMIC_SPLIT (the residual tile only) each split instead adds its
partial into `out` with a float atomic; a counter only where the tile writes row statistics or a
copy of the rows, so that the last split reads the finished rows back.
"""
import triton
import triton.language as tl

from conjugate.kernels.tile import STATS_CHUNK, store_row_stats

_REDUCE_BLOCK = tl.constexpr(128)  # partial maxima reduced per step by the argmax's last program


# ------------------------------------------------------------------------------------------------
# the main loop
# ------------------------------------------------------------------------------------------------
@triton.jit
def _split_span(K, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    """The columns of K one split covers, a BLOCK_K multiple (the last split may reach K sooner)."""
    return tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K


@triton.jit
def _tile_of(pid, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             SPLIT_K: tl.constexpr):
    """Program pid's tile: (num_m, num_n, m_blk, split, n_blk, k_lo, k_hi), M blocks varying fastest."""
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    m_blk = pid % num_m
    split = (pid // num_m) % SPLIT_K
    n_blk = pid // (num_m * SPLIT_K)
    k_span = _split_span(K, BLOCK_K, SPLIT_K)
    k_lo = split * k_span
    return num_m, num_n, m_blk, split, n_blk, k_lo, tl.minimum(k_lo + k_span, K)


@triton.jit
def _norm_pass(x_ptr, offs_m, k_lo, k_hi, M, stride_x, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """Each row's sum of squares over this split's columns of x: [BLOCK_M]. A pre-pass, so the main
    loop stays the plain, pipelined one; the splits' sums meet in the fix-up."""
    sumsq = tl.zeros([BLOCK_M], tl.float32)
    offs_k = tl.arange(0, BLOCK_K)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        kk = k0 + offs_k
        x = tl.load(x_ptr + offs_m[:, None] * stride_x + kk[None, :],
                    mask=(offs_m[:, None] < M) & (kk[None, :] < k_hi), other=0.0).to(tl.float32)  # [BM, BK]
        sumsq += tl.sum(x * x, axis=1)
    return sumsq


@triton.constexpr_function
def _stats_width(split_k, block_k):
    """Columns of a K step's statistics tile: every split's slice, the splits padded to a power of two."""
    return triton.next_power_of_2(split_k) * (block_k // STATS_CHUNK)


@triton.jit
def _stats_step(stats_ptr, offs_m, k0, k_lo, k_span, M, K, stride_stats, BLOCK_K: tl.constexpr,
                SPLIT_K: tl.constexpr):
    """[BLOCK_M, _stats_width]: the row statistics of the columns K step k0 covers in
    every split (this split's step and the same step of each other one), zeros past K or past the split.
    Summed over a split's steps: each row's whole sum of squares, in every split."""
    PER_STEP: tl.constexpr = BLOCK_K // STATS_CHUNK
    c = tl.arange(0, _stats_width(SPLIT_K, BLOCK_K))
    cols = ((k0 - k_lo) + (c // PER_STEP) * k_span) // STATS_CHUNK + c % PER_STEP
    ok = (c[None, :] // PER_STEP < SPLIT_K) & (cols[None, :] < tl.cdiv(K, STATS_CHUNK)) & (k0 < k_lo + k_span)
    ok = ok & (offs_m[:, None] < M)
    return tl.load(stats_ptr + offs_m[:, None] * stride_stats + cols[None, :], mask=ok, other=0.0)


@triton.jit
def _stats_sumsq(stats, ahead, stats_ptr, offs_m, k_lo, k_hi, k_span, M, K, stride_stats, BLOCK_K: tl.constexpr,
                 SPLIT_K: tl.constexpr):
    """Each row's sum of squares [BLOCK_M] once the main loop is done: the steps it read, the one it
    asked for ahead, and those of the steps a short split (K not a multiple of its span) never reached."""
    stats += ahead
    reached = k_lo + tl.cdiv(tl.maximum(k_hi - k_lo, 0), BLOCK_K) * BLOCK_K
    for k0 in range(reached + BLOCK_K, k_lo + k_span, BLOCK_K):
        stats += _stats_step(stats_ptr, offs_m, k0, k_lo, k_span, M, K, stride_stats, BLOCK_K, SPLIT_K)
    return tl.sum(stats, axis=1)


@triton.jit
def _accumulate_tile(pid,
                     # --- pointers
                     x_ptr, w_ptr, w2_ptr, stats_ptr,
                     # --- shapes, strides, packed block addressing
                     M, N, K, stride_x, stride_w, stride_stats, blk_stride, blk_pairs, tail_start,
                     # --- meta
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                     NORM: tl.constexpr, STATS_IN: tl.constexpr, TWO_ACC: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """Program pid's partial products over its split of K: (acc, acc2 [BM, BN] (acc2 with TWO_ACC),
    sumsq [BM] (the norm's; zeros without NORM), offs_m [BM], offs_n [BN], m_blk, split, n_blk,
    num_n)."""
    num_m, num_n, m_blk, split, n_blk, k_lo, k_hi = _tile_of(pid, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K)
    k_span = _split_span(K, BLOCK_K, SPLIT_K)
    offs_m = m_blk * BLOCK_M + tl.arange(0, BLOCK_M)
    rows_n = tl.arange(0, BLOCK_N)
    offs_n = n_blk * BLOCK_N + rows_n
    offs_k = tl.arange(0, BLOCK_K)
    w_block = tl.where(n_blk < blk_pairs, n_blk * blk_stride, tail_start + (n_blk - blk_pairs) * BLOCK_N * stride_w)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    sumsq = tl.zeros([BLOCK_M], tl.float32)
    stats = tl.zeros([BLOCK_M, _stats_width(SPLIT_K, BLOCK_K)], tl.float32)
    ahead = stats
    if NORM and STATS_IN:  # nothing before the first weight tile: the statistics come a step at a time
        ahead = _stats_step(stats_ptr, offs_m, k_lo, k_lo, k_span, M, K, stride_stats, BLOCK_K, SPLIT_K)
    elif NORM:
        sumsq = _norm_pass(x_ptr, offs_m, k_lo, k_hi, M, stride_x, BLOCK_M, BLOCK_K)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        kk = k0 + offs_k
        x = tl.load(x_ptr + offs_m[:, None] * stride_x + kk[None, :],
                    mask=(offs_m[:, None] < M) & (kk[None, :] < k_hi), other=0.0)  # [BM, BK]
        w_mask = (offs_n[:, None] < N) & (kk[None, :] < k_hi)
        w_offs = w_block + rows_n[:, None] * stride_w + kk[None, :]
        w = tl.load(w_ptr + w_offs, mask=w_mask, other=0.0)  # [BN, BK]
        acc += tl.dot(x.to(DOT_DTYPE), tl.trans(w.to(DOT_DTYPE)))  # fp32 accumulate
        if TWO_ACC:
            w2 = tl.load(w2_ptr + w_offs, mask=w_mask, other=0.0)
            acc2 += tl.dot(x.to(DOT_DTYPE), tl.trans(w2.to(DOT_DTYPE)))
        if NORM and STATS_IN:  # the slice asked for a step ago; the next one asked for after the weights
            stats += ahead
            ahead = _stats_step(stats_ptr, offs_m, k0 + BLOCK_K, k_lo, k_span, M, K, stride_stats, BLOCK_K, SPLIT_K)
    if NORM and STATS_IN:
        sumsq = _stats_sumsq(stats, ahead, stats_ptr, offs_m, k_lo, k_hi, k_span, M, K, stride_stats, BLOCK_K,
                             SPLIT_K)
    return acc, acc2, sumsq, offs_m, offs_n, m_blk, split, n_blk, num_n


@triton.jit
def _sum_splits(acc, acc2, sumsq, ws_ptr, counter_ptr, offs_m, offs_n, m_blk, split, n_blk, num_n, M, N,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr, TWO_ACC: tl.constexpr,
                NORM_PASS: tl.constexpr):
    """Split-K fix-up: each split stores its partials in a slot of its own (ws [SPLIT_K, M, N], then
    acc2's, then the norm pass's sums); the tile's last split (a counter says which) sums the slots in
    split order. Returns (whether this program runs the epilogue: the last split, or the only one;
    acc, acc2, sumsq)."""
    last = True
    if SPLIT_K > 1:
        tile = m_blk * num_n + n_blk
        slot = (split * M + offs_m[:, None]) * N + offs_n[None, :]
        ws_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        tl.store(ws_ptr + slot, acc, mask=ws_mask)
        if TWO_ACC:
            tl.store(ws_ptr + SPLIT_K * M * N + slot, acc2, mask=ws_mask)
        if NORM_PASS:  # with row statistics every split has the whole row's sum already
            tl.store(ws_ptr + 2 * SPLIT_K * M * N + (split * num_n + n_blk) * M + offs_m, sumsq, mask=offs_m < M)
        tl.debug_barrier()  # every thread's partials are stored before the release below
        last = tl.atomic_add(counter_ptr + 1 + tile, 1) == SPLIT_K - 1
        if last:
            acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            acc2 = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            if NORM_PASS:
                sumsq = tl.zeros([BLOCK_M], tl.float32)
            for s in range(SPLIT_K):
                slot = (s * M + offs_m[:, None]) * N + offs_n[None, :]
                acc += tl.load(ws_ptr + slot, mask=ws_mask, other=0.0, cache_modifier=".cg")
                if TWO_ACC:
                    acc2 += tl.load(ws_ptr + SPLIT_K * M * N + slot, mask=ws_mask, other=0.0, cache_modifier=".cg")
                if NORM_PASS:
                    sumsq += tl.load(ws_ptr + 2 * SPLIT_K * M * N + (s * num_n + n_blk) * M + offs_m,
                                     mask=offs_m < M, other=0.0, cache_modifier=".cg")
            tl.atomic_xchg(counter_ptr + 1 + tile, 0)  # ready for the next launch
    return last, acc, acc2, sumsq


@triton.jit
def _normed(acc, sumsq, K, eps, NORM: tl.constexpr):
    """acc [BM, BN] scaled by each row's 1/rms (the norm prologue's), or as it is."""
    if NORM:
        acc = acc * (1.0 / tl.sqrt(sumsq / K + eps))[:, None]
    return acc


# ------------------------------------------------------------------------------------------------
# epilogues
# ------------------------------------------------------------------------------------------------
@triton.jit
def _store_epilogue(acc, offs_m, offs_n, M, N, bias_ptr, out_ptr, stride_out, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    out_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(out_ptr + offs_m[:, None] * stride_out + offs_n[None, :], acc, mask=out_mask)


@triton.jit
def _finished_rows(new, out_mask, offs_m, offs_n, n_blk, M, N, stats_ptr, stride_stats, copy_ptr, stride_copy,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STATS_OUT: tl.constexpr, COPY_OUT: tl.constexpr):
    """What the next fused norm reads of finished residual rows `new`: their statistics (STATS_OUT)
    and a copy in copy_ptr's type (COPY_OUT: a fused MLP must not read the stream it adds into)."""
    if STATS_OUT:
        store_row_stats(new, out_mask, offs_m, n_blk, M, N, stats_ptr, stride_stats, BLOCK_M, BLOCK_N)
    if COPY_OUT:
        tl.store(copy_ptr + offs_m[:, None] * stride_copy + offs_n[None, :], new.to(copy_ptr.dtype.element_ty),
                 mask=out_mask)


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


# ------------------------------------------------------------------------------------------------
# tile functions, one per epilogue
# ------------------------------------------------------------------------------------------------
@triton.jit
def gemm_tile(pid,
              # --- pointers
              x_ptr, w_ptr, bias_ptr, out_ptr, counter_ptr, ws_ptr, stats_ptr,
              # --- shapes and strides
              M, N, K, stride_x, stride_w, stride_out, stride_stats, eps,
              # --- packed block addressing (0, 0, 0: the separate layout)
              blk_stride, blk_pairs, tail_start,
              # --- meta
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
              NORM: tl.constexpr, STATS_IN: tl.constexpr, HAS_BIAS: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """out[M, N] = norm?(x) @ w^T (+ bias)."""
    acc, acc2, sumsq, offs_m, offs_n, m_blk, split, n_blk, num_n = _accumulate_tile(
        pid, x_ptr, w_ptr, w_ptr, stats_ptr, M, N, K, stride_x, stride_w, stride_stats, blk_stride, blk_pairs,
        tail_start, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, NORM, STATS_IN, False, DOT_DTYPE)
    last, acc, acc2, sumsq = _sum_splits(acc, acc2, sumsq, ws_ptr, counter_ptr, offs_m, offs_n, m_blk, split, n_blk,
                                         num_n, M, N, BLOCK_M, BLOCK_N, SPLIT_K, False, NORM and not STATS_IN)
    if last:
        _store_epilogue(_normed(acc, sumsq, K, eps, NORM), offs_m, offs_n, M, N, bias_ptr, out_ptr, stride_out,
                        HAS_BIAS)


@triton.jit
def gemm_silu_mul_tile(pid,
                       # --- pointers: gate and up weights, both [N, K]
                       x_ptr, w_ptr, w2_ptr, out_ptr, counter_ptr, ws_ptr, stats_ptr,
                       # --- shapes and strides
                       M, N, K, stride_x, stride_w, stride_out, stride_stats, eps,
                       # --- packed block addressing
                       blk_stride, blk_pairs, tail_start,
                       # --- meta
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                       NORM: tl.constexpr, STATS_IN: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """out[M, N] = silu(norm?(x) @ w^T) * (norm?(x) @ w2^T), in out's type."""
    acc, acc2, sumsq, offs_m, offs_n, m_blk, split, n_blk, num_n = _accumulate_tile(
        pid, x_ptr, w_ptr, w2_ptr, stats_ptr, M, N, K, stride_x, stride_w, stride_stats, blk_stride, blk_pairs,
        tail_start, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, NORM, STATS_IN, True, DOT_DTYPE)
    last, acc, acc2, sumsq = _sum_splits(acc, acc2, sumsq, ws_ptr, counter_ptr, offs_m, offs_n, m_blk, split, n_blk,
                                         num_n, M, N, BLOCK_M, BLOCK_N, SPLIT_K, True, NORM and not STATS_IN)
    if last:
        gate = _normed(acc, sumsq, K, eps, NORM)
        up = _normed(acc2, sumsq, K, eps, NORM)
        out_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        tl.store(out_ptr + offs_m[:, None] * stride_out + offs_n[None, :],
                 (gate * tl.sigmoid(gate) * up).to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def gemm_residual_tile(pid,
                       # --- pointers: out is the residual stream, added into
                       x_ptr, w_ptr, out_ptr, counter_ptr, ws_ptr, stats_ptr, copy_ptr,
                       # --- shapes and strides
                       M, N, K, stride_x, stride_w, stride_out, stride_stats, stride_copy,
                       # --- packed block addressing
                       blk_stride, blk_pairs, tail_start,
                       # --- meta
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                       ATOMIC_SPLIT: tl.constexpr, STATS_OUT: tl.constexpr, COPY_OUT: tl.constexpr,
                       DOT_DTYPE: tl.constexpr):
    """out[M, N] += x @ w^T; with STATS_OUT / COPY_OUT the finished rows' statistics / copy."""
    acc, acc2, sumsq, offs_m, offs_n, m_blk, split, n_blk, num_n = _accumulate_tile(
        pid, x_ptr, w_ptr, w_ptr, stats_ptr, M, N, K, stride_x, stride_w, stride_stats, blk_stride, blk_pairs,
        tail_start, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, False, False, False, DOT_DTYPE)
    out_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    out_ptrs = out_ptr + offs_m[:, None] * stride_out + offs_n[None, :]
    if ATOMIC_SPLIT:  # out += this split's partial, the splits in any order
        tl.atomic_add(out_ptrs, acc, mask=out_mask, sem="relaxed")
        if STATS_OUT or COPY_OUT:  # the tile's last split (a counter says which) reads the finished rows back
            tile = m_blk * num_n + n_blk
            tl.debug_barrier()  # every thread's adds are issued before the release below
            if tl.atomic_add(counter_ptr + 1 + tile, 1) == SPLIT_K - 1:
                new = tl.load(out_ptrs, mask=out_mask, other=0.0, cache_modifier=".cg")
                _finished_rows(new, out_mask, offs_m, offs_n, n_blk, M, N, stats_ptr, stride_stats, copy_ptr,
                               stride_copy, BLOCK_M, BLOCK_N, STATS_OUT, COPY_OUT)
                tl.atomic_xchg(counter_ptr + 1 + tile, 0)  # ready for the next launch
    else:
        last, acc, acc2, sumsq = _sum_splits(acc, acc2, sumsq, ws_ptr, counter_ptr, offs_m, offs_n, m_blk, split,
                                             n_blk, num_n, M, N, BLOCK_M, BLOCK_N, SPLIT_K, False, False)
        if last:
            new = tl.load(out_ptrs, mask=out_mask, other=0.0) + acc
            tl.store(out_ptrs, new, mask=out_mask)
            _finished_rows(new, out_mask, offs_m, offs_n, n_blk, M, N, stats_ptr, stride_stats, copy_ptr,
                           stride_copy, BLOCK_M, BLOCK_N, STATS_OUT, COPY_OUT)


@triton.jit
def gemm_argmax_tile(pid,
                     # --- pointers: logits out, per-tile maxima, tokens out
                     x_ptr, w_ptr, out_ptr, part_val_ptr, part_idx_ptr, counter_ptr, tok_ptr, ws_ptr, stats_ptr,
                     # --- shapes and strides
                     M, N, K, stride_x, stride_w, stride_out, stride_tok, stride_stats, eps,
                     # --- packed block addressing
                     blk_stride, blk_pairs, tail_start,
                     # --- meta
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                     NORM: tl.constexpr, STATS_IN: tl.constexpr, WRITE_OUT: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """tok[m] = argmax_n (norm?(x) @ w^T)[m, n]; the logits too with WRITE_OUT."""
    acc, acc2, sumsq, offs_m, offs_n, m_blk, split, n_blk, num_n = _accumulate_tile(
        pid, x_ptr, w_ptr, w_ptr, stats_ptr, M, N, K, stride_x, stride_w, stride_stats, blk_stride, blk_pairs,
        tail_start, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, NORM, STATS_IN, False, DOT_DTYPE)
    last, acc, acc2, sumsq = _sum_splits(acc, acc2, sumsq, ws_ptr, counter_ptr, offs_m, offs_n, m_blk, split, n_blk,
                                         num_n, M, N, BLOCK_M, BLOCK_N, SPLIT_K, False, NORM and not STATS_IN)
    if last:
        acc = _normed(acc, sumsq, K, eps, NORM)
        if WRITE_OUT:
            out_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
            tl.store(out_ptr + offs_m[:, None] * stride_out + offs_n[None, :], acc, mask=out_mask)
        _argmax_epilogue(acc, offs_m, offs_n, n_blk, num_n, tl.cdiv(M, BLOCK_M) * num_n, M, N, part_val_ptr,
                         part_idx_ptr, counter_ptr, tok_ptr, stride_tok, BLOCK_M, BLOCK_N)


@triton.jit
def gemm_rope_kv_tile(pid,
                      # --- pointers: w2 = the heads' second halves; q out; one layer's caches; RoPE tables
                      x_ptr, w_ptr, w2_ptr, bias_ptr, counter_ptr, ws_ptr, stats_ptr, q_out_ptr, k_cache_ptr,
                      v_cache_ptr, cos_ptr, sin_ptr, q_norm_ptr, k_norm_ptr, lengths_ptr,
                      # --- shapes and strides (N: half-head columns)
                      M, N, K, stride_x, stride_w, stride_stats, stride_q, eps,
                      # --- positions: row r is token r % rope_tokens of sequence r // rope_tokens
                      rope_offset, rope_tokens, s_max, rope_eps,
                      # --- meta
                      BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, NORM: tl.constexpr,
                      STATS_IN: tl.constexpr, HAS_BIAS: tl.constexpr, DOT_DTYPE: tl.constexpr,
                      NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                      QK_NORM: tl.constexpr):
    """q, k, v of one head per tile from norm?(x) @ wqkv^T, rotated and written (q_out, caches)."""
    HALF: tl.constexpr = HEAD_DIM // 2
    # head n_blk's rows start HEAD_DIM rows after the last head's: every block is a pair
    acc, acc2, sumsq, offs_m, offs_n, m_blk, split, n_blk, num_n = _accumulate_tile(
        pid, x_ptr, w_ptr, w2_ptr, stats_ptr, M, N, K, stride_x, stride_w, stride_stats, HEAD_DIM * stride_w,
        NUM_HEADS + 2 * NUM_KV_HEADS, 0, BLOCK_M, HALF, BLOCK_K, SPLIT_K, NORM, STATS_IN, True, DOT_DTYPE)
    last, acc, acc2, sumsq = _sum_splits(acc, acc2, sumsq, ws_ptr, counter_ptr, offs_m, offs_n, m_blk, split, n_blk,
                                         num_n, M, N, BLOCK_M, HALF, SPLIT_K, True, NORM and not STATS_IN)
    if last:
        _rope_kv_epilogue(_normed(acc, sumsq, K, eps, NORM), _normed(acc2, sumsq, K, eps, NORM), offs_m, n_blk, M,
                          bias_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, cos_ptr, sin_ptr, q_norm_ptr, k_norm_ptr,
                          lengths_ptr, rope_offset, rope_tokens, s_max, stride_q, rope_eps, HAS_BIAS, NUM_HEADS,
                          NUM_KV_HEADS, HEAD_DIM, QK_NORM)
