"""benchmarks/baselines.py --merge joins runs measured in separate calls into one results file."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _row(name: str, **extra) -> dict:
    return {"workload": name, "variants": {"draft": "whole-sdpa", "verify": "whole-split"}, "conventional_ms": 9.9,
            "conventional_streams_ms": 8.2, "probe_ms": None, "repeat_spread_pct": 0.1, **extra}


def _run(tmp_path: Path, name: str, gpu: str, rows: list[dict]) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"gpu": gpu, "torch": "2.11", "date": "2026-12-01", "command": f"run {name}",
                                "workloads": rows}))
    return path


def _merge(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "baselines.py"), "--merge", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_runs_are_joined_in_order_without_their_cut_short_rows(tmp_path):
    a = _run(tmp_path, "a", "NVIDIA H200", [_row("llama-1b-8b-b8", process_spread_pct=0.13)])
    b = _run(tmp_path, "b", "NVIDIA H200", [_row("llama-1b-8b-b1"), {"workload": "qwen3-06b-8b-b4", "partial": True,
                                                                       "trials": []}])
    out = tmp_path / "joined.json"
    done = _merge(a, b, "--json", out)
    assert done.returncode == 0, done.stderr
    joined = json.loads(out.read_text())
    assert [w["workload"] for w in joined["workloads"]] == ["llama-1b-8b-b8", "llama-1b-8b-b1"]
    assert joined["commands"] == ["run a", "run b"] and joined["gpu"] == "NVIDIA H200"
    assert "llama-1b-8b-b1" in done.stdout and "qwen3" not in done.stdout


def test_runs_from_different_gpus_are_not_joined(tmp_path):
    a = _run(tmp_path, "a", "NVIDIA H200", [_row("llama-1b-8b-b8")])
    b = _run(tmp_path, "b", "NVIDIA B300", [_row("llama-1b-8b-b1")])
    done = _merge(a, b, "--json", tmp_path / "joined.json")
    assert done.returncode != 0 and "different GPUs" in done.stderr
    assert not (tmp_path / "joined.json").exists()
