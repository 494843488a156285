"""Binds one fused MLP (kernels/mlp.py, plan fusion `gate_up+down`) to its weights and rows."""
from __future__ import annotations

import torch

from conjugate.compiler.tile import PartCall, TileSignature, cdiv, dot_dtype, triton_dtype
from conjugate.kernels.mlp import mlp_tile
from conjugate.kernels.tile import STATS_CHUNK


SIGNATURE = TileSignature.of(mlp_tile)


def mlp_call(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, out: torch.Tensor, *,
             rows: int, act_dtype: torch.dtype, norm_eps: float | None = None, stats: torch.Tensor | None = None,
             stats_out: bool = False, block_m: int = 16, block_f: int = 64, block_k: int = 128,
             label: str = "") -> PartCall:
    """Bind one fused MLP. x: [rows, H], the mlp_norm's output, or with `norm_eps` (the norm fused: its
    weight folded into gate and up) the copy of the residual rows; gate, up: [F, H]; down: [H, F];
    out: fp32 [rows, H], the residual stream, added into; never x (programs still reading x would see
    other programs' sums). `act_dtype`: the type the separate gate_up launch stores its activations in.
    `stats` (fp32 [rows, >= H / STATS_CHUNK]): with `norm_eps` the rows' statistics are read from it,
    with `stats_out` the finished rows' are written into it."""
    f, h = gate.shape
    if x.dim() != 2 or x.shape[0] < rows or x.shape[1] != h or x.stride(1) != 1:
        raise ValueError(f"gate_up+down: x {tuple(x.shape)} is not {rows} contiguous rows of {h}")
    if up.shape != gate.shape or tuple(down.shape) != (h, f):
        raise ValueError(f"gate_up+down: gate {tuple(gate.shape)}, up {tuple(up.shape)} and down "
                         f"{tuple(down.shape)} are not an MLP's [F, H], [F, H], [H, F]")
    if up.stride(0) != gate.stride(0) or gate.stride(1) != 1 or up.stride(1) != 1 or down.stride(1) != 1:
        raise ValueError("gate_up+down: the gate and up weights need one row stride, and every weight's rows "
                         "contiguous")
    if x is out or (x.device.type != "meta" and x.data_ptr() == out.data_ptr()):  # meta: offline, no addresses
        raise ValueError("gate_up+down reads x while adding into the residual stream: x must be another buffer "
                         "(the mlp_norm launch's output, or a copy of the rows)")
    if out.dtype != torch.float32:
        raise ValueError(f"gate_up+down adds into an fp32 residual stream, got {out.dtype}")
    if stats_out and block_k % STATS_CHUNK.value:
        raise ValueError(f"row statistics are written in blocks of {STATS_CHUNK.value} columns: BLOCK_K "
                         f"{block_k} is not a multiple")
    width = cdiv(h, STATS_CHUNK.value)
    bad_stats = stats is None or stats.dtype != torch.float32 or stats.dim() != 2 or stats.shape[0] < rows \
        or stats.shape[1] < width or stats.stride(1) != 1
    if (stats_out or norm_eps is not None) and bad_stats:
        raise ValueError(f"row statistics need an fp32 [{rows}, {width}] buffer")
    if max(f * h, rows * max(x.stride(0), out.stride(0))) >= 2**31:
        raise ValueError(f"MLP {f}x{h} over {rows} rows: element offsets past 2^31 are not supported")
    num_m = cdiv(rows, block_m)
    counter = torch.zeros(num_m, dtype=torch.int32, device=gate.device)  # programs done per M block
    args = dict(x_ptr=x, gate_ptr=gate, up_ptr=up, down_ptr=down, out_ptr=out,
                stats_ptr=stats if stats is not None else counter, counter_ptr=counter, M=rows, F=f, H=h,
                stride_x=x.stride(0), stride_g=gate.stride(0), stride_d=down.stride(0), stride_out=out.stride(0),
                stride_stats=stats.stride(0) if stats is not None else 0, eps=float(norm_eps or 0.0))
    constexprs = dict(BLOCK_M=block_m, BLOCK_F=block_f, BLOCK_K=block_k, NORM=norm_eps is not None,
                      STATS_OUT=stats_out, ACT_DTYPE=triton_dtype(act_dtype), DOT_DTYPE=dot_dtype(gate.dtype))
    return PartCall(SIGNATURE, args, constexprs, num_m * cdiv(f, block_f), label, [counter])
