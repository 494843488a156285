"""What one grid-wide barrier of a persistent launch costs, against what one launch costs, on the GPU.

    python lab/experiments/barrier_cost.py [--grids 132 264 528 1056] [--groups 1 4 16 32] [--json OUT.json]

A persistent launch (persist.py) puts a barrier where separate launches had a kernel boundary. Per
grid (programs, all resident at once: the kernel holds few registers) and barrier kind (`groups`:
1 is one counter for the whole grid, more is the two-level barrier), a kernel of R barriers and
nothing else is timed against one of none, from CUDA graphs of ten calls: (t_R - t_0) / R per
barrier. Beside it, an empty kernel of the same grid launched back to back: what a kernel boundary
costs in a CUDA graph. Every kernel first checks its counters come back zeroed.

Then, in a process of its own (the CUDA context does not survive it), a barrier told to wait for
one program more than the grid has: it must stop with a CUDA error after persist.SPIN_LIMIT polls,
not hang; the seconds it took are reported (`--no-trap-check` skips it).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from conjugate.cli.arguments import output_file, positive  # noqa: E402
from conjugate.compiler.persist import grid_barrier, grid_exit, sync_words  # noqa: E402
from conjugate.evaluate.timing import time_per_call  # noqa: E402

ROUNDS = 32
CALLS = 10


@triton.jit
def barriers(sync, rounds, GROUPS: tl.constexpr):
    programs = tl.num_programs(0)
    for r in range(rounds):
        grid_barrier(sync, r, programs, GROUPS)
    grid_exit(sync, rounds, programs, GROUPS)


@triton.jit
def short_by_one(sync, GROUPS: tl.constexpr):
    """A barrier waiting for one program more than the grid has: it can only give up."""
    grid_barrier(sync, 0, tl.num_programs(0) + 1, GROUPS)


@triton.jit
def empty(out):
    if tl.program_id(0) == -1:  # never (the compiler drops it): a kernel that does nothing
        tl.store(out, 0)


def per_barrier_us(grid: int, groups: int, device: torch.device) -> float:
    sync = torch.zeros(sync_words(ROUNDS, groups), dtype=torch.int32, device=device)

    def run(rounds: int):
        return lambda: barriers[(grid,)](sync, rounds, GROUPS=groups, num_warps=4)

    for rounds in (0, ROUNDS):  # compiled, and its counters reset by the last program out
        run(rounds)()
        torch.cuda.synchronize()
        if int(sync.abs().sum()):
            raise SystemExit(f"grid {grid}, groups {groups}: counters not reset after {rounds} barriers")
    none, full = (time_per_call(run(r), device, CALLS) for r in (0, ROUNDS))
    return (full - none) / ROUNDS


def stuck_barrier(groups: int) -> None:
    """Run short_by_one (in a process of its own): exits through the CUDA error its trap raises."""
    device = torch.device("cuda")
    sync = torch.zeros(sync_words(1, groups), dtype=torch.int32, device=device)
    short_by_one[(8,)](sync, GROUPS=groups)
    torch.cuda.synchronize()


def trap_check(groups: int, timeout_s: float = 120.0) -> dict:
    """A stuck barrier's process: how it ended and after how many seconds."""
    started = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, __file__, "--stuck", str(groups)], capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"groups": groups, "ended": f"still waiting after {timeout_s:g} s: the barrier did not give up",
                "seconds": timeout_s}
    said = [line for line in done.stderr.splitlines() if "error" in line.lower()][-1:] or ["(no error printed)"]
    return {"groups": groups, "ended": f"exit {done.returncode}: {said[0].strip()[:200]}",
            "seconds": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grids", nargs="+", type=positive, default=[132, 264, 528, 1056])
    parser.add_argument("--groups", nargs="+", type=positive, default=[1, 4, 16, 32])
    parser.add_argument("--json", type=output_file)
    parser.add_argument("--no-trap-check", action="store_true")
    parser.add_argument("--stuck", type=positive, metavar="GROUPS", help=argparse.SUPPRESS)  # a trap check's process
    args = parser.parse_args()
    if args.stuck:
        return stuck_barrier(args.stuck)
    device = torch.device("cuda")
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "command": " ".join(sys.argv), "rounds": ROUNDS, "rows": []}
    scratch = torch.zeros(1, dtype=torch.int32, device=device)
    for grid in args.grids:
        launch_us = time_per_call(lambda: empty[(grid,)](scratch, num_warps=4), device, CALLS)
        row = {"grid": grid, "launch_us": launch_us,
               "barrier_us": {g: per_barrier_us(grid, g, device) for g in args.groups}}
        out["rows"].append(row)
        print(json.dumps(row), flush=True)
        if args.json:
            args.json.write_text(json.dumps(out, indent=1) + "\n")
    if not args.no_trap_check:
        out["trap_check"] = [trap_check(groups) for groups in (1, 4)]  # both barrier kinds
        print(json.dumps(out["trap_check"]), flush=True)
        if args.json:
            args.json.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{'grid':>5} {'empty launch us':>15}  " + "  ".join(f"{'groups ' + str(g):>10}" for g in args.groups))
    for r in out["rows"]:
        cells = "  ".join(f"{r['barrier_us'][g]:10.2f}" for g in args.groups)
        print(f"{r['grid']:5d} {r['launch_us']:15.2f}  {cells}")


if __name__ == "__main__":
    main()
