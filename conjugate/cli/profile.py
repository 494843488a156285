"""`conjugate profile`: where a plan's round spends its time on this GPU (ledger.py), as a table."""
from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table
from rich.text import Text

from conjugate.cli.arguments import PLAN_HELP, WORKLOAD_HELP, integer, plan_name_or_file, workload_name_or_file
from conjugate.cli.console import out
from conjugate.errors import ConjugateError
from conjugate.files import check_output, write_output

MAX_REPLAYS = 1000  # the profiles' own bound on ledger replays


def add_command(sub) -> None:
    cmd = sub.add_parser("profile", help="where a plan's round spends its time on the GPU: per op kind and stream, "
                                         "against the bandwidth floor")
    cmd.add_argument("workload", type=workload_name_or_file, help=WORKLOAD_HELP)
    cmd.add_argument("--plan", type=plan_name_or_file, default="streams", help=f"{PLAN_HELP} (default: streams)")
    cmd.add_argument("--replays", type=integer(1, MAX_REPLAYS), default=5,
                     help="round replays recorded (default: 5; the median one is reported)")
    cmd.add_argument("--json", help="also write the whole ledger (every launch) as JSON to this file")
    cmd.set_defaults(func=lambda args: cmd_profile(args, out))


def cmd_profile(args: argparse.Namespace, out: Console) -> None:
    import torch

    from conjugate.paths import plan_path

    check_output("--json", args.json, [args.workload, plan_path(args.plan)])
    if not torch.cuda.is_available():
        raise ConjugateError("conjugate profile measures on a GPU and this machine has no CUDA device")
    from conjugate.evaluate.round_ledger import measure_ledger
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
