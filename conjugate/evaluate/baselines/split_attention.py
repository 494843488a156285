"""`split` attention for the conventional baseline: flash-decoding built from torch's own kernel.

A decode step has few query rows per KV head, so attention that gives each head (and query tile) one
program walks the whole cache in a handful of programs: on the H200, torch's cuDNN kernel took
45.6 us a layer to read 4.2 MB of llama-3.1-8b's cache at B=1. Here a KV head's query heads become
the rows of one problem (`grouped_rows`), the cache [B, kv_heads, capacity, hd] is viewed (no copy)
as B x kv_heads x chunks problems of `chunk` keys starting every `stride` keys (`cut`: equal chunks
where the chunk count divides the capacity, else chunks that overlap a little, each key counted by
one chunk only), each attended by SDPA's memory-efficient kernel with its log-sum-exp, and the
chunks' results are combined by their log-sum-exp.

How many chunks: on a GPU, timed once per shape (`choose_chunks`: CHUNK_COUNTS, chunks of at least
SPLIT_MIN_KEYS keys, the fastest kept for the process) over caches that do not fit in the L2 cache,
as a model's layers stream theirs; elsewhere `split_count`'s rule.

The chunks are views of the cache by `unfold`. Cut by `as_strided`, the whole-step graph under
inductor ran nearly twice the kernels (944 against 497 in llama-1b-8b-b1's verify phase on the H200)
and the verify phase took 5.9-6.3 ms against 5.0-5.1
(benchmarks/results/conventional_variants_h200.json, runs 13 and 17).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

SPLIT_PROGRAMS = 256  # split_count cuts the cache until this many attention problems run at once
SPLIT_MIN_KEYS = 32  # ... and no chunk is shorter than this
CHUNK_COUNTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)  # the cuts choose_chunks times
COLD_BYTES = 256 << 20  # ... each over this many bytes of distinct caches (the H200's L2 holds 50 MB)
COLD_SETS = 512  # ... in at most this many caches (a 0.5 MB cache: 256 MB)

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


def cut(capacity: int, chunks: int) -> tuple[int, int]:
    """(chunk, stride): `chunks` chunks of `chunk` keys, one starting every `stride` keys, that cover
    `capacity` keys exactly: the shortest chunk of at least capacity / chunks keys for which the
    stride is whole (then stride <= chunk; they are equal when chunks divides capacity)."""
    if chunks == 1:
        return capacity, capacity
    chunk = -(-capacity // chunks)
    chunk += (capacity - chunk) % (chunks - 1)
    return chunk, (capacity - chunk) // (chunks - 1)


def chunk_counts(capacity: int) -> list[int]:
    """The cuts worth timing: CHUNK_COUNTS whose chunks hold at least SPLIT_MIN_KEYS keys and overlap
    by at most a quarter of the cache in all."""
    return [n for n in CHUNK_COUNTS if cut(capacity, n)[0] >= SPLIT_MIN_KEYS
            and n * cut(capacity, n)[0] <= 1.25 * capacity] or [1]


def split_count(capacity: int, problems: int) -> int:
    """The rule without a GPU to time on: chunks enough for SPLIT_PROGRAMS problems (`problems` before
    the cut), as long as a chunk holds SPLIT_MIN_KEYS keys."""
    wanted = -(-SPLIT_PROGRAMS // max(problems, 1))
    return max(1, min(wanted, capacity // SPLIT_MIN_KEYS))


def choose_chunks(batch: int, tokens: int, heads: int, kv_heads: int, capacity: int, head_dim: int,
                  dtype: torch.dtype, device: torch.device, time_us=None) -> int:
    """Chunks for this attention shape: on a GPU the fastest of chunk_counts, each timed on random data
    as a CUDA graph (`time_us(fn, device)`, default timing.time_per_call) over one cache after another
    (COLD_BYTES in all, so that each is read from memory), kept for the process."""
    if device.type != "cuda" and time_us is None:
        return split_count(capacity, batch * kv_heads)
    key = (batch, tokens, heads, kv_heads, capacity, head_dim, dtype, str(device))
    if key not in _CHOSEN:
        if time_us is None:
            from conjugate.evaluate.timing import time_per_call as time_us
        gen = torch.Generator(device=device).manual_seed(0)
        q = torch.randn(batch, tokens, heads, head_dim, generator=gen, device=device).to(dtype)
        shape = (batch, kv_heads, capacity, head_dim)
        one_cache = 2 * torch.Size(shape).numel() * dtype.itemsize
        caches = [tuple(torch.randn(shape, generator=gen, device=device).to(dtype) for _ in range(2))
                  for _ in range(max(1, min(COLD_SETS, -(-COLD_BYTES // one_cache))))]
        positions = torch.arange(capacity - tokens, capacity, device=device).expand(batch, tokens)
        visible = torch.arange(capacity, device=device)[None, None, :] <= positions[:, :, None]
        timed = {}
        for chunks in chunk_counts(capacity):
            mask = split_mask(visible, heads, kv_heads, dtype, chunks)
            timed[chunks] = time_us(lambda: [split_attention(q, k, v, mask) for k, v in caches], device)
        _CHOSEN[key] = min(timed, key=timed.get)
    return _CHOSEN[key]


def chosen_cuts() -> dict[str, int]:
    """The chunks choose_chunks has kept in this process, per shape as "B.. T.. heads.. kv.. capacity.. hd.."."""
    return {"B{} T{} heads{} kv{} capacity{} hd{}".format(*key[:6]): chunks for key, chunks in _CHOSEN.items()}


def kept_cuts() -> list[list]:
    """The chunks choose_chunks has kept in this process, as JSON for adopt_cuts:
    [[batch, tokens, heads, kv_heads, capacity, head_dim, dtype, device, chunks], ...]."""
    return [[*key[:6], str(key[6]).removeprefix("torch."), key[7], chunks] for key, chunks in _CHOSEN.items()]


def adopt_cuts(kept: list[list]) -> None:
    """Chunks kept by an earlier process (kept_cuts' form) taken as this process's, so that every
    process measuring a workload's conventional round cuts its caches alike: timed afresh, the cut can
    differ and move the verify phase by more than the spread allowed (qwen3-06b-8b-b4 on the H200:
    13.76 against 14.05 ms). ValueError for an entry of another form."""
    adopted = {}
    for entry in kept:
        if not (isinstance(entry, list) and len(entry) == 9):
            raise ValueError(f"a kept cut is not [B, T, heads, kv, capacity, hd, dtype, device, chunks]: {entry!r}")
        *shape, dtype_name, device, chunks = entry
        dtype = getattr(torch, str(dtype_name), None)
        if not (all(type(n) is int and n > 0 for n in (*shape, chunks)) and isinstance(dtype, torch.dtype)
                and isinstance(device, str)):
            raise ValueError(f"a kept cut is not [B, T, heads, kv, capacity, hd, dtype, device, chunks]: {entry!r}")
        adopted[(*shape, dtype, device)] = chunks
    for key, chunks in adopted.items():
        _CHOSEN.setdefault(key, chunks)


def split_mask(visible, heads: int, kv_heads: int, dtype, chunks: int):
    """The split's mask, made once per step for every layer, from [B, T, capacity] bool: (the additive
    mask [B * kv_heads, chunks, group * T, chunk] (0 or -inf) in `dtype`, its rows padded to 16
    elements as the memory-efficient kernel needs; which chunks hold a key to count
    [B, 1, chunks, group * T]). A key counts in a chunk when it is visible and the chunk owns it: the
    keys from its start to the next chunk's start (the last chunk: to the end)."""
    b, t, capacity = visible.shape
    group = heads // kv_heads
    (chunk, stride), rows = cut(capacity, chunks), group * t
    padded = chunk - chunk % -16
    start = torch.arange(chunks, device=visible.device)[:, None] * stride
    keys = start + torch.arange(chunk, device=visible.device)  # [chunks, chunk]: each chunk's key positions
    owned = (keys < start + stride) | (start == (chunks - 1) * stride)
    per_chunk = visible.repeat(1, group, 1)[:, :, keys] & owned  # [B, rows, chunks, chunk]
    per_chunk = per_chunk.permute(0, 2, 1, 3)  # [B, chunks, rows, chunk]
    bias = torch.where(per_chunk, 0.0, float("-inf")).to(dtype)
    bias = F.pad(bias, (0, padded - chunk))[:, None].expand(b, kv_heads, chunks, rows, padded)
    return bias.reshape(b * kv_heads, chunks, rows, padded)[..., :chunk], per_chunk.any(-1)[:, None]


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
    if not (cache_k.is_contiguous() and cache_v.is_contiguous()):
        raise ValueError("split attention views the cache as it lies: it must be contiguous")
    b, t, heads, hd = q.shape
    kv_heads, capacity = cache_k.shape[1], cache_k.shape[2]
    chunks = bias.shape[1]
    chunk, stride = cut(capacity, chunks)
    rows = grouped_rows(q, cache_k)  # [B, kv_heads, R, hd]
    r = rows.shape[2]
    queries = rows[:, :, None].expand(b, kv_heads, chunks, r, hd).reshape(b * kv_heads, chunks, r, hd)
    # [B * kv_heads, chunks, chunk, hd], views of the cache as it lies, by unfold (with as_strided over
    # a cache written in the same graph, inductor's graph ran nearly twice the kernels: module note)
    keys, values = (c.unfold(2, chunk, stride).transpose(-1, -2).reshape(b * kv_heads, chunks, chunk, hd)
                    for c in (cache_k, cache_v))
    out, lse = chunk_attention(queries, keys, values, bias)
    out, lse = out.view(b, kv_heads, chunks, r, hd).float(), lse.view(b, kv_heads, chunks, r)
    lse = torch.where(seen, lse, float("-inf"))
    weight = torch.exp(lse - lse.amax(2, keepdim=True))[..., None]  # chunk 0 always holds a visible key
    out = torch.where(seen[..., None], out, 0.0).mul(weight).sum(2) / weight.sum(2)
    return from_grouped_rows(out.to(cache_k.dtype), q.shape)
