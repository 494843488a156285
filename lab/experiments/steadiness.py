"""Why one round measured twice in one process could differ by 4%: the `sequential` plan timed
before the baselines ran, after torch.compile's conventional baseline only, after a garbage
collection and a dynamo reset, and as a second compiled copy, with the SM clock read after each.

    python lab/experiments/steadiness.py WORKLOAD_NAME OUT.json [--pinpoint | --graphs | --bisect] [--variant V]
    (WORKLOAD_NAME: an example's, e.g. qwen3-06b-8b-b4)

`--pinpoint` first times the round after one eager SDPA call, one eager GEMM, and two tiny
torch.compile'd functions, to find which first use starts the slowdown. `--bisect` takes the
conventional baseline apart instead: a large tensor beside the round (written, then freed), an
eager masked SDPA call of the verify phase's shapes, the conventional round's buffers and fused
weights, its eager run, its eager phases captured, and only then the compiled baseline. `--graphs`
first: two new streams, a second CUDA graph of one kernel, a graph of one cuBLAS GEMM. `--variant`:
the conventional variant built for both phases (default layers-sdpa).

Result (H200, benchmarks/results/steadiness_qwen3_h200.json, steadiness_triggers_qwen3_h200.json): the
same CUDA graph replays 4% slower once the conventional baseline's phases are captured in CUDA
graphs, at the same SM clock, for the rest of the process; not when its models are built or run
eagerly. graph_step.py narrows it to the kernels such a graph holds.
"""
import argparse
import gc
import json
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from baselines import sm_clock_mhz  # noqa: E402
from conjugate.compiler.buffers import kv_capacity  # noqa: E402
from conjugate.compiler.round import compile_round  # noqa: E402
from conjugate.evaluate.baselines.measure import conventional_baselines  # noqa: E402
from conjugate.evaluate.baselines.conventional import ConventionalRound, Variant  # noqa: E402
from conjugate.evaluate.measured import MeasuredHarness  # noqa: E402
from conjugate.evaluate.evaluators import load_profile  # noqa: E402
from conjugate.evaluate.rounds import checked_run  # noqa: E402
from conjugate.evaluate.session import EvaluationSession  # noqa: E402
from conjugate.evaluate.timing import capture, time_round  # noqa: E402
from conjugate.paths import EXAMPLES_DIR, shipped_plan  # noqa: E402
from conjugate.plan import load_plan  # noqa: E402
from conjugate.workload import load_workload  # noqa: E402



