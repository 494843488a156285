"""The `conjugate` command line: in-process through conjugate.cli.main, and once as a subprocess."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from conjugate.cli import main
from conjugate.graph import build_graph
from conjugate.models.presets import PRESETS
from conjugate.workload import load_workload

REPO = Path(__file__).resolve().parents[1]
PLANS = REPO / "plans"
EXAMPLES = REPO / "examples"
INTERLEAVE = PLANS / "interleave.json"
TINY = EXAMPLES / "tiny.toml"
SHIPPED = ("interleave", "sequential", "streams")

def torch_cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


TINY_FIELDS = ('k = 3\ndraft_batch = 2\ntarget_batch = 2\ncontext = 16\ndtype = "fp32"\n')


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    """Rich sizes tables to the terminal under `pytest -s`; keep op ids from wrapping."""
    import conjugate.cli

    monkeypatch.setattr(conjugate.cli.out, "width", 200)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code: int, err: str, *fragments: str) -> str:
    assert code == 2
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error:")
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def interleave_plan() -> dict:
    return json.loads(INTERLEAVE.read_text())


def write_json(path: Path, data) -> Path:
    path.write_text(json.dumps(data))
    return path


# ---------------------------------------------------------------------------------------------
# Good input


def test_help_subprocess(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "conjugate", "--help"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for command in ("check", "models", "plan"):
        assert command in proc.stdout
    assert "usage: conjugate" in proc.stdout


def test_models_lists_every_preset(capsys):
    code, out, err = run(capsys, "models")
    assert code == 0 and err == ""
    for name in PRESETS:
        assert name in out, name
    assert "llama3-rope" in out and "qk-norm" in out and "qkv-bias" in out


def test_plan_validate(capsys):
    code, out, err = run(capsys, "plan", "validate", INTERLEAVE, "--workload", TINY)
    assert code == 0, err
    assert out.startswith("ok")
    assert "'interleave'" in out and "tiny" in out and "launches" in out


@pytest.mark.parametrize("plan", SHIPPED)
def test_plan_validate_every_shipped_plan(capsys, plan):
    code, out, err = run(capsys, "plan", "validate", PLANS / f"{plan}.json", "--workload", TINY)
    assert code == 0, err
    assert "ok" in out and f"'{plan}'" in out


def test_plan_explain_table(capsys):
    code, out, err = run(capsys, "plan", "explain", INTERLEAVE, "--workload", TINY)
    assert code == 0, err
    assert "interleave on tiny" in out
    for op in ("t.l0.qkv", "t.l0.attn", "d.s0.l0.qkv", "t.embed"):
        assert op in out, op


def test_plan_explain_shows_a_rope_fused_qkv_tile_a_head_wide(capsys, tmp_path):
    """qkv+rope_kv runs whole heads: its BLOCK_N is not what runs, and the table says so."""
    plan = interleave_plan()
    plan["target"]["fusions"] = sorted(set(plan["target"]["fusions"]) | {"qkv+rope_kv"})
    plan["target"]["tiles"]["qkv"]["BLOCK_N"] = 32
    path = write_json(tmp_path / "plan.json", plan)
    code, out, err = run(capsys, "plan", "explain", path, "--workload", TINY)
    assert code == 0, err
    assert "N=head" in out
    from conjugate.cli.plan import _tile_as_run
    from conjugate.plan import expand, load_plan
    from conjugate.workload import load_workload

    parts = [p for launch in expand(load_plan(path), load_workload(TINY)).launches for p in launch.parts
             if p.kind == "qkv"]
    rope = [p for p in parts if "rope_kv" in p.fused]
    plain = [p for p in parts if "rope_kv" not in p.fused]
    assert rope and plain
    assert all("N=head" in _tile_as_run(p) and "N32" not in _tile_as_run(p) for p in rope)
    assert not any("N=head" in _tile_as_run(p) for p in plain)


@pytest.mark.parametrize("command", ["validate", "explain"])
def test_names_and_paths_are_printed_as_they_are_not_read_as_markup(capsys, tmp_path, command):
    """A "[/]" in a plan's name, a workload's name or a path is text (read as console markup, it
    ended the command in a traceback)."""
    folder = tmp_path / "x[" / "]y[bold]"
    folder.mkdir(parents=True)
    plan = json.loads(INTERLEAVE.read_text()) | {"name": "evil[/]x[/bold]"}
    (folder / "p[bold].json").write_text(json.dumps(plan))
    (folder / "w.toml").write_text(TINY.read_text().replace('name = "tiny"', 'name = "w[/]"'))
    code, out, err = run(capsys, "plan", command, folder / "p[bold].json", "--workload", folder / "w.toml")
    assert code == 0, err
    assert "evil[/]x[/bold]" in out and "w[/]" in out and "Traceback" not in err


def test_plan_explain_json(capsys, tmp_path):
    out_file = tmp_path / "schedule.json"
    code, out, err = run(capsys, "plan", "explain", INTERLEAVE, "--workload", TINY, "--json", out_file)
    assert code == 0, err
    assert "t.l0.qkv" in out
    schedule = json.loads(out_file.read_text())
    launches = schedule["launches"]
    assert launches
    assert [launch["index"] for launch in launches] == list(range(len(launches)))
    parts = [form_parts(launch["form"]) for launch in launches]
    counts = Counter(op for launch_parts in parts for part in launch_parts for op in part["ops"])
    assert counts and set(counts.values()) == {1}, [op for op, n in counts.items() if n != 1]
    assert set(counts) == set(build_graph(load_workload(TINY)).nodes)
    assert any([part["model"] for part in launch_parts] == ["target", "draft"] for launch_parts in parts)  # interleaved


def form_parts(form: dict) -> list[dict]:
    """A launch form's parts, as the schedule JSON writes them: One {kind, part}, or a pair (Split or
    Packed) {kind, target, draft, pattern, ratio}."""
    if form["kind"] == "one":
        assert set(form) == {"kind", "part"}, form
        return [form["part"]]
    assert form["kind"] in ("split", "packed") and {"target", "draft", "pattern", "ratio"} <= set(form), form
    return [form["target"], form["draft"]]


def test_check_default_workload(capsys):
    code, out, err = run(capsys, "check")
    assert code == 0, err
    assert "workload tiny" in out
    for plan in SHIPPED:
        assert plan in out, plan
    assert "reference round" in out
    assert "draft tokens" in out and "target tokens" in out
    assert "compiled round of 'interleave'" in out and "equals the reference round" in out


def test_check_unknown_plan(capsys):
    code, _, err = run(capsys, "check", "--plan", "nope")
    assert code == 2 and err.startswith("error: --plan: no shipped plan named 'nope'")


# ---------------------------------------------------------------------------------------------
# Bad plans: exit 2, one 'error:' line naming the file and the field


def test_malformed_plan_json(capsys, tmp_path):
    path = tmp_path / "plan.json"
    path.write_text('{"schema": "conjugate.plan/2", "name": }')
    code, _, err = run(capsys, "plan", "validate", path, "--workload", TINY)
    assert_one_line_error(code, err, str(path), "malformed JSON", "line 1")


def test_plan_unknown_key(capsys, tmp_path):
    plan = interleave_plan()
    plan["colour"] = "blue"
    path = write_json(tmp_path / "plan.json", plan)
    code, _, err = run(capsys, "plan", "validate", path, "--workload", TINY)
    assert_one_line_error(code, err, str(path), "$.colour", "unknown key")


def test_plan_tile_not_power_of_two(capsys, tmp_path):
    plan = interleave_plan()
    plan["target"]["tiles"]["qkv"]["BLOCK_N"] = 48
    path = write_json(tmp_path / "plan.json", plan)
    code, _, err = run(capsys, "plan", "explain", path, "--workload", TINY)
    assert_one_line_error(code, err, str(path), "$.target.tiles.qkv.BLOCK_N", "power of two", "48")


def test_plan_wrong_type(capsys, tmp_path):
    plan = interleave_plan()
    plan["draft"]["tiles"]["down"]["SPLIT_K"] = "2"
    path = write_json(tmp_path / "plan.json", plan)
    code, _, err = run(capsys, "plan", "validate", path, "--workload", TINY)
    assert_one_line_error(code, err, str(path), "$.draft.tiles.down.SPLIT_K", "integer")


def test_a_long_override_glob_is_refused_at_once(capsys, tmp_path):
    """Globbing costs the square of a pattern's length: a long one is refused before any glob runs."""
    plan = interleave_plan()
    plan["cross"]["overrides"] = [{"match": "[" * 50000, "pair": False}]
    path = write_json(tmp_path / "plan.json", plan)
    code, _, err = run(capsys, "plan", "validate", path, "--workload", TINY)
    line = assert_one_line_error(code, err, str(path), "$.cross.overrides[0].match", "50000 characters",
                                 "at most 200")
    assert len(line) < 400


