"""#49's record: the verify-phase kernels' shapes against the copy rate, and each workload's verify
phase alone against its byte floor, in the JSON #49 names.

    python benchmarks/verify_kernels.py examples/llama-1b-8b-b32.toml [...] \
        --sweeps benchmarks/results/kernel_sweep_b32_h100.json [...] --json OUT.json      # a GPU
    python benchmarks/verify_kernels.py --sweeps SWEEP.json [...] --json OUT.json       # no GPU: shapes only

`shapes`: every shape of the kernel sweeps given (`kernel_sweep.py`, whose `--batches`, `--ks` and
`--contexts` take the serving sizes), each at its best tile: {"kind": "gemm" | "attention", "model",
"op", "rows", "context", "ms", "bytes", "bw_fraction", "tile", "sweep"}, where rows are the GEMM's
activation rows or attention's batch x tokens, and bw_fraction the bytes over the time against the
sweep's copy rate, from a cold L2 (a sweep's numbers, converted; its GPU and commit are the sweep's).
`phases`: per workload the `sequential` plan compiled, its round checked against the fp32 reference
(ragged lengths), then the target's phase (the verify pass) alone timed as a CUDA graph (median of
--replays) against the target's bytes at the measured copy rate: {"workload", "verify_floor_ms",
"verify_ms", "ratio", "check"}. With `--streamed`, the same plan with the target's o_proj and down
run by the streamed kernel (`target.streamed`) too, checked, and both phases timed in --passes
interleaved passes: "variants": {"sequential" | "streamed": {"verify_ms", "passes_ms", "check"}}, and
"verify_ms" the sequential plan's median of its passes. `--pdl start` (or `end`) adds each of those
plans again with the target's launches programmatic dependent ones released there, as
"sequential+pdl=start" and "streamed+pdl=start", timed in the same interleaved passes. A variant whose
round does not fit in the GPU's memory beside the ones before it is a variant with its "error", untimed.
"""
from __future__ import annotations

import gc
import json
from pathlib import Path

from common import environment, failure, make_parser, round_case, write_json


def shape_rows(sweep: dict, source: str) -> list[dict]:
    """A kernel sweep's shapes as #49's rows, each at its best tile (the shipped one where none beat it)."""
    rows = []
    for s in sweep["shapes"]:
        best = s.get("best") or s["shipped"]
        fields = s["fields"]
        attention = s["kind"] == "attn"
        rows.append({"kind": "attention" if attention else "gemm", "model": s["model"], "op": s["kind"],
                     "rows": fields["batch"] * fields["tokens"] if attention else fields["rows"],
                     "context": fields["context"] if attention else None, "ms": best["us"] / 1e3,
                     "bytes": s["bytes"], "bw_fraction": best["share_of_copy"], "tile": best["plan_keys"],
                     "workloads": s["workloads"], "sweep": source})
    return rows


def streamed_plan(plan):
    """`plan` with the target's residual GEMMs run by the streamed kernel."""
    from conjugate.plan import validate_plan

    raw = plan.to_dict()
    raw["target"]["streamed"] = ["down", "o_proj"]
    return validate_plan(raw)


def with_pdl(plan, trigger: str):
    """`plan` with the target's launches programmatic dependent ones released at `trigger`."""
    from conjugate.plan import validate_plan

    raw = plan.to_dict()
    raw["target"]["pdl"] = trigger
    return validate_plan(raw)


