"""Decode / verify attention over one layer's KV cache, with GQA and optional split-KV.

Layout (fixed by the rest of the compiler):

* q: fp32, out: fp32 or bf16/fp16 (a GEMM operand) [M, num_heads * head_dim], row strides
  `stride_q` / `stride_o`; row r = b * T + t
  (b = sequence, t = new token, T = 1 for a draft decode step, k + 1 for target verify). Token t
  sits at position start + t and sees keys 0 .. start + t (causal among the new tokens).
* k_cache, v_cache: [B, num_kv_heads, S_max, head_dim] contiguous, bf16/fp16/fp32 (the dot products'
  operand type; fp32 under the interpreter). Positions 0 .. start + T - 1 are valid. Head h reads kv
  head h // GROUP.
* lengths: int64 [B], each sequence's length before the round, read at run time (sequences may
  differ); start = lengths[b] + offset, offset being the draft step (0 for the verify pass). Keys
  past S_max are never read.

One program per (b, kv_head, split), split fastest. It stacks the GROUP query heads of its kv head
and the T tokens into one q tile of ROWS = next_pow2(max(16, GROUP * T)) rows (row i: head
kv_head * GROUP + i // T, token i % T; rows >= GROUP * T are masked), then runs an online softmax
(running max m, sum l, accumulator acc, all fp32, in base 2) over its key range in BLOCK_N chunks.

Keys and values stay in the cache's dtype into the dot products (the query is cast once), so a bf16
cache's tiles take half the registers an fp32 copy would; the products are those of the upcast-and-
cast-back they replace.

Split-KV (flash-decoding): the keys 0 .. start + T - 1 are cut into SPLIT_KV contiguous chunks of
a BLOCK_N multiple each. With SPLIT_KV == 1 the program normalises and writes `out` itself. With
SPLIT_KV > 1 every split writes its partial (m, l, unnormalised acc) to scratch for the rows of
real heads and tokens only, GROUP * T, in CROWS = next_pow2(max(2, GROUP * T)) slots
(part_o [B * KVH, SPLIT_KV, CROWS, HEAD_DIM], part_ml [B * KVH, SPLIT_KV, 2, CROWS]), and bumps the
(b, kv_head) counter with an acq_rel atomic; the program that sees the count SPLIT_KV - 1 is the
last one, so every partial is visible to it: it combines them with a log-sum-exp rescale
    M = max_s m_s,  l = sum_s 2^(m_s - M) l_s,  o = sum_s 2^(m_s - M) acc_s / l
writes `out`, and resets the counter to 0 so the next launch (or graph replay) needs no zeroing.
Its merge is unrolled over up to UNROLL_SPLITS splits, so their loads need not wait for each other's
merges. With both changes the shipped tiles' attention ran 0-20% faster alone on the H200 (decode and
verify alike); reading a chunk of splits as one [splits, rows, HEAD_DIM] block instead made the
drafts' slower (benchmarks/README.md, attention_compare.py).
A split (or a row of a split) that saw no key keeps m = -inf and weighs 0, without NaNs.
"""
import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)  # softmax runs in base 2
UNROLL_SPLITS = tl.constexpr(16)  # merges of at most this many splits unrolled (H200: 2-32 measured unrolled)


@triton.jit
def _dot(a, b, acc, DOT_DTYPE: tl.constexpr):
    """acc + a @ b with operands cast to DOT_DTYPE; fp32 operands use exact (ieee) products."""
    if DOT_DTYPE == tl.float32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a.to(DOT_DTYPE), b.to(DOT_DTYPE), acc)


@triton.jit
def _row_offsets(b, kv_head, T, stride, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr):
    """Element offsets [ROWS, HEAD_DIM] of the q/out rows of this program, row mask [ROWS], tokens [ROWS]."""
    i = tl.arange(0, ROWS)  # [ROWS]
    t = i % T  # [ROWS] token index
    head = kv_head * GROUP + i // T  # [ROWS]
    d = tl.arange(0, HEAD_DIM)  # [HEAD_DIM]
    offs = (b * T + t)[:, None] * stride + (head * HEAD_DIM)[:, None] + d[None, :]  # [ROWS, HEAD_DIM]
    return offs, i < GROUP * T, t


