"""`conjugate bench`: plans evaluated on a workload beside the baselines, as a table (and JSON)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table

from conjugate.cli.arguments import WORKLOAD_HELP, evaluator_help, plan_name_or_file, workload_name_or_file
from conjugate.cli.bench_progress import BenchProgress, variant_trials_estimate
from conjugate.cli.console import out
from conjugate.cli.devices import require_device
from conjugate.files import check_output, write_output
from conjugate.paths import SEED_PLANS, plan_path, shipped_plan

if TYPE_CHECKING:
    from conjugate.evaluate.result import EvalResult

BASELINES = ("conventional", "sequential", "streams")


def cmd_bench(args: argparse.Namespace) -> int:
    """Evaluate plans on a workload beside the baselines; print a table, optionally write JSON."""
    from conjugate.evaluate.evaluators import load_profile
    from conjugate.evaluate.worker import IsolatedEvaluator
    from conjugate.plan import load_plan
    from conjugate.workload import load_workload

    workload = load_workload(args.workload)
    profile = load_profile(args.evaluator)
    paths = [plan_path(p) for p in args.plan] if args.plan else [shipped_plan(n) for n in SEED_PLANS]
    check_output("--json", args.json, [args.workload, profile.source, *paths])
    require_device(profile)  # every row would fail alike
    plans = [(_bench_label(path, plan), plan) for path, plan in ((path, load_plan(path)) for path in paths)]
    setup_s = variant_trials_estimate(workload, profile)
    rows = []
    with IsolatedEvaluator(profile) as isolated:  # a crash or a hang costs one result, not the run
        for i, (label, plan) in enumerate(plans):
            with BenchProgress(f"{profile.name}: {label} on {workload.name} ({i + 1}/{len(plans)})",
                               setup_s if i == 0 else None) as progress:
                result = isolated.evaluate(plan.to_dict(), args.workload, refresh_baselines=args.remeasure and i == 0,
                                           on_stage=progress.stage)
            rows.append((label, result))
            out.print(f"{label}: {_bench_cell(result)}")
    _bench_table(workload, profile, rows)
    if args.json:
        write_output(args.json, json.dumps({"workload": workload.name, "evaluator": profile.name,
                                               "modeled": profile.kind != "gpu",
                                               "plans": [{"plan": plan.name, "label": label, "result": r.to_dict()}
                                                         for (label, r), (_, plan) in zip(rows, plans)]},
                                              indent=1) + "\n")
    return 0 if all(r.ok for _, r in rows) else 1  # the table says where and why


def _bench_label(path: Path, plan) -> str:
    """A bench row's name: the plan's, with its file's stem first where that differs and the file is
    not the shipped plan of that name (an exported best plan keeps its seed's name, e.g. `streams`)."""
    if path.stem == plan.name or path.resolve() == shipped_plan(plan.name).resolve():
        return plan.name
    return f"{path.stem} ({plan.name})"


def _failure(r: EvalResult) -> str:
    return f"{r.status} at {r.stage}: {r.error}"


def _bench_cell(r: EvalResult) -> str:
    if not r.ok:
        return _failure(r)
    return f"{r.latency_ms:.3f} ms, " + ", ".join(f"{s:.2f}x vs {n}" for n, s in r.speedups.items())


def _bench_table(workload, profile, rows: list[tuple[str, EvalResult]]) -> None:
    measured_on = next((r.metrics.device for _, r in rows if r.metrics), "the GPU")
    what = f"MODELED for {profile.gpu}, not measured" if profile.kind != "gpu" else f"measured on {measured_on}"
    table = Table(title=f"{workload.name}, evaluator {profile.name}: latencies {what}")
    for col in ("plan", "latency", "p20-p80", "floor ratio", *(f"vs {b}" for b in BASELINES), "status", "checked"):
        table.add_column(col)
    for name, r in rows:
        m, checked = r.metrics, "skipped" if "skipped" in r.checks else ("yes" if r.checks.get("ok") else "-")
        table.add_row(name, f"{m.latency_ms:.3f} ms" if m else "-",
                      f"{m.p20_ms:.3f}-{m.p80_ms:.3f}" if m and m.p20_ms is not None else "-",
                      f"{m.floor_ratio:.2f}" if m else "-",
                      *(f"{r.speedups[b]:.2f}x" if b in r.speedups else ("GPU only" if r.modeled else "-")
                        for b in BASELINES),
                      "ok" if r.ok else _failure(r), checked)
    out.print(table)
    failed = {name: b for _, r in rows if r.metrics for name, b in r.metrics.baselines.items() if b.status != "ok"}
    for name, b in failed.items():
        out.print(f"baseline {name}: {b.status}" + (f": {b.error}" if b.error else ""))


def add_command(sub) -> None:
    bench = sub.add_parser("bench", help="evaluate plans on a workload beside the baselines")
    bench.add_argument("workload", type=workload_name_or_file, help=WORKLOAD_HELP)
    bench.add_argument("--plan", action="append", type=plan_name_or_file,
                       help="a plan JSON file or a shipped plan by name (repeatable; default: the shipped plans)")
    bench.add_argument("--evaluator", default="analytical", help=evaluator_help())
    bench.add_argument("--json", help="also write the results as JSON to this file")
    bench.add_argument("--remeasure", action="store_true", help="measure the baselines again (GPU evaluators "
                       "measure them once per workload in a worker process)")
    bench.set_defaults(func=cmd_bench)
