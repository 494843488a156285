"""Per-round latency of the shipped plans on the GPU, each checked against the reference first.

    python benchmarks/compiler_rounds.py [WORKLOAD.toml ...] [--plans sequential streams interleave]
                                         [--replays 200] [--profile] [--json OUT.json]
    python benchmarks/compiler_rounds.py [WORKLOAD.toml ...] --evaluator h200 [--json OUT.json [--append]]
    python benchmarks/compiler_rounds.py --merge PART.json ... --json OUT.json

For every workload (default: the six H200 configurations in examples/): seeded random weights on
the GPU, then per plan: compile, run eagerly on poisoned outputs and compare with the fp32
reference round (teacher-forced by the plan's draft tokens, see evaluate/correctness.py), capture
the whole round in a CUDA graph, check one replay, and time replays with CUDA events (median, p20,
p80). The floor is the bytes the round must move over the device-copy bandwidth measured in the
same process.

`--evaluator NAME` measures through `conjugate.evaluate.pipeline.evaluate` instead, the function the
search calls: per plan validate, compile, check (eagerly and replayed), time 200 replays on fresh
random inputs, then each multi-part launch against its parts; the three baselines (conventional,
sequential, streams) once per workload, kept by the one EvaluationSession of the process; and the
analytical evaluator's ranking of the same plans against the measured one. Its
workloads[].plans[].median_ms feed `conjugate calibrate --from`. `--merge` joins such result files of
runs made side by side (one per GPU of a host) without measuring.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from common import ROOT, SIX, environment, make_parser, require_gpu, write_json

from conjugate.errors import ConjugateError  # noqa: E402
from conjugate.plan import load_plan  # noqa: E402
from conjugate.workload import load_workload  # noqa: E402

BASELINES = ("conventional", "sequential", "streams")


# -- the compiler's rounds, timed directly

def profile_launches(compiled, reps: int = 10) -> list[dict]:
    """Each launch alone: a CUDA graph of `reps` back-to-back launches, timed per launch."""
    from conjugate.evaluate.timing import time_per_call

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
    from common import check_then_time
    from conjugate.compiler.round import compile_round

    plan = load_plan(plan_path)
    row = {"plan": plan.name, "plan_hash": plan.hash[:12]}
    t0 = time.perf_counter()
    try:
        compiled = compile_round(plan, workload, *prepared, cache_dir=cache_dir)
        compiled.load(inputs)
        compiled.warmup()  # every kernel compiled before anything is checked
        row["compile_s"] = round(time.perf_counter() - t0, 1)
        checked = check_then_time(compiled, inputs, check, replays)
    except ConjugateError as e:
        return row | {"status": "compile_error", "error": str(e)}
    row |= {"launches": len(compiled.launches), "kernels": len({l.digest for l in compiled.launches})}
    row |= {k: checked[k] for k in ("correct", "check", "eager_check_ok")}
    if not row["correct"]:
        return row | {"status": "incorrect", "deterministic": _deterministic(compiled, inputs)}
    row |= {**{k: v for k, v in checked.items() if k not in row}, "status": "ok"}
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
    from conjugate.compiler.buffers import PreparedWeights
    from conjugate.evaluate.correctness import ReferenceChecker
    from conjugate.evaluate.rounds import round_inputs
    from conjugate.graph import build_graph, graph_totals
    from conjugate.models import random_weights

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


def compiler_rounds(args) -> None:
    from conjugate.evaluate.timing import copy_bandwidth_gbs

    bandwidth = copy_bandwidth_gbs(torch.device("cuda")) * 1e9
    out = {**environment("compiler_rounds"), "copy_bandwidth_gbs": bandwidth / 1e9, "workloads": []}
    plans = [Path(p) if p.endswith(".json") else ROOT / "plans" / f"{p}.json" for p in args.plans]
    for path in args.workloads:
        out["workloads"].append(bench_workload(Path(path), plans, args.replays, bandwidth, args.cache_dir,
                                                 args.profile))
        torch.cuda.empty_cache()
        write_json(args.json, out)
    print(f"\n{out['gpu']}, copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    print(f"{'workload':24} {'floor':>7} " + " ".join(f"{p:>12}" for p in args.plans))
    for w in out["workloads"]:
        cells = [f"{r['median_ms']:9.2f} ms" if "median_ms" in r else f"{r['status']:>12}" for r in w["plans"]]
        print(f"{w['workload']:24} {w['floor_ms']:5.2f}ms " + " ".join(cells))


# -- the same plans through the evaluator the search uses (--evaluator)

def plan_row(plan, result, modeled) -> dict:
    from conjugate.evaluate.result import VerdictKind

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


def evaluate_workload(path: Path, plans: list, profile, analytical, session) -> dict:
    from conjugate.evaluate.calibrate import spearman
    from conjugate.evaluate.pipeline import evaluate

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


def evaluator_rounds(args) -> None:
    from conjugate.evaluate.evaluators import load_profile
    from conjugate.evaluate.session import EvaluationSession

    profile, analytical = load_profile(args.evaluator), load_profile("analytical")
    plans = [load_plan(p if p.endswith(".json") else ROOT / "plans" / f"{p}.json") for p in args.plans]
    out = {**environment("compiler_rounds"), "evaluator": profile.name, "workloads": []}
    if args.append and args.json and args.json.exists():
        earlier = json.loads(args.json.read_text())
        out["earlier_runs"] = earlier.get("earlier_runs", []) + [{k: v for k, v in earlier.items() if k not in (
            "workloads", "earlier_runs")}]
        out["workloads"] = earlier["workloads"]
    session = EvaluationSession()  # one workload's weights, references and baselines at a time
    for path in args.workloads:
        row = evaluate_workload(Path(path), plans, profile, analytical, session)
        out["workloads"] = [w for w in out["workloads"] if w["workload"] != row["workload"]] + [row]
        out["spearman_pooled"] = pooled_spearman(out["workloads"])
        write_json(args.json, out)
    print_table(out)


def pooled_spearman(workloads: list[dict]) -> float:
    from conjugate.evaluate.calibrate import spearman

    timed = [p for w in workloads for p in w["plans"] if "median_ms" in p]
    return spearman([p["median_ms"] for p in timed], [p["modeled_ms"] for p in timed])


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
    out["spearman_pooled"] = pooled_spearman(out["workloads"])
    write_json(dest, out)
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


def main() -> None:
    parser = make_parser(__doc__, full_doc=True)
    parser.add_argument("workloads", nargs="*", default=[str(ROOT / "examples" / f"{n}.toml") for n in SIX])
    parser.add_argument("--plans", nargs="+", default=["sequential", "streams", "interleave"],
                        help="shipped plan names or plan JSON paths")
    parser.add_argument("--replays", type=int, default=200)
    parser.add_argument("--cache-dir", type=Path)
    parser.add_argument("--profile", action="store_true", help="also time every launch alone, grouped by kind")
    parser.add_argument("--evaluator", help="measure through this evaluator profile (e.g. h200), as the search does")
    parser.add_argument("--append", action="store_true",
                        help="with --evaluator: keep the workloads already in --json and add or replace these")
    parser.add_argument("--merge", nargs="+", type=Path, metavar="PART.json",
                        help="only join these --evaluator result files (their workloads, in order) into --json")
    args = parser.parse_args()
    if args.merge:
        if parser.get_default("workloads") != args.workloads or args.append or args.evaluator:
            parser.error("--merge measures nothing: give it result files only (no workloads, --append, --evaluator)")
        return merge(args.merge, args.json)
    if args.append and not args.evaluator:
        parser.error("--append keeps the workloads of an --evaluator result file: give --evaluator")
    if not args.evaluator:
        require_gpu(parser, "it times the plans' launches on a GPU")
    return evaluator_rounds(args) if args.evaluator else compiler_rounds(args)


if __name__ == "__main__":
    main()
