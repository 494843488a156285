"""The reference speculative-decoding round, in plain PyTorch (no Triton).

Arithmetic is fp32 whatever the weight dtype; KV caches are stored in the weight dtype, as a
serving engine stores them, so every implementation reads back the same rounded keys and values.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from conjugate.models.spec import ModelSpec
from conjugate.models.weights import ModelWeights


@dataclass
class KVCache:
    k: torch.Tensor  # [layers, batch, kv_heads, max_len, head_dim], post-RoPE keys
    v: torch.Tensor  # [layers, batch, kv_heads, max_len, head_dim]

    @classmethod
    def empty(cls, spec: ModelSpec, batch: int, max_len: int, dtype, device) -> "KVCache":
        """Zeros; keys and values are the two halves of one [2, ...] tensor (the step kernel's layout)."""
        both = torch.zeros((2, spec.num_layers, batch, spec.num_kv_heads, max_len, spec.head_dim), dtype=dtype,
                           device=device)
        return cls(both[0], both[1])

    def clone(self) -> "KVCache":
        return KVCache(self.k.clone(), self.v.clone())

    def rows(self, b: int) -> "KVCache":
        """Sequence b's caches, as views: writes go through."""
        return KVCache(self.k[:, b:b + 1], self.v[:, b:b + 1])


def rope_inv_freq(spec: ModelSpec) -> torch.Tensor:
    """[head_dim / 2] inverse frequencies, with Llama-3 scaling when the spec has it."""
    dim = spec.head_dim
    inv_freq = 1.0 / (spec.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    s = spec.rope_scaling
    if s is None:
        return inv_freq
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_cos_sin(spec: ModelSpec, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: [T, head_dim] for integer positions [T] (rotate-half convention)."""
    freqs = positions.float()[:, None] * rope_inv_freq(spec).to(positions.device)[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, T, heads, head_dim]; cos/sin: [T, head_dim]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[None, :, None, :] + rotated * sin[None, :, None, :]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    out = x @ weight.float().t()
    return out + bias.float() if bias is not None else out


def attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int) -> torch.Tensor:
    """q: [B, T, heads, hd]; keys/values: [B, kv_heads, start + T, hd]. Query t sees keys 0..start+t."""
    b, t, heads, hd = q.shape
    group = heads // keys.shape[1]
    keys = keys.float().repeat_interleave(group, dim=1)  # [B, heads, S, hd]
    values = values.float().repeat_interleave(group, dim=1)
    scores = q.transpose(1, 2) @ keys.transpose(2, 3) / math.sqrt(hd)  # [B, heads, T, S]
    s = keys.shape[2]
    visible = torch.arange(s, device=q.device)[None, :] <= (start + torch.arange(t, device=q.device))[:, None]
    scores = scores.masked_fill(~visible, float("-inf"))
    return (scores.softmax(-1) @ values).transpose(1, 2).reshape(b, t, heads * hd)


def forward(w: ModelWeights, tokens: torch.Tensor, cache: KVCache, start: int | torch.Tensor) -> torch.Tensor:
    """One forward over T new tokens per sequence at positions start..start+T-1.

    tokens: [B, T]; start: one position for every sequence, or int64 [B] (sequences at different
    lengths); writes the new keys and values into `cache`; returns fp32 logits [B, T, V].
    """
    if isinstance(start, torch.Tensor):
        starts = start.tolist()
        if len(set(starts)) > 1:  # ragged: each sequence on its own, through views of the caches
            return torch.cat([forward(w, tokens[b:b + 1], cache.rows(b), s) for b, s in enumerate(starts)])
        start = starts[0]
    spec = w.spec
    b, t = tokens.shape
    x = w.embed[tokens].float()  # [B, T, H]
    cos, sin = rope_cos_sin(spec, torch.arange(start, start + t, device=tokens.device))
    for i, layer in enumerate(w.layers):
        h = rms_norm(x, layer.attn_norm, spec.rms_norm_eps)
        q = _linear(h, layer.wq, layer.bq).view(b, t, spec.num_heads, spec.head_dim)
        k = _linear(h, layer.wk, layer.bk).view(b, t, spec.num_kv_heads, spec.head_dim)
        v = _linear(h, layer.wv, layer.bv).view(b, t, spec.num_kv_heads, spec.head_dim)
        if spec.qk_norm:
            q, k = rms_norm(q, layer.q_norm, spec.rms_norm_eps), rms_norm(k, layer.k_norm, spec.rms_norm_eps)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        cache.k[i, :, :, start:start + t] = k.transpose(1, 2).to(cache.k.dtype)
        cache.v[i, :, :, start:start + t] = v.transpose(1, 2).to(cache.v.dtype)
        o = attention(q, cache.k[i, :, :, :start + t], cache.v[i, :, :, :start + t], start)
        x = x + _linear(o, layer.wo)
        h = rms_norm(x, layer.mlp_norm, spec.rms_norm_eps)
        x = x + _linear(F.silu(_linear(h, layer.w_gate)) * _linear(h, layer.w_up), layer.w_down)
    return _linear(rms_norm(x, w.final_norm, spec.rms_norm_eps), w.lm_head)


@dataclass
class RoundInputs:
    """One round: group A's draft phase and group B's verify phase, each sequence after its own
    number of tokens (its length)."""

    draft_last_tokens: torch.Tensor  # [Bd] the last accepted token of each draft sequence
    verify_tokens: torch.Tensor  # [Bt, k + 1] last accepted token + k proposed tokens
    draft_cache: KVCache  # positions [0, draft_lengths[b]) filled
    target_cache: KVCache
    draft_lengths: torch.Tensor  # [Bd] int64
    target_lengths: torch.Tensor  # [Bt] int64

    @property
    def k(self) -> int:
        return self.verify_tokens.shape[1] - 1


@dataclass
class RoundOutputs:
    draft_tokens: torch.Tensor  # [Bd, k]
    draft_logits: torch.Tensor  # [Bd, k, Vd] fp32
    target_logits: torch.Tensor  # [Bt, k + 1, Vt] fp32
    target_tokens: torch.Tensor  # [Bt, k + 1] argmax of target_logits
    draft_cache: KVCache
    target_cache: KVCache


def draft_phase(draft: ModelWeights, last_tokens: torch.Tensor, cache: KVCache, lengths: torch.Tensor, k: int,
                forced: torch.Tensor | None = None):
    """k greedy decode steps; returns tokens [Bd, k] and logits [Bd, k, V]. With `forced` [Bd, k]
    (teacher forcing) step s + 1 decodes from forced[:, s] instead of step s's own argmax."""
    tokens, logits = [], []
    current = last_tokens[:, None]  # [Bd, 1]
    for step in range(k):
        step_logits = forward(draft, current, cache, lengths + step)[:, 0]  # [Bd, V]
        chosen = step_logits.argmax(-1)
        tokens.append(chosen)
        logits.append(step_logits)
        current = (chosen if forced is None else forced[:, step]).view(-1, 1)
    return torch.stack(tokens, 1), torch.stack(logits, 1)


def reference_round(draft: ModelWeights, target: ModelWeights, inputs: RoundInputs,
                    forced_draft_tokens: torch.Tensor | None = None) -> RoundOutputs:
    """Runs both phases on copies of the caches; the inputs are left untouched. `forced_draft_tokens`
    teacher-forces the draft phase (see draft_phase)."""
    draft_cache, target_cache = inputs.draft_cache.clone(), inputs.target_cache.clone()
    draft_tokens, draft_logits = draft_phase(draft, inputs.draft_last_tokens, draft_cache, inputs.draft_lengths, inputs.k,
                                             forced_draft_tokens)
    target_logits = forward(target, inputs.verify_tokens, target_cache, inputs.target_lengths)
    return RoundOutputs(draft_tokens, draft_logits, target_logits, target_logits.argmax(-1), draft_cache, target_cache)


def make_round_inputs(draft: ModelWeights, target: ModelWeights, *, k: int, draft_batch: int, target_batch: int,
                      context: int, seed: int, kv_init: str = "random", ragged: bool = False) -> RoundInputs:
    """Seeded inputs. kv_init 'random' fills the caches with N(0, 1) data; 'prefill' runs each model
    over a random prompt, so the caches hold real keys and values. Every sequence is `context` tokens
    long, or with `ragged` of a seeded length in context // 2 .. context (the cache past each length
    then holds noise the round must not read)."""
    if kv_init not in ("random", "prefill"):
        raise ValueError(f"kv_init must be 'random' or 'prefill', got {kv_init!r}")
    device = draft.device
    gen = torch.Generator(device="cpu").manual_seed(seed)
    vocab = draft.spec.vocab_size  # proposals come from the draft's vocabulary
    capacity = context + k + 1

    def tokens(*shape: int) -> torch.Tensor:
        return torch.randint(0, vocab, shape, generator=gen).to(device)

    def lengths(batch: int) -> torch.Tensor:
        if not ragged:
            return torch.full((batch,), context, dtype=torch.int64, device=device)
        return torch.randint(context // 2, context + 1, (batch,), generator=gen).to(device)

    def cache_for(w: ModelWeights, lens: torch.Tensor) -> KVCache:
        cache = KVCache.empty(w.spec, len(lens), capacity, w.dtype, device)
        if kv_init == "prefill" and context:
            forward(w, tokens(len(lens), context), cache, 0)  # positions past a sequence's length are unread
            return cache
        filled = capacity if ragged else context
        for buf in (cache.k, cache.v):
            noise = torch.randn(buf[:, :, :, :filled].shape, generator=gen)
            buf[:, :, :, :filled] = noise.to(device=device, dtype=buf.dtype)
        return cache

    draft_lengths, target_lengths = lengths(draft_batch), lengths(target_batch)
    draft_cache, target_cache = cache_for(draft, draft_lengths), cache_for(target, target_lengths)
    return RoundInputs(tokens(draft_batch), tokens(target_batch, k + 1), draft_cache, target_cache,
                       draft_lengths, target_lengths)
