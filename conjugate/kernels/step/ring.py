"""The step kernel's weight ring and waits (Gluon, Hopper): a loader partition streams each task's weight
tiles by TMA into a ring of SLOT_ROWS x BK shared-memory slots, waiting only for free slots; the
compute partition stages a task's activation rows by cp.async, multiplies them against the ring's
slots with swap-AB wgmma (weights as the 128- or 2 x 64-row A operand, the RPAD activation rows as N),
and
waits on other programs' counters with bounded acquire spins.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from conjugate.kernels.step import columns as layout

SLOT_ROWS = gl.constexpr(layout.SLOT_ROWS)
HALF = gl.constexpr(layout.HALF_ROWS)
BK = gl.constexpr(layout.K_TILE)
OPS = layout.OPS
(C_OP, C_STEP, C_LAYER, C_TILE, C_KLO, C_KHI, C_SPLITS, C_PARTS, C_DONE, C_WOFF, C_WCNT, C_FOFF, C_FCNT,
 C_ROW0, C_SEG, C_HEAD0, C_COL0, C_TOKEN, C_W1C, C_W1T) = (gl.constexpr(i) for i in range(layout.REC))
REC = gl.constexpr(layout.REC)
STAMP_COLS = gl.constexpr(layout.STAMP_COLS)
(S_START, S_MET, S_STAGED, S_MULTIPLIED, S_END, S_ISSUED, S_ARRIVED) = (gl.constexpr(i) for i in
                                                                        range(layout.STAMP_COLS))
FIELDS = gl.constexpr(32)  # a record as one vector load


# --------------------------------------------------------------------------------------------------
# The ring
# --------------------------------------------------------------------------------------------------

@gluon.jit
def ring_slot(i, STAGES: gl.constexpr):
    """Ring position of the i-th slot filled (a weight tile or part of a history block): (slot, phase of
    that slot's barriers)."""
    return i % STAGES, (i // STAGES) & 1


@gluon.jit
def ring_barriers(STAGES: gl.constexpr):
    """(ready, empty): one mbarrier per ring slot each, initialised and fenced for TMA."""
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    fence_async_shared()  # barrier inits visible to the async proxy before the first copy
    return ready, empty


@gluon.jit
def _fill_slot(ring, ready, empty, i, STAGES: gl.constexpr):
    """Wait until slot i is free, arm its ready barrier for a full slot's bytes; return the slot."""
    s, phase = ring_slot(i, STAGES)
    mbarrier.wait(empty.index(s), phase ^ 1)  # barriers start as if phase 1 had completed
    mbarrier.expect(ready.index(s), SLOT_ROWS * BK * 2)
    return s


@gluon.jit
def history_blocks(lengths_ptr, b, step, chunk, CHUNKS: gl.constexpr, TOKENS: gl.constexpr):
    """Attention chunk `chunk` of sequence b at `step`: its keys [lo, hi) (whole 64-key blocks of the
    length + step + TOKENS keys, cut in CHUNKS) and how many of its blocks lie wholly below the
    sequence's length at launch: the cache's history, which no task of the launch writes, so the
    loader may stream it before any wait."""
    length = gl.load(lengths_ptr + b)
    n = length + step + TOKENS
    size = gl.cdiv(gl.cdiv(n, CHUNKS), 64) * 64
    lo = gl.minimum(chunk * size, n)
    hi = gl.minimum(lo + size, n)
    blocks = gl.maximum(gl.minimum(length // 64 * 64, hi) - lo, 0) // 64
    return lo, hi, blocks


@gluon.jit
def kv_tiles(ring, i, STAGES: gl.constexpr, D: gl.constexpr):
    """The key and value tiles ([64, D] each) of the history block whose first ring slot is the i-th:
    with 64-dim heads both in that slot (keys in its first 64 rows), with 128-dim heads keys there
    and values in the next."""
    s = i % STAGES
    if D == 64:
        return ring.index(s).slice(0, 64), ring.index(s).slice(64, 64)
    else:
        return (ring.index(s)._reinterpret(gl.bfloat16, [64, D], ring.layout),
                ring.index((i + 1) % STAGES)._reinterpret(gl.bfloat16, [64, D], ring.layout))


@gluon.jit
def _load_history(kv_desc, ring, ready, empty, lengths_ptr, rec, i, stamp_ptr, STAGES: gl.constexpr,
                  D: gl.constexpr, KVH: gl.constexpr, L: gl.constexpr, S: gl.constexpr, BATCH: gl.constexpr,
                  CHUNKS: gl.constexpr, TOKENS: gl.constexpr, STAMPS: gl.constexpr):
    """An attention task's history blocks (history_blocks) into the ring, keys then values, each block
    KV_SLOTS slots (kv_tiles). kv_desc views the [2, L, B, KVH, S, D] cache as rows of D. With STAMPS,
    stamps (at stamp_ptr) when it issued the first block, or when it reached a task with none."""
    gl.static_assert((D == 64) or (D == 128), "the ring holds history blocks of 64- or 128-dim heads")
    b = gl.load(rec + C_SEG)
    g = gl.load(rec + C_HEAD0)
    layer = gl.load(rec + C_LAYER)
    lo, hi, blocks = history_blocks(lengths_ptr, b, gl.load(rec + C_STEP), gl.load(rec + C_KLO), CHUNKS, TOKENS)
    k_row = ((layer * BATCH + b) * KVH + g) * S + lo
    v_row = k_row + L * BATCH * KVH * S
    if STAMPS:
        if blocks == 0:
            gl.store(stamp_ptr, now(b))
    for j in range(blocks):
        k_tile, v_tile = kv_tiles(ring, i, STAGES, D)
        s = _fill_slot(ring, ready, empty, i, STAGES)
        tma.async_copy_global_to_shared(kv_desc, [k_row + j * 64, 0], ready.index(s), k_tile)
        if D == 128:  # the values fill the next slot
            s = _fill_slot(ring, ready, empty, i + 1, STAGES)
        tma.async_copy_global_to_shared(kv_desc, [v_row + j * 64, 0], ready.index(s), v_tile)
        if STAMPS:
            if j == 0:
                gl.store(stamp_ptr, now(b))
        i += KV_SLOTS(D)
    return i


@gluon.constexpr_function
def KV_SLOTS(D):
    """Ring slots a history block takes (its keys and values: 2 x 64 x D bf16 over 16 KB slots)."""
    return 2 * 64 * D * 2 // (layout.SLOT_ROWS * layout.K_TILE * 2)


@gluon.jit
def step_loader(qkv_desc, o_desc, gu_desc, d_desc, head_desc, kv_desc, ring, ready, empty, table_ptr, list_ptr,
                bounds_ptr, lengths_ptr, stamps_ptr, STAGES: gl.constexpr, STAMPS: gl.constexpr,
                RING_KV: gl.constexpr, D: gl.constexpr, KVH: gl.constexpr, L: gl.constexpr, S: gl.constexpr,
                BATCH: gl.constexpr, CHUNKS: gl.constexpr, TOKENS: gl.constexpr):
    """Every weight tile of this program's GEMM tasks, in task order; waits for free slots only. With
    RING_KV also each attention task's history blocks (_load_history). With STAMPS, stamps when it
    issued each task's first tile."""
    pid = gl.program_id(0)
    i = 0
    for n in range(gl.load(bounds_ptr + pid), gl.load(bounds_ptr + pid + 1)):
        task = gl.load(list_ptr + n)
        rec = table_ptr + task * REC
        op = gl.load(rec + C_OP)
        row0 = gl.load(rec + C_ROW0)
        k_lo = gl.load(rec + C_KLO) * BK
        if RING_KV:
            if op == 2:
                i = _load_history(kv_desc, ring, ready, empty, lengths_ptr, rec, i,
                                  stamps_ptr + task * STAMP_COLS + S_ISSUED, STAGES, D, KVH, L, S, BATCH, CHUNKS,
                                  TOKENS, STAMPS)
        if (op != 0) & (op != 2):
            for kk in range(gl.load(rec + C_KHI) - gl.load(rec + C_KLO)):
                s = _fill_slot(ring, ready, empty, i, STAGES)
                col = k_lo + kk * BK
                if op == 1:
                    tma.async_copy_global_to_shared(qkv_desc, [row0, col], ready.index(s), ring.index(s))
                elif op == 3:
                    tma.async_copy_global_to_shared(o_desc, [row0, col], ready.index(s), ring.index(s))
                elif op == 4:
                    tma.async_copy_global_to_shared(gu_desc, [row0, col], ready.index(s), ring.index(s))
                elif op == 5:
                    tma.async_copy_global_to_shared(d_desc, [row0, col], ready.index(s), ring.index(s))
                else:
                    tma.async_copy_global_to_shared(head_desc, [row0, col], ready.index(s), ring.index(s))
                if STAMPS:
                    if kk == 0:
                        gl.store(stamps_ptr + task * STAMP_COLS + S_ISSUED, now(task))
                i += 1


# --------------------------------------------------------------------------------------------------
# Activations and GEMM tiles
# --------------------------------------------------------------------------------------------------

@gluon.jit
def stage_activations(act, src_ptr, row_stride, B, col0, n_tiles, RPAD: gl.constexpr):
    """act[kk] = src[:B, col0 + kk*BK : +BK] for kk < n_tiles (rows past B zero), by cp.async through
    L2 (.cg: another program may have just written src), then made visible to wgmma."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    rows = gl.arange(0, RPAD, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, BK, layout=gl.SliceLayout(0, layout))
    mask = (rows < B)[:, None] & (cols < BK)[None, :]
    for kk in range(n_tiles):
        ptrs = src_ptr + rows[:, None] * row_stride + (col0 + kk * BK + cols)[None, :]
        async_copy.async_copy_global_to_shared(act.index(kk), ptrs, mask=mask, cache_modifier=".cg")
    async_copy.commit_group()
    async_copy.wait_group(0)
    fence_async_shared()
    gl.thread_barrier()


@gluon.jit
def free_slot(empty, i, STAGES: gl.constexpr):
    """Hand ring slot (i % STAGES) back to the loader."""
    mbarrier.arrive(empty.index(i % STAGES), count=1)


@gluon.jit
def paired_tile(ring, ready, empty, act, i, n_tiles, STAGES: gl.constexpr, MMA_DEPTH: gl.constexpr, acc_g, acc_u):
    """A paired tile (qkv's heads' halves, gate_up's gate over up): x @ W^T of each 64-row half of the
    slots, transposed, added over n_tiles slots into the two [HALF, RPAD] fp32 accumulators. With
    MMA_DEPTH 2 a slot's pair of wgmma is still running while the next slot's is issued (its slot
    is handed back once it is done); with 1 each slot's finishes first."""
    for kk in range(n_tiles):
        s, phase = ring_slot(i, STAGES)
        mbarrier.wait(ready.index(s), phase)
        slot = ring.index(s)
        x_t = act.index(kk).permute((1, 0))
        acc_g = warpgroup_mma(slot.slice(0, HALF), x_t, acc_g, is_async=True)
        acc_u = warpgroup_mma(slot.slice(HALF, HALF), x_t, acc_u, is_async=True)
        if MMA_DEPTH == 1:
            acc_g, acc_u = warpgroup_mma_wait(num_outstanding=0, deps=(acc_g, acc_u))
            free_slot(empty, i, STAGES)
        else:
            acc_g, acc_u = warpgroup_mma_wait(num_outstanding=2, deps=(acc_g, acc_u))  # the slot before's pair
            if kk > 0:
                free_slot(empty, i - 1, STAGES)
        i += 1
    if MMA_DEPTH > 1:
        acc_g, acc_u = warpgroup_mma_wait(num_outstanding=0, deps=(acc_g, acc_u))
        if n_tiles > 0:
            free_slot(empty, i - 1, STAGES)
    return acc_g, acc_u, i


@gluon.jit
def single_tile(ring, ready, empty, act, i, n_tiles, STAGES: gl.constexpr, MMA_DEPTH: gl.constexpr, acc):
    """x @ W_tile^T transposed (o_proj, down, lm_head), added over n_tiles slots into the one
    [SLOT_ROWS, RPAD] fp32 accumulator; MMA_DEPTH as in paired_tile."""
    for kk in range(n_tiles):
        s, phase = ring_slot(i, STAGES)
        mbarrier.wait(ready.index(s), phase)
        acc = warpgroup_mma(ring.index(s), act.index(kk).permute((1, 0)), acc, is_async=True)
        if MMA_DEPTH == 1:
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
            free_slot(empty, i, STAGES)
        else:
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))  # the slot before's wgmma
            if kk > 0:
                free_slot(empty, i - 1, STAGES)
        i += 1
    if MMA_DEPTH > 1:
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        if n_tiles > 0:
            free_slot(empty, i - 1, STAGES)
    return acc, i


# --------------------------------------------------------------------------------------------------
# Counters and the table
# --------------------------------------------------------------------------------------------------

@gluon.jit
def now(anchor):
    """The GPU's global nanosecond timer (anchor: any int32 scalar, for the asm's operand)."""
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [anchor], dtype=gl.int64, is_pure=False,
                                     pack=1)


@gluon.jit
def acquire(counter_ptr, target, error_ptr, spin_limit):
    """Wait (bounded) until counter >= target. One acquire poll when the counter is already there (the
    common case); otherwise spin, unless a spin anywhere has already run out: the launch is then a
    failed check (the error word), and a wrong table ends in about one spin limit, not one per wait."""
    seen = gl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    if seen < target:
        if gl.atomic_add(error_ptr, 0, sem="relaxed", scope="gpu") == 0:
            spins = 0
            while (seen < target) & (spins < spin_limit):
                seen = gl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
                spins += 1
            if seen < target:
                gl.atomic_add(error_ptr, 1, sem="relaxed", scope="gpu")
    gl.thread_barrier()


@gluon.jit
def wait_all(waits_ptr, offset, count, counter_ptr, error_ptr, spin_limit):
    """Each (counter, target) of the task's list."""
    for j in range(count):
        c = gl.load(waits_ptr + 2 * (offset + j))
        target = gl.load(waits_ptr + 2 * (offset + j) + 1)
        acquire(counter_ptr + c, target, error_ptr, spin_limit)


@gluon.jit
def release(counter_ptr):
    """Publish this program's writes (every warp's, ordered by the barrier) to waiting programs."""
    gl.thread_barrier()
    gl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")


@gluon.jit
def record(table_ptr, task):
    """Task `task`'s record as one [FIELDS] vector (one round trip; issued a task ahead)."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    f = gl.arange(0, FIELDS, layout=layout)
    return gl.load(table_ptr + task * REC + f, mask=f < REC, other=0)


@gluon.jit
def field(record, i: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    f = gl.arange(0, FIELDS, layout=layout)
    return gl.sum(gl.where(f == i, record, 0), axis=0)
