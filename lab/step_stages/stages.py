"""The step launch's dependent chain, stage by stage, from its H100 ledgers
(benchmarks/results/draft_step_h100.json, tree a6d740e): what each dependent stage costs in waits, and
what the #48 aim (the draft phase within 1.35x of its byte floor) leaves for them.

    python lab/step_stages/stages.py

A stage is one op instance every later op waits for: per step, the embedding, each layer's qkv,
attention, o_proj, gate_up and down, then the head (the ledger's `stages`). A program's wait in the ledger is the time between its own tasks'
start and its waits met, summed over the launch; divided by the stages it is the mean exposed sync
cost of one stage (imbalance, the last piece's epilogue, the done counter's trip, the poll).
Attention's floor is its KV bytes at the copy rate, the mean length taken as 3/4 of the context
(ragged lengths are uniform in context/2..context); its ledger work is per program, the programs
running side by side, so the two compare directly. CPU only; reads committed figures.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from conjugate.workload import load_workload  # noqa: E402

AIM = 1.35  # #48: the draft phase within this of its byte floor
OPS_A_LAYER = 5  # qkv, attention, o_proj, gate_up, down; a step adds its embedding and head


def rows(path: Path) -> list[dict]:
    out = []
    data = json.loads(path.read_text())
    copy_gbs = data["copy_gbs"]
    for phase in data["phases"]:
        ledger = phase.get("ledger")
        if not ledger:
            continue
        wl = load_workload(ROOT / "examples" / f"{phase['workload']}.toml")
        stages = phase["k"] * (wl.draft.num_layers * OPS_A_LAYER + 2)
        ops = ledger["ops"]
        wait = sum(v["wait_us"] for v in ops.values())
        floor_us = phase["floor_ms"] * 1e3
        d = wl.draft
        kv_bytes = 2 * d.num_layers * wl.draft_batch * d.num_kv_heads * d.head_dim * 2 * 0.75 * wl.context * wl.k
        out.append({"workload": phase["workload"], "stages": stages, "span_us": ledger["span_us"],
                    "floor_us": floor_us, "floor_us_a_stage": floor_us / stages,
                    "wait_us_a_stage": wait / stages, "attn_work_us": ops["attn"]["work_us"],
                    "attn_floor_us": kv_bytes / (copy_gbs * 1e3),
                    # what the aim leaves a stage beyond its bytes at the floor
                    "aim_slack_us_a_stage": (AIM - 1) * floor_us / stages})
    return out


def main() -> int:
    table = rows(ROOT / "benchmarks" / "results" / "draft_step_h100.json")
    print(f"{'workload':<22} {'stages':>6} {'span us':>8} {'floor us':>8} {'floor/stage':>11} "
          f"{'wait/stage':>10} {'aim slack/stage':>15} {'attn work':>9} {'attn floor':>10}")
    for r in table:
        print(f"{r['workload']:<22} {r['stages']:6d} {r['span_us']:8.0f} {r['floor_us']:8.0f} "
              f"{r['floor_us_a_stage']:11.2f} {r['wait_us_a_stage']:10.2f} {r['aim_slack_us_a_stage']:15.2f} "
              f"{r['attn_work_us']:9.0f} {r['attn_floor_us']:10.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
