"""Element-wise family: token embedding lookup and greedy argmax over the vocabulary.

Layout. Activations are fp32, row-major, one row per token r = b*T + t, with an explicit row
stride. Token ids are int64 (or int32) with a stride between consecutive rows' tokens, so a
kernel can read or write one column of a [B, k] token buffer in place (stride k).

- embed:  x[r, :] = float32(table[tokens[r], :]); table [V, H] bf16/fp16/fp32.
          Grid M * cdiv(H, BLOCK): program pid copies chunk pid % cdiv(H, BLOCK) of row pid // that.
- argmax: out[r] = argmax_v logits[r, v] (first index on ties, as torch.argmax); logits fp32
          [M, V]. One program per row, looping over V in BLOCK chunks.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from conjugate.compiler.tile import PartCall, TileSignature, cdiv, next_pow2


# ----------------------------------------------------------------------------------------------
# embed
# ----------------------------------------------------------------------------------------------
@triton.jit
def embed_tile(pid, tokens_ptr, table_ptr, x_ptr, hidden, stride_tok, stride_table, stride_x,
               BLOCK: tl.constexpr):
    chunks = tl.cdiv(hidden, BLOCK)
    row = (pid // chunks).to(tl.int64)
    cols = (pid % chunks) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    mask = cols < hidden
    token = tl.load(tokens_ptr + row * stride_tok).to(tl.int64)  # scalar
    vals = tl.load(table_ptr + token * stride_table + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(x_ptr + row * stride_x + cols, vals, mask=mask)


EMBED_SIGNATURE = TileSignature.of(embed_tile)


def embed_call(tokens: torch.Tensor, table: torch.Tensor, x: torch.Tensor, *, rows: int, stride_tok: int = 1,
               block: int = 1024, label: str = "") -> PartCall:
    """x[r, :] = table[tokens[r * stride_tok], :] for r < rows; x fp32 [>= rows, H] with unit column stride."""
    hidden = table.shape[1]
    if not (table.stride(1) == 1 and x.stride(1) == 1):
        raise ValueError("embed: rows must be contiguous")
    block = min(block, next_pow2(hidden))
    args = dict(tokens_ptr=tokens, table_ptr=table, x_ptr=x, hidden=hidden, stride_tok=stride_tok,
                stride_table=table.stride(0), stride_x=x.stride(0))
    return PartCall(EMBED_SIGNATURE, args, dict(BLOCK=block), rows * cdiv(hidden, block), label)


# ----------------------------------------------------------------------------------------------
# argmax
# ----------------------------------------------------------------------------------------------
@triton.jit
def argmax_tile(pid, logits_ptr, out_ptr, vocab, stride_logits, stride_out, BLOCK: tl.constexpr):
    row = pid.to(tl.int64)
    base = logits_ptr + row * stride_logits
    cols = tl.arange(0, BLOCK)  # [BLOCK]
    vals = tl.load(base + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
    best_val = tl.max(vals, axis=0)  # scalar
    best_idx = tl.argmax(vals, axis=0, tie_break_left=True).to(tl.int64)
    for start in range(BLOCK, vocab, BLOCK):
        offs = start + cols
        vals = tl.load(base + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32)
        chunk_val = tl.max(vals, axis=0)
        chunk_idx = start + tl.argmax(vals, axis=0, tie_break_left=True).to(tl.int64)
        better = chunk_val > best_val  # strictly: an earlier chunk keeps a tie
        best_idx = tl.where(better, chunk_idx, best_idx)
        best_val = tl.where(better, chunk_val, best_val)
    tl.store(out_ptr + row * stride_out, best_idx.to(out_ptr.dtype.element_ty))


ARGMAX_SIGNATURE = TileSignature.of(argmax_tile)


def argmax_call(logits: torch.Tensor, out: torch.Tensor, *, rows: int, vocab: int, stride_out: int = 1,
                block: int = 1024, label: str = "") -> PartCall:
    """out[r * stride_out] = argmax(logits[r, :vocab]) for r < rows; out int64."""
    if not (logits.stride(1) == 1):
        raise ValueError("argmax: logits rows must be contiguous")
    block = min(block, next_pow2(vocab))
    args = dict(logits_ptr=logits, out_ptr=out, vocab=vocab, stride_logits=logits.stride(0), stride_out=stride_out)
    return PartCall(ARGMAX_SIGNATURE, args, dict(BLOCK=block), rows, label)
