"""Draws the README's figure from committed benchmark summaries (no GPU needed).

    python docs/figures.py            # writes docs/search_qwen3_h200.png

The curve is a search's best round so far (benchmarks/results/searchers_h200.json); the lines are
the same workload's conventional round, the `streams` plan and the byte floor
(benchmarks/results/floor_h200.json), all measured on one H200.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def _workload_row(rows: list[dict], name: str) -> dict:
    for row in rows:
        if row["workload"] == name:
            return row
    raise SystemExit(f"no row for workload {name!r}")


def search_figure(workload: str, agent: str, out: Path) -> None:
    searchers = json.loads((RESULTS / "searchers_h200.json").read_text())
    floor = _workload_row(json.loads((RESULTS / "floor_h200.json").read_text())["workloads"], workload)
    run = next(r for r in _workload_row(searchers["workloads"], workload)["runs"] if r["agent"] == agent)
    curve = run["best_so_far_ms"]
    fig, ax = plt.subplots(figsize=(7.2, 3.6), dpi=110)
    ax.plot(range(1, len(curve) + 1), curve, color="#1f6fb4", lw=2, label=f"search ({agent} agent): best so far")
    for label, ms, style in (("conventional (torch.compile, one model after the other)", floor["conventional_ms"], "--"),
                             ("the `streams` plan (two streams)", floor["streams_ms"], "-."),
                             ("floor (bytes / copy bandwidth)", floor["floor_ms"], ":")):
        ax.axhline(ms, color="#555555", ls=style, lw=1.2)
        ax.text(len(curve), ms, f" {label}: {ms:.2f} ms", va="bottom", ha="right", fontsize=8)
    ax.set_xlabel("evaluations (each plan checked against the reference, then timed)")
    ax.set_ylabel("round latency (ms)")
    ax.set_title(f"{workload} on one {searchers['gpu']}: one round = draft's k steps beside target's verify", fontsize=9)
    ax.set_ylim(0, max(curve[0], floor["conventional_ms"]) * 1.08)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    fig.savefig(out)
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="qwen3-06b-8b-b4")
    parser.add_argument("--agent", default="heuristic")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "search_qwen3_h200.png")
    args = parser.parse_args()
    search_figure(args.workload, args.agent, args.out)


if __name__ == "__main__":
    main()
