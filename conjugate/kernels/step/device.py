"""The step kernel (Gluon, Hopper): the draft's k decode steps as one persistent, warp-specialized
launch running the task table that conjugate/compiler/step/ builds (table.py) and encodes (layout.py).

Each program (one per SM it is given, all co-resident) reads its own list of tasks and runs two
partitions over it, both in the table's order:

* the **loader** (1 warp, ring.py) streams every weight tile of its GEMM tasks by TMA into the ring,
  waiting only for free slots, so later tasks' weights arrive while the compute partition waits;
* the **compute** partition (one warpgroup) reads each task's record (one vector load, issued while
  the task before runs), waits on its counters (bounded acquire spins: a spin that runs out counts
  an error, and later waits stop spinning), then runs it:
    embed    the step's token rows of the embedding into x (and their summed squares)
    GEMMs    x rows staged by cp.async, swap-AB wgmma over the ring's slots, the partial added into
             fp32 sums; the tile's last slice in (an acq_rel counter) runs the epilogue (with
             DIRECT_EPILOGUE a whole gate_up or lm_head tile runs it on its accumulators instead):
               qkv      1/rms, bias, Qwen3's q/k norm, RoPE; q to its buffer, k and v into the cache
               o_proj   + the residual: x_mid and its summed squares
               gate_up  1/rms, SiLU(gate) * up: h
               down     + the residual: the next layer's x and its summed squares
               lm_head  1/rms, the tile's max and first argmax; the last tile in reduces them to the
                        step's tokens and releases the token counter
    attn     one key chunk of one (sequence, KV head) for all its query heads on tensor cores; the
             pair's last chunk in merges the partials
  and bumps the tile's done counter (release).

The template's constexprs also run a verify pass (TOKENS tokens a sequence, causal attention,
LOGITS kept in lm_head's sums) and pad the activation rows to RPAD (16, 32 or 64), staging a long K
slice CHUNK tiles at a time; the draft form uses TOKENS 1, RPAD 16 or 32, whole slices, and the verify
pass is so far run only from lab/ (verify_step, cross_step).

The KV cache is one [2, L, B, KVH, S, D] tensor (keys, then values: KVCache.empty's layout).
`%globaltimer` stamps (STAMPS) give each task's start, waits met, activations staged, product done, parts
counter answered and end, and the loader's issue of its first weight tile (columns.py's S_*): the
in-kernel ledger.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, warpgroup_mma

from conjugate.kernels.step.ring import (BK, C_DONE, C_FCNT, C_FOFF, C_HEAD0, C_KHI, C_KLO, C_LAYER,
                                         C_OP, C_PARTS, C_SEG, C_SPLITS, C_STEP, C_TILE, C_TOKEN, C_W1C, C_W1T,
                                         C_WCNT, C_WOFF, HALF, S_ARRIVED, S_END, S_MET, S_MULTIPLIED, S_STAGED,
                                         S_START, SLOT_ROWS, STAMP_COLS, KV_SLOTS, acquire, field, free_slot,
                                         history_blocks, kv_tiles, now, paired_tile, record, release, ring_barriers,
                                         ring_slot, single_tile, stage_activations, step_loader, wait_all)


# --------------------------------------------------------------------------------------------------
# Partial sums in, finished tiles out
# --------------------------------------------------------------------------------------------------

@gluon.jit
def _add_rows(sum_ptr, acc, col0, width, B, ROWS: gl.constexpr, RPAD: gl.constexpr):
    """sums[b, col0 + r] += acc[r, b] (acc is the transposed [ROWS, RPAD] accumulator), r < ROWS."""
    r = gl.arange(0, ROWS, layout=gl.SliceLayout(1, acc.type.layout))
    b = gl.arange(0, RPAD, layout=gl.SliceLayout(0, acc.type.layout))
    gl.atomic_add(sum_ptr + b[None, :] * width + (col0 + r)[:, None], acc, mask=(b < B)[None, :], sem="relaxed")


@gluon.jit
def _stage(op, act, xs_ptr, xm_ptr, o_ptr, h_ptr, step, sl, sx, B, k_lo, n_k, H: gl.constexpr, Q: gl.constexpr,
           F: gl.constexpr, L: gl.constexpr, ROWS: gl.constexpr, RPAD: gl.constexpr):
    """The activation rows a GEMM task reads, K tiles [k_lo, k_lo + n_k * BK), into the activation tiles
    (constexpr row widths: cp.async needs to know they are 16-byte aligned)."""
    if op == 1:
        stage_activations(act, xs_ptr + sx * ROWS * H, H, B, k_lo, n_k, RPAD)
    elif op == 3:
        stage_activations(act, o_ptr + sl * ROWS * Q, Q, B, k_lo, n_k, RPAD)
    elif op == 4:
        stage_activations(act, xm_ptr + sl * ROWS * H, H, B, k_lo, n_k, RPAD)
    elif op == 5:
        stage_activations(act, h_ptr + sl * ROWS * F, F, B, k_lo, n_k, RPAD)
    else:
        stage_activations(act, xs_ptr + (step * (L + 1) + L) * ROWS * H, H, B, k_lo, n_k, RPAD)


@gluon.jit
def _add_paired(op, acc1, acc2, s_qkv_ptr, s_gu_ptr, sl, tile, B, NQ: gl.constexpr, F: gl.constexpr,
                ROWS: gl.constexpr, RPAD: gl.constexpr):
    """A paired tile's partial (qkv or gate_up) into the op's fp32 sums."""
    if op == 1:
        _add_rows(s_qkv_ptr + sl * ROWS * NQ * SLOT_ROWS, acc1, tile * SLOT_ROWS, NQ * SLOT_ROWS, B, HALF, RPAD)
        _add_rows(s_qkv_ptr + sl * ROWS * NQ * SLOT_ROWS, acc2, tile * SLOT_ROWS + HALF, NQ * SLOT_ROWS, B,
                  HALF, RPAD)
    else:
        _add_rows(s_gu_ptr + sl * ROWS * 2 * F, acc1, tile * SLOT_ROWS, 2 * F, B, HALF, RPAD)
        _add_rows(s_gu_ptr + sl * ROWS * 2 * F, acc2, tile * SLOT_ROWS + HALF, 2 * F, B, HALF, RPAD)


@gluon.jit
def _add_single(op, acc, s_o_ptr, s_d_ptr, s_head_ptr, step, sl, col0, B, H: gl.constexpr, NTH: gl.constexpr,
                ROWS: gl.constexpr, RPAD: gl.constexpr):
    """A single tile's partial (o_proj, down or lm_head) into the op's fp32 sums."""
    if op == 3:
        _add_rows(s_o_ptr + sl * ROWS * H, acc, col0, H, B, SLOT_ROWS, RPAD)
    elif op == 5:
        _add_rows(s_d_ptr + sl * ROWS * H, acc, col0, H, B, SLOT_ROWS, RPAD)
    else:
        _add_rows(s_head_ptr + step * ROWS * NTH * SLOT_ROWS, acc, col0, NTH * SLOT_ROWS, B, SLOT_ROWS, RPAD)


@gluon.jit
def _tile(ptr, col0, width, B, ROWS: gl.constexpr, layout: gl.constexpr, RPAD: gl.constexpr):
    """[RPAD, ROWS] fp32 of ptr[b, col0 + c] (rows past B zero), through L2."""
    b = gl.arange(0, RPAD, layout=gl.SliceLayout(1, layout))
    c = gl.arange(0, ROWS, layout=gl.SliceLayout(0, layout))
    mask = (b < B)[:, None] & (c < ROWS)[None, :]
    return gl.load(ptr + b[:, None] * width + (col0 + c)[None, :], mask=mask, other=0.0,
                   cache_modifier=".cg").to(gl.float32)


@gluon.jit
def _residual_epilogue(sum_ptr, res_ptr, out_ptr, ss_out_ptr, col0, B, H: gl.constexpr, RPAD: gl.constexpr):
    """out[:, tile] = bf16(res[:, tile] + sums[:, tile]); the rounded tile's squares into ss_out."""
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [4, 1], [1, 0])
    b = gl.arange(0, RPAD, layout=gl.SliceLayout(1, layout))
    c = gl.arange(0, SLOT_ROWS, layout=gl.SliceLayout(0, layout))
    new = _tile(sum_ptr, col0, H, B, SLOT_ROWS, layout, RPAD) + _tile(res_ptr, col0, H, B, SLOT_ROWS, layout, RPAD)
    new = new.to(gl.bfloat16)
    mask = (b < B)[:, None] & (c < SLOT_ROWS)[None, :]
    gl.store(out_ptr + b[:, None] * H + (col0 + c)[None, :], new, mask=mask)
    rounded = new.to(gl.float32)
    gl.atomic_add(ss_out_ptr + b, gl.sum(rounded * rounded, axis=1), mask=b < B, sem="relaxed")


