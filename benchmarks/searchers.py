"""The search against its own baselines at an equal budget: heuristic MCTS, `random` and `greedy`
(agents/search_baselines.py), each a fresh run on the same workload, evaluator and seed.

    python benchmarks/searchers.py WORKLOAD.toml [...] [--agents heuristic random greedy] [--budget 40]
                                   [--evaluator h200] [--seed 0] [--out DIR] [--json OUT.json]

Per workload and agent: a search run (as `conjugate search` starts one) into
DIR/<workload>_<agent>.db, then from its history the best latency after each evaluation (in the
order evaluations finished), the best plan and the `sequential` root's latency. The agents of one
workload share one evaluation worker, so its baselines are measured and its kernels compiled once
(each run still evaluates every plan it reaches: their databases are apart, so no run sees another's
results, lessons or best plans). One best-so-far plot per workload (DIR/<workload>_searchers.png).
JSON: {"gpu", "workloads": [{"workload", "runs": [{"agent", "best_ms", "sequential_ms",
"best_so_far_ms": [...], "evaluations"}]}]}.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from conjugate.agents import make_proposer  # noqa: E402
from conjugate.evaluate.profile import load_profile  # noqa: E402
from conjugate.evaluate.worker import IsolatedEvaluator  # noqa: E402
from conjugate.search.commands import open_store, scored_by  # noqa: E402
from conjugate.search.report import run_history  # noqa: E402
from conjugate.search.run import Search, SearchSettings  # noqa: E402
from conjugate.search.store import RunStatus, Store  # noqa: E402
from conjugate.workload import load_workload  # noqa: E402


def search(workload: Path, agent: str, budget: int, evaluator: IsolatedEvaluator, seed: int, db: Path) -> dict:
    db.unlink(missing_ok=True)
    started = time.perf_counter()
    settings = scored_by(SearchSettings(budget=budget), evaluator.profile)
    w = load_workload(workload)
    with open_store(str(db), create=True) as store:
        run = Search.start(store, w.name, w, str(workload.resolve()), evaluator, make_proposer(agent, seed=seed),
                           settings, seed)
        why = run.run_loop()
        store.set_run_status(run.run_id, RunStatus.FINISHED if why in ("budget", "exhausted") else RunStatus.STOPPED)
        print(f"{w.name} {agent}: {why} after {run.evaluations_done()} evaluations", flush=True)
    with Store.open(db) as store:
        run = store.latest_run()
        history = run_history(store, run)
    done = sorted((h for h in history if h["latency_ms"] is not None and h["status"] == "ok"),
                  key=lambda h: h["finished_at"] or "")
    best, curve = float("inf"), []
    for h in done:
        best = min(best, h["latency_ms"])
        curve.append(best)
    root = next(h for h in history if h["parent"] is None)
    return {"agent": agent, "best_ms": curve[-1], "sequential_ms": root["latency_ms"], "best_so_far_ms": curve,
            "evaluations": len(done), "seconds": time.perf_counter() - started, "db": str(db)}


def plot(name: str, runs: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    for r in runs:
        ax.plot(range(1, len(r["best_so_far_ms"]) + 1), r["best_so_far_ms"], label=r["agent"])
    ax.set_xlabel("evaluations")
    ax.set_ylabel("best round latency (ms)")
    ax.set_title(name)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="+", type=Path)
    parser.add_argument("--agents", nargs="+", default=["heuristic", "random", "greedy"])
    parser.add_argument("--budget", type=int, default=40)
    parser.add_argument("--evaluator", default="h200")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("searchers"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    out = {"gpu": None, "evaluator": args.evaluator, "budget": args.budget, "command": " ".join(sys.argv),
           "workloads": []}
    for path in args.workloads:
        name = load_workload(path).name
        with IsolatedEvaluator(load_profile(args.evaluator)) as shared:
            runs = [search(path, agent, args.budget, shared, args.seed, args.out / f"{name}_{agent}.db")
                    for agent in args.agents]
        plot(name, runs, args.out / f"{name}_searchers.png")
        out["workloads"].append({"workload": name, "runs": runs})
        if out["gpu"] is None:
            import torch
            out["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "none (" + args.evaluator + ")"
        if args.json:
            args.json.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{'workload':24} {'agent':10} {'sequential':>10} {'best':>8} {'evals':>5}")
    for w in out["workloads"]:
        for r in w["runs"]:
            print(f"{w['workload']:24} {r['agent']:10} {r['sequential_ms']:10.3f} {r['best_ms']:8.3f} {r['evaluations']:5d}")


if __name__ == "__main__":
    main()
