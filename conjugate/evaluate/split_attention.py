"""`split` attention for the conventional baseline: flash-decoding built from torch's own kernel.

A decode step has few query rows per KV head, so attention that gives each head (and query tile) one
program walks the whole cache in a handful of programs: on the H200, torch's cuDNN kernel took
45.6 us a layer to read 4.2 MB of llama-3.1-8b's cache at B=1. Here a KV head's query heads become
the rows of one problem (`grouped_rows`), the cache [B, kv_heads, capacity, hd] is viewed as
kv_heads x chunks problems of equal chunks (no copy), each attended by SDPA's memory-efficient kernel
with its log-sum-exp, and the chunks' results are combined by their log-sum-exp.

How many chunks: on a GPU, timed once per shape (`choose_chunks`: every even cut into chunks of at
least SPLIT_MIN_KEYS keys, the fastest kept for the process); elsewhere `split_count`'s rule.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

SPLIT_PROGRAMS = 256  # split_count cuts the cache until this many attention problems run at once
SPLIT_MIN_KEYS = 32  # ... and no chunk is shorter than this

_CHOSEN: dict[tuple, int] = {}  # shape -> chunks, timed once per process


def grouped_rows(q, cache_k):
    """q [B, T, heads, hd] -> [B, kv_heads, group * T, hd] in the cache's dtype: a KV head's query heads as rows."""
    b, t, heads, hd = q.shape
    kv_heads = cache_k.shape[1]
    return q.to(cache_k.dtype).view(b, t, kv_heads, heads // kv_heads, hd).permute(0, 2, 3, 1, 4).reshape(
        b, kv_heads, heads // kv_heads * t, hd)


def from_grouped_rows(out, q_shape):
    """The inverse of grouped_rows for the attention's output: -> [B, T, heads * hd]."""
    b, t, heads, hd = q_shape
    kv_heads = out.shape[1]
    return out.view(b, kv_heads, heads // kv_heads, t, hd).permute(0, 3, 1, 2, 4).reshape(b, t, heads * hd)


def even_cuts(capacity: int) -> list[int]:
    """Every chunk count that cuts `capacity` positions evenly into chunks of at least SPLIT_MIN_KEYS."""
    return [n for n in range(1, capacity + 1) if capacity % n == 0 and capacity // n >= SPLIT_MIN_KEYS] or [1]


def split_count(capacity: int, problems: int) -> int:
    """The rule without a GPU to time on: the fewest even cuts that give SPLIT_PROGRAMS problems
    (`problems` before the cut), else the most there are."""
    cuts = even_cuts(capacity)
    return next((n for n in cuts if problems * n >= SPLIT_PROGRAMS), cuts[-1])


def choose_chunks(batch: int, tokens: int, heads: int, kv_heads: int, capacity: int, head_dim: int,
                  dtype: torch.dtype, device: torch.device, time_us=None) -> int:
    """Chunks for this attention shape: on a GPU the fastest even cut, each timed on random data as
    a CUDA graph (`time_us(fn, device)`, default timing.time_per_call), kept for the process."""
    if device.type != "cuda" and time_us is None:
        return split_count(capacity, batch * kv_heads)
    key = (batch, tokens, heads, kv_heads, capacity, head_dim, dtype, str(device))
    if key not in _CHOSEN:
        if time_us is None:
            from conjugate.evaluate.timing import time_per_call as time_us
        gen = torch.Generator(device=device).manual_seed(0)
        q = torch.randn(batch, tokens, heads, head_dim, generator=gen, device=device).to(dtype)
        k, v = (torch.randn(batch, kv_heads, capacity, head_dim, generator=gen, device=device).to(dtype)
                for _ in range(2))
        positions = torch.arange(capacity - tokens, capacity, device=device).expand(batch, tokens)
        visible = torch.arange(capacity, device=device)[None, None, :] <= positions[:, :, None]
        timed = {}
        for chunks in even_cuts(capacity):
            mask = split_mask(visible, heads, kv_heads, dtype, chunks)
            timed[chunks] = time_us(lambda: split_attention(q, k, v, mask), device)
        _CHOSEN[key] = min(timed, key=timed.get)
    return _CHOSEN[key]


def split_mask(visible, heads: int, kv_heads: int, dtype, chunks: int):
    """The split's mask, made once per step for every layer, from [B, T, capacity] bool: (the additive
    mask [B, kv_heads * chunks, group * T, chunk] (0 or -inf) in `dtype`, its rows padded to 16
    elements as the memory-efficient kernel needs; which chunks hold a visible key [B, 1, chunks, group * T])."""
    b, t, capacity = visible.shape
    group = heads // kv_heads
    chunk, rows = capacity // chunks, group * t
    padded = chunk - chunk % -16
    per_chunk = visible.repeat(1, group, 1).view(b, rows, chunks, chunk).permute(0, 2, 1, 3)  # [B, chunks, rows, chunk]
    bias = torch.where(per_chunk, 0.0, float("-inf")).to(dtype)
    bias = F.pad(bias, (0, padded - chunk))[:, None].expand(b, kv_heads, chunks, rows, padded)
    return bias.reshape(b, kv_heads * chunks, rows, padded)[..., :chunk], per_chunk.any(-1)[:, None]


def chunk_attention(q, k, v, bias):
    """Attention of each chunk on its own: (out [.., rows, hd] in q's dtype, log-sum-exp [.., rows] fp32).
    On a GPU, SDPA's memory-efficient kernel; elsewhere the same in explicit fp32 operations."""
    if q.is_cuda:
        out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, True)[:2]
        return out, lse[..., :q.shape[2]]
    scores = q.float() @ k.float().transpose(-1, -2) * q.shape[-1] ** -0.5 + bias.float()
    lse = torch.logsumexp(scores, -1)
    return (torch.exp(scores - lse[..., None]) @ v.float()).to(q.dtype), lse


def split_attention(q, cache_k, cache_v, mask):
    """q [B, T, heads, hd] over cache_k/v [B, kv_heads, capacity, hd] -> [B, T, heads * hd] in the
    cache's dtype. `mask`: split_mask of the step's mask. A chunk with no visible key weighs nothing,
    whatever the kernel wrote for it."""
    bias, seen = mask
    b, t, heads, hd = q.shape
    kv_heads, capacity = cache_k.shape[1], cache_k.shape[2]
    chunks = bias.shape[1] // kv_heads
    rows = grouped_rows(q, cache_k)  # [B, kv_heads, R, hd]
    r = rows.shape[2]
    queries = rows[:, :, None].expand(b, kv_heads, chunks, r, hd).reshape(b, kv_heads * chunks, r, hd)
    keys = cache_k.view(b, kv_heads * chunks, capacity // chunks, hd)
    values = cache_v.view(b, kv_heads * chunks, capacity // chunks, hd)
    out, lse = chunk_attention(queries, keys, values, bias)
    out, lse = out.view(b, kv_heads, chunks, r, hd).float(), lse.view(b, kv_heads, chunks, r)
    lse = torch.where(seen, lse, float("-inf"))
    weight = torch.exp(lse - lse.amax(2, keepdim=True))[..., None]  # chunk 0 always holds a visible key
    out = torch.where(seen[..., None], out, 0.0).mul(weight).sum(2) / weight.sum(2)
    return from_grouped_rows(out.to(cache_k.dtype), q.shape)
