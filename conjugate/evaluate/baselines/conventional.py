"""The `conventional` baseline: each model run on its own by torch, as a serving engine would run it.

`StaticStep` is a model's forward with every shape fixed: the KV cache at its full capacity, each
sequence's position read from its length at run time (ragged batches allowed), so torch.compile
traces it once and a CUDA graph replays it as contexts grow. Attention is
F.scaled_dot_product_attention over the whole cache under a per-sequence mask (key position <=
query position); new keys and values are written into the cache in place. GEMMs and attention run
in the weights' dtype; norms, RoPE (q and k rounded back to that dtype) and softmax compute in fp32,
and the residual stream is fp32 as in this project's kernels, so both are held to one tolerance
(the `-bf16` variants keep it in the weights' dtype, as serving engines do: bf16 on the bf16
workloads, and fp32, so no change, on fp32 ones; chosen only where that passes the same check).

A step is built in one of several variants (`Variant`: how it is compiled x how attention runs);
the baselines time each and use the fastest correct one per phase (baselines.py):
- compile `layers`: one compiled graph per layer shape, reused by every layer (the weights are its
  arguments), and one for the head; `whole`: the whole step one graph, each layer's cache passed as
  a view of its own so that its in-place write stays in place (a view of one cache for all layers
  became a copy of every layer's cache per write: 40 ms a round); `tuned`: as `whole`, compiled with
  inductor's autotuning (each GEMM timed as cuBLAS and as Triton templates that can take the
  residual add and other epilogues into the GEMM; reductions tuned by coordinate descent);
  `eager`: not compiled (tests);
- attention `sdpa`: one SDPA call with grouped-query heads sharing their KV head (`enable_gqa`);
  `grouped`: a KV head's query heads stacked as rows of one SDPA call (each KV head read once);
  `efficient`: `grouped` held to SDPA's memory-efficient kernel; `matmul`: `grouped` as two batched
  GEMMs around a compiled masked softmax; `split`: `grouped` with the cache cut into chunks attended
  apart and combined (flash-decoding from torch's kernels: split_attention.py); `reduce`: products
  and sums in fp32 that the compiler turns into reductions of its own (no attention kernel; not
  tried by default: on the H200 correct but 1.9x the fastest draft and 4.5x the fastest verify on
  llama-1b-8b-b8, benchmarks/README.md);
  `flex`: FlexAttention with the per-sequence mask as a score modification (compiled: a Triton
  kernel). Not among the variants tried by default: on the H200 it was correct but slower in every
  phase measured (1.5-1.7x the fastest draft, 1.2-1.3x the fastest verify, 19x on qwen2.5-0.5b's
  draft: benchmarks/README.md).

Attention by explicit matmuls over the cache made the round 40% slower: cuBLAS ran the score GEMMs
in its path without tensor cores (lab/experiments/conventional_profile.py).

`ConventionalRound` runs both phases over the same `RoundBuffers` a compiled plan uses, with the
same interface (load, phase, run_eager, warmup, capture, run, outputs), so the checks, the timing
and the serving loop take either.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable

import torch
import torch.nn.functional as F

from conjugate.compiler.buffers import ModelBuffers, PreparedWeights, RoundBuffers
from conjugate.compiler.embed import sample_call
from conjugate.compiler.sampling import launch_sample
from conjugate.compiler.tile import PartCall
from conjugate.evaluate.baselines.split_attention import (choose_chunks, from_grouped_rows, grouped_rows, split_attention,
                                                split_mask)
from conjugate.models.reference import KVCache, RoundInputs, RoundOutputs
from conjugate.roles import Model
from conjugate.workload import Workload

COMPILES = ("layers", "whole", "tuned", "eager")
RESIDUALS = ("fp32", "bf16")  # the residual stream's dtype: fp32, or the weights' dtype (named by its suffix)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, T, heads, hd]; cos/sin: [B, T, hd] fp32."""
    half = x.shape[-1] // 2
    xf = x.float()
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos[:, :, None] + rotated * sin[:, :, None]).to(x.dtype)


def _sdpa_attention(q, cache_k, cache_v, visible):
    """q: [B, T, heads, hd]; cache_k/v: [B, kv_heads, capacity, hd]; visible: [B, T, capacity] ->
    [B, T, heads * hd] in the cache's dtype. Each KV head serves its group of query heads."""
    b, t, heads, hd = q.shape
    out = F.scaled_dot_product_attention(q.transpose(1, 2).to(cache_k.dtype), cache_k, cache_v,
                                         attn_mask=visible[:, None], enable_gqa=heads != cache_k.shape[1])
    return out.transpose(1, 2).reshape(b, t, heads * hd)


