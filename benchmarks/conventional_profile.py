"""Where the `conventional` baseline's time goes, and how other ways of compiling each model compare.

    python benchmarks/conventional_profile.py [WORKLOAD.toml] [--variants shipped eager bmm grouped whole]
                                              [--json OUT.json]

Per variant, both phases are built as `ConventionalRound` builds them, checked against the fp32
reference, captured as CUDA graphs and timed (median of replays on fresh inputs): draft phase alone,
verify phase alone, back to back, on two streams. Then each phase runs once eagerly under
torch.profiler and its CUDA kernels are summed by name, so the table shows which kernels take the time.

Variants:
- `shipped`: the baseline as shipped (one compiled graph per layer, reused by every layer;
  attention through F.scaled_dot_product_attention);
- `eager`: the same forward without torch.compile (each phase still one CUDA graph);
- `bmm`: as shipped, but attention as explicit matmuls over the cache, a KV head's query heads
  stacked as rows (the baseline's first form);
- `grouped`: as shipped, but a KV head's query heads stacked as rows of one SDPA call (every
  KV head read once, more query rows per tile);
- `whole`: each step compiled as one graph over all its layers.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from conjugate.compiler.round import device_name  # noqa: E402
from conjugate.evaluate import conventional  # noqa: E402
from conjugate.evaluate.conventional import ConventionalRound, compile_static  # noqa: E402
from conjugate.evaluate.correctness import ReferenceChecker, tolerance_for  # noqa: E402
from conjugate.evaluate.timing import time_replays  # noqa: E402
from conjugate.evaluate.rounds import round_inputs  # noqa: E402
from conjugate.workload import load_workload  # noqa: E402

VARIANTS = ("shipped", "eager", "bmm", "grouped", "whole")


def _groups_as_rows(q, kv_heads: int):
    """q [B, T, heads, hd] -> [B, kv_heads, group * T, hd]: a KV head's query heads stacked as rows."""
    b, t, heads, hd = q.shape
    group = heads // kv_heads
    return q.view(b, t, kv_heads, group, hd).permute(0, 2, 3, 1, 4).reshape(b, kv_heads, group * t, hd), group


def _rows_as_heads(out, t: int):
    """The inverse for the attention output: [B, kv_heads, group * T, hd] -> [B, T, heads * hd]."""
    b, kv_heads, rows, hd = out.shape
    group = rows // t
    return out.view(b, kv_heads, group, t, hd).permute(0, 3, 1, 2, 4).reshape(b, t, kv_heads * group * hd)


def _matmul_attention(q, cache_k, cache_v, visible):
    """q: [B, T, heads, hd]; cache: [B, kv_heads, max_len, hd]; visible: [T, max_len] -> [B, T, heads * hd]."""
    rows, group = _groups_as_rows(q.to(cache_k.dtype), cache_k.shape[1])
    scores = (rows @ cache_k.transpose(2, 3)).float() / math.sqrt(q.shape[-1])  # [B, kvh, group * T, max_len]
    probs = scores.masked_fill(~visible.repeat(group, 1), float("-inf")).softmax(-1)
    return _rows_as_heads(probs.to(cache_v.dtype) @ cache_v, q.shape[1])


def _grouped_sdpa(q, cache_k, cache_v, visible):
    """As _matmul_attention, through F.scaled_dot_product_attention."""
    rows, group = _groups_as_rows(q.to(cache_k.dtype), cache_k.shape[1])
    out = F.scaled_dot_product_attention(rows, cache_k, cache_v, attn_mask=visible.repeat(group, 1))
    return _rows_as_heads(out, q.shape[1])


def build(variant: str, draft, target, inputs) -> ConventionalRound:
    if variant in ("shipped", "bmm", "grouped"):
        return ConventionalRound(draft, target, inputs)
    rnd = ConventionalRound(draft, target, inputs, compile_fn=lambda fn: fn)
    if variant == "whole":
        rnd.draft_step = compile_static(rnd.draft_step.__call__)
        rnd.verify_step = compile_static(rnd.verify_step.__call__)
    return rnd


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


def profile_variant(variant, draft, target, inputs, timing_inputs, checker, replays, top) -> dict:
    started = time.perf_counter()
    original = conventional._attention
    if variant in ("bmm", "grouped"):
        conventional._attention = _matmul_attention if variant == "bmm" else _grouped_sdpa
    try:
        rnd = build(variant, draft, target, inputs)
        rnd.capture()
        compile_s = time.perf_counter() - started
        rnd.load(inputs)
        rnd.run()
        torch.cuda.synchronize()
        check = checker(rnd.outputs()).to_dict()
        rnd.load(timing_inputs)
        times = {name: time_replays(run, replays, warmup=10).median_ms for name, run in (
            ("draft_ms", rnd.graphs["draft"].replay), ("verify_ms", rnd.graphs["verify"].replay),
            ("round_ms", rnd.run), ("streams_ms", rnd.run_streams))}
        kernels = {"draft": kernel_table(rnd.draft_phase, top), "verify": kernel_table(rnd.verify_phase, top)}
    finally:
        conventional._attention = original
    del rnd
    torch.cuda.empty_cache()
    return {"variant": variant, "correct": check["ok"], "check": check, "compile_s": round(compile_s, 1),
            **{k: round(v, 3) for k, v in times.items()}, "kernels": kernels}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workload", nargs="?", default=str(ROOT / "examples" / "llama-1b-8b-b8.toml"))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--replays", type=int, default=100)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    w = load_workload(args.workload)
    device = torch.device("cuda")
    draft, target = w.weights("draft", device), w.weights("target", device)
    inputs, timing_inputs = round_inputs(w, draft, target), round_inputs(w, draft, target, w.seed + 1)
    checker = ReferenceChecker(draft, target, inputs, w.dtype, tolerance_for(w.dtype, {}))
    out = {"gpu": device_name(device), "torch": torch.__version__, "workload": w.name, "variants": []}
    for variant in args.variants:
        row = profile_variant(variant, draft, target, inputs, timing_inputs, checker, args.replays, args.top)
        out["variants"].append(row)
        print(f"{variant:10s} correct={row['correct']} compile {row['compile_s']:6.1f}s  draft {row['draft_ms']:.3f}"
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
