"""Per-round latency of the shipped plans on the GPU, after checking each against the reference.

    python benchmarks/compiler_rounds.py [WORKLOAD.toml ...] [--plans sequential streams interleave]
                                         [--replays 200] [--json OUT.json]

For every workload (default: the six H200 configurations in examples/): seeded random weights on
the GPU, then per plan: compile, run eagerly on poisoned outputs and compare with the fp32
reference round (teacher-forced by the plan's draft tokens, see evaluate/correctness.py), capture
the whole round in a CUDA graph, check one replay (both `evaluate.rounds.checked_run`), and time
replays with CUDA events (median, p20, p80). The floor is the bytes the round must move over the
device-copy bandwidth measured in the same process.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from conjugate.cli.arguments import output_file  # noqa: E402
from conjugate.compiler.buffers import PreparedWeights  # noqa: E402
from conjugate.compiler.round import compile_round, device_name  # noqa: E402
from conjugate.errors import ConjugateError  # noqa: E402
from conjugate.evaluate.correctness import ReferenceChecker  # noqa: E402
from conjugate.evaluate.rounds import checked_run, round_inputs  # noqa: E402
from conjugate.evaluate.timing import copy_bandwidth_gbs, time_per_call, time_replays  # noqa: E402
from conjugate.graph import build_graph, graph_totals  # noqa: E402
from conjugate.models import random_weights  # noqa: E402
from conjugate.plan import load_plan  # noqa: E402
from conjugate.workload import load_workload  # noqa: E402

SIX = ["llama-1b-8b-b1", "llama-1b-8b-b8", "qwen25-05b-7b-b8", "qwen3-06b-8b-b4", "llama-1b-3b-b16-ctx4k",
       "qwen25-15b-14b-b4"]


def profile_launches(compiled, reps: int = 10) -> list[dict]:
    """Each launch alone: a CUDA graph of `reps` back-to-back launches, timed per launch."""
    rows = []
    for launch, planned in zip(compiled.launches, compiled.schedule.launches):
        us = time_per_call(launch, compiled.device, calls=reps, replays=3)
        kinds = " | ".join(f"{p.model[0]}:{'+'.join(p.fused)}" for p in planned.parts)
        rows.append({"launch": launch.index, "kinds": kinds, "us": us, "bytes": planned.bytes,
                     "programs": [p.programs for p in launch.parts], **launch.resources.to_dict()})
    return rows


def summarize_profile(rows: list[dict]) -> list[dict]:
    groups: dict[str, dict] = {}
    for r in rows:
        g = groups.setdefault(r["kinds"], {"kinds": r["kinds"], "count": 0, "us": 0.0, "bytes": 0,
                                           "programs": r["programs"], "registers": r.get("registers"),
                                           "spills": r.get("spills")})
        g["count"] += 1
        g["us"] += r["us"]
        g["bytes"] += r["bytes"]
    for g in groups.values():
        g["gbs"] = g["bytes"] / (g["us"] * 1e-6) / 1e9
    return sorted(groups.values(), key=lambda g: -g["us"])


def bench_plan(plan_path: Path, workload, prepared, inputs, check, replays: int, cache_dir,
               profile: bool = False) -> dict:
    plan = load_plan(plan_path)
    row = {"plan": plan.name, "plan_hash": plan.hash[:12]}
    t0 = time.perf_counter()
    try:
        compiled = compile_round(plan, workload, *prepared, cache_dir=cache_dir)
        compiled.load(inputs)
        compiled.warmup()  # every kernel compiled before anything is checked
        row["compile_s"] = round(time.perf_counter() - t0, 1)
        eager = checked_run(compiled, inputs, check)
        compiled.prepare()  # a CUDA graph of the whole round when the plan says capture: graph
        replayed = checked_run(compiled, inputs, check, graph=True)
    except ConjugateError as e:
        return row | {"status": "compile_error", "error": str(e)}
    row |= {"launches": len(compiled.launches), "kernels": len({l.digest for l in compiled.launches}),
            "correct": eager.ok and replayed.ok, "check": replayed.to_dict(), "eager_check_ok": eager.ok}
    if not row["correct"]:
        return row | {"status": "incorrect", "deterministic": _deterministic(compiled, inputs)}
    timing = time_replays(compiled.run, replays, warmup=10)
    row |= {**timing.to_dict(), "status": "ok"}
    row["resources"] = _resource_summary(compiled.feedback())
    if profile:
        row["profile"] = summarize_profile(profile_launches(compiled))
        row["launches_alone_ms"] = sum(g["us"] for g in row["profile"]) / 1e3
    del compiled
    return row


def _deterministic(compiled, inputs, runs: int = 3) -> bool:
    """Do repeated eager rounds give bit-identical caches? (A race shows up as a no.)"""
    results = []
    for _ in range(runs):
        compiled.load(inputs)
        compiled.run_eager()
        out = compiled.outputs()
        results.append((out.target_cache.k, out.draft_cache.k, out.target_tokens))
    return all(all(torch.equal(a, b) for a, b in zip(results[0], r)) for r in results[1:])


def _resource_summary(feedback) -> dict:
    resources = [f.resources for f in feedback]
    return {"max_registers": max((r.registers for r in resources if r.registers is not None), default=None),
            "launches_with_spills": sum(1 for r in resources if r.spills),
            "max_shared_bytes": max((r.shared_bytes for r in resources if r.shared_bytes is not None), default=None)}


def bench_workload(path: Path, plans: list[Path], replays: int, bandwidth: float, cache_dir,
                   profile: bool = False) -> dict:
    workload = load_workload(path)
    device = torch.device("cuda")
    draft = random_weights(workload.draft, workload.seed, workload.torch_dtype, device)
    target = random_weights(workload.target, workload.seed, workload.torch_dtype, device)
    inputs = round_inputs(workload, draft, target)
    check = ReferenceChecker(draft, target, inputs, workload.dtype)
    nbytes = graph_totals(build_graph(workload))["bytes"]
    result = {"workload": workload.name, "bytes": nbytes, "floor_ms": nbytes / bandwidth * 1e3, "plans": []}
    prepared = (PreparedWeights(draft), PreparedWeights(target))
    for plan in plans:
        row = bench_plan(plan, workload, prepared, inputs, check, replays, cache_dir, profile)
        if "median_ms" in row:
            row["floor_ratio"] = row["median_ms"] / result["floor_ms"]
        result["plans"].append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("check", "profile")}), flush=True)
        for g in row.get("profile", [])[:14]:
            print(f"   {g['kinds']:48} x{g['count']:4} {g['us']:9.1f} us {g['gbs']:7.0f} GB/s  progs {g['programs']}"
                  f" regs {g['registers']} spills {g['spills']}", flush=True)
        torch.cuda.empty_cache()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workloads", nargs="*", default=[str(ROOT / "examples" / f"{n}.toml") for n in SIX])
    parser.add_argument("--plans", nargs="+", default=["sequential", "streams", "interleave"],
                        help="shipped plan names or plan JSON paths")
    parser.add_argument("--replays", type=int, default=200)
    parser.add_argument("--json", type=output_file)
    parser.add_argument("--cache-dir", type=Path)
    parser.add_argument("--profile", action="store_true", help="also time every launch alone, grouped by kind")
    args = parser.parse_args()
    bandwidth = copy_bandwidth_gbs(torch.device("cuda")) * 1e9
    out = {"gpu": device_name(torch.device("cuda")), "torch": torch.__version__, "copy_bandwidth_gbs": bandwidth / 1e9,
           "command": " ".join(["python", "benchmarks/compiler_rounds.py", *sys.argv[1:]]), "workloads": []}
    plans = [Path(p) if p.endswith(".json") else ROOT / "plans" / f"{p}.json" for p in args.plans]
    for path in args.workloads:
        out["workloads"].append(bench_workload(Path(path), plans, args.replays, bandwidth, args.cache_dir,
                                                 args.profile))
        torch.cuda.empty_cache()
        if args.json:
            args.json.write_text(json.dumps(out, indent=1) + "\n")
    print(f"\n{out['gpu']}, copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    print(f"{'workload':24} {'floor':>7} " + " ".join(f"{p:>12}" for p in args.plans))
    for w in out["workloads"]:
        cells = [f"{r['median_ms']:9.2f} ms" if "median_ms" in r else f"{r['status']:>12}" for r in w["plans"]]
        print(f"{w['workload']:24} {w['floor_ms']:5.2f}ms " + " ".join(cells))


if __name__ == "__main__":
    main()
