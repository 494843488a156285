"""The streamed GEMM (Gluon, Hopper): a residual GEMM's weights streamed once, in whole-K tiles.

    x[M, N] += a[M, K] @ w[N, K]^T      a, w bf16 (a's buffer padded to MPAD rows, which only feed
                                        results the epilogue drops); x the fp32 residual stream

A tile is 64 weight rows (64 columns of x) with the whole K, so no tile is cut in K and no partial
sum leaves its program: tiles are dealt round-robin to the programs (at most one an SM), and each
finished tile is added into x by the program that owns it. In each program:

- a loader warp streams the tile's weight boxes (64 x 64) and a's (MPAD x 64) by TMA into a ring of
  STAGES slots, waiting only for free slots;
- the compute warps run swapped wgmma (the weight box as A, a's rows as N), one in flight while the
  next slot's is issued; a slot is freed once the wgmma after it is issued and it has retired. With
  MPAD = 128 two warpgroups share the tile, 64 of a's rows each;
- the epilogue adds the tile into x and, where the next norm is fused, writes the rows' statistics
  (sums of squares of each STATS_CHUNK columns, kernels/tile.py) and a bf16 copy of the finished rows.

Launched as a programmatic dependent launch (the plan's PDL trigger, "start" or "end"), its programs
may start while the kernel before it ends; both partitions wait for that kernel (griddepcontrol.wait)
before their first load, and the next launch may start once every program has begun its tiles
("start") or finished them ("end"). Loading the ring's first weights before that wait measured no
better (lab/stream_chain: -0.4% to +0.7% against waiting first, on three verify phases).

Measured against the tl template (kernels/gemm.py) alone in lab/stream_chain (`--epilogues`), and in
the verify phase by benchmarks/verify_kernels.py --streamed (results/verify_streamed_h100.json).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from conjugate.kernels.step.ring import ring_barriers, ring_slot

TILE_ROWS = 64  # weight rows a tile: wgmma's M
TILE_K = 64  # K a ring slot: 128 bytes of bf16, the TMA box's inner limit under 128-byte swizzle
_STATS_CHUNK = gl.constexpr(16)  # kernels/tile.py's STATS_CHUNK: columns of x a row statistic


@gluon.jit
def _grid_dependency_wait():
    """griddepcontrol.wait: the kernel before this one on its stream has ended and its writes are visible."""
    gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _launch_dependents():
    """griddepcontrol.launch_dependents: the next launch on this stream may start once every program has."""
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False,
                              pack=1)


@gluon.jit
def _load_partition(w_desc, a_desc, w_ring, a_ring, ready, empty, n_tiles, k_steps, STAGES: gl.constexpr,
                    PDL: gl.constexpr):
    """Each owned tile's weight and activation boxes into the ring, in K order."""
    nbytes: gl.constexpr = w_desc.block_type.nbytes + a_desc.block_type.nbytes
    if PDL != "none":  # a's rows are the kernel before's
        _grid_dependency_wait()
    c = 0
    for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        for k in range(k_steps):
            s, phase = ring_slot(c, STAGES)
            mbarrier.wait(empty.index(s), phase ^ 1)
            mbarrier.expect(ready.index(s), nbytes)
            tma.async_copy_global_to_shared(w_desc, [tile * w_desc.block_type.shape[0], k * w_desc.block_type.shape[1]],
                                            ready.index(s), w_ring.index(s))
            tma.async_copy_global_to_shared(a_desc, [0, k * a_desc.block_type.shape[1]], ready.index(s),
                                            a_ring.index(s))
            c += 1