def test_a_pipe_in_place_of_a_plan_is_refused_without_waiting_for_a_writer(tmp_path):
    pipe = tmp_path / "plan.json"
    os.mkfifo(pipe)
    proc = subprocess.run([sys.executable, "-m", "conjugate", "plan", "validate", str(pipe), "--workload", str(TINY)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert_one_line_error(proc.returncode, proc.stderr, str(pipe), "not a regular file")


@pytest.mark.parametrize("name,reason", [("loop", "ymlink loop"), ("a" * 5000, "File name too long")])
def test_a_checkpoint_path_that_cannot_resolve_names_the_workload_field(capsys, tmp_path, name, reason):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    workload = tmp_path / "w.toml"
    workload.write_text(f'draft = "{name}"\ntarget = "tiny-llama-t"\n' + TINY_FIELDS)
    code, _, err = run(capsys, "plan", "validate", INTERLEAVE, "--workload", workload)
    line = assert_one_line_error(code, err, str(workload), "field 'draft'", reason)
    assert len(line) < 400


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs a device that is always full")
def test_a_json_output_that_cannot_be_written_names_its_path(capsys):
    code, _, err = run(capsys, "plan", "explain", INTERLEAVE, "--workload", TINY, "--json", "/dev/full")
    assert_one_line_error(code, err, "/dev/full", "No space left")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="where a GPU is, check runs the round there")
def test_check_skips_rounds_whose_kv_caches_would_not_fit_a_cpu(capsys, tmp_path):
    """Tiny models, but context 131072 x batch 256: about 51 GB of caches, never allocated here."""
    from conjugate.evaluate.modeled import ModeledHarness
    from conjugate.evaluate.evaluators import load_profile
    from conjugate.evaluate.session import EvaluationSession
    from conjugate.workload import load_workload

    path = tmp_path / "w.toml"
    path.write_text('draft = "tiny-llama-d"\ntarget = "tiny-llama-t"\nk = 16\ndraft_batch = 256\n'
                    'target_batch = 256\ncontext = 131072\ndtype = "fp32"\n')
    code, out, err = run(capsys, "check", path, "--plan", "sequential")
    assert code == 0 and "rounds: skipped" in out and "KV caches" in out, err
    setup = ModeledHarness(load_profile("analytical"), tmp_path, EvaluationSession()).prepare(load_workload(path))
    assert setup.check is None and "KV caches of" in setup.skipped


def test_plan_several_errors_stay_on_one_line(capsys, tmp_path):
    plan = interleave_plan()
    plan["cross"]["alignment"] = "diagonal"
    plan["cross"]["capture"] = True
    plan["target"]["tiles"]["qkv"]["BLOCK_N"] = 48
    path = write_json(tmp_path / "plan.json", plan)
    code, _, err = run(capsys, "plan", "validate", path, "--workload", TINY)
    assert_one_line_error(code, err, str(path), "$.cross.alignment", "$.cross.capture", "$.target.tiles.qkv.BLOCK_N")


def test_missing_plan_file(capsys, tmp_path):
    path = tmp_path / "nope.json"
    code, _, err = run(capsys, "plan", "validate", path, "--workload", TINY)
    assert_one_line_error(code, err, str(path), "no such plan file")


def test_plan_path_is_a_directory(capsys, tmp_path):
    code, _, err = run(capsys, "plan", "validate", tmp_path, "--workload", TINY)
    assert_one_line_error(code, err, str(tmp_path))


def test_plan_not_utf8(capsys, tmp_path):
    path = tmp_path / "plan.json"
    path.write_bytes(b"\xff\xfe{}")
    code, _, err = run(capsys, "plan", "validate", path, "--workload", TINY)
    assert_one_line_error(code, err, str(path))


# ---------------------------------------------------------------------------------------------
# Bad workloads


def test_malformed_workload_toml(capsys, tmp_path):
    path = tmp_path / "w.toml"
    path.write_text('draft = "tiny-llama-d\n')
    code, _, err = run(capsys, "plan", "validate", INTERLEAVE, "--workload", path)
    assert_one_line_error(code, err, str(path), "malformed TOML")


def test_workload_draft_vocab_larger_than_target(capsys, tmp_path):
    path = tmp_path / "w.toml"
    path.write_text('draft = "tiny-qwen2-t"\ntarget = "tiny-qwen2-d"\n' + TINY_FIELDS)
    code, _, err = run(capsys, "check", path)
    assert_one_line_error(code, err, str(path), "'draft'", "272", "256")


def test_workload_wrong_type(capsys, tmp_path):
    path = tmp_path / "w.toml"
    path.write_text('draft = "tiny-llama-d"\ntarget = "tiny-llama-t"\n' + TINY_FIELDS.replace("k = 3", 'k = "3"'))
    code, _, err = run(capsys, "plan", "explain", INTERLEAVE, "--workload", path)
    assert_one_line_error(code, err, str(path), "'k'")


def test_workload_checkpoint_without_safetensors(capsys, tmp_path):
    ckpt = tmp_path / "ck"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 200, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "tie_word_embeddings": True}))
    path = tmp_path / "w.toml"
    path.write_text('draft = "ck"\ntarget = "tiny-llama-t"\n' + TINY_FIELDS)
    code, _, err = run(capsys, "plan", "validate", INTERLEAVE, "--workload", path)
    line = assert_one_line_error(code, err, str(path), "'draft'", "safetensors")
    assert str(ckpt) in line


