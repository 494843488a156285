"""One table of several `conjugate bench --json` files: per workload, each plan's median round, its p20-p80,
its status and floor ratio, its change against the first plan of the same file (one worker process;
none where the first failed), its speedup over the `conventional` baseline measured beside it (its own
result's; carried or modeled baselines are left out), the ledger's busy time per stream, and the
verdicts of its launches that join several parts of one model (persistent or ticket-ordered: the launch
against its parts launched one by one). The baselines' medians are kept per plan; the table shows those
of each file's first measured plan (the baseline `streams` is torch's phases on two streams, not the
shipped `streams` plan).

    python benchmarks/bench_table.py BENCH.json... --json OUT.json [--note TEXT]
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from common import make_parser, write_json


def _joined_verdicts(verdicts: list[dict]) -> dict | None:
    """Median time of the launches joining several parts of one model, and of their parts one by one."""
    joined = [v for v in verdicts if len(v["parts"]) > 1 and len({p["model"] for p in v["parts"]}) == 1
              and v.get("shared_us") is not None and v.get("separate_us") is not None]
    if not joined:
        return None
    return {"launches": len(joined), "median_us": statistics.median(v["shared_us"] for v in joined),
            "parts_median_us": statistics.median(v["separate_us"] for v in joined)}


def _measured_baselines(metrics: dict) -> dict[str, float]:
    """The baselines' medians (ms) measured correct in the result's own process: none carried or modeled."""
    return {name: b["latency_ms"] for name, b in (metrics.get("baselines") or {}).items()
            if b.get("status") == "ok" and b.get("latency_ms") and not b.get("carried") and not b.get("modeled")}


def summarise(bench: dict) -> dict:
    """The rows of one bench file."""
    plans = {}
    first = (bench["plans"][0]["result"].get("metrics") or {}).get("latency_ms") if bench["plans"] else None
    for entry in bench["plans"]:
        result = entry["result"]
        metrics = result.get("metrics") or {}
        ms = metrics.get("latency_ms")
        ledger = metrics.get("ledger") or {}
        baselines = _measured_baselines(metrics)
        conventional = baselines.get("conventional")
        plans[entry["label"]] = {
            "ms": ms, "p20_ms": metrics.get("p20_ms"), "p80_ms": metrics.get("p80_ms"), "status": result["status"],
            "floor_ratio": metrics.get("floor_ratio"),
            "change_percent": None if ms is None or not first else round(100 * (ms / first - 1), 2),
            "over_conventional": None if not ms or not conventional else round(conventional / ms, 4),
            "baselines_ms": baselines,
            "streams_busy_ms": ledger.get("streams"), "joined_launches": _joined_verdicts(result.get("verdicts") or [])}
    measured = next((e["result"]["metrics"] for e in bench["plans"] if e["result"].get("metrics")), {})
    return {"workload": bench["workload"], "device": measured.get("device"),
            "baselines_ms": _measured_baselines(measured), "plans": plans}


def markdown(rows: list[dict]) -> str:
    lines = ["| workload | plan | ms | change | floor ratio | over conventional | draft / target busy "
             "| joined launch / its parts (us) |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        for name, ms in row["baselines_ms"].items():
            label = "baseline `streams` (torch, two streams)" if name == "streams" else f"baseline `{name}`"
            lines.append(f"| {row['workload']} | {label} | {ms:.3f} | - | - | - | - | - |")
        for label, p in row["plans"].items():
            busy = p["streams_busy_ms"] or {}
            busy_text = " / ".join(f"{busy[m]:.2f}" for m in ("draft", "target") if m in busy) or "-"
            joined = p["joined_launches"]
            joined_text = f"{joined['median_us']:.1f} / {joined['parts_median_us']:.1f}" if joined else "-"
            ms = "-" if p["ms"] is None else f"{p['ms']:.3f}"
            change = "-" if p["change_percent"] is None else f"{p['change_percent']:+.1f}%"
            ratio = "-" if p["floor_ratio"] is None else f"{p['floor_ratio']:.3f}"
            over = "-" if p["over_conventional"] is None else f"{p['over_conventional']:.3f}x"
            lines.append(f"| {row['workload']} | {label} | {ms} | {change} | {ratio} | {over} | {busy_text} "
                         f"| {joined_text} |")
    return "\n".join(lines)


def main() -> None:
    parser = make_parser(__doc__, json_help="write the rows here")
    parser.add_argument("bench", nargs="+", type=Path, help="`conjugate bench --json` files")
    parser.add_argument("--note", default="", help="recorded in the JSON (GPU, code, command)")
    args = parser.parse_args()
    rows = []
    for path in args.bench:
        try:
            rows.append(summarise(json.loads(path.read_text())))
        except (OSError, ValueError, KeyError, TypeError) as e:
            sys.exit(f"{path}: not a `conjugate bench --json` file ({type(e).__name__}: {e})")
    write_json(args.json, {"note": args.note, "files": [p.name for p in args.bench], "workloads": rows})
    print(markdown(rows))


if __name__ == "__main__":
    main()
