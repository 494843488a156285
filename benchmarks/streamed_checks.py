"""The streamed kernel (`<model>.streamed`: o_proj and down) checked on a Hopper GPU across the
families, rows a pass and the plans around it, nothing timed: its correctness log.

    python benchmarks/streamed_checks.py --json benchmarks/results/streamed_checks_h100.json

Per model (a preset of each family, random weights, as both draft and target) and per (batch, k), a
round of each plan below with both models' o_proj and down streamed is compiled, run on ragged
lengths (context // 2 to context) and checked against the fp32 reference round. The target passes
batch x (k + 1) rows, the draft batch: from 2 to 128, and one past it, which the compiler refuses
(a row with its refusal). Plans:
  norms   `sequential` with every norm fused into its GEMM (the residual GEMMs write row statistics),
          programmatic dependent launches released at the end
  mlp     `streams` (two streams, programmatic dependent launches released at the start) with the MLP
          fused (gate_up+down) and its norm too: o_proj writes a copy of its rows for it
Then (`kernel`) the kernel alone against torch on shapes the examples do not reach: N and K not
multiples of 64 (nor N of 16), rows 1 to 128, the statistics and the copy on and off, the padded rows
poisoned with NaN, and SM limits of 1, 3 and 7 programs, so that each program owns several tiles and
its ring runs on from one tile into the next. Rows are written as they finish.
"""
from __future__ import annotations

from pathlib import Path

from common import environment, make_parser, positive, require_gpu, write_json

import torch  # noqa: E402

from conjugate.compiler.feedback import CompileError  # noqa: E402
from conjugate.compiler.round import compile_round  # noqa: E402
from conjugate.compiler.buffers import padded_rows  # noqa: E402
from conjugate.compiler.streamed import CompiledStreamed, StreamedOperands  # noqa: E402
from conjugate.evaluate.correctness import ReferenceChecker  # noqa: E402
from conjugate.evaluate.rounds import checked_run  # noqa: E402
from conjugate.graph import build_graph  # noqa: E402
from conjugate.models.reference import make_round_inputs  # noqa: E402
from conjugate.paths import shipped_plan  # noqa: E402
from conjugate.plan import load_plan, validate_plan  # noqa: E402
from conjugate.roles import Model  # noqa: E402
from conjugate.workload import workload_from_dict  # noqa: E402

MODELS = ("llama-3.2-1b", "qwen2.5-0.5b", "qwen3-0.6b")  # llama, qwen2 (N = 896: 14 tiles), qwen3
CASES = ((1, 1), (4, 3), (3, 5), (8, 4), (20, 4), (32, 3), (33, 3))  # (batch, k): 2 .. 128 rows, then 132
NORMS = ["attn_norm+qkv", "mlp_norm+gate_up", "final_norm+lm_head", "lm_head+argmax"]


def plans() -> dict:
    """The plans checked, each with both models' residual GEMMs streamed."""
    norms = load_plan(shipped_plan("sequential")).to_dict()
    mlp = load_plan(shipped_plan("streams")).to_dict()
    for model in ("draft", "target"):
        norms[model] |= {"fusions": NORMS, "streamed": ["down", "o_proj"], "pdl": "end"}
        mlp[model] |= {"fusions": NORMS + ["gate_up+down"], "streamed": ["down", "o_proj"], "pdl": "start"}
    return {"norms": validate_plan(norms), "mlp": validate_plan(mlp)}


def check_case(model: str, batch: int, k: int, context: int, weights, plan_name: str, plan) -> dict:
    wl = workload_from_dict({"name": f"{model}-b{batch}-k{k}", "draft": model, "target": model, "k": k,
                             "draft_batch": batch, "target_batch": batch, "context": context, "dtype": "bf16"},
                            Path("streamed_checks"))
    row = {"model": model, "family": wl.draft.family, "plan": plan_name, "batch": batch, "k": k,
           "rows": batch * (k + 1), "context": context}
    inputs = make_round_inputs(weights, weights, k=k, draft_batch=batch, target_batch=batch, context=context,
                               seed=batch * 100 + k, ragged=True)
    try:
        compiled = compile_round(plan, wl, weights, weights, graph=build_graph(wl))
        compiled.warmup()
    except CompileError as e:
        return row | {"ok": False, "refused": str(e)}
    report = checked_run(compiled, inputs, ReferenceChecker(weights, weights, inputs, wl.dtype))
    streamed = sum(isinstance(l, CompiledStreamed) for l in compiled.launches)
    return row | {"ok": bool(report.ok and streamed), "streamed_launches": streamed, "problems": report.problems[:3],
                  "errors": report.errors}


