"""Hostile command lines: an output path that is one of the command's inputs, empty, a pipe or under a
file; names that would send escape sequences to the terminal; a GPU profile where no GPU is. Each
ends in one `error:` line (exit 2) before any work, and no file is written or changed. (Bad input
files: tests/test_faults_inputs.py.)"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conjugate.cli import main
from conjugate.evaluate.evaluators import load_profile
from conjugate.evaluate.worker import IsolatedEvaluator
from scripts import run_script  # tests/scripts.py
from test_cli import INTERLEAVE, REPO, TINY, assert_one_line_error, run

FAST_TEXT = (REPO / "evaluators" / "analytical.toml").read_text().replace("max_params = 5000000", "max_params = 0")
ESCAPE = "\x1b]0;pwned\x07"  # sets a terminal's title
TOML_ESCAPE = "\\u001b]0;pwned\\u0007"  # the same in a TOML string


@pytest.fixture
def no_evaluation(monkeypatch):
    """Any evaluation started fails the test: every refusal comes before the work."""
    def started(self):
        raise AssertionError("the evaluator started before the command line was refused")

    monkeypatch.setattr(IsolatedEvaluator, "__enter__", started)


@pytest.fixture
def inputs(tmp_path) -> dict[str, Path]:
    """Copies of a workload, a plan and a fast evaluator profile, which the commands must not change."""
    files = {"workload": tmp_path / "w.toml", "plan": tmp_path / "p.json", "profile": tmp_path / "e.toml"}
    shutil.copy(TINY, files["workload"])
    shutil.copy(INTERLEAVE, files["plan"])
    files["profile"].write_text(FAST_TEXT)
    return files


def unchanged(files: dict[str, Path]) -> dict[str, bytes]:
    return {name: path.read_bytes() for name, path in files.items()}


def bench(files: dict[str, Path], *extra) -> list:
    return ["bench", files["workload"], "--plan", files["plan"], "--evaluator", files["profile"], *extra]


def explain(files: dict[str, Path], *extra) -> list:
    return ["plan", "explain", files["plan"], "--workload", files["workload"], *extra]


# -- an output that is an input ------------------------------------------------------------------

@pytest.mark.parametrize("command,output", [
    (bench, "workload"), (bench, "plan"), (bench, "profile"), (bench, "link to workload"), (explain, "plan"),
    (explain, "workload"),
])
def test_an_output_that_is_an_input_is_refused_before_any_work(command, output, inputs, no_evaluation, capsys):
    if output.startswith("link to "):
        output = inputs["workload"].parent / "link.toml"
        output.symlink_to(inputs["workload"].name)
        shown = str(inputs["workload"])
    else:
        output = shown = inputs[output]
    before = unchanged(inputs)
    code, out, err = run(capsys, *command(inputs, "--json", output))
    assert_one_line_error(code, err, f"--json {output}: would overwrite {shown}")
    assert unchanged(inputs) == before and out == ""


def test_compile_refuses_a_folder_whose_manifest_is_its_plan(inputs, tmp_path, capsys):
    plan = tmp_path / "out" / "manifest.json"
    plan.parent.mkdir()
    shutil.copy(inputs["plan"], plan)
    code, _, err = run(capsys, "plan", "compile", plan, "--workload", inputs["workload"], "--out", plan.parent)
    assert_one_line_error(code, err, f"--out {plan.parent}", "manifest.json would overwrite", str(plan))
    assert os.listdir(plan.parent) == ["manifest.json"] and plan.read_bytes() == inputs["plan"].read_bytes()


@pytest.fixture(scope="module")
def good_db(tmp_path_factory):
    """A search run of two evaluations, the fast profile's."""
    root = tmp_path_factory.mktemp("hostile")
    (root / "fast.toml").write_text(FAST_TEXT)
    assert main(["search", str(TINY), "--db", str(root / "good.db"), "--budget", "2", "--evaluator",
                 str(root / "fast.toml")]) == 0
    return root / "good.db"


@pytest.mark.parametrize("as_name,url", [("best_plan.json", False), ("report.md", True), ("workload.toml", False)])
def test_export_refuses_a_folder_where_a_file_it_writes_is_one_it_reads(good_db, tmp_path, as_name, url, capsys):
    """The database as one of the files written (also named by a sqlite URL), or --workload as the
    workload.toml an export writes or removes."""
    out = tmp_path / "export"
    out.mkdir()
    db, extra = good_db, []
    if as_name == "workload.toml":
        shutil.copy(TINY, out / as_name)
        extra = ["--workload", out / as_name]
    else:
        db = out / as_name
        shutil.copy(good_db, db)
    before = (out / as_name).read_bytes()
    code, _, err = run(capsys, "export", f"sqlite:///{db}" if url else db, "--out", out, *extra)
    assert_one_line_error(code, err, f"--out {out}", f"its {as_name} would overwrite", str(out / as_name))
    assert os.listdir(out) == [as_name] and (out / as_name).read_bytes() == before


# -- empty, missing, misplaced and unwritable outputs ---------------------------------------------

