"""The step kernel's split-K finish in isolation: what a split tile's pieces pay to hand their partial
sums to the tile's last piece (`lab/step_stages`: the finish is the largest part of the small drafts'
work, 1.3-4.6 us a task, most of it the parts counter's acq_rel trip behind the tile's fp32 atomics).

Every program runs TASKS tasks back to back, no waits between them; task t of program p is piece
(t * P + p) % SPLITS of tile (t * P + p) // SPLITS, so a tile's pieces run at once on neighbouring
programs, as the step table deals them. A piece holds a [128, C] fp32 partial (128 weight rows, C
batch rows, as a swap-AB accumulator) and finishes one of two ways:

* `atomic` (the step kernel today): the partial is added into the tile's fp32 sums by relaxed atomics
  (all pieces of a tile on the same addresses), then the parts counter (acq_rel); the last piece in
  reads the sums;
* `slots`: the partial is stored into the piece's own slot (plain stores, no address shared), then
  the parts counter (acq_rel); the last piece in reads every slot and adds them;
* `count`: nothing written, only the parts counter: its trip alone, the floor both forms sit on.

The last piece stores the tile's sum (`count`: nothing). Checked against the sum of the partials before it is timed. Per
form: the kernel's time (CUDA events, median of REPS) and, from %globaltimer stamps, the median and
90th percentile of a piece's counter trip (the acq_rel's answer after its writes) and of its finish
(from its first write to its end, the last piece's read and store included). Each form is timed
twice: alone (`idle`), and `loaded`, beside a read stream on a side stream (benchmarks/kernel_sweep's
stream_read over 2 GiB, two programs an SM), as the step kernel's loader streams weights while its
compute warpgroup counts: the trip's writes then queue behind that traffic.

    python lab/split_finish/probe.py --json OUT.json          # a GPU
    python lab/split_finish/probe.py --check                  # the forms' sums on the CPU (interpreter)
    python lab/split_finish/probe.py --offline                # both forms compiled for sm_90a here

Lab code: nothing in conjugate/ imports it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

if "--check" in sys.argv:  # the interpreter, before anything imports triton
    os.environ["TRITON_INTERPRET"] = "1"
elif "--offline" in sys.argv:  # Triton's compiler, not its interpreter
    os.environ["TRITON_INTERPRET"] = "0"

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

TILE_ROWS, TILE_COLUMNS = 128, 16  # a weight tile's rows (the swap-AB accumulator's M), its N (C of them real)
ROWS, COLUMNS = tl.constexpr(TILE_ROWS), tl.constexpr(TILE_COLUMNS)  # the same, in the kernel
FORMS = ("atomic", "slots", "count")  # FORM, as the kernel takes it: the index
LOADS = ("idle", "loaded")  # the probe alone, or beside a read stream (Reader)


@triton.jit
def _now(anchor):
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [anchor], dtype=tl.int64, is_pure=False,
                                     pack=1)


@triton.jit
def _partial(tile, piece, r, c):
    """A piece's partial: small integers, so any order of adding them is exact."""
    return ((tile * 7 + piece * 3 + r[:, None] + c[None, :] * 5) % 13 - 6).to(tl.float32)


@triton.jit
def _write(sums_ptr, slots_ptr, tile, piece, part, offs, mask, SPLITS: tl.constexpr, FORM: tl.constexpr):
    """The piece's partial into the tile's sums (atomics) or into its own slot (stores)."""
    if FORM == 1:
        tl.store(slots_ptr + (tile * SPLITS + piece) * ROWS * COLUMNS + offs, part, mask=mask)
    elif FORM == 0:
        tl.atomic_add(sums_ptr + tile * ROWS * COLUMNS + offs, part, mask=mask, sem="relaxed")


@triton.jit
def _gather(sums_ptr, slots_ptr, tile, offs, mask, SPLITS: tl.constexpr, FORM: tl.constexpr):
    """The last piece's read of the tile's whole sum (past L1: the other pieces wrote it)."""
    if FORM == 1:
        total = tl.zeros((ROWS, COLUMNS), dtype=tl.float32)
        for s in tl.static_range(SPLITS):
            total += tl.load(slots_ptr + (tile * SPLITS + s) * ROWS * COLUMNS + offs, mask=mask, other=0.0,
                             cache_modifier=".cg")
    else:
        total = tl.load(sums_ptr + tile * ROWS * COLUMNS + offs, mask=mask, other=0.0, cache_modifier=".cg")
    return total