def test_missing_workload_file(capsys, tmp_path):
    path = tmp_path / "nope.toml"
    code, _, err = run(capsys, "check", path)
    assert_one_line_error(code, err, str(path), "no such workload file")


def test_workload_path_is_a_directory(capsys, tmp_path):
    code, _, err = run(capsys, "check", tmp_path)
    assert_one_line_error(code, err, str(tmp_path))


# ---------------------------------------------------------------------------------------------
# Naming what ships: workloads, evaluator profiles, the version


def test_version(capsys):
    import conjugate

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.split() == ["conjugate", conjugate.__version__]


@pytest.mark.parametrize("name", ["tiny", "llama-1b-8b-b1"])
def test_a_shipped_workload_is_taken_by_name(capsys, name):
    code, out, err = run(capsys, "plan", "validate", INTERLEAVE, "--workload", name)
    assert code == 0, err
    assert f"on {load_workload(EXAMPLES / f'{name}.toml').name}:" in out


@pytest.mark.parametrize("argv", [["plan", "validate", str(INTERLEAVE), "--workload", "llama-1b-8b-b9"],
                                  ["search", "llama-1b-8b-b9"], ["bench", "llama-1b-8b-b9"], ["check", "no-such"],
                                  ["generate", "no-such"], ["profile", "no-such"],
                                  ["show", "runs.db", "--workload", "no-such"]])
