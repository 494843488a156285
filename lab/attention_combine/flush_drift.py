"""Is the L2 flush's time, measured once and subtracted from every timing, steady within a process?
harness_gap.py found the same launch 4.9 us slower (+-0.1) timed in graphs of 20 calls than of 10,
every split and output type alike: a constant, so the subtracted flush, not the launch, differs.

    python lab/attention_combine/flush_drift.py --json OUT.json      # a GPU

Six rounds, each measuring the flush (write and read) in graphs of 10 and 20 calls, then the
product's B=1 attention (harness_gap.py's shape, SPLIT_KV 8, bf16 output) with the flush just
measured subtracted (harness_gap.subtracting: how the sweeps timed before d201728), and again as
timing.time_per_call now times it (`paired_us`: the flushes' graph replayed after each timed replay); the SM clock (nvidia-smi) beside each round. Lab code.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import harness_gap as hg  # noqa: E402  (puts the repository and benchmarks/ on the path)
import time_merge as tm  # noqa: E402

from conjugate.compiler.cache import KernelCache  # noqa: E402


def sm_clock_mhz() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError) as error:
        return f"unknown ({type(error).__name__})"


def main() -> int:
    from common import environment

    from conjugate.evaluate.timing import copy_bandwidth_gbs, l2_flush_bytes, time_per_call

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--cold", action="store_true", help="first the flush measured as the sweeps measure it")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    device = torch.device("cuda")
    env = environment("lab/attention_combine/flush_drift.py")
    flush_bytes = l2_flush_bytes(device)
    cold = []
    if args.cold:  # the sweeps' order: the copy rate, then the flush, before any launch is compiled
        copy_bandwidth_gbs(device)
        cold = [{"calls": calls, "flush_us": hg.flush_time_us(device, calls, flush_bytes)} for calls in (10, 20) * 4]
        print("flush just after the copy rate, us: " + " ".join(f"{c['flush_us']:.2f} ({c['calls']})" for c in cold))
    inputs = hg.ks.operands(hg.SHAPE)
    rows, started = [], time.perf_counter()
    print(f"{'round':>5} {'s':>6} {'MHz':>5} {'flush':>5} {'calls':>5} {'flush us':>9} {'attention us':>12} {'paired us':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        launch, out = hg.launch_of(inputs, 8, torch.bfloat16, KernelCache(Path(tmp)))
        err = tm.check(launch, out, inputs)
        if err >= 1e-2:
            raise SystemExit(f"the attention launch is wrong: relative error {err:.3g}")
        for r in range(args.rounds):
            clock = sm_clock_mhz()
            for flush in ("write", "read"):
                for calls in (10, 20):
                    flush_us = hg.flush_time_us(device, calls, flush_bytes, flush)
                    us = hg.subtracting(launch, device, calls, flush_bytes, flush_us, flush)
                    row = {"round": r, "s": time.perf_counter() - started, "sm_mhz": clock, "flush": flush,
                           "calls": calls, "flush_us": flush_us, "attention_us": us}
                    row["paired_us"] = time_per_call(launch, device, calls, flush_bytes=flush_bytes, flush=flush)
                    rows.append(row)
                    print(f"{r:5d} {row['s']:6.1f} {clock:>5} {flush:>5} {calls:5d} {flush_us:9.2f} {us:12.2f}"
                          f" {row['paired_us']:9.2f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({**env, "flush_bytes": flush_bytes, "cold": cold, "rel_err": err, "rows": rows}, indent=1)
                             + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
