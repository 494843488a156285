"""How much of each phase's time overlapping its consecutive launches could win, with today's tiles.

    python lab/experiments/overlap_bound.py examples/qwen3-06b-8b-b4.toml [...] [--streams 1 2 4 8]
                                       [--plan PLAN.json] [--replays 30] [--json OUT.json]

Per workload, a plan whose launches run on one stream (default: `lab/experiments/variants/knobs/<workload>/
best-phases-apart.json`, the best plan's draft phase, then its verify phase) is compiled over seeded
weights and checked against the fp32 reference first. Then each phase's launches, in order, are
captured into a CUDA graph and timed (--streams 1: the phase as it runs); and again dealt round-robin
to N streams with nothing ordering them (--streams N > 1: launch i on stream i mod N), so up to N
consecutive launches run at once. Last the `round`: both phases at once, each dealt to its own N
streams (N 1: the two phases on two streams, as a `streams` plan runs them, without an SM limit).
The figures with N > 1 compute garbage: they say how fast the same kernels go when each launch's
start, ramp and tail overlap its neighbours', which is the most a dataflow kernel (an op's tiles
starting as soon as the tiles they read are done) could win without faster tiles. A floor: the
launches' bytes at the measured copy bandwidth.
One process, every variant in it: compare within a run.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from conjugate.cli.arguments import output_file, positive  # noqa: E402
from conjugate.workload import load_workload  # noqa: E402

MODELS = ("draft", "target")


def default_plan(workload: Path) -> Path:
    return ROOT / "lab" / "experiments" / "variants" / "knobs" / load_workload(workload).name / "best-phases-apart.json"


def phase_launches(schedule, model: str) -> list[int]:
    """Indices of the launches of one model's phase; a launch holding both models' ops is refused."""
    out = []
    for i, launch in enumerate(schedule.launches):
        models = {p.model.value for p in launch.parts}
        if len(models) > 1:
            raise SystemExit(f"launch {i} holds both models' ops: the phases do not separate")
        if model in models:
            out.append(i)
    return out


def shares(launches: list, streams: int) -> list:
    """The launches dealt round-robin to `streams` calls, each running its share in order."""
    return [lambda share=launches[j::streams]: [launch() for launch in share] for j in range(streams)]


def dealt(launches: list, streams: int, device):
    """The launches in order on the current stream (1), or dealt round-robin to `streams` streams."""
    from conjugate.evaluate.timing import concurrently

    if streams == 1:
        return shares(launches, 1)[0]
    return concurrently(shares(launches, streams), device)


def bench(workload_path: Path, plan_path: Path, streams: list[int], replays: int, cache: Path) -> dict:
    import torch

    from conjugate.compiler.round import compile_round
    from conjugate.evaluate.measured import MeasuredHarness
    from conjugate.evaluate.evaluators import load_profile
    from conjugate.evaluate.rounds import checked_run
    from conjugate.evaluate.session import EvaluationSession
    from conjugate.evaluate.timing import capture, concurrently, copy_bandwidth_gbs, time_replays
    from conjugate.plan import load_plan

    device = torch.device("cuda")
    w = load_workload(workload_path)
    setup = MeasuredHarness(load_profile("h200"), cache, EvaluationSession()).prepare(w)
    compiled = compile_round(load_plan(plan_path), w, *setup.weights, cache_dir=cache)
    compiled.load(setup.inputs)
    compiled.warmup()
    check = checked_run(compiled, setup.inputs, setup.check)  # in order: the mathematics first
    if not check.ok:
        raise SystemExit(f"{w.name}: {plan_path} fails its check: {'; '.join(check.problems[:3])}")
    compiled.load(setup.inputs)
    compiled.run_eager()  # every buffer holds a round's values (valid tokens) before the unordered runs
    torch.cuda.synchronize(device)
    copy_gbs = copy_bandwidth_gbs(device)
    out = {"workload": w.name, "plan": str(plan_path), "checked": True, "copy_gbs": copy_gbs, "phases": {}}
    indices = {m: phase_launches(compiled.schedule, m) for m in MODELS}
    phases = {m: [compiled.launches[i] for i in indices[m]] for m in MODELS}
    bytes_of = {m: sum(compiled.schedule.launches[i].bytes for i in indices[m]) for m in MODELS}

    def timed(body) -> float:
        graph = capture(body, device, warmup=1)
        return time_replays(graph.replay, replays, warmup=3).median_ms

    for model in (*MODELS, "round"):
        names = MODELS if model == "round" else (model,)
        row = {"launches": sum(len(phases[m]) for m in names),
               "floor_ms": sum(bytes_of[m] for m in names) / (copy_gbs * 1e9) * 1e3, "ms": {}}
        for n in streams:
            if model == "round":  # each phase on its own n streams, both at once
                row["ms"][n] = timed(concurrently([f for m in MODELS for f in shares(phases[m], n)], device))
            else:
                row["ms"][n] = timed(dealt(phases[model], n, device))
        out["phases"][model] = row
        print(json.dumps({"workload": w.name, "phase": model} | row), flush=True)
    return out


def print_table(results: list[dict], streams: list[int]) -> None:
    print(f"{'workload':24} {'phase':7} {'launches':>8} {'floor':>7} " + " ".join(f"{f'{n} stream':>15}" for n in streams))
    for r in results:
        for model, row in r["phases"].items():
            cells = " ".join(f"{row['ms'][n]:7.3f} ({row['ms'][n] / row['floor_ms']:4.2f}x)" for n in streams)
            print(f"{r['workload']:24} {model:7} {row['launches']:8d} {row['floor_ms']:7.3f} {cells}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="+", type=Path)
    parser.add_argument("--plan", type=Path, help="one plan for every workload (default: each one's best-phases-apart)")
    parser.add_argument("--streams", nargs="+", type=positive, default=[1, 2, 4, 8])
    parser.add_argument("--replays", type=positive, default=30)
    parser.add_argument("--json", type=output_file)
    args = parser.parse_args()
    streams = sorted(set(args.streams) | {1})
    plans = [args.plan or default_plan(p) for p in args.workloads]
    for plan in plans:
        if not plan.is_file():
            raise SystemExit(f"{plan}: no such plan")
    import torch

    results = []
    with tempfile.TemporaryDirectory(prefix="overlap-bound-") as cache:
        for workload, plan in zip(args.workloads, plans):
            results.append(bench(workload, plan, streams, args.replays, Path(cache)))
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "command": " ".join(sys.argv),
           "streams": streams, "results": results}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    print_table(results, streams)


if __name__ == "__main__":
    main()