@triton.jit
def _attend(k_ptr, v_ptr, q, t, kv_base, lo, hi, start, qk_scale, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr,
            BLOCK_N: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """Online softmax of q [ROWS, HEAD_DIM] over keys lo .. hi - 1; returns m, l [ROWS] and acc [ROWS, HEAD_DIM].

    m is in base-2 units (scores scaled by qk_scale = scale * log2(e)); -inf where a row saw no key.
    """
    d = tl.arange(0, HEAD_DIM)  # [HEAD_DIM]
    m = tl.full([ROWS], float("-inf"), tl.float32)  # [ROWS]
    l = tl.zeros([ROWS], tl.float32)  # [ROWS]
    acc = tl.zeros([ROWS, HEAD_DIM], tl.float32)  # [ROWS, HEAD_DIM]
    q = q.to(DOT_DTYPE)  # once, not per key block
    for n0 in range(lo, hi, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)  # [BLOCK_N] key positions
        kv_offs = kv_base + n[:, None] * HEAD_DIM + d[None, :]  # [BLOCK_N, HEAD_DIM]
        in_range = (n < hi)[:, None]  # [BLOCK_N, 1]
        k = tl.load(k_ptr + kv_offs, mask=in_range, other=0.0)  # [BLOCK_N, HEAD_DIM] cache dtype
        v = tl.load(v_ptr + kv_offs, mask=in_range, other=0.0)  # [BLOCK_N, HEAD_DIM]
        s = _dot(q, tl.trans(k), tl.zeros([ROWS, BLOCK_N], tl.float32), DOT_DTYPE) * qk_scale  # [ROWS, BLOCK_N]
        visible = (n[None, :] <= (start + t)[:, None]) & (n < hi)[None, :]  # [ROWS, BLOCK_N]
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))  # [ROWS]
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # [ROWS] no -inf - -inf
        p = tl.exp2(s - m_safe[:, None])  # [ROWS, BLOCK_N]
        alpha = tl.exp2(m - m_safe)  # [ROWS]
        l = l * alpha + tl.sum(p, 1)
        acc = _dot(p, v, acc * alpha[:, None], DOT_DTYPE)  # [ROWS, HEAD_DIM]
        m = m_new
    return m, l, acc


@triton.jit
def _store_partial(part_o_ptr, part_ml_ptr, slot, m, l, acc, REAL_ROWS, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr,
                   CROWS: tl.constexpr):
    """Writes one split's m, l [ROWS] and acc [ROWS, HEAD_DIM] at scratch slot bh * SPLIT_KV + split: its
    first REAL_ROWS rows (real heads and tokens: a draft step with two query heads per KV head uses 2 of
    16), each slot CROWS rows long."""
    i = tl.arange(0, ROWS)  # [ROWS]
    d = tl.arange(0, HEAD_DIM)  # [HEAD_DIM]
    real = i < REAL_ROWS  # [ROWS]
    tl.store(part_o_ptr + slot * CROWS * HEAD_DIM + i[:, None] * HEAD_DIM + d[None, :], acc, mask=real[:, None])
    tl.store(part_ml_ptr + slot * 2 * CROWS + i, m, mask=real)
    tl.store(part_ml_ptr + slot * 2 * CROWS + CROWS + i, l, mask=real)


@triton.jit
def _merge_split(part_o_ptr, part_ml_ptr, slot, m, l, o, r, d, real, HEAD_DIM: tl.constexpr, CROWS: tl.constexpr):
    """(m, l, o) merged with the partial at scratch `slot` (log-sum-exp rescale)."""
    m_s = tl.load(part_ml_ptr + slot * 2 * CROWS + r, mask=real, other=float("-inf"), cache_modifier=".cg")  # [CROWS]
    l_s = tl.load(part_ml_ptr + slot * 2 * CROWS + CROWS + r, mask=real, other=0.0, cache_modifier=".cg")
    o_s = tl.load(part_o_ptr + (slot * CROWS + r)[:, None] * HEAD_DIM + d[None, :], mask=real[:, None],
                  other=0.0, cache_modifier=".cg")  # [CROWS, HEAD_DIM]
    m_new = tl.maximum(m, m_s)  # [CROWS]
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # [CROWS] no -inf - -inf
    a_old = tl.exp2(m - m_safe)  # [CROWS] 0 when m = -inf
    a_s = tl.exp2(m_s - m_safe)  # [CROWS] 0 when the split saw no key
    return m_new, l * a_old + l_s * a_s, o * a_old[:, None] + o_s * a_s[:, None]