def test_an_unknown_workload_name_lists_the_shipped_ones(capsys, argv):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1, err
    shipped = [p.stem for p in EXAMPLES.glob("*.toml")]
    assert argv[-1] in err and all(name in err for name in shipped)


def _options(parser):
    """(command, option) of every option of the parser and its subcommands, and its help text."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _options(sub)
        elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            yield parser.prog, action.dest, action.help


def test_every_option_has_help():
    from conjugate.cli.main import build_parser

    missing = [(prog, dest) for prog, dest, text in _options(build_parser()) if not text and dest != "command"]
    assert not missing


@pytest.mark.parametrize("command", ["search", "bench", "calibrate"])
def test_evaluator_help_lists_the_shipped_profiles(capsys, command):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())  # help lines wrap anywhere
    assert all(p.stem in text for p in (REPO / "evaluators").glob("*.toml"))


def test_an_unknown_evaluator_lists_the_shipped_profiles(capsys):
    code, _, err = run(capsys, "bench", "tiny", "--evaluator", "h100")
    assert_one_line_error(code, err, "--evaluator", "'h100'",
                          *(p.stem for p in (REPO / "evaluators").glob("*.toml")))


@pytest.mark.skipif(torch_cuda_available(), reason="a GPU profile runs where CUDA is")
def test_a_gpu_search_on_a_cpu_machine_is_refused_before_a_run_exists(capsys, tmp_path):
    db = tmp_path / "gpu.db"
    code, out, err = run(capsys, "search", "tiny", "--evaluator", "h200", "--db", db)
    assert_one_line_error(code, err, "h200.toml", "no CUDA device")
    assert not db.exists() and "resume" not in out


# ---------------------------------------------------------------------------------------------
# What export writes


def test_report_md_lists_verdicts_worst_first_and_says_how_many_it_leaves_out():
    from types import SimpleNamespace as Obj

    from conjugate.search.report import VERDICTS_SHOWN, _markdown

    gains = [(i * 37) % 50 - 25.0 for i in range(VERDICTS_SHOWN + 5)]  # shuffled, some below zero
    verdicts = [Obj(launch=i, parts=[Obj(label=f"d.l{i}.qkv"), Obj(label=f"t.l{i}.down")], verdict="x",
                    shared_us=1.0, separate_us=1.0, gain_percent=g) for i, g in enumerate(gains)]
    metrics = Obj(device="H200", p20_ms=None, latency_ms=1.0, floor_ratio=1.5, floor_ms=0.7, baselines={},
                  speedups={})
    text = _markdown(Obj(id=1, workload_name="w", evaluator="e", agent="a", seed=0),
                     {"node": 1, "depth": 0}, Obj(metrics=metrics, modeled=True, verdicts=verdicts), [])
    rows = [line.split("|") for line in text.splitlines() if line.startswith("| ") and "d.l" in line]
    shown = [float(row[6]) for row in rows]
    assert shown == sorted(gains)[:VERDICTS_SHOWN]
    assert "5 more not shown" in text


def test_reproduce_sh_runs_without_python_on_the_path(tmp_path, monkeypatch):
    """An exported reproduce.sh run with no environment activated: only bash and coreutils on PATH."""
    fast = tmp_path / "fast.toml"
    fast.write_text((REPO / "evaluators" / "analytical.toml").read_text().replace("max_params = 5000000",
                                                                                   "max_params = 0"))
    monkeypatch.setenv("CONJUGATE_CACHE", str(tmp_path / "cache"))
    db, export = tmp_path / "r.db", tmp_path / "export"
    assert main(["search", "tiny", "--db", str(db), "--budget", "1", "--evaluator", str(fast)]) == 0
    assert main(["export", str(db), "--out", str(export)]) == 0
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("bash", "dirname"):
        (bare / tool).symlink_to(subprocess.run(["which", tool], capture_output=True, text=True).stdout.strip())
    env = {**os.environ, "PATH": str(bare)}
    ran = subprocess.run(["bash", str(export / "reproduce.sh")], capture_output=True, text=True, cwd=tmp_path,
                         env=env, timeout=300)
    assert ran.returncode == 0, ran.stderr
    assert json.loads((export / "reproduced.json").read_text())["plans"]


# ---------------------------------------------------------------------------------------------
# Long work says what it is doing


def test_bench_says_before_it_tries_every_conventional_variant(capsys, monkeypatch, tmp_path):
    """The first GPU evaluation of a workload on a GPU builds every conventional variant (minutes): bench
    says so on stderr, with the variants and an estimate; once a choice is kept it says nothing."""
    import torch

    from conjugate.cli.bench_progress import variant_trials_estimate
    from conjugate.evaluate.baselines.measure import choice_file
    from conjugate.evaluate.evaluators import load_profile

    monkeypatch.setenv("CONJUGATE_CACHE", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *device: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    profile, workload = load_profile("h200"), load_workload(TINY)
    estimate = variant_trials_estimate(workload, profile)
    captured = capsys.readouterr()
    assert estimate > 0 and captured.out == ""
    assert all(variant in captured.err for variant in profile.timing.conventional)
    kept = choice_file(workload, "NVIDIA H200", profile.timing, None)
    kept.parent.mkdir(parents=True)
    kept.write_text("{}")
    assert variant_trials_estimate(workload, profile) is None
    assert variant_trials_estimate(workload, load_profile("analytical")) is None
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("argv", [["plan", "explain", "streams", "--workload", "tiny"],
                                  ["plan", "validate", "interleave", "--workload", str(TINY)]])
def test_a_shipped_plan_is_taken_by_name(capsys, argv):
    code, out, err = run(capsys, *argv)
    assert code == 0 and argv[2] in out, err


@pytest.mark.parametrize("argv", [["plan", "validate", "no-such", "--workload", "tiny"],
                                  ["bench", "tiny", "--plan", "no-such"], ["profile", "tiny", "--plan", "no-such"]])
def test_an_unknown_plan_name_lists_the_shipped_ones(capsys, argv):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1, err
    assert "no-such" in err and all(name in err for name in SHIPPED)
