"""Lowering: one part of a launch (an op or a fused chain of one model) -> a bound tile call.

Vertical fusions lower as follows: `attn_norm+qkv`, `mlp_norm+gate_up` and `final_norm+lm_head`
become a GEMM with the RMSNorm prologue and the norm weight folded into the GEMM weight, its sum of
squares read from the row statistics the residual GEMM before it writes (o_proj for mlp_norm, the
previous layer's down for attn_norm, the last down for final_norm; layer 0's qkv, after the
embedding, passes over x itself; with split-K partials summed atomically, each residual tile's
last split reads its finished rows back for them);
`lm_head+argmax` becomes the GEMM's argmax epilogue, which writes tokens and no logits (a round that
samples has the fusion off, and its draft's argmax lowers to the sample part: embed.sample_call);
`qkv+rope_kv` becomes the GEMM's rope_kv epilogue (one head per tile: the plan's BLOCK_N for qkv
gives way to head_dim / 2), which writes q and the layer's caches and no qkv activations;
`gate_up+down` becomes the fused MLP (mlp.py): gate_up's tiles, BLOCK_N the ffn columns a program
owns, BLOCK_K the hidden columns a step in both of its loops (its SPLIT_K and down's tile go
unused); it adds into the residual stream atomically and, where the next norm is fused, writes the
row statistics in down's place.
With `mlp_norm+gate_up` too, the chain mlp_norm+gate_up+down reads a copy of the residual rows that
the o_proj before writes beside its row statistics (gemm.py COPY_OUT), its norm a prologue.
"""
from __future__ import annotations

from dataclasses import replace

import networkx as nx

from conjugate.compiler.attention import attn_call
from conjugate.compiler.buffers import ModelBuffers, RoundBuffers
from conjugate.compiler.embed import argmax_call, embed_call, sample_call
from conjugate.compiler.gemm import RopeKV, gemm_call
from conjugate.compiler.mlp import mlp_call
from conjugate.compiler.norm import rmsnorm_call
from conjugate.compiler.rope import rope_kv_call
from conjugate.compiler.tile import PartCall
from conjugate.graph import Op
from conjugate.plan.expand import Part

_NORM_OF = {"qkv": "attn_norm", "gate_up": "mlp_norm", "lm_head": "final_norm"}
_NORM_KINDS = ("attn_norm", "mlp_norm", "final_norm")


def _gemm_tiles(tiles: dict[str, int]) -> dict[str, int]:
    return dict(block_m=tiles["BLOCK_M"], block_n=tiles["BLOCK_N"], block_k=tiles["BLOCK_K"], split_k=tiles["SPLIT_K"])


def _norm_weight(b: ModelBuffers, op: Op):
    w = b.prepared.weights
    return w.final_norm if op.kind == "final_norm" else getattr(w.layers[op.layer], op.kind)


def _step_views(b: ModelBuffers, step: int):
    """(tokens in, their stride, tokens out, their stride, logits rows) of one pass."""
    if not b.is_draft:
        return b.tokens_in, 1, b.tokens_out, 1, b.logits
    tokens_in, stride_in = (b.tokens_in, 1) if step == 0 else (b.tokens_out[:, step - 1], b.steps)
    return tokens_in, stride_in, b.tokens_out[:, step], b.steps, b.logits[:, step]


def _stats(op: Op, norm: bool, norm_stats: tuple[str, ...], layers: int) -> dict:
    """Whether the GEMM writes x's row statistics (a residual GEMM whose x a fused norm reads next) or
    reads them (a fused norm whose x a residual GEMM wrote: not layer 0's, which the embedding wrote)."""
    if op.kind == "o_proj":
        return dict(stats_out="mlp_norm" in norm_stats)
    if op.kind == "down":
        return dict(stats_out=("attn_norm" if op.layer < layers - 1 else "final_norm") in norm_stats)
    return dict(stats_in=norm and _NORM_OF[op.kind] in norm_stats and not (op.kind == "qkv" and op.layer == 0))


def residual_writes(op: Op, norm_stats: tuple[str, ...], mlp_fused: bool, layers: int) -> tuple[bool, bool]:
    """What a residual GEMM (o_proj, down) writes besides the stream: (its rows' statistics, for the
    fused norm that reads x next; a copy of its rows, for a fused MLP with its norm)."""
    stats_out = _stats(op, False, norm_stats, layers)["stats_out"]
    return stats_out, op.kind == "o_proj" and mlp_fused and "mlp_norm" in norm_stats


