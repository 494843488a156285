"""The packed operand layout: a target GEMM and a draft GEMM sharing one launch read their weights
from one block-interleaved buffer, through one homogeneous tile loop.

    buffer = [T0 D0 T1 D1 ... T(R-1) D(R-1) | the larger model's remaining blocks]

Block j of a model is its weight rows j*BLOCK_N .. (j+1)*BLOCK_N (zero-padded to BLOCK_N rows),
row stride its own K: different K need no padding, the tile loop takes each model's K and its
block addressing (GemmBlocks) as per-program arguments. Both parts run the target's tile shape.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from conjugate.compiler.gemm import SIGNATURES
from conjugate.compiler.tile import PartCall, cdiv

# one tile loop runs both: the target's constexprs are the draft's too (its row statistics written or read
# alike), but for K, which each model's rows carry as a runtime argument
_MUST_MATCH = ("NORM", "HAS_BIAS", "WRITE_OUT", "DOT_DTYPE", "ATOMIC_SPLIT", "STATS_OUT", "STATS_IN", "COPY_OUT")


@dataclass(frozen=True)
class GemmBlocks:
    """Where one model's weight blocks sit in a packed buffer (element offsets)."""

    offset: int  # of the model's block 0
    stride: int  # between its blocks j and j + 1 while they alternate (j < pairs)
    pairs: int
    tail_start: int  # of its block `pairs`, relative to `offset`


def pack_pair(w_t: torch.Tensor, w_d: torch.Tensor, block_n: int) -> tuple[torch.Tensor, GemmBlocks, GemmBlocks]:
    """The block-interleaved buffer of two [N, K] weights, and each one's block addressing."""
    (n_t, k_t), (n_d, k_d) = w_t.shape, w_d.shape
    nb_t, nb_d = cdiv(n_t, block_n), cdiv(n_d, block_n)
    size_t, size_d = block_n * k_t, block_n * k_d
    pairs, stride = min(nb_t, nb_d), size_t + size_d
    buffer = torch.zeros(nb_t * size_t + nb_d * size_d, dtype=w_t.dtype, device=w_t.device)
    tail = pairs * stride

    def place(w: torch.Tensor, blocks: GemmBlocks, size: int) -> None:
        for j in range(cdiv(w.shape[0], block_n)):
            start = blocks.offset + (j * blocks.stride if j < pairs else blocks.tail_start + (j - pairs) * size)
            rows = w[j * block_n:(j + 1) * block_n]
            buffer[start:start + rows.numel()] = rows.reshape(-1)

    blocks_t = GemmBlocks(0, stride, pairs, tail)
    blocks_d = GemmBlocks(size_t, stride, pairs, tail - size_t + (nb_t - pairs) * size_t)
    place(w_t, blocks_t, size_t)
    place(w_d, blocks_d, size_d)
    return buffer, blocks_t, blocks_d


def _bind(call: PartCall, name: str, buffer: torch.Tensor, blocks: GemmBlocks) -> None:
    call.args[name] = buffer[blocks.offset:]
    call.args.update(stride_w=call.args["K"], blk_stride=blocks.stride, blk_pairs=blocks.pairs,
                     tail_start=blocks.tail_start)
    call.scratch.append(buffer)


Packer = Callable[[torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, GemmBlocks, GemmBlocks]]


def pack_calls(t_call: PartCall, d_call: PartCall, packer: Packer) -> list[PartCall]:
    """Re-bind a target GEMM and a draft GEMM, both lowered at the target's tile shape, to one packed
    buffer of their weights (`packer`: pack_pair, or a cache of its buffers); ValueError when the two
    GEMMs cannot share a tile loop."""
    if SIGNATURES["rope_kv"] in (t_call.sig, d_call.sig):
        raise ValueError(f"the packed operand layout cannot hold a qkv+rope_kv GEMM ({t_call.label} beside "
                         f"{d_call.label}): its tiles are heads read as two halves")
    differ = ["epilogue"] if t_call.sig != d_call.sig else []
    differ += [c for c in _MUST_MATCH if t_call.constexprs.get(c) != d_call.constexprs.get(c)]
    if differ:
        raise ValueError(f"the packed operand layout needs GEMMs with the same epilogue, prologue, split-K sum, "
                         f"row statistics and copy of the rows; "
                         f"{t_call.label} and {d_call.label} differ in {', '.join(differ)}")
    names = ("w_ptr", "w2_ptr") if t_call.sig == SIGNATURES["silu_mul"] else ("w_ptr",)
    for name in names:
        buffer, blocks_t, blocks_d = packer(t_call.args[name], d_call.args[name], t_call.constexprs["BLOCK_N"])
        _bind(t_call, name, buffer, blocks_t)
        _bind(d_call, name, buffer, blocks_d)
    return [t_call, d_call]
