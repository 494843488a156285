"""Binds one rope_kv op (kernels/rope.py: rotary embedding, QK-norm, KV-cache write) to its buffers."""
from __future__ import annotations

import torch

from conjugate.compiler.tile import PartCall, TileSignature, cdiv
from conjugate.kernels.rope import rope_kv_tile


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
