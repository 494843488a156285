"""The step form (`draft.form: step`) checked on a Hopper GPU across the families, batches and step
counts, nothing timed: the log #48 asks for.

    python benchmarks/step_checks.py --json benchmarks/results/step_checks_h100.json

Per draft model (a preset of each family, random weights) and per batch and k, a round of
`plans/step.json` is compiled with the model as its own target (one sequence verified, so the
target's part stays small), run on ragged lengths (context // 2 to context) and checked against the
fp32 reference round, and the step launch's waits are checked for spent spins. A batch the step
kernel cannot take is a row with the compiler's refusal. Rows are written as they finish.
`--launch mma_depth=1` checks the launch with those StepLaunch options instead of its defaults.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from common import environment, make_parser, positive, require_gpu, write_json

import torch  # noqa: E402

from conjugate.compiler.feedback import CompileError  # noqa: E402
from conjugate.compiler.round import compile_round  # noqa: E402
from conjugate.compiler.step.compiled import CompiledStep  # noqa: E402
from conjugate.compiler.step.launch import LAUNCH_OPTIONS  # noqa: E402
from conjugate.evaluate.correctness import ReferenceChecker  # noqa: E402
from conjugate.evaluate.rounds import checked_run  # noqa: E402
from conjugate.graph import build_graph  # noqa: E402
from conjugate.models.reference import make_round_inputs  # noqa: E402
from conjugate.paths import shipped_plan  # noqa: E402
from conjugate.plan import load_plan  # noqa: E402
from conjugate.roles import Model  # noqa: E402
from conjugate.workload import workload_from_dict  # noqa: E402

MODELS = ("llama-3.2-1b", "qwen2.5-0.5b", "qwen3-0.6b", "qwen2.5-1.5b")  # llama, qwen2 (64- and 128-dim heads), qwen3


def check_case(model: str, batch: int, k: int, context: int, weights, dtype: str = "bf16",
               options: dict | None = None) -> dict:
    wl = workload_from_dict({"name": f"{model}-b{batch}-k{k}", "draft": model, "target": model, "k": k,
                             "draft_batch": batch, "target_batch": 1, "context": context, "dtype": dtype},
                            Path("step_checks"))
    row = {"model": model, "family": wl.draft.family, "batch": batch, "k": k, "context": context}
    inputs = make_round_inputs(weights, weights, k=k, draft_batch=batch, target_batch=1, context=context,
                               seed=batch * 100 + k, ragged=True)
    try:
        compiled = compile_round(load_plan(shipped_plan("step")), wl, weights, weights, graph=build_graph(wl))
        if options:
            next(l for l in compiled.launches if isinstance(l, CompiledStep)).use_launch_options(**options)
        compiled.warmup()
    except CompileError as e:
        return row | {"ok": False, "refused": str(e)}
    report = checked_run(compiled, inputs, ReferenceChecker(weights, weights, inputs, wl.dtype))
    step = next(l for l in compiled.launches if isinstance(l, CompiledStep))
    spins = step.spins_ran_out()
    return row | {"ok": bool(report.ok and not spins), "spins_ran_out": spins, "problems": report.problems[:3],
                  "errors": report.errors, "programs": step.table.programs}


def launch_option(text: str) -> tuple[str, int]:
    """KEY=INT: one of StepLaunch's tuning options."""
    key, sep, value = text.partition("=")
    if not sep or key not in LAUNCH_OPTIONS or not value.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: a launch option is KEY=INT with KEY one of "
                                         f"{', '.join(LAUNCH_OPTIONS)}, e.g. mma_depth=1")
    return key, int(value)


def main() -> int:
    parser = make_parser(__doc__)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--batches", nargs="+", type=positive, default=[1, 5, 16, 32])
    parser.add_argument("--steps", nargs="+", type=positive, default=[1, 8])
    parser.add_argument("--context", type=positive, default=512)
    parser.add_argument("--launch", nargs="+", type=launch_option, default=[], metavar="KEY=INT",
                        help="StepLaunch options to check instead of its defaults (e.g. mma_depth=1)")
    args = parser.parse_args()
    options = dict(args.launch)
    require_gpu(parser)
    device = torch.device("cuda")
    out = environment("step_checks") | {"launch_options": options, "cases": []}
    for model in args.models:
        weights = None
        for batch in args.batches:
            for k in args.steps:
                if weights is None:
                    probe = workload_from_dict({"draft": model, "target": model, "k": k, "draft_batch": batch,
                                                "target_batch": 1, "context": args.context, "dtype": "bf16"},
                                               Path("step_checks"))
                    weights = probe.weights(Model.DRAFT, device)
                row = check_case(model, batch, k, args.context, weights, options=options)
                out["cases"].append(row)
                write_json(args.json, out)
                print(f"{model:<14} B={batch:<3} k={k}: "
                      f"{'ok' if row['ok'] else row.get('refused') or row.get('problems')}", flush=True)
        del weights
        torch.cuda.empty_cache()
    failed = [r for r in out["cases"] if not r["ok"] and "refused" not in r]
    print(f"{len(out['cases'])} cases: {sum(r['ok'] for r in out['cases'])} ok, "
          f"{sum('refused' in r for r in out['cases'])} refused, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
