"""benchmarks/baselines.py's parts that need no GPU: --merge joins runs measured in separate calls into
one results file; --resume reads a cut-short run; --prewarm deals the variants out to processes."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from scripts import load_script, run_script  # tests/scripts.py

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


def test_each_joined_row_gains_its_median_seconds_per_evaluation_after_and_before(tmp_path):
    """Pooled over a stage's runs of the workload, each run's first evaluation (it also prepared the
    workload) left out; None where a stage has no run; eval times from another GPU are refused."""
    def timed_run(workload, stage, seconds):
        return {"workload": workload, "stage": stage, "rows": [{"wall_s": s} for s in seconds]}

    a = _run(tmp_path, "a", "NVIDIA H200", [_row("llama-1b-8b-b8"), _row("llama-1b-8b-b1")])
    times = tmp_path / "eval_time.json"
    times.write_text(json.dumps({"gpu": "NVIDIA H200", "runs": [
        timed_run("llama-1b-8b-b8", "after", [90.0, 2.0, 1.0]), timed_run("llama-1b-8b-b8", "after", [50.0, 3.0, 9.0]),
        timed_run("llama-1b-8b-b8", "before", [100.0, 9.5]), timed_run("llama-1b-8b-b1", "after", [60.0, 1.5]),
        timed_run("llama-1b-8b-b1", "replays", [60.0, 4.0])]}))
    out = tmp_path / "joined.json"
    done = _merge_here(a, "--eval-times", times, "--json", out)
    assert done.returncode == 0, done.stderr
    rows = {w["workload"]: w for w in json.loads(out.read_text())["workloads"]}
    assert (rows["llama-1b-8b-b8"]["eval_seconds_median"], rows["llama-1b-8b-b8"]["eval_seconds_before"]) == (2.5, 9.5)
    assert (rows["llama-1b-8b-b1"]["eval_seconds_median"], rows["llama-1b-8b-b1"]["eval_seconds_before"]) == (1.5, None)
    times.write_text(json.dumps({"gpu": "NVIDIA B300", "runs": []}))
    done = _merge_here(a, "--eval-times", times, "--json", tmp_path / "other.json")
    assert done.returncode != 0 and f"--eval-times {times}: measured on NVIDIA B300" in done.stderr
    assert not (tmp_path / "other.json").exists()


def test_runs_from_different_gpus_are_not_joined(tmp_path):
    a = _run(tmp_path, "a", "NVIDIA H200", [_row("llama-1b-8b-b8")])
    b = _run(tmp_path, "b", "NVIDIA B300", [_row("llama-1b-8b-b1")])
    done = _merge_here(a, b, "--json", tmp_path / "joined.json")
    assert done.returncode != 0 and "different GPUs" in done.stderr
    assert not (tmp_path / "joined.json").exists()


def _script():
    return load_script("baselines")


def _trial(variant: str, draft: float, verify: float, correct: bool = True) -> dict:
    return {"variant": variant, "correct": correct, "phase_ms": {"draft": draft, "verify": verify} if correct else {},
            "problem": "" if correct else "tokens differ", "built": True, "build_s": 50.0}


CUT = {"workload": "qwen25-05b-7b-b8", "partial": True,
       "trials": [_trial("layers-grouped", 7.85, 6.16), _trial("whole-sdpa", 4.62, 7.10),
                  _trial("whole-grouped", 7.69, 6.14), _trial("whole-split", 5.40, 5.36),
                  _trial("whole-flex", 0, 0, False)]}


def test_a_resumed_run_keeps_the_cut_short_choice_and_its_pairs():
    bench = _script()
    pairs = {"whole-sdpa/whole-grouped": 7.90, "whole-sdpa/whole-split": 8.09, "whole-split/whole-split": 8.65}
    tried, chosen, kept = bench.resumed_choice(None, None, CUT | {"streams_pairs_ms": pairs})  # nothing built
    assert [t.variant for t in tried] == [t["variant"] for t in CUT["trials"]] and kept == pairs
    assert chosen == {"draft": "whole-sdpa", "verify": "whole-split", "streams_draft": "whole-sdpa",
                      "streams_verify": "whole-grouped"}
    # what a prewarm builds for it: the chosen variants and the pair's; without pairs, every candidate
    assert bench.pair_variants(CUT | {"streams_pairs_ms": pairs}) == {"whole-sdpa", "whole-split", "whole-grouped"}
    assert bench.pair_variants(CUT) == {"layers-grouped", "whole-sdpa", "whole-grouped", "whole-split"}


def test_resume_names_a_file_it_cannot_use(tmp_path):
    def resume(path):  # the first as a program, the others in this process
        if path != done:
            return run_script("baselines", "--resume", path)
        return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "baselines.py"), "--resume", str(path)],
                              capture_output=True, text=True, timeout=120)

    done = _run(tmp_path, "done", "NVIDIA H200", [_row("llama-1b-8b-b8")])
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    for path, said in ((done, "no workload there was cut short after its trials"),
                       (broken, "not a baselines.py run's JSON (JSONDecodeError"),
                       (tmp_path / "absent.json", "not a baselines.py run's JSON (FileNotFoundError")):
        failed = resume(path)
        assert failed.returncode == 1 and f"--resume {path}: {said}" in failed.stderr, failed.stderr


def test_prewarm_deals_whole_step_variants_out_first_and_survives_a_failed_process():
    bench = _script()
    variants = ["layers-grouped", "whole-sdpa", "whole-grouped", "whole-split"]
    assert bench.prewarm_shares(variants, 2) == [["whole-sdpa", "whole-split"], ["whole-grouped", "layers-grouped"]]
    assert bench.prewarm_shares(variants, 8) == [["whole-sdpa"], ["whole-grouped"], ["whole-split"], ["layers-grouped"]]
    started = []

    class Worker:
        def __init__(self, command, env):
            started.append(command)
            assert env["TORCHINDUCTOR_AUTOTUNE_LOCAL_CACHE"] == "0"  # no tuning cached from contended builds
            self.returncode = 1 if "whole-grouped" in command else None if "whole-split" in command else 0
            self.killed = False

        def wait(self, timeout=None):
            if self.returncode is None and timeout is not None:  # hangs: the prewarm gives up on it
                raise bench.subprocess.TimeoutExpired("build", timeout)
            return self.returncode

        def poll(self):
            return self.returncode

        def kill(self):
            self.killed, self.returncode = True, -9

    workers = []

    def run(command, env):
        workers.append(Worker(command, env))
        return workers[-1]

    bench.PREWARM_LIMIT_S = 0.01
    seconds = bench.prewarm("qwen25-05b-7b-b8", variants, 3, run=run)
    assert seconds >= 0 and len(started) == 3
    assert all(c[2:4] == ["--build-only", "qwen25-05b-7b-b8"] and c[4] == "--variants" for c in started)
    assert sorted(v for c in started for v in c[5:]) == sorted(variants)
    assert [w.killed for w in workers] == [c[5] == "whole-split" for c in started]  # none outlives the prewarm


def test_resume_refuses_a_workload_cut_before_all_its_trials_and_flags_that_do_not_apply(tmp_path):
    def resume(*args):
        return run_script("baselines", "--resume", *args)

    early = _run(tmp_path, "early", "NVIDIA H200", [CUT | {"trials": CUT["trials"][:2]}])
    failed = resume(early)
    assert failed.returncode == 1
    assert (f"--resume {early}: qwen25-05b-7b-b8 was cut short before trying whole-grouped, whole-split: "
            "measure it again instead") in failed.stderr
    whole = _run(tmp_path, "whole", "NVIDIA H200", [CUT])
    failed = resume(whole, "--workloads", "llama-1b-8b-b8")
    assert failed.returncode == 1 and "--workloads does not apply" in failed.stderr
    failed = resume(whole, "--json", whole)
    assert failed.returncode == 1 and f"--json {whole}: the file --resume reads" in failed.stderr
    assert json.loads(whole.read_text())["workloads"] == [CUT]  # untouched


def _merge_here(*args) -> subprocess.CompletedProcess:
    """`_merge` in this process (tests/scripts.py: no interpreter to start, no torch to import)."""
    return run_script("baselines", "--merge", *args)


def test_a_file_that_is_not_a_run_is_named_in_one_line(tmp_path):
    a = _run(tmp_path, "a", "NVIDIA H200", [_row("llama-1b-8b-b8")])
    broken, joined = tmp_path / "broken.json", tmp_path / "joined.json"
    for text, said in (("{", "JSONDecodeError"), ("[]", "it lacks an object"), ('{"gpu": "x"}', "it lacks torch")):
        broken.write_text(text)
        done = _merge_here(a, broken, "--json", joined)
        assert done.returncode == 1 and f"--merge {broken}: " in done.stderr and said in done.stderr
        done = _merge_here(a, "--eval-times", broken, "--json", joined)
        assert done.returncode == 1 and f"--eval-times {broken}: " in done.stderr
    done = _merge(a, broken, "--json", joined)  # the last again, in the script's own process
    assert done.returncode == 1 and f"--merge {broken}: " in done.stderr and "it lacks torch" in done.stderr
    assert not joined.exists()
