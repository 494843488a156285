"""The committed best plans re-measured: each workload's plan (benchmarks/results/plans/W.json) beside
the shipped `streams` plan, one `conjugate bench` process per workload, against the figures
`floor_h200.json` recorded for them.

    python benchmarks/best_plans.py [--workloads W ...] [--evaluator benchmarks/profiles/h200_quick.toml]
                                    [--tolerance 0.01] [--json benchmarks/results/best_plans_h200.json]
                                    [--resume CUT.json]

Every plan is checked against the reference before it is timed (the evaluator does that). A row
holds both medians, their recorded figures and the ratios; `within` says whether the best plan's
median is within `--tolerance` of its recorded one. The default evaluator leaves out the torch.compile
baselines (minutes per workload on a fresh machine); `evaluators/h200.toml` measures them too. The
table is printed last; the exit status is 1 when a plan failed or moved by more than the tolerance.
`--resume` takes a run cut short (its `--json`): its rows where both plans measured are kept, with
that run's command, commit and date as `measured_by`, and only the other workloads are benched. The
cut-short run must come from the same GPU and evaluator.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from common import RESULTS, ROOT, environment, make_parser, write_json

PLANS = RESULTS / "plans"


def workload_file(name: str) -> Path:
    for folder in (ROOT / "examples", ROOT / "benchmarks" / "workloads"):
        if (folder / f"{name}.toml").is_file():
            return folder / f"{name}.toml"
    raise SystemExit(f"best_plans.py: --workloads: no examples/{name}.toml or benchmarks/workloads/{name}.toml")


def bench(name: str, evaluator: str, log: Path) -> dict[str, dict]:
    """One `conjugate bench` process: {"streams": result, "best": result} (EvalResult dicts)."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "bench.json"
        command = [sys.executable, "-m", "conjugate", "bench", str(workload_file(name)), "--evaluator", evaluator,
                   "--plan", "streams", "--plan", str(PLANS / f"{name}.json"), "--json", str(out)]
        with log.open("w") as sink:
            subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT)
        if not out.is_file():
            return {}
        streams, best = json.loads(out.read_text())["plans"]
        return {"streams": streams["result"], "best": best["result"]}


def median_ms(result: dict | None) -> float | None:
    metrics = (result or {}).get("metrics")
    return metrics["latency_ms"] if result and result.get("status") == "ok" and metrics else None


def row(name: str, results: dict[str, dict], recorded: dict, tolerance: float) -> dict:
    best, streams = median_ms(results.get("best")), median_ms(results.get("streams"))
    then_best, then_streams = recorded.get("best_ms"), recorded.get("streams_ms")
    ratio = best / then_best if best and then_best else None
    return {"workload": name, "best_ms": best, "streams_ms": streams, "recorded_best_ms": then_best,
            "recorded_streams_ms": then_streams, "best_over_recorded": ratio,
            "streams_over_recorded": streams / then_streams if streams and then_streams else None,
            "within": ratio is not None and abs(ratio - 1) <= tolerance,
            "status": {plan: (r or {}).get("status", "no result") for plan, r in results.items()} or "no result"}


def resumed_rows(path: Path, gpu: str | None, evaluator: str, tolerance: float) -> dict[str, dict]:
    """The rows of a cut-short run worth keeping (both plans measured), by workload; `within` is
    recomputed for this run's tolerance. Refused with one line when the run is unreadable or comes
    from another GPU or evaluator."""
    try:
        partial = json.loads(path.read_text())
        rows, their_gpu, their_evaluator = partial["rows"], partial.get("gpu"), partial["evaluator"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"best_plans.py: --resume: {path}: not a best_plans.py result ({type(e).__name__}: {e})")
    if their_gpu != gpu or their_evaluator != evaluator:
        raise SystemExit(f"best_plans.py: --resume: {path} was measured on {their_gpu} with {their_evaluator}; "
                         f"this run is {gpu} with {evaluator}")
    provenance = {key: partial.get(key) for key in ("command", "code", "date")}
    kept = {}
    for r in rows:
        if isinstance(r, dict) and r.get("status") == {"streams": "ok", "best": "ok"}:
            ratio = r.get("best_over_recorded")
            kept[r["workload"]] = r | {"within": ratio is not None and abs(ratio - 1) <= tolerance,
                                       "measured_by": r.get("measured_by", provenance)}
    return kept


def main(argv: list[str] | None = None) -> int:
    recorded = {w["workload"]: w for w in json.loads((RESULTS / "floor_h200.json").read_text())["workloads"]}
    parser = make_parser(__doc__)
    parser.add_argument("--workloads", nargs="+", default=sorted(p.stem for p in PLANS.glob("*.json")))
    parser.add_argument("--evaluator", default="benchmarks/profiles/h200_quick.toml")
    parser.add_argument("--tolerance", type=float, default=0.01, help="the largest change kept (default: 0.01)")
    parser.add_argument("--logs", type=Path, help="keep each bench's output here (default: a scratch folder)")
    parser.add_argument("--resume", type=Path, metavar="CUT.json",
                        help="a run cut short: keep its measured rows (same GPU and evaluator), bench the rest")
    args = parser.parse_args(argv)
    for name in args.workloads:
        workload_file(name)  # every name refused before any work
        if not (PLANS / f"{name}.json").is_file():
            raise SystemExit(f"best_plans.py: --workloads: no {PLANS / name}.json")
    logs = args.logs or Path(tempfile.mkdtemp(prefix="best_plans_"))
    logs.mkdir(parents=True, exist_ok=True)
    out = environment("best_plans") | {"evaluator": args.evaluator, "tolerance": args.tolerance, "rows": []}
    kept = resumed_rows(args.resume, out["gpu"], args.evaluator, args.tolerance) if args.resume else {}
    for name in args.workloads:
        if name in kept:
            out["rows"].append(kept[name])
            write_json(args.json, out)
            print(f"{name}: kept from {args.resume} (measured {kept[name]['measured_by'].get('date')})", flush=True)
            continue
        out["rows"].append(row(name, bench(name, args.evaluator, logs / f"{name}.log"), recorded.get(name, {}),
                               args.tolerance))
        write_json(args.json, out)
        r = out["rows"][-1]
        print(f"{name}: best {r['best_ms']} ms, streams {r['streams_ms']} ms ({r['status']})", flush=True)
    print(f"\n{'workload':24} {'best ms':>8} {'then':>8} {'ratio':>6} {'streams':>8} {'then':>8}  within")
    for r in out["rows"]:
        cells = [r["best_ms"], r["recorded_best_ms"], r["best_over_recorded"], r["streams_ms"], r["recorded_streams_ms"]]
        print(f"{r['workload']:24} " + " ".join(f"{c:8.3f}" if c is not None else f"{'-':>8}" for c in cells)
              + f"  {r['within']}")
    return 0 if all(r["within"] for r in out["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
