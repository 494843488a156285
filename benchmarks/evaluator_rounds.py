"""The measured evaluator (evaluators/h200.toml) on the six H200 configurations: for each, the three
baselines (conventional, sequential, streams), the shipped plans, the floor, per-launch verdicts,
and the analytical evaluator's ranking of the same plans against the measured one.

    python benchmarks/evaluator_rounds.py [WORKLOAD.toml ...] [--plans sequential streams interleave]
                                          [--evaluator h200] [--json OUT.json [--append]]
    python benchmarks/evaluator_rounds.py --merge PART.json ... --json OUT.json

`--merge` joins result files of runs made side by side (one per GPU of a host) without measuring.

Everything goes through `conjugate.evaluate.pipeline.evaluate`, the function the search calls: per
plan validate, compile, check against the fp32 reference (eagerly and replayed from the CUDA graph),
time 200 replays of the whole round on fresh random inputs, then time each multi-part launch against
its parts. The baselines are measured once per workload, kept by the one EvaluationSession of this
process. The output's workloads[].plans[].median_ms feed `conjugate calibrate --from`.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from conjugate.arguments import output_file  # noqa: E402
from conjugate.compiler.round import device_name  # noqa: E402
from conjugate.evaluate.calibrate import spearman  # noqa: E402
from conjugate.evaluate.pipeline import evaluate  # noqa: E402
from conjugate.evaluate.evaluators import load_profile  # noqa: E402
from conjugate.evaluate.result import EvalResult, VerdictKind  # noqa: E402
from conjugate.evaluate.session import EvaluationSession  # noqa: E402
from conjugate.plan import load_plan  # noqa: E402
from conjugate.workload import load_workload  # noqa: E402

SIX = ["llama-1b-8b-b1", "llama-1b-8b-b8", "qwen25-05b-7b-b8", "qwen3-06b-8b-b4", "llama-1b-3b-b16-ctx4k",
       "qwen25-15b-14b-b4"]
BASELINES = ("conventional", "sequential", "streams")


def plan_row(plan, result: EvalResult, modeled: EvalResult) -> dict:
    row = {"plan": plan.name, "plan_hash": plan.hash[:12], "status": str(result.status), "stage": str(result.stage),
           "error": result.error, "wall_s": result.wall_s, "seconds": result.seconds, "modeled_ms": modeled.latency_ms}
    if result.ok:
        m, resources = result.metrics, [f.resources for f in result.feedback]
        counts = {str(k): sum(1 for v in result.verdicts if v.verdict is k) for k in VerdictKind}
        row |= {"median_ms": m.latency_ms, "p20_ms": m.p20_ms, "p80_ms": m.p80_ms, "replays": m.replays,
                "floor_ratio": m.floor_ratio, "bandwidth_gbs": m.bandwidth_gbs, "speedups": m.speedups,
                "launches": m.launches, "verdict_counts": counts, "verdicts": [v.to_dict() for v in result.verdicts],
                "max_registers": max((r.registers for r in resources if r.registers is not None), default=None),
                "launches_with_spills": sum(1 for r in resources if r.spills)}
    return row


def bench_workload(path: Path, plans: list, profile, analytical, session: EvaluationSession) -> dict:
    workload = load_workload(path)
    out = {"workload": workload.name, "plans": []}
    for plan in plans:
        result = evaluate(plan, workload, profile, session=session)
        modeled = evaluate(plan, workload, analytical, session=session)
        row = plan_row(plan, result, modeled)
        out["plans"].append(row)
        if result.ok and "baselines" not in out:
            m = result.metrics
            out |= {"baselines": {name: b.to_dict() for name, b in m.baselines.items()}, "floor_ms": m.floor_ms,
                    "floor_memory_ms": m.floor_memory_ms, "floor_compute_ms": m.floor_compute_ms, "bytes": m.bytes,
                    "copy_bandwidth_gbs": m.copy_bandwidth_gbs, "matmul_tflops": m.matmul_tflops}
        print(json.dumps({k: v for k, v in row.items() if k != "verdicts"}), flush=True)
    timed = [p for p in out["plans"] if "median_ms" in p]
    out["spearman"] = spearman([p["median_ms"] for p in timed], [p["modeled_ms"] for p in timed])
    torch.cuda.empty_cache()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workloads", nargs="*", default=[str(ROOT / "examples" / f"{n}.toml") for n in SIX])
    parser.add_argument("--plans", nargs="+", default=["sequential", "streams", "interleave"],
                        help="shipped plan names or plan JSON paths")
    parser.add_argument("--evaluator", default="h200")
    parser.add_argument("--json", type=output_file)
    parser.add_argument("--append", action="store_true",
                        help="keep the workloads already in --json (from an earlier run) and add or replace these")
    parser.add_argument("--merge", nargs="+", type=Path, metavar="PART.json",
                        help="only join these result files (their workloads, in order) into --json")
    args = parser.parse_args()
    if args.merge:
        if parser.get_default("workloads") != args.workloads or args.append:
            parser.error("--merge measures nothing: give it result files only (no workloads, no --append)")
        return merge(args.merge, args.json)
    profile, analytical = load_profile(args.evaluator), load_profile("analytical")
    plans = [load_plan(p if p.endswith(".json") else ROOT / "plans" / f"{p}.json") for p in args.plans]
    out = {"gpu": device_name(torch.device("cuda")), "torch": torch.__version__, "evaluator": profile.name,
           "command": " ".join(["python", "benchmarks/evaluator_rounds.py", *sys.argv[1:]]), "workloads": []}
    if args.append and args.json and args.json.exists():
        earlier = json.loads(args.json.read_text())
        out["earlier_runs"] = earlier.get("earlier_runs", []) + [{k: v for k, v in earlier.items() if k not in (
            "workloads", "earlier_runs")}]
        out["workloads"] = earlier["workloads"]
    session = EvaluationSession()  # one workload's weights, references and baselines at a time
    for path in args.workloads:
        row = bench_workload(Path(path), plans, profile, analytical, session)
        out["workloads"] = [w for w in out["workloads"] if w["workload"] != row["workload"]] + [row]
        timed = [p for w in out["workloads"] for p in w["plans"] if "median_ms" in p]
        out["spearman_pooled"] = spearman([p["median_ms"] for p in timed], [p["modeled_ms"] for p in timed])
        if args.json:
            args.json.write_text(json.dumps(out, indent=1) + "\n")
    print_table(out)


def merge(parts: list[Path], dest: Path | None) -> None:
    """One result file from parts measured side by side: same GPU model, torch and evaluator; a
    workload measured in two parts keeps the later part's rows."""
    loaded = [json.loads(p.read_text()) for p in parts]
    for path, part in zip(parts[1:], loaded[1:]):
        for key in ("gpu", "torch", "evaluator"):
            if part[key] != loaded[0][key]:
                sys.exit(f"{path}: field {key!r} is {part[key]!r}, {parts[0]} has {loaded[0][key]!r}: not one setting")
    out = {k: loaded[0][k] for k in ("gpu", "torch", "evaluator")}
    out["commands"] = [c for part in loaded for c in part.get("commands", [part.get("command")]) if c]
    workloads: dict[str, dict] = {}
    for part in loaded:
        workloads |= {w["workload"]: w for w in part["workloads"]}
    out["workloads"] = list(workloads.values())
    timed = [p for w in out["workloads"] for p in w["plans"] if "median_ms" in p]
    out["spearman_pooled"] = spearman([p["median_ms"] for p in timed], [p["modeled_ms"] for p in timed])
    if dest:
        dest.write_text(json.dumps(out, indent=1) + "\n")
    print_table(out)


def print_table(out: dict) -> None:
    print(f"\n{out['gpu']}: median ms (speedup of the plan vs conventional / sequential / streams)")
    for w in out["workloads"]:
        base = w.get("baselines", {})
        print(f"{w['workload']:22} floor {w.get('floor_ms', float('nan')):5.2f}  " +
              "  ".join(f"{b} {base[b]['latency_ms']:.2f}" for b in BASELINES if base.get(b, {}).get("latency_ms")) +
              f"  spearman {w['spearman']:.2f}")
        for p in w["plans"]:
            if "median_ms" in p:
                s = p["speedups"]
                print(f"   {p['plan']:12} {p['median_ms']:6.2f} ms  floor x{p['floor_ratio']:.2f}  " +
                      " / ".join(f"{s.get(b, float('nan')):.2f}x" for b in BASELINES) + f"  verdicts {p['verdict_counts']}")
            else:
                print(f"   {p['plan']:12} {p['status']} at {p['stage']}: {p['error'][:120]}")


if __name__ == "__main__":
    main()
