"""RoPE family: rotary embedding fused with the KV-cache write (and Qwen3's QK-norm).

Layout.
- qkv    fp32 [M, (NUM_HEADS + 2*NUM_KV_HEADS) * HEAD_DIM], row stride stride_qkv; per row the q
         heads, then the k heads, then the v heads, head-major, bias already added. Row r = b*T + t
         is token t of sequence b, at position pos = lengths[b] + offset + t (lengths: int64 [B],
         each sequence's length before the round, read at run time; offset: the draft step).
- q_out  fp32 [M, NUM_HEADS * HEAD_DIM], row stride stride_q: QK-norm'd (optional), rotated q.
- k_cache, v_cache: one layer's [B, NUM_KV_HEADS, S_max, HEAD_DIM], contiguous, bf16/fp16/fp32;
         row pos of each (b, kv_head) gets the QK-norm'd rotated key / the value, cast on store.
- cos, sin: fp32 [S_max, HEAD_DIM] = reference.rope_cos_sin(spec, arange(S_max)).

Rotate-half: out[d] = x[d]*cos[d] + sign[d]*x[partner[d]]*sin[d], partner = (d + HEAD_DIM/2) mod
HEAD_DIM, sign -1 below HEAD_DIM/2; the partner values come from a second, permuted load.

Work: the M * (NUM_HEADS + 2*NUM_KV_HEADS) (row, head vector) pairs, flattened row-major; each
program takes HEADS_PER_PROG consecutive pairs as one [HEADS_PER_PROG, HEAD_DIM] tile, and per-pair
masks choose the q, k or v treatment.
"""
import triton
import triton.language as tl


@triton.jit
def _qk_norm(x, xp, is_q, d, partner, q_norm_ptr, k_norm_ptr, eps, HEAD_DIM: tl.constexpr):
    """RMSNorm of each head vector x [P, D] (and its permuted copy xp) with q_norm or k_norm."""
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / HEAD_DIM + eps)[:, None]  # [P, 1]
    w = tl.where(is_q[:, None], tl.load(q_norm_ptr + d).to(tl.float32)[None, :],
                 tl.load(k_norm_ptr + d).to(tl.float32)[None, :])  # [P, D]
    wp = tl.where(is_q[:, None], tl.load(q_norm_ptr + partner).to(tl.float32)[None, :],
                  tl.load(k_norm_ptr + partner).to(tl.float32)[None, :])  # [P, D]
    return x * rstd * w, xp * rstd * wp


@triton.jit
def rope_kv_tile(pid, qkv_ptr, q_out_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, q_norm_ptr, k_norm_ptr,
                 lengths_ptr, offset, rows, tokens, s_max, stride_qkv, stride_q, eps,
                 NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                 HEADS_PER_PROG: tl.constexpr, QK_NORM: tl.constexpr):
    ALL_HEADS: tl.constexpr = NUM_HEADS + 2 * NUM_KV_HEADS
    HALF: tl.constexpr = HEAD_DIM // 2
    pair = pid.to(tl.int64) * HEADS_PER_PROG + tl.arange(0, HEADS_PER_PROG)  # [P]
    valid = pair < rows * ALL_HEADS
    row, head = pair // ALL_HEADS, pair % ALL_HEADS  # [P]
    seq = row // tokens  # [P]
    pos = tl.load(lengths_ptr + seq, mask=valid, other=0).to(tl.int32) + offset + row % tokens  # [P]
    valid = valid & (pos < s_max)  # a length past the cache writes nothing
    is_q, is_v = head < NUM_HEADS, head >= NUM_HEADS + NUM_KV_HEADS
    is_k = ~is_q & ~is_v
    d = tl.arange(0, HEAD_DIM)  # [D]
    partner = (d + HALF) % HEAD_DIM
    m = valid[:, None]  # [P, 1]
    src = qkv_ptr + row[:, None] * stride_qkv + head[:, None] * HEAD_DIM  # [P, 1]
    x = tl.load(src + d[None, :], mask=m, other=0.0).to(tl.float32)  # [P, D]
    xp = tl.load(src + partner[None, :], mask=m, other=0.0).to(tl.float32)  # [P, D] partners
    xn, xpn = x, xp
    if QK_NORM:  # v rows are normalised too, but only their raw x is stored
        xn, xpn = _qk_norm(x, xp, is_q, d, partner, q_norm_ptr, k_norm_ptr, eps, HEAD_DIM)
    cs = pos[:, None] * HEAD_DIM + d[None, :]  # [P, D]
    cos = tl.load(cos_ptr + cs, mask=m, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + cs, mask=m, other=0.0).to(tl.float32)
    rotated = tl.where((d < HALF)[None, :], -xpn, xpn)  # [P, D] rotate-half partner, signed
    y = xn * cos + rotated * sin  # [P, D]
    q_dst = q_out_ptr + row[:, None] * stride_q + head[:, None] * HEAD_DIM + d[None, :]
    tl.store(q_dst, y, mask=m & is_q[:, None])
    kv_head = tl.where(is_k, head - NUM_HEADS, head - NUM_HEADS - NUM_KV_HEADS)  # [P]
    dst = ((seq * NUM_KV_HEADS + kv_head) * s_max + pos)[:, None] * HEAD_DIM + d[None, :]  # [P, D]
    tl.store(k_ptr + dst, y.to(k_ptr.dtype.element_ty), mask=m & is_k[:, None])
    tl.store(v_ptr + dst, x.to(v_ptr.dtype.element_ty), mask=m & is_v[:, None])
