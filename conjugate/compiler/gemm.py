"""Binds one GEMM (kernels/gemm.py) to its weights and rows: the tile function of its epilogue,
its arguments, and the scratch it needs (split-K workspace and counters, argmax partials)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from conjugate.compiler.tile import INTERPRETING, PartCall, TileSignature, cdiv, dot_dtype
from conjugate.kernels.gemm import (gemm_argmax_tile, gemm_residual_tile, gemm_rope_kv_tile, gemm_silu_mul_tile,
                                    gemm_tile)
from conjugate.kernels.tile import STATS_CHUNK

# epilogue name (gemm_call's) -> its tile function's signature
SIGNATURES = {"store": TileSignature.of(gemm_tile), "residual": TileSignature.of(gemm_residual_tile),
              "silu_mul": TileSignature.of(gemm_silu_mul_tile), "argmax": TileSignature.of(gemm_argmax_tile),
              "rope_kv": TileSignature.of(gemm_rope_kv_tile)}
EPILOGUES = tuple(SIGNATURES)
GEMM_TILES = frozenset(sig.fn for sig in SIGNATURES.values())
TWO_WEIGHT_TILES = frozenset({SIGNATURES["silu_mul"].fn, SIGNATURES["rope_kv"].fn})  # w and w2 each step


@dataclass(frozen=True)
class RopeKV:
    """Where the rope_kv epilogue puts a qkv projection's heads (rope.py's op, the same buffers)."""
    q_out: torch.Tensor  # fp32 [rows, num_heads * head_dim]
    k_cache: torch.Tensor  # one layer's [B, num_kv_heads, S_max, head_dim]
    v_cache: torch.Tensor
    cos: torch.Tensor  # fp32 [S_max, head_dim]
    sin: torch.Tensor
    lengths: torch.Tensor  # int64 [B]
    offset: int  # the draft step
    tokens: int  # rows per sequence
    num_heads: int
    num_kv_heads: int
    head_dim: int
    q_norm: torch.Tensor | None = None  # Qwen3's QK-norm weights
    k_norm: torch.Tensor | None = None
    eps: float = 1e-6

    def bind(self) -> tuple[dict, dict]:
        """The rope_kv tile's own arguments and constexprs."""
        qk_norm = self.q_norm is not None
        return (dict(q_out_ptr=self.q_out, k_cache_ptr=self.k_cache, v_cache_ptr=self.v_cache, cos_ptr=self.cos,
                     sin_ptr=self.sin, q_norm_ptr=self.q_norm if qk_norm else self.cos,
                     k_norm_ptr=self.k_norm if qk_norm else self.cos, lengths_ptr=self.lengths,
                     rope_offset=self.offset, rope_tokens=self.tokens, s_max=self.k_cache.shape[2],
                     stride_q=self.q_out.stride(0), rope_eps=float(self.eps)),
                dict(NUM_HEADS=self.num_heads, NUM_KV_HEADS=self.num_kv_heads, HEAD_DIM=self.head_dim,
                     QK_NORM=qk_norm))


def split_span(k: int, block_k: int, split_k: int) -> int:
    """The columns of K one split covers (the last split may have fewer): the tile's k_span."""
    return cdiv(cdiv(k, block_k), split_k) * block_k


def _check_stats(stats, stats_out: bool, stats_in: bool, rows: int, n: int, k: int, block_n: int, epilogue: str,
                 norm_eps) -> None:
    """ValueError for row statistics a GEMM cannot write or read."""
    if not (stats_out or stats_in):
        return
    width = n if stats_out else k
    if stats is None or stats.dtype != torch.float32 or stats.dim() != 2 or stats.shape[0] < rows \
            or stats.shape[1] < cdiv(width, STATS_CHUNK.value) or stats.stride(1) != 1:
        raise ValueError(f"row statistics need an fp32 [{rows}, {cdiv(width, STATS_CHUNK.value)}] buffer")
    if stats_out and (epilogue != "residual" or block_n % STATS_CHUNK.value):
        raise ValueError(f"row statistics are written by a residual epilogue, BLOCK_N a multiple of "
                         f"{STATS_CHUNK.value}")
    if stats_in and norm_eps is None:
        raise ValueError("row statistics are read by a norm prologue")


def _check_epilogue(epilogue: str, rope, w2, bias, norm_eps, tokens, atomic_split: bool, copy, rows: int,
                    n: int) -> None:
    """ValueError for an epilogue and buffers that do not go together."""
    if epilogue not in SIGNATURES:
        raise ValueError(f"unknown GEMM epilogue {epilogue!r}")
    if (epilogue == "rope_kv") != (rope is not None):
        raise ValueError("the rope_kv epilogue and its RopeKV buffers go together")
    if atomic_split and (epilogue != "residual" or bias is not None or norm_eps is not None):
        raise ValueError("an atomic split-K sum is for the residual epilogue alone (no bias, no norm prologue)")
    if bias is not None and epilogue not in ("store", "rope_kv"):
        raise ValueError(f"a bias is added by the store and rope_kv epilogues, not {epilogue}")
    if epilogue == "residual" and norm_eps is not None:
        raise ValueError("the residual epilogue adds into the stream its rows come from: no norm prologue")
    if epilogue == "silu_mul" and w2 is None:
        raise ValueError("the silu_mul epilogue needs w2 (the up projection)")
    if epilogue == "argmax" and tokens is None:
        raise ValueError("the argmax epilogue needs a tokens buffer")
    if copy is not None and (epilogue != "residual" or copy.dim() != 2 or copy.shape[0] < rows or copy.shape[1] < n
                             or copy.stride(1) != 1):
        raise ValueError(f"a copy of the finished rows is the residual epilogue's, into a [{rows}, {n}] buffer")


