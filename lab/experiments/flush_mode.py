"""How a launch's time alone depends on the way L2 is emptied before it (launch verdicts time each
launch so): overwriting a buffer twice the cache, which leaves the cache full of dirty lines that
the launch's own misses must write back, against reading one, against not emptying it at all.

    python lab/experiments/flush_mode.py examples/llama-1b-8b-b8.toml [...] [--json OUT.json]

Per workload (seeded random weights on the GPU), from `lab/experiments/variants/streams-fused.json`:
each launch of layer 0 (the draft's first step, and the target), timed alone from a CUDA graph of
ten calls (timing.time_per_call) with each flush, the flush's own time subtracted; its planned
bytes over that time against the copy bandwidth. One process, every variant in it: compare within
a run. The round is checked against the fp32 reference first.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from conjugate.cli.arguments import output_file  # noqa: E402
from conjugate.compiler.round import compile_round  # noqa: E402
from conjugate.evaluate.measured import MeasuredHarness  # noqa: E402
from conjugate.evaluate.evaluators import load_profile  # noqa: E402
from conjugate.evaluate.rounds import checked_run  # noqa: E402
from conjugate.evaluate.session import EvaluationSession  # noqa: E402
from conjugate.evaluate.timing import (FLUSHES, copy_bandwidth_gbs, l2_flush_bytes,  # noqa: E402
                                       time_per_call)
from conjugate.plan import load_plan  # noqa: E402
from conjugate.workload import load_workload  # noqa: E402

PLAN = ROOT / "lab" / "experiments" / "variants" / "streams-fused.json"
CALLS = 10
LAYER_0 = (".s0.l0.", "t.l0.")  # the draft's first step, the target's first layer


def bench(path: Path, cache: Path, copy_gbs: float) -> list[dict]:
    w = load_workload(path)
    device = torch.device("cuda")
    setup = MeasuredHarness(load_profile("h200"), cache, EvaluationSession()).prepare(w)
    compiled = compile_round(load_plan(PLAN), w, *setup.weights, cache_dir=cache)
    compiled.load(setup.inputs)
    compiled.warmup()
    check = checked_run(compiled, setup.inputs, setup.check)
    if not check.ok:
        raise SystemExit(f"{w.name}: the round is wrong: {'; '.join(check.problems[:3])}")
    flush = l2_flush_bytes(device)
    rows = []
    for launch, planned in zip(compiled.launches, compiled.schedule.launches):
        if not any(marker in op for op in planned.ops for marker in LAYER_0):
            continue
        us = {"none": time_per_call(launch, device, CALLS)}
        for mode in FLUSHES:
            us[mode] = time_per_call(launch, device, CALLS, flush_bytes=flush, flush=mode)
        rows.append({"workload": w.name, "launch": planned.index, "ops": " | ".join(p.label for p in launch.parts),
                     "bytes": planned.bytes, "us": us,
                     "share_of_copy": {m: planned.bytes / (t * 1e-6) / (copy_gbs * 1e9) if t else None
                                       for m, t in us.items()}})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="+", type=Path)
    parser.add_argument("--json", type=output_file)
    args = parser.parse_args()
    copy_gbs = copy_bandwidth_gbs(torch.device("cuda"))
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "command": " ".join(sys.argv),
           "copy_gbs": copy_gbs, "rows": []}
    with tempfile.TemporaryDirectory(prefix="flush-mode-") as cache:
        for path in args.workloads:
            out["rows"] += bench(path, Path(cache), copy_gbs)
            if args.json:
                args.json.write_text(json.dumps(out, indent=1) + "\n")
    print(f"copy bandwidth {copy_gbs:.0f} GB/s; per launch us (share of copy bandwidth)")
    print(f"{'workload':22} {'launch':42} {'MB':>6} " + " ".join(f"{m:>14}" for m in ("none", *FLUSHES)))
    for r in out["rows"]:
        cells = " ".join(f"{r['us'][m]:7.1f} ({r['share_of_copy'][m] or 0:4.0%})" for m in ("none", *FLUSHES))
        print(f"{r['workload']:22} {r['ops'][:42]:42} {r['bytes'] / 1e6:6.1f} {cells}")


if __name__ == "__main__":
    main()
