"""benchmarks/compiler_rounds.py: evaluator result files joined without measuring, and the options
that only make sense together refused before any work."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "compiler_rounds.py"


def _part(workload: str, ms: list[float], gpu: str = "NVIDIA H200") -> dict:
    plans = [{"plan": p, "median_ms": m, "modeled_ms": m * 0.9, "floor_ratio": m / 5.0, "speedups": {"sequential": ms[0] / m},
              "verdict_counts": {}} for p, m in zip(("sequential", "streams"), ms)]
    return {"gpu": gpu, "torch": "2.11", "evaluator": "h200", "command": f"python benchmarks/compiler_rounds.py {workload}",
            "workloads": [{"workload": workload, "plans": plans, "spearman": 1.0}]}


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_merge_joins_parts_measured_side_by_side(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(_part("llama-1b-8b-b1", [9.0, 7.0])))
    (tmp_path / "b.json").write_text(json.dumps(_part("qwen3-06b-8b-b4", [12.0, 9.5])))
    proc = _run("--merge", "a.json", "b.json", "--json", "out.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert [w["workload"] for w in out["workloads"]] == ["llama-1b-8b-b1", "qwen3-06b-8b-b4"]
    assert len(out["commands"]) == 2 and out["spearman_pooled"] == 1.0


def test_merge_refuses_parts_of_two_gpu_models(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(_part("llama-1b-8b-b1", [9.0, 7.0])))
    (tmp_path / "b.json").write_text(json.dumps(_part("qwen3-06b-8b-b4", [12.0, 9.5], gpu="NVIDIA H100")))
    proc = _run("--merge", "a.json", "b.json", "--json", "out.json", cwd=tmp_path)
    assert proc.returncode != 0 and "gpu" in proc.stderr and not (tmp_path / "out.json").exists()


def test_options_that_need_another_are_refused_before_any_work(tmp_path):
    for args in (("--merge", "a.json", "--evaluator", "h200"), ("--append",)):
        proc = _run(*args, cwd=tmp_path)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
