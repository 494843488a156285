"""The `conventional` baseline: each model compiled on its own with torch.compile, as a serving
engine would run it, the draft phase then the verify phase.

`StaticStep` is the model's forward with every shape fixed (the KV cache at its full length, the
position a tensor), so torch.compile traces it once and a CUDA graph can replay it: attention is
F.scaled_dot_product_attention over the whole cache under a mask (key position <= query position),
grouped-query heads sharing their KV head, and the new keys and values are written with index_copy_.
GEMMs and attention run in the weights' dtype; norms, RoPE (q and k rounded back to that dtype) and
softmax compute in fp32, and the residual stream is fp32 as in this project's kernels, so both are
held to the same tolerance against the fp32 reference.

Attention by explicit matmuls over the cache made the round 40% slower: cuBLAS ran the score GEMMs
in its path without tensor cores, most likely because the cache's odd length (context + k + 1)
leaves their rows unaligned (benchmarks/conventional_profile.py).
"""
from __future__ import annotations

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


def _layer(x, positions, cos, sin, visible, cache_k, cache_v, w: tuple, spec):
    """One decoder layer over the fp32 residual stream x [B, T, H]; writes its new keys and values
    into cache_k/cache_v [B, kv_heads, max_len, hd] at `positions` and returns the new x."""
    attn_norm, w_qkv, b_qkv, q_norm, k_norm, wo, mlp_norm, w_gate_up, w_down = w
    b, t, _ = x.shape
    q_size, kv_size = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    h = _rms(x, attn_norm, spec.rms_norm_eps).to(w_qkv.dtype)
    q, k, v = F.linear(h, w_qkv, b_qkv).split([q_size, kv_size, kv_size], dim=-1)
    q = q.reshape(b, t, spec.num_heads, spec.head_dim)
    k = k.reshape(b, t, spec.num_kv_heads, spec.head_dim)
    v = v.reshape(b, t, spec.num_kv_heads, spec.head_dim)
    if spec.qk_norm:
        q, k = _rms(q, q_norm, spec.rms_norm_eps), _rms(k, k_norm, spec.rms_norm_eps)
    q, k = _rope(q, cos, sin), _rope(k, cos, sin)
    cache_k.index_copy_(2, positions, k.transpose(1, 2).to(cache_k.dtype))
    cache_v.index_copy_(2, positions, v.transpose(1, 2).to(cache_v.dtype))
    x = x + F.linear(_attention(q, cache_k, cache_v, visible), wo).float()
    h = _rms(x, mlp_norm, spec.rms_norm_eps).to(w_gate_up.dtype)
    gate, up = F.linear(h, w_gate_up).chunk(2, dim=-1)
    return x + F.linear(F.silu(gate) * up, w_down).float()


def _attention(q, cache_k, cache_v, visible):
    """q: [B, T, heads, hd]; cache_k/v: [B, kv_heads, max_len, hd]; visible: [T, max_len] ->
    [B, T, heads * hd] in the cache's dtype. Each KV head serves its group of query heads."""
    b, t, heads, hd = q.shape
    out = F.scaled_dot_product_attention(q.transpose(1, 2).to(cache_k.dtype), cache_k, cache_v,
                                         attn_mask=visible, enable_gqa=heads != cache_k.shape[1])
    return out.transpose(1, 2).reshape(b, t, heads * hd)


def _head(x, final_norm, lm_head, eps: float):
    return F.linear(_rms(x, final_norm, eps).to(lm_head.dtype), lm_head).float()


def _fused(l) -> tuple:
    """A layer's weights as engines hold them: q/k/v in one projection, gate/up in another."""
    b_qkv = torch.cat([l.bq, l.bk, l.bv]) if l.bq is not None else None
    return (l.attn_norm, torch.cat([l.wq, l.wk, l.wv]), b_qkv, l.q_norm, l.k_norm, l.wo, l.mlp_norm,
            torch.cat([l.w_gate, l.w_up]), l.w_down)


