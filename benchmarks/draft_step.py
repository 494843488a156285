"""The draft's phase as one launch per op or as one step launch (plan `draft.form: step`), per workload:
each round checked against the fp32 reference first, then the draft phase alone timed as a CUDA graph,
against its byte floor.

    python benchmarks/draft_step.py examples/qwen3-06b-8b-b4.toml examples/llama-1b-8b-b8.toml \
        --json benchmarks/results/draft_step_h100.json        # a Hopper GPU

Both forms run the `sequential` plan's target launches; the step plan is plans/step.json. Sequence
lengths are ragged (`--equal` for all at the context). Per workload the JSON holds #48's fields
(workload, draft, batch, k, floor_ms, launches_ms, step_kernel_ms, plan) with both checks and the
step launch's in-kernel ledger (per op: the mean per program of the time waiting on other programs,
split at the last producer's end into producers and handoff, and of the time working, split into
staging, the product and the finish; and how far ahead the loader issued a task's weights).
`analytical_step_efficiency`: the analytical evaluator's `step` efficiency that gives each
workload's measured step/launches ratio (geometric mean), as evaluators/analytical.toml sets it.
"""
from __future__ import annotations

import math
import tempfile
from pathlib import Path

from common import environment, make_parser, require_gpu, round_case, write_json

import torch  # noqa: E402

from conjugate.compiler.feedback import CompileError  # noqa: E402
from conjugate.compiler.round import compile_round  # noqa: E402
from conjugate.compiler.step.compiled import CompiledStep  # noqa: E402
from conjugate.evaluate.analytical import AnalyticalModel, launch_programs, part_costs  # noqa: E402
from conjugate.evaluate.calibrate import meta_weights  # noqa: E402
from conjugate.evaluate.evaluators import load_profile  # noqa: E402
from conjugate.evaluate.rounds import checked_run  # noqa: E402
from conjugate.evaluate.timing import capture, copy_bandwidth_gbs, time_replays  # noqa: E402
from conjugate.graph import build_graph  # noqa: E402
from conjugate.paths import shipped_plan  # noqa: E402
from conjugate.plan import load_plan  # noqa: E402
from conjugate.roles import Model  # noqa: E402
from conjugate.workload import load_workload  # noqa: E402

FORMS = {"launches": "sequential", "step": "step"}  # form -> the shipped plan that runs it


def draft_bytes(graph) -> int:
    return sum(graph.nodes[op]["op"].bytes for op in graph.graph["order"][Model.DRAFT])


