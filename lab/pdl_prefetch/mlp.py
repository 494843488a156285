"""The whole MLP of a decode step in one launch (plan fusion `gate_up+down`):

    x[M, H] += (silu(h @ gate^T) * (h @ up^T)) @ down^T      h = RMSNorm(x)

Program `pid` owns one (M block, ffn block) tile, M blocks varying fastest: it streams its BLOCK_F
rows of the gate and up weights (HF layout [F, H]) over the hidden size, applies SiLU-and-multiply in
registers, rounds the activations to the type the separate launches would have stored them in, then
streams the matching BLOCK_F columns of the down weight ([H, F]) in BLOCK_K-row steps and adds its
partial products into the residual stream with float atomics. Nothing of the [M, F] activations
leaves the program, and the two launches of the separate gate_up and down become one.

The sum over ffn blocks is atomic, so its rounding order varies from run to run, as the split-K sums
of `split_reduce: atomic` do: F / BLOCK_F adds per output element (the plan's BLOCK_N for gate_up is
BLOCK_F; its SPLIT_K, and down's tile, go unused). Meant for a small draft, whose two GEMMs are short
launches (not yet measured on a GPU); a large ffn block keeps the atomics few.

The input is never the residual stream the launch adds into (programs still reading it would see
other programs' sums): it is h, the mlp_norm launch's output, or, with the norm fused too
(`mlp_norm+gate_up`), the copy of the finished rows the o_proj before wrote (gemm.py COPY_OUT): NORM
then scales each row by 1/rms (the norm weight folded into gate and up), its sum of squares from
the row statistics that o_proj wrote (STATS_IN), as gemm.py's norm prologue does. STATS_OUT: the
last program of an M block to finish (a counter says which) reads its finished rows back from L2
and writes their row statistics for the next fused norm (the next layer's attn_norm, or after the
last layer the final_norm).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from conjugate.compiler.gemm import STATS_BLOCK, STATS_CHUNK, _store_row_stats
from conjugate.compiler.persist import L2_LINE_BITS, prefetch_l2
from conjugate.compiler.tile import PartCall, TileSignature, cdiv, dot_dtype, triton_dtype


@triton.jit
def mlp_tile(pid, x_ptr, gate_ptr, up_ptr, down_ptr, out_ptr, stats_ptr, counter_ptr, M, F, H, stride_x, stride_g,
             stride_d, stride_out, stride_stats, eps,
             BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_K: tl.constexpr, NORM: tl.constexpr,
             STATS_OUT: tl.constexpr, ACT_DTYPE: tl.constexpr, DOT_DTYPE: tl.constexpr):
    num_m = tl.cdiv(M, BLOCK_M)
    m_blk = pid % num_m
    f_blk = pid // num_m
    offs_m = m_blk * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_f = f_blk * BLOCK_F + tl.arange(0, BLOCK_F)
    offs_k = tl.arange(0, BLOCK_K)
    rows_ok = offs_m < M
    sumsq = tl.zeros([BLOCK_M], tl.float32)
    if NORM:  # the row statistics the o_proj before wrote (gemm.py STATS_OUT)
        for c0 in range(0, tl.cdiv(H, STATS_CHUNK), STATS_BLOCK):
            cols = c0 + tl.arange(0, STATS_BLOCK)
            ok = rows_ok[:, None] & (cols[None, :] < tl.cdiv(H, STATS_CHUNK))
            sumsq += tl.sum(tl.load(stats_ptr + offs_m[:, None] * stride_stats + cols[None, :], mask=ok, other=0.0),
                            axis=1)
    gate = tl.zeros([BLOCK_M, BLOCK_F], tl.float32)
    up = tl.zeros([BLOCK_M, BLOCK_F], tl.float32)
    for k0 in range(0, H, BLOCK_K):
        kk = k0 + offs_k
        x = tl.load(x_ptr + offs_m[:, None] * stride_x + kk[None, :], mask=rows_ok[:, None] & (kk[None, :] < H),
                    other=0.0)
        w_offs = offs_f[:, None] * stride_g + kk[None, :]
        w_mask = (offs_f[:, None] < F) & (kk[None, :] < H)
        g = tl.load(gate_ptr + w_offs, mask=w_mask, other=0.0)
        u = tl.load(up_ptr + w_offs, mask=w_mask, other=0.0)
        gate += tl.dot(x.to(DOT_DTYPE), tl.trans(g.to(DOT_DTYPE)))
        up += tl.dot(x.to(DOT_DTYPE), tl.trans(u.to(DOT_DTYPE)))
    if NORM:
        rstd = 1.0 / tl.sqrt(sumsq / H + eps)
        gate = gate * rstd[:, None]
        up = up * rstd[:, None]
    # rounded as the separate gate_up launch stores it, then read as the down GEMM reads it
    act = (gate * tl.sigmoid(gate) * up).to(ACT_DTYPE).to(DOT_DTYPE)
    for n0 in range(0, H, BLOCK_K):
        nn = n0 + offs_k
        d_mask = (nn[:, None] < H) & (offs_f[None, :] < F)
        d = tl.load(down_ptr + nn[:, None] * stride_d + offs_f[None, :], mask=d_mask, other=0.0)  # [BLOCK_K, BLOCK_F]
        part = tl.dot(act, tl.trans(d.to(DOT_DTYPE)))  # [BLOCK_M, BLOCK_K]
        tl.atomic_add(out_ptr + offs_m[:, None] * stride_out + nn[None, :], part,
                      mask=rows_ok[:, None] & (nn[None, :] < H), sem="relaxed")
    if STATS_OUT:  # the M block's last program reads its finished rows back from L2
        tl.debug_barrier()  # every thread's adds are issued before the release below
        if tl.atomic_add(counter_ptr + m_blk, 1) == tl.cdiv(F, BLOCK_F) - 1:
            for n0 in range(0, H, BLOCK_K):
                nn = n0 + offs_k
                ok = rows_ok[:, None] & (nn[None, :] < H)
                new = tl.load(out_ptr + offs_m[:, None] * stride_out + nn[None, :], mask=ok, other=0.0,
                              cache_modifier=".cg")
                _store_row_stats(new, ok, offs_m, n0 // BLOCK_K, M, H, stats_ptr, stride_stats, BLOCK_M, BLOCK_K)
            tl.atomic_xchg(counter_ptr + m_blk, 0)  # ready for the next launch


@triton.jit
def mlp_prefetch(pid, x_ptr, gate_ptr, up_ptr, down_ptr, out_ptr, stats_ptr, counter_ptr, M, F, H, stride_x,
                 stride_g, stride_d, stride_out, stride_stats, eps,
                 BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_K: tl.constexpr, NORM: tl.constexpr,
                 STATS_OUT: tl.constexpr, ACT_DTYPE: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """mlp_tile's weights for program `pid` asked into L2 (persist.py): its gate and up rows, one
    request per 128-byte line, and of its down columns the first line in each row (the whole block
    up to BLOCK_F = 64 bf16 columns). Its parameters are mlp_tile's, in order."""
    num_m = tl.cdiv(M, BLOCK_M)
    if pid % num_m == 0:  # the M blocks of one ffn block share its weights: one of them asks
        rows_f = (pid // num_m) * BLOCK_F + tl.arange(0, BLOCK_F)
        rows_f = tl.where(rows_f < F, rows_f, 0)
        LINE: tl.constexpr = L2_LINE_BITS // gate_ptr.dtype.element_ty.primitive_bitwidth
        for k0 in range(0, H, LINE):
            prefetch_l2(gate_ptr + rows_f * stride_g + k0)
            prefetch_l2(up_ptr + rows_f * stride_g + k0)
        first = tl.minimum((pid // num_m) * BLOCK_F, F - 1)
        for n0 in range(0, H, BLOCK_K):
            nn = n0 + tl.arange(0, BLOCK_K)
            prefetch_l2(down_ptr + tl.where(nn < H, nn, 0) * stride_d + first)


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