# (rows, N, K, statistics, copy, programs at most)
KERNEL_CASES = tuple((rows, 4096, 4096, True, True, 132) for rows in (1, 16, 17, 33, 65, 127, 128)) + tuple(
    (rows, n, k, True, rows != 40, 132) for n, k in ((200, 4096), (1000, 72), (4104, 14336), (8, 520))
    for rows in (5, 40, 128)) + tuple(
    (rows, n, k, stats, stats, sms) for sms in (1, 3, 7) for rows in (5, 128)
    for n, k, stats in ((4096, 14336, True), (1000, 1000, False)))


def kernel_case(rows: int, n: int, k: int, stats: bool, copy: bool, sms: int, seed: int) -> dict:
    """The kernel on random operands against x + a w^T in fp32 (statistics and copy of that sum)."""
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(seed)
    a = torch.full((padded_rows(rows), k), float("nan"), device=device, dtype=torch.bfloat16)
    a[:rows] = torch.randn(rows, k, device=device, generator=gen).bfloat16()
    w = (torch.randn(n, k, device=device, generator=gen) / k ** 0.5).bfloat16()
    x0 = torch.randn(rows, n, device=device, generator=gen)
    chunks = -(-n // 16)
    ops = StreamedOperands(a, w, x0.clone(), torch.full((rows, chunks + 2), -7.0, device=device) if stats else None,
                           torch.full((rows, n), -7.0, device=device, dtype=torch.bfloat16) if copy else None)
    launch = CompiledStreamed(0, ops, rows, "kernel check", "main", sms, gpu=True)
    launch()
    torch.cuda.synchronize()
    new = x0 + a[:rows].float() @ w.float().T
    errors = {"x": ((ops.x - new).abs().max() / new.abs().max()).item()}
    ok = errors["x"] < 1e-4
    if stats:
        padded = torch.nn.functional.pad(new, (0, chunks * 16 - n))
        ref = (padded * padded).view(rows, chunks, 16).sum(-1)
        errors["stats"] = ((ops.stats[:, :chunks] - ref).abs().max() / ref.abs().max()).item()
        ok &= errors["stats"] < 1e-4 and bool((ops.stats[:, chunks:] == -7.0).all())  # nothing past the chunks
    if copy:
        errors["copy"] = ((ops.copy.float() - new).abs().max() / new.abs().max()).item()
        ok &= errors["copy"] < 1e-2
    return {"rows": rows, "n": n, "k": k, "stats": stats, "copy": copy, "programs": launch.grid,
            "tiles": -(-n // 64), "ok": bool(ok), "errors": errors}


def main() -> int:
    parser = make_parser(__doc__)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--context", type=positive, default=256)
    parser.add_argument("--kernel-only", action="store_true", help="the kernel cases alone, no rounds")
    args = parser.parse_args()
    require_gpu(parser)
    device = torch.device("cuda")
    out = environment("streamed_checks") | {"cases": []}
    checked = plans()
    for model in [] if args.kernel_only else args.models:
        probe = workload_from_dict({"draft": model, "target": model, "k": 1, "draft_batch": 1, "target_batch": 1,
                                    "context": args.context, "dtype": "bf16"}, Path("streamed_checks"))
        weights = probe.weights(Model.DRAFT, device)
        for batch, k in CASES:
            for plan_name, plan in checked.items():
                row = check_case(model, batch, k, args.context, weights, plan_name, plan)
                out["cases"].append(row)
                write_json(args.json, out)
                print(f"{model:<14} {plan_name:<6} B={batch:<3} k={k} rows={row['rows']:<4}: "
                      f"{'ok' if row['ok'] else row.get('refused') or row.get('problems')}", flush=True)
        del weights
        torch.cuda.empty_cache()
    out["kernel"] = []
    for i, case in enumerate(KERNEL_CASES):
        row = kernel_case(*case, seed=i)
        out["kernel"].append(row)
        write_json(args.json, out)
        print(f"kernel rows={row['rows']:<4} N={row['n']:<5} K={row['k']:<5} programs={row['programs']:<3} "
              f"tiles={row['tiles']:<3}: {'ok' if row['ok'] else row['errors']}", flush=True)
    failed = [r for r in out["cases"] if not r["ok"] and "refused" not in r] + [r for r in out["kernel"] if not r["ok"]]
    print(f"{len(out['cases'])} rounds: {sum(r['ok'] for r in out['cases'])} ok, "
          f"{sum('refused' in r for r in out['cases'])} refused; {len(out['kernel'])} kernel cases: "
          f"{sum(r['ok'] for r in out['kernel'])} ok; {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
