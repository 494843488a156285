"""Whether a persistent round is right, deterministic and independent of its grid on the GPU.

    python lab/experiments/persist_check.py examples/llama-1b-8b-b8.toml [--grids 1 132 0] [--json OUT.json]

From lab/experiments/variants/streams-fused.json with the draft's layers persistent (persist_layer.py's
plans), on the evaluator's inputs: the separate-launch round run twice (is it deterministic?), then
the persistent round at each grid (0: as many programs as fit at once), twice each. Per run: the
evaluator's check against the fp32 reference, and for every output that differs from the separate
round's first run, and from the persistent round's first run, how many elements, the largest
difference, and for a KV cache the layers and positions that differ.

The persistent kernel is compiled apart from the separate ones, so Triton may lay out a reduction
differently and round differently: bit equality with the separate round is information, not the
test. A race shows as persistent runs that differ from each other, or with the grid.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from persist_layer import output_fields, persist_plan  # noqa: E402

from conjugate.cli.arguments import output_file  # noqa: E402
from conjugate.compiler.round import compile_round  # noqa: E402
from conjugate.evaluate.measured import MeasuredHarness  # noqa: E402
from conjugate.evaluate.evaluators import load_profile  # noqa: E402
from conjugate.evaluate.session import EvaluationSession  # noqa: E402
from conjugate.workload import load_workload  # noqa: E402


def differences(out, expected) -> dict[str, dict]:
    """Per differing field: elements, largest |difference|, and for a cache [layer, batch, head, pos, dim]
    the layers and positions where it differs."""
    found = {}
    theirs = output_fields(expected)
    for name, x in output_fields(out).items():
        y = theirs.get(name)
        if y is None or torch.equal(x, y):
            continue
        diff = x.float() != y.float()
        row = {"elements": int(diff.sum()), "of": diff.numel(),
               "max_abs": float((x.float() - y.float()).abs().nan_to_num(float("inf")).max())}
        if x.dim() == 5:
            where = diff.nonzero()
            row["layers"] = sorted({int(i) for i in where[:, 0].tolist()})
            row["positions"] = sorted({int(i) for i in where[:, 3].tolist()})[:20]
            row["batch_rows"] = sorted({int(i) for i in where[:, 1].tolist()})
        found[name] = row
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", type=Path)
    parser.add_argument("--grids", nargs="+", type=int, default=[1, 132, 0])
    parser.add_argument("--warps", type=int, default=4)
    parser.add_argument("--json", type=output_file)
    args = parser.parse_args()
    w = load_workload(args.workload)
    with tempfile.TemporaryDirectory(prefix="persist-check-") as cache:
        setup = MeasuredHarness(load_profile("h200"), Path(cache), EvaluationSession()).prepare(w)
        rows, first = [], []

        def run(compiled, label: str, **extra) -> None:
            compiled.load(setup.inputs)
            compiled.bufs.poison()
            compiled.run()
            torch.cuda.synchronize()
            out = compiled.outputs()
            report = setup.check(out)
            if len(first) < 2 and label.endswith("run 1"):  # the separate round's, then the first persistent's
                first.append(out)
            rows.append({"round": label, **extra, "check_ok": report.ok, "problems": report.problems[:3],
                         "differ_from_separate": differences(out, first[0]),
                         "differ_from_first_persistent": differences(out, first[1]) if len(first) > 1 else None})
            print(json.dumps(rows[-1]), flush=True)

        separate = compile_round(persist_plan(args.warps, True, persist=False), w, *setup.weights,
                                 cache_dir=Path(cache))
        separate.warmup()
        run(separate, "separate, run 1")
        run(separate, "separate, run 2")
        persistent = compile_round(persist_plan(args.warps, True), w, *setup.weights, cache_dir=Path(cache))
        persistent.warmup()
        joined = [launch for launch in persistent.launches if launch.sync is not None]
        fits = {id(launch): launch.grid for launch in joined}
        for grid in args.grids:
            for launch in joined:
                launch.grid = fits[id(launch)] if grid == 0 else min(grid, fits[id(launch)])
            for attempt in (1, 2):
                run(persistent, f"persistent, grid {grid or 'all that fit'}, run {attempt}",
                    grids=sorted({launch.grid for launch in joined}))
    if args.json:
        args.json.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "command": " ".join(sys.argv),
                                         "workload": w.name, "rows": rows}, indent=1) + "\n")
    def said(found) -> str:
        return "-" if found is None else "same" if not found else "; ".join(
            f"{k}: {v['elements']}/{v['of']} max {v['max_abs']:.3g}"
            + (f" layers {v['layers']}" if "layers" in v else "")
            for k, v in found.items())

    for r in rows:
        print(f"{r['round']:36} check {'ok' if r['check_ok'] else 'FAILED'}  vs separate: "
              f"{said(r['differ_from_separate'])}  vs first persistent: {said(r['differ_from_first_persistent'])}")


if __name__ == "__main__":
    main()
