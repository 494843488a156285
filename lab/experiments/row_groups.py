"""Would the draft's rows, split into groups on streams of their own, shorten its chain?

    python lab/experiments/row_groups.py examples/qwen3-06b-8b-b4.toml [...] [--groups 1 2 4]
                                    [--plan PLAN.json] [--replays 30] [--json OUT.json]

A draft's requests are independent: row r of every draft op reads only row r of the op before it
(attention reads its own sequence's cache). So the draft phase of B rows could run as G chains of
B/G rows, each on a stream of its own, their launch latencies overlapping, all reading the same
weights (a weight read by one chain is in L2 when the other's launch reads it soon after).

Per workload, a plan whose launches run on one stream (default: `lab/experiments/variants/knobs/
<workload>/best-phases-apart.json`) is compiled for the workload and for each G for the same
workload with B/G draft rows, over the same weights; each compiled round is checked against the
fp32 reference first. G copies of the B/G-row round (buffers of their own, weights shared) stand for
the G row groups. Timed, each in a CUDA graph: the draft phase (the full batch; one group alone; G
groups at once), and the round (the full batch's draft and its verify on two streams, as `streams`
runs them; the G groups' drafts and the verify on G + 1 streams). One process: compare within a run.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from conjugate.cli.arguments import output_file, positive  # noqa: E402
from conjugate.workload import load_workload  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from overlap_bound import default_plan, phase_launches  # noqa: E402


def bench(workload_path: Path, plan_path: Path, groups: list[int], replays: int, cache: Path) -> dict:
    import torch

    from conjugate.compiler.buffers import PreparedWeights
    from conjugate.compiler.round import compile_round
    from conjugate.evaluate.correctness import ReferenceChecker, tolerance_for
    from conjugate.evaluate.evaluators import load_profile
    from conjugate.evaluate.rounds import checked_run, round_inputs
    from conjugate.evaluate.timing import capture, concurrently, copy_bandwidth_gbs, time_replays
    from conjugate.plan import load_plan
    from conjugate.roles import Model

    device = torch.device("cuda")
    w = load_workload(workload_path)
    plan = load_plan(plan_path)
    draft, target = w.weights(Model.DRAFT, device), w.weights(Model.TARGET, device)
    prepared = (PreparedWeights(draft), PreparedWeights(target))
    tolerances = load_profile("h200").tolerances

    def compiled_for(workload, copies: int) -> list:
        inputs = round_inputs(workload, draft, target)
        check = ReferenceChecker(draft, target, inputs, workload.dtype, tolerance_for(workload.dtype, tolerances))
        rounds = []
        for _ in range(copies):
            compiled = compile_round(plan, workload, *prepared, cache_dir=cache)
            compiled.load(inputs)
            compiled.warmup()
            result = checked_run(compiled, inputs, check)
            if not result.ok:
                raise SystemExit(f"{workload.name}: {plan_path} fails its check: {'; '.join(result.problems[:3])}")
            compiled.load(inputs)
            compiled.run_eager()
            rounds.append(compiled)
        torch.cuda.synchronize(device)
        return rounds

    def phase(compiled, model: str) -> list:
        return [compiled.launches[i] for i in phase_launches(compiled.schedule, model)]

    def run_all(launches: list):
        return lambda: [launch() for launch in launches]

    def timed(body) -> float:
        graph = capture(body, device, warmup=1)
        return time_replays(graph.replay, replays, warmup=3).median_ms

    full = compiled_for(w, 1)[0]
    copy_gbs = copy_bandwidth_gbs(device)
    draft_bytes = sum(full.schedule.launches[i].bytes for i in phase_launches(full.schedule, "draft"))
    verify = phase(full, "target")
    out = {"workload": w.name, "plan": str(plan_path), "checked": True, "copy_gbs": copy_gbs,
           "draft_floor_ms": draft_bytes / (copy_gbs * 1e9) * 1e3, "groups": {}}
    for g in groups:
        if w.draft_batch % g:
            print(f"{w.name}: {g} groups do not divide {w.draft_batch} draft rows; skipped", flush=True)
            continue
        if g == 1:
            drafts = [phase(full, "draft")]
        else:
            part = dataclasses.replace(w, name=f"{w.name}-rows{w.draft_batch // g}", draft_batch=w.draft_batch // g)
            drafts = [phase(c, "draft") for c in compiled_for(part, g)]
        row = {"rows": w.draft_batch // g,
               "one_group_ms": timed(run_all(drafts[0])),
               "draft_ms": timed(concurrently([run_all(d) for d in drafts], device) if g > 1 else run_all(drafts[0])),
               "round_ms": timed(concurrently([run_all(d) for d in drafts] + [run_all(verify)], device))}
        out["groups"][g] = row
        print(json.dumps({"workload": w.name, "groups": g} | row), flush=True)
    out["verify_ms"] = timed(run_all(verify))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="+", type=Path)
    parser.add_argument("--plan", type=Path, help="one plan for every workload (default: each one's best-phases-apart)")
    parser.add_argument("--groups", nargs="+", type=positive, default=[1, 2, 4])
    parser.add_argument("--replays", type=positive, default=30)
    parser.add_argument("--json", type=output_file)
    args = parser.parse_args()
    groups = sorted(set(args.groups) | {1})
    plans = [args.plan or default_plan(p) for p in args.workloads]
    for plan in plans:
        if not plan.is_file():
            raise SystemExit(f"{plan}: no such plan")
    import torch

    results = []
    with tempfile.TemporaryDirectory(prefix="row-groups-") as cache:
        for workload, plan in zip(args.workloads, plans):
            results.append(bench(workload, plan, groups, args.replays, Path(cache)))
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "command": " ".join(sys.argv),
           "results": results}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{'workload':24} {'groups':>6} {'rows':>4} {'floor':>7} {'one group':>9} {'draft':>7} {'verify':>7} {'round':>7}")
    for r in results:
        for g, row in r["groups"].items():
            print(f"{r['workload']:24} {g:>6} {row['rows']:4d} {r['draft_floor_ms']:7.3f} {row['one_group_ms']:9.3f} "
                  f"{row['draft_ms']:7.3f} {r['verify_ms']:7.3f} {row['round_ms']:7.3f}")


if __name__ == "__main__":
    main()