@triton.jit
def split_finish(sums_ptr, slots_ptr, out_ptr, parts_ptr, stamps_ptr, C, TASKS: tl.constexpr,
                 SPLITS: tl.constexpr, FORM: tl.constexpr, STAMPS: tl.constexpr):
    pid, programs = tl.program_id(0), tl.num_programs(0)
    r, c = tl.arange(0, ROWS), tl.arange(0, COLUMNS)
    offs = r[:, None] + c[None, :] * ROWS  # [b, col] sums, as the step kernel's: b * width + col
    mask = (c < C)[None, :]
    for t in range(TASKS):
        task = t * programs + pid
        tile, piece = task // SPLITS, task % SPLITS
        part = _partial(tile, piece, r, c)
        if STAMPS:
            t_write = _now(pid)
        _write(sums_ptr, slots_ptr, tile, piece, part, offs, mask, SPLITS, FORM)
        tl.debug_barrier()
        if STAMPS:
            t_count = _now(tile)
        arrived = tl.atomic_add(parts_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if STAMPS:
            t_answer = _now(arrived)
        if (arrived == SPLITS - 1) & (FORM != 2):
            tl.store(out_ptr + tile * ROWS * COLUMNS + offs,
                     _gather(sums_ptr, slots_ptr, tile, offs, mask, SPLITS, FORM), mask=mask)
        if STAMPS:
            tl.debug_barrier()
            t_end = _now(task)
            tl.store(stamps_ptr + task * 2, t_answer - t_count)
            tl.store(stamps_ptr + task * 2 + 1, t_end - t_write)


class Case:
    """One form at one shape: its buffers, the launch and its reference."""

    def __init__(self, form: str, programs: int, tasks: int, splits: int, batch: int, device, stamps: bool):
        if (programs * tasks) % splits:
            raise ValueError(f"{programs} programs x {tasks} tasks do not deal into pieces of {splits}")
        self.form, self.programs, self.tasks, self.splits, self.batch = form, programs, tasks, splits, batch
        self.tiles = programs * tasks // splits
        f32 = dict(dtype=torch.float32, device=device)
        self.sums = torch.zeros(self.tiles, TILE_COLUMNS, TILE_ROWS, **f32)
        self.slots = torch.zeros(self.tiles * splits if form == "slots" else 1, TILE_COLUMNS, TILE_ROWS, **f32)
        self.out = torch.zeros(self.tiles, TILE_COLUMNS, TILE_ROWS, **f32)
        self.parts = torch.zeros(self.tiles, dtype=torch.int32, device=device)
        self.stamps = torch.zeros(programs * tasks, 2, dtype=torch.int64, device=device)
        self.stamped = stamps

    def reset(self) -> None:
        self.parts.zero_()
        self.sums.zero_()

    def launch(self) -> None:
        split_finish[(self.programs,)](self.sums, self.slots, self.out, self.parts, self.stamps, self.batch,
                                       TASKS=self.tasks, SPLITS=self.splits, FORM=FORMS.index(self.form),
                                       STAMPS=self.stamped, num_warps=4)

    def reference(self) -> torch.Tensor:
        tile = torch.arange(self.tiles, device=self.out.device)[:, None, None, None]
        piece = torch.arange(self.splits, device=self.out.device)[None, :, None, None]
        c = torch.arange(TILE_COLUMNS, device=self.out.device)[None, None, :, None]
        r = torch.arange(TILE_ROWS, device=self.out.device)[None, None, None, :]
        parts = ((tile * 7 + piece * 3 + r + c * 5) % 13 - 6).float()
        total = parts.sum(1)
        total[:, self.batch:] = 0
        return total if self.form != "count" else torch.zeros_like(total)

    def check(self) -> str | None:
        self.reset()
        self.out.zero_()
        self.launch()
        got, want = self.out, self.reference()
        if not torch.equal(got, want):
            bad = (got != want).nonzero()[0].tolist()
            return f"{self.form}: tile {bad[0]} row {bad[1]} col {bad[2]}: {got[tuple(bad)].item()} != " \
                   f"{want[tuple(bad)].item()}"
        if int(self.parts.sum()) != self.programs * self.tasks:
            return f"{self.form}: the parts counters hold {int(self.parts.sum())}, not {self.programs * self.tasks}"
        return None


class Reader:
    """A read stream beside the probe: stream_read over 2 GiB on a side stream, two programs an SM
    (the step kernel's weight traffic, which the probe's writes and counters queue behind)."""

    def __init__(self, programs: int):
        from kernel_sweep import stream_read  # a GPU run only: it imports the product

        self.kernel, self.grid = stream_read, 2 * programs
        self.src = torch.ones(1 << 30, dtype=torch.bfloat16, device="cuda")
        self.sums = torch.empty(self.grid, dtype=torch.float32, device="cuda")
        self.stream = torch.cuda.Stream()
        self.began, self.ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            self.began.record()
            self.kernel[(self.grid,)](self.src, self.sums, self.src.numel(), BLOCK=4096, num_warps=8)
            self.ended.record()

    def us(self) -> float:
        self.ended.synchronize()
        return self.began.elapsed_time(self.ended) * 1000


def launch_times(launch, reps: int, reader: Reader | None, before=None) -> tuple[list[float], list[float]]:
    """REPS launches' times (us, CUDA events; `before` runs ahead of each, untimed) and, with a reader
    started ahead of each, the read stream's."""
    times, read_us = [], []
    for _ in range(reps):
        if before:
            before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if reader:
            reader.start()
        start.record()
        launch()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000)
        if reader:
            read_us.append(reader.us())
    return times, read_us


