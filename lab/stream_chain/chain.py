"""Lab experiment (not product code; nothing in conjugate/ imports it): a dependent chain of the draft
model's decode step as ONE persistent, warp-specialized Gluon kernel, to learn whether weights can
stream at close to copy bandwidth while activations wait on other programs.

The chain is L of the draft's pre-norm MLP blocks with their residual, for B <= 16 rows (Llama-3.2-1B:
H=2048, I=8192). RMSNorm costs no pass of its own: its weight is folded into Wg and Wu, each x_l's
summed squares per row are added up by the programs that write x_l's tiles, and stage 1 scales its
finished dot products by the row's 1 / rms.

    h_l = silu(n_l Wg_l^T) * (n_l Wu_l^T)   n_l = rmsnorm(x_l); stage 1: I / 64 tasks, one 64-column tile of h each
    x_{l+1} = x_l + h_l Wd_l^T              stage 2: (H / 128) x S2 tasks, a 128-column tile over one
                                            S2-th of I; fp32 atomics sum the partials, the last one
                                            in adds the residual and publishes the tile

`--merged` makes the block one stage (lab/step_stages: fewer stages): a task computes its 64-column
tile of h and at once multiplies it by the 64 columns of Wd it meets (every output column, K = 64),
adding the product into x_{l+1}'s fp32 sums; no program waits between the two GEMMs, only for the
layer before. The last task of a layer in adds the residual to all of x_{l+1} (TAIL_COLS columns a
load trip) and publishes it. `--forms folded` is the same block with no last task (lab/step_stages:
the consumer applies the epilogue): a task only adds its partials and releases the layer's counter;
the next layer's tasks, once every task is in, stage x_{l+1} = bf16(x_l + sums) themselves (FOLD_TILES
K tiles a load trip) and take its norm from the whole row; the layer's first task stores x_{l+1} for
the residual after it.

Each program (one per SM, all co-resident) runs two partitions:

* the **loader** (1 warp) streams every weight tile the program will need, layer after layer, by TMA
  into a ring of shared-memory slots. It waits only for free slots, never on a dependency, so the
  next stage's weights are already arriving while the previous stage is being finished elsewhere;
* the **compute** partition (one warpgroup) stages activations by cp.async into shared memory, runs
  swap-AB wgmma (W tile [rows, 64] x act^T [64, 16]), and talks to other programs through counters:
  release after writing, acquire (a bounded spin) before reading. A wait that runs out records an
  error and goes on, so a wrong schedule is a failed check, never a hung GPU.

    python lab/stream_chain/chain.py --json OUT.json   # Hopper GPU: check, then time beside torch
    python lab/stream_chain/chain.py --forms staged merged --layers 16 --json OUT.json   # both, one process
    python lab/stream_chain/chain.py --offline         # no GPU: compile for sm_90a, read the PTX
    python -m pytest -q lab/stream_chain               # CPU: the schedule simulated against the reference
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

ROWS_PER_SLOT = 128  # weight rows a ring slot holds: stage 1 puts 64 gate rows over 64 up rows
K_PER_SLOT = 64      # K per slot: 128 bytes of bf16, the TMA box's inner limit under 128-byte swizzle
BATCH_PAD = 16       # batch rows as the wgmma N dimension (B <= 16)
# The same, as the kernel sees them.
SLOT_ROWS = gl.constexpr(ROWS_PER_SLOT)
HALF = gl.constexpr(ROWS_PER_SLOT // 2)
BK = gl.constexpr(K_PER_SLOT)
BPAD = gl.constexpr(BATCH_PAD)
EPS = gl.constexpr(1e-5)  # RMSNorm's epsilon
# The merged form's last task finishes all of x_{l+1} alone, one load trip a tile: 256 columns a tile
# halve llama-3.2-1b's 16 trips (128 columns) and keep the tile's fp32 sums at 32 registers a thread.
TAIL_COLS = gl.constexpr(256)
FOLD_TILES = 4  # the folded form's K tiles a load trip as it stages x (x and the sums of four 64-column tiles)
SMEM_BUDGET = 220 * 1024

# The weight ring, activation staging, GEMM tiles and bounded acquire this probe grew are the
# product's step kernel's now (conjugate/kernels/step/ring.py; its acquire stops spinning once any
# spin ran out); the probe imports them from there.
from conjugate.kernels.step.ring import _fill_slot, ring_barriers  # noqa: E402,F401
from conjugate.kernels.step.ring import ring_slot as _slot  # noqa: E402,F401
from conjugate.kernels.step.ring import paired_tile as _gate_up_tile  # noqa: E402,F401
from conjugate.kernels.step.ring import acquire as _acquire  # noqa: E402,F401
from conjugate.kernels.step.ring import release as _release  # noqa: E402,F401
from conjugate.kernels.step.ring import single_tile as _down_tile  # noqa: E402,F401
from conjugate.kernels.step.ring import stage_activations as _stage_activations  # noqa: E402,F401

# Draft MLPs (H, I) this probe runs.
MODELS = {"llama-3.2-1b": (2048, 8192), "llama-3.2-3b": (3072, 8192), "qwen3-0.6b": (1024, 3072),
          "qwen2.5-0.5b": (896, 4864)}


# --------------------------------------------------------------------------------------------------
# The kernel, one concern per function
# --------------------------------------------------------------------------------------------------

@gluon.jit
def load_partition(w1_desc, w2_desc, ring, ready, empty, H: gl.constexpr, I: gl.constexpr, S1: gl.constexpr,
                   S2: gl.constexpr, L: gl.constexpr, STAGES: gl.constexpr, MERGED: gl.constexpr):
    """Stream this program's weight tiles of every layer, in the order the compute partition consumes
    them. It waits for free slots only: layer l+1's weights arrive while layer l is being finished."""
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    T1: gl.constexpr = I // HALF
    KR1: gl.constexpr = H // S1
    NT2: gl.constexpr = H // SLOT_ROWS
    KR2: gl.constexpr = I // S2
    i = 0
    for layer in range(L):
        if MERGED:  # one task: its h tile's gate and up rows, then the 64 columns of Wd it meets
            for t in range(pid, T1, programs):
                row = layer * 2 * I + t * HALF
                for kk in range(H // BK):
                    s = _fill_slot(ring, ready, empty, i, STAGES)
                    slot = ring.index(s)
                    tma.async_copy_global_to_shared(w1_desc, [row, kk * BK], ready.index(s), slot.slice(0, HALF))
                    tma.async_copy_global_to_shared(w1_desc, [row + I, kk * BK], ready.index(s), slot.slice(HALF, HALF))
                    i += 1
                for n in range(NT2):
                    s = _fill_slot(ring, ready, empty, i, STAGES)
                    tma.async_copy_global_to_shared(w2_desc, [layer * H + n * SLOT_ROWS, t * HALF], ready.index(s),
                                                    ring.index(s))
                    i += 1
        else:
            for t in range(pid, T1 * S1, programs):  # stage 1: gate rows over up rows in one slot
                row = layer * 2 * I + (t % T1) * HALF
                for kk in range(KR1 // BK):
                    col = (t // T1) * KR1 + kk * BK
                    s = _fill_slot(ring, ready, empty, i, STAGES)
                    slot = ring.index(s)
                    tma.async_copy_global_to_shared(w1_desc, [row, col], ready.index(s), slot.slice(0, HALF))
                    tma.async_copy_global_to_shared(w1_desc, [row + I, col], ready.index(s), slot.slice(HALF, HALF))
                    i += 1
            for t in range(pid, NT2 * S2, programs):  # stage 2: down-projection rows over one slice of I
                row = layer * H + (t % NT2) * SLOT_ROWS
                for kk in range(KR2 // BK):
                    s = _fill_slot(ring, ready, empty, i, STAGES)
                    tma.async_copy_global_to_shared(w2_desc, [row, (t // NT2) * KR2 + kk * BK], ready.index(s),
                                                    ring.index(s))
                    i += 1


@gluon.jit
def _row_rstd(ss_ptr, B, H: gl.constexpr, acc_layout: gl.constexpr):
    """RMSNorm's 1 / rms of each batch row (the accumulators' columns), from the row's summed squares.
    Scaling the finished dot products by it is the norm: x_norm W^T = rstd * (x W^T), and the norm's
    weight is folded into W's columns on the host."""
    b = gl.arange(0, BPAD, layout=gl.SliceLayout(0, acc_layout))
    ss = gl.load(ss_ptr + b, mask=b < B, other=0.0, cache_modifier=".cg")
    return gl.rsqrt(ss / H + EPS)


@gluon.jit
def _store_h(h_ptr, acc_g, acc_u, col0, B, I: gl.constexpr):
    """h[b, col0 + r] = silu(g) * u, from the transposed accumulators (row r, column b); -> the bf16 tile."""
    r = gl.arange(0, HALF, layout=gl.SliceLayout(1, acc_g.type.layout))
    b = gl.arange(0, BPAD, layout=gl.SliceLayout(0, acc_g.type.layout))
    h = (acc_g / (1.0 + gl.exp(-acc_g)) * acc_u).to(gl.bfloat16)
    gl.store(h_ptr + b[None, :] * I + (col0 + r)[:, None], h, mask=(b < B)[None, :])
    return h


@gluon.jit
def _add_gate_up_partial(gu_ptr, acc_g, acc_u, col0, B, I: gl.constexpr):
    """gu[b, col0 + r] += g[r, b] and gu[b, I + col0 + r] += u[r, b] (stage 1 split over S1 slices of H)."""
    r = gl.arange(0, HALF, layout=gl.SliceLayout(1, acc_g.type.layout))
    b = gl.arange(0, BPAD, layout=gl.SliceLayout(0, acc_g.type.layout))
    offsets = b[None, :] * (2 * I) + (col0 + r)[:, None]
    mask = (b < B)[None, :]
    gl.atomic_add(gu_ptr + offsets, acc_g, mask=mask, sem="relaxed")
    gl.atomic_add(gu_ptr + I + offsets, acc_u, mask=mask, sem="relaxed")


@gluon.jit
def _finish_h(gu_ptr, h_ptr, col0, B, I: gl.constexpr):
    """h[:, tile] = silu(g) * u from the summed partials, once all S1 of them are in."""
    layout: gl.constexpr = gl.BlockedLayout([1, 2], [2, 16], [4, 1], [1, 0])
    b = gl.arange(0, BPAD, layout=gl.SliceLayout(1, layout))
    c = col0 + gl.arange(0, HALF, layout=gl.SliceLayout(0, layout))
    mask = (b < B)[:, None] & (c < I)[None, :]
    g = gl.load(gu_ptr + b[:, None] * (2 * I) + c[None, :], mask=mask, cache_modifier=".cg")
    u = gl.load(gu_ptr + I + b[:, None] * (2 * I) + c[None, :], mask=mask, cache_modifier=".cg")
    h = g / (1.0 + gl.exp(-g)) * u
    gl.store(h_ptr + b[:, None] * I + c[None, :], h.to(gl.bfloat16), mask=mask)


@gluon.jit
def _add_partial(sum_ptr, acc, col0, B, H: gl.constexpr):
    """sums[b, col0 + r] += acc[r, b]: fp32 atomics, S2 programs add into each output tile."""
    r = gl.arange(0, SLOT_ROWS, layout=gl.SliceLayout(1, acc.type.layout))
    b = gl.arange(0, BPAD, layout=gl.SliceLayout(0, acc.type.layout))
    gl.atomic_add(sum_ptr + b[None, :] * H + (col0 + r)[:, None], acc, mask=(b < B)[None, :], sem="relaxed")


@gluon.jit
def _finish_tile(sum_ptr, x_ptr, x_next_ptr, ss_next_ptr, col0, B, H: gl.constexpr, COLS: gl.constexpr):
    """x_next[:, tile] = bf16(x[:, tile] + sums[:, tile]) over COLS columns from col0 (those past H
    masked): the residual, once all partials are in; the tile's squares are added into each row's sum
    for the next layer's norm."""
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [4, 1], [1, 0])
    b = gl.arange(0, BPAD, layout=gl.SliceLayout(1, layout))
    c = col0 + gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))
    offsets = b[:, None] * H + c[None, :]
    mask = (b < B)[:, None] & (c < H)[None, :]
    total = gl.load(sum_ptr + offsets, mask=mask, cache_modifier=".cg")
    total += gl.load(x_ptr + offsets, mask=mask, cache_modifier=".cg").to(gl.float32)
    out = total.to(gl.bfloat16)
    gl.store(x_next_ptr + offsets, out, mask=mask)
    rounded = out.to(gl.float32)
    gl.atomic_add(ss_next_ptr + b, gl.sum(rounded * rounded, axis=1), mask=b < B, sem="relaxed")


@gluon.jit
def _h_times_down(ring, ready, empty, act, i, acc_g, acc_u, layer_h, layer_sums, col0, B, H: gl.constexpr,
                  I: gl.constexpr, STAGES: gl.constexpr, acc_layout: gl.constexpr):
    """A one-stage task's second half: its h tile (from the normed gate and up accumulators) into act's
    first tile, times the 64 columns of Wd it meets, H / 128 slots, added into the fp32 sums."""
    h = _store_h(layer_h, acc_g, acc_u, col0, B, I)  # stored too, for the check's per-layer errors
    act.index(0).store(gl.permute(h, (1, 0)))  # the h tile as the down GEMM's [BPAD, 64] operand
    fence_async_shared()
    gl.thread_barrier()
    for n in range(H // SLOT_ROWS):
        acc, i = _down_tile(ring, ready, empty, act, i, 1, STAGES, 1,
                            gl.zeros((SLOT_ROWS, BPAD), dtype=gl.float32, layout=acc_layout))
        _add_partial(layer_sums, acc, n * SLOT_ROWS, B, H)
    return i


@gluon.jit
def _merged_layer(ring, ready, empty, act, i, x_ptr, layer_h, layer_sums, ss_ptr, ss_next_ptr, parts_ptr, x_done_ptr, B,
                  H: gl.constexpr, I: gl.constexpr, STAGES: gl.constexpr, acc_layout: gl.constexpr):
    """One layer's MLP block as one stage: each task this program owns makes its 64-column h tile
    and adds h_tile @ Wd[:, tile]^T into every output column's fp32 sums; the layer's last task in
    adds the residual to all of x_{l+1} and publishes it (x_done)."""
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    T1: gl.constexpr = I // HALF
    for t in range(pid, T1, programs):
        _stage_activations(act, x_ptr, H, B, 0, H // BK, BPAD)
        acc_g, acc_u, i = _gate_up_tile(ring, ready, empty, act, i, H // BK, STAGES, 1,
                                        gl.zeros((HALF, BPAD), dtype=gl.float32, layout=acc_layout),
                                        gl.zeros((HALF, BPAD), dtype=gl.float32, layout=acc_layout))
        rstd = _row_rstd(ss_ptr, B, H, acc_layout)[None, :]
        i = _h_times_down(ring, ready, empty, act, i, acc_g * rstd, acc_u * rstd, layer_h, layer_sums, t * HALF, B, H,
                          I, STAGES, acc_layout)
        gl.thread_barrier()
        arrived = gl.atomic_add(parts_ptr, 1, sem="acq_rel", scope="gpu")
        if arrived == T1 - 1:  # the layer's last task: every partial is in; its loads a TAIL_COLS-wide
            for c0 in range(0, H, TAIL_COLS):  # tile at a time (each tile's loads are one trip)
                _finish_tile(layer_sums, x_ptr, x_ptr + B * H, ss_next_ptr, c0, B, H, TAIL_COLS)
            _release(x_done_ptr)
    return i


@gluon.jit
def _fold_put(act, x_out_ptr, write_x, x, sums, kk, rows, cols, mask, KT: gl.constexpr, H: gl.constexpr):
    """K tile kk of x_{l+1} = bf16(x + sums) into act[kk] (and x_out with write_x); -> its rows'
    summed squares (zero past the last K tile)."""
    ss = gl.zeros([BPAD], gl.float32, layout=gl.SliceLayout(1, x.type.layout))
    if kk < KT:
        new = (x.to(gl.float32) + sums).to(gl.bfloat16)
        act.index(kk).store(new)
        if write_x:
            gl.store(x_out_ptr + rows[:, None] * H + (kk * BK + cols)[None, :], new, mask=mask)
        rounded = new.to(gl.float32)
        ss = gl.sum(rounded * rounded, axis=1)
    return ss


@gluon.jit
def _stage_folded(act, x_ptr, sum_ptr, x_out_ptr, write_x, B, H: gl.constexpr, acc_layout: gl.constexpr):
    """act[kk] = bf16(x + sums) over the whole row, FOLD_TILES (four) K tiles a load trip: every load of
    a group is issued before any is used. -> each row's 1 / rms of the rounded row, as the
    accumulators' columns."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    KT: gl.constexpr = H // BK
    rows = gl.arange(0, BPAD, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, BK, layout=gl.SliceLayout(0, layout))
    mask = (rows < B)[:, None] & (cols < BK)[None, :]
    ss = gl.zeros([BPAD], gl.float32, layout=gl.SliceLayout(1, layout))
    for k0 in range(0, KT, 4):
        offs = rows[:, None] * H + (k0 * BK + cols)[None, :]
        m0 = mask
        m1 = mask & (k0 + 1 < KT)
        m2 = mask & (k0 + 2 < KT)
        m3 = mask & (k0 + 3 < KT)
        x0 = gl.load(x_ptr + offs, mask=m0, other=0.0, cache_modifier=".cg")
        s0 = gl.load(sum_ptr + offs, mask=m0, other=0.0, cache_modifier=".cg")
        x1 = gl.load(x_ptr + offs + BK, mask=m1, other=0.0, cache_modifier=".cg")
        s1 = gl.load(sum_ptr + offs + BK, mask=m1, other=0.0, cache_modifier=".cg")
        x2 = gl.load(x_ptr + offs + 2 * BK, mask=m2, other=0.0, cache_modifier=".cg")
        s2 = gl.load(sum_ptr + offs + 2 * BK, mask=m2, other=0.0, cache_modifier=".cg")
        x3 = gl.load(x_ptr + offs + 3 * BK, mask=m3, other=0.0, cache_modifier=".cg")
        s3 = gl.load(sum_ptr + offs + 3 * BK, mask=m3, other=0.0, cache_modifier=".cg")
        ss += _fold_put(act, x_out_ptr, write_x, x0, s0, k0, rows, cols, mask, KT, H)
        ss += _fold_put(act, x_out_ptr, write_x, x1, s1, k0 + 1, rows, cols, mask, KT, H)
        ss += _fold_put(act, x_out_ptr, write_x, x2, s2, k0 + 2, rows, cols, mask, KT, H)
        ss += _fold_put(act, x_out_ptr, write_x, x3, s3, k0 + 3, rows, cols, mask, KT, H)
    fence_async_shared()
    gl.thread_barrier()
    rstd = gl.rsqrt(ss / H + EPS)
    return gl.convert_layout(rstd, gl.SliceLayout(0, acc_layout))


@gluon.jit
def _folded_layer(ring, ready, empty, act, i, x_ptr, ss0_ptr, layer_h, layer_sums, parts_ptr, layer, B, H: gl.constexpr,
                  I: gl.constexpr, STAGES: gl.constexpr, acc_layout: gl.constexpr):
    """One layer's MLP block as one stage with no last task: each task stages x_l itself (layer 0: x_0
    and its given squares; later: bf16(x_{l-1} + the layer before's sums), the layer's first task
    storing it), makes its h tile, adds h_tile @ Wd[:, tile]^T into the fp32 sums and releases the
    layer's counter."""
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    T1: gl.constexpr = I // HALF
    for t in range(pid, T1, programs):
        if layer == 0:
            _stage_activations(act, x_ptr, H, B, 0, H // BK, BPAD)
            rstd = _row_rstd(ss0_ptr, B, H, acc_layout)
        else:  # x_l = x_{l-1} + the layer before's sums, x_l stored by the layer's first task
            rstd = _stage_folded(act, x_ptr - B * H, layer_sums - B * H, x_ptr, t == 0, B, H, acc_layout)
        acc_g, acc_u, i = _gate_up_tile(ring, ready, empty, act, i, H // BK, STAGES, 1,
                                        gl.zeros((HALF, BPAD), dtype=gl.float32, layout=acc_layout),
                                        gl.zeros((HALF, BPAD), dtype=gl.float32, layout=acc_layout))
        gl.thread_barrier()  # every warp's reads of act (the product) done before it is overwritten
        i = _h_times_down(ring, ready, empty, act, i, acc_g * rstd[None, :], acc_u * rstd[None, :], layer_h,
                          layer_sums, t * HALF, B, H, I, STAGES, acc_layout)
        _release(parts_ptr)
    return i


@gluon.jit
def _staged_layer(ring, ready, empty, act, i, x_ptr, layer_h, layer_sums, gu_ptr, ss_ptr, h_done, parts1, parts2, x_done,
                  layer, B, error_ptr, spin_limit, H: gl.constexpr, I: gl.constexpr, S1: gl.constexpr,
                  S2: gl.constexpr, STAGES: gl.constexpr, acc_layout: gl.constexpr):
    """One layer's MLP block as two stages: the program's stage-1 tasks (h tiles, or their slices of
    H), then its stage-2 tasks (an output tile over one slice of I, once that slice of h is in)."""
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    T1: gl.constexpr = I // HALF
    KR1: gl.constexpr = H // S1
    KR2: gl.constexpr = I // S2
    NT2: gl.constexpr = H // SLOT_ROWS
    for t in range(pid, T1 * S1, programs):
        n = t % T1
        _stage_activations(act, x_ptr, H, B, (t // T1) * KR1, KR1 // BK, BPAD)
        acc_g, acc_u, i = _gate_up_tile(ring, ready, empty, act, i, KR1 // BK, STAGES, 1,
                                        gl.zeros((HALF, BPAD), dtype=gl.float32, layout=acc_layout),
                                        gl.zeros((HALF, BPAD), dtype=gl.float32, layout=acc_layout))
        rstd = _row_rstd(ss_ptr + layer * B, B, H, acc_layout)[None, :]
        acc_g *= rstd
        acc_u *= rstd
        if S1 == 1:
            _store_h(layer_h, acc_g, acc_u, n * HALF, B, I)
            _release(h_done + layer * S2 + (n * HALF) // KR2)
        else:
            layer_gu = gu_ptr + layer * B * 2 * I
            _add_gate_up_partial(layer_gu, acc_g, acc_u, n * HALF, B, I)
            gl.thread_barrier()
            arrived = gl.atomic_add(parts1 + layer * T1 + n, 1, sem="acq_rel", scope="gpu")
            if arrived == S1 - 1:  # the last partial of this h tile: finish it and publish it
                _finish_h(layer_gu, layer_h, n * HALF, B, I)
                _release(h_done + layer * S2 + (n * HALF) // KR2)
    for t in range(pid, NT2 * S2, programs):
        ks = t // NT2
        col0 = (t % NT2) * SLOT_ROWS
        _acquire(h_done + layer * S2 + ks, KR2 // HALF, error_ptr, spin_limit)
        _stage_activations(act, layer_h, I, B, ks * KR2, KR2 // BK, BPAD)
        acc, i = _down_tile(ring, ready, empty, act, i, KR2 // BK, STAGES, 1,
                            gl.zeros((SLOT_ROWS, BPAD), dtype=gl.float32, layout=acc_layout))
        _add_partial(layer_sums, acc, col0, B, H)
        gl.thread_barrier()
        arrived = gl.atomic_add(parts2 + layer * NT2 + t % NT2, 1, sem="acq_rel", scope="gpu")
        if arrived == S2 - 1:  # the last partial of this tile: finish it and publish it
            _finish_tile(layer_sums, x_ptr, x_ptr + B * H, ss_ptr + (layer + 1) * B, col0, B, H, SLOT_ROWS)
            _release(x_done + layer)
    return i


@gluon.jit
def compute_partition(ring, ready, empty, act, xs_ptr, h_ptr, gu_ptr, sum_ptr, ss_ptr, counter_ptr, error_ptr, B,
                      spin_limit, H: gl.constexpr, I: gl.constexpr, S1: gl.constexpr, S2: gl.constexpr,
                      L: gl.constexpr, STAGES: gl.constexpr, MERGED: gl.constexpr, FOLDED: gl.constexpr):
    """Per layer: every stage-1 task this program owns, then every stage-2 task. Counters (one int32
    buffer): h_done[L, S2] (h tiles finished per slice of I), parts1[L, T1] (stage-1 partials per h
    tile, when S1 > 1), parts2[L, NT2] (stage-2 partials per output tile; merged: parts2[l, 0] counts
    the layer's tasks), x_done[L] (output tiles of x_{l+1} finished; merged: 1 when all are)."""
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BPAD, 16])
    T1: gl.constexpr = I // HALF
    NT2: gl.constexpr = H // SLOT_ROWS
    h_done = counter_ptr
    parts1 = h_done + L * S2
    parts2 = parts1 + L * T1
    x_done = parts2 + L * NT2
    i = 0
    for layer in range(L):
        x_ptr = xs_ptr + layer * B * H
        layer_h = h_ptr + layer * B * I
        layer_sums = sum_ptr + layer * B * H
        if FOLDED:
            if layer > 0:
                _acquire(parts2 + (layer - 1) * NT2, T1, error_ptr, spin_limit)
            i = _folded_layer(ring, ready, empty, act, i, x_ptr, ss_ptr, layer_h, layer_sums, parts2 + layer * NT2,
                              layer, B, H, I, STAGES, acc_layout)
        elif MERGED:
            if layer > 0:
                _acquire(x_done + layer - 1, 1, error_ptr, spin_limit)
            i = _merged_layer(ring, ready, empty, act, i, x_ptr, layer_h, layer_sums, ss_ptr + layer * B,
                              ss_ptr + (layer + 1) * B, parts2 + layer * NT2, x_done + layer, B, H, I, STAGES,
                              acc_layout)
        else:
            if layer > 0:
                _acquire(x_done + layer - 1, NT2, error_ptr, spin_limit)
            i = _staged_layer(ring, ready, empty, act, i, x_ptr, layer_h, layer_sums, gu_ptr, ss_ptr, h_done, parts1,
                              parts2, x_done, layer, B, error_ptr, spin_limit, H, I, S1, S2, STAGES, acc_layout)
    if FOLDED:  # the chain's output: program 0 adds the last layer's sums once every task is in
        if gl.program_id(0) == 0:
            _acquire(parts2 + (L - 1) * NT2, T1, error_ptr, spin_limit)
            for c0 in range(0, H, TAIL_COLS):
                _finish_tile(sum_ptr + (L - 1) * B * H, xs_ptr + (L - 1) * B * H, xs_ptr + L * B * H, ss_ptr + L * B, c0,
                             B, H, TAIL_COLS)


@gluon.jit
def mlp_chain_kernel(w1_desc, w2_desc, xs_ptr, h_ptr, gu_ptr, sum_ptr, ss_ptr, counter_ptr, error_ptr, B,
                     spin_limit,  #
                     H: gl.constexpr, I: gl.constexpr, S1: gl.constexpr, S2: gl.constexpr, L: gl.constexpr,
                     STAGES: gl.constexpr, KT_MAX: gl.constexpr, MERGED: gl.constexpr, FOLDED: gl.constexpr):
    """x_{l+1} = x_l + mlp_l(rmsnorm(x_l)) for L layers (the norm's weight folded into Wg, Wu),
    persistent: grid <= SMs, every program co-resident. ss[0] holds x_0's summed squares per row; the
    fp32 partial sums (gu when S1 > 1, sums), ss[1:] and the counters start at zero."""
    ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, SLOT_ROWS, BK], w2_desc.layout)
    act_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BPAD, BK], gl.bfloat16)
    act = gl.allocate_shared_memory(gl.bfloat16, [KT_MAX, BPAD, BK], act_layout)
    ready, empty = ring_barriers(STAGES)
    gl.warp_specialize([
        (compute_partition, (ring, ready, empty, act, xs_ptr, h_ptr, gu_ptr, sum_ptr, ss_ptr, counter_ptr, error_ptr, B,
                             spin_limit, H, I, S1, S2, L, STAGES, MERGED, FOLDED)),
        (load_partition, (w1_desc, w2_desc, ring, ready, empty, H, I, S1, S2, L, STAGES, MERGED)),
    ], [1], [40])


# --------------------------------------------------------------------------------------------------
# Host side: the schedule's checks, descriptors, launch
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Schedule:
    H: int
    I: int
    layers: int
    S1: int
    S2: int
    stages: int
    programs: int
    merged: bool = False  # the block as one stage (gate_up and down in one task), S1 = S2 = 1
    folded: bool = False  # merged, with no last task: the next layer's tasks add the residual as they stage x

    @property
    def kt_max(self) -> int:
        if self.merged:  # all of x staged for the gate_up tile, then its slot 0 holds the h tile
            return self.H // K_PER_SLOT
        return max(self.H // self.S1, self.I // self.S2) // K_PER_SLOT

    @property
    def n_counters(self) -> int:
        return self.layers * (self.S2 + self.I // (ROWS_PER_SLOT // 2) + self.H // ROWS_PER_SLOT + 1)

    def shared_bytes(self) -> int:
        return (self.stages * ROWS_PER_SLOT * K_PER_SLOT * 2 + self.kt_max * BATCH_PAD * K_PER_SLOT * 2
                + self.stages * 16)


def plan_schedule(H: int, I: int, layers: int, sms: int, S1: int | None = None, S2: int | None = None,
                  stages: int | None = None, merged: bool = False, folded: bool = False) -> Schedule:
    """The chain's schedule, checked: tile divisibility, one program per SM at most (co-residency is
    what lets every wait end), and the shared memory it needs. By default stage 1 splits H over S1
    slices and stage 2 splits I over S2 slices, each as finely as keeps its tasks within the SMs.
    `merged`: one stage a block, I / 64 tasks (no split: S1 = S2 = 1); `folded`: the same with the
    residual added by the next layer's tasks."""
    merged = merged or folded
    half = ROWS_PER_SLOT // 2
    if H % ROWS_PER_SLOT or I % half:
        raise ValueError(f"H={H} must divide by {ROWS_PER_SLOT} and I={I} by {half}")
    t1, nt2 = I // half, H // ROWS_PER_SLOT
    if merged:
        if (S1 or 1) != 1 or (S2 or 1) != 1:
            raise ValueError(f"a merged block splits neither projection (S1={S1}, S2={S2})")
        S1 = S2 = 1

    def finest(n: int, tasks: int) -> int:
        return max((s for s in range(1, n // K_PER_SLOT + 1) if n % (s * K_PER_SLOT) == 0 and tasks * s <= sms),
                   default=1)

    S1 = S1 or finest(H, t1)
    S2 = S2 or finest(I, nt2)
    if H % (S1 * K_PER_SLOT) or I % (S2 * K_PER_SLOT):
        raise ValueError(f"S1={S1} must split H={H} and S2={S2} must split I={I} into whole {K_PER_SLOT}-column tiles")
    programs = min(sms, t1 if merged else max(t1 * S1, nt2 * S2))
    kt_max = H // K_PER_SLOT if merged else max(H // S1, I // S2) // K_PER_SLOT
    if stages is None:
        stages = min(16, (SMEM_BUDGET - kt_max * BATCH_PAD * K_PER_SLOT * 2) // (ROWS_PER_SLOT * K_PER_SLOT * 2 + 16))
    schedule = Schedule(H, I, layers, S1, S2, stages, programs, merged, folded)
    if stages < 2 or schedule.shared_bytes() > SMEM_BUDGET:
        raise ValueError(f"{schedule} needs {schedule.shared_bytes()} bytes of shared memory (budget "
                         f"{SMEM_BUDGET}) or has fewer than 2 slots")
    return schedule


def launch_args(xs, w_gu, w_d, h, gu, sums, ss, counters, error, schedule: Schedule, spin_limit: int):
    half = ROWS_PER_SLOT // 2
    w1_desc = TensorDescriptor.from_tensor(w_gu, [half, K_PER_SLOT],
                                           gl.NVMMASharedLayout.get_default_for([half, K_PER_SLOT], gl.bfloat16))
    w2_desc = TensorDescriptor.from_tensor(
        w_d, [ROWS_PER_SLOT, K_PER_SLOT], gl.NVMMASharedLayout.get_default_for([ROWS_PER_SLOT, K_PER_SLOT],
                                                                               gl.bfloat16))
    args = (w1_desc, w2_desc, xs, h, gu, sums, ss, counters, error, xs.shape[1], spin_limit)
    kwargs = dict(H=schedule.H, I=schedule.I, S1=schedule.S1, S2=schedule.S2, L=schedule.layers, STAGES=schedule.stages,
                  KT_MAX=schedule.kt_max, MERGED=schedule.merged, FOLDED=schedule.folded, num_warps=4,
                  maxnreg=168)
    return (schedule.programs, ), args, kwargs


class Chain:
    """One chain's buffers and launch. w_gu: [L*2I, H] (each layer's gate rows over its up rows),
    w_d: [L*H, I]. xs[0] is the input; call() zeroes the partial sums and counters, runs the kernel
    and returns xs[L]."""

    def __init__(self, w_gu, w_d, B: int, schedule: Schedule, spin_limit: int = 1 << 20):
        dev, L = w_gu.device, schedule.layers
        assert B <= BATCH_PAD, f"B={B} > {BATCH_PAD}"
        self.xs = torch.zeros(L + 1, B, schedule.H, device=dev, dtype=torch.bfloat16)
        self.h = torch.empty(L, B, schedule.I, device=dev, dtype=torch.bfloat16)
        self.sums = torch.empty(L, B, schedule.H, device=dev, dtype=torch.float32)
        # stage 1's partial sums, read only when it is split (else one unused layer's worth)
        self.gu = torch.empty(L if schedule.S1 > 1 else 1, B, 2 * schedule.I, device=dev, dtype=torch.float32)
        self.split_stage1 = schedule.S1 > 1
        self.ss = torch.empty(L + 1, B, device=dev, dtype=torch.float32)  # each x_l's summed squares per row
        self.counters = torch.zeros(schedule.n_counters, device=dev, dtype=torch.int32)
        self.error = torch.zeros(1, device=dev, dtype=torch.int32)
        self.grid, self.args, self.kwargs = launch_args(self.xs, w_gu, w_d, self.h, self.gu, self.sums, self.ss,
                                                        self.counters, self.error, schedule, spin_limit)

    def __call__(self):
        if self.split_stage1:
            self.gu.zero_()
        self.sums.zero_()
        torch.sum(self.xs[0].float().square(), dim=-1, out=self.ss[0])  # the embedding's job in a real step
        self.ss[1:].zero_()
        self.counters.zero_()
        mlp_chain_kernel[self.grid](*self.args, **self.kwargs)
        return self.xs[-1]


def torch_chain(x, w_gu, w_d, layers: int):
    """The same chain as torch's RMSNorm, cuBLAS GEMMs and torch elementwise ops (what a graph of
    launches does)."""
    H, I = x.shape[1], w_d.shape[1]
    for layer in range(layers):
        gu = torch.nn.functional.rms_norm(x, (H, ), eps=1e-5) @ w_gu[layer * 2 * I:(layer + 1) * 2 * I].T
        x = x + (torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]) @ w_d[layer * H:(layer + 1) * H].T
    return x


def rms_normed(x):
    """x / rms(x) per row, in fp32 (the norm's weight is folded into the next weights)."""
    x = x.float()
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-5)


def reference(x, w_gu, w_d, layers: int):
    """fp32 math on bf16 inputs, rounded to bf16 where the kernel stores (h, each layer's x)."""
    H, I = x.shape[1], w_d.shape[1]
    for layer in range(layers):
        gu = rms_normed(x) @ w_gu[layer * 2 * I:(layer + 1) * 2 * I].float().T
        h = (torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]).to(torch.bfloat16)
        x = (x.float() + h.float() @ w_d[layer * H:(layer + 1) * H].float().T).to(torch.bfloat16)
    return x.float()


# --------------------------------------------------------------------------------------------------
# The schedule simulated on the CPU: the same task order, counters and tile offsets as the kernel's
# compute partition, executed with torch ops, programs interleaved round-robin
# --------------------------------------------------------------------------------------------------

def program_tasks(schedule: Schedule, pid: int):
    """The compute partition's steps for program pid, in its order: ("wait", counter, target) or
    ("run", kind, layer, task). Counters are named tuples: ("h", layer, slice), ("x", layer), and the
    folded form's ("layer", layer) (its tasks in)."""
    H, I, S1, S2, P = schedule.H, schedule.I, schedule.S1, schedule.S2, schedule.programs
    half, nt2, kr2 = ROWS_PER_SLOT // 2, H // ROWS_PER_SLOT, I // S2
    for layer in range(schedule.layers):
        if schedule.folded:
            if layer > 0:
                yield ("wait", ("layer", layer - 1), I // half)
            for t in range(pid, I // half, P):
                yield ("run", "folded", layer, t)
            continue
        if schedule.merged:
            if layer > 0:
                yield ("wait", ("x", layer - 1), 1)
            for t in range(pid, I // half, P):
                yield ("run", "mlp", layer, t)
            continue
        if layer > 0:
            yield ("wait", ("x", layer - 1), nt2)
        for t in range(pid, I // half * S1, P):
            yield ("run", "gate_up", layer, t)
        for t in range(pid, nt2 * S2, P):
            yield ("wait", ("h", layer, t // nt2), kr2 // half)
            yield ("run", "down", layer, t)
    if schedule.folded and pid == 0:  # the chain's output, once the last layer's tasks are all in
        yield ("wait", ("layer", schedule.layers - 1), I // half)
        yield ("run", "tail", schedule.layers - 1, 0)


def weight_slots(schedule: Schedule, pid: int) -> tuple[int, int]:
    """(slots the loader fills, slots the compute partition consumes) for program pid: equal, or a
    partition would wait forever on a slot."""
    H, I, S1, S2, P = schedule.H, schedule.I, schedule.S1, schedule.S2, schedule.programs
    half, nt2 = ROWS_PER_SLOT // 2, H // ROWS_PER_SLOT
    if schedule.merged:  # the loader's order: each task's H / 64 gate/up slots, then its NT2 Wd slots
        loaded = schedule.layers * len(range(pid, I // half, P)) * (H // K_PER_SLOT + nt2)
    else:
        loaded = schedule.layers * (len(range(pid, I // half * S1, P)) * (H // S1 // K_PER_SLOT)
                                    + len(range(pid, nt2 * S2, P)) * (I // S2 // K_PER_SLOT))
    per_task = {"gate_up": H // S1 // K_PER_SLOT, "down": I // S2 // K_PER_SLOT, "mlp": H // K_PER_SLOT + nt2,
                "folded": H // K_PER_SLOT + nt2, "tail": 0}
    consumed = sum(per_task[step[1]] for step in program_tasks(schedule, pid) if step[0] == "run")
    return loaded, consumed


def simulate(schedule: Schedule, x0, w_gu, w_d):
    """Run every program's steps against shared counters, one step per program per turn; a turn in
    which no program moves is a deadlock (raised). Returns x_L (bf16) computed tile by tile."""
    H, I, S1, S2, L = schedule.H, schedule.I, schedule.S1, schedule.S2, schedule.layers
    half, nt2, kr1, kr2 = ROWS_PER_SLOT // 2, H // ROWS_PER_SLOT, H // S1, I // S2
    B = x0.shape[0]
    gu = torch.zeros(L, B, 2 * I)
    ss = torch.zeros(L + 1, B)
    ss[0] = x0.float().square().sum(-1)
    xs = torch.full((L + 1, B, H), float("nan"), dtype=torch.bfloat16)  # a read before its write shows
    xs[0] = x0
    h = torch.full((L, B, I), float("nan"), dtype=torch.bfloat16)
    sums = torch.zeros(L, B, H)
    counters: dict = {}
    parts: dict = {}
    programs = [program_tasks(schedule, pid) for pid in range(schedule.programs)]
    pending = [next(p, None) for p in programs]
    while any(step is not None for step in pending):
        moved = False
        for pid, step in enumerate(pending):
            if step is None or (step[0] == "wait" and counters.get(step[1], 0) < step[2]):
                continue
            if step[0] == "run" and step[1] in ("folded", "tail"):  # x_l = x_{l-1} + sums, staged by each task
                layer, n = step[2], step[3]
                if step[1] == "tail":
                    xs[layer + 1] = (xs[layer].float() + sums[layer]).to(torch.bfloat16)
                else:
                    if layer == 0:
                        x, rstd = xs[0], torch.rsqrt(ss[0] / H + 1e-5)[:, None]
                    else:
                        x = (xs[layer - 1].float() + sums[layer - 1]).to(torch.bfloat16)
                        rstd = torch.rsqrt(x.float().square().sum(-1) / H + 1e-5)[:, None]
                        if n == 0:  # the layer's first task keeps x_l for the residual after it
                            xs[layer] = x
                    cols = slice(n * half, (n + 1) * half)
                    rows = slice(layer * 2 * I + n * half, layer * 2 * I + (n + 1) * half)
                    up = slice(rows.start + I, rows.stop + I)
                    g = x.float() @ w_gu[rows].float().T * rstd
                    u = x.float() @ w_gu[up].float().T * rstd
                    h[layer, :, cols] = (torch.nn.functional.silu(g) * u).to(torch.bfloat16)
                    sums[layer] += h[layer, :, cols].float() @ w_d[layer * H:(layer + 1) * H, cols].float().T
                    counters[("layer", layer)] = counters.get(("layer", layer), 0) + 1
            elif step[0] == "run" and step[1] == "mlp":  # merged: h tile, then its share of every output column
                layer, n = step[2], step[3]
                cols = slice(n * half, (n + 1) * half)
                rows = slice(layer * 2 * I + n * half, layer * 2 * I + (n + 1) * half)
                up = slice(rows.start + I, rows.stop + I)
                rstd = torch.rsqrt(ss[layer] / H + 1e-5)[:, None]
                g = xs[layer].float() @ w_gu[rows].float().T * rstd
                u = xs[layer].float() @ w_gu[up].float().T * rstd
                h[layer, :, cols] = (torch.nn.functional.silu(g) * u).to(torch.bfloat16)
                sums[layer] += h[layer, :, cols].float() @ w_d[layer * H:(layer + 1) * H, cols].float().T
                parts[("layer", layer)] = parts.get(("layer", layer), 0) + 1
                if parts[("layer", layer)] == I // half:  # the last task in finishes x_{l+1}
                    xs[layer + 1] = (xs[layer].float() + sums[layer]).to(torch.bfloat16)
                    ss[layer + 1] = xs[layer + 1].float().square().sum(-1)
                    counters[("x", layer)] = 1
            elif step[0] == "run" and step[1] == "gate_up":
                layer, t = step[2], step[3]
                n, k = t % (I // half), slice((t // (I // half)) * kr1, (t // (I // half) + 1) * kr1)
                rows = slice(layer * 2 * I + n * half, layer * 2 * I + (n + 1) * half)
                up = slice(rows.start + I, rows.stop + I)
                cols = slice(n * half, (n + 1) * half)
                rstd = torch.rsqrt(ss[layer] / H + 1e-5)[:, None]
                gu[layer, :, cols] += xs[layer, :, k].float() @ w_gu[rows, k].float().T * rstd
                gu[layer, :, I + cols.start:I + cols.stop] += xs[layer, :, k].float() @ w_gu[up, k].float().T * rstd
                parts[("h", layer, n)] = parts.get(("h", layer, n), 0) + 1
                if parts[("h", layer, n)] == S1:
                    g, u = gu[layer, :, cols], gu[layer, :, I + cols.start:I + cols.stop]
                    h[layer, :, cols] = (torch.nn.functional.silu(g) * u).to(torch.bfloat16)
                    key = ("h", layer, n * half // kr2)
                    counters[key] = counters.get(key, 0) + 1
            elif step[0] == "run":
                layer, t = step[2], step[3]
                ks, n = t // nt2, t % nt2
                cols = slice(n * ROWS_PER_SLOT, (n + 1) * ROWS_PER_SLOT)
                k = slice(ks * kr2, (ks + 1) * kr2)
                sums[layer, :, cols] += h[layer, :, k].float() @ w_d[layer * H + cols.start:layer * H + cols.stop, k].float().T
                parts[(layer, n)] = parts.get((layer, n), 0) + 1
                if parts[(layer, n)] == S2:
                    xs[layer + 1, :, cols] = (xs[layer, :, cols].float() + sums[layer, :, cols]).to(torch.bfloat16)
                    ss[layer + 1] += xs[layer + 1, :, cols].float().square().sum(-1)
                    counters[("x", layer)] = counters.get(("x", layer), 0) + 1
            pending[pid] = next(programs[pid], None)
            moved = True
        if not moved:
            stuck = {pid: step for pid, step in enumerate(pending) if step is not None}
            raise RuntimeError(f"deadlock: {len(stuck)} programs wait, e.g. {next(iter(stuck.items()))}")
    return xs[L]


# --------------------------------------------------------------------------------------------------
# Measurement (GPU)
# --------------------------------------------------------------------------------------------------

def weights(H, I, layers, dev):
    """Random layers at the scales of a trained model's: each block's RMSNorm weight (about 1) folded
    into its gate and up rows, so w_gu is what the kernel reads. The norm keeps the residual stream's
    growth additive, about 0.35 |x|^2 / H a layer."""
    gamma = 1 + 0.1 * torch.randn(layers, 1, H, device=dev)
    w_gu = (torch.randn(layers, 2 * I, H, device=dev) / H ** 0.5 * gamma).to(torch.bfloat16).reshape(-1, H)
    w_d = torch.randn(layers * H, I, device=dev, dtype=torch.bfloat16) / I ** 0.5
    return w_gu, w_d


def graph_time_us(calls, replays: int = 15) -> float:
    """Median time of one call: every call in `calls` (each on its own weights, so nothing repeats
    out of L2) captured back to back in one CUDA graph, replayed; per-call = replay / len(calls)."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for fn in calls:
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for fn in calls:
            fn()
    times = []
    for _ in range(replays + 2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    times = sorted(times[2:])
    return times[len(times) // 2]


def copy_bandwidth() -> float:
    """Bytes/s of a device-to-device copy of 1 GiB (read + write counted), in a graph."""
    src = torch.empty(1 << 29, device="cuda", dtype=torch.float16)
    dst = torch.empty_like(src)
    us = graph_time_us([lambda: dst.copy_(src)])
    return 2 * src.numel() * 2 / (us * 1e-6)


def layer_errors(chain: Chain, w_gu, w_d, layers: int) -> tuple[float, float]:
    """Each layer checked on the kernel's own input to it (so errors do not compound): the largest
    relative error of h_l, and of x_{l+1} - x_l against h_l Wd_l^T (a missing partial sum is 1/S2 of it)."""
    H, I = chain.xs.shape[2], chain.h.shape[2]
    err_h = err_x = 0.0
    for layer in range(layers):
        x = chain.xs[layer].float()
        gu = rms_normed(x) @ w_gu[layer * 2 * I:(layer + 1) * 2 * I].float().T
        h_ref = torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]
        err_h = max(err_h, ((chain.h[layer].float() - h_ref).abs().max() / h_ref.abs().max()).item())
        delta = chain.h[layer].float() @ w_d[layer * H:(layer + 1) * H].float().T
        err_x = max(err_x, ((chain.xs[layer + 1].float() - x - delta).abs().max() / delta.abs().max()).item())
    return err_h, err_x


def write_probe_result(path: str | None, sms: int, bw: float, **fields) -> None:
    """A probe's JSON (rewritten after every row, so a run cut short keeps what it measured): GPU,
    SMs, copy rate, command, commit, versions, then the probe's own fields."""
    if not path:
        return
    commit = subprocess.run(["git", "-C", str(Path(__file__).parent), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "unknown"
    Path(path).write_text(json.dumps(dict(
        gpu=torch.cuda.get_device_name(), sms=sms, copy_gbs=bw / 1e9,
        command=" ".join(["python"] + sys.argv), code=commit, triton=triton.__version__, torch=torch.__version__,
        cuda=torch.version.cuda, **fields), indent=1) + "\n")


def hopper_and_copy_rate() -> tuple[int, float] | None:
    """(SMs, measured copy bytes/s) on a Hopper GPU, printed; None (and a line on stderr) elsewhere."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("error: needs a Hopper GPU (sm_90); use --offline without one", file=sys.stderr)
        return None
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: {sms} SMs, copy {bw / 1e9:.0f} GB/s", flush=True)
    return sms, bw


def check(label: str, chain: Chain, w_gu, w_d, layers: int) -> float:
    """Fresh input, h poisoned with NaN (a stage-2 read before its stage-1 write shows up): every
    layer on its own input (h within 2e-2, the residual update within 5e-2, relative), and the output
    against the fp32 reference run from x_0 (5e-2). Exits on a failure or a wait that ran out."""
    chain.xs[0].copy_(torch.randn_like(chain.xs[0]))
    chain.h.fill_(float("nan"))
    chain.error.zero_()
    out = chain().float()
    torch.cuda.synchronize()
    err_h, err_x = layer_errors(chain, w_gu, w_d, layers)
    ref = reference(chain.xs[0], w_gu, w_d, layers)
    err = ((out - ref).abs().max() / ref.abs().max()).item()
    errors = int(chain.error.item())
    if errors or not (err_h < 2e-2 and err_x < 5e-2 and err < 5e-2):
        raise SystemExit(f"{label}: relative error of h {err_h}, of the residual update {err_x}, of the "
                         f"output {err}; {errors} waits ran out")
    return max(err, err_h, err_x)


def run_gpu(args) -> int:
    gpu = hopper_and_copy_rate()
    if gpu is None:
        return 2
    sms, bw = gpu
    print(f"{'model':<14}{'L':>3}{'B':>3}  {'schedule':<20}{'err':>9}{'floor us':>10}{'chain us':>10}{'of floor':>9}"
          f"{'torch us':>10}{'of floor':>9}{'chain/torch':>12}")
    rows = []
    for model in args.models:
        H, I = MODELS[model]
        for layers in args.layers:
            schedules = [plan_schedule(H, I, layers, sms, S1=args.s1, S2=args.s2, stages=args.stages,
                                       merged=form == "merged", folded=form == "folded") for form in args.forms]
            weight_bytes = layers * 3 * H * I * 2
            copies = max(1, -(-300_000_000 // weight_bytes))  # > 2x L2 between repeats of one set
            sets = [weights(H, I, layers, "cuda") for _ in range(copies)]
            for B in args.batches:
                x = torch.randn(B, H, device="cuda", dtype=torch.bfloat16)
                torch_us = graph_time_us([lambda w=w: torch_chain(x, *w, layers) for w in sets])
                floor_us = weight_bytes / bw * 1e6
                for schedule in schedules:  # the forms in one process, on the same weights
                    label = f"{model} L={layers} B={B} {schedule}"
                    chains = [Chain(w_gu, w_d, B, schedule) for w_gu, w_d in sets]
                    err = check(label, chains[0], *sets[0], layers)
                    for c in chains:
                        c.xs[0].copy_(x)
                        c.error.zero_()
                    chain_us = graph_time_us(chains)
                    errors = sum(int(c.error.item()) for c in chains)
                    row = dict(model=model, H=H, I=I, layers=layers, B=B, schedule=asdict(schedule), rel_err=err,
                               waits_ran_out=errors, floor_us=floor_us, chain_us=chain_us, torch_us=torch_us)
                    rows.append(row)
                    sched = (f"{('folded' if schedule.folded else 'merged') if schedule.merged else f'S={schedule.S1}/{schedule.S2}'} "
                             f"st={schedule.stages} P={schedule.programs}")
                    print(f"{model:<14}{layers:>3}{B:>3}  {sched:<20}{err:>9.1e}{floor_us:>10.1f}{chain_us:>10.1f}"
                          f"{chain_us / floor_us:>9.2f}{torch_us:>10.1f}{torch_us / floor_us:>9.2f}"
                          f"{chain_us / torch_us:>12.2f}" + (f"  ({errors} waits ran out)" if errors else ""),
                          flush=True)
                    write_probe_result(args.json, sms, bw, rows=rows)
                    del chains
            del sets
            torch.cuda.empty_cache()
    return 0


# --------------------------------------------------------------------------------------------------
# Offline compile (no GPU)
# --------------------------------------------------------------------------------------------------

def compile_for_sm90(kernel, args, kwargs):
    """A Gluon kernel compiled for GPUTarget('cuda', 90, 32) (sm_90a) from CPU tensors of the right
    shapes: the binder reads only dtypes, shapes, strides and alignment."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    kwargs = {**kwargs, "debug": False}
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    return triton.compile(GluonASTSource(kernel, signature, constexprs, attrs), target=target,
                          options=options.__dict__)


def compile_offline(schedule: Schedule, B: int = 8):
    H, I, L = schedule.H, schedule.I, schedule.layers
    w_gu, w_d = torch.empty(L * 2 * I, H, dtype=torch.bfloat16), torch.empty(L * H, I, dtype=torch.bfloat16)
    xs, h = torch.empty(L + 1, B, H, dtype=torch.bfloat16), torch.empty(L, B, I, dtype=torch.bfloat16)
    sums = torch.empty(L, B, H, dtype=torch.float32)
    ss = torch.empty(L + 1, B, dtype=torch.float32)
    gu = torch.empty(L if schedule.S1 > 1 else 1, B, 2 * I, dtype=torch.float32)
    counters, error = torch.empty(schedule.n_counters, dtype=torch.int32), torch.empty(1, dtype=torch.int32)
    _, args, kwargs = launch_args(xs, w_gu, w_d, h, gu, sums, ss, counters, error, schedule, 1 << 20)
    return compile_for_sm90(mlp_chain_kernel, args, kwargs)


def run_offline(args) -> int:
    print(f"triton {triton.__version__}: mlp_chain_kernel for cuda:90 (sm_90a), no GPU")
    for model, layers, form in itertools.product(args.models, args.layers, args.forms):
        H, I = MODELS[model]
        schedule = plan_schedule(H, I, layers, 132, S1=args.s1, S2=args.s2, stages=args.stages,
                                 merged=form == "merged", folded=form == "folded")
        compiled = compile_offline(schedule)
        ptx = compiled.asm["ptx"]
        found = {name: pattern in ptx for name, pattern in (
            ("wgmma", "wgmma.mma_async"), ("tma", "cp.async.bulk.tensor"), ("cp.async", "cp.async.cg"),
            ("mbarrier", "mbarrier.try_wait"), ("acquire", ".acquire"), ("release", ".release"),
            ("acq_rel", ".acq_rel"), ("setmaxnreg", "setmaxnreg"))}
        sm = re.search(r"^\.target\s+(\S+)", ptx, re.M).group(1)
        local = len(re.findall(r"\b(?:ld|st)\.local", ptx))
        print(f"{model}: {schedule}, shared {compiled.metadata.shared} B, target {sm}, local memory accesses "
              f"{local}, " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in found.items()))
        if args.dump_ptx:
            Path(args.dump_ptx).mkdir(parents=True, exist_ok=True)
            (Path(args.dump_ptx) / f"{model}-L{layers}-{form}.ptx").write_text(ptx)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="A chain of the draft's MLP blocks as one persistent warp-specialized Gluon kernel "
                                                 "(weights stream while activations wait), against torch.")
    parser.add_argument("--json")
    parser.add_argument("--offline", action="store_true")
    parser.add_argument("--dump-ptx")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--layers", nargs="+", type=int, default=[1, 16], help="MLP blocks in the chain")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 4, 8, 16])
    parser.add_argument("--s1", type=int, default=None, help="K slices of the gate/up projection")
    parser.add_argument("--s2", type=int, default=None, help="K slices of the down projection")
    parser.add_argument("--stages", type=int, default=None, help="ring slots (default: fill shared memory)")
    parser.add_argument("--forms", nargs="+", default=["staged"], choices=["staged", "merged", "folded"],
                        help="staged: two stages a block (gate_up tasks, then down tasks); merged: one (gate_up "
                             "and down in one task, the layer's last task adding the residual); folded: merged with "
                             "the residual added by the next layer's tasks; each timed in this process on the same "
                             "weights")
    args = parser.parse_args(argv)
    return run_offline(args) if args.offline else run_gpu(args)


if __name__ == "__main__":
    if "--offline" in sys.argv:
        os.environ.setdefault("TRITON_INTERPRET", "0")
    sys.exit(main())
