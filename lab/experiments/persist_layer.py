"""A draft layer as one persistent launch against its parts launched one after another, alone.

    python lab/experiments/persist_layer.py examples/llama-1b-8b-b8.toml [...] [--warps 4 8]
                                       [--grids 132 264 396 528] [--groups 1 16] [--flush read]
                                       [--json OUT.json]

Per workload (seeded random weights on the GPU), from `lab/experiments/variants/streams-fused.json` with
the draft's `persist` span set to `layer`, for each number of warps, each barrier kind
(`--groups`: persist.BARRIER_GROUPS) and with prefetch on and off:
1. correctness first: the whole persistent round against the fp32 reference (the evaluator's
   check), and whether its outputs equal those of the same plan with separate launches bit for bit
   (information only: the persistent kernel is compiled apart, and Triton may order a reduction
   differently there; lab/experiments/persist_check.py tells a race from that);
2. the first draft layer's persistent launch timed alone at each grid the GPU can hold at once
   (`--grids`, and its largest, which `programs: 0` takes), and its parts launched one after
   another in one graph at their own settings; each from a CUDA graph of ten calls with the L2
   cache flushed before every call (overwritten, as a round's launch verdicts are timed, or read:
   `--flush read`, see flush_mode.py).
One process, every variant in it: compare within a run.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from functools import partial
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from conjugate.compiler.round import compile_round  # noqa: E402
from conjugate.evaluate.measured import MeasuredHarness  # noqa: E402
from conjugate.evaluate.evaluators import load_profile  # noqa: E402
from conjugate.evaluate.rounds import checked_run  # noqa: E402
from conjugate.evaluate.session import EvaluationSession  # noqa: E402
from conjugate.cli.arguments import output_file, positive  # noqa: E402
from conjugate.compiler import persist  # noqa: E402
from conjugate.evaluate.timing import FLUSHES, l2_flush_bytes, time_per_call  # noqa: E402
from conjugate.plan import load_plan, validate_plan  # noqa: E402
from conjugate.workload import load_workload  # noqa: E402

BASE = ROOT / "lab" / "experiments" / "variants" / "streams-fused.json"
CALLS = 10


def persist_plan(warps: int, prefetch: bool, persist: bool = True):
    """streams-fused with the draft's layers persistent (or not), all launches at `warps` warps."""
    plan = load_plan(BASE).to_dict()
    plan["name"] = f"persist-layer-w{warps}-{'prefetch' if prefetch else 'plain'}" if persist else f"separate-w{warps}"
    plan["launch"] = plan["launch"] | {"num_warps": warps}
    plan["persist"] = {"draft": {"span": "layer" if persist else "none", "prefetch": prefetch}}
    return validate_plan(plan)


def output_fields(out) -> dict[str, torch.Tensor]:
    """A round's outputs by name: tokens, both models' caches, and the target's logits where written."""
    fields = {"draft_tokens": out.draft_tokens, "target_tokens": out.target_tokens,
              "draft_cache_k": out.draft_cache.k, "draft_cache_v": out.draft_cache.v,
              "target_cache_k": out.target_cache.k, "target_cache_v": out.target_cache.v}
    if out.target_logits is not None:
        fields["target_logits"] = out.target_logits
    return fields


def differing_outputs(a, b) -> list[str]:
    """The output fields where two rounds differ (an empty list: bit for bit the same)."""
    theirs = output_fields(b)
    return [name for name, x in output_fields(a).items() if name in theirs and not torch.equal(x, theirs[name])]


def bench(path: Path, warps_list: list[int], grids: list[int], cache: Path, groups_list: list[int] = (1,),
          flush_mode: str = "write") -> list[dict]:
    w = load_workload(path)
    device = torch.device("cuda")
    setup = MeasuredHarness(load_profile("h200"), cache, EvaluationSession()).prepare(w)
    draft, target, inputs = *setup.weights, setup.inputs
    flush = l2_flush_bytes(device)
    timed = partial(time_per_call, device=device, calls=CALLS, flush_bytes=flush, flush=flush_mode)
    rows = []
    for warps in warps_list:
        separate = compile_round(persist_plan(warps, True, persist=False), w, draft, target, cache_dir=cache)
        separate.load(inputs)
        separate.warmup()
        separate.load(inputs)
        separate.run()
        expected = separate.outputs()
        for prefetch, groups in ((p, g) for g in groups_list for p in (True, False)):
            persist.BARRIER_GROUPS = groups  # read when the kernel source and its sync buffer are made
            compiled = compile_round(persist_plan(warps, prefetch), w, draft, target, cache_dir=cache)
            compiled.load(inputs)
            compiled.warmup()  # compiles, records resources, sizes each persistent grid to what fits
            compiled.load(inputs)
            compiled.run()
            differ = differing_outputs(compiled.outputs(), expected)
            check = checked_run(compiled, inputs, setup.check)
            index = next(i for i, l in enumerate(compiled.schedule.launches)
                         if l.persistent and any(".l0." in op for op in l.ops))
            launch = compiled.launches[index]
            fits = launch.grid
            solos = [compiled.solo(index, p) for p in range(len(launch.parts))]
            sequence_us = timed(lambda: [s() for s in solos])
            parts_us = [timed(s) for s in solos]
            row = {"workload": w.name, "warps": warps, "prefetch": prefetch, "barrier_groups": groups,
                   "flush": flush_mode, "correct": check.ok, "problems": check.problems[:3],
                   "bit_equal": not differ, "differ": differ,
                   "registers": launch.resources.registers, "shared_bytes": launch.resources.shared_bytes,
                   "resident": fits,
                   "parts": [f"{p.model.value} {p.kind}" for p in compiled.schedule.launches[index].parts],
                   "parts_us": parts_us, "sequence_us": sequence_us, "grids_us": {}}
            for grid in sorted({g for g in grids if g <= fits} | {fits}):
                launch.grid = grid
                row["grids_us"][grid] = timed(launch)
            launch.grid = fits
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="+", type=Path)
    parser.add_argument("--warps", nargs="+", type=int, default=[4])
    parser.add_argument("--grids", nargs="+", type=int, default=[66, 132, 264, 396])
    parser.add_argument("--groups", nargs="+", type=positive, default=[1],
                        help="barrier kinds (persist.BARRIER_GROUPS): 1 is one counter for the grid")
    parser.add_argument("--flush", choices=FLUSHES, default="write", help="how L2 is emptied before each call")
    parser.add_argument("--json", type=output_file)
    args = parser.parse_args()
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "command": " ".join(sys.argv), "rows": []}
    with tempfile.TemporaryDirectory(prefix="persist-layer-") as cache:
        for path in args.workloads:
            out["rows"] += bench(path, args.warps, args.grids, Path(cache), args.groups, args.flush)
            if args.json:
                args.json.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{'workload':22} {'warps':>5} {'prefetch':>8} {'groups':>6} {'ok':>3} {'bits':>4} "
          f"{'parts back to back':>18}  "
          f"persistent by grid (us)")
    for r in out["rows"]:
        grids = "  ".join(f"{g}: {us:.1f}" for g, us in r["grids_us"].items())
        print(f"{r['workload']:22} {r['warps']:5d} {str(r['prefetch']):>8} {r['barrier_groups']:6d} "
              f"{'yes' if r['correct'] else 'NO':>3} "
              f"{'same' if r['bit_equal'] else 'diff':>4} "
              f"{r['sequence_us']:18.1f}  {grids}")


if __name__ == "__main__":
    main()
