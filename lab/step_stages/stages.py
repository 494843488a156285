"""The step launch's dependent chain, stage by stage, from its H100 ledgers
(benchmarks/results/draft_step_h100.json, tree a6d740e): what each dependent stage costs in waits, and
what the #48 aim (the draft phase within 1.35x of its byte floor) leaves for them.

    python lab/step_stages/stages.py

A stage is one op instance every later op waits for: per step, each layer's qkv, attention, o_proj,
gate_up and down, then the head. A program's wait in the ledger is the time between its own tasks'
start and its waits met, summed over the launch; divided by the stages it is the mean exposed sync
cost of one stage (imbalance, the last piece's epilogue, the done counter's trip, the poll). CPU
only; reads committed figures.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from conjugate.workload import load_workload  # noqa: E402

AIM = 1.35  # #48: the draft phase within this of its byte floor
OPS_A_LAYER = 5  # qkv, attention, o_proj, gate_up, down


def rows(path: Path) -> list[dict]:
    out = []
    for phase in json.loads(path.read_text())["phases"]:
        ledger = phase.get("ledger")
        if not ledger:
            continue
        wl = load_workload(ROOT / "examples" / f"{phase['workload']}.toml")
        stages = phase["k"] * (wl.draft.num_layers * OPS_A_LAYER + 1)
        ops = ledger["ops"]
        wait = sum(v["wait_us"] for v in ops.values())
        floor_us = phase["floor_ms"] * 1e3
        out.append({"workload": phase["workload"], "stages": stages, "span_us": ledger["span_us"],
                    "floor_us": floor_us, "floor_us_a_stage": floor_us / stages,
                    "wait_us_a_stage": wait / stages, "attn_work_us": ops["attn"]["work_us"],
                    # what the aim leaves a stage beyond its bytes at the floor
                    "aim_slack_us_a_stage": (AIM - 1) * floor_us / stages})
    return out


def main() -> int:
    table = rows(ROOT / "benchmarks" / "results" / "draft_step_h100.json")
    print(f"{'workload':<22} {'stages':>6} {'span us':>8} {'floor us':>8} {'floor/stage':>11} "
          f"{'wait/stage':>10} {'aim slack/stage':>15}")
    for r in table:
        print(f"{r['workload']:<22} {r['stages']:6d} {r['span_us']:8.0f} {r['floor_us']:8.0f} "
              f"{r['floor_us_a_stage']:11.2f} {r['wait_us_a_stage']:10.2f} {r['aim_slack_us_a_stage']:15.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
