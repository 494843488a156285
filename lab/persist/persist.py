"""Grid-wide ordering inside a persistent launch (plan `persist`).

A persistent launch runs its parts one after another on a fixed grid: program `pid` of P takes
tiles pid, pid + P, ... of each part, then waits at a barrier until every program has finished
that part, so the next part reads what the whole grid wrote. The barrier is a counter per part in
global memory: each program adds one with release semantics after its stores, then spins with
acquire reads until the count reaches P. The last program to leave resets the counters for the
next launch (a stream runs the next launch only after this one ended).

A barrier is an arrival (`grid_arrive`) and a wait (`grid_wait`). With `preload` the two are apart: after
its tiles of a part a program arrives, and each GEMM tile of the next part loads its first weight step
into registers before it waits (gemm.py's WAIT_GRID), as a programmatic dependent launch's does
before its wait (a program with no tile of that part does not wait there: the next barrier still
counts only programs done with both parts).

While it waits at a barrier a program can already pull the next part's weights toward the GPU's L2
cache (`prefetch`: weights never depend on the part before; prefetching into L2 is coherent, so a
prefetched KV-cache line a previous part rewrites is read fresh): tile families that have a
prefetch function take the same arguments as their tile function (PREFETCHES).

With BARRIER_GROUPS > 1 the barrier is two-level, so no one counter takes every program's atomic
while every program polls it: program pid arrives on its group's counter (pid % GROUPS), the last of
a group on the top counter, and the last group sets a flag that every program waits on; each counter
and the flag sit in a 128-byte line of their own (SYNC_LINE words apart). Every arrival is acq_rel,
so the flag's release carries what every program stored (benchmarks/barrier_cost.py times both).

A barrier that waits past SPIN_LIMIT polls (seconds; a legitimate wait is one part's time, or the
other stream's kernels ending) stops the kernel with a trap, so a grid that cannot all be resident
fails its evaluation at once instead of hanging until the evaluator's time limit.

With `order: tickets` (`ticket_source` in codegen.py) the parts' tiles are dealt in dependency order
instead: each program takes the next ticket from a counter (an atomic add), ticket t naming tile t of
the parts' tiles laid end to end, runs that tile and counts it in on its part's counter (release);
a tile of part i first waits (acquire polls) until part i - 1's counter holds all of its tiles. A
program holds a ticket only while it runs, so every tile a waiting one needs belongs to a program
already running: no program need be resident for another to finish, the grid may be any size (one
program per tile by default, as launches are; the plan's `programs` take tickets in turn), and the
other stream's thread blocks start on the SMs a finished program leaves. Part i done implies every
part before it done (each of its tiles waited for the part before), so reads and rewrites of a
buffer are ordered as by barriers. The sync buffer: a line per counter of the parts but the last,
then the ticket counter and the exit counter; the last program out zeroes it.

With barriers every program must be resident at once, or a waiting program holds its SM while a program it
waits for never starts. P starts at one program per SM (always resident); once the kernel is
compiled, `resident_programs` says how many fit on the GPU at once by its registers, shared memory
and warps, and P grows to that (the plan's `programs` when set, refused above it): one program per
SM keeps too few loads in flight (on the H200 a llama-3.2-1b layer took 1.5x its launches). Under
the Triton interpreter programs run one after another, so P is 1 there.
"""
from __future__ import annotations

import triton
import triton.language as tl

from conjugate.compiler.tile import INTERPRETING

# Hopper (H100, H200) per multiprocessor: four sub-partitions, each with its own register file
SUBPARTITIONS = 4
SUBPARTITION_REGISTERS = 16384
SM_THREADS = 2048
SM_PROGRAMS = 32
SM_SHARED_BYTES = 233472  # 228 KB, 1 KB of it reserved per program
REGISTER_UNIT = 256  # registers are given to a warp in units of 256
SHARED_UNIT = 128  # and shared memory to a program in units of 128 bytes


