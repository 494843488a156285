"""Why one round measured twice in one process could differ by 4%: the `sequential` plan timed
before the baselines ran, after torch.compile's conventional baseline only, after a garbage
collection and a dynamo reset, and as a second compiled copy, with the SM clock read after each.

    python benchmarks/steadiness.py WORKLOAD_NAME OUT.json [--pinpoint]     # e.g. qwen3-06b-8b-b4

`--pinpoint` first times the round after one eager SDPA call, one eager GEMM, and two tiny
torch.compile'd functions, to find which first use starts the slowdown.

Result (H200, benchmarks/results/steadiness_qwen3_h200.json): the same CUDA graph replays 4% slower
once the conventional baseline has run, at the same SM clock, for the rest of the process; nothing
undoes it (not freeing memory, not resetting dynamo, not a single inductor compile thread).
"""
import gc
import json
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from baselines import sm_clock_mhz  # noqa: E402
from conjugate.compiler.round import compile_round  # noqa: E402
from conjugate.evaluate.baselines import conventional_baselines  # noqa: E402
from conjugate.evaluate.measured import MeasuredHarness  # noqa: E402
from conjugate.evaluate.profile import load_profile  # noqa: E402
from conjugate.evaluate.rounds import checked_run  # noqa: E402
from conjugate.evaluate.session import EvaluationSession  # noqa: E402
from conjugate.evaluate.timing import time_round  # noqa: E402
from conjugate.paths import EXAMPLES_DIR, shipped_plan  # noqa: E402
from conjugate.plan import load_plan  # noqa: E402
from conjugate.workload import load_workload  # noqa: E402



def main(name: str, out: str, pinpoint: bool = False) -> None:
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
    conventional_baselines(setup, timing, {"draft": "layers-sdpa", "verify": "layers-sdpa"})
    record("after conventional (layers-sdpa) only", first)
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
    main(sys.argv[1], sys.argv[2], "--pinpoint" in sys.argv[3:])
