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
the row statistics that o_proj wrote (STATS_IN), summed before its loop (gemm.py reads them inside
its main loop instead; the fused MLP itself lost, fact `fused_mlp`). STATS_OUT: the
last program of an M block to finish (a counter says which) reads its finished rows back from L2
and writes their row statistics for the next fused norm (the next layer's attn_norm, or after the
last layer the final_norm).
"""
import triton
import triton.language as tl

from conjugate.kernels.tile import store_row_stats, sum_row_stats


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
        sumsq = sum_row_stats(stats_ptr, offs_m, M, H, stride_stats, BLOCK_M)
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
                store_row_stats(new, ok, offs_m, n0 // BLOCK_K, M, H, stats_ptr, stride_stats, BLOCK_M, BLOCK_K)
            tl.atomic_xchg(counter_ptr + m_blk, 0)  # ready for the next launch
