"""Where a search's evaluations spend their time, and how long each takes: one measured search per
workload and evaluator profile, each a process of its own (`conjugate search`, heuristic agent,
same seed), then from its database every evaluation's wall time split into steps (setup, baselines,
compile, warmup, check, replays, verdicts: EvalResult.seconds) and its baselines.

    python benchmarks/eval_time.py WORKLOAD.toml [...] --evaluators PROFILE [PROFILE ...]
                                   [--budget 16] [--time 240s] [--out DIR] [--json OUT.json]
                                   [--code DIR] [--read]

`--code DIR` runs the searches with the code of another checkout (e.g. `git worktree add DIR COMMIT`
for the evaluator as it was at COMMIT: the "before" stage), read back with this one's.
`--read` runs nothing: it reads back the databases an earlier run left in `--out` (one stopped by a
time limit before it wrote its JSON); `search_s` is then unknown.

The first evaluation of a run also prepares the workload and measures the baselines; the medians
leave it aside. Two runs of one workload on one GPU also give the baselines measured in two
processes (`baseline_spread_pct`).
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import ROOT, environment, git_commit, make_parser, write_json

from conjugate.evaluate.result import STEPS  # noqa: E402
from conjugate.search.runs import eval_key, run_evaluator_id  # noqa: E402
from conjugate.search.store import Store  # noqa: E402
from conjugate.workload import load_workload  # noqa: E402

BASELINES = ("conventional", "streams", "sequential")


def search(workload: Path, evaluator: str, budget: int, limit: str, db: Path, code: Path = ROOT) -> float:
    """A `conjugate search` process run with the code at `code`; its seconds."""
    db.unlink(missing_ok=True)
    if Path(evaluator).exists():
        evaluator = str(Path(evaluator).resolve())
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "conjugate", "search", str(workload.resolve()), "--evaluator",
                           evaluator, "--budget", str(budget), "--time", limit, "--seed", "0", "--db", str(db.resolve())],
                          cwd=code, env=env)
    if done.returncode:  # its own one-line error is above
        raise SystemExit(f"{workload}: `conjugate search --evaluator {evaluator}` ended with status {done.returncode}")
    return time.perf_counter() - started


def evaluations(db: Path, workload: Path) -> list[dict]:
    """The run's finished evaluations in the order they finished."""
    w = load_workload(workload)
    with Store.open(db) as store:
        run = store.latest_run()
        found = [(n, store.evaluation(eval_key(n.plan_hash, w, run_evaluator_id(run)))) for n in store.nodes(run.id)]
    rows = []
    for node, record in sorted(((n, f) for n, f in found if f is not None and f.done), key=lambda nf: nf[1].finished_at):
        r, m = record.result, record.result.metrics
        baselines = m.baselines if m else {}
        rows.append({"node": node.id, "proposer": node.proposer, "rationale": node.rationale,
                     "status": str(r.status), "device": m.device if m else None, "latency_ms": r.latency_ms,
                     "floor_ms": m.floor_ms if m else None,
                     "speedups": r.speedups, "wall_s": r.wall_s, "seconds": r.seconds,
                     "replays": r.metrics.replays if r.metrics else None,
                     "verdicts": len(r.verdicts), "baselines": {k: b.latency_ms for k, b in baselines.items()},
                     "variants": baselines["conventional"].variants if "conventional" in baselines else {}})
    return rows


def summary(rows: list[dict], search_s: float | None) -> dict:
    later = rows[1:]  # the first also prepared the workload and measured the baselines
    median = (lambda xs: round(statistics.median(xs), 3) if xs else None)
    first = rows[0] if rows else {}
    ok = [r for r in rows if r["latency_ms"]]
    best = min(ok, key=lambda r: r["latency_ms"], default={})
    seeds = {r["rationale"].split()[-1] if r["rationale"].startswith("shipped plan") else "sequential": r["latency_ms"]
             for r in rows if r["proposer"] == "seed"}
    return {"evaluations": len(rows), "search_s": None if search_s is None else round(search_s, 1),
            "first_eval_s": first.get("wall_s"), "eval_seconds_median": median([r["wall_s"] for r in later]),
            "eval_seconds_max": max((r["wall_s"] for r in later), default=None),
            "step_seconds_median": {s: median([r["seconds"].get(s, 0.0) for r in later]) for s in STEPS},
            "replays_median": median([r["replays"] for r in later if r["replays"]]),
            "baselines_ms": first.get("baselines", {}), "variants": first.get("variants", {}),
            "seeds_ms": seeds, "best_ms": best.get("latency_ms"), "best_node": best.get("node"),
            "best_rationale": best.get("rationale"), "floor_ms": best.get("floor_ms"),
            "best_speedups": best.get("speedups", {})}


def spread_pct(runs: list[dict]) -> dict[str, float]:
    """Per baseline, (max - min) / min over the runs (processes) that measured it, in percent."""
    out = {}
    for name in BASELINES:
        values = [r["baselines_ms"][name] for r in runs if r["baselines_ms"].get(name)]
        if len(values) > 1:
            out[name] = round((max(values) - min(values)) / min(values) * 100, 3)
    return out


def main() -> None:
    parser = make_parser(__doc__)
    parser.add_argument("workloads", nargs="+", type=Path)
    parser.add_argument("--evaluators", nargs="+", default=["h200"])
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--time", default="240s")
    parser.add_argument("--out", type=Path, default=Path("eval_time"))
    parser.add_argument("--code", type=Path, default=ROOT, help="the checkout whose code runs the searches")
    parser.add_argument("--read", action="store_true", help="run nothing: read back the databases in --out")
    args = parser.parse_args()
    if not (args.code / "conjugate" / "__main__.py").exists():
        raise SystemExit(f"--code {args.code}: no conjugate package there")
    args.out.mkdir(parents=True, exist_ok=True)
    out = {**environment("eval_time"), "budget": args.budget, "time": args.time, "workloads": []}
    if args.code.resolve() != ROOT.resolve():  # the searches run another checkout's code: its commit
        out["code"] = git_commit(args.code)
    for path in args.workloads:
        name = load_workload(path).name
        runs = []
        for evaluator in args.evaluators:
            db = args.out / f"{name}_{Path(evaluator).stem}.db"
            if args.read and not db.is_file():
                raise SystemExit(f"{db}: no such database to read back")
            search_s = None if args.read else search(path, evaluator, args.budget, args.time, db, args.code.resolve())
            rows = evaluations(db, path)
            runs.append({"evaluator": evaluator, **summary(rows, search_s), "rows": rows})
        out["workloads"].append({"workload": name, "runs": runs, "baseline_spread_pct": spread_pct(runs)})
        out["gpu"] = out["gpu"] or next((r["device"] for run in runs for r in run["rows"] if r["device"]), None)
        write_json(args.json, out)
    print(f"{'workload':24} {'evaluator':18} {'evals':>5} {'first s':>8} {'median s':>8} {'max s':>7}  steps (median s)")
    for w in out["workloads"]:
        for r in w["runs"]:
            steps = " ".join(f"{k}={v:.2f}" for k, v in r["step_seconds_median"].items() if v)
            print(f"{w['workload']:24} {Path(r['evaluator']).stem:18} {r['evaluations']:5d} {r['first_eval_s'] or 0:8.1f} "
                  f"{r['eval_seconds_median'] or 0:8.2f} {r['eval_seconds_max'] or 0:7.2f}  {steps}")
        print(f"{'':24} baselines across processes: spread % {w['baseline_spread_pct']}")


if __name__ == "__main__":
    main()
