"""The step kernel beside the product's launches, in one process: an example workload's draft phase
(its k steps, as the plan's draft launches run them, captured in a CUDA graph) against one launch of
the step kernel over the same weights, tokens, lengths and cache, and both against the byte floor.

    python lab/step_kernel/launches.py examples/qwen3-06b-8b-b4.toml --plans plans/sequential.json \
        benchmarks/results/plans/qwen3-06b-8b-b4.json --json OUT.json      # a Hopper GPU

Writes #48's fields per workload: workload, draft, batch, k, floor_ms, launches_ms (per plan),
step_kernel_ms, and the step kernel's check and ledger.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "stream_chain"), str(HERE.parents[1])]
from chain import graph_time_us, write_probe_result  # noqa: E402
from host import StepLaunch, tile_weights  # noqa: E402
from run import check_against_reference, floor_bytes, ledger  # noqa: E402
from program import build, check, coarsen  # noqa: E402

from conjugate.compiler.round import compile_round  # noqa: E402
from conjugate.evaluate.timing import copy_bandwidth_gbs  # noqa: E402
from conjugate.models.reference import make_round_inputs  # noqa: E402
from conjugate.plan import load_plan  # noqa: E402
from conjugate.roles import Model  # noqa: E402
from conjugate.workload import load_workload  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="+", type=Path)
    parser.add_argument("--plans", nargs="+", type=Path, default=[Path("plans/sequential.json")])
    parser.add_argument("--json")
    parser.add_argument("--attention", default="cores", choices=["cores", "mma"])
    parser.add_argument("--spin-sleep", type=int, default=0, help="ns a spinning wait pauses between polls")
    args = parser.parse_args()
    form = dict(attention=args.attention, spin_sleep=args.spin_sleep)
    device = torch.device("cuda")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    bw = copy_bandwidth_gbs(device) * 1e9
    print(f"{torch.cuda.get_device_name()}: copy {bw / 1e9:.0f} GB/s", flush=True)
    phases = []
    for path in args.workloads:
        wl = load_workload(path)
        draft, target = wl.weights(Model.DRAFT, "cuda"), wl.weights(Model.TARGET, "cuda")
        inputs = make_round_inputs(draft, target, k=wl.k, draft_batch=wl.draft_batch, target_batch=wl.target_batch,
                                   context=wl.context, seed=wl.seed)
        lengths = inputs.draft_lengths
        floor_us = floor_bytes(wl.draft, wl.draft_batch, wl.k, lengths) / bw * 1e6
        row = dict(workload=wl.name, draft=wl.draft.name, batch=wl.draft_batch, k=wl.k, context=wl.context,
                   floor_ms=floor_us / 1e3, launches_ms={}, **form)
        for plan_path in args.plans:
            compiled = compile_round(load_plan(plan_path), wl, draft, target)
            compiled.load(inputs)
            compiled.warmup()
            us = graph_time_us([compiled.phase(Model.DRAFT)])
            row["launches_ms"][str(plan_path)] = us / 1e3
            print(f"{wl.name}: {plan_path} draft phase {us / 1e3:.3f} ms ({us / floor_us:.2f}x the floor)", flush=True)
            del compiled
            torch.cuda.empty_cache()
        del target
        torch.cuda.empty_cache()
        prog = coarsen(build(wl.draft, wl.draft_batch, wl.k, sms))
        check(prog, sms)
        kv = torch.stack([inputs.draft_cache.k, inputs.draft_cache.v]).contiguous()
        weights = tile_weights(draft, prog)
        launch = StepLaunch(prog, weights, kv.shape[4], **form)
        row["check"] = check_against_reference(launch, draft, inputs.draft_last_tokens, lengths, kv)
        ok = (row["check"]["logits_rel_err"] < 5e-2 and row["check"]["tokens_near"] == row["check"]["tokens"]
              and row["check"]["cache_rel_err"] < 5e-2 and row["check"]["cache_elsewhere_untouched"]
              and not row["check"]["waits_ran_out"])
        row["passed"] = ok
        print(f"{wl.name}: step kernel check {row['check']}", flush=True)
        if ok:
            kv_run = kv.clone()
            us = graph_time_us([lambda: launch.run(kv_run)])
            row["step_kernel_ms"] = us / 1e3
            stamped = StepLaunch(prog, weights, kv.shape[4], stamps=True, **form)
            stamped.tokens_in.copy_(launch.tokens_in)
            stamped.lengths.copy_(launch.lengths)
            stamped.run(kv.clone())
            torch.cuda.synchronize()
            row["ledger"] = ledger(prog, stamped.stamps)
            print(f"{wl.name}: step kernel {us / 1e3:.3f} ms ({us / floor_us:.2f}x the floor)", flush=True)
        phases.append(row)
        write_probe_result(args.json, sms, bw, phases=phases)
        del draft, launch, weights, kv
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
