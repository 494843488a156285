"""The split-KV attention with a lighter merge: each split stores its rows normalised, in the
partial buffer's type (bf16 on the GPU: half the product's fp32 bytes), and the last split weighs
every split at once from their (m, l) read as one tile, so its loads of the partial rows do not wait
on one another's rescales.

The product (conjugate/kernels/attention.py) stores each split's unnormalised fp32 accumulator and
merges split after split with a running max: at B=1 on the H100 more splits ran slower (llama-3.1-8b's
verify at context 1024: SPLIT_KV 4 9.3 us, 8 12.5 us at BLOCK_N 64), though each split then reads
half the keys. `combine_tile` takes attn_tile's arguments and constexprs, plus SPLITS_P2 (SPLIT_KV
rounded up to a power of two); only the partial rows' type and the merge differ. Lab code: nothing
in `conjugate/` imports it.
"""
import triton
import triton.language as tl

from conjugate.kernels.attention import LOG2E, UNROLL_SPLITS, _attend, _row_offsets


@triton.jit
def _store_normalised(part_o_ptr, part_ml_ptr, slot, m, l, acc, REAL_ROWS, HEAD_DIM: tl.constexpr,
                      ROWS: tl.constexpr, CROWS: tl.constexpr):
    """One split's rows acc / l in part_o's type, and its m, l [ROWS] (fp32), at scratch `slot`."""
    i = tl.arange(0, ROWS)  # [ROWS]
    d = tl.arange(0, HEAD_DIM)  # [HEAD_DIM]
    real = i < REAL_ROWS  # [ROWS]
    o = acc / tl.where(l == 0.0, 1.0, l)[:, None]  # [ROWS, HEAD_DIM]
    tl.store(part_o_ptr + slot * CROWS * HEAD_DIM + i[:, None] * HEAD_DIM + d[None, :],
             o.to(part_o_ptr.dtype.element_ty), mask=real[:, None])
    tl.store(part_ml_ptr + slot * 2 * CROWS + i, m, mask=real)
    tl.store(part_ml_ptr + slot * 2 * CROWS + CROWS + i, l, mask=real)


@triton.jit
def _split_weights(part_ml_ptr, bh, REAL_ROWS, CROWS: tl.constexpr, SPLIT_KV: tl.constexpr,
                   SPLITS_P2: tl.constexpr):
    """[SPLITS_P2, CROWS]: each split's share of each row's softmax mass (zeros for splits past
    SPLIT_KV, splits that saw no key and rows past REAL_ROWS), from every split's (m, l) in one load."""
    s = tl.arange(0, SPLITS_P2)  # [S]
    r = tl.arange(0, CROWS)  # [CROWS]
    ok = (s[:, None] < SPLIT_KV) & (r[None, :] < REAL_ROWS)  # [S, CROWS]
    at = (bh * SPLIT_KV + s)[:, None] * 2 * CROWS + r[None, :]  # [S, CROWS]
    m_s = tl.load(part_ml_ptr + at, mask=ok, other=float("-inf"), cache_modifier=".cg")
    l_s = tl.load(part_ml_ptr + at + CROWS, mask=ok, other=0.0, cache_modifier=".cg")
    top = tl.max(m_s, 0)  # [CROWS]
    top = tl.where(top == float("-inf"), 0.0, top)  # no -inf - -inf
    mass = tl.exp2(m_s - top[None, :]) * l_s  # [S, CROWS]
    total = tl.sum(mass, 0)  # [CROWS]
    return mass / tl.where(total == 0.0, 1.0, total)[None, :]


@triton.jit
def _add_split(o, part_o_ptr, weights, split, slot, r, d, real, HEAD_DIM: tl.constexpr, CROWS: tl.constexpr,
               SPLITS_P2: tl.constexpr):
    """o + split's weight x its normalised rows (read at scratch `slot`)."""
    w = tl.sum(tl.where(tl.arange(0, SPLITS_P2)[:, None] == split, weights, 0.0), 0)  # [CROWS]
    o_s = tl.load(part_o_ptr + (slot * CROWS + r)[:, None] * HEAD_DIM + d[None, :], mask=real[:, None], other=0.0,
                  cache_modifier=".cg").to(tl.float32)  # [CROWS, HEAD_DIM]
    return o + w[:, None] * o_s


