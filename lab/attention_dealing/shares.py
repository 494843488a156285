"""Lab copy (lost on an H100, README.md): the attention template with its split programs taking equal
shares of all pairs' key tiles, as it was in conjugate/kernels/attention.py at commit de1e68b
(its unchanged helpers are imported from the product template).

Its tensors, layout and causal rule are the product template's (see that module's docstring).

A program attends one piece: the keys [lo, hi) of one (b, kv_head) pair. It stacks the GROUP query
heads of its kv head and the T tokens into one q tile of ROWS = next_pow2(max(16, GROUP * T)) rows
(row i: head kv_head * GROUP + i // T, token i % T; rows >= GROUP * T are masked), then runs an online
softmax (running max m, sum l, accumulator acc, all fp32, in base 2) over the piece in BLOCK_N chunks.

Keys and values stay in the cache's dtype into the dot products (the query is cast once), so a bf16
cache's tiles take half the registers an fp32 copy would; the products are those of the upcast-and-
cast-back they replace.

SPLIT_KV == 1: one program per pair, all of its keys; it normalises and writes `out` itself.

SPLIT_KV > 1 (flash-decoding, dealt stream-K style): the launch has P = B * KVH * SPLIT_KV programs.
Every program reads all B lengths (one vector load and a scan), counts the BLOCK_N-key tiles of every
pair (pairs in order, b-major) and takes one equal contiguous share of them,
[p * total // P, (p + 1) * total // P). So with ragged lengths every program streams the same bytes
(a per-pair split would leave the longest sequence's programs running alone), and with equal lengths
a pair's tiles fall into SPLIT_KV shares as a per-pair split would. A share walks its pairs: a pair it
holds whole is written at once; a piece of a pair cut by the share's ends leaves its partial
(m, l, unnormalised acc; the GROUP * T real rows only, in CROWS = next_pow2(max(2, GROUP * T)) rows)
in one of the program's two scratch slots (part_o [2P, CROWS, HEAD_DIM], part_ml [2P, 2, CROWS]) and
bumps the pair's counter with an acq_rel atomic. The programs holding a pair's pieces follow from the
arithmetic of the shares (the owner of tile t is ((t + 1) P - 1) // total), so the count is known in
the kernel: the piece that sees it last merges them with a log-sum-exp rescale
    M = max_s m_s,  l = sum_s 2^(m_s - M) l_s,  o = sum_s 2^(m_s - M) acc_s / l
writes `out`, and resets the counter to 0 so the next launch (or graph replay) needs no zeroing. With
fewer tiles than programs, one program per tile and the rest idle.
A piece (or a row of a piece) that saw no key keeps m = -inf and weighs 0, without NaNs.
"""
import triton
import triton.language as tl

# the piece loop and the partials' store and merge are the product template's own
from conjugate.kernels.attention import LOG2E, _attend, _merge_split, _row_offsets, _store_partial  # noqa: F401


@triton.jit
def _deal(lengths_ptr, batch, offset, T, S_max, programs, NUM_KV_HEADS: tl.constexpr, BLOCK_N: tl.constexpr,
          BATCH_BLOCK: tl.constexpr):
    """The key tiles of every (b, kv_head) pair, pairs in order, b-major: each sequence's tile count
    [BATCH_BLOCK], the running end of its pairs' tiles [BATCH_BLOCK], the total, and how many
    programs get a share (all of them, or one per tile when there are fewer tiles)."""
    bs = tl.arange(0, BATCH_BLOCK)  # [BATCH_BLOCK]
    starts = tl.load(lengths_ptr + bs, mask=bs < batch, other=0).to(tl.int32) + offset
    n_keys = tl.where(bs < batch, tl.minimum(starts + T, S_max), 0)
    tiles = tl.cdiv(n_keys, BLOCK_N)  # [BATCH_BLOCK] per pair of sequence b
    ends = tl.cumsum(tiles, 0) * NUM_KV_HEADS  # [BATCH_BLOCK] one past the last tile of b's pairs
    total = tl.sum(tiles, 0).to(tl.int64) * NUM_KV_HEADS  # int64: pid * total may pass 2^31
    return tiles, ends, total, tl.minimum(programs, total)


