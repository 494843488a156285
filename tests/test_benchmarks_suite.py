"""benchmarks/: every script its README names exists, and each suite script answers --help from a checkout."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
SUITE = sorted(p.stem for p in BENCHMARKS.glob("*.py") if p.stem != "common")


def test_every_script_the_readme_names_exists():
    text = (BENCHMARKS / "README.md").read_text()
    named = set(re.findall(r"\b((?:benchmarks|lab/experiments)/[\w/]+\.py)\b", text))
    assert {f"benchmarks/{s}.py" for s in SUITE} <= named  # the README gives a command for each
    assert [path for path in sorted(named) if not (ROOT / path).is_file()] == []


def test_every_json_the_readme_cites_is_committed():
    text = (BENCHMARKS / "README.md").read_text()
    cited = set(re.findall(r"\bresults/[\w./-]+\.json\b", text))
    assert cited and [path for path in sorted(cited) if not (BENCHMARKS / path).is_file()] == []


@pytest.fixture(scope="module")
def help_answers(tmp_path_factory) -> dict[str, dict]:
    """Each script's answer to --help, as the program gives it (tests/scripts.py), all in one fresh Python
    process started in a folder outside the checkout: Python and torch start once, not once a script."""
    answer = "import json, sys; from scripts import run_script; print(json.dumps({s: vars(run_script(s, '--help')) " \
             "for s in sys.argv[1:]}))"
    proc = subprocess.run([sys.executable, "-c", answer, *SUITE], cwd=tmp_path_factory.mktemp("help"),
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get(
                              "PYTHONPATH", "")])}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("script", SUITE)
def test_a_suite_script_answers_help(script, help_answers):
    answer = help_answers[script]
    assert answer["returncode"] == 0, answer["stderr"][-2000:]
    assert "--json" in answer["stdout"]


GPU_ONLY = {"draft_step": [ROOT / "examples" / "llama-1b-8b-b1.toml"], "compiler_rounds": [],
            "streamed_checks": [], "step_checks": [], "baselines": [],
            "kernel_sweep": [ROOT / "examples" / "llama-1b-8b-b1.toml"],
            "verify_kernels": [ROOT / "examples" / "llama-1b-8b-b1.toml"]}


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="with a GPU the scripts would measure")
@pytest.mark.parametrize("script", sorted(GPU_ONLY))
def test_a_gpu_script_on_a_machine_without_one_says_so_in_one_line(script, tmp_path):
    from scripts import run_script

    out = tmp_path / "out.json"
    proc = run_script(script, *GPU_ONLY[script], "--json", out)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-500:]
    assert "GPU" in proc.stderr.strip().splitlines()[-1]
    assert not out.exists()


def test_step_checks_refuses_a_launch_option_it_does_not_know_in_one_line(tmp_path):
    """--launch takes StepLaunch's tuning options only, checked before anything runs."""
    from scripts import run_script

    out = tmp_path / "out.json"
    for bad in ("ring_kv", "ring=1", "ring_kv=yes"):
        proc = run_script("step_checks", "--launch", bad, "--json", out)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-500:]
        assert "--launch" in proc.stderr.strip().splitlines()[-1] and bad in proc.stderr
    assert not out.exists()
