"""lab/experiments/phases.py: each model's phase alone against its byte floor, from profile ledgers."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from experiment_scripts import load_script  # lab/experiments/tests/experiment_scripts.py

ROOT = Path(__file__).resolve().parents[3]


def _ledger(path: Path, launches: list[tuple[str, float, int]]) -> Path:
    path.write_text(json.dumps({"workload": "w", "plan": "best-phases-apart", "ledger": {
        "round_us": 3000.0, "copy_gbs": 4000.0,
        "launches": [{"kind": k, "us": us, "bytes": b, "stream": "one"} for k, us, b in launches]}}))
    return path


def test_each_phase_sums_its_own_launches_against_their_bytes(tmp_path):
    # draft: 2 launches, 1500 us over 4 MB (1.0 ms at 4000 GB/s); target: 1200 us over 4 MB
    path = _ledger(tmp_path / "a.json", [("draft qkv", 500.0, 2_000_000_000 // 1000), ("draft attn", 1000.0, 2_000_000),
                                         ("target gate_up", 1200.0, 4_000_000)])
    row = load_script("phases").phases(path)
    assert row["draft"]["launches"] == 2 and row["draft"]["ms"] == pytest.approx(1.5)
    assert row["draft"]["floor_ms"] == pytest.approx(0.001) and row["draft"]["ratio"] == pytest.approx(1500)
    assert row["target"]["floor_ms"] == pytest.approx(0.001) and row["target"]["ms"] == pytest.approx(1.2)
    assert row["round_ms"] == pytest.approx(3.0) and row["target"]["aim"] == 1.15


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "lab" / "experiments" / "phases.py"), *args],
                          capture_output=True, text=True)


def test_a_shared_launch_and_a_file_that_is_no_ledger_are_refused_in_one_line(tmp_path):
    shared = _ledger(tmp_path / "s.json", [("target gate_up + draft qkv", 10.0, 100)])
    proc = _run(str(shared))
    assert proc.returncode == 1 and "holds both models' ops" in proc.stderr and len(proc.stderr.splitlines()) == 1
    bad = tmp_path / "b.json"
    bad.write_text('{"ledger": {}}')
    proc = _run(str(bad))
    assert proc.returncode == 1 and f"{bad}: not a `conjugate profile --json` ledger" in proc.stderr


def test_the_table_and_json_are_written(tmp_path):
    path = _ledger(tmp_path / "a.json", [("draft qkv", 400.0, 800_000), ("target down", 600.0, 2_000_000)])
    proc = _run(str(path), "--json", str(tmp_path / "out.json"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1].split()[:2] == ["w", "0.400"]
    rows = json.loads((tmp_path / "out.json").read_text())["phases"]
    assert rows[0]["draft"]["ratio"] == pytest.approx(0.4 / 0.0002)