@gluon.jit
def _residual_epilogue(acc, tile, M, N, x_ptr, stride_x, stats_ptr, stride_stats, copy_ptr, stride_copy,
                       STATS_OUT: gl.constexpr, COPY_OUT: gl.constexpr):
    """x[m, tile * 64 + r] += acc[r, m]; then the finished rows' statistics and copy where asked."""
    TILE: gl.constexpr = acc.shape[0]
    r_local = gl.arange(0, TILE, layout=gl.SliceLayout(1, acc.type.layout))
    r = tile * TILE + r_local
    m = gl.arange(0, acc.shape[1], layout=gl.SliceLayout(0, acc.type.layout))
    mask = (m < M)[None, :] & (r < N)[:, None]
    ptrs = x_ptr + m[None, :] * stride_x + r[:, None]
    new = gl.load(ptrs, mask=mask, other=0.0) + acc
    gl.store(ptrs, new, mask=mask)
    if STATS_OUT:
        sq = gl.where(mask, new * new, 0.0)
        for c in gl.static_range(TILE // _STATS_CHUNK):
            part = gl.sum(gl.where((r_local // _STATS_CHUNK == c)[:, None], sq, 0.0), axis=0)  # [MPAD]
            col = tile * (TILE // _STATS_CHUNK) + c
            gl.store(stats_ptr + m * stride_stats + col, part, mask=(m < M) & (col * _STATS_CHUNK < N))
    if COPY_OUT:
        gl.store(copy_ptr + m[None, :] * stride_copy + r[:, None], new.to(copy_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def _compute_partition(w_ring, a_ring, ready, empty, M, N, n_tiles, k_steps, x_ptr, stride_x, stats_ptr,
                       stride_stats, copy_ptr, stride_copy, STAGES: gl.constexpr, WARPS: gl.constexpr,
                       STATS_OUT: gl.constexpr, COPY_OUT: gl.constexpr, PDL: gl.constexpr):
    if PDL != "none":  # x is read and written below: after the kernel before has ended
        _grid_dependency_wait()
    if PDL == "start":
        _launch_dependents()
    TILE: gl.constexpr = w_ring.shape[1]
    MPAD: gl.constexpr = a_ring.shape[1]
    groups: gl.constexpr = WARPS // 4  # warpgroups side by side over a's rows
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, groups],
                                                         instr_shape=[16, MPAD // groups, 16])
    c = 0
    for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        acc = gl.zeros((TILE, MPAD), dtype=gl.float32, layout=acc_layout)
        for k in range(k_steps):
            s, phase = ring_slot(c + k, STAGES)
            mbarrier.wait(ready.index(s), phase)
            acc = warpgroup_mma(w_ring.index(s), a_ring.index(s).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
            if k > 0:  # the wgmma on the slot before has retired
                before, _ = ring_slot(c + k - 1, STAGES)
                mbarrier.arrive(empty.index(before), count=1)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        last, _ = ring_slot(c + k_steps - 1, STAGES)
        mbarrier.arrive(empty.index(last), count=1)
        _residual_epilogue(acc, tile, M, N, x_ptr, stride_x, stats_ptr, stride_stats, copy_ptr, stride_copy,
                           STATS_OUT, COPY_OUT)
        c += k_steps
    if PDL == "end":
        _launch_dependents()


@gluon.jit
def streamed_residual_kernel(w_desc, a_desc, M, N, K, x_ptr, stride_x, stats_ptr, stride_stats, copy_ptr,
                             stride_copy, STAGES: gl.constexpr, WARPS: gl.constexpr, STATS_OUT: gl.constexpr,
                             COPY_OUT: gl.constexpr, PDL: gl.constexpr):
    """Persistent over the owned tiles; launch with num_warps=WARPS (4, or 8 where MPAD is 128), and
    with launch_pdl=True where PDL is "start" or "end" (the plan's trigger; "none" otherwise)."""
    TILE: gl.constexpr = w_desc.block_type.shape[0]
    BK: gl.constexpr = w_desc.block_type.shape[1]
    MPAD: gl.constexpr = a_desc.block_type.shape[0]
    n_tiles = gl.cdiv(N, TILE)
    k_steps = gl.cdiv(K, BK)
    w_ring = gl.allocate_shared_memory(w_desc.dtype, [STAGES, TILE, BK], w_desc.layout)
    a_ring = gl.allocate_shared_memory(a_desc.dtype, [STAGES, MPAD, BK], a_desc.layout)
    ready, empty = ring_barriers(STAGES)
    gl.warp_specialize([
        (_compute_partition, (w_ring, a_ring, ready, empty, M, N, n_tiles, k_steps, x_ptr, stride_x, stats_ptr,
                              stride_stats, copy_ptr, stride_copy, STAGES, WARPS, STATS_OUT, COPY_OUT, PDL)),
        (_load_partition, (w_desc, a_desc, w_ring, a_ring, ready, empty, n_tiles, k_steps, STAGES, PDL)),
    ], [1], [40])
