"""How well the analytical evaluator ranks plans the way the GPU does.

    python benchmarks/analytical_agreement.py [--measured results/evaluator_rounds_h200.json]
                                              [--search search/search_llama-1b-8b-b8_h200.db]
                                              [--json results/analytical_agreement.json]

Runs on the CPU: models every (workload, plan) of a committed GPU result with the analytical
evaluator (evaluators/analytical.toml) and reports Spearman's rank correlation between modeled
and measured latency, per workload (over its plans) and pooled over every pair. With `--search`,
also over the plans a measured search's agent made and the GPU evaluated correctly: many close
variants of one workload's plans, none of them among the rounds the profile was fitted to (the
search's seeds, the shipped plans, are left out).
"""
from __future__ import annotations

import json
from pathlib import Path

from common import ROOT, environment, make_parser, write_json

from conjugate.evaluate.calibrate import spearman  # noqa: E402
from conjugate.evaluate.pipeline import evaluate  # noqa: E402
from conjugate.evaluate.evaluators import load_profile  # noqa: E402
from conjugate.evaluate.session import EvaluationSession  # noqa: E402
from conjugate.paths import shipped_plan  # noqa: E402
from conjugate.plan import load_plan  # noqa: E402
from conjugate.workload import load_workload  # noqa: E402


def main() -> None:
    parser = make_parser(__doc__, full_doc=True)
    parser.add_argument("--measured", type=Path, default=ROOT / "benchmarks" / "results" / "evaluator_rounds_h200.json")
    parser.add_argument("--search", type=Path, help="a measured search's database (its latest run)")
    args = parser.parse_args()
    measured = json.loads(args.measured.read_text())
    profile, session = load_profile("analytical"), EvaluationSession()
    rows, per_workload = [], {}
    for w in measured["workloads"]:
        workload = load_workload(ROOT / "examples" / f"{w['workload']}.toml")
        pairs = []
        for p in w["plans"]:
            if "median_ms" not in p:
                continue
            result = evaluate(load_plan(shipped_plan(p["plan"])), workload, profile, session=session)
            pairs.append((p["plan"], p["median_ms"], result.latency_ms))
            rows.append({"workload": w["workload"], "plan": p["plan"], "measured_ms": p["median_ms"],
                         "modeled_ms": result.latency_ms})
        per_workload[w["workload"]] = spearman([m for _, m, _ in pairs], [e for _, _, e in pairs])
    pooled = spearman([r["measured_ms"] for r in rows], [r["modeled_ms"] for r in rows])
    out = {**environment("analytical_agreement", gpu=measured["gpu"]), "measured": _shown(args.measured),
           "evaluator": profile.name, "spearman_per_workload": per_workload, "spearman_pooled": pooled, "rows": rows}
    if args.search:
        out["search"] = search_agreement(args.search, profile, session)
    write_json(args.json, out)
    for r in rows:
        print(f"{r['workload']:24} {r['plan']:11} measured {r['measured_ms']:6.2f} ms  modeled {r['modeled_ms']:6.2f} ms")
    print("Spearman per workload:", {k: round(v, 2) for k, v in per_workload.items()})
    print(f"Spearman pooled over {len(rows)} rounds: {pooled:.3f}")
    if args.search:
        found = out["search"]
        print(f"Search {found['workload']}: Spearman over its {found['plans']} measured plans {found['spearman']:.3f}; "
              f"the model's best is measured {found['modeled_best_measured_ms']:.3f} ms against the best "
              f"{found['measured_best_ms']:.3f} ms")


def search_agreement(db: Path, profile, session: EvaluationSession) -> dict:
    """Spearman between measured and modeled latency over the plans a search's agent proposed
    (not its seeds) that the GPU evaluated correctly."""
    from conjugate.plan import validate_plan
    from conjugate.search.report import run_history
    from conjugate.search.runs import check_workload
    from conjugate.search.store import Store

    with Store.open(str(db)) as store:
        run = store.latest_run()
        history = {h["node"]: h for h in run_history(store, run) if h["status"] == "ok" and h["proposer"] != "seed"}
        plans = {n.id: n.plan for n in store.nodes(run.id) if n.id in history}
    workload = load_workload(ROOT / "examples" / f"{run.workload_name}.toml")
    check_workload(run, workload)  # the example file as the search measured it
    estimate = {i: evaluate(validate_plan(plans[i]), workload, profile, session=session).latency_ms
                for i in sorted(plans)}
    pairs = [(history[i]["latency_ms"], estimate[i]) for i in sorted(plans)]
    measured, modeled = [m for m, _ in pairs], [e for _, e in pairs]
    return {"db": _shown(db), "workload": run.workload_name, "plans": len(pairs),
            "spearman": spearman(measured, modeled), "measured_best_ms": min(measured),
            "modeled_best_measured_ms": measured[modeled.index(min(modeled))]}


def _shown(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


if __name__ == "__main__":
    main()
