"""benchmarks/eval_time.py: reading back a search's evaluations, and naming a database that is not there."""
from __future__ import annotations

import subprocess
from pathlib import Path

from scripts import load_script  # tests/scripts.py

ROOT = Path(__file__).resolve().parents[1]


def _script():
    return load_script("eval_time")


def test_read_names_a_database_that_is_not_there(tmp_path):
    result = subprocess.run(["python", str(ROOT / "benchmarks" / "eval_time.py"), str(ROOT / "examples" / "tiny.toml"),
                             "--evaluators", "analytical", "--read", "--out", str(tmp_path)],
                            capture_output=True, text=True)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == f"{tmp_path / 'tiny_analytical.db'}: no such database to read back"


def test_a_run_read_back_has_no_search_seconds():
    rows = [{"wall_s": 30.0, "seconds": {"check": 29.0}, "replays": 50, "latency_ms": 2.0, "proposer": "seed",
             "rationale": "baseline: draft phase, then verify phase", "node": 1, "floor_ms": 1.0, "speedups": {},
             "baselines": {"sequential": 2.0}, "variants": {}},
            {"wall_s": 3.0, "seconds": {"check": 2.0}, "replays": 60, "latency_ms": 1.5, "proposer": "heuristic",
             "rationale": "an edit", "node": 2, "floor_ms": 1.0, "speedups": {}, "baselines": {}, "variants": {}}]
    summary = _script().summary(rows, None)
    assert summary["search_s"] is None
    assert (summary["first_eval_s"], summary["eval_seconds_median"], summary["best_node"]) == (30.0, 3.0, 2)
