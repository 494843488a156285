"""Binds one layer's attention (kernels/attention.py) to its query, caches and output."""
from __future__ import annotations

import math

import torch

from conjugate.compiler import tile
from conjugate.compiler.tile import PartCall, TileSignature
from conjugate.kernels.attention import attn_tile

SIGNATURE = TileSignature.of(attn_tile)


def _check(q, k_cache, v_cache, out, lengths, batch, tokens, offset, num_heads, num_kv_heads, head_dim, block_n,
           split_kv):
    """Raises ValueError for shapes or options the kernel cannot run."""
    if head_dim < 16 or head_dim != tile.next_pow2(head_dim):
        raise ValueError(f"attention: head_dim must be a power of two >= 16, got {head_dim}")
    if block_n < 16 or block_n != tile.next_pow2(block_n):
        raise ValueError(f"attention: block_n must be a power of two >= 16, got {block_n}")
    if split_kv < 1:
        raise ValueError(f"attention: split_kv must be >= 1, got {split_kv}")
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise ValueError(f"attention: num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if tokens < 1 or offset < 0:
        raise ValueError(f"attention: need tokens >= 1 and offset >= 0, got tokens={tokens}, offset={offset}")
    if lengths.dtype != torch.int64 or tuple(lengths.shape) != (batch,) or lengths.device != q.device:
        raise ValueError(f"attention: lengths must be int64 [{batch}] on {q.device}, got {lengths.dtype} "
                         f"{tuple(lengths.shape)} on {lengths.device}")
    expected = (batch, num_kv_heads, k_cache.shape[2], head_dim)
    if tuple(k_cache.shape) != expected or v_cache.shape != k_cache.shape or not k_cache.is_contiguous() \
            or not v_cache.is_contiguous():
        raise ValueError(f"attention: caches must be contiguous {expected}, got {tuple(k_cache.shape)}, "
                         f"{tuple(v_cache.shape)}")
    if offset + tokens > k_cache.shape[2]:
        raise ValueError(f"attention: offset + tokens = {offset + tokens} exceeds the cache length {k_cache.shape[2]}")
    width = num_heads * head_dim
    for name, x, dtypes in (("q", q, (torch.float32,)), ("out", out, (torch.float32, torch.bfloat16, torch.float16))):
        if x.dtype not in dtypes or x.dim() != 2 or x.shape[0] != batch * tokens or x.shape[1] != width \
                or x.stride(1) != 1:
            raise ValueError(f"attention: {name} must be {'/'.join(str(d) for d in dtypes)} "
                             f"[{batch * tokens}, {width}] with unit column stride, got {x.dtype} {tuple(x.shape)}")


def attn_call(q, k_cache, v_cache, out, lengths, *, batch, tokens, offset, num_heads, num_kv_heads, head_dim,
              block_n=64, split_kv=1, label="") -> PartCall:
    """Binds one layer's attention at positions lengths[b] + offset + t (lengths read at run time);
    allocates the split-KV scratch and counter (kept in PartCall.scratch)."""
    _check(q, k_cache, v_cache, out, lengths, batch, tokens, offset, num_heads, num_kv_heads, head_dim, block_n,
           split_kv)
    group = num_heads // num_kv_heads
    rows = tile.next_pow2(max(16, group * tokens))
    crows = tile.next_pow2(max(2, group * tokens))  # the partials' rows: real heads and tokens only
    dev = q.device
    if split_kv > 1:
        part_o = torch.empty(batch * num_kv_heads, split_kv, crows, head_dim, dtype=torch.float32, device=dev)
        part_ml = torch.empty(batch * num_kv_heads, split_kv, 2, crows, dtype=torch.float32, device=dev)
    else:  # unused by the kernel
        part_o = part_ml = torch.empty(1, dtype=torch.float32, device=dev)
    counter = torch.zeros(max(1, batch * num_kv_heads), dtype=torch.int32, device=dev)
    args = dict(q_ptr=q, k_ptr=k_cache, v_ptr=v_cache, out_ptr=out, part_o_ptr=part_o, part_ml_ptr=part_ml,
                counter_ptr=counter, lengths_ptr=lengths, offset=offset, T=tokens, S_max=k_cache.shape[2],
                stride_q=q.stride(0), stride_o=out.stride(0), scale=1.0 / math.sqrt(head_dim))
    constexprs = dict(NUM_KV_HEADS=num_kv_heads, GROUP=group, HEAD_DIM=head_dim, ROWS=rows, CROWS=crows,
                      BLOCK_N=block_n, SPLIT_KV=split_kv, DOT_DTYPE=tile.dot_dtype(k_cache.dtype))
    return PartCall(SIGNATURE, args, constexprs, programs=batch * num_kv_heads * split_kv, label=label,
                    scratch=[part_o, part_ml, counter])