@triton.jit
def _owner(tile, total, active):
    """The program whose share holds `tile`: shares are [p * total // active, (p + 1) * total // active)."""
    return ((tile + 1) * active - 1) // total


@triton.jit
def _merge_pieces(part_o_ptr, part_ml_ptr, first, last, pair_start, total, active, REAL_ROWS,
                  HEAD_DIM: tl.constexpr, CROWS: tl.constexpr, UNROLL: tl.constexpr):
    """Log-sum-exp merge of one pair's pieces, held by programs first .. last: a program's piece is in
    its slot 0 when its share starts inside the pair, else in slot 1 (the pair starts inside its share).
    The first UNROLL programs' merges are unrolled, so their loads need not wait for each other's
    merges (masked past `last`); any more, which only ragged lengths give, loop.
    Returns l [CROWS], o [CROWS, HEAD_DIM] (rows from REAL_ROWS on read nothing and weigh 0)."""
    r = tl.arange(0, CROWS)  # [CROWS]
    d = tl.arange(0, HEAD_DIM)  # [HEAD_DIM]
    real = r < REAL_ROWS  # [CROWS]
    m = tl.full([CROWS], float("-inf"), tl.float32)  # [CROWS]
    l = tl.zeros([CROWS], tl.float32)  # [CROWS]
    o = tl.zeros([CROWS, HEAD_DIM], tl.float32)  # [CROWS, HEAD_DIM]
    for i in tl.static_range(UNROLL):
        p = first + i
        slot = 2 * p + (p * total // active < pair_start).to(tl.int64)
        m, l, o = _merge_split(part_o_ptr, part_ml_ptr, slot, m, l, o, r, d, real & (p <= last), HEAD_DIM, CROWS)
    for p in range(first + UNROLL, last + 1):
        slot = 2 * p + (p * total // active < pair_start).to(tl.int64)
        m, l, o = _merge_split(part_o_ptr, part_ml_ptr, slot, m, l, o, r, d, real, HEAD_DIM, CROWS)
    return l, o


@triton.jit
def _write_out(out_ptr, b, kv_head, T, stride_o, l, acc, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
               ROWS: tl.constexpr):
    """out rows of (b, kv_head) = acc / l (rows that saw no key: 0)."""
    o_offs, o_ok, _ = _row_offsets(b, kv_head, T, stride_o, GROUP, HEAD_DIM, ROWS)  # [ROWS, HEAD_DIM]
    l = tl.where(l == 0.0, 1.0, l)  # [ROWS] only masked rows have l == 0
    tl.store(out_ptr + o_offs, (acc / l[:, None]).to(out_ptr.dtype.element_ty), mask=o_ok[:, None])


@triton.jit
def shares_tile(pid, q_ptr, k_ptr, v_ptr, out_ptr, part_o_ptr, part_ml_ptr, counter_ptr,
              lengths_ptr, batch, offset, T, S_max, stride_q, stride_o, scale,
              NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr,
              CROWS: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_KV: tl.constexpr, BATCH_BLOCK: tl.constexpr,
              MERGE_UNROLL: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """Program pid of batch * NUM_KV_HEADS * SPLIT_KV. SPLIT_KV == 1: pid is the pair (b, kv_head),
    all its keys. SPLIT_KV > 1: pid's equal share of all pairs' key tiles (see the module docstring)."""
    qk_scale = scale * LOG2E
    if SPLIT_KV == 1:
        b = pid // NUM_KV_HEADS
        kv_head = pid % NUM_KV_HEADS
        q_offs, row_ok, t = _row_offsets(b, kv_head, T, stride_q, GROUP, HEAD_DIM, ROWS)  # [ROWS, HEAD_DIM], [ROWS]
        q = tl.load(q_ptr + q_offs, mask=row_ok[:, None], other=0.0).to(tl.float32)  # [ROWS, HEAD_DIM]
        start = tl.load(lengths_ptr + b).to(tl.int32) + offset
        m, l, acc = _attend(k_ptr, v_ptr, q, t, pid.to(tl.int64) * S_max * HEAD_DIM, 0, tl.minimum(start + T, S_max),
                            start, qk_scale, HEAD_DIM, ROWS, BLOCK_N, DOT_DTYPE)
        _write_out(out_ptr, b, kv_head, T, stride_o, l, acc, GROUP, HEAD_DIM, ROWS)
    else:
        tiles_b, ends_b, total, active = _deal(lengths_ptr, batch, offset, T, S_max, batch * NUM_KV_HEADS * SPLIT_KV,
                                               NUM_KV_HEADS, BLOCK_N, BATCH_BLOCK)
        bs = tl.arange(0, BATCH_BLOCK)  # [BATCH_BLOCK]
        lo = pid * total // active
        hi = tl.where(pid < active, (pid + 1) * total // active, lo)  # programs past `active` have no share
        tile = lo
        while tile < hi:
            b = tl.sum((ends_b <= tile).to(tl.int32), 0)  # the sequence whose pairs hold `tile`
            tiles = tl.sum(tl.where(bs == b, tiles_b, 0), 0)  # tiles of each of its pairs
            b_start = tl.sum(tl.where(bs == b, ends_b, 0), 0) - tiles * NUM_KV_HEADS  # its first pair's first tile
            kv_head = ((tile - b_start) // tiles).to(tl.int32)
            pair_start = b_start + kv_head * tiles
            stop = tl.minimum(hi, pair_start + tiles)  # this piece: tiles [tile, stop) of the pair
            q_offs, row_ok, t = _row_offsets(b, kv_head, T, stride_q, GROUP, HEAD_DIM, ROWS)
            q = tl.load(q_ptr + q_offs, mask=row_ok[:, None], other=0.0).to(tl.float32)  # [ROWS, HEAD_DIM]
            start = tl.load(lengths_ptr + b).to(tl.int32) + offset
            n_keys = tl.minimum(start + T, S_max)
            bh = b * NUM_KV_HEADS + kv_head
            key_lo = ((tile - pair_start) * BLOCK_N).to(tl.int32)  # int32 keys: the shares' sums are int64
            key_hi = tl.minimum(((stop - pair_start) * BLOCK_N).to(tl.int32), n_keys)
            m, l, acc = _attend(k_ptr, v_ptr, q, t, bh.to(tl.int64) * S_max * HEAD_DIM, key_lo, key_hi, start, qk_scale,
                                HEAD_DIM, ROWS, BLOCK_N, DOT_DTYPE)  # [ROWS], [ROWS], [ROWS, HEAD_DIM]
            if (tile == pair_start) & (stop == pair_start + tiles):  # the whole pair: no partials
                _write_out(out_ptr, b, kv_head, T, stride_o, l, acc, GROUP, HEAD_DIM, ROWS)
            else:
                _store_partial(part_o_ptr, part_ml_ptr, 2 * pid + (tile > lo).to(tl.int32), m, l, acc, GROUP * T,
                               HEAD_DIM, ROWS, CROWS)
                tl.debug_barrier()  # every thread's partial stores precede the release below
                first = _owner(pair_start, total, active)
                last = _owner(pair_start + tiles - 1, total, active)
                if tl.atomic_add(counter_ptr + bh, 1) == last - first:  # acq_rel, gpu scope: the last piece
                    l_all, o_all = _merge_pieces(part_o_ptr, part_ml_ptr, first, last, pair_start, total, active,
                                                 GROUP * T, HEAD_DIM, CROWS, MERGE_UNROLL)  # [CROWS], [CROWS, HEAD_DIM]
                    _write_out(out_ptr, b, kv_head, T, stride_o, l_all, o_all, GROUP, HEAD_DIM, CROWS)
                    tl.atomic_xchg(counter_ptr + bh, 0)  # ready for the next launch
            tile = stop
