"""`conjugate profile`: where a plan's round spends its time on this GPU (ledger.py), as a table."""
from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table
from rich.text import Text

from conjugate.arguments import positive
from conjugate.errors import ConjugateError
from conjugate.files import check_output, write_output


def add_command(sub, out: Console) -> None:
    cmd = sub.add_parser("profile", help="where a plan's round spends its time on the GPU: per op kind and stream, "
                                         "against the bandwidth floor")
    cmd.add_argument("workload", help="workload TOML file")
    cmd.add_argument("--plan", default="streams", help="plan name (plans/) or JSON file (default: streams)")
    cmd.add_argument("--replays", type=positive, default=5, help="round replays recorded (default: 5; the median "
                                                                 "one is reported)")
    cmd.add_argument("--json", help="also write the whole ledger (every launch) as JSON to this file")
    cmd.set_defaults(func=lambda args: cmd_profile(args, out))


def cmd_profile(args: argparse.Namespace, out: Console) -> None:
    import torch

    from conjugate.paths import plan_path

    check_output("--json", args.json, [args.workload, plan_path(args.plan)])
    if not torch.cuda.is_available():
        raise ConjugateError("conjugate profile measures on a GPU and this machine has no CUDA device")
    from conjugate.plan import load_plan
    from conjugate.workload import load_workload

    workload, plan = load_workload(args.workload), load_plan(plan_path(args.plan))
    with out.status(Text(f"compiling and checking {plan.name!r} on {workload.name}")):
        ledger = measure_ledger(plan, workload, args.replays)
    out.print(_table(ledger))
    out.print(ledger.summary(), markup=False)
    if args.json:
        write_output(args.json, json.dumps({"workload": workload.name, "plan": plan.name,
                                               "ledger": ledger.to_dict()}, indent=1) + "\n")


def measure_ledger(plan, workload, replays: int):
    """The plan's round on this GPU: compiled, checked against the reference (a wrong round is not
    profiled), captured in its CUDA graph, its kernels recorded over `replays` replays."""
    import torch

    from conjugate.compiler.round import compile_round
    from conjugate.evaluate.correctness import ReferenceChecker, tolerance_for
    from conjugate.evaluate.ledger import Ledger, kernel_records
    from conjugate.evaluate.evaluators import load_profile
    from conjugate.evaluate.rounds import checked_run, round_inputs
    from conjugate.evaluate.timing import copy_bandwidth_gbs
    from conjugate.graph import build_graph
    from conjugate.roles import Model

    device = torch.device("cuda")
    draft, target = workload.weights(Model.DRAFT, device), workload.weights(Model.TARGET, device)
    inputs = round_inputs(workload, draft, target)
    tolerances = load_profile("h200").tolerances  # the measured evaluator's: a round it would accept
    check = ReferenceChecker(draft, target, inputs, workload.dtype, tolerance_for(workload.dtype, tolerances))
    compiled = compile_round(plan, workload, draft, target)
    compiled.load(inputs)
    compiled.warmup()
    report = checked_run(compiled, inputs, check)
    if report.ok:
        compiled.capture()
        report = checked_run(compiled, inputs, check, graph=True)
    if not report.ok:
        raise ConjugateError(f"plan {plan.name!r} computes a wrong round on {workload.name}: "
                             + "; ".join(report.problems[:3]))
    compiled.load(round_inputs(workload, draft, target, workload.seed + 1))
    return Ledger.of(compiled, build_graph(workload), kernel_records(compiled.run, device, replays),
                     copy_bandwidth_gbs(device))


def _table(ledger) -> Table:
    table = Table(title=f"round {ledger.round_us / 1e3:.3f} ms, floor {ledger.floor_us / 1e3:.3f} ms, "
                        f"GPU idle {ledger.idle_us / 1e3:.3f} ms")
    for column in ("op kind", "launches", "ms", "share", "GB/s", "of copy bw", "ms over its floor"):
        table.add_column(column, justify="left" if column == "op kind" else "right")
    for k in ledger.kinds:
        table.add_row(k.kind, str(k.launches), f"{k.us / 1e3:.3f}", f"{k.us / ledger.round_us:.0%}",
                      f"{k.bytes / (k.us * 1e-6) / 1e9:.0f}" if k.us else "-", f"{k.bandwidth_fraction:.0%}",
                      f"{(k.us - k.floor_us) / 1e3:.3f}")
    return table
