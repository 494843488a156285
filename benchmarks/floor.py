"""How close the best plans found come to the bandwidth floor: per workload the floor, `streams`,
the strengthened `conventional`, the best plan of its searches and where that plan's time still goes
(its time ledger), read from search databases.

    python benchmarks/floor.py WORKLOAD.toml [...] --dbs DB [...] [--json OUT.json] [--plans DIR]

A workload's best plan is the fastest plan that passed every check in any database given whose run is
of that workload; `streams_ms` is the shipped `streams` plan as measured in that same run, and
`conventional_ms` and the floor are that best evaluation's own (`measured`: its date, so rows of databases
from several sessions say which baseline they stand on; `conventional_carried`: where it was measured,
when a resumed run carried it from an earlier process; `conventional_from`: where the best plan's
evaluator did not measure it, the latest that any run of that workload given measured itself). The best
plan is written to DIR/<workload>.json. JSON: {"gpu", "workloads": [{"workload", "floor_ms", "streams_ms",
"conventional_ms", "best_ms", "best_plan", "evaluations", "ledger", ...}]}.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from common import ROOT, environment, make_parser, write_json

from conjugate.errors import ConjugateError  # noqa: E402
from conjugate.paths import shipped_plan  # noqa: E402
from conjugate.plan import load_plan  # noqa: E402
from conjugate.search.report import node_evaluations, passed  # noqa: E402
from conjugate.search.runs import check_workload  # noqa: E402
from conjugate.search.store import NodeStatus, Store  # noqa: E402
from conjugate.workload import load_workload  # noqa: E402

STREAMS = load_plan(shipped_plan("streams")).hash  # the seed every run measures beside its best


def runs_of(db: Path, workload, path: Path):
    """(run, [(node, evaluation)]) for each run of this workload in the database."""
    if not db.is_file():
        raise SystemExit(f"{db}: no such database")
    with Store.open(db) as store:
        for run in store.runs():
            if run.workload_name != workload.name:
                continue
            check_workload(run, workload, path)
            yield run, node_evaluations(store, run, workload)


def best_row(path: Path, dbs: list[Path], plans: Path) -> dict | None:
    workload = load_workload(path)
    best, conventionals = None, []
    for db in dbs:
        for run, pairs in runs_of(db, workload, path):
            measured = [(n, e) for n, e in pairs if passed(e)]
            if not measured:
                continue
            conventionals += _conventionals(db, run, measured)
            node, ev = min(measured, key=lambda p: p[1].result.latency_ms)
            if best is None or ev.result.latency_ms < best["best_ms"]:
                streams = next((e for n, e in measured if n.plan_hash == STREAMS), None)
                metrics = ev.result.metrics
                best = {"workload": workload.name, "example": path.resolve().parent == ROOT / "examples",
                        "floor_ms": metrics.floor_ms,
                        "streams_ms": streams.result.latency_ms if streams else None,
                        "conventional_ms": _baseline(metrics, "conventional"),
                        "conventional_carried": _carried(metrics, "conventional"),
                        "best_ms": ev.result.latency_ms, "floor_ratio": metrics.floor_ratio,
                        "evaluations": sum(1 for n, _ in pairs if n.status is not NodeStatus.NEW),
                        "agent": run.agent, "db": str(db), "node": node.id, "lineage": lineage(pairs, node),
                        "device": metrics.device, "plan": node.plan,
                        "measured": ev.finished_at.date().isoformat() if ev.finished_at else None,
                        "ledger": metrics.ledger.to_dict() if metrics.ledger else None}
    if best is None:
        return None
    if best["conventional_ms"] is None and conventionals:  # an evaluator that skips it (h200_quick)
        _, best["conventional_ms"], best["conventional_from"] = max(conventionals)
    plans.mkdir(parents=True, exist_ok=True)
    out = (plans / f"{workload.name}.json").resolve()
    out.write_text(json.dumps(best.pop("plan"), indent=1) + "\n")
    best["best_plan"] = str(out.relative_to(ROOT)) if out.is_relative_to(ROOT) else str(out)
    return best


def _conventionals(db: Path, run, measured) -> list[tuple[str, float, str]]:
    """(when, ms, where) of the conventional baseline each evaluation of this run measured itself."""
    return [(e.finished_at.isoformat(), ms, f"{db}, run {run.id}, evaluation of node {n.id}, "
             f"{e.finished_at:%Y-%m-%d %H:%M}") for n, e in measured
            if e.finished_at and (ms := _baseline(e.result.metrics, "conventional"))
            and not _carried(e.result.metrics, "conventional")]


def _baseline(metrics, name: str) -> float | None:
    found = metrics.baselines.get(name)
    return found.latency_ms if found is not None and found.latency_ms else None


def _carried(metrics, name: str) -> str | None:
    """Where a baseline carried into a resumed run's process was measured (search --carry-baselines)."""
    found = metrics.baselines.get(name)
    return found.carried or None if found is not None else None


def _ratio(a: float | None, b: float) -> str:
    return "-" if a is None else f"{a / b:.3f}"


def lineage(pairs, node) -> list[str]:
    """The edits from the root to this node, each with the latency measured after it."""
    by_id = {n.id: (n, e) for n, e in pairs}
    chain, current = [], node.id
    while current is not None:
        n, e = by_id[current]
        chain.append(f"{e.result.latency_ms:.3f} ms: {n.rationale}" if passed(e) else n.rationale)
        current = n.parent_id
    return chain[::-1]


def main() -> None:
    parser = make_parser(__doc__)
    parser.add_argument("workloads", nargs="+", type=Path)
    parser.add_argument("--dbs", nargs="+", type=Path, required=True)
    parser.add_argument("--plans", type=Path, default=ROOT / "benchmarks" / "results" / "plans")
    args = parser.parse_args()
    rows = [r for r in (best_row(p, args.dbs, args.plans) for p in args.workloads) if r is not None]
    out = {**environment("floor"), "gpu": next((r["device"] for r in rows), None), "workloads": rows}
    print(f"{'workload':24} {'floor':>7} {'conv':>7} {'streams':>7} {'best':>7} {'xfloor':>6} {'/streams':>8} "
          f"{'/conv':>6} {'evals':>5}")
    for r in rows:
        ms = [("-" if r[k] is None else f"{r[k]:.3f}") for k in ("conventional_ms", "streams_ms")]
        print(f"{r['workload']:24} {r['floor_ms']:7.3f} {ms[0]:>7} {ms[1]:>7} {r['best_ms']:7.3f} "
              f"{r['floor_ratio']:6.3f} "
              f"{_ratio(r['streams_ms'], r['best_ms']):>8} {_ratio(r['conventional_ms'], r['best_ms']):>6} "
              f"{r['evaluations']:5d}")
    for key, name in (("streams_ms", "streams"), ("conventional_ms", "conventional")):
        measured = [r for r in rows if r[key] is not None and r["example"]]
        if measured:
            gm = math.exp(sum(math.log(r[key] / r["best_ms"]) for r in measured) / len(measured))
            print(f"geometric mean over {len(measured)} examples: {gm:.3f}x over {name}")
    write_json(args.json, out)


if __name__ == "__main__":
    try:
        main()
    except ConjugateError as e:  # bad input: one line, no traceback
        raise SystemExit(f"error: {e}") from None
