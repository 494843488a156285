"""The step launch's critical path from committed ledgers: per workload and op, a stage's time on the
path (the stage before's end to its own) and its last task's phases (ledger.critical_path), as a
markdown table. CPU only; reads JSONs that `lab/step_variants/variants.py` or `benchmarks/draft_step.py`
wrote on a GPU (a ledger with its `critical` entry).

    python lab/step_stages/critical.py lab/step_stages/h100_critical.json [--variant default]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PHASES = ("busy_us", "handoff_us", "stage_us", "multiply_us", "arrive_us", "epilogue_us", "straggle_us")


def ledgers(data: dict, variant: str):
    """(workload, ledger) from a variants JSON (`workloads`) or a draft_step JSON (`phases`)."""
    for e in data.get("workloads", []):
        row = e["variants"].get(variant, {})
        if "ledger" in row:
            yield e["workload"], e["floor_ms"], row["ledger"]
    for e in data.get("phases", []):
        if "ledger" in e:
            yield e["workload"], e["floor_ms"], e["ledger"]


def table(data: dict, variant: str) -> list[str]:
    head = "| workload | op | stages | us a stage | " + " | ".join(p[:-3] for p in PHASES) + " |"
    lines = [head, "|" + "---|" * (4 + len(PHASES))]
    for name, floor_ms, ledger in ledgers(data, variant):
        crit = ledger.get("critical")
        if not crit:
            continue
        lines.append(f"| {name} | all | {sum(v['stages'] for v in crit['ops'].values())} | "
                     f"{crit['span_us'] / sum(v['stages'] for v in crit['ops'].values()):.2f} | "
                     f"floor {floor_ms * 1e3 / sum(v['stages'] for v in crit['ops'].values()):.2f} a stage; "
                     f"{crit['critical_programs']} programs ran a last task, the busiest "
                     f"{crit['top_program_share']:.0%} |" + " |" * (len(PHASES) - 1))
        for op, v in crit["ops"].items():
            n = v["stages"]
            lines.append(f"| | {op} | {n} | {v['us'] / n:.2f} | " + " | ".join(f"{v[p] / n:.2f}" for p in PHASES) + " |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+", type=Path)
    parser.add_argument("--variant", default="default")
    args = parser.parse_args()
    for path in args.json:
        print("\n".join(table(json.loads(path.read_text()), args.variant)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
