"""benchmarks/: every script its README names exists, and each suite script answers --help from a checkout."""
from __future__ import annotations

import json
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


# Runs each script given as `python SCRIPT --help` would (as __main__, its folder first on sys.path), in one
# process: Python and torch start once for the suite, not once a script.
HELP = """
import contextlib, io, json, os, runpy, sys
answers, path0 = {}, sys.path[0]
for script in sys.argv[1:]:
    sys.argv, sys.path[0] = [script, "--help"], os.path.dirname(script)
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            code = e.code
        except BaseException as e:
            code = repr(e)
    answers[script] = {"code": code, "out": out.getvalue(), "err": err.getvalue()}
sys.path[0] = path0
print(json.dumps(answers))
"""


@pytest.fixture(scope="module")
def help_answers(tmp_path_factory) -> dict:
    scripts = [str(BENCHMARKS / f"{script}.py") for script in SUITE]
    proc = subprocess.run([sys.executable, "-c", HELP, *scripts], cwd=tmp_path_factory.mktemp("help"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {Path(script).stem: answer for script, answer in json.loads(proc.stdout.splitlines()[-1]).items()}


@pytest.mark.parametrize("script", SUITE)
def test_a_suite_script_answers_help(script, help_answers):
    answer = help_answers[script]
    assert answer["code"] in (0, None), answer["err"][-2000:]
    assert "--json" in answer["out"]
