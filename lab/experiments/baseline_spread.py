"""The baselines as each evaluation worker measured them, read from search databases: how far apart
two processes' `conventional`, `sequential` and `streams` come on one workload.

    python lab/experiments/baseline_spread.py DB [...] [--json OUT.json]

A worker measures the baselines once, before any plan it times, and every evaluation it settles
carries them; so each distinct set of baseline latencies in a workload's evaluations is one worker
process (a resumed run, another GPU, a restarted worker). Per workload: those sets in the order
they first appear, and each baseline's spread, (max - min) / min.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from conjugate.cli.arguments import output_file  # noqa: E402
from conjugate.errors import ConjugateError  # noqa: E402
from conjugate.search.report import node_evaluations  # noqa: E402
from conjugate.search.runs import run_workload  # noqa: E402
from conjugate.search.store import Store  # noqa: E402

BASELINES = ("conventional", "sequential", "streams")


def measured_sets(dbs: list[Path]) -> dict[str, list[dict]]:
    """Per workload name, each distinct set of baseline latencies with when it was first seen."""
    out: dict[str, dict[tuple, dict]] = {}
    for db in dbs:
        if not db.is_file():
            raise SystemExit(f"{db}: no such database")
        with Store.open(db) as store:
            for run in store.runs():
                for _, found in node_evaluations(store, run, run_workload(run)):
                    _add(out.setdefault(run.workload_name, {}), found, run, db)
    return {name: sorted(sets.values(), key=lambda s: s["first_seen"]) for name, sets in out.items()}


def _add(sets: dict, found, run, db: Path) -> None:
    if found is None or not found.done or found.result.metrics is None:
        return
    baselines = found.result.metrics.baselines
    if not all(b in baselines and baselines[b].latency_ms for b in BASELINES):
        return
    key = tuple(round(baselines[b].latency_ms, 4) for b in BASELINES)
    seen = found.finished_at.isoformat()
    if key not in sets or seen < sets[key]["first_seen"]:
        sets[key] = {**dict(zip(BASELINES, key)), "first_seen": seen, "db": db.name, "run_agent": run.agent}


def spread_pct(values: list[float]) -> float:
    return (max(values) - min(values)) / min(values) * 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dbs", nargs="+", type=Path)
    parser.add_argument("--json", type=output_file)
    args = parser.parse_args()
    rows = []
    for name, sets in sorted(measured_sets(args.dbs).items()):
        rows.append({"workload": name, "processes": sets,
                     "spread_pct": {b: round(spread_pct([s[b] for s in sets]), 2) for b in BASELINES}})
    print(f"{'workload':24} {'sets':>4} " + " ".join(f"{b + ' spread %':>22}" for b in BASELINES))
    for r in rows:
        spreads = " ".join(f"{r['spread_pct'][b]:22.2f}" for b in BASELINES)
        print(f"{r['workload']:24} {len(r['processes']):4d} {spreads}")
    if args.json:
        args.json.write_text(json.dumps({"command": " ".join(sys.argv), "workloads": rows}, indent=1) + "\n")


if __name__ == "__main__":
    try:
        main()
    except ConjugateError as e:  # bad input: one line, no traceback
        raise SystemExit(f"error: {e}") from None