def time_case(case: Case, reps: int, reader: Reader | None) -> dict:
    times, read_us = launch_times(case.launch, reps, reader, before=case.reset)
    trips, finishes = (case.stamps[:, i].float().cpu() / 1000 for i in (0, 1))

    def pct(x: torch.Tensor, q: float) -> float:
        return round(float(x.quantile(q)), 3)

    kernel_us = statistics.median(times)
    row = {"kernel_us": round(kernel_us, 2), "us_a_task": round(kernel_us / case.tasks, 3),
           "trip_us": pct(trips, 0.5), "trip_p90_us": pct(trips, 0.9), "finish_us": pct(finishes, 0.5),
           "finish_p90_us": pct(finishes, 0.9)}
    if reader:  # the read stream's own time: past the probe's, it ran under load throughout
        row["reader_us"] = round(statistics.median(read_us), 2)
    return row


def offline() -> None:
    """Both forms compiled for sm_90a (stamped): their atomics and loads as PTX names them."""
    import re

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {"sums_ptr": "*fp32", "slots_ptr": "*fp32", "out_ptr": "*fp32", "parts_ptr": "*i32",
                 "stamps_ptr": "*i64", "C": "i32", "TASKS": "constexpr", "SPLITS": "constexpr", "FORM": "constexpr",
                 "STAMPS": "constexpr"}
    for form in FORMS:
        source = ASTSource(split_finish, signature,
                           constexprs={"TASKS": 70, "SPLITS": 5, "FORM": FORMS.index(form), "STAMPS": True})
        ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
        ops = sorted(set(re.findall(r"\b(?:red|atom)\.global[a-z0-9._]*", ptx)))
        print(f"{form}: {', '.join(ops)}; {ptx.count('st.global')} stores, {ptx.count('ld.global.cg')} .cg loads")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--check", action="store_true", help="check the forms' sums on the CPU, nothing timed")
    parser.add_argument("--offline", action="store_true", help="compile both forms for sm_90a, run nothing")
    parser.add_argument("--splits", type=int, nargs="+", default=[2, 5, 7])
    parser.add_argument("--batches", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--tasks", type=int, default=70)
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    if any(b < 1 or b > TILE_COLUMNS for b in args.batches):
        parser.error(f"--batches: 1 to {TILE_COLUMNS}")
    if args.offline:
        return offline()
    if args.check:  # a few programs, few tasks: the interpreter's pace
        for form in FORMS:
            for splits in (2, 3):
                problem = Case(form, 6, 2, splits, 5, "cpu", stamps=False).check()
                print(problem or f"{form}, {splits} pieces: the tiles' sums and the counters match")
                if problem:
                    sys.exit(1)
        return
    from common import environment, require_gpu, write_json
    require_gpu(parser, "it measures on a GPU (--check runs on the CPU)")
    programs = torch.cuda.get_device_properties(0).multi_processor_count
    reader = Reader(programs)
    rows, failed = [], False
    out = environment("lab/split_finish/probe.py") | {"programs": programs, "tasks": args.tasks, "loads": LOADS,
                                                       "rows": rows}
    for load in LOADS:
        for splits in args.splits:
            for batch in args.batches:
                row = {"load": load, "splits": splits, "batch": batch}
                for form in FORMS:
                    case = Case(form, programs, args.tasks, splits, batch, "cuda", stamps=True)
                    problem = case.check()
                    row[form] = {"problem": problem} if problem else \
                        time_case(case, args.reps, reader if load == "loaded" else None)
                    failed |= problem is not None
                rows.append(row)
                write_json(args.json, out)
                print(load, splits, batch, {f: row[f] for f in FORMS}, flush=True)
    heads = "  ".join(f"{f + ': task / trip / finish us':>34}" for f in FORMS)
    print(f"\n{'load':>6} {'pieces':>6} {'B':>3}  {heads}")
    for row in rows:
        cells = [f"{row[f]['us_a_task']:>10} / {row[f]['trip_us']:>6} / {row[f]['finish_us']:>6}"
                 if "problem" not in row[f] else row[f]["problem"][:34] for f in FORMS]
        print(f"{row['load']:>6} {row['splits']:>6} {row['batch']:>3}  " + "  ".join(f"{cell:>34}" for cell in cells))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
