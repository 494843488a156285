"""Worker isolation: failing plans, a hung kernel and a crash kill only the worker."""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from conjugate.evaluate.evaluators import load_profile
from conjugate.evaluate.worker import IsolatedEvaluator

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "examples" / "tiny.toml"
FAULTS = {"PYTHONPATH": os.pathsep.join([str(Path(__file__).parent / "faults"), os.environ.get("PYTHONPATH", "")])}
CHEAP = {"schema": "conjugate.plan/2"}  # default tiles: few programs, quick under the interpreter


@pytest.fixture
def profile():
    return load_profile("analytical")


def test_failing_plans_come_back_as_results(profile, tmp_path):
    with IsolatedEvaluator(profile, time_limit_s=120, cache_dir=tmp_path) as isolated:
        bad = isolated.evaluate({"schema": "conjugate.plan/2", "cross": {"launch": {"num_warps": 3}}}, TINY)
        assert (bad.stage, bad.status) == ("validate", "invalid") and "$.cross.launch.num_warps" in bad.error
        huge = {"schema": "conjugate.plan/2", "target": {"tiles": {"qkv": {"BLOCK_M": 256, "BLOCK_N": 512,
                                                                           "BLOCK_K": 512}}}}
        failed = isolated.evaluate(huge, TINY)
        assert (failed.stage, failed.status) == ("compile", "compile_error")
        heard = []
        good = isolated.evaluate(CHEAP, TINY, on_stage=heard.append)
        assert good.ok and good.checks["ok"] and isolated.restarts == 0
        assert heard == ["setup", "validate", "compile", "correctness", "timing"]  # progress, as the worker moves on


def test_a_hung_kernel_times_out_and_the_next_evaluation_proceeds(profile, tmp_path):
    with IsolatedEvaluator(profile, time_limit_s=120, cache_dir=tmp_path, env=FAULTS) as isolated:
        # An invalid plan first: the worker is up, its imports done, so a short limit times only the hang.
        assert isolated.evaluate({"schema": "conjugate.plan/2", "cross": {"launch": {"num_warps": 3}}},
                                 TINY).status == "invalid"
        isolated.entry, isolated.time_limit_s = "evaluators:hang_in_kernel", 5
        hung = isolated.evaluate(CHEAP, TINY)
        assert (hung.stage, hung.status) == ("compile", "timeout") and "time limit of 5 s" in hung.error
        assert isolated.restarts == 1 and hung.plan_hash
        isolated.entry, isolated.time_limit_s = "conjugate.evaluate.pipeline:evaluate", 120
        isolated.profile = replace(profile, max_check_params=0)  # modeled only: quick
        after = isolated.evaluate(CHEAP, TINY)  # a fresh worker
        assert after.ok


def test_a_crash_is_recorded_with_its_stage(profile, tmp_path):
    with IsolatedEvaluator(profile, time_limit_s=120, cache_dir=tmp_path, entry="evaluators:crash_in_correctness",
                           env=FAULTS) as isolated:
        crashed = isolated.evaluate(CHEAP, TINY)
        assert (crashed.stage, crashed.status) == ("correctness", "crashed")
        assert "exited with status" in crashed.error and "illegal memory access (simulated)" in crashed.error
        isolated.entry = "evaluators:chatty_then_evaluate"  # stdout noise stays out of the protocol
        assert isolated.evaluate(CHEAP, TINY).ok and isolated.restarts == 1


def test_the_worker_passes_carried_baselines_on_only_when_there_are_some(profile, tmp_path):
    import json

    with IsolatedEvaluator(profile, time_limit_s=60, cache_dir=tmp_path, entry="evaluators:report_carried",
                           env=FAULTS) as isolated:
        assert set(dict(json.loads(isolated.evaluate(CHEAP, TINY).error))) == {"session"}
        isolated.carried = {"device": "NVIDIA H200", "from": "run 1", "baselines": {}}
        sent = dict(json.loads(isolated.evaluate(CHEAP, TINY).error))
        assert sent["carried_baselines"] == isolated.carried


PARENT = """
import sys, time
from conjugate.evaluate.evaluators import load_profile
from conjugate.evaluate.worker import IsolatedEvaluator
isolated = IsolatedEvaluator(load_profile("analytical"), time_limit_s=600, entry="evaluators:hang_in_kernel",
                             env={"PYTHONPATH": sys.argv[2]})
worker = isolated._start()
print(worker.pid, flush=True)
# the worker hangs: the parent waits on it; each stage the worker enters is printed
isolated.evaluate({"schema": "conjugate.plan/2"}, sys.argv[1], on_stage=lambda stage: print(stage, flush=True))
"""


def test_a_worker_ends_soon_after_its_search_is_killed_outright(tmp_path):
    """kill -9 of the search leaves its worker busy (here: hung in a kernel); the worker notices its parent
    is gone and exits within a few seconds rather than running on."""
    import signal
    import subprocess
    import sys
    import time

    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(TINY), FAULTS["PYTHONPATH"]],
                              stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        worker = int(parent.stdout.readline())
        while parent.stdout.readline().strip() != "compile":  # the worker imported, read the request and hangs
            assert parent.poll() is None, "the parent exited before its worker hung"
        assert _alive(worker), "the worker should be busy until its parent is killed"
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        killed = time.monotonic()
        while _alive(worker) and time.monotonic() - killed < 10:
            time.sleep(0.1)
        assert not _alive(worker), "the worker outlived its parent"
        assert time.monotonic() - killed < 5
    finally:
        if parent.poll() is None:
            parent.kill()


def _alive(pid: int) -> bool:
    """Whether the process runs (a zombie, exited and not yet reaped by its new parent, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"