def _bisect(setup, workload, record, rnd) -> None:
    """The conventional baseline's parts one at a time, the round timed after each."""
    free = torch.cuda.mem_get_info()[0]
    filler = torch.empty(min(24 << 30, free // 3), dtype=torch.uint8, device="cuda").fill_(1)
    record(f"beside {filler.numel() >> 30} GiB written", rnd)
    del filler
    torch.cuda.empty_cache()
    record("after freeing it", rnd)
    spec, cap, dt = workload.target, kv_capacity(workload), workload.torch_dtype
    b, t = workload.target_batch, workload.k + 1
    q = torch.randn(b, spec.num_heads, t, spec.head_dim, dtype=dt, device="cuda")
    kv = torch.randn(b, spec.num_kv_heads, cap, spec.head_dim, dtype=dt, device="cuda")
    mask = torch.ones(b, 1, t, cap, dtype=torch.bool, device="cuda")
    torch.nn.functional.scaled_dot_product_attention(q, kv, kv, attn_mask=mask, enable_gqa=True)
    torch.cuda.synchronize()
    del q, kv, mask
    record("after an eager masked SDPA of the verify shapes", rnd)
    eager = ConventionalRound(workload, *setup.weights, Variant.parse("eager-sdpa"), Variant.parse("eager-sdpa"))
    record("after the conventional round's buffers and fused weights", rnd)
    eager.load(setup.inputs)
    eager.run_eager()
    torch.cuda.synchronize()
    record("after its eager run", rnd)
    eager.capture()
    eager.run()
    torch.cuda.synchronize()
    record("after its eager phases captured and replayed", rnd)
    del eager
    gc.collect()
    torch.cuda.empty_cache()
    record("after freeing the eager round", rnd)


def _graphs(record, rnd) -> None:
    """New streams, then a second CUDA graph of one kernel, then one of a cuBLAS GEMM."""
    x, kept = torch.zeros(1 << 18, device="cuda"), []
    for _ in range(2):
        kept.append(torch.cuda.Stream())
        with torch.cuda.stream(kept[-1]):
            x.mul_(1.0)
    torch.cuda.synchronize()
    record("after two new streams ran a kernel each", rnd)
    kept.append(capture(lambda: x.mul_(1.0), x.device))
    kept[-1].replay()
    record("after a second graph (one elementwise kernel)", rnd)
    a = torch.randn(40, 4096, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(4096, 4096, dtype=torch.bfloat16, device="cuda")
    kept.append(capture(lambda: torch.nn.functional.linear(a, w), x.device))
    kept[-1].replay()
    record("after a graph of one cuBLAS GEMM", rnd)


def main(name: str, out: str, pinpoint: bool = False, bisect: bool = False, graphs: bool = False,
         variant: str = "layers-sdpa") -> None:
    profile = load_profile("h200")
    timing, cache = profile.timing, Path(tempfile.mkdtemp())
    workload = load_workload(EXAMPLES_DIR / f"{name}.toml")
    setup = MeasuredHarness(profile, cache, EvaluationSession()).prepare(workload)
    plan, rows = load_plan(shipped_plan("sequential")), []

    def record(label: str, rnd) -> None:
        x = time_round(rnd.run, lambda: rnd.load(setup.timing_inputs), timing.replays, timing.warmup)
        rows.append({"when": label, "ms": round(x.median_ms, 3), **sm_clock_mhz()})
        print(json.dumps(rows[-1]), flush=True)

    first = compile_round(plan, workload, *setup.weights, cache_dir=cache)  # as an evaluation meets a plan
    first.load(setup.inputs)
    first.warmup()
    checked_run(first, setup.inputs, setup.check)
    first.prepare()
    checked_run(first, setup.inputs, setup.check, graph=True)
    record("plan path, before any baseline", first)
    if pinpoint:  # which first use of torch's machinery starts it
        q = torch.randn(8, 32, 5, 128, dtype=torch.bfloat16, device="cuda")
        kv = torch.randn(8, 32, 1029, 128, dtype=torch.bfloat16, device="cuda")
        torch.nn.functional.scaled_dot_product_attention(q, kv, kv)
        record("after one eager SDPA call", first)
        a = torch.randn(40, 4096, dtype=torch.bfloat16, device="cuda")
        w = torch.randn(4096, 4096, dtype=torch.bfloat16, device="cuda")
        torch.nn.functional.linear(a, w)
        record("after one eager cuBLAS GEMM", first)
        torch.compile(lambda x: (x * 2).relu().sum(-1), dynamic=False)(a)
        record("after a torch.compile'd elementwise function", first)
        torch.compile(lambda x, y: torch.nn.functional.linear(x, y).float().softmax(-1), dynamic=False)(a, w)
        record("after a torch.compile'd GEMM + softmax", first)
        torch.cuda.synchronize()
    if graphs:
        _graphs(record, first)
    if bisect:
        _bisect(setup, workload, record, first)
    conventional_baselines(setup, timing, {"draft": variant, "verify": variant})
    record(f"after conventional ({variant}) only", first)
    gc.collect()
    torch.cuda.empty_cache()
    record("after gc + empty_cache", first)
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()
    record("after dynamo reset", first)
    second = compile_round(plan, workload, *setup.weights, cache_dir=cache)  # as the sequential baseline is
    second.prepare()
    checked_run(second, setup.inputs, setup.check, graph=True)
    record("a second copy", second)
    record("the first copy", first)
    Path(out).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", help="an example workload's name, e.g. qwen3-06b-8b-b4")
    parser.add_argument("out", help="the rows as JSON")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--pinpoint", action="store_true")
    what.add_argument("--graphs", action="store_true")
    what.add_argument("--bisect", action="store_true")
    parser.add_argument("--variant", default="layers-sdpa", help="the conventional variant built for both phases")
    args = parser.parse_args()
    try:
        Variant.parse(args.variant)  # a bad name fails here, before any GPU work
    except ValueError as error:
        parser.error(str(error))
    main(args.workload, args.out, args.pinpoint, args.bisect, args.graphs, args.variant)
