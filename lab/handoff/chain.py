"""A dependent stage's handoff in isolation: a done counter and a poll (the step kernel today) against
flags carried in the data itself (each fp32 value stored beside the launch's epoch in one 8-byte word,
so a reader that sees the word sees its value, and needs no counter).

A chain of STAGES stages, TASKS tasks a stage, dealt round the programs (one an SM, all co-resident);
each task reads the whole [B, W] output of the stage before (the way a GEMM task stages its
activation rows), adds each row up, and writes its W / TASKS columns of this stage's output:

    y[b, j] = (sum_k x[b, k] + j + s) mod 251        (small integers: exact in fp32, in any order)

Forms (FORM, as the kernel takes it: the index):

* `counter`: the task stores its columns, then a barrier and a release add on the stage's counter;
  the next stage's task polls that counter with acquire adds of zero until all TASKS have arrived,
  then reads the rows (past L1). Counters are never reset: launch e waits for e * TASKS.
* `flagged`: the task stores (epoch << 32 | bits of the value) words; the next stage's task reads the
  words KC columns at a time, again (volatile) until every word of the chunk carries this launch's
  epoch. No counter, no barrier, no fence: a word is written and read whole (8 bytes, aligned).
* `none`: the counter form's reads and writes with no waiting and no counting: the work's own time,
  so each form's time a stage less it is what its handoff costs (not checked: it reads whatever is there).

Every wait is bounded (a spin limit that counts an error); each checked form is checked against the
chain on the host, and again after its timed launches (the epochs move on each launch). Per form:
the kernel's time over STAGES (CUDA events, median of REPS), alone and beside a read stream
(lab/split_finish's Reader: stream_read over 2 GiB on a side stream), as the step kernel's loader
streams weights while its tasks hand off.

    python lab/handoff/chain.py --json OUT.json        # a GPU (runbook case handoff)
    python lab/handoff/chain.py --check                # the checked forms on the CPU (interpreter)
    python lab/handoff/chain.py --offline              # every form compiled for sm_90a here

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
sys.path.insert(0, str(ROOT / "lab" / "split_finish"))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

FORMS = ("counter", "flagged", "none")
CHECKED = ("counter", "flagged")
LOADS = ("idle", "loaded")
MODULUS = tl.constexpr(251)
CHUNK_COLUMNS = 256  # KC: the columns a task reads (and, flagged, polls) at a time
KC = tl.constexpr(CHUNK_COLUMNS)


@triton.jit
def _word(value, epoch):
    """An fp32 value and the launch's epoch as one int64 word: epoch above, the value's bits below."""
    bits = value.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
    return (epoch.to(tl.int64) << 32) | bits


@triton.jit
def _value(word):
    return (word & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _wait_counter(counter_ptr, target, error_ptr, spin_limit):
    """Bounded acquire polls of a counter until it reaches target (the step kernel's acquire)."""
    seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    spins = 0
    while (seen < target) & (spins < spin_limit):
        seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
        spins += 1
    if seen < target:
        tl.atomic_add(error_ptr, 1, sem="relaxed", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _read_flagged(ptrs, mask, epoch, error_ptr, spin_limit):
    """A chunk of words, read again until each carries this launch's epoch (bounded): its values."""
    words = tl.load(ptrs, mask=mask, other=0, volatile=True)
    ready = tl.min(tl.where(mask, (words >> 32) == epoch, True).to(tl.int32))
    spins = 0
    while (ready == 0) & (spins < spin_limit):
        words = tl.load(ptrs, mask=mask, other=0, volatile=True)
        ready = tl.min(tl.where(mask, (words >> 32) == epoch, True).to(tl.int32))
        spins += 1
    if ready == 0:
        tl.atomic_add(error_ptr, 1, sem="relaxed", scope="gpu")
    return tl.where(mask, _value(words), 0.0)


@triton.jit
def _row_sums(x0_ptr, rows_ptr, words_ptr, counters_ptr, error_ptr, s, b, mask_b, epoch, spin_limit,
              W: tl.constexpr, TASKS: tl.constexpr, BP: tl.constexpr, FORM: tl.constexpr):
    """Each row of the stage before's output added up (stage 0 reads the chain's input x0)."""
    k = tl.arange(0, KC)
    mask = mask_b[:, None] & (k < KC)[None, :]
    total = tl.zeros((BP,), dtype=tl.float32)
    if s == 0:
        for k0 in range(0, W, KC):
            total += tl.sum(tl.load(x0_ptr + b[:, None] * W + (k0 + k)[None, :], mask=mask, other=0.0), axis=1)
    elif FORM == 1:
        base = words_ptr + ((s - 1) * BP + b[:, None]) * W
        for k0 in range(0, W, KC):
            total += tl.sum(_read_flagged(base + (k0 + k)[None, :], mask, epoch, error_ptr, spin_limit), axis=1)
    else:
        if FORM == 0:
            _wait_counter(counters_ptr + s - 1, epoch * TASKS, error_ptr, spin_limit)
        base = rows_ptr + ((s - 1) * BP + b[:, None]) * W
        for k0 in range(0, W, KC):
            total += tl.sum(tl.load(base + (k0 + k)[None, :], mask=mask, other=0.0, cache_modifier=".cg"), axis=1)
    return total


@triton.jit(do_not_specialize=["epoch"])  # epoch 1 would otherwise become a constant
def chain(x0_ptr, rows_ptr, words_ptr, counters_ptr, error_ptr, epoch, spin_limit, B, STAGES: tl.constexpr,
          TASKS: tl.constexpr, W: tl.constexpr, BP: tl.constexpr, FORM: tl.constexpr):
    pid, programs = tl.program_id(0), tl.num_programs(0)
    C: tl.constexpr = W // TASKS
    b = tl.arange(0, BP)
    mask_b = b < B
    c = tl.arange(0, C)
    for n in range(pid, STAGES * TASKS, programs):  # stage order on every program
        s = n // TASKS
        t = n % TASKS
        total = _row_sums(x0_ptr, rows_ptr, words_ptr, counters_ptr, error_ptr, s, b, mask_b, epoch, spin_limit,
                          W, TASKS, BP, FORM)
        j = t * C + c
        y = (total[:, None] + j[None, :].to(tl.float32) + s) % MODULUS
        mask = mask_b[:, None] & (c < C)[None, :]
        offs = (s * BP + b[:, None]) * W + j[None, :]
        if FORM == 1:
            tl.store(words_ptr + offs, _word(y, epoch), mask=mask)
        else:
            tl.store(rows_ptr + offs, y, mask=mask)
            if FORM == 0:
                tl.debug_barrier()
                tl.atomic_add(counters_ptr + s, 1, sem="release", scope="gpu")


class Chain:
    """One form at one shape: its buffers, its launches (each a new epoch) and the host's chain."""

    def __init__(self, form: str, programs: int, stages: int, tasks: int, width: int, batch: int, device,
                 spin_limit: int = 1 << 22):
        if width % tasks or width % CHUNK_COLUMNS or (width // tasks) & (width // tasks - 1):
            raise ValueError(f"width {width}: {tasks} tasks of a power of two columns, {CHUNK_COLUMNS}-column chunks")
        self.form, self.programs, self.stages, self.tasks, self.width, self.batch = \
            form, programs, stages, tasks, width, batch
        self.rows_pad = triton.next_power_of_2(batch)
        gen = torch.Generator().manual_seed(width + batch)
        self.x0 = torch.randint(0, int(MODULUS), (self.rows_pad, width), generator=gen).float().to(device)
        shape = (stages, self.rows_pad, width)
        self.rows = torch.zeros(shape, dtype=torch.float32, device=device)
        self.words = torch.zeros(shape if form == "flagged" else (1,), dtype=torch.int64, device=device)
        self.counters = torch.zeros(stages, dtype=torch.int32, device=device)
        self.error = torch.zeros(1, dtype=torch.int32, device=device)
        self.epoch, self.spin_limit = 0, spin_limit

    def launch(self) -> None:
        self.epoch += 1
        chain[(self.programs,)](self.x0, self.rows, self.words, self.counters, self.error, self.epoch, self.spin_limit,
                                self.batch, STAGES=self.stages, TASKS=self.tasks, W=self.width,
                                BP=self.rows_pad, FORM=FORMS.index(self.form), num_warps=4)

    def last_stage(self) -> torch.Tensor | str:
        """The last stage's [B, W] values, or why they cannot be read (a word from another launch)."""
        if self.form == "flagged":
            words = self.words[-1, :self.batch]
            if not bool(((words >> 32) == self.epoch).all()):
                return f"flagged: a word of the last stage is from another launch than {self.epoch}"
            return (words & 0xFFFFFFFF).to(torch.int32).view(torch.float32)
        return self.rows[-1, :self.batch]

    def reference(self) -> torch.Tensor:
        x = self.x0[:self.batch].cpu().double()
        j = torch.arange(self.width, dtype=torch.float64)
        for s in range(self.stages):
            x = torch.remainder(x.sum(1, keepdim=True) + j[None, :] + s, int(MODULUS))
        return x.float()

    def check(self) -> str | None:
        self.launch()
        if int(self.error.item()):
            return f"{self.form}: {int(self.error.item())} waits ran out of spins"
        got = self.last_stage()
        if isinstance(got, str):
            return got
        got, want = got.cpu(), self.reference()
        if not torch.equal(got, want):
            bad = (got != want).nonzero()[0].tolist()
            return f"{self.form}: row {bad[0]} column {bad[1]}: {got[tuple(bad)].item()} != {want[tuple(bad)].item()}"
        return None


def time_chain(chain_: Chain, reps: int, reader) -> dict:
    from probe import launch_times  # lab/split_finish

    times, read_us = launch_times(chain_.launch, reps, reader)
    kernel_us = statistics.median(times)
    row = {"kernel_us": round(kernel_us, 2), "us_a_stage": round(kernel_us / chain_.stages, 3)}
    if reader:
        row["reader_us"] = round(statistics.median(read_us), 2)
    return row


def offline() -> None:
    """Every form compiled for sm_90a: the handoff's atomics and loads as PTX names them."""
    import re

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {"x0_ptr": "*fp32", "rows_ptr": "*fp32", "words_ptr": "*i64", "counters_ptr": "*i32",
                 "error_ptr": "*i32", "epoch": "i32", "spin_limit": "i32", "B": "i32", "STAGES": "constexpr",
                 "TASKS": "constexpr", "W": "constexpr", "BP": "constexpr", "FORM": "constexpr"}
    for form in FORMS:
        source = ASTSource(chain, signature, constexprs={"STAGES": 64, "TASKS": 32, "W": 1024, "BP": 4,
                                                         "FORM": FORMS.index(form)})
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
        ptx = compiled.asm["ptx"]
        ops = sorted(set(re.findall(r"\b(?:red|atom|ld\.volatile|ld\.global\.cg|ld\.global\.gpu\.acquire|st\.global)[a-z0-9._]*", ptx)))
        print(f"{form}: {', '.join(ops)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--check", action="store_true", help="check the forms on the CPU, nothing timed")
    parser.add_argument("--offline", action="store_true", help="compile every form for sm_90a, run nothing")
    parser.add_argument("--widths", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--batches", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--tasks", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--stages", type=int, default=64)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    if args.offline:
        return offline()
    if args.check:  # one program a task, in stage order: the interpreter runs programs one after another
        for form in CHECKED:
            for batch in (3, 4):
                case = Chain(form, 3 * 4, 3, 4, 512, batch, "cpu", spin_limit=50)
                problem = case.check() or case.check()  # a second launch: the epochs move on
                print(problem or f"{form}, B={batch}: two launches match the chain")
                if problem:
                    sys.exit(1)
        case = Chain("counter", 3 * 4, 3, 4, 512, 4, "cpu", spin_limit=50)
        case.check()
        case.counters.zero_()  # the next launch's waits can never be met: each must run out and say so
        problem = case.check()
        print(f"counters cleared between launches: {problem}")
        if not problem or "ran out of spins" not in problem:
            sys.exit(1)
        return
    from common import environment, require_gpu, write_json
    from probe import Reader  # lab/split_finish

    require_gpu(parser, "it measures on a GPU (--check runs on the CPU)")
    programs = torch.cuda.get_device_properties(0).multi_processor_count
    reader = Reader(programs)
    rows, failed = [], False
    out = environment("lab/handoff/chain.py") | {"programs": programs, "stages": args.stages, "loads": LOADS,
                                                  "rows": rows}
    for load in LOADS:
        for width in args.widths:
            for batch in args.batches:
                for tasks in args.tasks:
                    row = {"load": load, "width": width, "batch": batch, "tasks": tasks}
                    for form in FORMS:
                        case = Chain(form, programs, args.stages, tasks, width, batch, "cuda")
                        problem = case.check() if form in CHECKED else None
                        if problem is None:
                            row[form] = time_chain(case, args.reps, reader if load == "loaded" else None)
                            if form in CHECKED:  # again after the timed launches
                                problem = case.check()
                        if problem:
                            row[form] = {"problem": problem}
                            failed = True
                    rows.append(row)
                    write_json(args.json, out)
                    print(load, width, batch, tasks, {f: row[f] for f in FORMS}, flush=True)
    print(f"\n{'load':>6} {'W':>5} {'B':>3} {'tasks':>5}  " + "  ".join(f"{f + ' us a stage':>20}" for f in FORMS))
    for row in rows:
        cells = [f"{row[f]['us_a_stage']:>20}" if "problem" not in row[f] else row[f]["problem"][:20] for f in FORMS]
        print(f"{row['load']:>6} {row['width']:>5} {row['batch']:>3} {row['tasks']:>5}  " + "  ".join(cells))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