@triton.jit
def _combine(part_o_ptr, part_ml_ptr, bh, REAL_ROWS, HEAD_DIM: tl.constexpr, CROWS: tl.constexpr,
             SPLIT_KV: tl.constexpr):
    """Log-sum-exp merge of the SPLIT_KV partials of (b, kv_head) `bh`, unrolled up to UNROLL_SPLITS
    splits so every split's loads can be issued before the first merge; returns l [CROWS],
    o [CROWS, HEAD_DIM] (rows from REAL_ROWS on read nothing and weigh 0)."""
    r = tl.arange(0, CROWS)  # [CROWS]
    d = tl.arange(0, HEAD_DIM)  # [HEAD_DIM]
    real = r < REAL_ROWS  # [CROWS]
    m = tl.full([CROWS], float("-inf"), tl.float32)  # [CROWS]
    l = tl.zeros([CROWS], tl.float32)  # [CROWS]
    o = tl.zeros([CROWS, HEAD_DIM], tl.float32)  # [CROWS, HEAD_DIM]
    if SPLIT_KV <= UNROLL_SPLITS:
        for split in tl.static_range(SPLIT_KV):
            m, l, o = _merge_split(part_o_ptr, part_ml_ptr, bh * SPLIT_KV + split, m, l, o, r, d, real, HEAD_DIM,
                                   CROWS)
    else:  # not unrolled: code size and registers stay those of one split
        for split in range(SPLIT_KV):
            m, l, o = _merge_split(part_o_ptr, part_ml_ptr, bh * SPLIT_KV + split, m, l, o, r, d, real, HEAD_DIM,
                                   CROWS)
    return l, o


@triton.jit
def attn_tile(pid, q_ptr, k_ptr, v_ptr, out_ptr, part_o_ptr, part_ml_ptr, counter_ptr,
              lengths_ptr, offset, T, S_max, stride_q, stride_o, scale,
              NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr,
              CROWS: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_KV: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """Program pid = (b * NUM_KV_HEADS + kv_head) * SPLIT_KV + split of the attention grid."""
    split = pid % SPLIT_KV
    bh = pid // SPLIT_KV  # b * NUM_KV_HEADS + kv_head
    b = bh // NUM_KV_HEADS
    kv_head = bh % NUM_KV_HEADS
    q_offs, row_ok, t = _row_offsets(b, kv_head, T, stride_q, GROUP, HEAD_DIM, ROWS)  # [ROWS, HEAD_DIM], [ROWS], [ROWS]
    q = tl.load(q_ptr + q_offs, mask=row_ok[:, None], other=0.0).to(tl.float32)  # [ROWS, HEAD_DIM]
    start = tl.load(lengths_ptr + b).to(tl.int32) + offset
    n_keys = tl.minimum(start + T, S_max)
    chunk = tl.cdiv(tl.cdiv(n_keys, SPLIT_KV), BLOCK_N) * BLOCK_N  # keys per split, a BLOCK_N multiple
    lo = tl.minimum(split * chunk, n_keys)
    hi = tl.minimum(lo + chunk, n_keys)
    kv_base = bh.to(tl.int64) * S_max * HEAD_DIM
    m, l, acc = _attend(k_ptr, v_ptr, q, t, kv_base, lo, hi, start, scale * LOG2E, HEAD_DIM, ROWS, BLOCK_N,
                        DOT_DTYPE)  # [ROWS], [ROWS], [ROWS, HEAD_DIM]
    if SPLIT_KV == 1:
        o_offs, _, _ = _row_offsets(b, kv_head, T, stride_o, GROUP, HEAD_DIM, ROWS)  # [ROWS, HEAD_DIM]
        l = tl.where(l == 0.0, 1.0, l)  # [ROWS] only masked rows have l == 0
        tl.store(out_ptr + o_offs, (acc / l[:, None]).to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    else:
        _store_partial(part_o_ptr, part_ml_ptr, pid, m, l, acc, GROUP * T, HEAD_DIM, ROWS, CROWS)
        tl.debug_barrier()  # every thread's partial stores precede the release below
        prev = tl.atomic_add(counter_ptr + bh, 1)  # acq_rel, gpu scope
        if prev == SPLIT_KV - 1:
            # [CROWS], [CROWS, HEAD_DIM]
            l_all, o_all = _combine(part_o_ptr, part_ml_ptr, bh, GROUP * T, HEAD_DIM, CROWS, SPLIT_KV)
            l_all = tl.where(l_all == 0.0, 1.0, l_all)
            o_offs, o_ok, _ = _row_offsets(b, kv_head, T, stride_o, GROUP, HEAD_DIM, CROWS)  # [CROWS, HEAD_DIM]
            tl.store(out_ptr + o_offs, (o_all / l_all[:, None]).to(out_ptr.dtype.element_ty), mask=o_ok[:, None])
            tl.atomic_xchg(counter_ptr + bh, 0)  # ready for the next launch
