"""Binds one RMSNorm (kernels/norm.py) to its rows."""
from __future__ import annotations

import torch

from conjugate.compiler.tile import PartCall, TileSignature, next_pow2
from conjugate.kernels.norm import rmsnorm_tile


SIGNATURE = TileSignature.of(rmsnorm_tile)


def rmsnorm_call(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, *, rows: int, eps: float,
                 block: int = 1024, label: str = "") -> PartCall:
    """out[r, :] = rms_norm(x[r, :], weight, eps) for r < rows."""
    hidden = weight.shape[0]
    if not (x.stride(1) == 1 and out.stride(1) == 1):
        raise ValueError("rmsnorm: rows must be contiguous")
    block = min(block, next_pow2(hidden))
    args = dict(x_ptr=x, w_ptr=weight, out_ptr=out, hidden=hidden, stride_x=x.stride(0),
                stride_out=out.stride(0), eps=float(eps))
    return PartCall(SIGNATURE, args, dict(BLOCK=block), rows, label)
