"""Grid-wide ordering inside a persistent launch (plan `persist`).

A persistent launch runs its parts one after another on a fixed grid: program `pid` of P takes
tiles pid, pid + P, ... of each part, then waits at a barrier until every program has finished
that part, so the next part reads what the whole grid wrote. The barrier is a counter per part in
global memory: each program adds one with release semantics after its stores, then spins with
acquire reads until the count reaches P. The last program to leave resets the counters for the
next launch (a stream runs the next launch only after this one ended).

While it waits at a barrier a program can already pull the next part's weights toward the GPU's L2
cache (`prefetch`: weights never depend on the part before; prefetching into L2 is coherent, so a
prefetched KV-cache line a previous part rewrites is read fresh): tile families that have a
prefetch function take the same arguments as their tile function (PREFETCHES).

Every program must be resident at once, or a waiting program holds its SM while a program it
waits for never starts. P starts at one program per SM (always resident); once the kernel is
compiled, `resident_programs` says how many fit on the GPU at once by its registers, shared memory
and warps, and P grows to that (the plan's `programs` when set, refused above it): one program per
SM keeps too few loads in flight (on the H200 a llama-3.2-1b layer took 1.5x its launches). Under
the Triton interpreter programs run one after another, so P is 1 there.
"""
from __future__ import annotations

import triton
import triton.language as tl

# Hopper (H100, H200) per multiprocessor
SM_REGISTERS = 65536
SM_THREADS = 2048
SM_PROGRAMS = 32
SM_SHARED_BYTES = 233472  # 228 KB, 1 KB of it reserved per program
REGISTER_UNIT = 256  # registers are given to a warp in units of 256


def resident_programs(registers: int, shared_bytes: int, num_warps: int, sms: int) -> int:
    """How many programs of a kernel the GPU holds at once (occupancy, Hopper's limits)."""
    per_warp = -(-max(registers, 1) * 32 // REGISTER_UNIT) * REGISTER_UNIT
    per_sm = min(SM_REGISTERS // (per_warp * num_warps), SM_THREADS // (32 * num_warps), SM_PROGRAMS,
                 SM_SHARED_BYTES // (shared_bytes + 1024))
    return max(per_sm, 0) * sms


# tile function -> (module, function) issuing its weight prefetches, same arguments as the tile
PREFETCHES = {"gemm_tile": ("conjugate.compiler.gemm", "gemm_prefetch"),
              "attn_tile": ("conjugate.compiler.attention", "attn_prefetch")}
L2_LINE_ELEMENTS = tl.constexpr(64)  # elements of 2 bytes a 128-byte line holds


@triton.jit
def prefetch_l2(ptrs):
    """Ask the L2 cache for the lines at `ptrs` (no registers wait for them; GPU only)."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n    mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def grid_barrier(sync_ptr, index, programs):
    """Wait until all `programs` programs have passed barrier `index`."""
    tl.debug_barrier()  # every thread of this program has stored its part of the tile
    tl.atomic_add(sync_ptr + index, 1, sem="release", scope="gpu")
    arrived = tl.atomic_add(sync_ptr + index, 0, sem="acquire", scope="gpu")
    while arrived < programs:
        arrived = tl.atomic_add(sync_ptr + index, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def grid_exit(sync_ptr, barriers, programs):
    """After the last part: the last program out zeroes the `barriers` counters and its own."""
    tl.debug_barrier()
    left = tl.atomic_add(sync_ptr + barriers, 1, sem="acq_rel", scope="gpu")
    if left == programs - 1:
        for i in range(barriers + 1):
            tl.atomic_xchg(sync_ptr + i, 0, sem="relaxed", scope="gpu")
