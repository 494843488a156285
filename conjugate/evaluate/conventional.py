"""The `conventional` baseline: each model compiled on its own with torch.compile, as a serving
engine would run it, the draft phase then the verify phase.

`StaticStep` is the model's forward with every shape fixed (the KV cache at its full length, the
position a tensor), so torch.compile traces it once and a CUDA graph can replay it: attention runs
over the whole cache under a mask (key position <= query position) and the new keys and values are
written with index_copy_. Arithmetic is in the weights' dtype with fp32 softmax and norms, as in an
engine; correctness against the fp32 reference uses the dtype's tolerance.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from conjugate.models.reference import KVCache, RoundInputs, RoundOutputs, rope_cos_sin
from conjugate.models.weights import ModelWeights


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, T, heads, hd]; cos/sin: [T, hd] fp32."""
    half = x.shape[-1] // 2
    xf = x.float()
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos[None, :, None] + rotated * sin[None, :, None]).to(x.dtype)


class StaticStep:
    """One forward over `tokens` new tokens per sequence at a position given as a tensor."""

    def __init__(self, weights: ModelWeights, cache: KVCache, tokens: int):
        self.w, self.cache, self.tokens = weights, cache, tokens
        self.max_len = cache.k.shape[3]
        cos, sin = rope_cos_sin(weights.spec, torch.arange(self.max_len, device=weights.device))
        self.cos, self.sin = cos, sin  # [max_len, hd]

    def __call__(self, tokens: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """tokens: [B, T] int64; start: [] int64. Returns fp32 logits [B, T, V]."""
        spec, w = self.w.spec, self.w
        b, t = tokens.shape
        positions = start + torch.arange(t, device=tokens.device)  # [T]
        cos, sin = self.cos[positions], self.sin[positions]
        keys_at = torch.arange(self.max_len, device=tokens.device)
        visible = keys_at[None, :] <= positions[:, None]  # [T, max_len]
        x = w.embed[tokens]  # [B, T, H] in the weights' dtype
        for i, layer in enumerate(w.layers):
            x = x + self._attention(i, layer, _rms(x, layer.attn_norm, spec.rms_norm_eps), positions, cos, sin,
                                    visible)
            h = _rms(x, layer.mlp_norm, spec.rms_norm_eps)
            x = x + F.linear(F.silu(F.linear(h, layer.w_gate)) * F.linear(h, layer.w_up), layer.w_down)
        return F.linear(_rms(x, w.final_norm, spec.rms_norm_eps), w.lm_head).float()

    def _attention(self, i, layer, h, positions, cos, sin, visible) -> torch.Tensor:
        spec = self.w.spec
        b, t, _ = h.shape
        q = F.linear(h, layer.wq, layer.bq).view(b, t, spec.num_heads, spec.head_dim)
        k = F.linear(h, layer.wk, layer.bk).view(b, t, spec.num_kv_heads, spec.head_dim)
        v = F.linear(h, layer.wv, layer.bv).view(b, t, spec.num_kv_heads, spec.head_dim)
        if spec.qk_norm:
            q, k = _rms(q, layer.q_norm, spec.rms_norm_eps), _rms(k, layer.k_norm, spec.rms_norm_eps)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        self.cache.k[i].index_copy_(2, positions, k.transpose(1, 2).to(self.cache.k.dtype))
        self.cache.v[i].index_copy_(2, positions, v.transpose(1, 2).to(self.cache.v.dtype))
        group = spec.num_heads // spec.num_kv_heads
        keys = self.cache.k[i].repeat_interleave(group, dim=1)  # [B, heads, max_len, hd]
        values = self.cache.v[i].repeat_interleave(group, dim=1)
        scores = (q.transpose(1, 2).float() @ keys.float().transpose(2, 3)) / math.sqrt(spec.head_dim)
        probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)  # [B, heads, T, max_len]
        out = (probs @ values.float()).to(h.dtype).transpose(1, 2).reshape(b, t, -1)
        return F.linear(out, layer.wo)


def compile_static(fn: Callable) -> Callable:
    """torch.compile for one StaticStep. All steps share one code object, so dynamo's per-code
    recompile limit (8) would silently send later models back to eager: lift it for these calls."""
    compiled = torch.compile(fn, dynamic=False)
    limits = {key: 4096 for key in ("recompile_limit", "accumulated_recompile_limit", "cache_size_limit")
              if hasattr(torch._dynamo.config, key)}

    def run(*args):
        with torch._dynamo.config.patch(**limits):
            return compiled(*args)

    return run


class ConventionalRound:
    """Both phases as torch.compile'd static steps over their own buffers: the conventional baseline.
    (CUDA-graph capture of the two phases, for timing on the GPU, is still to come.)"""

    def __init__(self, draft: ModelWeights, target: ModelWeights, inputs: RoundInputs,
                 compile_fn: Callable = compile_static):
        self.k, self.context = inputs.k, inputs.context
        self.draft_cache, self.target_cache = inputs.draft_cache.clone(), inputs.target_cache.clone()
        self.inputs = inputs
        self.draft_step = compile_fn(StaticStep(draft, self.draft_cache, 1).__call__)
        self.verify_step = compile_fn(StaticStep(target, self.target_cache, self.k + 1).__call__)
        device = draft.device
        self.draft_last = inputs.draft_last_tokens.clone()
        self.verify_tokens = inputs.verify_tokens.clone()
        self.starts = [torch.tensor(self.context + s, device=device) for s in range(self.k + 1)]
        self.draft_tokens = torch.zeros(self.draft_last.shape[0], self.k, dtype=torch.int64, device=device)
        self.draft_logits = torch.zeros(self.draft_last.shape[0], self.k, draft.spec.vocab_size, device=device)
        self.target_logits = torch.zeros(*self.verify_tokens.shape, target.spec.vocab_size, device=device)

    def draft_phase(self) -> None:
        current = self.draft_last[:, None]
        for s in range(self.k):
            logits = self.draft_step(current, self.starts[s])[:, 0]  # [Bd, V]
            self.draft_logits[:, s] = logits
            self.draft_tokens[:, s] = logits.argmax(-1)
            current = self.draft_tokens[:, s:s + 1]

    def verify_phase(self) -> None:
        self.target_logits.copy_(self.verify_step(self.verify_tokens, self.starts[0]))

    def run(self) -> None:
        self.draft_phase()
        self.verify_phase()

    def outputs(self) -> RoundOutputs:
        return RoundOutputs(self.draft_tokens.clone(), self.draft_logits.clone(), self.target_logits.clone(),
                            self.target_logits.argmax(-1), KVCache(self.draft_cache.k.clone(), self.draft_cache.v.clone()),
                            KVCache(self.target_cache.k.clone(), self.target_cache.v.clone()))
