"""Where the `conventional` baseline's time goes, variant by variant.

    python lab/experiments/conventional_profile.py [WORKLOAD.toml] [--variants layers-sdpa whole-grouped ...]
                                              [--split-chunks 4 8 ...] [--json OUT.json]

Per variant (evaluate/baselines/conventional.py: its compile x attention [x residual]; default: the profiles'
default list), both phases are built as the baseline builds them, checked against the fp32
reference, captured as CUDA graphs and timed (median of replays on fresh inputs): draft phase alone, verify phase alone, back to
back, on two streams. Then each phase runs once eagerly under torch.profiler and its CUDA kernels
are summed by name, so the table shows which kernels take the time. With `--split-chunks`, each
`split` variant is built once per chunk count given, in place of the cut the baseline would choose. (The results committed before
2026-11-30's variants were measured with this script's earlier form, which patched the attention
function in place: `git log lab/experiments/conventional_profile.py`.)
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from conjugate.cli.arguments import output_file  # noqa: E402
from conjugate.compiler.buffers import PreparedWeights  # noqa: E402
from conjugate.compiler.round import device_name  # noqa: E402
from conjugate.evaluate.baselines import conventional  # noqa: E402
from conjugate.evaluate.baselines.conventional import ConventionalRound, Variant  # noqa: E402
from conjugate.evaluate.baselines.split_attention import choose_chunks  # noqa: E402
from conjugate.evaluate.correctness import ReferenceChecker, tolerance_for  # noqa: E402
from conjugate.evaluate.evaluators import TimingSettings  # noqa: E402
from conjugate.evaluate.rounds import round_inputs  # noqa: E402
from conjugate.evaluate.timing import time_replays  # noqa: E402
from conjugate.roles import Model  # noqa: E402
from conjugate.workload import load_workload  # noqa: E402


def kernel_table(fn, top: int) -> list[dict]:
    """fn's CUDA kernels summed by name, longest first."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    totals: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            entry = totals[event.name]
            entry[0] += 1
            entry[1] += event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time_total
    rows = sorted(totals.items(), key=lambda kv: -kv[1][1])
    all_us = sum(v[1] for _, v in rows)
    return [{"kernel": name[:90], "calls": n, "us": round(us, 1)} for name, (n, us) in rows[:top]] + \
           [{"kernel": "(all kernels)", "calls": sum(v[0] for _, v in rows), "us": round(all_us, 1)}]


def forced_cut(chunks: int, capacity: int) -> int:
    """--split-chunks' count for a cache of `capacity` keys, if it can cut it (at least a key a chunk)."""
    if not 1 <= chunks <= capacity:
        raise SystemExit(f"--split-chunks {chunks}: a {capacity}-key cache takes 1 to {capacity} chunks")
    return chunks


def profile_variant(variant, w, draft, target, inputs, timing_inputs, checker, replays, top,
                    split_chunks: int | None = None) -> dict:
    started = time.perf_counter()
    v = Variant.parse(variant)
    if split_chunks is not None:  # every split step of this round cut into this many chunks
        conventional.choose_chunks = lambda *shape: forced_cut(split_chunks, shape[4])
    try:
        rnd = ConventionalRound(w, draft, target, v, v)
    finally:
        conventional.choose_chunks = choose_chunks
    rnd.capture()
    compile_s = time.perf_counter() - started
    rnd.load(inputs)
    rnd.run()
    torch.cuda.synchronize()
    check = checker(rnd.outputs()).to_dict()
    rnd.load(timing_inputs)
    times = {name: time_replays(run, replays, warmup=10).median_ms for name, run in (
        ("draft_ms", rnd.graphs[Model.DRAFT].replay), ("verify_ms", rnd.graphs[Model.TARGET].replay),
        ("round_ms", rnd.run), ("streams_ms", rnd.run_streams))}
    kernels = {"draft": kernel_table(rnd.draft_phase, top), "verify": kernel_table(rnd.verify_phase, top)}
    chunks = {"draft": rnd.draft_step.chunks, "verify": rnd.verify_step.chunks}  # split attention's cut (else 1)
    del rnd
    torch.cuda.empty_cache()
    return {"variant": variant, "correct": check["ok"], "check": check, "compile_s": round(compile_s, 1), "chunks": chunks,
            **{k: round(v, 3) for k, v in times.items()}, "kernels": kernels}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workload", nargs="?", default=str(ROOT / "examples" / "llama-1b-8b-b8.toml"))
    parser.add_argument("--variants", nargs="+", default=list(TimingSettings.conventional),
                        help="conventional variants (default: the profiles' default list)")
    parser.add_argument("--split-chunks", type=int, nargs="+", help="build each split variant with these cuts")
    parser.add_argument("--replays", type=int, default=100)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--json", type=output_file)
    args = parser.parse_args()

    w = load_workload(args.workload)
    device = torch.device("cuda")
    draft, target = w.weights(Model.DRAFT, device), w.weights(Model.TARGET, device)
    inputs, timing_inputs = round_inputs(w, draft, target), round_inputs(w, draft, target, w.seed + 1)
    checker = ReferenceChecker(draft, target, inputs, w.dtype, tolerance_for(w.dtype, {}))
    out = {"gpu": device_name(device), "torch": torch.__version__, "workload": w.name, "variants": []}
    builds = [(v, n) for v in args.variants
              for n in (args.split_chunks if args.split_chunks and Variant.parse(v).attention == "split" else [None])]
    for variant, chunks in builds:
        row = profile_variant(variant, w, PreparedWeights(draft), PreparedWeights(target), inputs, timing_inputs,
                              checker, args.replays, args.top, chunks)
        out["variants"].append(row)
        print(f"{variant:10s} chunks {row['chunks']} correct={row['correct']} compile {row['compile_s']:6.1f}s"
              f"  draft {row['draft_ms']:.3f}"
              f"  verify {row['verify_ms']:.3f}  round {row['round_ms']:.3f}  streams {row['streams_ms']:.3f} ms",
              flush=True)
        if not row["correct"]:
            print("   ", "; ".join(row["check"]["problems"][:5]), flush=True)
        if args.json:
            args.json.write_text(json.dumps(out, indent=1) + "\n")
    for row in out["variants"]:
        for phase, table in row["kernels"].items():
            print(f"\n{row['variant']} {phase}:")
            for k in table:
                print(f"  {k['us']:9.1f} us {k['calls']:5d}x  {k['kernel']}")


if __name__ == "__main__":
    main()
