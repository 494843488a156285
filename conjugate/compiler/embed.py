"""Binds the token embedding (kernels/embed.py), the greedy argmax (kernels/argmax.py) and its sampling
counterpart (kernels/sampling.py)."""
from __future__ import annotations

import torch

from conjugate.compiler.sampling import SamplingRows
from conjugate.compiler.tile import PartCall, TileSignature, cdiv, next_pow2
from conjugate.kernels.argmax import argmax_tile
from conjugate.kernels.embed import embed_tile
from conjugate.kernels.sampling import sample_tile


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


SAMPLE_SIGNATURE = TileSignature.of(sample_tile)


def sample_call(logits: torch.Tensor, out: torch.Tensor, lengths: torch.Tensor, sampling: SamplingRows, *, rows: int,
                vocab: int, step: int = 0, stride_out: int = 1, block: int = 1024, label: str = "") -> PartCall:
    """out[r * stride_out] = row r's next token for r < rows: argmax(logits[r, :vocab]) where the row's
    temperature is 0, else a draw from its warped logits keyed by (seed, lengths[r] + step + 1)."""
    if logits.stride(1) != 1:
        raise ValueError("sample: logits rows must be contiguous")
    if out.dtype != torch.int64:
        raise ValueError(f"sample: out must be int64, got {out.dtype}")
    if tuple(lengths.shape) != (rows,) or lengths.dtype != torch.int64 or lengths.stride(0) != 1:
        raise ValueError(f"sample: lengths must be a contiguous int64 [{rows}], got {lengths.dtype} "
                         f"{tuple(lengths.shape)}")
    if not 0 < vocab <= logits.shape[1]:
        raise ValueError(f"sample: vocab {vocab} outside 1..{logits.shape[1]}")
    sampling.check(rows, logits.device)
    block = min(block, next_pow2(vocab))
    args = dict(logits_ptr=logits, vocab=vocab, stride_logits=logits.stride(0), out_ptr=out, stride_out=stride_out,
                lengths_ptr=lengths, step=step, temperature_ptr=sampling.temperature, top_p_ptr=sampling.top_p,
                top_k_ptr=sampling.top_k, seed_ptr=sampling.seed)
    return PartCall(SAMPLE_SIGNATURE, args, dict(BLOCK=block), rows, label)
