"""The target's verify pass as one step launch (the draft step kernel's template with TOKENS = k + 1
tokens a sequence and its logits kept), beside the `sequential` plan's verify launches.

    python lab/verify_step/verify.py examples/llama-1b-8b-b1.toml examples/qwen3-06b-8b-b4.toml \
        --target-batch 1 2 --json OUT.json

Per workload and target batch (the example's, or each of --target-batch): the target's weights and a
ragged round's inputs; the reference (forward() in fp32 on the verify tokens); the `sequential` plan
compiled, its round checked, its verify phase alone timed as a CUDA graph; the step launch run on a
copy of the target cache, its logits, argmax and new cache rows compared with the reference, then
timed as a CUDA graph (its zeroing included) and its ledger taken; the floor is the verify phase's
bytes at the measured copy rate. A step launch that fails its check is reported, not timed.

Lab code: nothing in `conjugate/` imports it. The launch takes the kernel's limits (rows = batch x
(k + 1) up to its row tile); a case past them is a row with the reason.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import environment, failure  # noqa: E402

import torch  # noqa: E402

from conjugate.compiler.round import compile_round  # noqa: E402
from conjugate.compiler.step.launch import StepLaunch  # noqa: E402
from conjugate.compiler.step.layout import tile_weights  # noqa: E402
from conjugate.compiler.step.ledger import task_ledger  # noqa: E402
from conjugate.compiler.step.table import step_table  # noqa: E402
from conjugate.evaluate.correctness import TOLERANCES, ReferenceChecker  # noqa: E402
from conjugate.evaluate.rounds import checked_run  # noqa: E402
from conjugate.evaluate.timing import capture, copy_bandwidth_gbs, time_replays  # noqa: E402
from conjugate.graph import build_graph  # noqa: E402
from conjugate.models.reference import forward, make_round_inputs  # noqa: E402
from conjugate.paths import shipped_plan  # noqa: E402
from conjugate.plan import load_plan  # noqa: E402
from conjugate.roles import Model  # noqa: E402
from conjugate.workload import read_workload_fields, workload_from_dict  # noqa: E402


def relative_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.double(), ref.double()
    return float("inf") if not torch.isfinite(got).all() else float((got - ref).norm() / ref.norm())


TOL = TOLERANCES["bf16"]  # the evaluator's own: relative error of logits and cache rows, and the near-tie margin


def token_ok(got: int, ref_logits: torch.Tensor) -> bool:
    """Exact, or a near tie of the reference's best logit (the evaluator's rule, correctness._token_ok)."""
    return bool(ref_logits[got] >= ref_logits.max() - TOL.tie_margin * ref_logits.std())


def check_step(launch: StepLaunch, ref_logits, ref_kv, lengths, tokens: int) -> dict:
    """The launch's logits, argmax (a near tie of the reference's best may differ) and new cache rows
    against the reference, within the evaluator's bf16 tolerance."""
    got = launch.logits()[0].view_as(ref_logits)
    argmax = launch.tokens[0, :got.shape[0] * tokens].view(got.shape[0], tokens).long()
    ref_argmax = ref_logits.argmax(-1)
    mismatches = [(b, t) for b, t in (argmax != ref_argmax).nonzero().tolist()
                  if not token_ok(int(argmax[b, t]), ref_logits[b, t])]
    new = torch.stack([torch.arange(int(n), int(n) + tokens) for n in lengths.cpu()])  # [B, T] positions
    rows = lambda kv: torch.stack([kv[:, :, b, :, new[b]] for b in range(len(new))], 2)  # noqa: E731
    out = {"logits_rel": relative_error(got, ref_logits), "argmax_mismatches": len(mismatches),
           "near_ties": int((argmax != ref_argmax).sum()) - len(mismatches),
           "cache_rel": relative_error(rows(launch.kv).float(), rows(ref_kv).float()),
           "spins_ran_out": int(launch.error.item())}
    out["ok"] = out["logits_rel"] < TOL.rel and out["cache_rel"] < TOL.rel and not out["argmax_mismatches"] \
        and not out["spins_ran_out"]
    return out


