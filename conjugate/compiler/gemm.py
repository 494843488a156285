"""Weight-streaming GEMM for decode shapes: out[M, N] = x[M, K] @ w[N, K]^T, M up to a few hundred.

Weights keep the Hugging Face layout [N, K] (row stride `stride_w`); activation rows are fp32 or
the weights' type, cast to DOT_DTYPE at the load.
Program `pid` owns one (M block, split, N block) tile; M blocks vary fastest so the programs that
stream the same weight tile run side by side and share it through L2.

Prologue: NORM scales each row by 1/rms(x) (RMSNorm folded into the GEMM: the norm weight was
multiplied into `w` at compile time). Epilogues (EPILOGUE constexpr):
    STORE     out = acc (+ bias)
    RESIDUAL  out += acc (the residual stream)
    SILU_MUL  out = silu(x @ w^T) * (x @ w2^T): gate and up projections in one tile
With SPLIT_K > 1 each split stores its partial sums in a workspace slot of its own and the tile's
last split adds them up, in split order, and runs the epilogue: deterministic, no float atomics.
    ARGMAX    per-tile row max and index to scratch; the last program to finish reduces them to
              one token per row (first index on ties, like torch.argmax); logits are written only
              when WRITE_OUT
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from conjugate.compiler.tile import PartCall, TileSignature, cdiv, dot_dtype

# The EPILOGUE constexpr's values, as globals the tile functions can read.
EPILOGUE_STORE = tl.constexpr(0)
EPILOGUE_RESIDUAL = tl.constexpr(1)
EPILOGUE_SILU_MUL = tl.constexpr(2)
EPILOGUE_ARGMAX = tl.constexpr(3)
EPILOGUES = {"store": EPILOGUE_STORE.value, "residual": EPILOGUE_RESIDUAL.value,
             "silu_mul": EPILOGUE_SILU_MUL.value, "argmax": EPILOGUE_ARGMAX.value}  # gemm_call's names
_REDUCE_BLOCK = tl.constexpr(128)  # partial maxima reduced per step by the last program


@triton.jit
def _argmax_epilogue(acc, offs_m, offs_n, n_blk, num_n, pid_count, M, N, part_val_ptr, part_idx_ptr, counter_ptr,
                     tok_ptr, stride_tok, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    vals = tl.where(offs_n[None, :] < N, acc, float("-inf"))  # [BLOCK_M, BLOCK_N]
    tile_max = tl.max(vals, axis=1)  # [BLOCK_M]
    tile_idx = tl.argmax(vals, axis=1, tie_break_left=True) + n_blk * BLOCK_N
    row_ok = offs_m < M
    tl.store(part_val_ptr + offs_m * num_n + n_blk, tile_max, mask=row_ok)
    tl.store(part_idx_ptr + offs_m * num_n + n_blk, tile_idx.to(tl.int32), mask=row_ok)
    tl.debug_barrier()  # every thread's partial is stored before the release below
    done = tl.atomic_add(counter_ptr, 1)  # acq_rel: the last program sees every partial
    if done == pid_count - 1:
        for m0 in range(0, M, BLOCK_M):
            rows = m0 + tl.arange(0, BLOCK_M)
            best_val = tl.full([BLOCK_M], float("-inf"), tl.float32)
            best_idx = tl.zeros([BLOCK_M], tl.int32)
            for c0 in range(0, num_n, _REDUCE_BLOCK):
                cols = c0 + tl.arange(0, _REDUCE_BLOCK)
                ok = (rows[:, None] < M) & (cols[None, :] < num_n)
                val = tl.load(part_val_ptr + rows[:, None] * num_n + cols[None, :], mask=ok, other=float("-inf"),
                              cache_modifier=".cg")  # [BLOCK_M, R]
                idx = tl.load(part_idx_ptr + rows[:, None] * num_n + cols[None, :], mask=ok, other=0, cache_modifier=".cg")
                chunk_max = tl.max(val, axis=1)
                chunk_arg = tl.argmax(val, axis=1, tie_break_left=True)
                chunk_idx = tl.sum(tl.where(cols[None, :] == (c0 + chunk_arg)[:, None], idx, 0), axis=1)
                better = chunk_max > best_val  # strict: an earlier tile wins a tie
                best_idx = tl.where(better, chunk_idx, best_idx)
                best_val = tl.where(better, chunk_max, best_val)
            tl.store(tok_ptr + rows * stride_tok, best_idx.to(tl.int64), mask=rows < M)
        tl.atomic_xchg(counter_ptr, 0)  # ready for the next launch


@triton.jit
def gemm_tile(pid, x_ptr, w_ptr, w2_ptr, bias_ptr, out_ptr, part_val_ptr, part_idx_ptr, counter_ptr, tok_ptr, ws_ptr,
              M, N, K, stride_x, stride_w, stride_out, stride_tok, eps, blk_stride, blk_pairs, tail_start,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
              NORM: tl.constexpr, EPILOGUE: tl.constexpr, HAS_BIAS: tl.constexpr, WRITE_OUT: tl.constexpr,
              DOT_DTYPE: tl.constexpr):
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    m_blk = pid % num_m
    split = (pid // num_m) % SPLIT_K
    n_blk = pid // (num_m * SPLIT_K)
    k_span = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    k_lo = split * k_span
    k_hi = tl.minimum(k_lo + k_span, K)

    offs_m = m_blk * BLOCK_M + tl.arange(0, BLOCK_M)
    rows_n = tl.arange(0, BLOCK_N)
    offs_n = n_blk * BLOCK_N + rows_n
    offs_k = tl.arange(0, BLOCK_K)
    # The weight block of rows n_blk*BLOCK_N.. : contiguous in the separate layout (blk_pairs = 0);
    # in the packed layout the first blk_pairs blocks alternate with the other model's.
    w_block = tl.where(n_blk < blk_pairs, n_blk * blk_stride, tail_start + (n_blk - blk_pairs) * BLOCK_N * stride_w)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    sumsq = tl.zeros([BLOCK_M], tl.float32)
    if NORM:  # a pre-pass over this split's rows, so the main loop stays the plain, pipelined one
        for k0 in range(k_lo, k_hi, BLOCK_K):
            kk = k0 + offs_k
            x = tl.load(x_ptr + offs_m[:, None] * stride_x + kk[None, :],
                        mask=(offs_m[:, None] < M) & (kk[None, :] < k_hi), other=0.0).to(tl.float32)  # [BM, BK]
            sumsq += tl.sum(x * x, axis=1)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        kk = k0 + offs_k
        x = tl.load(x_ptr + offs_m[:, None] * stride_x + kk[None, :],
                    mask=(offs_m[:, None] < M) & (kk[None, :] < k_hi), other=0.0)  # [BM, BK]
        w_mask = (offs_n[:, None] < N) & (kk[None, :] < k_hi)
        w_offs = w_block + rows_n[:, None] * stride_w + kk[None, :]
        w = tl.load(w_ptr + w_offs, mask=w_mask, other=0.0)  # [BN, BK]
        acc += tl.dot(x.to(DOT_DTYPE), tl.trans(w.to(DOT_DTYPE)))  # fp32 accumulate
        if EPILOGUE == EPILOGUE_SILU_MUL:
            w2 = tl.load(w2_ptr + w_offs, mask=w_mask, other=0.0)
            acc2 += tl.dot(x.to(DOT_DTYPE), tl.trans(w2.to(DOT_DTYPE)))
    if SPLIT_K > 1:
        # Split-K fix-up: each split stores its partials in a slot of its own; the tile's last split
        # (a counter says which) sums the slots in split order and runs the epilogue alone. No
        # floating-point atomics, so the result does not depend on the programs' timing.
        tile = m_blk * num_n + n_blk
        slot = (split * M + offs_m[:, None]) * N + offs_n[None, :]  # ws: [SPLIT_K, M, N]
        ws_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        tl.store(ws_ptr + slot, acc, mask=ws_mask)
        if EPILOGUE == EPILOGUE_SILU_MUL:
            tl.store(ws_ptr + SPLIT_K * M * N + slot, acc2, mask=ws_mask)
        if NORM:
            tl.store(ws_ptr + 2 * SPLIT_K * M * N + (split * num_n + n_blk) * M + offs_m, sumsq, mask=offs_m < M)
        tl.debug_barrier()  # every thread's partials are stored before the release below
        arrived = tl.atomic_add(counter_ptr + 1 + tile, 1)
        if arrived == SPLIT_K - 1:
            acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            acc2 = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            sumsq = tl.zeros([BLOCK_M], tl.float32)
            for s in range(SPLIT_K):
                slot = (s * M + offs_m[:, None]) * N + offs_n[None, :]
                acc += tl.load(ws_ptr + slot, mask=ws_mask, other=0.0, cache_modifier=".cg")
                if EPILOGUE == EPILOGUE_SILU_MUL:
                    acc2 += tl.load(ws_ptr + SPLIT_K * M * N + slot, mask=ws_mask, other=0.0, cache_modifier=".cg")
                if NORM:
                    sumsq += tl.load(ws_ptr + 2 * SPLIT_K * M * N + (s * num_n + n_blk) * M + offs_m,
                                     mask=offs_m < M, other=0.0, cache_modifier=".cg")
            tl.atomic_xchg(counter_ptr + 1 + tile, 0)  # ready for the next launch
            _epilogue(acc, acc2, sumsq, offs_m, offs_n, n_blk, num_n, M, N, K, eps, bias_ptr, out_ptr, stride_out,
                      part_val_ptr, part_idx_ptr, counter_ptr, tok_ptr, stride_tok, BLOCK_M, BLOCK_N, NORM, EPILOGUE,
                      HAS_BIAS, WRITE_OUT)
    else:
        _epilogue(acc, acc2, sumsq, offs_m, offs_n, n_blk, num_n, M, N, K, eps, bias_ptr, out_ptr, stride_out,
                  part_val_ptr, part_idx_ptr, counter_ptr, tok_ptr, stride_tok, BLOCK_M, BLOCK_N, NORM, EPILOGUE,
                  HAS_BIAS, WRITE_OUT)


@triton.jit
def _epilogue(acc, acc2, sumsq, offs_m, offs_n, n_blk, num_n, M, N, K, eps, bias_ptr, out_ptr, stride_out,
              part_val_ptr, part_idx_ptr, counter_ptr, tok_ptr, stride_tok, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, NORM: tl.constexpr, EPILOGUE: tl.constexpr, HAS_BIAS: tl.constexpr,
              WRITE_OUT: tl.constexpr):
    if NORM:
        rstd = 1.0 / tl.sqrt(sumsq / K + eps)  # [BLOCK_M]
        acc = acc * rstd[:, None]
        acc2 = acc2 * rstd[:, None]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    out_ptrs = out_ptr + offs_m[:, None] * stride_out + offs_n[None, :]
    out_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if EPILOGUE == EPILOGUE_STORE:
        tl.store(out_ptrs, acc, mask=out_mask)
    elif EPILOGUE == EPILOGUE_RESIDUAL:
        tl.store(out_ptrs, tl.load(out_ptrs, mask=out_mask, other=0.0) + acc, mask=out_mask)
    elif EPILOGUE == EPILOGUE_SILU_MUL:
        tl.store(out_ptrs, (acc * tl.sigmoid(acc) * acc2).to(out_ptr.dtype.element_ty), mask=out_mask)
    else:  # EPILOGUE_ARGMAX
        if WRITE_OUT:
            tl.store(out_ptrs, acc, mask=out_mask)
        _argmax_epilogue(acc, offs_m, offs_n, n_blk, num_n, tl.cdiv(M, BLOCK_M) * num_n, M, N, part_val_ptr,
                         part_idx_ptr, counter_ptr, tok_ptr, stride_tok, BLOCK_M, BLOCK_N)


SIGNATURE = TileSignature.of(gemm_tile)


def gemm_call(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, *, rows: int, epilogue: str = "store",
              w2: torch.Tensor | None = None, bias: torch.Tensor | None = None, norm_eps: float | None = None,
              tokens: torch.Tensor | None = None, stride_tok: int = 1, write_out: bool = True,
              block_m: int = 16, block_n: int = 64, block_k: int = 128, split_k: int = 1, label: str = "") -> PartCall:
    """Bind one GEMM. x: [rows, K] fp32 or the weights' type; w, w2: [N, K]; out: [rows, N] (row strides free)."""
    n, k = w.shape
    if epilogue not in EPILOGUES:
        raise ValueError(f"unknown GEMM epilogue {epilogue!r}")
    if epilogue == "silu_mul" and w2 is None:
        raise ValueError("the silu_mul epilogue needs w2 (the up projection)")
    if epilogue == "argmax" and tokens is None:
        raise ValueError("the argmax epilogue needs a tokens buffer")
    num_m, num_n = cdiv(rows, block_m), cdiv(n, block_n)
    ws_size = split_k * (2 * rows * n + num_n * rows) if split_k > 1 else 1  # acc, acc2, sums of squares
    if max(n * k, ws_size, rows * out.stride(0)) >= 2**31:
        raise ValueError(f"GEMM {n}x{k} over {rows} rows (split-K {split_k}): element offsets past 2^31 "
                         f"are not supported")
    dev = w.device
    # counter[0]: programs done (argmax); counter[1 + tile]: splits done per output tile
    counter = torch.zeros(1 + num_m * num_n, dtype=torch.int32, device=dev)
    part_val = torch.empty(rows * num_n if epilogue == "argmax" else 1, dtype=torch.float32, device=dev)
    part_idx = torch.empty(rows * num_n if epilogue == "argmax" else 1, dtype=torch.int32, device=dev)
    ws = torch.empty(ws_size, dtype=torch.float32, device=dev)
    scratch = [counter, part_val, part_idx, ws]
    args = dict(x_ptr=x, w_ptr=w, w2_ptr=w2 if w2 is not None else w, bias_ptr=bias if bias is not None else w,
                out_ptr=out, part_val_ptr=part_val, part_idx_ptr=part_idx, counter_ptr=counter,
                tok_ptr=tokens if tokens is not None else counter, ws_ptr=ws, M=rows, N=n, K=k, stride_x=x.stride(0),
                stride_w=w.stride(0), stride_out=out.stride(0), stride_tok=stride_tok,
                eps=float(norm_eps or 0.0), blk_stride=0, blk_pairs=0, tail_start=0)
    constexprs = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k, NORM=norm_eps is not None,
                      EPILOGUE=EPILOGUES[epilogue], HAS_BIAS=bias is not None, WRITE_OUT=write_out,
                      DOT_DTYPE=dot_dtype(w.dtype))
    programs = num_m * num_n * split_k
    return PartCall(SIGNATURE, args, constexprs, programs, label, scratch)
