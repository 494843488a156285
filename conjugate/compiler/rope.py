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
from __future__ import annotations

import torch
import triton
import triton.language as tl

from conjugate.compiler.tile import PartCall, TileSignature, cdiv


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


SIGNATURE = TileSignature.of(rope_kv_tile)


def check_rope_buffers(qkv: torch.Tensor, q_out: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       cos: torch.Tensor, sin: torch.Tensor, lengths: torch.Tensor, *, rows: int, tokens: int,
                       offset: int, num_kv_heads: int, head_dim: int, q_norm: torch.Tensor | None,
                       k_norm: torch.Tensor | None) -> None:
    """ValueError unless the buffers fit the rope_kv op (and the GEMM epilogue doing its work)."""
    if not (head_dim & (head_dim - 1) == 0):
        raise ValueError(f"rope_kv: head_dim {head_dim} must be a power of two")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous() and cos.is_contiguous() and sin.is_contiguous()):
        raise ValueError("rope: unsupported layout (k_cache.is_contiguous() and v_cache.is_contiguous() and cos.is_contiguous() and sin.is_contiguous())")
    if not (qkv.stride(1) == 1 and q_out.stride(1) == 1):
        raise ValueError("rope_kv: rows must be contiguous")
    if not ((q_norm is None) == (k_norm is None)):
        raise ValueError("rope_kv: q_norm and k_norm go together")
    # positions are read at run time, up to S_max - 1: the tables must cover the whole cache
    if not (offset + tokens <= k_cache.shape[2] <= min(cos.shape[0], sin.shape[0])):
        raise ValueError("rope_kv: positions past the cache or the tables")
    if lengths.dtype != torch.int64 or lengths.dim() != 1 or lengths.shape[0] * tokens != rows \
            or lengths.device != qkv.device:  # one length per sequence: the tile reads lengths[row // tokens]
        raise ValueError(f"rope_kv: lengths must be int64 [batch] on {qkv.device}, got {lengths.dtype} "
                         f"{tuple(lengths.shape)} on {lengths.device}")
    if not (cos.shape[1] == head_dim and k_cache.shape[1:] == (num_kv_heads, k_cache.shape[2], head_dim)):
        raise ValueError("rope: unsupported layout (cos.shape[1] == head_dim and k_cache.shape[1:] == (num_kv_heads, k_cache.shape[2], head_dim))")


def rope_kv_call(qkv: torch.Tensor, q_out: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 cos: torch.Tensor, sin: torch.Tensor, lengths: torch.Tensor, *, rows: int, tokens: int, offset: int,
                 num_heads: int,
                 num_kv_heads: int, head_dim: int, q_norm: torch.Tensor | None = None,
                 k_norm: torch.Tensor | None = None, eps: float = 1e-6, block: int = 256,
                 label: str = "") -> PartCall:
    """Rotate rows' q into q_out and write their k, v at positions lengths[b] + offset + t of one layer's
    caches (lengths read at run time)."""
    check_rope_buffers(qkv, q_out, k_cache, v_cache, cos, sin, lengths, rows=rows, tokens=tokens, offset=offset,
                       num_kv_heads=num_kv_heads, head_dim=head_dim, q_norm=q_norm, k_norm=k_norm)
    heads_per_prog = max(1, block // head_dim)
    if not (heads_per_prog & (heads_per_prog - 1) == 0):
        raise ValueError(f"rope_kv: block {block} // head_dim must be a power of two")
    qk_norm = q_norm is not None
    args = dict(qkv_ptr=qkv, q_out_ptr=q_out, k_ptr=k_cache, v_ptr=v_cache, cos_ptr=cos, sin_ptr=sin,
                q_norm_ptr=q_norm if qk_norm else cos, k_norm_ptr=k_norm if qk_norm else cos,  # dummies: never read
                lengths_ptr=lengths, offset=offset, rows=rows, tokens=tokens, s_max=k_cache.shape[2], stride_qkv=qkv.stride(0),
                stride_q=q_out.stride(0), eps=float(eps))
    constexprs = dict(NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
                      HEADS_PER_PROG=heads_per_prog, QK_NORM=qk_norm)
    programs = cdiv(rows * (num_heads + 2 * num_kv_heads), heads_per_prog)
    return PartCall(SIGNATURE, args, constexprs, programs, label)