def resident_programs(registers: int, shared_bytes: int, num_warps: int, sms: int) -> int:
    """How many programs of a kernel the GPU holds at once (occupancy by Hopper's limits, as CUDA's
    occupancy calculator counts: a warp's registers come from one sub-partition's file)."""
    per_warp = -(-max(registers, 1) * 32 // REGISTER_UNIT) * REGISTER_UNIT
    warps = SUBPARTITION_REGISTERS // per_warp * SUBPARTITIONS
    shared = -(-shared_bytes // SHARED_UNIT) * SHARED_UNIT + 1024
    per_sm = min(warps // num_warps, SM_THREADS // (32 * num_warps), SM_PROGRAMS, SM_SHARED_BYTES // shared)
    return max(per_sm, 0) * sms


# tile function -> (module, function) issuing its weight prefetches, same arguments as the tile
PREFETCHES = {"gemm_tile": ("conjugate.compiler.gemm", "gemm_prefetch"),
              "attn_tile": ("conjugate.compiler.attention", "attn_prefetch"),
              "mlp_tile": ("conjugate.compiler.mlp", "mlp_prefetch")}
L2_LINE_BITS = tl.constexpr(1024)  # a 128-byte line: 1024 // an element's bits = its elements
PREFETCH_L2_SHARE = 0.5  # a part is prefetched only when its bytes fit in this share of the L2 cache
ASSUMED_L2_BYTES = 50 * 2**20  # an H100's or H200's L2 cache, where no GPU says (offline compiles)


@triton.jit
def prefetch_l2(ptrs):
    """Ask the L2 cache for the lines at `ptrs` (no registers wait for them; GPU only)."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n    mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


SPIN_LIMIT = tl.constexpr(1 << 22)  # polls of a barrier before it gives up: ~3 s at ~0.7 us an L2 round trip
TRAPS = tl.constexpr(not INTERPRETING)  # the interpreter has no inline PTX (and runs one program)


@triton.jit
def give_up(polls):
    """Stop the kernel (a trap: the launch fails with a CUDA error) once `polls` passes SPIN_LIMIT."""
    if TRAPS:
        if polls > SPIN_LIMIT:
            tl.inline_asm_elementwise("trap;\n    mov.u32 $0, $1;", "=r,r", [polls], dtype=tl.int32, is_pure=False,
                                      pack=1)


# Programs per counter of a grid barrier: 1 is one counter for the whole grid.
BARRIER_GROUPS = 1
SYNC_LINE_WORDS = 32  # int32 words in a 128-byte line: counters this far apart never share a line
SYNC_LINE = tl.constexpr(SYNC_LINE_WORDS)


def sync_words(barriers: int, groups: int | None = None) -> int:
    """The int32 words of a persistent launch's sync buffer: per barrier its group counters, the top
    counter and the flag, each on a line of its own; then the exit counter (`groups`: BARRIER_GROUPS
    as it is now)."""
    groups = BARRIER_GROUPS if groups is None else groups
    if groups < 1:
        raise ValueError(f"barrier groups {groups}: at least 1 (one counter for the whole grid)")
    return (barriers * (groups + 2) + 1) * SYNC_LINE_WORDS


@triton.jit
def barrier_word(sync_ptr, index, GROUPS: tl.constexpr = 1):
    """The word a program polls to pass barrier `index`: its counter (one group) or its flag."""
    base = sync_ptr + index * ((GROUPS + 2) * SYNC_LINE)
    if GROUPS == 1:
        return base
    else:
        return base + (GROUPS + 1) * SYNC_LINE


@triton.jit
def barrier_target(programs, GROUPS: tl.constexpr = 1):
    """What that word holds once every program has arrived: the count, or the flag's 1."""
    if GROUPS == 1:
        return programs
    else:
        return programs * 0 + 1


@triton.jit
def grid_arrive(sync_ptr, index, programs, GROUPS: tl.constexpr = 1):
    """Count this program in at barrier `index` (its stores released to whoever passes the barrier)."""
    tl.debug_barrier()  # every thread of this program has stored its part of the tile
    base = sync_ptr + index * ((GROUPS + 2) * SYNC_LINE)
    if GROUPS == 1:
        tl.atomic_add(base, 1, sem="release", scope="gpu")
    else:
        group = tl.program_id(0) % GROUPS
        members = (programs - group + GROUPS - 1) // GROUPS  # programs whose pid % GROUPS is `group`
        if tl.atomic_add(base + group * SYNC_LINE, 1, sem="acq_rel", scope="gpu") == members - 1:
            top = tl.atomic_add(base + GROUPS * SYNC_LINE, 1, sem="acq_rel", scope="gpu")
            if top == tl.minimum(programs, GROUPS) - 1:  # the last group in: everyone may go
                tl.atomic_xchg(base + (GROUPS + 1) * SYNC_LINE, 1, sem="release", scope="gpu")


@triton.jit
def grid_wait(word_ptr, target):
    """Poll `word_ptr` (barrier_word) with acquire reads until it holds `target` (barrier_target):
    every program has arrived, and what they stored before is visible."""
    seen = tl.atomic_add(word_ptr, 0, sem="acquire", scope="gpu")
    polls = 0
    while seen < target:
        seen = tl.atomic_add(word_ptr, 0, sem="acquire", scope="gpu")
        polls += 1
        give_up(polls)
    tl.debug_barrier()


@triton.jit
def grid_barrier(sync_ptr, index, programs, GROUPS: tl.constexpr = 1):
    """Wait until all `programs` programs have passed barrier `index` (arrive, then wait)."""
    grid_arrive(sync_ptr, index, programs, GROUPS)
    grid_wait(barrier_word(sync_ptr, index, GROUPS), barrier_target(programs, GROUPS))


@triton.jit
def grid_exit(sync_ptr, barriers, programs, GROUPS: tl.constexpr = 1):
    """After the last part: the last program out zeroes every barrier's words and the exit counter
    (the next launch on the stream starts after this one ends, and sees them zeroed)."""
    tl.debug_barrier()
    words = barriers * ((GROUPS + 2) * SYNC_LINE)
    left = tl.atomic_add(sync_ptr + words, 1, sem="acq_rel", scope="gpu")
    if left == programs - 1:
        for w0 in range(0, words + SYNC_LINE, SYNC_LINE):
            tl.store(sync_ptr + w0 + tl.arange(0, SYNC_LINE), tl.zeros([SYNC_LINE], tl.int32))


def ticket_words(parts: int) -> int:
    """The int32 words of a ticket-ordered launch's sync buffer: a line per counter of the parts but the
    last, the ticket counter's line, the exit counter's line."""
    if parts < 2:
        raise ValueError(f"a ticket-ordered launch has two parts or more, got {parts}")
    return (parts + 1) * SYNC_LINE_WORDS


@triton.jit
def take_ticket(sync_ptr, PARTS: tl.constexpr):
    """The next ticket: the tile this program runs next (tiles of all parts in dependency order)."""
    return tl.atomic_add(sync_ptr + (PARTS - 1) * SYNC_LINE, 1, sem="relaxed", scope="gpu")


@triton.jit
def part_word(sync_ptr, part):
    """The counter of the tiles of `part` done."""
    return sync_ptr + part * SYNC_LINE


@triton.jit
def part_done(sync_ptr, part):
    """Count this program's tile of `part` in (its stores released to whoever acquires the count)."""
    tl.debug_barrier()  # every thread of this program has stored its part of the tile
    tl.atomic_add(sync_ptr + part * SYNC_LINE, 1, sem="release", scope="gpu")


@triton.jit
def tickets_exit(sync_ptr, programs, PARTS: tl.constexpr):
    """After a program's last ticket: the last program out zeroes the counters, the ticket counter and
    the exit counter (the next launch on the stream starts after this one ends, and sees them zeroed)."""
    tl.debug_barrier()
    left = tl.atomic_add(sync_ptr + PARTS * SYNC_LINE, 1, sem="acq_rel", scope="gpu")
    if left == programs - 1:
        for w0 in range(0, (PARTS + 1) * SYNC_LINE, SYNC_LINE):
            tl.store(sync_ptr + w0 + tl.arange(0, SYNC_LINE), tl.zeros([SYNC_LINE], tl.int32))