def measure_phase(path: Path, replays: int, copy_gbs: float, streamed: bool = False, passes: int = 3,
                  pdl: tuple[str, ...] = ()) -> dict:
    import torch

    from conjugate.compiler.round import compile_round
    from conjugate.evaluate.rounds import checked_run
    from conjugate.evaluate.timing import capture, time_replays
    from conjugate.paths import shipped_plan
    from conjugate.plan import load_plan
    from conjugate.roles import Model

    device = torch.device("cuda")
    case = round_case(path, device)
    order = case.graph.graph["order"][Model.TARGET]
    floor_ms = sum(case.graph.nodes[op]["op"].bytes for op in order) / (copy_gbs * 1e6)
    row = {"workload": case.workload.name, "path": str(path), "verify_floor_ms": floor_ms,
           "rows": case.workload.target_batch * (case.workload.k + 1)}
    sequential = load_plan(shipped_plan("sequential"))
    plans = {"sequential": sequential} | ({"streamed": streamed_plan(sequential)} if streamed else {})
    plans |= {f"{name}+pdl={t}": with_pdl(plan, t) for t in pdl for name, plan in list(plans.items())}
    compared = len(plans) > 1
    variants, phases, rounds = {}, {}, {}  # rounds: alive while their captured graphs replay over their buffers
    for name, plan in plans.items():  # every variant checked before any is timed
        try:
            rounds[name] = compiled = compile_round(plan, case.workload, case.draft, case.target, graph=case.graph)
            compiled.warmup()
            report = checked_run(compiled, case.inputs, case.check)
            variants[name] = {"check": report.to_dict(), "passes_ms": []}
            if report.ok:
                compiled.load(case.inputs)
                phases[name] = capture(compiled.phase(Model.TARGET), device)
            else:
                print(f"{row['workload']} {name}: check failed {report.problems[:3]}", flush=True)
        except torch.OutOfMemoryError:  # the variants' buffers side by side: a row, not the end of the call
            rounds.pop(name, None)
            phases.pop(name, None)
            compiled = None
            variants[name] = {"error": "out of GPU memory beside the variants before it", "passes_ms": []}
            print(f"{row['workload']} {name}: out of GPU memory, not timed", flush=True)
        if "error" in variants[name]:  # its buffers freed once the exception's frames are gone
            gc.collect()
            torch.cuda.empty_cache()
    for _ in range(passes if compared else 1):
        for name, phase in phases.items():
            variants[name]["passes_ms"].append(time_replays(phase.replay, replays, warmup=20).median_ms)
    for name, v in variants.items():
        if v["passes_ms"]:
            v["verify_ms"] = sorted(v["passes_ms"])[len(v["passes_ms"]) // 2]
            print(f"{row['workload']} {name}: verify {v['verify_ms']:.3f} ms, {v['verify_ms'] / floor_ms:.2f}x "
                  f"its floor {floor_ms:.3f} ms", flush=True)
    row["check"] = variants["sequential"].get("check")
    if "verify_ms" in variants["sequential"]:
        row["verify_ms"] = variants["sequential"]["verify_ms"]
        row["ratio"] = row["verify_ms"] / floor_ms
    if compared:
        row["variants"] = variants
    return row


def main() -> int:
    parser = make_parser(__doc__)
    parser.add_argument("workloads", nargs="*", type=Path, help="workloads whose verify phase is timed (a GPU)")
    parser.add_argument("--sweeps", nargs="*", type=Path, default=[], help="kernel_sweep.py JSONs to convert")
    parser.add_argument("--replays", type=int, default=100)
    parser.add_argument("--streamed", action="store_true",
                        help="also the target's o_proj and down as the streamed kernel, timed interleaved")
    parser.add_argument("--passes", type=int, default=3, help="interleaved passes with --streamed or --pdl")
    parser.add_argument("--pdl", nargs="*", choices=("start", "end"), default=[],
                        help="also each plan with the target's launches programmatic dependent ones, timed interleaved")
    args = parser.parse_args()
    if not args.workloads and not args.sweeps:
        parser.error("nothing to do: give workloads to time, --sweeps to convert, or both")
    sweeps = []
    for path in args.sweeps:
        try:
            sweeps.append((path, json.loads(path.read_text())))
        except (OSError, ValueError) as e:
            parser.error(f"{path}: {failure(e)}")
    out = environment("verify_kernels") | {"sweeps": [{"path": str(p), "gpu": s.get("gpu"), "code": s.get("code"),
                                                          "command": s.get("command")} for p, s in sweeps]}
    try:
        out["shapes"] = [row for p, s in sweeps for row in shape_rows(s, str(p))]
    except (KeyError, TypeError) as e:
        parser.error(f"a sweep is not a kernel_sweep.py JSON ({failure(e)})")
    out["phases"] = []
    if args.workloads:
        import torch

        from conjugate.errors import ConjugateError
        from conjugate.evaluate.timing import copy_bandwidth_gbs
        from conjugate.workload import load_workload

        for path in args.workloads:  # every file read before anything is measured
            try:
                load_workload(path)
            except ConjugateError as e:
                parser.error(str(e))
        if not torch.cuda.is_available():
            parser.error("timing a verify phase needs a GPU; without one give --sweeps only")

        out["copy_gbs"] = copy_gbs = copy_bandwidth_gbs(torch.device("cuda"))
        for path in args.workloads:
            out["phases"].append(measure_phase(path, args.replays, copy_gbs, args.streamed, args.passes,
                                               tuple(args.pdl)))
            write_json(args.json, out)
            gc.collect()  # the workload's rounds and graphs, before the next one's
            torch.cuda.empty_cache()
    write_json(args.json, out)
    low = [r for r in out["shapes"] if r["bw_fraction"] < (0.80 if r["kind"] == "attention" else 0.85)]
    print(f"{len(out['shapes'])} shapes, {len(low)} under #49's share (GEMMs 85%, attention 80% of copy)")
    for r in out["phases"]:
        if "verify_ms" in r:
            others = {name: v["verify_ms"] for name, v in r.get("variants", {}).items()
                      if name != "sequential" and "verify_ms" in v}
            print(f"{r['workload']:<24} verify {r['verify_ms']:7.3f} ms  floor {r['verify_floor_ms']:7.3f}  "
                  f"{r['ratio']:.2f}x" + "".join(f"  {name} {ms:7.3f} ({ms / r['verify_ms']:.3f})"
                                                 for name, ms in others.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