def _lower_gemm(b: ModelBuffers, op: Op, fused: tuple[str, ...], tiles: dict, label: str,
                atomic_split: bool = False, norm_stats: tuple[str, ...] = (), mlp_fused: bool = False) -> PartCall:
    spec, act, rows = b.spec, b.act, b.rows
    norm = _NORM_OF.get(op.kind) in fused
    eps = spec.rms_norm_eps if norm else None
    x = act["x"] if norm else act["h"]
    common = dict(rows=rows, norm_eps=eps, label=label, stats=act["stats"],
                  **_stats(op, norm, norm_stats, spec.num_layers), **_gemm_tiles(tiles))
    if op.kind == "qkv":
        w, bias = b.prepared.qkv(op.layer, norm)
        if "rope_kv" in fused:
            return gemm_call(x, w, act["q"], bias=bias, epilogue="rope_kv", rope=_rope_target(b, op), **common)
        return gemm_call(x, w, act["qkv"], bias=bias, **common)
    if op.kind == "gate_up" and "down" in fused:  # x: the o_proj's copy of the rows when the norm is fused
        gate, up = b.prepared.gate_up(op.layer, norm)
        stats_out = _stats(replace(op, kind="down"), False, norm_stats, spec.num_layers)["stats_out"]
        return mlp_call(act["h"], gate, up, b.prepared.weights.layers[op.layer].w_down, act["x"], rows=rows,
                        act_dtype=act["mlp"].dtype, norm_eps=eps, stats=act["stats"], stats_out=stats_out,
                        label=label, block_m=tiles["BLOCK_M"], block_f=tiles["BLOCK_N"], block_k=tiles["BLOCK_K"])
    if op.kind == "gate_up":
        gate, up = b.prepared.gate_up(op.layer, norm)
        return gemm_call(x, gate, act["mlp"], epilogue="silu_mul", w2=up, **common)
    if op.kind in ("o_proj", "down"):
        lw = b.prepared.weights.layers[op.layer]
        source, w = (act["attn_out"], lw.wo) if op.kind == "o_proj" else (act["mlp"], lw.w_down)
        copy = act["h"] if residual_writes(op, norm_stats, mlp_fused, spec.num_layers)[1] else None
        return gemm_call(source, w, act["x"], epilogue="residual", atomic_split=atomic_split, copy=copy, **common)
    _, _, tokens_out, stride_out, logits = _step_views(b, op.step)
    w = b.prepared.lm_head(norm)
    if "argmax" in fused:
        return gemm_call(x, w, logits, epilogue="argmax", tokens=tokens_out, stride_tok=stride_out,
                         write_out=False, **common)
    return gemm_call(x, w, logits, **common)


def _rope_target(b: ModelBuffers, op: Op) -> RopeKV:
    """Where layer op.layer's rope_kv puts q, k and v (the rope_kv op's own buffers)."""
    spec, lw = b.spec, b.prepared.weights.layers[op.layer]
    return RopeKV(b.act["q"], b.cache.k[op.layer], b.cache.v[op.layer], b.cos, b.sin, b.lengths, offset=op.step,
                  tokens=b.tokens, num_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim,
                  q_norm=lw.q_norm, k_norm=lw.k_norm, eps=spec.rms_norm_eps)


def lower_part(part: Part, graph: nx.DiGraph, bufs: RoundBuffers) -> PartCall:
    """The tile call of one part; ValueError says what about the part cannot be lowered."""
    b = bufs.model(part.model)
    ops = [graph.nodes[o]["op"] for o in part.ops]
    main = next(o for o in ops if o.kind == part.kind)
    label = "+".join(part.ops)
    spec, act, rows, tiles = b.spec, b.act, b.rows, part.tiles
    if main.kind in ("qkv", "o_proj", "gate_up", "down", "lm_head"):
        return _lower_gemm(b, main, part.fused, tiles, label, part.atomic_split, part.norm_stats, part.mlp_fused)
    if len(ops) > 1:
        raise ValueError(f"no fused lowering for the chain {'+'.join(part.fused)}")
    if main.kind == "embed":
        tokens_in, stride_in, *_ = _step_views(b, main.step)
        return embed_call(tokens_in, b.prepared.weights.embed, act["x"], rows=rows, stride_tok=stride_in,
                          block=tiles["BLOCK"], label=label)
    if main.kind in _NORM_KINDS:
        return rmsnorm_call(act["x"], _norm_weight(b, main), act["h"], rows=rows, eps=spec.rms_norm_eps,
                            block=tiles["BLOCK"], label=label)
    if main.kind == "rope_kv":
        lw = b.prepared.weights.layers[main.layer]
        return rope_kv_call(act["qkv"], act["q"], b.cache.k[main.layer], b.cache.v[main.layer], b.cos, b.sin,
                            b.lengths, rows=rows, tokens=b.tokens, offset=main.step, num_heads=spec.num_heads,
                            num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim, q_norm=lw.q_norm,
                            k_norm=lw.k_norm, eps=spec.rms_norm_eps, block=tiles["BLOCK"], label=label)
    if main.kind == "attn":
        return attn_call(act["q"], b.cache.k[main.layer], b.cache.v[main.layer], act["attn_out"], b.lengths,
                         batch=b.batch, tokens=b.tokens, offset=main.step, num_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads,
                         head_dim=spec.head_dim, block_n=tiles["BLOCK_N"], split_kv=tiles["SPLIT_KV"], label=label)
    if main.kind == "argmax":
        _, _, tokens_out, stride_out, logits = _step_views(b, main.step)
        if b.sampling is not None:
            return sample_call(logits, tokens_out, b.lengths, b.sampling, rows=rows, vocab=spec.vocab_size,
                               step=main.step, stride_out=stride_out, block=tiles["BLOCK"], label=label)
        return argmax_call(logits, tokens_out, rows=rows, vocab=spec.vocab_size, stride_out=stride_out,
                           block=tiles["BLOCK"], label=label)
    raise ValueError(f"no lowering for op kind {main.kind!r}")
