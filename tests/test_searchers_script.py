"""benchmarks/searchers.py on the CPU (the analytical evaluator, the tiny workload with one sequence
drafting one token): an interrupt mid-search leaves the run stopped, and --resume (with
--carry-baselines: nothing measured to carry) takes it on to a larger budget."""
from __future__ import annotations

import json
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "searchers.py"
TINY = ROOT / "examples" / "tiny.toml"


def _small(folder: Path) -> Path:
    """tiny.toml with one sequence drafting one token: each round checked in a few seconds, not ten. (Not
    modeled only: a search of instant evaluations spends its time in its own code rather than waiting on
    its worker, and there the interrupt was seen lost, once in some 40 runs.)"""
    path = folder / "workload" / "tiny.toml"
    if not path.exists():
        path.parent.mkdir()
        path.write_text(re.sub(r"(?m)^(k|draft_batch|target_batch) = .*$", r"\1 = 1", TINY.read_text()))
    return path


def _searchers(out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(_small(out)), "--agents", "heuristic", "--evaluator",
                           "analytical", "--out", str(out), *extra], capture_output=True, text=True, timeout=600)


def test_an_interrupt_mid_search_leaves_the_run_stopped_and_resumable(tmp_path):
    proc = subprocess.Popen([sys.executable, str(SCRIPT), str(_small(tmp_path)), "--agents", "heuristic",
                             "--evaluator", "analytical", "--out", str(tmp_path), "--budget", "30"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    db = tmp_path / "tiny_heuristic.db"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        time.sleep(0.05)
        try:
            with sqlite3.connect(db) as c:
                if c.execute("SELECT count(*) FROM evaluations WHERE status = 'done'").fetchone()[0] >= 1:
                    break
        except sqlite3.OperationalError:  # not created yet
            pass
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert err.strip().splitlines()[-1].startswith("tiny heuristic: interrupted after ")
    assert err.strip().endswith(f"evaluations; --resume continues it from {db}")
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT status FROM runs").fetchall() == [("stopped",)]
        settled = c.execute("SELECT count(*) FROM nodes WHERE status != 'new'").fetchone()[0]
    again = _searchers(tmp_path, "--budget", str(settled + 1), "--resume", "--carry-baselines",
                       "--json", str(tmp_path / "b.json"))
    assert again.returncode == 0, again.stderr
    run = json.loads((tmp_path / "b.json").read_text())["workloads"][0]["runs"][0]
    assert run["settled"] == settled + 1 and run["complete"] and len(run["best_so_far_ms"]) == run["evaluations"]