def measure(path: Path, args, copy_gbs: float) -> dict:
    case = round_case(path, torch.device("cuda"), ragged=not args.equal)
    wl, draft, target, inputs, graph, check = (case.workload, case.draft, case.target, case.inputs, case.graph,
                                               case.check)
    device = torch.device("cuda")
    floor_ms = case.draft_floor_ms(copy_gbs)
    row = {"workload": wl.name, "path": str(path), "draft": wl.draft.name, "batch": wl.draft_batch, "k": wl.k,
           "context": wl.context, "ragged": not args.equal, "floor_ms": floor_ms, "plan": f"plans/{FORMS['step']}.json", "checks": {}}
    for form, plan_name in FORMS.items():
        try:
            compiled = compile_round(load_plan(shipped_plan(plan_name)), wl, draft, target, graph=graph)
            compiled.warmup()
        except CompileError as e:  # a form this workload cannot take (the step kernel: batches up to 32)
            row["checks"][form] = {"ok": False, "problems": [str(e)]}
            print(f"{wl.name} {form}: {e}", flush=True)
            continue
        report = checked_run(compiled, inputs, check)
        step = next((l for l in compiled.launches if isinstance(l, CompiledStep)), None)
        spins = step.spins_ran_out() if step else 0
        row["checks"][form] = report.to_dict() | {"spins_ran_out": spins}
        print(f"{wl.name} {form}: check {'ok' if report.ok and not spins else 'FAILED'} {report.problems[:3]}",
              flush=True)
        if not report.ok or spins:
            continue
        compiled.load(inputs)
        phase = capture(compiled.phase(Model.DRAFT), device)
        ms = time_replays(phase.replay, args.replays, warmup=20).median_ms
        row["launches_ms" if form == "launches" else "step_kernel_ms"] = ms
        print(f"{wl.name} {form}: draft phase {ms:.3f} ms, {ms / floor_ms:.2f}x its floor {floor_ms:.3f} ms", flush=True)
        if step is not None:
            row["resources"] = step.resources.to_dict()
            row["ledger"] = led = step.ledger()
            per_stage = {key: sum(o[key] for o in led["ops"].values()) / led["stages"]
                         for key in ("wait_us", "producers_us", "handoff_us")}
            print(f"{wl.name} step ledger, a stage: {per_stage['wait_us']:.2f} us waited "
                  f"({per_stage['producers_us']:.2f} on producers, {per_stage['handoff_us']:.2f} handoff)", flush=True)
            for op, v in led["ops"].items():
                if "stage_us" in v:  # a program's means over the launch: staging, product, finish; loader lead
                    print(f"    {op:<8} work {v['work_us']:7.0f} us = stage {v['stage_us']:6.0f} + product "
                          f"{v['multiply_us']:6.0f} + arrive {v['arrive_us']:6.0f} + epilogue {v['epilogue_us']:6.0f}"
                          + (f"; first tile issued {v['lead_us']:6.2f} us before the waits were met"
                             if "lead_us" in v else ""), flush=True)
        del compiled, phase
        torch.cuda.empty_cache()
    return row


def step_efficiency(rows: list[dict]) -> float | None:
    """The analytical `step` efficiency under which the model's step launch takes each workload's
    measured step/launches share of the model's sequential draft launches (geometric mean)."""
    model = AnalyticalModel(load_profile("analytical").model)
    effs = []
    for row in rows:
        if "launches_ms" not in row or "step_kernel_ms" not in row:
            continue
        wl = load_workload(Path(row["path"]))
        graph = build_graph(wl)
        compiled = compile_round(load_plan(shipped_plan("sequential")), wl, meta_weights(wl.draft, wl.torch_dtype),
                                 meta_weights(wl.target, wl.torch_dtype), cache_dir=Path(tempfile.mkdtemp()),
                                 graph=graph)
        modeled = sum(model.launch_us(part_costs(graph, launch, programs))
                      for launch, programs in zip(compiled.schedule.launches, launch_programs(compiled))
                      if launch.parts[0].model == Model.DRAFT)
        wanted_us = modeled * row["step_kernel_ms"] / row["launches_ms"] - model.c.launch_overhead_us
        effs.append(draft_bytes(graph) / (model.c.bandwidth_gbs * 1e3 * wanted_us))
    return math.exp(sum(map(math.log, effs)) / len(effs)) if effs else None


def main() -> int:
    parser = make_parser(__doc__)
    parser.add_argument("workloads", nargs="+", type=Path)
    parser.add_argument("--replays", type=int, default=100)
    parser.add_argument("--equal", action="store_true", help="every sequence at the context length")
    args = parser.parse_args()
    require_gpu(parser)
    copy_gbs = copy_bandwidth_gbs(torch.device("cuda"))
    out = environment("draft_step") | {"copy_gbs": copy_gbs, "phases": []}
    for path in args.workloads:
        out["phases"].append(measure(path, args, copy_gbs))
        write_json(args.json, out)
    out["analytical_step_efficiency"] = step_efficiency(out["phases"])
    write_json(args.json, out)
    print(f"{'workload':<22} {'floor':>7} {'launches':>9} {'step':>7} {'speedup':>8}")
    for r in out["phases"]:
        l, s = r.get("launches_ms"), r.get("step_kernel_ms")
        print(f"{r['workload']:<22} {r['floor_ms']:7.3f} {l or float('nan'):9.3f} {s or float('nan'):7.3f} "
              f"{(l / s) if l and s else float('nan'):8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
