"""What reading sequence lengths at run time costs: the same plan's round compiled by this checkout
(lengths read from a device tensor by the attention and RoPE kernels) and by a copy of the package
from before (start positions fixed in the kernel arguments), on one GPU, in alternating processes.

    git archive ef3c78f conjugate plans examples evaluators | tar -x -C .old    # the fixed-length copy
    python lab/experiments/runtime_lengths.py --old .old [--workloads ...] [--plan streams] [--repeats 2]
                                         [--json benchmarks/results/runtime_lengths_h200.json]

Each process compiles the plan for the workload (kernels cached on disk between processes), loads
the workload's round inputs, replays the round's CUDA graph 300 times and prints its median. The
versions alternate (fixed, runtime, fixed, runtime, ...) so drift in the GPU's state hits both.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SIX = ["llama-1b-8b-b1", "llama-1b-8b-b8", "qwen25-05b-7b-b8", "qwen3-06b-8b-b4", "llama-1b-3b-b16-ctx4k",
       "qwen25-15b-14b-b4"]

# Runs inside a child whose PYTHONPATH selects the version; uses only API both versions share.
CHILD = """
import json, sys, torch
from conjugate.compiler.round import compile_round
from conjugate.evaluate.timing import time_replays
from conjugate.models import make_round_inputs
from conjugate.plan import load_plan
from conjugate.workload import load_workload
root, workload, plan = sys.argv[1:4]
w = load_workload(f"{root}/examples/{workload}.toml")
draft, target = w.weights("draft", "cuda"), w.weights("target", "cuda")
rnd = compile_round(load_plan(f"{root}/plans/{plan}.json"), w, draft, target)
rnd.load(make_round_inputs(draft, target, k=w.k, draft_batch=w.draft_batch, target_batch=w.target_batch,
                           context=w.context, seed=w.seed + 1, kv_init=w.kv_init))
rnd.prepare()
print(json.dumps({"median_ms": time_replays(rnd.run, 300, 30).median_ms}))
"""


def measure(root: Path, workload: str, plan: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-c", CHILD, str(root), workload, plan], env=env, capture_output=True,
                          text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{root} {workload}: {done.stderr.strip().splitlines()[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["median_ms"]


def _gpu() -> str:
    import torch

    return torch.cuda.get_device_name()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="the fixed-length copy of the package (see above)")
    parser.add_argument("--workloads", nargs="+", default=SIX)
    parser.add_argument("--plan", default="streams")
    parser.add_argument("--repeats", type=int, default=2, help="processes per version and workload")
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = []
    for workload in args.workloads:
        fixed, runtime = [], []
        for _ in range(args.repeats):
            fixed.append(measure(Path(args.old).resolve(), workload, args.plan))
            runtime.append(measure(ROOT, workload, args.plan))
        row = {"workload": workload, "plan": args.plan, "fixed_ms": fixed, "runtime_ms": runtime,
               "cost_percent": (statistics.median(runtime) / statistics.median(fixed) - 1) * 100}
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.json:  # after every workload: a run cut short keeps what it measured
            Path(args.json).write_text(json.dumps({"gpu": _gpu(), "runs": rows}, indent=1) + "\n")
    print(f"{'workload':24} {'fixed ms':>9} {'runtime ms':>10} {'cost':>7}")
    for r in rows:
        print(f"{r['workload']:24} {statistics.median(r['fixed_ms']):9.3f} {statistics.median(r['runtime_ms']):10.3f} "
              f"{r['cost_percent']:+6.2f}%")


if __name__ == "__main__":
    main()