@pytest.mark.parametrize("argv", [
    ["plan", "compile", INTERLEAVE, "--workload", TINY, "--out", ""],
    ["plan", "explain", INTERLEAVE, "--workload", TINY, "--json", ""],
    ["bench", TINY, "--plan", "sequential", "--json", ""],
    ["calibrate", "--from", "m.json", "--out", ""],
    ["generate", TINY, "--prompt-ids", "1,2", "--json", ""],
], ids=["compile", "explain", "bench", "calibrate", "generate"])
def test_an_empty_output_path_is_refused(argv, tmp_path, monkeypatch, no_evaluation, capsys):
    monkeypatch.chdir(tmp_path)  # where Path("") would write
    code, _, err = run(capsys, *argv)
    option = "--out" if "--out" in argv else "--json"
    assert_one_line_error(code, err, f"{option}: an empty path")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("where,fragment", [
    ("file/out.json", "file is a file, not a folder"),
    ("missing/out.json", "its folder missing does not exist"),
    ("folder", "a directory, not a file"),
])
@pytest.mark.parametrize("command", [
    ["plan", "explain", INTERLEAVE, "--workload", TINY, "--json"],
    ["bench", TINY, "--plan", "sequential", "--json"],
    ["profile", TINY, "--json"],
    ["generate", TINY, "--prompt-ids", "1,2", "--json"],
    ["calibrate", "--from", "m.json", "--out"],
], ids=["explain", "bench", "profile", "generate", "calibrate"])
def test_an_output_path_that_cannot_be_a_file_is_one_line(command, where, fragment, tmp_path, monkeypatch,
                                                         no_evaluation, capsys):
    monkeypatch.chdir(tmp_path)
    Path("file").write_text("kept")
    Path("folder").mkdir()
    code, _, err = run(capsys, *command, where)
    assert_one_line_error(code, err, f"{command[-1]} {where}: {fragment}")
    assert sorted(os.listdir()) == ["file", "folder"] and Path("file").read_text() == "kept"


def test_an_output_folder_under_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("kept")
    for out in (tmp_path / "file", tmp_path / "file" / "kernels"):
        code, _, err = run(capsys, "plan", "compile", INTERLEAVE, "--workload", TINY, "--out", out)
        assert_one_line_error(code, err, f"--out {out}", "a file, not a folder")
    assert os.listdir(tmp_path) == ["file"]


def test_a_pipe_as_output_is_refused_not_waited_on(tmp_path):
    """A FIFO without a reader would block the writer for ever (after the whole bench)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    proc = subprocess.run([sys.executable, "-m", "conjugate", "bench", str(TINY), "--plan", "sequential",
                           "--json", str(fifo)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert_one_line_error(proc.returncode, proc.stderr, f"--json {fifo}", "not a regular file")
    assert proc.stdout == ""


def test_a_character_device_stays_a_valid_output(capsys):
    code, _, err = run(capsys, "plan", "explain", INTERLEAVE, "--workload", TINY, "--json", os.devnull)
    assert code == 0 and err == ""


# -- what reaches the terminal ---------------------------------------------------------------------

@pytest.mark.parametrize("field", ["plan name", "profile name", "profile gpu"])
def test_bench_refuses_names_that_would_reach_the_terminal_as_escapes(field, inputs, no_evaluation, capsys):
    if field == "plan name":
        named = inputs["plan"], "$.name"
        inputs["plan"].write_text(json.dumps(json.loads(inputs["plan"].read_text()) | {"name": ESCAPE}))
    else:
        key = field.split()[1]  # name, or the gpu that the title says plans are modeled for
        named = inputs["profile"], f"field '{key}'"
        text = inputs["profile"].read_text()
        inputs["profile"].write_text(text.replace(f'{key} = "', f'{key} = "{TOML_ESCAPE}', 1))
    code, out, err = run(capsys, *bench(inputs))
    assert_one_line_error(code, err, str(named[0]), named[1], "printable")
    assert "\x1b" not in out + err and "\x07" not in out + err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_gpu_profile_without_a_gpu_names_the_profile_file(no_evaluation, capsys):
    code, out, err = run(capsys, "bench", TINY, "--evaluator", "h200")
    assert_one_line_error(code, err, str(REPO / "evaluators" / "h200.toml"), "kind 'gpu'", "no CUDA device")
    assert out == ""


def test_a_profile_may_leave_the_baselines_out(tmp_path):
    """`baselines = []` times plans alone (benchmarks/README.md), so it stays valid; a repeat does not."""
    path = tmp_path / "alone.toml"
    path.write_text((REPO / "evaluators" / "h200.toml").read_text().replace(
        'baselines = ["conventional", "sequential", "streams"]', "baselines = []"))
    assert load_profile(path).timing.baselines == ()


# -- benchmark scripts: a --json path that cannot take the result, refused before the measurements

@pytest.mark.parametrize("script", ["searchers", "floor", "baselines", "kernel_sweep"])
def test_a_benchmark_s_json_path_is_checked_before_its_work(script, tmp_path, monkeypatch):
    """Run as a program once; the other bad paths run in this process (tests/scripts.py), the same program
    without starting Python and torch again for each."""
    (tmp_path / "taken").write_text("a file where a folder should be")
    monkeypatch.chdir(tmp_path)
    for i, (path, fragment) in enumerate(((tmp_path / "missing" / "out.json", "does not exist"),
                                          (tmp_path, "a directory"),
                                          (tmp_path / "taken" / "out.json", "is a file, not a folder"))):
        proc = run_script(script, "--json", path) if i else subprocess.run(
            [sys.executable, str(REPO / "benchmarks" / f"{script}.py"), "--json", str(path)], cwd=tmp_path,
            capture_output=True, text=True, timeout=120)
        last = proc.stderr.strip().splitlines()[-1]
        assert proc.returncode == 2 and "argument --json" in last and fragment in last, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "missing").exists()
