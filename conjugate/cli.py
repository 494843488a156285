"""`conjugate ...`: the command-line entry point. Bad input ends in one line on stderr and exit 2."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from conjugate.arguments import positive
from conjugate.errors import ConjugateError, PlanError
from conjugate.files import check_output, write_output
from conjugate.paths import DEFAULT_WORKLOAD, EXAMPLES_DIR, PLANS_DIR, SEED_PLANS, plan_path, shipped_plan
from conjugate.secrets import scrub

if TYPE_CHECKING:
    from conjugate.evaluate.result import EvalResult

PLAN_DIR = PLANS_DIR
# no markup: names and paths from files, flags and stores are printed as they are (a "[/]" in one is text)
out = Console(highlight=False, markup=False, width=None if sys.stdout.isatty() else 160)


def _human_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def cmd_models(args: argparse.Namespace) -> None:
    from conjugate.models import PRESETS

    table = Table(title="Model presets")
    for col in ("name", "family", "params", "hidden", "layers", "heads/kv", "head dim", "ffn", "vocab", "features"):
        table.add_column(col, justify="left" if col in ("name", "family", "features") else "right")
    for spec in PRESETS.values():
        features = [f for f, on in (("qkv-bias", spec.qkv_bias), ("qk-norm", spec.qk_norm),
                                    ("llama3-rope", spec.rope_scaling), ("tied", spec.tied_embeddings)) if on]
        table.add_row(spec.name, spec.family, f"{spec.num_params() / 1e9:.2f}B" if spec.num_params() > 1e8
                      else f"{spec.num_params() / 1e6:.2f}M", str(spec.hidden_size), str(spec.num_layers),
                      f"{spec.num_heads}/{spec.num_kv_heads}", str(spec.head_dim), str(spec.ffn_size),
                      str(spec.vocab_size), " ".join(features))
    out.print(table)


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
              f"{s['launches']} launches, {s['cross_model']} cross-model, {_human_bytes(s['bytes'])}")
    for warning in schedule.warnings:
        out.print(f"warning: {warning}")


def _schedule_table(schedule, title: str, limit: int | None = None) -> Table:
    table = Table(title=title)
    for col in ("#", "stream", "parts", "op ids", "tiles", "bytes"):
        table.add_column(col, justify="right" if col in ("#", "bytes") else "left")
    launches = schedule.launches if limit is None else schedule.launches[:limit]
    limits = dict(schedule.sm_limits)
    for launch in launches:
        parts = " | ".join(f"{p.model[0]}:{'+'.join(p.fused)}" for p in launch.parts)
        if launch.cross_model:
            parts += f"  [{launch.pattern}{'' if launch.pattern != 'ratio' else ' %d:%d' % launch.ratio}]"
        if launch.tickets:
            grid = f"{launch.programs} programs taking tickets" if launch.programs else "one program per tile"
            parts += f"  [tickets: {grid}, each tile after the part before{', preload' if launch.preload else ''}]"
        elif launch.persistent:
            grid = f"{launch.programs} programs" if launch.programs else "all programs that fit at once"
            parts += (f"  [persistent: {grid}, parts in sequence{', preload' if launch.preload else ''}]"
                      if len(launch.parts) > 1 else f"  [tile loop: {grid}]")
        if launch.pdl != "none":
            parts += (f"  [pdl: release at {launch.pdl}{', prefetch' if launch.pdl_prefetch else ''}"
                      f"{', preload' if launch.pdl_preload else ''}]")
        tiles = " | ".join(",".join(f"{k.replace('BLOCK_', '')}{v}" for k, v in p.tiles.items()) for p in launch.parts)
        stream = f"{launch.stream} ({limits[launch.stream]} SMs)" if launch.stream in limits else launch.stream
        table.add_row(str(launch.index), stream, parts, "\n".join(" + ".join(p.ops) for p in launch.parts),
                      tiles, _human_bytes(launch.bytes))
    return table


def cmd_plan_explain(args: argparse.Namespace) -> None:
    check_output("--json", args.json, [args.plan, args.workload])
    plan, workload, schedule = _load(args.plan, args.workload)
    if args.json:
        write_output(args.json, json.dumps(schedule.to_dict(), indent=1) + "\n")
    s = schedule.summary()
    out.print(_schedule_table(schedule, f"{plan.name} on {workload.name}: {s['launches']} launches, "
                                        f"{s['cross_model']} cross-model, {_human_bytes(s['bytes'])}"))
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
    for path in sorted(PLAN_DIR.glob("*.json")):
        if path.name.endswith(".schema.json"):
            continue
        plan = load_plan(path)
        schedules[plan.name] = schedule = expand(plan, workload)
        s = schedule.summary()
        table.add_row(plan.name, plan.hash[:12], str(s["launches"]), str(s["cross_model"]), _human_bytes(s["bytes"]), "valid")
    out.print(table)
    if args.plan not in schedules:
        raise PlanError(f"--plan: no shipped plan named {args.plan!r}; shipped: {', '.join(schedules)}")
    shown = args.plan
    out.print(_schedule_table(schedules[shown], f"Expanded schedule of {shown!r}", limit=args.limit))
    if len(schedules[shown].launches) > args.limit:
        out.print(f"... {len(schedules[shown].launches) - args.limit} more launches (conjugate plan explain)")
    _run_rounds(workload, load_plan(PLAN_DIR / f"{shown}.json"))


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


BASELINES = ("conventional", "sequential", "streams")
_STAGE_TEXT = {"setup": "preparing the workload (and, first, measuring the baselines)", "validate": "validating",
               "compile": "compiling", "correctness": "checking against the reference", "timing": "timing"}


def cmd_bench(args: argparse.Namespace) -> int:
    """Evaluate plans on a workload beside the baselines; print a table, optionally write JSON."""
    import torch

    from conjugate.evaluate.evaluators import ProfileError, load_profile
    from conjugate.evaluate.worker import IsolatedEvaluator
    from conjugate.plan import load_plan
    from conjugate.workload import load_workload

    workload = load_workload(args.workload)
    profile = load_profile(args.evaluator)
    paths = [plan_path(p) for p in args.plan] if args.plan else [shipped_plan(n) for n in SEED_PLANS]
    check_output("--json", args.json, [args.workload, profile.source, *paths])
    if profile.kind == "gpu" and not torch.cuda.is_available():  # every row would fail alike
        raise ProfileError(f"{profile.source}: kind 'gpu' measures on a GPU and this machine has no CUDA device; "
                           "use --evaluator analytical")
    plans = [(_bench_label(path, plan), plan) for path, plan in ((path, load_plan(path)) for path in paths)]
    rows = []
    with IsolatedEvaluator(profile) as isolated:  # a crash or a hang costs one result, not the run
        for i, (label, plan) in enumerate(plans):
            head = f"{profile.name}: {label} on {workload.name} ({i + 1}/{len(plans)})"
            with out.status(Text(f"{head}: starting")) as status:
                result = isolated.evaluate(plan.to_dict(), args.workload, refresh_baselines=args.remeasure and i == 0,
                                           on_stage=lambda stage: status.update(Text(f"{head}: {_STAGE_TEXT[stage]}")))
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


def cmd_calibrate(args: argparse.Namespace) -> None:
    """Fit the analytical evaluator's constants to measured rounds (a compiler_rounds result file)."""
    import tempfile

    from conjugate.evaluate.calibrate import fit, loss, make_case, measured_rounds, profile_text
    from conjugate.evaluate.evaluators import ProfileError, load_profile
    from conjugate.plan import load_plan
    from conjugate.workload import load_workload

    check_output("--out", args.out, [args.measured])  # over the starting profile: what no --out does
    profile = load_profile(args.evaluator)
    if profile.model is None:
        raise ProfileError(f"--evaluator: profile {profile.name!r} ({profile.source}) is of kind {profile.kind} and "
                           "has no [model] table; calibrate fits an analytical profile's constants")
    source = Path(args.measured)
    rows = measured_rounds(source)
    cases = []
    with tempfile.TemporaryDirectory() as tmp, out.status(Text(f"lowering {len(rows)} measured rounds")):
        for workload, plan, ms in rows:
            cases.append(make_case(load_plan(PLAN_DIR / f"{plan}.json"),
                                   load_workload(EXAMPLES_DIR / f"{workload}.toml"), ms, Path(tmp)))
    before = loss(profile.model, cases)
    with out.status(Text("fitting")):
        fitted = fit(profile.model, cases)
    after = loss(fitted, cases)
    target = Path(args.out) if args.out else Path(profile.source)
    target.write_text(profile_text(fitted, str(source), after, profile.max_check_params))
    out.print(f"fitted {len(cases)} rounds: mean squared log error {before:.4f} -> {after:.4f}; wrote {target}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="conjugate", description="Compile the draft and target models of "
                                     "speculative decoding together.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    check = sub.add_parser("check", help="validate and expand the shipped plans on a workload; run the reference "
                                         "round and a plan's compiled round and compare them")
    check.add_argument("workload", nargs="?", default=str(DEFAULT_WORKLOAD), help="workload TOML (default: the tiny CPU one)")
    check.add_argument("--plan", default="interleave", help="the plan to print and run (default: interleave)")
    check.add_argument("--limit", type=positive, default=40, help="launches to print (default: 40)")
    check.set_defaults(func=cmd_check)
    sub.add_parser("models", help="list the model presets").set_defaults(func=cmd_models)
    bench = sub.add_parser("bench", help="evaluate plans on a workload beside the baselines")
    bench.add_argument("workload", help="workload TOML file")
    bench.add_argument("--plan", action="append",
                       help="a plan JSON file or a shipped plan by name (repeatable; default: the shipped plans)")
    bench.add_argument("--evaluator", default="analytical", help="evaluator profile name or TOML path "
                       "(default: analytical)")
    bench.add_argument("--json", help="also write the results as JSON to this file")
    bench.add_argument("--remeasure", action="store_true", help="measure the baselines again (GPU evaluators "
                       "measure them once per workload in a worker process)")
    bench.set_defaults(func=cmd_bench)
    calibrate = sub.add_parser("calibrate", help="fit the analytical evaluator to measured rounds")
    calibrate.add_argument("--from", dest="measured", required=True,
                           help="a measured-rounds JSON (benchmarks/compiler_rounds.py --json)")
    calibrate.add_argument("--evaluator", default="analytical", help="the profile to start from (default: analytical)")
    calibrate.add_argument("--out", help="where to write the fitted profile (default: over the starting one)")
    calibrate.set_defaults(func=cmd_calibrate)
    plan = sub.add_parser("plan", help="work with cross-model plans").add_subparsers(dest="plan_command", required=True,
                                                                                      metavar="ACTION")
    for name, func, text in (("validate", cmd_plan_validate, "validate a plan and expand it on a workload"),
                             ("explain", cmd_plan_explain, "print a plan's expanded launches"),
                             ("compile", cmd_plan_compile, "lower a plan and write its generated Triton kernels")):
        action = plan.add_parser(name, help=text)
        action.add_argument("plan", help="plan JSON file")
        action.add_argument("--workload", required=True, help="workload TOML file")
        if name == "explain":
            action.add_argument("--json", help="also write the schedule as JSON to this file")
        if name == "compile":
            action.add_argument("--out", required=True, help="directory for the kernel sources")
        action.set_defaults(func=func)
    from conjugate.evaluate.ledger_command import add_command as add_profile_command
    from conjugate.search.commands import add_commands
    from conjugate.serving.command import add_command
    add_commands(sub, out)
    add_command(sub, out)
    add_profile_command(sub, out)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status = args.func(args)
    except ConjugateError as e:
        print(f"error: {scrub(str(e))}", file=sys.stderr)
        return 2
    except OSError as e:  # writing outputs: a path that is not a directory, no permission, a full disk
        why = e.strerror or str(e)
        if isinstance(e, FileExistsError) and e.filename and not Path(e.filename).is_dir():
            why = "a file where a folder is needed"  # mkdir over a file, or a file as a parent folder
        print(f"error: {e.filename or ''}: {why}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return status or 0


if __name__ == "__main__":
    sys.exit(main())
