"""`conjugate plan validate|explain|compile|upgrade`: a plan checked, expanded and lowered on a workload;
older plan files rewritten in the current format."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.table import Table

from conjugate.cli.arguments import PLAN_HELP, WORKLOAD_HELP, plan_name_or_file, workload_name_or_file
from conjugate.cli.console import human_bytes, out
from conjugate.files import check_output, write_output
from conjugate.plan.launch import Step, Streamed


def _load(plan_path: str, workload_path: str):
    from conjugate.plan import expand, load_plan
    from conjugate.workload import load_workload

    workload = load_workload(workload_path)
    plan = load_plan(plan_path)
    return plan, workload, expand(plan, workload)


def cmd_plan_validate(args: argparse.Namespace) -> None:
    plan, workload, schedule = _load(args.plan, args.workload)
    s = schedule.summary()
    out.print(f"ok: {args.plan}: plan {plan.name!r} ({plan.hash[:12]}) on {workload.name}: "
              f"{s['launches']} launches, {s['cross_model']} cross-model, {human_bytes(s['bytes'])}")
    for warning in schedule.warnings:
        out.print(f"warning: {warning}")


def _tile_as_run(part) -> str:
    """A part's tile keys, short; a qkv fused with rope_kv runs whole heads whatever its BLOCK_N says."""
    whole_heads = {"qkv", "rope_kv"} <= set(part.fused)
    return ",".join("N=head" if whole_heads and k == "BLOCK_N" else f"{k.replace('BLOCK_', '')}{v}"
                    for k, v in part.tiles.items())


def schedule_table(schedule, title: str, limit: int | None = None) -> Table:
    table = Table(title=title)
    for col in ("#", "stream", "parts", "op ids", "tiles", "bytes"):
        table.add_column(col, justify="right" if col in ("#", "bytes") else "left")
    launches = schedule.launches if limit is None else schedule.launches[:limit]
    limits = dict(schedule.sm_limits)
    for launch in launches:
        if isinstance(launch.form, Step):  # hundreds of ops: named by their kind and their ends
            part = launch.parts[0]
            table.add_row(str(launch.index), launch.stream, "d:step (the draft's k decode steps, one launch)",
                          f"{len(part.ops)} ops: {part.ops[0]} .. {part.ops[-1]}", "", human_bytes(launch.bytes))
            continue
        if isinstance(launch.form, Streamed):  # the streamed kernel: no tile of the plan's
            part = launch.parts[0]
            pdl = f"  [pdl: release at {launch.pdl}]" if launch.pdl != "none" else ""
            table.add_row(str(launch.index), launch.stream, f"{part.model[0]}:{part.kind} (streamed kernel){pdl}",
                          part.ops[0], "", human_bytes(launch.bytes))
            continue
        parts = " | ".join(f"{p.model[0]}:{'+'.join(p.fused)}" for p in launch.parts)
        if launch.cross_model:
            form = launch.form
            parts += f"  [{form.pattern}{'' if form.pattern != 'ratio' else ' %d:%d' % form.ratio}]"
        if launch.pdl != "none":
            parts += f"  [pdl: release at {launch.pdl}]"
        tiles = " | ".join(_tile_as_run(p) for p in launch.parts)
        stream = f"{launch.stream} ({limits[launch.stream]} SMs)" if launch.stream in limits else launch.stream
        table.add_row(str(launch.index), stream, parts, "\n".join(" + ".join(p.ops) for p in launch.parts),
                      tiles, human_bytes(launch.bytes))
    return table


def cmd_plan_explain(args: argparse.Namespace) -> None:
    check_output("--json", args.json, [args.plan, args.workload])
    plan, workload, schedule = _load(args.plan, args.workload)
    if args.json:
        write_output(args.json, json.dumps(schedule.to_dict(), indent=1) + "\n")
    s = schedule.summary()
    out.print(schedule_table(schedule, f"{plan.name} on {workload.name}: {s['launches']} launches, "
                                        f"{s['cross_model']} cross-model, {human_bytes(s['bytes'])}"))
    for warning in schedule.warnings:
        out.print(f"warning: {warning}")


def cmd_plan_compile(args: argparse.Namespace) -> None:
    """Lower a plan on shape-only (meta) weights and write the generated kernel sources."""
    import shutil
    import tempfile

    from conjugate.compiler.round import compile_round
    from conjugate.models.weights import meta_weights

    check_output("--out", args.out, [args.plan, args.workload], files=["manifest.json"])  # kernels: k_<digest>.py
    plan, workload, schedule = _load(args.plan, args.workload)
    out_dir = Path(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        compiled = compile_round(plan, workload, meta_weights(workload.draft, workload.torch_dtype),
                                 meta_weights(workload.target, workload.torch_dtype), cache_dir=Path(tmp),
                                 schedule=schedule)
        out_dir.mkdir(parents=True, exist_ok=True)
        for file in compiled.source_dir.iterdir():
            shutil.copy(file, out_dir / file.name)
    kernels = len({launch.digest for launch in compiled.launches})
    out.print(f"{plan.name} on {workload.name}: {len(compiled.launches)} launches, {kernels} distinct kernels "
              f"written to {out_dir} (manifest.json maps launches to kernel files)")


def cmd_plan_upgrade(args: argparse.Namespace) -> None:
    from conjugate.plan.rewrite import upgrade_files

    paths = [Path(p) for p in args.plans]
    check_output("--out", args.out, args.plans, files=[p.name for p in paths])
    for path, written in upgrade_files(paths, None if args.in_place else Path(args.out)):
        out.print(f"{path}: already v2, left as it is" if written is None else f"{path} -> {written}")


def _add_upgrade(actions) -> None:
    upgrade = actions.add_parser("upgrade", help="rewrite conjugate.plan/1 files as conjugate.plan/2")
    upgrade.add_argument("plans", nargs="+", metavar="PLAN", help="plan JSON files")
    where = upgrade.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", help="directory to write the upgraded plans into, under their own names")
    where.add_argument("--in-place", action="store_true", help="rewrite each file where it is")
    upgrade.set_defaults(func=cmd_plan_upgrade)


def add_command(sub) -> None:
    plans = sub.add_parser("plan", help="work with cross-model plans")
    actions = plans.add_subparsers(dest="plan_command", required=True, metavar="ACTION")
    for name, func, text in (("validate", cmd_plan_validate, "validate a plan and expand it on a workload"),
                             ("explain", cmd_plan_explain, "print a plan's expanded launches"),
                             ("compile", cmd_plan_compile, "lower a plan and write its generated Triton kernels")):
        action = actions.add_parser(name, help=text)
        action.add_argument("plan", type=plan_name_or_file, help=PLAN_HELP)
        action.add_argument("--workload", required=True, type=workload_name_or_file, help=WORKLOAD_HELP)
        if name == "explain":
            action.add_argument("--json", help="also write the schedule as JSON to this file")
        if name == "compile":
            action.add_argument("--out", required=True, help="directory for the kernel sources")
        action.set_defaults(func=func)
    _add_upgrade(actions)
