"""Lab experiment (not product code): verify-phase decode attention streamed like chain.py, #49's shape.

Each of B rows brings T = k+1 new queries per query head; its keys and values are already in the
cache at positions [0, len_b), the new ones at the end. Query heads share a KV head in groups of G:

    out[b, t, h] = softmax(q[b, t, h] . K[b, h // G, :p+1]^T * scale) V[b, h // G, :p+1],  p = len_b - T + t

At these sizes the attention reads the cache once and does little else, so it is a streaming
problem, dealt like chain.py's GEMMs:

* the work is dealt stream-K style, in the kernel, from the runtime lengths (as a CUDA graph needs):
  the key tiles of every (row b, KV head g) pair below len_b, pair after pair, are cut into one
  equal contiguous range per program (one program per SM, fewer when there are fewer tiles). A
  program's range is a run of pieces: whole pairs in the middle, part of a pair at either end;
* a 1-warp loader TMA-loads the K and V tiles of its range into a ring. It waits only for free slots;
* the compute warpgroup puts a pair's T x G queries in one 64-row wgmma tile (rows past T*G idle:
  MMA time, not bytes) and runs S = Q K^T, the causal and length mask, an online softmax in base 2,
  and O += P V (Q and P from registers). A whole pair is written out at once. A piece leaves its
  (m, l, O) in the program's slot 0 (the piece its range starts in) or slot 1 (the one it ends in);
  the pair's last piece to arrive (a counter per pair) merges them and writes out.

    python lab/stream_chain/attention.py --json OUT.json   # Hopper GPU: check, time beside torch SDPA
    python lab/stream_chain/attention.py --offline         # no GPU: compile for sm_90a
    python -m pytest -q lab/stream_chain                   # CPU: dealing, masks and merge simulated
"""
from __future__ import annotations

import argparse
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

sys.path.insert(0, str(Path(__file__).parent))
from conjugate.kernels.step.device import online_softmax  # noqa: E402
from chain import (_slot, compile_for_sm90, graph_time_us, hopper_and_copy_rate, ring_barriers,  # noqa: E402
                   write_probe_result)

Q_ROWS = 64        # a piece's T x G queries, padded to one wgmma tile
KEYS_PER_TILE = 64
QROWS = gl.constexpr(Q_ROWS)
BLOCK_N = gl.constexpr(KEYS_PER_TILE)
LOG2E = gl.constexpr(1.4426950408889634)