# An epilogue's inputs besides its tile's sums (the norm's summed squares; qkv's bias, positions, q/k norm
# weights and RoPE frequencies) are loaded before they are needed, on a coarse table (COARSE: every one of
# them is complete once the task's waits are met): a whole tile's squares before its product, a split
# tile's inputs before its pieces are counted (their trip overlaps the count's). A last piece then reads
# only its sums: one round trip, not the two or three of loads chained behind the squares' 1/rms
# (lab/step_stages/h100_early.json). On a table of per-tile waits they load after the finish waits.

@gluon.jit
def _norm_squares(op, ssx_ptr, ssm_ptr, step, sl, sx, L: gl.constexpr, ROWS: gl.constexpr):
    """Where the summed squares of the rows a GEMM's norm scales by live: qkv's x, gate_up's x_mid,
    lm_head's last x (o_proj and down have no norm: x's, read and unused)."""
    ptr = ssx_ptr + sx * ROWS
    if op == 4:
        ptr = ssm_ptr + sl * ROWS
    elif op == 6:
        ptr = ssx_ptr + (step * (L + 1) + L) * ROWS
    return ptr


@gluon.jit
def _squares(ss_ptr, B, layout: gl.constexpr, RPAD: gl.constexpr):
    """[RPAD] summed squares of each row, in `layout` (a row-vector slice), loaded now, used later."""
    b = gl.arange(0, RPAD, layout=layout)
    return gl.load(ss_ptr + b, mask=b < B, other=0.0, cache_modifier=".cg")