class StaticStep:
    """One forward over `tokens` new tokens per sequence at a position given as a tensor.

    Compiled piecewise, as serving engines do: every layer has the same shapes, so one compiled
    layer graph serves them all (the weights are its arguments), and the head is a second graph.
    Projections are fused as in engines (q/k/v one GEMM, gate/up one GEMM)."""

    def __init__(self, weights: ModelWeights, cache: KVCache, tokens: int, compile_fn: Callable = lambda fn: fn):
        self.w, self.cache, self.tokens = weights, cache, tokens
        self.max_len = cache.k.shape[3]
        self.cos, self.sin = rope_cos_sin(weights.spec, torch.arange(self.max_len, device=weights.device))
        self.layer, self.head = compile_fn(_layer), compile_fn(_head)
        self.layer_weights = [_fused(l) for l in weights.layers]

    def __call__(self, tokens: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """tokens: [B, T] int64; start: [] int64. Returns fp32 logits [B, T, V]."""
        w, spec = self.w, self.w.spec
        positions = start + torch.arange(tokens.shape[1], device=tokens.device)  # [T]
        cos, sin = self.cos[positions], self.sin[positions]
        visible = torch.arange(self.max_len, device=tokens.device)[None, :] <= positions[:, None]  # [T, max_len]
        x = w.embed[tokens].float()  # [B, T, H], the fp32 residual stream
        for i, lw in enumerate(self.layer_weights):
            x = self.layer(x, positions, cos, sin, visible, self.cache.k[i], self.cache.v[i], lw, spec)
        return self.head(x, w.final_norm, w.lm_head, spec.rms_norm_eps)


def compile_static(fn: Callable) -> Callable:
    """torch.compile for a StaticStep piece. All steps share these code objects, so dynamo's
    per-code recompile limit (8) would silently send later models back to eager: lift it."""
    compiled = torch.compile(fn, dynamic=False)
    limits = {key: 4096 for key in ("recompile_limit", "accumulated_recompile_limit", "cache_size_limit")
              if hasattr(torch._dynamo.config, key)}

    def run(*args):
        with torch._dynamo.config.patch(**limits):
            return compiled(*args)

    return run


def _one_length(inputs: RoundInputs) -> int:
    """The length every sequence has before the round: static steps run all of them at one position."""
    lengths = set(inputs.draft_lengths.tolist()) | set(inputs.target_lengths.tolist())
    if len(lengths) != 1:
        raise ValueError(f"the conventional baseline needs every sequence at one length, got {sorted(lengths)}")
    return lengths.pop()


class ConventionalRound:
    """Both phases as torch.compile'd static steps over their own buffers: the conventional baseline.

    On a GPU `capture()` records each phase as a CUDA graph on a side stream of its own; then
    `run()` replays draft then verify (conventional) and `run_streams()` replays the two graphs
    concurrently on two streams (the streams baseline)."""

    def __init__(self, draft: ModelWeights, target: ModelWeights, inputs: RoundInputs,
                 compile_fn: Callable = compile_static):
        self.k, self.context = inputs.k, _one_length(inputs)
        self.draft_cache, self.target_cache = inputs.draft_cache.clone(), inputs.target_cache.clone()
        self.draft_step = StaticStep(draft, self.draft_cache, 1, compile_fn)
        self.verify_step = StaticStep(target, self.target_cache, self.k + 1, compile_fn)
        device = self.device = draft.device
        self.draft_last = inputs.draft_last_tokens.clone()
        self.verify_tokens = inputs.verify_tokens.clone()
        self.starts = [torch.tensor(self.context + s, device=device) for s in range(self.k + 1)]
        self.draft_tokens = torch.zeros(self.draft_last.shape[0], self.k, dtype=torch.int64, device=device)
        self.draft_logits = torch.zeros(self.draft_last.shape[0], self.k, draft.spec.vocab_size, device=device)
        self.target_logits = torch.zeros(*self.verify_tokens.shape, target.spec.vocab_size, device=device)
        self.graphs: dict[str, torch.cuda.CUDAGraph] = {}

    def load(self, inputs: RoundInputs) -> None:
        """New round inputs into the same buffers (captured graphs read them from there)."""
        for mine, theirs in ((self.draft_cache, inputs.draft_cache), (self.target_cache, inputs.target_cache)):
            mine.k.copy_(theirs.k)
            mine.v.copy_(theirs.v)
        self.draft_last.copy_(inputs.draft_last_tokens)
        self.verify_tokens.copy_(inputs.verify_tokens)

    def draft_phase(self) -> None:
        current = self.draft_last[:, None]
        for s in range(self.k):
            logits = self.draft_step(current, self.starts[s])[:, 0]  # [Bd, V]
            self.draft_logits[:, s] = logits
            self.draft_tokens[:, s] = logits.argmax(-1)
            current = self.draft_tokens[:, s:s + 1]

    def verify_phase(self) -> None:
        self.target_logits.copy_(self.verify_step(self.verify_tokens, self.starts[0]))

    def capture(self) -> None:
        """Each phase in a CUDA graph of its own, captured on its own side stream (GPU only)."""
        from conjugate.evaluate.timing import capture

        self.graphs = {"draft": capture(self.draft_phase, self.device, warmup=3),
                       "verify": capture(self.verify_phase, self.device, warmup=3)}

    def run(self) -> None:
        if self.graphs:
            self.graphs["draft"].replay()
            self.graphs["verify"].replay()
        else:
            self.draft_phase()
            self.verify_phase()

    def run_streams(self) -> None:
        """The two captured phases at once, each on a stream forked from and joined to the current one."""
        main = torch.cuda.current_stream(self.device)
        if not hasattr(self, "_streams"):
            self._streams = (torch.cuda.Stream(self.device), torch.cuda.Stream(self.device))
        for stream, phase in zip(self._streams, ("draft", "verify")):
            stream.wait_stream(main)
            with torch.cuda.stream(stream):
                self.graphs[phase].replay()
        for stream in self._streams:
            main.wait_stream(stream)

    def outputs(self) -> RoundOutputs:
        return RoundOutputs(self.draft_tokens.clone(), self.draft_logits.clone(), self.target_logits.clone(),
                            self.target_logits.argmax(-1), KVCache(self.draft_cache.k.clone(), self.draft_cache.v.clone()),
                            KVCache(self.target_cache.k.clone(), self.target_cache.v.clone()))