def _grouped_attention(q, cache_k, cache_v, visible):
    """As _sdpa_attention, a KV head's query heads stacked as the rows of one attention problem."""
    group = q.shape[2] // cache_k.shape[1]
    out = F.scaled_dot_product_attention(grouped_rows(q, cache_k), cache_k, cache_v,
                                         attn_mask=visible.repeat(1, group, 1)[:, None])
    return from_grouped_rows(out, q.shape)


def _efficient_attention(q, cache_k, cache_v, visible):
    """As _grouped_attention, with SDPA held to its memory-efficient kernel where it can run (else its
    math form): on the H200 torch otherwise picks cuDNN's flash kernel, which walks the whole cache in
    one program per head and query tile."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    group = q.shape[2] // cache_k.shape[1]
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        out = F.scaled_dot_product_attention(grouped_rows(q, cache_k), cache_k, cache_v,
                                             attn_mask=visible.repeat(1, group, 1)[:, None])
    return from_grouped_rows(out, q.shape)


def _matmul_attention(q, cache_k, cache_v, visible):
    """Attention as two batched GEMMs in the cache's dtype around a masked softmax in fp32 (over scores
    the GEMM rounded to that dtype), a KV head's query heads as rows: the compiler fuses the scale,
    mask and softmax into one kernel. (On the H200 cuBLAS ran these small batched products in kernels
    without tensor cores: benchmarks/README.md.)"""
    rows = grouped_rows(q, cache_k)
    group = q.shape[2] // cache_k.shape[1]
    scores = torch.matmul(rows, cache_k.transpose(-1, -2)).float() * q.shape[-1] ** -0.5  # [B, kvh, rows, capacity]
    scores = scores.masked_fill(~visible.repeat(1, group, 1)[:, None], float("-inf"))
    out = torch.matmul(scores.softmax(-1).to(cache_v.dtype), cache_v)
    return from_grouped_rows(out, q.shape)


def _reduce_attention(q, cache_k, cache_v, visible):
    """Attention as plain products and sums in fp32, with no attention kernel: compiled, inductor
    generates its own fused reductions (the scores over the head dimension, the output over the
    cache), one program per row of outputs rather than per head and query tile, so a decode step's
    few query rows still spread over the whole GPU. A KV head's query heads share its cache."""
    b, t, heads, hd = q.shape
    kv_heads = cache_k.shape[1]
    rows = q.float().view(b, t, kv_heads, heads // kv_heads, hd).permute(0, 2, 3, 1, 4)  # [B, kvh, group, T, hd]
    if torch.compiler.is_compiling():  # fused by the compiler: the products are never held in memory
        keys, values = cache_k[:, :, None, None].float(), cache_v[:, :, None].float()  # [B, kvh, 1, 1, capacity, hd]
        scores = (rows[..., None, :] * keys).sum(-1)  # [B, kvh, group, T, capacity]
    else:  # run eagerly they would be [.., capacity, hd] tensors: the same sums by einsum
        scores = torch.einsum("bkgtd,bkcd->bkgtc", rows, cache_k.float())
    weights = (scores * hd ** -0.5).masked_fill(~visible[:, None, None], float("-inf")).softmax(-1)
    if torch.compiler.is_compiling():
        out = (weights[..., None] * values[:, :, :, None]).sum(-2)  # [B, kvh, group, T, hd]
    else:
        out = torch.einsum("bkgtc,bkcd->bkgtd", weights, cache_v.float())
    return out.permute(0, 3, 1, 2, 4).reshape(b, t, heads * hd).to(cache_k.dtype)


def _flex_attention(q, cache_k, cache_v, visible):
    """As _sdpa_attention, by FlexAttention: compiled, a Triton kernel generated for this mask."""
    from torch.nn.attention.flex_attention import flex_attention

    b, t, heads, hd = q.shape

    def hide_unseen(score, batch, head, q_idx, kv_idx):
        return torch.where(visible[batch, q_idx, kv_idx], score, float("-inf"))

    out = flex_attention(q.transpose(1, 2).to(cache_k.dtype), cache_k, cache_v, score_mod=hide_unseen,
                         enable_gqa=heads != cache_k.shape[1])
    return out.transpose(1, 2).reshape(b, t, heads * hd)


ATTENTION: dict[str, Callable] = {"sdpa": _sdpa_attention, "grouped": _grouped_attention,
                                  "efficient": _efficient_attention, "matmul": _matmul_attention,
                                  "split": split_attention, "reduce": _reduce_attention, "flex": _flex_attention}


@dataclass(frozen=True)
class Variant:
    """How a conventional step is built: its compilation, its attention and its residual stream."""
    compile: str
    attention: str
    residual: str = "fp32"

    @property
    def name(self) -> str:
        return f"{self.compile}-{self.attention}" + ("" if self.residual == "fp32" else f"-{self.residual}")

    @property
    def low_precision_residual(self) -> bool:
        return self.residual != "fp32"

    @classmethod
    def parse(cls, name: str) -> "Variant":
        parts = name.split("-") if isinstance(name, str) else []
        residual = parts.pop() if len(parts) == 3 and parts[2] in RESIDUALS[1:] else "fp32"
        if len(parts) != 2 or parts[0] not in COMPILES or parts[1] not in ATTENTION:
            raise ValueError(f"conventional variant {name!r}: expected <{'|'.join(COMPILES)}>-"
                             f"<{'|'.join(ATTENTION)}>[-{'|'.join(RESIDUALS[1:])}]")
        return cls(parts[0], parts[1], residual)


DEFAULT = Variant("layers", "sdpa")


def _layer(x, positions, cos, sin, visible, cache_k, cache_v, w: tuple, spec, attention: str):
    """One decoder layer over the residual stream x [B, T, H] (fp32, or the weights' dtype); writes its
    new keys and values into cache_k/cache_v [B, kv_heads, capacity, hd] at `positions` [B, T] and
    returns the new x, in x's dtype."""
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
    rows = torch.arange(b, device=x.device)[:, None]  # [B, 1]: with positions, each sequence's own slots
    cache_k[rows, :, positions] = k.to(cache_k.dtype)  # [B, T, kv_heads, hd] into [B, kv_heads, capacity, hd]
    cache_v[rows, :, positions] = v.to(cache_v.dtype)
    x = x + F.linear(ATTENTION[attention](q, cache_k, cache_v, visible), wo).to(x.dtype)
    h = _rms(x, mlp_norm, spec.rms_norm_eps).to(w_gate_up.dtype)
    gate, up = F.linear(h, w_gate_up).chunk(2, dim=-1)
    return x + F.linear(F.silu(gate) * up, w_down).to(x.dtype)


def _head(x, final_norm, lm_head, eps: float):
    """-> (fp32 logits, their greedy tokens): the argmax compiled with the head (torch's own argmax
    kernel took 26-27 us a call over 1 or 8 rows of a 128k vocabulary on the H200:
    benchmarks/results/conventional_variants_h200.json)."""
    logits = F.linear(_rms(x, final_norm, eps).to(lm_head.dtype), lm_head).float()
    return logits, logits.argmax(-1)


def _forward(layer, head, tokens, positions, embed, cos_table, sin_table, caches_k, caches_v, layer_weights,
             final_norm, lm_head, spec, attention: str, residual_fp32: bool = True, chunks: int = 1):
    """tokens, positions: [B, T] -> (fp32 logits [B, T, V], greedy tokens [B, T]); `layer`/`head` as
    compiled (or not); `chunks`: the cut of the cache for `split` attention."""
    capacity = cos_table.shape[0]
    cos, sin = cos_table[positions], sin_table[positions]  # [B, T, hd]
    visible = torch.arange(capacity, device=tokens.device)[None, None, :] <= positions[:, :, None]  # [B, T, capacity]
    if attention == "split":  # its mask made once for every layer
        visible = split_mask(visible, spec.num_heads, spec.num_kv_heads, caches_k[0].dtype, chunks)
    x = embed[tokens]  # [B, T, H], the residual stream
    x = x.float() if residual_fp32 else x
    for cache_k, cache_v, lw in zip(caches_k, caches_v, layer_weights):
        x = layer(x, positions, cos, sin, visible, cache_k, cache_v, lw, spec, attention)
    return head(x, final_norm, lm_head, spec.rms_norm_eps)


def _whole(tokens, positions, embed, cos_table, sin_table, caches_k, caches_v, layer_weights, final_norm, lm_head,
           spec, attention: str, residual_fp32: bool = True, chunks: int = 1):
    return _forward(_layer, _head, tokens, positions, embed, cos_table, sin_table, caches_k, caches_v, layer_weights,
                    final_norm, lm_head, spec, attention, residual_fp32, chunks)


def _fused(prepared: PreparedWeights, i: int) -> tuple:
    """Layer i's weights as engines hold them: q/k/v in one projection, gate/up in another (made once
    per model and shared with every round over the same prepared weights)."""
    l = prepared.weights.layers[i]
    w_qkv, b_qkv = prepared.qkv(i, folded=False)
    return (l.attn_norm, w_qkv, b_qkv, l.q_norm, l.k_norm, l.wo, l.mlp_norm, prepared.gate_up_stacked(i), l.w_down)


def compile_static(fn: Callable, mode: str | None = None) -> Callable:
    """torch.compile with static shapes (and inductor's `mode`). Every step shares these code objects,
    so dynamo's per-code recompile limit (8) would silently send later models back to eager: lift it."""
    compiled = torch.compile(fn, dynamic=False, mode=mode)
    limits = {key: 4096 for key in ("recompile_limit", "accumulated_recompile_limit", "cache_size_limit")
              if hasattr(torch._dynamo.config, key)}

    def run(*args):
        with torch._dynamo.config.patch(**limits):
            return compiled(*args)

    return run


class StaticStep:
    """One forward over a model's buffers: `tokens` new tokens per sequence at each sequence's
    length plus an offset, the keys and values written into the buffers' cache."""

    def __init__(self, bufs: ModelBuffers, variant: Variant):
        w = bufs.prepared.weights
        self.bufs, self.variant = bufs, variant
        self.layer_weights = [_fused(bufs.prepared, i) for i in range(len(w.layers))]
        # each layer's cache a view of its own: see the module's note on `whole`
        self.caches_k, self.caches_v = list(bufs.cache.k.unbind(0)), list(bufs.cache.v.unbind(0))
        self.arange = torch.arange(bufs.tokens, device=w.device)
        cache = bufs.cache.k  # [layers, B, kv_heads, capacity, hd]
        self.chunks = choose_chunks(cache.shape[1], bufs.tokens, w.spec.num_heads, cache.shape[2], cache.shape[3],
                                    cache.shape[4], cache.dtype, cache.device) if variant.attention == "split" else 1
        if variant.compile in ("whole", "tuned"):
            self.body = compile_static(_whole, "max-autotune-no-cudagraphs" if variant.compile == "tuned" else None)
        else:
            pieces = (compile_static(_layer), compile_static(_head)) if variant.compile == "layers" else (_layer, _head)
            self.body = lambda *args: _forward(*pieces, *args)

    def __call__(self, tokens: torch.Tensor, offset: int) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens: [B, T] int64 at positions lengths + offset + (0..T-1). Returns (fp32 logits [B, T, V],
        greedy tokens [B, T])."""
        w, bufs = self.bufs.prepared.weights, self.bufs
        positions = (bufs.lengths + offset)[:, None] + self.arange[:tokens.shape[1]]  # [B, T]
        return self.body(tokens, positions, w.embed, bufs.cos, bufs.sin, self.caches_k, self.caches_v,
                         self.layer_weights, w.final_norm, w.lm_head, w.spec, self.variant.attention,
                         not self.variant.low_precision_residual, self.chunks)


_SIDE_STREAMS: dict[torch.device, tuple] = {}


def on_two_streams(device: torch.device, *work: Callable[[], None]) -> None:
    """Each of `work` on a side stream of its own (two per device, made once), forked from and joined
    to the current stream."""
    main = torch.cuda.current_stream(device)
    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = (torch.cuda.Stream(device), torch.cuda.Stream(device))
    for stream, fn in zip(_SIDE_STREAMS[device], work):
        stream.wait_stream(main)
        with torch.cuda.stream(stream):
            fn()
    for stream in _SIDE_STREAMS[device]:
        main.wait_stream(stream)


class ConventionalRound:
    """Both phases as static steps over a round's buffers: the draft's k decode steps, then (or, with
    `streams`, beside) the target's verification of k + 1 tokens per sequence.

    On a GPU `capture()` records each phase as a CUDA graph on a side stream of its own; `run()`
    replays draft then verify (the conventional baseline), `run_streams()` the two concurrently (the
    streams baseline)."""

    def __init__(self, workload: Workload, draft: PreparedWeights, target: PreparedWeights,
                 draft_variant: Variant = DEFAULT, verify_variant: Variant = DEFAULT, streams: bool = False,
                 sampling: bool = False):
        """`sampling`: the draft samples its tokens from its logits by the sampling rows of its buffers
        (`bufs.draft.sampling`, greedy until set), with the compiled round's sample kernel."""
        self.workload, self.k = workload, workload.k
        self.variants = {Model.DRAFT: draft_variant, Model.TARGET: verify_variant}
        self.bufs = RoundBuffers.allocate(workload, draft, target, sampling=sampling)
        self.device = self.bufs.target.cache.k.device
        self.draft_step = StaticStep(self.bufs.draft, draft_variant)
        self.verify_step = StaticStep(self.bufs.target, verify_variant)
        self.streams = streams
        self.graphs: dict[Model, torch.cuda.CUDAGraph] = {}

    @property
    def name(self) -> str:
        d, t = self.variants[Model.DRAFT].name, self.variants[Model.TARGET].name
        return f"conventional ({d} / {t})" + (" on two streams" if self.streams else "")

    def load(self, inputs: RoundInputs) -> None:
        self.bufs.load(inputs)

    def draft_phase(self) -> None:
        d = self.bufs.draft
        current = d.tokens_in[:, None]
        for s in range(self.k):
            logits, greedy = self.draft_step(current, s)  # [Bd, 1, V], [Bd, 1]
            d.logits[:, s] = logits[:, 0]
            if d.sampling is None:
                d.tokens_out[:, s] = greedy[:, 0]
            else:
                launch_sample(self._samples[s])
            current = d.tokens_out[:, s:s + 1]

    @cached_property
    def _samples(self) -> list[PartCall]:
        """Per draft step, the sample kernel bound to the step's logits and tokens."""
        d = self.bufs.draft
        return [sample_call(d.logits[:, s], d.tokens_out[:, s], d.lengths, d.sampling, rows=d.batch,
                            vocab=d.logits.shape[2], step=s, stride_out=d.steps) for s in range(self.k)]

    def verify_phase(self) -> None:
        t = self.bufs.target
        logits, greedy = self.verify_step(t.tokens_in.view(t.batch, t.tokens), 0)  # [Bt, k + 1, V], [Bt, k + 1]
        t.logits.copy_(logits.view(t.rows, -1))
        t.tokens_out.copy_(greedy.view(-1))

    def phase(self, model: Model) -> Callable[[], None]:
        return self.draft_phase if model == Model.DRAFT else self.verify_phase

    def run_eager(self) -> None:
        """Both phases launched kernel by kernel: one after the other, or on two streams."""
        if not (self.streams and self.device.type == "cuda"):
            self.draft_phase()
            self.verify_phase()
            return
        on_two_streams(self.device, self.draft_phase, self.verify_phase)

    def warmup(self) -> None:
        """Compile both steps (torch.compile traces on the first call)."""
        self.draft_phase()
        self.verify_phase()

    def capture(self) -> None:
        """Each phase in a CUDA graph of its own, captured on its own side stream (GPU only)."""
        from conjugate.evaluate.timing import capture

        self.graphs = {model: capture(self.phase(model), self.device, warmup=3) for model in Model}

    def prepare(self) -> None:
        self.capture() if self.device.type == "cuda" else self.warmup()

    def run(self) -> None:
        """The round as captured (each phase's graph; on two streams with `streams`), else eagerly."""
        if not self.graphs:
            return self.run_eager()
        if self.streams:
            return self.run_streams()
        self.graphs[Model.DRAFT].replay()
        self.graphs[Model.TARGET].replay()

    def run_streams(self) -> None:
        on_two_streams(self.device, self.graphs[Model.DRAFT].replay, self.graphs[Model.TARGET].replay)

    def outputs(self) -> RoundOutputs:
        d, t = self.bufs.draft, self.bufs.target
        return RoundOutputs(d.tokens_out.clone(), d.logits.clone(), t.logits.view(t.batch, t.tokens, -1).clone(),
                            t.tokens_out.view(t.batch, t.tokens).clone(), KVCache(d.cache.k.clone(), d.cache.v.clone()),
                            KVCache(t.cache.k.clone(), t.cache.v.clone()))
