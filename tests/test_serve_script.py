"""benchmarks/serve.py from a checkout, on the CPU: the tiny workload under `--plan conventional`
(each model run by torch, so no kernels are interpreted), driven by the official openai client; what
is checked is the plumbing of a run and of `--resume`."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "serve.py"
ARGS = ["--workloads", "tiny", "--plans", "conventional", "--temperatures", "0", "--requests", "1",
        "--max-tokens", "4"]


def serve(tmp_path, *extra, timeout=300):
    return subprocess.run([sys.executable, str(SCRIPT), *ARGS, "--logs", str(tmp_path / "logs"), *extra],
                          cwd=tmp_path, capture_output=True, text=True, timeout=timeout)


def cut_short(tmp_path, runs, settings=None, gpu=None) -> Path:
    path = tmp_path / "cut.json"
    path.write_text(json.dumps({"command": "python benchmarks/serve.py --json cut.json", "gpu": gpu,
                                "code": "abc1234", "date": "2026-12-05",
                                "settings": settings or {"requests": 1, "max_tokens": 4}, "runs": runs}))
    return path


def row(clients: int, tokens_per_s: float) -> dict:
    return {"workload": "tiny", "plan": "conventional", "clients": clients, "temperature": 0.0, "requests": clients,
            "output_tokens": 4 * clients, "seconds": 1.0, "output_tokens_per_s": tokens_per_s,
            "ttft_ms_median": 50.0, "ttft_ms_p90": 60.0, "acceptance": 0.0}


def test_resume_measures_only_what_a_cut_short_run_left(tmp_path):
    out = tmp_path / "serve.json"
    proc = serve(tmp_path, "--clients", "1", "2", "--resume", str(cut_short(tmp_path, [row(1, 123.0)])),
                 "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    kept, measured = result["runs"]
    assert kept["output_tokens_per_s"] == 123.0 and kept["measured_by"]["code"] == "abc1234"
    assert measured["clients"] == 2 and measured["output_tokens"] == 8 and "measured_by" not in measured
    assert measured["output_tokens_per_s"] > 0 and result["settings"] == {"requests": 1, "max_tokens": 4}


def test_each_mode_gets_a_server_of_its_own_and_rows_that_name_it(tmp_path):
    out = tmp_path / "serve.json"
    proc = serve(tmp_path, "--clients", "1", "--modes", "simple", "pipelined", "--resume",
                 str(cut_short(tmp_path, [row(1, 5.0)])), "--json", str(out))  # the cut row: pipelined (no mode)
    assert proc.returncode == 0, proc.stderr[-2000:]
    simple, kept = json.loads(out.read_text())["runs"]
    assert simple["mode"] == "simple" and simple["output_tokens"] == 4 and "measured_by" not in simple
    assert kept["output_tokens_per_s"] == 5.0 and "measured_by" in kept
    assert [p.name for p in (tmp_path / "logs").glob("*.log")] == ["tiny-conventional-simple.log"]
    assert "simple" in (tmp_path / "logs" / "tiny-conventional-simple.log").read_text()


def test_resume_with_nothing_missing_starts_no_server(tmp_path):
    out = tmp_path / "serve.json"
    proc = serve(tmp_path, "--clients", "1", "--resume", str(cut_short(tmp_path, [row(1, 7.0)])), "--json", str(out),
                 timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [r["output_tokens_per_s"] for r in json.loads(out.read_text())["runs"]] == [7.0]
    assert not list((tmp_path / "logs").glob("*.log"))


@pytest.mark.parametrize("settings, gpu", [({"requests": 4, "max_tokens": 4}, None),
                                           ({"requests": 1, "max_tokens": 4}, "NVIDIA H200")])
def test_resume_refuses_another_gpu_or_other_settings(tmp_path, settings, gpu):
    proc = serve(tmp_path, "--clients", "1", "--resume", str(cut_short(tmp_path, [row(1, 7.0)], settings, gpu)),
                 "--json", str(tmp_path / "o.json"), timeout=120)
    assert proc.returncode != 0 and "--resume" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "o.json").exists()