@gluon.jit
def _qkv_inputs(on, bias_ptr, qkn_ptr, inv_freq_ptr, lengths_ptr, layer, tile, seg, B, NQ: gl.constexpr,
                D: gl.constexpr, QK_NORM: gl.constexpr, TOKENS: gl.constexpr, RPAD: gl.constexpr):
    """A qkv tile's epilogue inputs besides its sums and squares (`on`: a qkv task; else none is read):
    its halves' bias, each row's cache length, the q/k norm's weights (Qwen3) and RoPE's frequencies."""
    layout: gl.constexpr = gl.BlockedLayout([1, 2], [2, 16], [4, 1], [1, 0])
    b = gl.arange(0, RPAD, layout=gl.SliceLayout(1, layout))
    r = gl.arange(0, HALF, layout=gl.SliceLayout(0, layout))
    d = r % (D // 2)
    cols = (r < HALF) & on
    bias1 = gl.load(bias_ptr + layer * NQ * SLOT_ROWS + tile * SLOT_ROWS + r, mask=cols, other=0.0)
    bias2 = gl.load(bias_ptr + layer * NQ * SLOT_ROWS + tile * SLOT_ROWS + HALF + r, mask=cols, other=0.0)
    length = gl.load(lengths_ptr + b // TOKENS, mask=(b < B) & on, other=0)
    if QK_NORM:
        norm = qkn_ptr + (layer * 2 + gl.minimum(seg, 1)) * D  # v (seg 2) has none: k's, unused
        w1 = gl.load(norm + d, mask=cols, other=0.0)
        w2 = gl.load(norm + D // 2 + d, mask=cols, other=0.0)
    else:
        w1 = bias1
        w2 = bias2
    freq = gl.load(inv_freq_ptr + d, mask=cols, other=0.0)
    return bias1, bias2, length, w1, w2, freq


@gluon.jit
def _qkv_epilogue(sum_ptr, ss, bias1, bias2, length, w1, w2, freq, q_ptr, kv_ptr, layer, step, tile, seg, head0, B,
                H: gl.constexpr, NQ: gl.constexpr, Q: gl.constexpr, D: gl.constexpr, KVH: gl.constexpr,
                L: gl.constexpr, S: gl.constexpr, BATCH: gl.constexpr, QK_NORM: gl.constexpr, EPS: gl.constexpr,
                TOKENS: gl.constexpr, RPAD: gl.constexpr):
    """One paired tile from its sums and its inputs (_squares, _qkv_inputs): 1/rms, bias, Qwen3's q/k norm,
    RoPE; q to its buffer, k or v into the cache. Rows r < 64 are dims d = r % (D/2) of head
    head0 + r // (D/2) (first halves), the next 64 the same heads' second halves. Activation row b is
    token b % TOKENS of sequence b // TOKENS, at position length + step + that token."""
    layout: gl.constexpr = gl.BlockedLayout([1, 2], [2, 16], [4, 1], [1, 0])
    b = gl.arange(0, RPAD, layout=gl.SliceLayout(1, layout))
    r = gl.arange(0, HALF, layout=gl.SliceLayout(0, layout))
    HD2: gl.constexpr = D // 2
    j = r // HD2
    d = r % HD2
    rstd = gl.rsqrt(ss / H + EPS)[:, None]
    a1 = _tile(sum_ptr, tile * SLOT_ROWS, NQ * SLOT_ROWS, B, HALF, layout, RPAD) * rstd + bias1[None, :]
    a2 = _tile(sum_ptr, tile * SLOT_ROWS + HALF, NQ * SLOT_ROWS, B, HALF, layout, RPAD) * rstd + bias2[None, :]
    seq = b // TOKENS
    pos = length + step + b % TOKENS
    if seg < 2:
        if QK_NORM:  # one head per tile (D = 128): its 1/rms over both halves
            ms = (gl.sum(a1 * a1, axis=1) + gl.sum(a2 * a2, axis=1)) / D
            rn = gl.rsqrt(ms + EPS)[:, None]
            a1 = a1 * rn * w1[None, :]
            a2 = a2 * rn * w2[None, :]
        angle = pos.to(gl.float32)[:, None] * freq[None, :]
        cos = gl.cos(angle)
        sin = gl.sin(angle)
        o1 = a1 * cos - a2 * sin
        o2 = a2 * cos + a1 * sin
    else:
        o1 = a1
        o2 = a2
    head = head0 + j  # [HALF]
    mask = (b < B)[:, None]
    if seg == 0:
        base = q_ptr + b[:, None] * Q + (head * D + d)[None, :]
        gl.store(base, o1.to(gl.bfloat16), mask=mask)
        gl.store(base + HD2, o2.to(gl.bfloat16), mask=mask)
    else:
        # [RPAD]: the (k or v, layer, sequence) cache plane; in int64, as attention's reads are (a target's
        # cache passes 2^31 elements: llama-3.2-3b at 16 sequences of 4100 positions)
        plane = (((seg - 1) * L + layer) * BATCH + seq).to(gl.int64)
        base = kv_ptr + ((plane[:, None] * KVH + head[None, :]) * S + pos[:, None]) * D + d[None, :]
        gl.store(base, o1.to(gl.bfloat16), mask=mask)
        gl.store(base + HD2, o2.to(gl.bfloat16), mask=mask)


@gluon.jit
def _gate_up_epilogue(sum_ptr, ss, h_ptr, tile, B, H: gl.constexpr, F: gl.constexpr, EPS: gl.constexpr,
                    RPAD: gl.constexpr):
    """h[:, tile] = SiLU(gate) * up from the tile's sums, 1/rms from its squares (_squares)."""
    layout: gl.constexpr = gl.BlockedLayout([1, 2], [2, 16], [4, 1], [1, 0])
    b = gl.arange(0, RPAD, layout=gl.SliceLayout(1, layout))
    c = gl.arange(0, HALF, layout=gl.SliceLayout(0, layout))
    rstd = gl.rsqrt(ss / H + EPS)[:, None]
    g = _tile(sum_ptr, tile * SLOT_ROWS, 2 * F, B, HALF, layout, RPAD) * rstd
    u = _tile(sum_ptr, tile * SLOT_ROWS + HALF, 2 * F, B, HALF, layout, RPAD) * rstd
    h = g / (1.0 + gl.exp(-g)) * u
    gl.store(h_ptr + b[:, None] * F + (tile * HALF + c)[None, :], h.to(gl.bfloat16), mask=(b < B)[:, None])


@gluon.jit
def _gate_up_epilogue_direct(acc_g, acc_u, ss, h_ptr, tile, B, H: gl.constexpr, F: gl.constexpr, EPS: gl.constexpr,
                             RPAD: gl.constexpr):
    """_gate_up_epilogue over a whole tile's accumulators ([HALF, RPAD] each, transposed) instead of its
    sums (DIRECT_EPILOGUE: the launch's default on a coarse table; split tiles still finish from their sums)."""
    layout: gl.constexpr = acc_g.type.layout
    c = gl.arange(0, HALF, layout=gl.SliceLayout(1, layout))
    b = gl.arange(0, RPAD, layout=gl.SliceLayout(0, layout))
    rstd = gl.rsqrt(ss / H + EPS)[None, :]
    g = acc_g * rstd
    h = g / (1.0 + gl.exp(-g)) * (acc_u * rstd)
    gl.store(h_ptr + b[None, :] * F + (tile * HALF + c)[:, None], h.to(gl.bfloat16), mask=(b < B)[None, :])


@gluon.jit
def _head_epilogue(sum_ptr, ss, best_val_ptr, best_idx_ptr, tile, B, H: gl.constexpr, V: gl.constexpr,
                   NTH: gl.constexpr, EPS: gl.constexpr, LOGITS: gl.constexpr, RPAD: gl.constexpr):
    """The tile's logits (1/rms from its squares, _squares): each row's max and its first column, into the
    step's partials; with LOGITS the logits themselves too, over the tile's sums (the step's [rows, NTH *
    128] fp32)."""
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [4, 1], [1, 0])
    b = gl.arange(0, RPAD, layout=gl.SliceLayout(1, layout))
    c = tile * SLOT_ROWS + gl.arange(0, SLOT_ROWS, layout=gl.SliceLayout(0, layout))
    rstd = gl.rsqrt(gl.convert_layout(ss, gl.SliceLayout(1, layout)) / H + EPS)[:, None]
    logits = _tile(sum_ptr, tile * SLOT_ROWS, NTH * SLOT_ROWS, B, SLOT_ROWS, layout, RPAD) * rstd
    if LOGITS:
        gl.store(sum_ptr + b[:, None] * (NTH * SLOT_ROWS) + c[None, :], logits, mask=(b < B)[:, None] & (c < V)[None, :])
    logits = gl.where((c < V)[None, :], logits, float("-inf"))
    best = gl.max(logits, axis=1)
    first = -gl.max(gl.where(logits == best[:, None], -c[None, :], -(V + 1)), axis=1)
    gl.store(best_val_ptr + tile * RPAD + b, best, mask=b < B)
    gl.store(best_idx_ptr + tile * RPAD + b, first, mask=b < B)


@gluon.jit
def _head_epilogue_direct(acc, ss, sum_ptr, best_val_ptr, best_idx_ptr, tile, B, H: gl.constexpr, V: gl.constexpr,
                          NTH: gl.constexpr, EPS: gl.constexpr, LOGITS: gl.constexpr, RPAD: gl.constexpr):
    """_head_epilogue over a whole tile's accumulator ([SLOT_ROWS, RPAD], transposed) instead of its sums."""
    layout: gl.constexpr = acc.type.layout
    c = tile * SLOT_ROWS + gl.arange(0, SLOT_ROWS, layout=gl.SliceLayout(1, layout))
    b = gl.arange(0, RPAD, layout=gl.SliceLayout(0, layout))
    logits = acc * gl.rsqrt(ss / H + EPS)[None, :]
    if LOGITS:
        gl.store(sum_ptr + b[None, :] * (NTH * SLOT_ROWS) + c[:, None], logits,
                 mask=(b < B)[None, :] & (c < V)[:, None])
    logits = gl.where((c < V)[:, None], logits, float("-inf"))
    best = gl.max(logits, axis=0)
    first = -gl.max(gl.where(logits == best[None, :], -c[:, None], -(V + 1)), axis=0)
    gl.store(best_val_ptr + tile * RPAD + b, best, mask=b < B)
    gl.store(best_idx_ptr + tile * RPAD + b, first, mask=b < B)


@gluon.jit
def _paired_out(op, acc1, acc2, direct, s_qkv_ptr, s_gu_ptr, h_ptr, sl, tile, B, H: gl.constexpr,
                NQ: gl.constexpr, F: gl.constexpr, EPS: gl.constexpr, ROWS: gl.constexpr, RPAD: gl.constexpr,
                ss_cols):
    """A paired tile's product out: its partials into the op's sums, or (`direct`) gate_up's epilogue
    (the rows' squares loaded before the product)."""
    if direct:
        _gate_up_epilogue_direct(acc1, acc2, ss_cols, h_ptr + sl * ROWS * F, tile, B, H, F, EPS, RPAD)
    else:
        _add_paired(op, acc1, acc2, s_qkv_ptr, s_gu_ptr, sl, tile, B, NQ, F, ROWS, RPAD)


@gluon.jit
def _single_out(op, acc, direct, s_o_ptr, s_d_ptr, s_head_ptr, best_val_ptr, best_idx_ptr, step, sl, tile, col0, B,
                H: gl.constexpr, V: gl.constexpr, NTH: gl.constexpr, EPS: gl.constexpr,
                LOGITS: gl.constexpr, ROWS: gl.constexpr, RPAD: gl.constexpr, ss_cols):
    """A single tile's product out: its partial into the op's sums, or (`direct`) lm_head's epilogue
    (the rows' squares loaded before the product)."""
    if direct:
        _head_epilogue_direct(acc, ss_cols, s_head_ptr + step * ROWS * NTH * SLOT_ROWS,
                              best_val_ptr + step * NTH * RPAD, best_idx_ptr + step * NTH * RPAD, tile, B, H, V,
                              NTH, EPS, LOGITS, RPAD)
    else:
        _add_single(op, acc, s_o_ptr, s_d_ptr, s_head_ptr, step, sl, col0, B, H, NTH, ROWS, RPAD)


@gluon.jit
def _reduce_tokens(best_val_ptr, best_idx_ptr, tokens_ptr, B, NTH: gl.constexpr, RPAD: gl.constexpr):
    """The step's tokens: per row, the first tile (in column order) holding the largest maximum."""
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [4, 1], [1, 0])
    b = gl.arange(0, RPAD, layout=gl.SliceLayout(1, layout))
    t = gl.arange(0, SLOT_ROWS, layout=gl.SliceLayout(0, layout))
    top = gl.full([RPAD], float("-inf"), gl.float32, layout=gl.SliceLayout(1, layout))
    arg = gl.zeros([RPAD], gl.int32, layout=gl.SliceLayout(1, layout))
    for t0 in range(0, NTH, SLOT_ROWS):
        tiles = t0 + t
        mask = (b < B)[:, None] & (tiles < NTH)[None, :]
        vals = gl.load(best_val_ptr + tiles[None, :] * RPAD + b[:, None], mask=mask, other=float("-inf"),
                       cache_modifier=".cg")
        idx = gl.load(best_idx_ptr + tiles[None, :] * RPAD + b[:, None], mask=mask, other=0, cache_modifier=".cg")
        chunk = gl.max(vals, axis=1)
        first = -gl.max(gl.where(vals == chunk[:, None], -idx, -2147483647), axis=1)
        better = chunk > top
        arg = gl.where(better, first, arg)
        top = gl.where(better, chunk, top)
    gl.store(tokens_ptr + b, arg, mask=b < B)


# --------------------------------------------------------------------------------------------------
# Embedding and attention (no weights through the ring)
# --------------------------------------------------------------------------------------------------

@gluon.jit
def _embed(embed_ptr, tokens_ptr, x_ptr, ss_ptr, col0, B, H: gl.constexpr, RPAD: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [4, 1], [1, 0])
    b = gl.arange(0, RPAD, layout=gl.SliceLayout(1, layout))
    c = col0 + gl.arange(0, SLOT_ROWS, layout=gl.SliceLayout(0, layout))
    tok = gl.load(tokens_ptr + b, mask=b < B, other=0, cache_modifier=".cg")
    mask = (b < B)[:, None]
    rows = gl.load(embed_ptr + tok.to(gl.int64)[:, None] * H + c[None, :], mask=mask, other=0.0)
    gl.store(x_ptr + b[:, None] * H + c[None, :], rows, mask=mask)
    f = rows.to(gl.float32)
    gl.atomic_add(ss_ptr + b, gl.sum(f * f, axis=1), mask=b < B, sem="relaxed")


@gluon.jit
def _issue_kv(tiles, buf, k_base, v_base, k0, hi, keys, d, D: gl.constexpr):
    """cp.async of the key and value rows [k0, k0 + 64) below hi into buffer `buf` (rows past hi zero)."""
    offs = (k0 + keys)[:, None] * D + d[None, :]
    ok = (k0 + keys < hi)[:, None]
    async_copy.async_copy_global_to_shared(tiles.index(2 * buf), k_base + offs, mask=ok)
    async_copy.async_copy_global_to_shared(tiles.index(2 * buf + 1), v_base + offs, mask=ok)
    async_copy.commit_group()


@gluon.jit
def online_softmax(scores, m, l, o, o_layout: gl.constexpr):
    """One key block of the streaming softmax (base 2; scores already scaled, masked keys -inf):
    (p, the new running max, the new running sum, o rescaled to the new max). A row with no key
    seen yet keeps max -inf and weighs nothing."""
    m_new = gl.maximum(m, gl.max(scores, axis=1))
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(scores - m_safe[:, None])
    alpha = gl.exp2(m - m_safe)
    l = l * alpha + gl.sum(p, axis=1)
    o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    return p, m_new, l, o


@gluon.jit
def attend_chunk(q_ptr, kv_ptr, part_ml_ptr, part_acc_ptr, slot, lengths_ptr, layer, step, b, g, chunk, act,
                 ring, ready, empty, i, D: gl.constexpr, G: gl.constexpr, KVH: gl.constexpr, Q: gl.constexpr,
                 L: gl.constexpr, S: gl.constexpr, BATCH: gl.constexpr, QK_SCALE: gl.constexpr, GP: gl.constexpr,
                 CHUNKS: gl.constexpr, KV_BUFS: gl.constexpr, TOKENS: gl.constexpr, STAGES: gl.constexpr,
                 RING_KV: gl.constexpr):
    """One key chunk of (sequence b, KV head g) for its G query heads of each of its TOKENS tokens, on
    tensor cores: keys [lo, hi), chunk `chunk` of CHUNKS of the length + step + TOKENS keys in whole
    64-key blocks, token t seeing the keys up to its own position. The query rows (token t's head h
    is row t * G + h) are the first rows of a 64-row wgmma tile (register operand). With RING_KV the
    chunk's history blocks (ring.history_blocks) are already in the ring, streamed by the loader
    before the task's waits ended; the rest (all of it without RING_KV) come by cp.async into the
    activation buffer's shared memory (free while attention runs), KV_BUFS deep, so blocks
    j + 1 .. j + KV_BUFS - 1 are on their way while block j is multiplied. Leaves (m, l, unnormalised
    acc) in `slot`; returns the ring slots consumed."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    q_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, D], gl.bfloat16)
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    tiles = act._reinterpret(gl.bfloat16, [2 * KV_BUFS, 64, D], kv_layout)  # (K, V) per buffer
    r = gl.arange(0, 64, layout=gl.SliceLayout(1, ld))
    d = gl.arange(0, D, layout=gl.SliceLayout(0, ld))
    if TOKENS == 1:
        q = gl.load(q_ptr + b * Q + (g * G + r)[:, None] * D + d[None, :], mask=(r < G)[:, None], other=0.0,
                    cache_modifier=".cg")
    else:
        q = gl.load(q_ptr + (b * TOKENS + r // G)[:, None] * Q + (g * G + r % G)[:, None] * D + d[None, :],
                    mask=(r < G * TOKENS)[:, None], other=0.0, cache_modifier=".cg")
    q = gl.convert_layout(q.to(gl.bfloat16), q_layout)
    lo, hi, history = history_blocks(lengths_ptr, b, step, chunk, CHUNKS, TOKENS)
    if RING_KV:
        start = lo + history * 64  # the blocks from here come by cp.async
    else:
        start = lo
    n = gl.load(lengths_ptr + b) + step + TOKENS
    k_base = kv_ptr + ((layer * BATCH + b) * KVH + g).to(gl.int64) * S * D
    v_base = kv_ptr + (((L + layer) * BATCH + b) * KVH + g).to(gl.int64) * S * D
    key = gl.arange(0, 64, layout=gl.SliceLayout(0, s_layout))
    m = gl.full([64], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l = gl.zeros([64], gl.float32, layout=gl.SliceLayout(1, s_layout))
    o = gl.zeros([64, D], gl.float32, layout=o_layout)
    for j in gl.static_range(KV_BUFS - 1):  # the first KV_BUFS - 1 blocks (blocks past hi: zeros)
        _issue_kv(tiles, j, k_base, v_base, start + j * 64, hi, r, d, D)
    if RING_KV:  # the history, in the ring (every key visible to every token)
        for _j in range(history):
            k_tile, v_tile = kv_tiles(ring, i, STAGES, D)
            for t in gl.static_range(KV_SLOTS(D)):
                s, phase = ring_slot(i + t, STAGES)
                mbarrier.wait(ready.index(s), phase)
            scores = warpgroup_mma(q, k_tile.permute((1, 0)), gl.zeros([64, 64], gl.float32, layout=s_layout))
            p, m, l, o = online_softmax(scores * QK_SCALE, m, l, o, o_layout)
            o = warpgroup_mma(gl.convert_layout(p.to(gl.bfloat16), p_layout), v_tile, o)
            gl.thread_barrier()  # every warp's wgmma is done with the slots
            for t in gl.static_range(KV_SLOTS(D)):
                free_slot(empty, i + t, STAGES)
            i += KV_SLOTS(D)
    for k0 in range(start, hi, 64):
        block = (k0 - start) // 64
        buf = block % KV_BUFS
        if KV_BUFS > 1:  # block + KV_BUFS - 1 into the buffer the block before used (every warp is done with it)
            _issue_kv(tiles, (block + KV_BUFS - 1) % KV_BUFS, k_base, v_base, k0 + (KV_BUFS - 1) * 64, hi, r, d, D)
            async_copy.wait_group(KV_BUFS - 1)
        else:
            _issue_kv(tiles, 0, k_base, v_base, k0, hi, r, d, D)
            async_copy.wait_group(0)
        fence_async_shared()
        gl.thread_barrier()
        scores = warpgroup_mma(q, tiles.index(2 * buf).permute((1, 0)),
                               gl.zeros([64, 64], gl.float32, layout=s_layout))
        visible = (k0 + key < hi)[None, :]
        if TOKENS > 1:  # causal among the new tokens: row t * G + h sees keys up to n - TOKENS + t
            own = n - TOKENS + gl.arange(0, 64, layout=gl.SliceLayout(1, s_layout)) // G
            visible = visible & ((k0 + key)[None, :] <= own[:, None])
        scores = gl.where(visible, scores * QK_SCALE, float("-inf"))
        p, m, l, o = online_softmax(scores, m, l, o, o_layout)
        o = warpgroup_mma(gl.convert_layout(p.to(gl.bfloat16), p_layout), tiles.index(2 * buf + 1), o)
        gl.thread_barrier()  # every warp is done with this buffer before a later issue refills it
    async_copy.wait_group(0)  # the activation buffer is the GEMMs' again after this task
    gl.thread_barrier()
    rows = gl.arange(0, 64, layout=gl.SliceLayout(1, o_layout))
    dd = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
    live = rows < GP
    gl.store(part_ml_ptr + slot * 2 * GP + rows, gl.convert_layout(m, gl.SliceLayout(1, o_layout)), mask=live)
    gl.store(part_ml_ptr + slot * 2 * GP + GP + rows, gl.convert_layout(l, gl.SliceLayout(1, o_layout)), mask=live)
    gl.store(part_acc_ptr + (slot * GP + rows)[:, None] * D + dd[None, :], o, mask=live[:, None])
    return i


@gluon.jit
def _merge_chunks(part_ml_ptr, part_acc_ptr, first_slot, o_ptr, b, g, D: gl.constexpr, G: gl.constexpr,
                  Q: gl.constexpr, GP: gl.constexpr, CHUNKS: gl.constexpr, TOKENS: gl.constexpr):
    """o[b's rows, heads of g] from the CHUNKS partials (log-sum-exp rescale; an empty chunk weighs 0).
    The GP partial rows are the TOKENS x G query rows (token t's head h: row t * G + h), padded."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    d = gl.arange(0, D, layout=gl.SliceLayout(0, layout))
    heads = gl.arange(0, GP, layout=gl.SliceLayout(1, layout))
    m = gl.full([GP], float("-inf"), gl.float32, layout=gl.SliceLayout(1, layout))
    l = gl.zeros([GP], gl.float32, layout=gl.SliceLayout(1, layout))
    acc = gl.zeros([GP, D], gl.float32, layout=layout)
    for c in range(CHUNKS):
        slot = first_slot + c
        m_c = gl.load(part_ml_ptr + slot * 2 * GP + heads, cache_modifier=".cg")
        l_c = gl.load(part_ml_ptr + slot * 2 * GP + GP + heads, cache_modifier=".cg")
        a_c = gl.load(part_acc_ptr + (slot * GP + heads)[:, None] * D + d[None, :], cache_modifier=".cg")
        m_new = gl.maximum(m, m_c)
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        w_old = gl.exp2(m - m_safe)
        w_c = gl.exp2(m_c - m_safe)
        l = l * w_old + l_c * w_c
        acc = acc * w_old[:, None] + a_c * w_c[:, None]
        m = m_new
    out = acc / gl.where(l > 0.0, l, 1.0)[:, None]
    if TOKENS == 1:
        gl.store(o_ptr + b * Q + (g * G + heads)[:, None] * D + d[None, :], out.to(gl.bfloat16),
                 mask=(heads < G)[:, None])
    else:
        gl.store(o_ptr + (b * TOKENS + heads // G)[:, None] * Q + (g * G + heads % G)[:, None] * D + d[None, :],
                 out.to(gl.bfloat16), mask=(heads < G * TOKENS)[:, None])


# --------------------------------------------------------------------------------------------------
# The compute partition and the kernel
# --------------------------------------------------------------------------------------------------

@gluon.jit
def step_compute(ring, ready, empty, act, table_ptr, list_ptr, bounds_ptr, waits_ptr, counter_ptr, error_ptr,
                 spin_limit, B, tokens_in_ptr, tokens_ptr, lengths_ptr, embed_ptr, xs_ptr, xm_ptr, ssx_ptr,
                 ssm_ptr,
                 q_ptr, o_ptr, h_ptr, kv_ptr, s_qkv_ptr, s_o_ptr, s_gu_ptr, s_d_ptr, s_head_ptr, best_val_ptr,
                 best_idx_ptr, bias_ptr, qkn_ptr, inv_freq_ptr, part_ml_ptr, part_acc_ptr, stamps_ptr,
                 H: gl.constexpr, Q: gl.constexpr, F: gl.constexpr, V: gl.constexpr, D: gl.constexpr,
                 G: gl.constexpr, KVH: gl.constexpr, L: gl.constexpr, S: gl.constexpr, NQ: gl.constexpr,
                 NTH: gl.constexpr, BATCH: gl.constexpr, QK_NORM: gl.constexpr, STAGES: gl.constexpr, EPS: gl.constexpr,
                 QK_SCALE: gl.constexpr, GP: gl.constexpr, CHUNKS: gl.constexpr, STAMPS: gl.constexpr,
                 KV_BUFS: gl.constexpr, TOKENS: gl.constexpr, LOGITS: gl.constexpr, RPAD: gl.constexpr,
                 CHUNK: gl.constexpr, MMA_DEPTH: gl.constexpr, DIRECT_EPILOGUE: gl.constexpr, RING_KV: gl.constexpr,
                 COARSE: gl.constexpr):
    ROWS: gl.constexpr = BATCH * TOKENS  # activation rows a step: sequence b's token t is row b * TOKENS + t
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, RPAD, 16])
    epi: gl.constexpr = gl.BlockedLayout([1, 2], [2, 16], [4, 1], [1, 0])  # the split tiles' epilogues'
    pid = gl.program_id(0)
    i = 0  # ring slots consumed
    first = gl.load(bounds_ptr + pid)
    last = gl.load(bounds_ptr + pid + 1)
    task = gl.load(list_ptr + first, mask=first < last, other=0)
    vec = record(table_ptr, task)
    for n in range(first, last):
        # the next task's record is on its way while this one runs
        task_next = gl.load(list_ptr + gl.minimum(n + 1, last - 1))
        vec_next = record(table_ptr, task_next)
        if STAMPS:
            t_start = now(task)
        op = field(vec, C_OP)
        step = field(vec, C_STEP)
        layer = field(vec, C_LAYER)
        tile = field(vec, C_TILE)
        col0 = tile * SLOT_ROWS  # o_proj, down, lm_head and the embedding: 128-column tiles from 0
        w1_target = field(vec, C_W1T)
        if w1_target > 0:
            acquire(counter_ptr + field(vec, C_W1C), w1_target, error_ptr, spin_limit)
        wait_all(waits_ptr, field(vec, C_WOFF) + 1, field(vec, C_WCNT) - 1, counter_ptr, error_ptr, spin_limit)
        if STAMPS:
            gl.store(stamps_ptr + task * STAMP_COLS + S_START, t_start)
            gl.store(stamps_ptr + task * STAMP_COLS + S_MET, now(task))
        sl = step * L + layer  # this (step, layer)'s slot in the per-layer buffers
        sx = step * (L + 1) + layer
        if op == 0:
            if step == 0:
                tokens = tokens_in_ptr
            else:
                tokens = tokens_ptr + (step - 1) * RPAD
            _embed(embed_ptr, tokens, xs_ptr + step * (L + 1) * ROWS * H, ssx_ptr + step * (L + 1) * ROWS, col0,
                   B, H, RPAD)
            release(counter_ptr + field(vec, C_DONE))
        elif op == 2:
            b = field(vec, C_SEG)
            g = field(vec, C_HEAD0)
            first_slot = ((sl * BATCH + b) * KVH + g) * CHUNKS  # per (sequence, KV head)
            i = attend_chunk(q_ptr + sl * ROWS * Q, kv_ptr, part_ml_ptr, part_acc_ptr, first_slot + field(vec, C_KLO),
                             lengths_ptr, layer, step, b, g, field(vec, C_KLO), act, ring, ready, empty, i, D, G, KVH,
                             Q, L, S, BATCH, QK_SCALE, GP, CHUNKS, KV_BUFS, TOKENS, STAGES, RING_KV)
            if STAMPS:
                t_done = now(task)
                gl.store(stamps_ptr + task * STAMP_COLS + S_STAGED, t_done)
                gl.store(stamps_ptr + task * STAMP_COLS + S_MULTIPLIED, t_done)
            gl.thread_barrier()
            arrived = gl.atomic_add(counter_ptr + field(vec, C_PARTS), 1, sem="acq_rel", scope="gpu")
            if STAMPS:  # after the counter's answer: a scalar atomic's result is shared through a barrier
                gl.store(stamps_ptr + task * STAMP_COLS + S_ARRIVED, now(arrived))
            if arrived == CHUNKS - 1:  # the pair's last chunk in merges them
                _merge_chunks(part_ml_ptr, part_acc_ptr, first_slot, o_ptr + sl * ROWS * Q, b, g, D, G, Q, GP, CHUNKS,
                              TOKENS)
                release(counter_ptr + field(vec, C_DONE))
        else:
            k_lo = field(vec, C_KLO) * BK  # the table holds K in BK-column tiles
            n_k = field(vec, C_KHI) - field(vec, C_KLO)
            if DIRECT_EPILOGUE:  # a whole gate_up or lm_head tile (its K one task's): its epilogue on its accumulators
                direct = ((op == 4) | (op == 6)) & (field(vec, C_SPLITS) == 1)
            ss_at = _norm_squares(op, ssx_ptr, ssm_ptr, step, sl, sx, L, ROWS)
            if DIRECT_EPILOGUE:  # the norm's squares, before the product (a whole tile's epilogue follows it)
                ss_cols = _squares(ss_at, B, gl.SliceLayout(0, acc_layout), RPAD)
            else:
                ss_cols = 0.0
            if CHUNK == 0:  # the activation tiles hold every task's K
                _stage(op, act, xs_ptr, xm_ptr, o_ptr, h_ptr, step, sl, sx, B, k_lo, n_k, H, Q, F, L, ROWS, RPAD)
                if STAMPS:
                    gl.store(stamps_ptr + task * STAMP_COLS + S_STAGED, now(task))
                if (op == 1) | (op == 4):
                    acc1, acc2, i = paired_tile(ring, ready, empty, act, i, n_k, STAGES, MMA_DEPTH,
                                                gl.zeros((HALF, RPAD), dtype=gl.float32, layout=acc_layout),
                                                gl.zeros((HALF, RPAD), dtype=gl.float32, layout=acc_layout))
                    if DIRECT_EPILOGUE:
                        _paired_out(op, acc1, acc2, direct, s_qkv_ptr, s_gu_ptr, h_ptr, sl, tile, B, H, NQ, F, EPS,
                                    ROWS, RPAD, ss_cols)
                    else:
                        _add_paired(op, acc1, acc2, s_qkv_ptr, s_gu_ptr, sl, tile, B, NQ, F, ROWS, RPAD)
                else:
                    acc, i = single_tile(ring, ready, empty, act, i, n_k, STAGES, MMA_DEPTH,
                                         gl.zeros((SLOT_ROWS, RPAD), dtype=gl.float32, layout=acc_layout))
                    if DIRECT_EPILOGUE:
                        _single_out(op, acc, direct, s_o_ptr, s_d_ptr, s_head_ptr, best_val_ptr, best_idx_ptr, step,
                                    sl, tile, col0, B, H, V, NTH, EPS, LOGITS, ROWS, RPAD, ss_cols)
                    else:
                        _add_single(op, acc, s_o_ptr, s_d_ptr, s_head_ptr, step, sl, col0, B, H, NTH, ROWS, RPAD)
            else:  # they hold CHUNK K tiles: the task's K is staged and multiplied CHUNK tiles at a time
                if STAMPS:  # staging and multiplying interleave: the whole product counts as multiplying
                    gl.store(stamps_ptr + task * STAMP_COLS + S_STAGED, now(task))
                if (op == 1) | (op == 4):
                    acc1 = gl.zeros((HALF, RPAD), dtype=gl.float32, layout=acc_layout)
                    acc2 = gl.zeros((HALF, RPAD), dtype=gl.float32, layout=acc_layout)
                    for c0 in range(0, n_k, CHUNK):
                        m = gl.minimum(n_k - c0, CHUNK)
                        _stage(op, act, xs_ptr, xm_ptr, o_ptr, h_ptr, step, sl, sx, B, k_lo + c0 * BK, m, H, Q, F, L,
                               ROWS, RPAD)
                        acc1, acc2, i = paired_tile(ring, ready, empty, act, i, m, STAGES, MMA_DEPTH, acc1, acc2)
                    if DIRECT_EPILOGUE:
                        _paired_out(op, acc1, acc2, direct, s_qkv_ptr, s_gu_ptr, h_ptr, sl, tile, B, H, NQ, F, EPS,
                                    ROWS, RPAD, ss_cols)
                    else:
                        _add_paired(op, acc1, acc2, s_qkv_ptr, s_gu_ptr, sl, tile, B, NQ, F, ROWS, RPAD)
                else:
                    acc = gl.zeros((SLOT_ROWS, RPAD), dtype=gl.float32, layout=acc_layout)
                    for c0 in range(0, n_k, CHUNK):
                        m = gl.minimum(n_k - c0, CHUNK)
                        _stage(op, act, xs_ptr, xm_ptr, o_ptr, h_ptr, step, sl, sx, B, k_lo + c0 * BK, m, H, Q, F, L,
                               ROWS, RPAD)
                        acc, i = single_tile(ring, ready, empty, act, i, m, STAGES, MMA_DEPTH, acc)
                    if DIRECT_EPILOGUE:
                        _single_out(op, acc, direct, s_o_ptr, s_d_ptr, s_head_ptr, best_val_ptr, best_idx_ptr, step,
                                    sl, tile, col0, B, H, V, NTH, EPS, LOGITS, ROWS, RPAD, ss_cols)
                    else:
                        _add_single(op, acc, s_o_ptr, s_d_ptr, s_head_ptr, step, sl, col0, B, H, NTH, ROWS, RPAD)
            if STAMPS:
                gl.store(stamps_ptr + task * STAMP_COLS + S_MULTIPLIED, now(task))
            if COARSE:  # a split tile's epilogue inputs, in flight while its pieces are counted
                ss_rows = _squares(ss_at, B, gl.SliceLayout(1, epi), RPAD)
                q_b1, q_b2, q_len, q_w1, q_w2, q_freq = _qkv_inputs(op == 1, bias_ptr, qkn_ptr, inv_freq_ptr,
                                                                    lengths_ptr, layer, tile, field(vec, C_SEG), B,
                                                                    NQ, D, QK_NORM, TOKENS, RPAD)
            gl.thread_barrier()
            if DIRECT_EPILOGUE:
                if direct:  # its epilogue already ran on its accumulators: no pieces to count
                    arrived = field(vec, C_SPLITS) - 1
                else:
                    arrived = gl.atomic_add(counter_ptr + field(vec, C_PARTS), 1, sem="acq_rel", scope="gpu")
            else:
                arrived = gl.atomic_add(counter_ptr + field(vec, C_PARTS), 1, sem="acq_rel", scope="gpu")
            if STAMPS:
                gl.store(stamps_ptr + task * STAMP_COLS + S_ARRIVED, now(arrived))
            if arrived == field(vec, C_SPLITS) - 1:  # the tile's last slice: its epilogue
                wait_all(waits_ptr, field(vec, C_FOFF), field(vec, C_FCNT), counter_ptr, error_ptr, spin_limit)
                if not COARSE:  # a table of per-tile waits: the rows' squares are complete only now
                    ss_rows = _squares(ss_at, B, gl.SliceLayout(1, epi), RPAD)
                    q_b1, q_b2, q_len, q_w1, q_w2, q_freq = _qkv_inputs(op == 1, bias_ptr, qkn_ptr, inv_freq_ptr,
                                                                        lengths_ptr, layer, tile, field(vec, C_SEG),
                                                                        B, NQ, D, QK_NORM, TOKENS, RPAD)
                if op == 1:
                    _qkv_epilogue(s_qkv_ptr + sl * ROWS * NQ * SLOT_ROWS, ss_rows, q_b1, q_b2, q_len, q_w1, q_w2,
                                  q_freq, q_ptr + sl * ROWS * Q, kv_ptr, layer, step, tile, field(vec, C_SEG),
                                  field(vec, C_HEAD0), B, H, NQ, Q, D, KVH, L, S, BATCH, QK_NORM, EPS, TOKENS, RPAD)
                elif op == 3:
                    _residual_epilogue(s_o_ptr + sl * ROWS * H, xs_ptr + sx * ROWS * H, xm_ptr + sl * ROWS * H,
                                       ssm_ptr + sl * ROWS, col0, B, H, RPAD)
                elif op == 4:
                    if (not DIRECT_EPILOGUE) or field(vec, C_SPLITS) > 1:  # else it ran on the accumulators
                        _gate_up_epilogue(s_gu_ptr + sl * ROWS * 2 * F, ss_rows, h_ptr + sl * ROWS * F, tile, B, H, F,
                                          EPS, RPAD)
                elif op == 5:
                    _residual_epilogue(s_d_ptr + sl * ROWS * H, xm_ptr + sl * ROWS * H,
                                       xs_ptr + (sx + 1) * ROWS * H, ssx_ptr + (sx + 1) * ROWS, col0, B, H, RPAD)
                elif (not DIRECT_EPILOGUE) or field(vec, C_SPLITS) > 1:
                    _head_epilogue(s_head_ptr + step * ROWS * NTH * SLOT_ROWS, ss_rows, best_val_ptr + step * NTH * RPAD,
                                   best_idx_ptr + step * NTH * RPAD, tile, B, H, V, NTH, EPS, LOGITS, RPAD)
                if op == 6:
                    gl.thread_barrier()
                    done = gl.atomic_add(counter_ptr + field(vec, C_DONE), 1, sem="acq_rel", scope="gpu")
                    if done == NTH - 1:  # every tile's partial is in: the step's tokens
                        _reduce_tokens(best_val_ptr + step * NTH * RPAD, best_idx_ptr + step * NTH * RPAD,
                                       tokens_ptr + step * RPAD, B, NTH, RPAD)
                        release(counter_ptr + field(vec, C_TOKEN))
                else:
                    release(counter_ptr + field(vec, C_DONE))
        if STAMPS:
            gl.store(stamps_ptr + task * STAMP_COLS + S_END, now(task))
        task = task_next
        vec = vec_next


@gluon.jit
def step_kernel(qkv_desc, o_desc, gu_desc, d_desc, head_desc, kv_desc, table_ptr, list_ptr, bounds_ptr, waits_ptr, counter_ptr,
                error_ptr, spin_limit, B, tokens_in_ptr, tokens_ptr, lengths_ptr, embed_ptr, xs_ptr, xm_ptr,
                ssx_ptr,
                ssm_ptr, q_ptr, o_ptr, h_ptr, kv_ptr, s_qkv_ptr, s_o_ptr, s_gu_ptr, s_d_ptr, s_head_ptr, best_val_ptr,
                best_idx_ptr, bias_ptr, qkn_ptr, inv_freq_ptr, part_ml_ptr, part_acc_ptr, stamps_ptr,  #
                H: gl.constexpr, Q: gl.constexpr, F: gl.constexpr, V: gl.constexpr, D: gl.constexpr,
                G: gl.constexpr, KVH: gl.constexpr, L: gl.constexpr, S: gl.constexpr, NQ: gl.constexpr,
                NTH: gl.constexpr, BATCH: gl.constexpr, QK_NORM: gl.constexpr, STAGES: gl.constexpr,
                KT_MAX: gl.constexpr, EPS: gl.constexpr, QK_SCALE: gl.constexpr, GP: gl.constexpr,
                CHUNKS: gl.constexpr, STAMPS: gl.constexpr, KV_BUFS: gl.constexpr, TOKENS: gl.constexpr,
                LOGITS: gl.constexpr, RPAD: gl.constexpr, CHUNK: gl.constexpr, MMA_DEPTH: gl.constexpr,
                DIRECT_EPILOGUE: gl.constexpr, RING_KV: gl.constexpr, COARSE: gl.constexpr):
    ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, SLOT_ROWS, BK], qkv_desc.layout)
    act_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([RPAD, BK], gl.bfloat16)
    act = gl.allocate_shared_memory(gl.bfloat16, [KT_MAX, RPAD, BK], act_layout)
    ready, empty = ring_barriers(STAGES)
    gl.warp_specialize([
        (step_compute, (ring, ready, empty, act, table_ptr, list_ptr, bounds_ptr, waits_ptr, counter_ptr, error_ptr,
                        spin_limit, B, tokens_in_ptr, tokens_ptr, lengths_ptr, embed_ptr, xs_ptr, xm_ptr,
                        ssx_ptr,
                        ssm_ptr, q_ptr, o_ptr, h_ptr, kv_ptr, s_qkv_ptr, s_o_ptr, s_gu_ptr, s_d_ptr, s_head_ptr,
                        best_val_ptr, best_idx_ptr, bias_ptr, qkn_ptr, inv_freq_ptr, part_ml_ptr, part_acc_ptr,
                        stamps_ptr, H, Q, F, V, D, G, KVH, L, S, NQ, NTH, BATCH, QK_NORM, STAGES, EPS, QK_SCALE, GP,
                        CHUNKS, STAMPS, KV_BUFS, TOKENS, LOGITS, RPAD, CHUNK, MMA_DEPTH, DIRECT_EPILOGUE, RING_KV,
                        COARSE)),
        (step_loader, (qkv_desc, o_desc, gu_desc, d_desc, head_desc, kv_desc, ring, ready, empty, table_ptr,
                       list_ptr, bounds_ptr, lengths_ptr, stamps_ptr, STAGES, STAMPS, RING_KV, D, KVH, L, S, BATCH,
                       CHUNKS, TOKENS)),
    ], [1], [40])


