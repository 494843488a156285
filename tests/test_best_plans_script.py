"""benchmarks/best_plans.py from a checkout, on the CPU: the analytical evaluator stands in for the
GPU's, so the rows are modeled; what is checked is the plumbing (one bench process per workload, its
two plans read back, the comparison with floor_h200.json, the exit status) and the refusals."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "best_plans.py"


def test_a_workload_is_benched_beside_streams_and_compared_with_its_recorded_figures(tmp_path):
    out = tmp_path / "best.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--workloads", "llama-1b-8b-b1", "--evaluator", "analytical",
                           "--tolerance", "0.2", "--json", str(out), "--logs", str(tmp_path / "logs")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=240)
    result = json.loads(out.read_text())
    recorded = next(w for w in json.loads((ROOT / "benchmarks/results/floor_h200.json").read_text())["workloads"]
                    if w["workload"] == "llama-1b-8b-b1")
    [row] = result["rows"]
    assert row["status"] == {"streams": "ok", "best": "ok"}, (tmp_path / "logs" / "llama-1b-8b-b1.log").read_text()
    assert row["best_ms"] > 0 and row["streams_ms"] > 0 and row["best_ms"] != row["streams_ms"]
    assert row["recorded_best_ms"] == recorded["best_ms"] and row["recorded_streams_ms"] == recorded["streams_ms"]
    assert row["best_over_recorded"] == row["best_ms"] / recorded["best_ms"]
    assert row["within"] == (abs(row["best_over_recorded"] - 1) <= 0.2)
    assert proc.returncode == (0 if row["within"] else 1), proc.stderr
    assert result["command"].startswith("python benchmarks/best_plans.py --workloads llama-1b-8b-b1")
    assert proc.stdout.splitlines()[-1].startswith("llama-1b-8b-b1 ")  # the table comes last


def test_an_unknown_workload_is_refused_before_any_work(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--workloads", "nope", "--json", str(tmp_path / "o.json")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "--workloads" in proc.stderr and "nope" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "o.json").exists()


def cut_short_run(tmp_path, gpu=None, evaluator="analytical") -> Path:
    """A best_plans.py result as a run cut short leaves it: one measured row, one that failed."""
    measured = {"workload": "llama-1b-8b-b1", "best_ms": 6.8, "streams_ms": 7.1, "recorded_best_ms": 6.703,
                "recorded_streams_ms": 7.076, "best_over_recorded": 6.8 / 6.703, "streams_over_recorded": 7.1 / 7.076,
                "within": True, "status": {"streams": "ok", "best": "ok"}}
    failed = dict(measured, workload="llama-1b-8b-b8", best_ms=None, best_over_recorded=None, within=False,
                  status={"streams": "ok", "best": "error"})
    path = tmp_path / "cut.json"
    path.write_text(json.dumps({"command": "python benchmarks/best_plans.py --json cut.json", "gpu": gpu,
                                "code": "abc1234", "date": "2026-12-05", "evaluator": evaluator,
                                "tolerance": 0.01, "rows": [measured, failed]}))
    return path


def test_resume_keeps_the_measured_rows_of_a_cut_short_run_with_their_provenance(tmp_path):
    out = tmp_path / "best.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--workloads", "llama-1b-8b-b1", "--evaluator", "analytical",
                           "--tolerance", "0.001", "--resume", str(cut_short_run(tmp_path)), "--json", str(out),
                           "--logs", str(tmp_path / "logs")], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    [row] = json.loads(out.read_text())["rows"]
    assert row["best_ms"] == 6.8 and row["measured_by"] == {
        "command": "python benchmarks/best_plans.py --json cut.json", "code": "abc1234", "date": "2026-12-05"}
    assert row["within"] is False and proc.returncode == 1  # 1.4% off: outside this run's tolerance
    assert not (tmp_path / "logs" / "llama-1b-8b-b1.log").exists()  # nothing was benched again


def test_resume_refuses_a_run_from_another_gpu_or_evaluator(tmp_path):
    for partial in (cut_short_run(tmp_path, gpu="NVIDIA H100 80GB HBM3"), cut_short_run(tmp_path, evaluator="h200")):
        proc = subprocess.run([sys.executable, str(SCRIPT), "--workloads", "llama-1b-8b-b1", "--evaluator",
                               "analytical", "--resume", str(partial), "--json", str(tmp_path / "o.json")],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode != 0 and "--resume" in proc.stderr and "Traceback" not in proc.stderr
        assert not (tmp_path / "o.json").exists()