def _rope_shape(x: torch.Tensor, w: torch.Tensor, rope: RopeKV, rows: int) -> tuple[torch.Tensor, int, int]:
    """(w2, N, BLOCK_N) of a qkv GEMM with the rope_kv epilogue: one head per tile, its halves as two
    accumulators (w2: the weight from the first head's second half on)."""
    from conjugate.compiler.rope import check_rope_buffers

    check_rope_buffers(x, rope.q_out, rope.k_cache, rope.v_cache, rope.cos, rope.sin, rope.lengths, rows=rows,
                       tokens=rope.tokens, offset=rope.offset, num_kv_heads=rope.num_kv_heads,
                       head_dim=rope.head_dim, q_norm=rope.q_norm, k_norm=rope.k_norm)
    heads, half = rope.num_heads + 2 * rope.num_kv_heads, rope.head_dim // 2
    if w.shape[0] != heads * rope.head_dim:
        raise ValueError(f"rope_kv: the qkv projection has {w.shape[0]} rows, not {heads} heads of {rope.head_dim}")
    if half < 16 and not INTERPRETING:  # tl.dot's smallest tile side on the GPU
        raise ValueError(f"qkv+rope_kv: head_dim {rope.head_dim} gives half-head tiles of {half} columns; "
                         f"the GPU's dot needs at least 16")
    return w[half:], heads * half, half


def gemm_call(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, *, rows: int, epilogue: str = "store",
              w2: torch.Tensor | None = None, bias: torch.Tensor | None = None, norm_eps: float | None = None,
              tokens: torch.Tensor | None = None, stride_tok: int = 1, write_out: bool = True,
              block_m: int = 16, block_n: int = 64, block_k: int = 128, split_k: int = 1, label: str = "",
              rope: RopeKV | None = None, atomic_split: bool = False, stats: torch.Tensor | None = None,
              stats_out: bool = False, stats_in: bool = False, copy: torch.Tensor | None = None) -> PartCall:
    """Bind one GEMM. x: [rows, K] fp32 or the weights' type; w, w2: [N, K]; out: [rows, N] (row strides free).
    With `rope` (epilogue rope_kv), w is the qkv projection and each tile is one head: block_n is
    taken as head_dim / 2 and `out` is not written. `stats` (fp32 [rows, >= width / STATS_CHUNK]): with
    `stats_out` the residual epilogue writes each row's sums of squares per STATS_CHUNK columns of
    `out` there; with `stats_in` the norm prologue reads them (written for x by the GEMM before)
    instead of a pass over x. `copy` ([rows, N], the residual epilogue's): the finished rows stored there
    too, in its type."""
    n, k = w.shape
    _check_epilogue(epilogue, rope, w2, bias, norm_eps, tokens, atomic_split, copy, rows, n)
    if rope is not None:
        w2, n, block_n = _rope_shape(x, w, rope, rows)
    atomic_split = atomic_split and split_k > 1  # one split: the plain residual add
    _check_stats(stats, stats_out, stats_in, rows, n, k, block_n, epilogue, norm_eps)
    num_m, num_n = cdiv(rows, block_m), cdiv(n, block_n)
    ws_size = split_k * (2 * rows * n + num_n * rows) if split_k > 1 and not atomic_split else 1  # acc, acc2, sums
    if max(w.shape[0] * k, ws_size, rows * out.stride(0)) >= 2**31:  # w.shape[0]: all rows (rope: n counts halves)
        raise ValueError(f"GEMM {n}x{k} over {rows} rows (split-K {split_k}): element offsets past 2^31 "
                         f"are not supported")
    dev = w.device
    # counter[0]: programs done (argmax); counter[1 + tile]: splits done per output tile
    counter = torch.zeros(1 + num_m * num_n, dtype=torch.int32, device=dev)
    part_val = torch.empty(rows * num_n if epilogue == "argmax" else 1, dtype=torch.float32, device=dev)
    part_idx = torch.empty(rows * num_n if epilogue == "argmax" else 1, dtype=torch.int32, device=dev)
    ws = torch.empty(ws_size, dtype=torch.float32, device=dev)
    args = dict(x_ptr=x, w_ptr=w, w2_ptr=w2, bias_ptr=bias if bias is not None else w, out_ptr=out,
                part_val_ptr=part_val, part_idx_ptr=part_idx, counter_ptr=counter, tok_ptr=tokens, ws_ptr=ws,
                stats_ptr=stats if stats is not None else counter, copy_ptr=copy if copy is not None else counter,
                M=rows, N=n, K=k, stride_x=x.stride(0), stride_w=w.stride(0), stride_out=out.stride(0),
                stride_tok=stride_tok, stride_stats=stats.stride(0) if stats is not None else 0,
                stride_copy=copy.stride(0) if copy is not None else 0, eps=float(norm_eps or 0.0),
                blk_stride=0, blk_pairs=0, tail_start=0)
    constexprs = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k, NORM=norm_eps is not None,
                      HAS_BIAS=bias is not None, WRITE_OUT=write_out, DOT_DTYPE=dot_dtype(w.dtype),
                      ATOMIC_SPLIT=atomic_split, STATS_OUT=stats_out, STATS_IN=stats_in, COPY_OUT=copy is not None)
    if rope is not None:
        rope_args, rope_constexprs = rope.bind()
        args, constexprs = args | rope_args, constexprs | rope_constexprs
    sig = SIGNATURES[epilogue]
    return PartCall(sig, {a: args[a] for a in sig.args}, {c: constexprs[c] for c in sig.constexprs},
                    num_m * num_n * split_k, label, [counter, part_val, part_idx, ws])
