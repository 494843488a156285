"""Prompts into a group's KV caches, as many at once as fit one forward.

The rows a group admits together are prefilled in batches of one forward per model: prompts sorted
by length, right-padded to the longest of their batch (a causal mask keeps every real position
blind to the padding after it), at most PREFILL_TOKENS positions a batch. Keys and values land in
a scratch cache and are copied into the rows' slots; what the padding wrote past a row's length is
never read, since every kernel of the round masks by the row's length.

The arithmetic is the reference's (conjugate/models/reference.py) with two serving changes: on a
GPU the projections multiply in the weights' type (the fp32 activations cast, as the round's kernels
do) instead of converting every weight to fp32 on each call, and no logits are computed (the last
prompt id is the draft's first input, not part of the prefill).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from conjugate.models.reference import KVCache, apply_rope, rms_norm, rope_cos_sin
from conjugate.models.weights import ModelWeights

PREFILL_TOKENS = 8192  # positions (rows x longest prompt) one batched forward takes at most


def prefill_batches(prompts: dict[int, list[int]], budget: int = PREFILL_TOKENS) -> list[list[int]]:
    """The rows of `prompts` (row -> ids to prefill) in batches: by length, each batch's rows times
    its longest prompt at most `budget` (a longer prompt alone); rows with nothing to prefill left out."""
    rows = sorted((r for r, ids in prompts.items() if ids), key=lambda r: len(prompts[r]))
    batches: list[list[int]] = []
    for row in rows:
        if batches and (len(batches[-1]) + 1) * len(prompts[row]) <= budget:
            batches[-1].append(row)
        else:
            batches.append([row])
    return batches


def prefill(w: ModelWeights, cache: KVCache, prompts: dict[int, list[int]], budget: int = PREFILL_TOKENS) -> None:
    """Write the keys and values of each row's ids (row -> ids, from position 0) into `cache`."""
    for rows in prefill_batches(prompts, budget):
        longest = max(len(prompts[r]) for r in rows)
        tokens = torch.zeros(len(rows), longest, dtype=torch.int64)
        for i, r in enumerate(rows):
            tokens[i, :len(prompts[r])] = torch.tensor(prompts[r], dtype=torch.int64)
        scratch = _forward_into_scratch(w, tokens.to(cache.k.device, non_blocking=True), cache.k.dtype)
        index = torch.tensor(rows, device=cache.k.device)
        cache.k[:, index, :, :longest] = scratch.k
        cache.v[:, index, :, :longest] = scratch.v


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight^T, fp32 out: on a GPU in the weight's type (tensor cores, no fp32 copy of the
    weight), elsewhere in fp32 as the reference computes."""
    if weight.is_cuda:
        out = F.linear(x.to(weight.dtype), weight).float()
    else:
        out = x @ weight.float().t()
    return out + bias.float() if bias is not None else out


def _forward_into_scratch(w: ModelWeights, tokens: torch.Tensor, cache_dtype: torch.dtype) -> KVCache:
    """Every layer's keys and values of `tokens` [n, T] at positions 0..T-1: [layers, n, kv_heads, T, hd]."""
    spec = w.spec
    n, t = tokens.shape
    scratch = KVCache.empty(spec, n, t, cache_dtype, tokens.device)
    cos, sin = rope_cos_sin(spec, torch.arange(t, device=tokens.device))
    group = spec.num_heads // spec.num_kv_heads
    x = w.embed[tokens].float()
    for i, layer in enumerate(w.layers):
        h = rms_norm(x, layer.attn_norm, spec.rms_norm_eps)
        k = _linear(h, layer.wk, layer.bk).view(n, t, spec.num_kv_heads, spec.head_dim)
        v = _linear(h, layer.wv, layer.bv).view(n, t, spec.num_kv_heads, spec.head_dim)
        if spec.qk_norm:
            k = rms_norm(k, layer.k_norm, spec.rms_norm_eps)
        scratch.k[i] = apply_rope(k, cos, sin).transpose(1, 2).to(cache_dtype)
        scratch.v[i] = v.transpose(1, 2).to(cache_dtype)
        if i == len(w.layers) - 1:
            break  # the last layer's output feeds only the logits, which a prefill does not need
        q = _linear(h, layer.wq, layer.bq).view(n, t, spec.num_heads, spec.head_dim)
        if spec.qk_norm:
            q = rms_norm(q, layer.q_norm, spec.rms_norm_eps)
        q = apply_rope(q, cos, sin).transpose(1, 2)  # [n, heads, T, hd]
        # keys and values as the cache stores them, as the reference reads them back
        keys = scratch.k[i].float().repeat_interleave(group, dim=1)
        values = scratch.v[i].float().repeat_interleave(group, dim=1)
        o = F.scaled_dot_product_attention(q, keys, values, is_causal=True)
        x = x + _linear(o.transpose(1, 2).reshape(n, t, spec.num_heads * spec.head_dim), layer.wo)
        h = rms_norm(x, layer.mlp_norm, spec.rms_norm_eps)
        x = x + _linear(F.silu(_linear(h, layer.w_gate)) * _linear(h, layer.w_up), layer.w_down)
    return scratch