@triton.jit
def _merge(part_o_ptr, part_ml_ptr, bh, REAL_ROWS, HEAD_DIM: tl.constexpr, CROWS: tl.constexpr,
           SPLIT_KV: tl.constexpr, SPLITS_P2: tl.constexpr):
    """The rows of (b, kv_head) `bh` [CROWS, HEAD_DIM], normalised: every split weighed first, then
    their rows added (unrolled up to UNROLL_SPLITS splits, their loads independent)."""
    r = tl.arange(0, CROWS)
    d = tl.arange(0, HEAD_DIM)
    real = r < REAL_ROWS
    weights = _split_weights(part_ml_ptr, bh, REAL_ROWS, CROWS, SPLIT_KV, SPLITS_P2)  # [S, CROWS]
    o = tl.zeros([CROWS, HEAD_DIM], tl.float32)
    if SPLIT_KV <= UNROLL_SPLITS:
        for split in tl.static_range(SPLIT_KV):
            o = _add_split(o, part_o_ptr, weights, split, bh * SPLIT_KV + split, r, d, real, HEAD_DIM, CROWS,
                           SPLITS_P2)
    else:
        for split in range(SPLIT_KV):
            o = _add_split(o, part_o_ptr, weights, split, bh * SPLIT_KV + split, r, d, real, HEAD_DIM, CROWS,
                           SPLITS_P2)
    return o


@triton.jit
def combine_tile(pid, q_ptr, k_ptr, v_ptr, out_ptr, part_o_ptr, part_ml_ptr, counter_ptr,
                 lengths_ptr, offset, T, S_max, stride_q, stride_o, scale,
                 NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr,
                 CROWS: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_KV: tl.constexpr, DOT_DTYPE: tl.constexpr,
                 SPLITS_P2: tl.constexpr):
    """attn_tile with the normalised partials and the weighed merge (SPLIT_KV > 1; one split as the product)."""
    split = pid % SPLIT_KV
    bh = pid // SPLIT_KV
    b = bh // NUM_KV_HEADS
    kv_head = bh % NUM_KV_HEADS
    q_offs, row_ok, t = _row_offsets(b, kv_head, T, stride_q, GROUP, HEAD_DIM, ROWS)
    q = tl.load(q_ptr + q_offs, mask=row_ok[:, None], other=0.0).to(tl.float32)
    start = tl.load(lengths_ptr + b).to(tl.int32) + offset
    n_keys = tl.minimum(start + T, S_max)
    chunk = tl.cdiv(tl.cdiv(n_keys, SPLIT_KV), BLOCK_N) * BLOCK_N
    lo = tl.minimum(split * chunk, n_keys)
    hi = tl.minimum(lo + chunk, n_keys)
    kv_base = bh.to(tl.int64) * S_max * HEAD_DIM
    m, l, acc = _attend(k_ptr, v_ptr, q, t, kv_base, lo, hi, start, scale * LOG2E, HEAD_DIM, ROWS, BLOCK_N,
                        DOT_DTYPE)
    if SPLIT_KV == 1:
        o_offs, _, _ = _row_offsets(b, kv_head, T, stride_o, GROUP, HEAD_DIM, ROWS)
        l = tl.where(l == 0.0, 1.0, l)
        tl.store(out_ptr + o_offs, (acc / l[:, None]).to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    else:
        _store_normalised(part_o_ptr, part_ml_ptr, pid, m, l, acc, GROUP * T, HEAD_DIM, ROWS, CROWS)
        tl.debug_barrier()  # every thread's partial stores precede the release below
        prev = tl.atomic_add(counter_ptr + bh, 1)  # acq_rel, gpu scope
        if prev == SPLIT_KV - 1:
            o_all = _merge(part_o_ptr, part_ml_ptr, bh, GROUP * T, HEAD_DIM, CROWS, SPLIT_KV, SPLITS_P2)
            o_offs, o_ok, _ = _row_offsets(b, kv_head, T, stride_o, GROUP, HEAD_DIM, CROWS)
            tl.store(out_ptr + o_offs, o_all.to(out_ptr.dtype.element_ty), mask=o_ok[:, None])
            tl.atomic_xchg(counter_ptr + bh, 0)  # ready for the next launch
