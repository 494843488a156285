"""The prediction in README.md: what balanced runs should save, from the H100 ledgers of the step
launch (benchmarks/results/draft_step_h100.json, measured with round-robin tables at tree a6d740e).

    python lab/step_dealing/predict.py

Fits each GEMM op's work per program (ledger) to its tasks and K tiles per program (the table the
ledger ran), by least squares over the six examples; then, per workload and table, sums over stages
the slowest program's work at those rates and adds the ledger's attention (its work and waits).
CPU only; a prediction, not a measurement.
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from conjugate.compiler.step import table  # noqa: E402
from conjugate.workload import load_workload  # noqa: E402

GEMMS = ("qkv", "o_proj", "gate_up", "down", "head")


def tables(balanced: bool):
    """Each ledger row's workload and its table, dealt round-robin or in balanced runs."""
    product = table.balanced_runs
    table.balanced_runs = product if balanced else (lambda *a, **k: None)
    table._TABLES.clear()
    try:
        for row in ROWS:
            wl = load_workload(ROOT / "examples" / f"{row['workload']}.toml")
            yield row, table.step_table(wl.draft, wl.draft_batch, wl.k, 132, sms=132)
    finally:
        table.balanced_runs = product
        table._TABLES.clear()


def critical_us(prog, per_task: float, per_k_tile: float) -> float:
    """Sum over GEMM stages of the slowest program's work."""
    stages: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for t in prog.tasks:
        if t.op in GEMMS:
            stages[t.stage][t.program] += per_task + per_k_tile * ((t.k_range[1] - t.k_range[0]) // prog.tiles.k)
    return sum(max(p.values()) for p in stages.values())


RESULT = json.loads((ROOT / "benchmarks" / "results" / "draft_step_h100.json").read_text())
ROWS = [r for r in RESULT["phases"] if "ledger" in r]

if __name__ == "__main__":
    x, y = [], []
    for row, prog in tables(balanced=False):
        for op in GEMMS:
            ts = [t for t in prog.tasks if t.op == op]
            x.append([len(ts) / prog.programs, sum((t.k_range[1] - t.k_range[0]) // prog.tiles.k for t in ts)
                      / prog.programs])
            y.append(row["ledger"]["ops"][op]["work_us"])
    (per_task, per_k_tile), *_ = np.linalg.lstsq(np.array(x), np.array(y), rcond=None)
    print(f"fit: {per_task:.3f} us a task, {per_k_tile:.3f} us a K tile (128 x 64 bf16)")
    before = {r["workload"]: critical_us(p, per_task, per_k_tile) for r, p in tables(balanced=False)}
    after = {r["workload"]: critical_us(p, per_task, per_k_tile) for r, p in tables(balanced=True)}
    print(f"{'workload':<24} {'span':>7} {'model':>7} {'balanced':>9} {'saves':>6}  (us; model = GEMM stages + attention)")
    for r in ROWS:
        attn = r["ledger"]["ops"]["attn"]
        a = attn["work_us"] + attn["wait_us"]
        w = r["workload"]
        print(f"{w:<24} {r['ledger']['span_us']:7.0f} {before[w] + a:7.0f} {after[w] + a:9.0f} "
              f"{before[w] - after[w]:6.0f}")
