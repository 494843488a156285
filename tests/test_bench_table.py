"""benchmarks/bench_table.py: one table of several `conjugate bench --json` files."""
from __future__ import annotations

import json
import subprocess
import sys

from scripts import load_script  # tests/scripts.py
from test_round import ROOT


def _bench(ms: list[float | None]) -> dict:
    plans = []
    for i, value in enumerate(ms):
        baselines = {"conventional": {"status": "ok", "latency_ms": 18.0 + 2 * i, "carried": ""},
                     "streams": {"status": "incorrect", "latency_ms": None},  # not measured correct: left out
                     "sequential": {"status": "ok", "latency_ms": 11.0, "carried": "run 1, node 3"}}  # carried: out
        metrics = None if value is None else {"latency_ms": value, "p20_ms": value - 0.01, "p80_ms": value + 0.01,
                                              "floor_ratio": value / 5.0, "device": "NVIDIA H200",
                                              "baselines": baselines,
                                              "ledger": {"streams": {"draft": value - 0.2, "target": value - 0.4}}}
        verdicts = [{"parts": [{"model": "draft"}, {"model": "draft"}], "shared_us": 40.0 + i, "separate_us": 30.0},
                    {"parts": [{"model": "draft"}, {"model": "target"}], "shared_us": 99.0, "separate_us": 1.0}]
        plans.append({"label": f"plan{i}", "result": {"status": "ok" if value else "compile_error",
                                                      "metrics": metrics, "verdicts": verdicts if i else []}})
    return {"workload": "w", "evaluator": "e", "modeled": False, "plans": plans}


def test_rows_name_each_plan_against_the_first_and_its_joined_launches(tmp_path):
    script = load_script("bench_table")
    row = script.summarise(_bench([8.0, 9.0, None]))
    assert row["device"] == "NVIDIA H200" and list(row["plans"]) == ["plan0", "plan1", "plan2"]
    assert row["plans"]["plan1"]["change_percent"] == 12.5 and row["plans"]["plan0"]["joined_launches"] is None
    assert row["baselines_ms"] == {"conventional": 18.0}  # the first measured plan's
    assert row["plans"]["plan1"]["over_conventional"] == 2.2222 and row["plans"]["plan0"]["over_conventional"] == 2.25
    assert row["plans"]["plan1"]["baselines_ms"] == {"conventional": 20.0}  # each plan's own process
    assert row["plans"]["plan1"]["joined_launches"] == {"launches": 1, "median_us": 41.0, "parts_median_us": 30.0}
    assert row["plans"]["plan2"]["ms"] is None and row["plans"]["plan2"]["status"] == "compile_error"
    failed_first = script.summarise(_bench([None, 9.0, 10.0]))["plans"]  # no baseline: no change is made up
    assert [p["change_percent"] for p in failed_first.values()] == [None, None, None]
    assert [p["over_conventional"] for p in failed_first.values()] == [None, 2.2222, 2.2]
    assert script.summarise(_bench([None, 9.0]))["baselines_ms"] == {"conventional": 20.0}
    assert script.summarise(_bench([0.0]))["plans"]["plan0"]["over_conventional"] is None  # no division by zero
    table = script.markdown([row])
    assert "| w | baseline `conventional` | 18.000 | - | - | - | - | - |" in table
    assert "| w | plan1 | 9.000 | +12.5% | 1.800 | 2.222x | 8.80 / 8.60 | 41.0 / 30.0 |" in table
    assert "| w | plan2 | - | - | - | - | - | 42.0 / 30.0 |" in table


def test_a_file_that_is_not_a_bench_json_is_named_in_one_line(tmp_path):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(_bench([8.0])))
    bad.write_text(json.dumps({"workload": "w"}))
    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_table.py"), str(good), str(bad),
                           "--json", str(out)], capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr.strip().count("\n") == 0
    assert proc.stderr.startswith(f"{bad}: not a `conjugate bench --json` file (KeyError")
    assert not out.exists()
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_table.py"), str(good), "--json", str(out),
                           "--note", "H200"], capture_output=True, text=True)
    assert proc.returncode == 0 and json.loads(out.read_text())["note"] == "H200"
