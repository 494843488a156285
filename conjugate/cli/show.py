"""`conjugate show` and `conjugate export`: a search database's runs, best plans and failures, and a
run's export (best plan, kernels, report, plot, reproduce.sh)."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from conjugate.cli.arguments import positive, run_id, workload_name_or_file
from conjugate.cli.console import out
from conjugate.errors import ConjugateError
from conjugate.files import check_output
from conjugate.search.databases import database_file, open_store
from conjugate.text import visible

if TYPE_CHECKING:
    from conjugate.workload import Workload

MOVED_WORKLOAD_HELP = "the run's workload file (or shipped workload name), where the database moved away from it"


def cmd_show(args: argparse.Namespace, out: Console) -> None:
    with open_store(args.db) as store:
        runs = store.runs()
        if not runs:
            raise ConjugateError(f"{args.db}: holds no run")
        table = Table(title=f"runs in {store.url_for_display}")
        for col in ("run", "name", "workload", "evaluator", "agent", "seed", "status", "nodes", "created"):
            table.add_column(col)
        for r in runs:
            table.add_row(str(r.id), r.name, r.workload_name, r.evaluator, r.agent, str(r.seed), r.status,
                          str(len(store.nodes(r.id))), r.created_at.strftime("%Y-%m-%d %H:%M"))
        out.print(table)
        chosen = [store.run(args.run)] if args.run else runs[-1:]
        for run in chosen:
            show_run(store, run, out, limit=args.limit, workload_file=args.workload)


def show_run(store, run, out: Console, limit: int = 10, workload_file: str | None = None,
             workload: Workload | None = None) -> None:
    from conjugate.search.report import run_history
    from conjugate.search.runs import run_workload

    history = run_history(store, run, workload or run_workload(run, workload_file))
    ok = sorted((h for h in history if h["status"] == "ok"), key=lambda h: h["latency_ms"])
    table = Table(title=f"run {run.id}: best plans ({'modeled' if history and history[0]['modeled'] else 'measured'})")
    for col in ("node", "depth", "latency", *(f"vs {b}" for b in ("conventional", "sequential", "streams")),
                "visits", "edit"):
        table.add_column(col)
    for h in ok[:limit]:
        table.add_row(str(h["node"]), str(h["depth"]), f"{h['latency_ms']:.3f} ms",
                      *(f"{h['speedups'][b]:.3f}x" if b in h["speedups"] else "-"
                        for b in ("conventional", "sequential", "streams")),
                      str(h["visits"]), f"[{h['kind']}] {h['rationale'][:70]}")
    out.print(table)
    failed = [h for h in history if h["status"] not in ("ok", "pending")]
    out.print(f"{len(history)} nodes, {len(ok)} ok, {len(failed)} failed" +
              "".join(f"\n  node {h['node']}: {h['status']}: {visible(h['error'])[:120]}" for h in failed[-3:]))


def cmd_export(args: argparse.Namespace, out: Console) -> None:
    from conjugate.search.report import EXPORT_FILES, export_run

    with open_store(args.db) as store:
        run = store.run(args.run) if args.run else store.latest_run()
        if run is None:
            raise ConjugateError(f"{args.db}: holds no run to export")
        check_output("--out", args.out, [database_file(args.db), args.workload, run.workload_path or None],
                     EXPORT_FILES)
        written = export_run(store, run, Path(args.out), out, args.workload)
    out.print(f"exported run {run.id} to {args.out}: " + ", ".join(sorted(p.name for p in written)))


def add_commands(sub) -> None:
    show = sub.add_parser("show", help="runs of a search database, the best plans, failures")
    show.add_argument("db", help="SQLAlchemy URL or SQLite file")
    show.add_argument("--run", type=run_id, help="the run to detail (default: the latest)")
    show.add_argument("--limit", type=positive, default=10, help="best plans listed (default: 10)")
    show.add_argument("--workload", type=workload_name_or_file, help=MOVED_WORKLOAD_HELP)
    show.set_defaults(func=lambda a: cmd_show(a, out))
    export = sub.add_parser("export", help="write a run's best plan, its kernels, a report and a plot")
    export.add_argument("db", help="SQLAlchemy URL or SQLite file")
    export.add_argument("--out", required=True, help="directory to write into")
    export.add_argument("--run", type=run_id, help="the run to export (default: the latest)")
    export.add_argument("--workload", type=workload_name_or_file,
                        help=MOVED_WORKLOAD_HELP + " (default: the file the run was started with, else the workload "
                             "the run stored)")
    export.set_defaults(func=lambda a: cmd_export(a, out))
