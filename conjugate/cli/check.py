"""`conjugate check`: every shipped plan validated and expanded on a workload; the reference round
and one plan's compiled round run and compared."""
from __future__ import annotations

import argparse

from rich.table import Table
from rich.text import Text

from conjugate.cli.arguments import WORKLOAD_HELP, integer, workload_name_or_file
from conjugate.cli.console import human_bytes, out
from conjugate.cli.plan import schedule_table
from conjugate.errors import PlanError
from conjugate.paths import DEFAULT_WORKLOAD, PLANS_DIR

MAX_LIMIT = 1_000_000  # launches printed


def cmd_check(args: argparse.Namespace) -> None:
    """Load a workload, validate and expand every shipped plan, run the reference round and one
    plan's compiled round, and check that they agree."""
    from conjugate.plan import expand, load_plan
    from conjugate.workload import load_workload

    workload = load_workload(args.workload)
    out.print(f"workload {workload.name}: {workload.draft.name} -> {workload.target.name}, k={workload.k}, "
              f"batches {workload.draft_batch}/{workload.target_batch}, context {workload.context}, {workload.dtype}")
    table = Table(title="Shipped plans")
    for col in ("plan", "hash", "launches", "cross-model", "bytes", "status"):
        table.add_column(col)
    schedules = {}
    for path in sorted(PLANS_DIR.glob("*.json")):
        if path.name.endswith(".schema.json"):
            continue
        plan = load_plan(path)
        schedules[plan.name] = schedule = expand(plan, workload)
        s = schedule.summary()
        table.add_row(plan.name, plan.hash[:12], str(s["launches"]), str(s["cross_model"]), human_bytes(s["bytes"]), "valid")
    out.print(table)
    if args.plan not in schedules:
        raise PlanError(f"--plan: no shipped plan named {args.plan!r}; shipped: {', '.join(schedules)}")
    shown = args.plan
    out.print(schedule_table(schedules[shown], f"Expanded schedule of {shown!r}", limit=args.limit))
    if len(schedules[shown].launches) > args.limit:
        out.print(f"... {len(schedules[shown].launches) - args.limit} more launches (conjugate plan explain)")
    _run_rounds(workload, load_plan(PLANS_DIR / f"{shown}.json"))


def _run_rounds(workload, plan) -> None:
    """The reference round, then the plan's compiled round checked against it."""
    import torch

    from conjugate.compiler.round import compile_round
    from conjugate.evaluate.correctness import ReferenceChecker
    from conjugate.evaluate.modeled import CHECK_CACHE_BYTES
    from conjugate.evaluate.rounds import checked_run, round_inputs
    from conjugate.models import reference_round
    from conjugate.roles import Model

    too_large = workload.draft.num_params() + workload.target.num_params() > 2e8 or \
        workload.cache_bytes() > CHECK_CACHE_BYTES
    if too_large and not torch.cuda.is_available():
        out.print("rounds: skipped (models or KV caches too large for this CPU; run it where a GPU is)")
        return
    device = "cuda" if torch.cuda.is_available() else "cpu"
    draft, target = workload.weights(Model.DRAFT, device), workload.weights(Model.TARGET, device)
    inputs = round_inputs(workload, draft, target)
    ref = reference_round(draft, target, inputs)
    out.print(f"reference round on {device}: draft tokens {ref.draft_tokens.tolist()}, "
              f"target tokens {ref.target_tokens.tolist()}")
    where = "GPU" if device == "cuda" else "Triton interpreter"
    with out.status(Text(f"compiling and running {plan.name!r} ({where})")):
        compiled = compile_round(plan, workload, draft, target)
        report = checked_run(compiled, inputs, ReferenceChecker(draft, target, inputs, workload.dtype))
    verdict = "equals the reference round" if report.ok else "DIFFERS from the reference: " + "; ".join(report.problems)
    out.print(f"compiled round of {plan.name!r} ({len(compiled.launches)} launches, kernels in "
              f"{compiled.source_dir}): {verdict}")
    if not report.ok:
        raise SystemExit(1)


def add_command(sub) -> None:
    check = sub.add_parser("check", help="validate and expand the shipped plans on a workload; run the reference "
                                         "round and a plan's compiled round and compare them")
    check.add_argument("workload", nargs="?", type=workload_name_or_file, default=str(DEFAULT_WORKLOAD),
                       help=f"{WORKLOAD_HELP} (default: the tiny CPU one)")
    check.add_argument("--plan", default="interleave", help="the plan to print and run (default: interleave)")
    check.add_argument("--limit", type=integer(1, MAX_LIMIT), default=40, help="launches to print (default: 40)")
    check.set_defaults(func=cmd_check)
