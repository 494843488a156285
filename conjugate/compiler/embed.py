"""Binds the token embedding (kernels/embed.py) and the greedy argmax (kernels/argmax.py)."""
from __future__ import annotations

import torch

from conjugate.compiler.tile import PartCall, TileSignature, cdiv, next_pow2
from conjugate.kernels.argmax import argmax_tile
from conjugate.kernels.embed import embed_tile


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


ARGMAX_SIGNATURE = TileSignature.of(argmax_tile)


def argmax_call(logits: torch.Tensor, out: torch.Tensor, *, rows: int, vocab: int, stride_out: int = 1,
                block: int = 1024, label: str = "") -> PartCall:
    """out[r * stride_out] = argmax(logits[r, :vocab]) for r < rows; out int64."""
    if not (logits.stride(1) == 1):
        raise ValueError("argmax: logits rows must be contiguous")
    block = min(block, next_pow2(vocab))
    args = dict(logits_ptr=logits, out_ptr=out, vocab=vocab, stride_logits=logits.stride(0), stride_out=stride_out)
    return PartCall(ARGMAX_SIGNATURE, args, dict(BLOCK=block), rows, label)