def measure(path: Path, target_batch: int | None, copy_gbs: float, replays: int) -> dict:
    fields = read_workload_fields(path)
    if target_batch:
        fields |= {"target_batch": target_batch, "name": f"{fields.get('name', path.stem)}-t{target_batch}"}
    wl = workload_from_dict(fields, path)
    device = torch.device("cuda")
    draft, target = wl.weights(Model.DRAFT, device), wl.weights(Model.TARGET, device)
    inputs = make_round_inputs(draft, target, k=wl.k, draft_batch=wl.draft_batch, target_batch=wl.target_batch,
                               context=wl.context, seed=wl.seed, ragged=True)
    graph = build_graph(wl)
    tokens = wl.k + 1
    floor_ms = sum(graph.nodes[o]["op"].bytes for o in graph.graph["order"][Model.TARGET]) / (copy_gbs * 1e6)
    row: dict = {"workload": wl.name, "target": wl.target.name, "batch": wl.target_batch, "tokens": tokens,
                 "rows": wl.target_batch * tokens, "floor_ms": floor_ms}
    compiled = compile_round(load_plan(shipped_plan("sequential")), wl, draft, target, graph=graph)
    compiled.warmup()
    report = checked_run(compiled, inputs, ReferenceChecker(draft, target, inputs, wl.dtype))
    row["launches_check"] = report.ok
    if report.ok:
        compiled.load(inputs)
        row["launches_ms"] = time_replays(capture(compiled.phase(Model.TARGET), device).replay, replays, 20).median_ms
    del compiled
    torch.cuda.empty_cache()
    ref_cache = inputs.target_cache.clone()
    ref_logits = forward(target, inputs.verify_tokens, ref_cache, inputs.target_lengths)
    try:
        prog = step_table(wl.target, wl.target_batch, 1, torch.cuda.get_device_properties(device).multi_processor_count,
                          tokens=tokens)
        kv = inputs.target_cache.k._base.clone()  # [2, L, B, KVH, S, D]: keys and values as KVCache.empty makes them
        launch = StepLaunch(prog, tile_weights(target, prog), kv, logits=True)
    except ValueError as e:
        return row | {"step": {"refused": str(e)}}
    try:
        launch.tokens_in[:prog.rows].copy_(inputs.verify_tokens.reshape(-1))
        launch.lengths.copy_(inputs.target_lengths)
        launch.run()
        torch.cuda.synchronize()
        ref_kv = torch.stack([ref_cache.k, ref_cache.v])
        row["step"] = check_step(launch, ref_logits, ref_kv, inputs.target_lengths, tokens) | {
            "programs": prog.programs, "tasks": len(prog.tasks), "stages": launch.kwargs["STAGES"],
            "kt_max": launch.kwargs["KT_MAX"], "rpad": launch.kwargs["RPAD"], "chunk": launch.kwargs["CHUNK"]}
        if row["step"]["ok"]:
            row["step_ms"] = time_replays(capture(launch.run, device).replay, replays, 20).median_ms
            stamped = StepLaunch(prog, launch.w, kv.clone(), stamps=True, logits=True)  # the same tiled weights
            stamped.tokens_in.copy_(launch.tokens_in)
            stamped.lengths.copy_(launch.lengths)
            stamped.run()
            torch.cuda.synchronize()
            row["ledger"] = task_ledger(prog, stamped.stamps)
    except Exception as e:  # a launch that fails is a row, not the end of the run
        row["step"] = row.get("step", {}) | {"error": failure(e)}
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="+", type=Path)
    parser.add_argument("--target-batch", type=int, nargs="+", default=[0], help="0: the workload's own")
    parser.add_argument("--replays", type=int, default=100)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    copy_gbs = copy_bandwidth_gbs(torch.device("cuda"))
    out = {**environment("verify"), "command": "python " + " ".join(sys.argv), "copy_gbs": copy_gbs, "rows": []}
    for path in args.workloads:
        for batch in args.target_batch:
            row = measure(path, batch or None, copy_gbs, args.replays)
            out["rows"].append(row)
            args.json.write_text(json.dumps(out, indent=1))
            print(json.dumps({k: v for k, v in row.items() if k != "ledger"}), flush=True)
            torch.cuda.empty_cache()
    print(f"\n{'workload':<26} {'rows':>4} {'floor':>7} {'launches':>9} {'step':>7}")
    for r in out["rows"]:
        print(f"{r['workload']:<26} {r['rows']:4d} {r['floor_ms']:7.3f} {r.get('launches_ms', float('nan')):9.3f} "
              f"{r.get('step_ms', float('nan')):7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
