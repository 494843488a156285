"""The step launch on part of the GPU: does the draft's step kernel need every SM, and does it win
beside the target's stream when it holds only some?

    python lab/step_share/share.py examples/qwen3-06b-8b-b4.toml examples/llama-1b-8b-b8.toml --json OUT.json

Per workload, two parts, every round checked against the fp32 reference (and for no spent spins)
before it is timed:

* **alone**: `plans/step.json` (sequential) with the step kernel's programs forced to P (the product
  takes every SM in a one-stream plan); the draft phase alone, as a CUDA graph, and the kernel's ledger.
* **co-located**: the whole round, as a CUDA graph, for the `streams` plan (or `--base PLAN`) and
  the same plan with `draft.form: "step"` and the draft's stream on P SMs (a green context; the
  target keeps every SM). The schema takes such a plan (the step form needs the sequential
  alignment, which two streams keep); the heuristic does not propose it (`form_step_two_streams`).

Lab code: it patches one module global of the package (the step launch's program count); nothing in
`conjugate/` imports it.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import environment, failure, round_case  # noqa: E402

import torch  # noqa: E402

from conjugate.compiler import round as round_module  # noqa: E402
from conjugate.compiler.round import compile_round  # noqa: E402
from conjugate.compiler.step.compiled import CompiledStep  # noqa: E402
from conjugate.evaluate.rounds import checked_run  # noqa: E402
from conjugate.evaluate.timing import capture, copy_bandwidth_gbs, time_replays, time_round  # noqa: E402
from conjugate.paths import shipped_plan  # noqa: E402
from conjugate.plan import load_plan  # noqa: E402
from conjugate.plan.schema import validate_plan  # noqa: E402
from conjugate.roles import Model  # noqa: E402

_PRODUCT_COMPILE_STEP = round_module._compile_step


def force_programs(programs: int | None) -> None:
    """The step launch's programs: `programs`, or (None) the product's own choice."""
    if programs is None:
        round_module._compile_step = _PRODUCT_COMPILE_STEP
    else:
        round_module._compile_step = lambda launch, bufs, limits: _PRODUCT_COMPILE_STEP(
            launch, bufs, ((Model.DRAFT.value, programs),))


def step_variant(base: dict, sms: int) -> dict:
    plan = json.loads(json.dumps(base))
    plan["name"] = f"{base.get('name', 'base')}-step-{sms}"
    plan["draft"]["form"] = "step"
    for model in ("draft", "target"):
        plan[model].setdefault("stream", {})["sms"] = 0
    plan["draft"]["stream"]["sms"] = sms
    for model in ("draft", "target"):  # a step draft has no launches to chain or pin
        plan[model].get("stream", {}).pop("priority", None)
    plan["draft"].pop("pdl", None)
    plan.get("cross", {}).pop("overrides", None)
    return plan


def checked(compiled, inputs, check) -> dict:
    report = checked_run(compiled, inputs, check)
    step = next((l for l in compiled.launches if isinstance(l, CompiledStep)), None)
    spins = step.spins_ran_out() if step else 0
    return {"ok": bool(report.ok and not spins), "problems": report.problems[:3], "spins_ran_out": spins}


def alone(wl, draft, target, inputs, check, graph, programs: int, replays: int) -> dict:
    force_programs(programs)
    row: dict = {"programs": programs}
    try:
        compiled = compile_round(load_plan(shipped_plan("step")), wl, draft, target, graph=graph)
        compiled.warmup()
        row["check"] = checked(compiled, inputs, check)
        if row["check"]["ok"]:
            compiled.load(inputs)
            phase = capture(compiled.phase(Model.DRAFT), torch.device("cuda"))
            row["ms"] = time_replays(phase.replay, replays, warmup=20).median_ms
            step = next(l for l in compiled.launches if isinstance(l, CompiledStep))
            row["ledger"] = step.ledger()
    except Exception as e:  # a variant that does not compile or run is a row, not the end of the run
        row["error"] = failure(e)
    finally:
        force_programs(None)
    return row


def co_located(name: str, plan_dict: dict, wl, draft, target, inputs, check, graph, replays: int) -> dict:
    row: dict = {"plan": name}
    try:
        compiled = compile_round(validate_plan(plan_dict, name), wl, draft, target, graph=graph)
        compiled.warmup()
        row["check"] = checked(compiled, inputs, check)
        if row["check"]["ok"]:
            compiled.prepare()
            row["round_ms"] = time_round(compiled.run, lambda: compiled.load(inputs), replays, 10).median_ms
    except Exception as e:
        row["error"] = failure(e)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="+", type=Path)
    parser.add_argument("--programs", type=int, nargs="+", default=[132, 96, 64, 40])
    parser.add_argument("--sms", type=int, nargs="+", default=[40, 64, 88, 104])
    parser.add_argument("--base", type=Path, help="the two-stream plan the co-located variants start from")
    parser.add_argument("--replays", type=int, default=100)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    device = torch.device("cuda")
    copy_gbs = copy_bandwidth_gbs(device)
    out = {**environment("share"), "command": "python " + " ".join(sys.argv), "copy_gbs": copy_gbs, "workloads": []}
    for path in args.workloads:
        case = round_case(path, device)
        wl, draft, target, inputs, graph, check = (case.workload, case.draft, case.target, case.inputs, case.graph,
                                                   case.check)
        floor_ms = case.draft_floor_ms(copy_gbs)
        entry = {"workload": wl.name, "draft_floor_ms": floor_ms, "alone": [], "co_located": []}
        out["workloads"].append(entry)
        for p in args.programs:
            row = alone(wl, draft, target, inputs, check, graph, p, args.replays)
            entry["alone"].append(row)
            args.json.write_text(json.dumps(out, indent=1))  # each row kept should the call run out of time
            print(f"{wl.name} alone P={p}: {row.get('ms', row.get('error') or row.get('check'))}", flush=True)
        base_path = args.base or shipped_plan("streams")
        base = json.loads(Path(base_path).read_text())
        variants = [(str(base_path), base)] + [(f"step on {s} SMs", step_variant(base, s)) for s in args.sms]
        for name, plan in variants:
            row = co_located(name, plan, wl, draft, target, inputs, check, graph, args.replays)
            entry["co_located"].append(row)
            args.json.write_text(json.dumps(out, indent=1))
            print(f"{wl.name} round {name}: {row.get('round_ms', row.get('error') or row.get('check'))}", flush=True)
            torch.cuda.empty_cache()
        args.json.write_text(json.dumps(out, indent=1))
        del draft, target, inputs, check, case
        torch.cuda.empty_cache()
    print(f"\n{'workload':<22} {'what':<26} {'ms':>8}")
    for e in out["workloads"]:
        for r in e["alone"]:
            print(f"{e['workload']:<22} {'draft alone P=' + str(r['programs']):<26} {r.get('ms', float('nan')):8.3f}")
        for r in e["co_located"]:
            print(f"{e['workload']:<22} {Path(r['plan']).name:<26} {r.get('round_ms', float('nan')):8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