# --------------------------------------------------------------------------------------------------
# The dealing: every program computes it from the lengths alone (runtime values, as in a CUDA graph)
# --------------------------------------------------------------------------------------------------
@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _rows(lens_ptr, B, HKV, BP: gl.constexpr, WARPS: gl.constexpr):
    """Every row at once, as [BP] vectors (rows past B: no tiles): (row ids, key tiles n_b below its
    length, tiles of all pairs before row b). One load, no dependent chain."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    rows = gl.arange(0, BP, layout=layout)
    n = gl.cdiv(gl.load(lens_ptr + rows, mask=rows < B, other=0), BLOCK_N)
    return rows, n, (gl.associative_scan(n, 0, _add) - n) * HKV


@gluon.jit
def _dealt(total):
    """(programs that get work, this program's tiles [lo, hi)): equal contiguous ranges, none empty."""
    programs = gl.minimum(gl.num_programs(0), total)
    i = gl.program_id(0)
    return programs, i * total // programs, (i + 1) * total // programs


@gluon.jit
def _row(rows, n_all, before_all, b):
    """Row b's (key tiles, tiles of all pairs before it), picked out of _rows' vectors."""
    return gl.sum(gl.where(rows == b, n_all, 0), axis=0), gl.sum(gl.where(rows == b, before_all, 0), axis=0)


@gluon.jit
def _pair_at(rows, n_all, before_all, t, HKV):
    """The pair holding tile t: (row b, its tiles n, tiles before row b over all heads, KV head g, j)."""
    b = gl.sum((before_all + n_all * HKV <= t).to(gl.int32), axis=0)  # rows wholly before t
    n, before = _row(rows, n_all, before_all, b)
    g = (t - before) // n
    return b, n, before, g, t - before - g * n


@gluon.jit
def _next_pair(rows, n_all, before_all, b, n, before, g, first, hi, HKV):
    """After pair (b, g), whose tiles start at `first`: (its end t, and the next pair's b, n, before, g)."""
    t = first + n
    g += 1
    if (g == HKV) & (t < hi):
        g = 0
        b += 1
        n, before = _row(rows, n_all, before_all, b)
    return t, b, n, before, g


@gluon.jit
def _owner(t, programs, total):
    """The program whose range holds tile t."""
    return ((t + 1) * programs - 1) // total


@gluon.jit
def load_partition(k_desc, v_desc, k_ring, v_ring, ready, empty, lens_ptr, B, HKV, CTX, BP: gl.constexpr,
                   STAGES: gl.constexpr):
    nbytes: gl.constexpr = k_desc.block_type.nbytes + v_desc.block_type.nbytes
    rows, n_all, before_all = _rows(lens_ptr, B, HKV, BP, 1)
    programs, lo, hi = _dealt(gl.sum(n_all, axis=0) * HKV)
    if gl.program_id(0) < programs:
        b, n, before, g, j = _pair_at(rows, n_all, before_all, lo, HKV)
        t = lo
        i = 0
        while t < hi:
            row0 = (b * HKV + g) * CTX
            first = before + g * n
            for jj in range(j, gl.minimum(n, hi - first)):
                s, phase = _slot(i, STAGES)
                mbarrier.wait(empty.index(s), phase ^ 1)
                mbarrier.expect(ready.index(s), nbytes)
                tma.async_copy_global_to_shared(k_desc, [row0 + jj * BLOCK_N, 0], ready.index(s), k_ring.index(s))
                tma.async_copy_global_to_shared(v_desc, [row0 + jj * BLOCK_N, 0], ready.index(s), v_ring.index(s))
                i += 1
            t, b, n, before, g = _next_pair(rows, n_all, before_all, b, n, before, g, first, hi, HKV)
            j = 0


@gluon.jit
def _load_queries(q_ptr, b, g, T, HQ, G, D: gl.constexpr, layout: gl.constexpr):
    """Q tile [64, D]: row r is query t = r // G of head g*G + r % G (rows past T*G are zero)."""
    r = gl.arange(0, QROWS, layout=gl.SliceLayout(1, layout))
    d = gl.arange(0, D, layout=gl.SliceLayout(0, layout))
    row = (b * T + r // G) * HQ + g * G + r % G
    return gl.load(q_ptr + row[:, None] * D + d[None, :], mask=(r < T * G)[:, None], other=0.0)


@gluon.jit
def _store_out(out_ptr, o, b, g, T, HQ, G, D: gl.constexpr):
    """A finished [64, D] tile's first T*G rows into out [B, T, HQ, D]."""
    r = gl.arange(0, QROWS, layout=gl.SliceLayout(1, o.type.layout))
    d = gl.arange(0, D, layout=gl.SliceLayout(0, o.type.layout))
    row = (b * T + r // G) * HQ + g * G + r % G
    gl.store(out_ptr + row[:, None] * D + d[None, :], o.to(gl.bfloat16), mask=(r < T * G)[:, None])


@gluon.jit
def _store_partial(ws_o, ws_ml, slot, o, m, l, rows, D: gl.constexpr):
    """A piece's unnormalized O and its running max and sum (base 2), fp32, its first `rows` rows."""
    r = gl.arange(0, QROWS, layout=gl.SliceLayout(1, o.type.layout))
    d = gl.arange(0, D, layout=gl.SliceLayout(0, o.type.layout))
    gl.store(ws_o + (slot * QROWS + r)[:, None] * D + d[None, :], o, mask=(r < rows)[:, None])
    gl.store(ws_ml + (slot * 2) * QROWS + r, m, mask=r < rows)
    gl.store(ws_ml + (slot * 2 + 1) * QROWS + r, l, mask=r < rows)


@gluon.jit
def _merge(ws_o, ws_ml, out_ptr, b, g, first, n, programs, total, T, HQ, G, D: gl.constexpr):
    """out for pair (b, g) from the partials of the programs its tiles [first, first + n) were dealt to:
    each piece rescaled to the largest max, summed, divided. A program's piece of the pair is its
    slot 0 when its range starts inside the pair, else slot 1 (the pair came after its first piece)."""
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
    r = gl.arange(0, QROWS, layout=gl.SliceLayout(1, layout))
    d = gl.arange(0, D, layout=gl.SliceLayout(0, layout))
    rows = T * G
    p0 = _owner(first, programs, total)
    p1 = _owner(first + n - 1, programs, total)
    m_all = gl.full([QROWS], float("-inf"), gl.float32, layout=gl.SliceLayout(1, layout))
    for p in range(p0, p1 + 1):
        slot = 2 * p + (p * total // programs < first).to(gl.int32)
        m_all = gl.maximum(m_all, gl.load(ws_ml + (slot * 2) * QROWS + r, mask=r < rows, other=float("-inf"),
                                          cache_modifier=".cg"))
    m_all = gl.where(m_all == float("-inf"), 0.0, m_all)
    acc = gl.zeros([QROWS, D], gl.float32, layout=layout)
    sum_l = gl.zeros([QROWS], gl.float32, layout=gl.SliceLayout(1, layout))
    for p in range(p0, p1 + 1):
        slot = 2 * p + (p * total // programs < first).to(gl.int32)
        w = gl.exp2(gl.load(ws_ml + (slot * 2) * QROWS + r, mask=r < rows, other=float("-inf"),
                            cache_modifier=".cg") - m_all)
        sum_l += w * gl.load(ws_ml + (slot * 2 + 1) * QROWS + r, mask=r < rows, other=0.0, cache_modifier=".cg")
        acc += w[:, None] * gl.load(ws_o + (slot * QROWS + r)[:, None] * D + d[None, :], mask=(r < rows)[:, None],
                                    other=0.0, cache_modifier=".cg")
    _store_out(out_ptr, acc / gl.where(sum_l > 0, sum_l, 1.0)[:, None], b, g, T, HQ, G, D)


@gluon.jit
def _attend_piece(k_ring, v_ring, ready, empty, q, i, j0, j1, length, T, G, qk_scale,
                  D: gl.constexpr, STAGES: gl.constexpr):
    """Online softmax over key tiles j0..j1-1 of one pair (ring positions from i): (o, m, l, i)."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    r = gl.arange(0, QROWS, layout=gl.SliceLayout(1, s_layout))
    key = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    last_key = length - T + r // G  # each query's own position: it sees keys up to it
    m = gl.full([QROWS], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l = gl.zeros([QROWS], gl.float32, layout=gl.SliceLayout(1, s_layout))
    o = gl.zeros([QROWS, D], gl.float32, layout=o_layout)
    for j in range(j0, j1):
        s, phase = _slot(i, STAGES)
        mbarrier.wait(ready.index(s), phase)
        scores = warpgroup_mma(q, k_ring.index(s).permute((1, 0)),
                               gl.zeros([QROWS, BLOCK_N], gl.float32, layout=s_layout))
        pos = j * BLOCK_N + key
        seen = (pos[None, :] <= last_key[:, None]) & (r < T * G)[:, None]
        scores = gl.where(seen, scores * qk_scale, float("-inf"))
        p, m_new, l, o = online_softmax(scores, m, l, o, o_layout)  # the product's step kernel's, as this probe had it
        o = warpgroup_mma(gl.convert_layout(p.to(gl.bfloat16), p_layout), v_ring.index(s), o)
        mbarrier.arrive(empty.index(s), count=1)
        m = m_new
        i += 1
    return o, gl.convert_layout(m, gl.SliceLayout(1, o_layout)), gl.convert_layout(l, gl.SliceLayout(1, o_layout)), i


@gluon.jit
def compute_partition(k_ring, v_ring, ready, empty, q_ptr, out_ptr, lens_ptr, ws_o, ws_ml, count_ptr, B, HKV, T,
                      HQ, G, scale, D: gl.constexpr, BP: gl.constexpr, STAGES: gl.constexpr):
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    q_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2)
    qk_scale = scale * LOG2E
    rows, n_all, before_all = _rows(lens_ptr, B, HKV, BP, 4)
    total = gl.sum(n_all, axis=0) * HKV
    programs, lo, hi = _dealt(total)
    if gl.program_id(0) < programs:
        b, n, before, g, j = _pair_at(rows, n_all, before_all, lo, HKV)
        t = lo
        i = 0
        while t < hi:
            first = before + g * n
            j1 = gl.minimum(n, hi - first)
            q = _load_queries(q_ptr, b, g, T, HQ, G, D, q_layout)
            o, m, l, i = _attend_piece(k_ring, v_ring, ready, empty, q, i, j, j1, gl.load(lens_ptr + b), T, G,
                                       qk_scale, D, STAGES)
            if (j == 0) & (j1 == n):  # the whole pair here: finish it
                _store_out(out_ptr, o / gl.where(l > 0, l, 1.0)[:, None], b, g, T, HQ, G, D)
            else:  # a piece: leave the partial; the pair's last piece in merges
                slot = 2 * gl.program_id(0) + (first > lo).to(gl.int32)
                _store_partial(ws_o, ws_ml, slot, o, m, l, T * G, D)
                gl.thread_barrier()
                pieces = _owner(first + n - 1, programs, total) - _owner(first, programs, total) + 1
                arrived = gl.atomic_add(count_ptr + b * HKV + g, 1, sem="acq_rel", scope="gpu")
                if arrived == pieces - 1:
                    _merge(ws_o, ws_ml, out_ptr, b, g, first, n, programs, total, T, HQ, G, D)
                    gl.store(count_ptr + b * HKV + g, 0)  # ready for the next launch
            t, b, n, before, g = _next_pair(rows, n_all, before_all, b, n, before, g, first, hi, HKV)
            j = 0


@gluon.jit
def verify_attention_kernel(k_desc, v_desc, q_ptr, out_ptr, lens_ptr, ws_o, ws_ml, count_ptr, B, HKV, CTX, T, HQ, G,
                            scale, BP: gl.constexpr, STAGES: gl.constexpr):
    """Persistent; the per-(b, g) counters start at zero and are left at zero."""
    D: gl.constexpr = k_desc.block_type.shape[1]
    k_ring = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, D], k_desc.layout)
    v_ring = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, D], v_desc.layout)
    ready, empty = ring_barriers(STAGES)
    gl.warp_specialize([
        (compute_partition, (k_ring, v_ring, ready, empty, q_ptr, out_ptr, lens_ptr, ws_o, ws_ml, count_ptr, B, HKV,
                             T, HQ, G, scale, D, BP, STAGES)),
        (load_partition, (k_desc, v_desc, k_ring, v_ring, ready, empty, lens_ptr, B, HKV, CTX, BP, STAGES)),
    ], [1], [40])


# --------------------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Shape:
    """One verify attention: B rows of T queries, HQ query heads over HKV KV heads of dim D, a cache
    of CTX positions."""
    B: int
    T: int
    HQ: int
    HKV: int
    D: int
    CTX: int

    def check(self) -> None:
        if self.HQ % self.HKV or self.T * (self.HQ // self.HKV) > Q_ROWS:
            raise ValueError(f"{self}: T x G must be at most {Q_ROWS} with G = HQ / HKV whole")
        if self.D not in (64, 128) or self.CTX % KEYS_PER_TILE:
            raise ValueError(f"{self}: D must be 64 or 128, CTX a multiple of {KEYS_PER_TILE}")

    @property
    def stages(self) -> int:
        return min(8, 192 * 1024 // (2 * KEYS_PER_TILE * self.D * 2))


class VerifyAttention:
    """Buffers and launch for one shape: one program per SM, the dealing done in the kernel."""

    def __init__(self, shape: Shape, q, k_cache, v_cache, lens, sms: int):
        shape.check()
        self.shape, dev = shape, q.device
        self.out = torch.empty_like(q)
        self.ws_o = torch.empty(2 * sms, Q_ROWS, shape.D, device=dev, dtype=torch.float32)  # two pieces a program
        self.ws_ml = torch.empty(2 * sms, 2, Q_ROWS, device=dev, dtype=torch.float32)
        self.counts = torch.zeros(shape.B * shape.HKV, device=dev, dtype=torch.int32)  # left at zero by the merges
        layout = gl.NVMMASharedLayout.get_default_for([KEYS_PER_TILE, shape.D], gl.bfloat16)
        k_desc = TensorDescriptor.from_tensor(k_cache.view(-1, shape.D), [KEYS_PER_TILE, shape.D], layout)
        v_desc = TensorDescriptor.from_tensor(v_cache.view(-1, shape.D), [KEYS_PER_TILE, shape.D], layout)
        self.grid = (sms, )
        self.args = (k_desc, v_desc, q, self.out, lens, self.ws_o, self.ws_ml, self.counts, shape.B, shape.HKV,
                     shape.CTX, shape.T, shape.HQ, shape.HQ // shape.HKV, 1 / math.sqrt(shape.D))
        self.kwargs = dict(BP=max(32, triton.next_power_of_2(shape.B)), STAGES=shape.stages, num_warps=4, maxnreg=168)

    def __call__(self):
        verify_attention_kernel[self.grid](*self.args, **self.kwargs)
        return self.out


def deal(lens: list[int], HKV: int, programs: int) -> list[list[tuple[int, int, int, int]]]:
    """What the kernel's dealing gives each program: its pieces (b, g, j0, j1), key tiles j0..j1-1 of
    pair (b, g), in order (the kernel's walk, in Python)."""
    tiles = [-(-n // KEYS_PER_TILE) for n in lens]
    total = sum(tiles) * HKV
    programs = min(programs, total)
    pieces = []
    for i in range(programs):
        lo, hi = i * total // programs, (i + 1) * total // programs
        mine, before = [], 0
        for b, n in enumerate(tiles):
            for g in range(HKV):
                first = before + g * n
                j0, j1 = max(lo - first, 0), min(n, hi - first)
                if j0 < j1:
                    mine.append((b, g, j0, j1))
            before += n * HKV
        pieces.append(mine)
    return pieces


def owner(t: int, programs: int, total: int) -> int:
    """The program whose range holds tile t (the kernel's `_owner`)."""
    return ((t + 1) * programs - 1) // total


def reference(q, k_cache, v_cache, lens):
    """fp32 attention of each row's T queries over its cache, causal among the new positions."""
    B, T, HQ, D = q.shape
    G = HQ // k_cache.shape[1]
    out = torch.empty(B, T, HQ, D)
    for b in range(B):
        n = int(lens[b])
        k = k_cache[b, :, :n].float().repeat_interleave(G, 0)  # [HQ, n, D]
        v = v_cache[b, :, :n].float().repeat_interleave(G, 0)
        scores = torch.einsum("thd,hnd->htn", q[b].float(), k) / math.sqrt(D)
        seen = torch.arange(n)[None, :] <= (n - T + torch.arange(T))[:, None]
        scores = scores.masked_fill(~seen[None], float("-inf"))
        out[b] = torch.einsum("htn,hnd->thd", scores.softmax(-1), v)
    return out


def simulate(shape: Shape, q, k_cache, v_cache, lens, programs: int = 132):
    """The kernel's dealing, tile masks, base-2 online softmax, partial slots and merges in torch on
    the CPU. Pieces run program by program; a pair's merge reads the slots `_merge` reads."""
    B, T, HQ, D = q.shape
    G, scale = HQ // shape.HKV, 1 / math.sqrt(D) * 1.4426950408889634
    lens_l = [int(n) for n in lens]
    tiles = [-(-n // KEYS_PER_TILE) for n in lens_l]
    total = sum(tiles) * shape.HKV
    dealt = deal(lens_l, shape.HKV, programs)
    programs = len(dealt)
    out = torch.full((B, T, HQ, D), float("nan"))
    slots: dict[int, tuple] = {}
    r = torch.arange(Q_ROWS)
    valid = r < T * G
    starts = [sum(tiles[:b]) * shape.HKV for b in range(B)]

    def store(b, g, res):
        out[b, (r // G)[valid], (g * G + r % G)[valid]] = res[valid]

    for i, pieces in enumerate(dealt):
        lo = i * total // programs
        for b, g, j0, j1 in pieces:
            n, first = tiles[b], starts[b] + g * tiles[b]
            qt = torch.zeros(Q_ROWS, D)
            qt[valid] = q[b, (r // G)[valid], (g * G + r % G)[valid]].float()
            m, l, o = torch.full((Q_ROWS, ), float("-inf")), torch.zeros(Q_ROWS), torch.zeros(Q_ROWS, D)
            for j in range(j0, j1):
                pos = j * KEYS_PER_TILE + torch.arange(KEYS_PER_TILE)
                kt = k_cache[b, g, pos.clamp(max=shape.CTX - 1)].float()
                vt = v_cache[b, g, pos.clamp(max=shape.CTX - 1)].float()
                seen = (pos[None, :] <= (lens_l[b] - T + r // G)[:, None]) & valid[:, None]
                sc = (qt @ kt.T * scale).masked_fill(~seen, float("-inf"))
                m_new = torch.maximum(m, sc.max(1).values)
                m_safe = torch.where(m_new == float("-inf"), 0.0, m_new)
                p = torch.exp2(sc - m_safe[:, None])
                alpha = torch.exp2(m - m_safe)
                l, o, m = l * alpha + p.sum(1), o * alpha[:, None] + p.bfloat16().float() @ vt, m_new
            if j0 == 0 and j1 == n:
                store(b, g, o / torch.where(l > 0, l, 1.0)[:, None])
                continue
            slot = 2 * i + int(first > lo)
            if slot in slots:
                raise AssertionError(f"program {i} fills slot {slot} twice")
            slots[slot] = (m, l, o)
            p0, p1 = owner(first, programs, total), owner(first + n - 1, programs, total)
            if i == p1:  # programs run in order here, so the pair's last program is its last piece in
                parts = [slots.pop(2 * p + int(p * total // programs < first)) for p in range(p0, p1 + 1)]
                m_all = torch.stack([pt[0] for pt in parts]).max(0).values
                m_all = torch.where(m_all == float("-inf"), 0.0, m_all)
                w = [torch.exp2(pt[0] - m_all) for pt in parts]
                sum_l = sum(wc * pt[1] for wc, pt in zip(w, parts))
                acc = sum(wc[:, None] * pt[2] for wc, pt in zip(w, parts))
                store(b, g, acc / torch.where(sum_l > 0, sum_l, 1.0)[:, None])
    if slots:
        raise AssertionError(f"partials never merged: slots {sorted(slots)}")
    return out


def inputs(shape: Shape, dev, ragged: bool = True, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(shape.B, shape.T, shape.HQ, shape.D, generator=gen).to(dev, torch.bfloat16)
    k = torch.randn(shape.B, shape.HKV, shape.CTX, shape.D, generator=gen).to(dev, torch.bfloat16)
    v = torch.randn(shape.B, shape.HKV, shape.CTX, shape.D, generator=gen).to(dev, torch.bfloat16)
    low = shape.T if ragged else shape.CTX
    lens = torch.randint(low, shape.CTX + 1, (shape.B, ), generator=gen, dtype=torch.int32)
    if not ragged:
        lens.fill_(shape.CTX)
    return q, k, v, lens.to(dev)


# Llama-3.1-8B's target attention (32 query heads over 8 KV heads, dim 128) and Qwen2.5-0.5B's draft
# (14 over 2, dim 64), at #49's contexts and batches.
SHAPES = [Shape(B, T, 32, 8, 128, ctx) for B, T, ctx in ((1, 4, 512), (8, 4, 1024), (16, 4, 4096), (32, 4, 1024),
                                                           (64, 2, 512), (4, 8, 8192))] + [Shape(8, 4, 14, 2, 64, 1024)]


def run_gpu(args) -> int:
    gpu = hopper_and_copy_rate()
    if gpu is None:
        return 2
    sms, bw = gpu
    print(f"{'B':>3}{'T':>3}{'HQ/HKV':>8}{'D':>5}{'ctx':>6}{'err':>9}{'floor us':>10}{'ours us':>9}{'of copy':>8}"
          f"{'sdpa us':>9}{'of copy':>8}")
    rows = []
    for shape in SHAPES:
        q, k, v, lens = inputs(shape, "cuda")
        attn = VerifyAttention(shape, q, k, v, lens, sms)
        out = attn().float().cpu()
        ref = reference(q.cpu(), k.cpu(), v.cpu(), lens.cpu())
        err = ((out - ref).abs().max() / ref.abs().max()).item()
        if not err < 2e-2:
            raise SystemExit(f"{shape}: relative error {err}")
        kv_bytes = int(lens.sum()) * shape.HKV * shape.D * 2 * 2
        copies = max(1, -(-200_000_000 // (k.numel() * 4)))
        sets = [(q, k, v, lens)] + [inputs(shape, "cuda", seed=s) for s in range(1, copies)]
        ours = graph_time_us([VerifyAttention(shape, *s, sms) for s in sets])
        theirs = graph_time_us([lambda s=s: sdpa(shape, *s) for s in sets])
        floor = kv_bytes / bw * 1e6
        rows.append(dict(kind="attention", model=f"{shape.HQ}/{shape.HKV}x{shape.D}", op="verify", rows=shape.B * shape.T,
                         context=shape.CTX, shape=shape.__dict__, rel_err=err, bytes=kv_bytes, floor_us=floor, us=ours,
                         bw_fraction=floor / ours, sdpa_us=theirs, sdpa_bw_fraction=floor / theirs))
        print(f"{shape.B:>3}{shape.T:>3}{f'{shape.HQ}/{shape.HKV}':>8}{shape.D:>5}{shape.CTX:>6}{err:>9.1e}"
              f"{floor:>10.1f}{ours:>9.1f}{floor / ours:>8.2f}{theirs:>9.1f}{floor / theirs:>8.2f}", flush=True)
        write_probe_result(args.json, sms, bw, timing="cuda graph", shapes=rows)
        del sets
        torch.cuda.empty_cache()
    return 0


def sdpa(shape: Shape, q, k, v, lens):
    """torch's attention over the whole cache with a mask (lengths ragged: the mask holds them)."""
    pos = torch.arange(shape.CTX, device=q.device)
    last = lens[:, None] - shape.T + torch.arange(shape.T, device=q.device)[None, :]  # [B, T]
    mask = (pos[None, None, :] <= last[:, :, None])[:, None]  # [B, 1, T, CTX]
    return torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask,
                                                            enable_gqa=True)


def run_offline(args) -> int:
    print(f"triton {triton.__version__}: verify_attention_kernel for cuda:90 (sm_90a), no GPU")
    for shape in (SHAPES[0], SHAPES[-1]):
        small = Shape(shape.B, shape.T, shape.HQ, shape.HKV, shape.D, 128)
        q, k, v, lens = inputs(small, "cpu")
        attn_args = VerifyAttention(small, q, k, v, lens, 132)
        compiled = compile_for_sm90(verify_attention_kernel, attn_args.args, attn_args.kwargs)
        ptx = compiled.asm["ptx"]
        mmas = sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx)))
        print(f"D={shape.D}: stages {shape.stages}, shared {compiled.metadata.shared} B, wgmma {mmas}, "
              f"TMA {'yes' if 'cp.async.bulk.tensor' in ptx else 'NO'}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Verify-phase decode attention streamed by a warp-specialized "
                                                 "persistent Gluon kernel, against torch SDPA.")
    parser.add_argument("--json")
    parser.add_argument("--offline", action="store_true")
    args = parser.parse_args(argv)
    return run_offline(args) if args.offline else run_gpu(args)


if __name__ == "__main__":
    if "--offline" in sys.argv:
        os.environ.setdefault("TRITON_INTERPRET", "0")
    sys.exit(main())
