"""The conventional baselines measured in a process of their own: what comes back, and a child
that fails or hangs giving error baselines that say why."""
from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

from conjugate.evaluate.baselines import measure as baselines
from conjugate.evaluate.baselines.apart import measure_apart
from conjugate.evaluate.evaluators import load_profile
from conjugate.evaluate.result import Baseline
from conjugate.workload import Workload, load_workload

ROOT = Path(__file__).resolve().parents[1]
TINY = load_workload(ROOT / "examples" / "tiny.toml")
FAULTS = {"PYTHONPATH": os.pathsep.join([str(Path(__file__).parent / "faults"), os.environ.get("PYTHONPATH", "")])}


def _profile(**timing):
    p = load_profile("analytical")
    return replace(p, timing=replace(p.timing, baselines_apart=True, **timing))


def test_a_workload_survives_its_dict_through_json():
    for path in sorted((ROOT / "examples").glob("*.toml")):
        workload = load_workload(path)
        again = Workload.from_dict(json.loads(json.dumps(workload.to_dict())))
        assert again == workload and again.target == workload.target and again.draft_source == workload.draft_source


def test_the_baselines_come_from_another_process(tmp_path):
    measured = measure_apart(TINY, _profile(), tmp_path, entry="evaluators:conventional_on_cpu", env=FAULTS)
    assert set(measured) == {"conventional", "streams"}
    assert all(b.status == "ok" and b.latency_ms > 0 for b in measured.values()), measured
    assert measured["conventional"].variants == {"draft": "eager-sdpa", "verify": "eager-sdpa"}
    assert int((tmp_path / "child.pid").read_text()) != os.getpid()
    only = measure_apart(TINY, _profile(baselines=("conventional", "sequential")), tmp_path,
                         entry="evaluators:conventional_on_cpu", env=FAULTS)
    assert set(only) == {"conventional"}


def test_a_failing_child_gives_error_baselines_that_say_why(tmp_path):
    measured = measure_apart(TINY, _profile(), tmp_path, entry="evaluators:apart_raises", env=FAULTS)
    assert {b.status for b in measured.values()} == {"error"}
    error = measured["streams"].error
    assert "own process exited with status 1" in error and "no kernel image is available" in error


def test_a_hung_child_is_stopped_at_the_time_limit(tmp_path):
    profile = replace(_profile(), time_limit_s=3)
    measured = measure_apart(TINY, profile, tmp_path, entry="evaluators:apart_sleeps", env=FAULTS)
    assert measured["conventional"].status == "error" and "time limit (2.4 s, 80% of the profile's)" in \
        measured["conventional"].error


def test_the_profile_chooses_where_the_conventional_baselines_run(monkeypatch):
    from types import SimpleNamespace

    calls = []
    monkeypatch.setattr(baselines, "measure_apart", lambda *a: calls.append("apart") or {"conventional": Baseline("ok", 1.0)})
    monkeypatch.setattr(baselines, "measure_conventional", lambda *a: calls.append("here") or {"conventional": Baseline("ok", 2.0)})
    monkeypatch.setattr(baselines.torch.cuda, "empty_cache", lambda: None)
    setup = SimpleNamespace(workload=TINY)
    wanted = ("conventional",)
    assert baselines.measure_baselines(setup, _profile(baselines=wanted), None)["conventional"].latency_ms == 1.0
    here = replace(_profile(baselines=wanted), timing=replace(_profile(baselines=wanted).timing, baselines_apart=False))
    assert baselines.measure_baselines(setup, here, None)["conventional"].latency_ms == 2.0
    assert calls == ["apart", "here"]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"  # a zombie has exited
    except (OSError, IndexError):
        return False


def test_the_child_does_not_outlive_a_killed_parent(tmp_path):
    """A worker killed at its time limit leaves no baseline process holding the GPU."""
    import subprocess
    import sys
    import time

    script = ("import sys; from pathlib import Path; from dataclasses import replace;"
              "from conjugate.evaluate.baselines.apart import measure_apart;"
              "from conjugate.evaluate.evaluators import load_profile;"
              "from conjugate.workload import load_workload;"
              "p = load_profile('analytical'); p = replace(p, timing=replace(p.timing, baselines_apart=True));"
              f"measure_apart(load_workload({str(ROOT / 'examples' / 'tiny.toml')!r}), p, Path({str(tmp_path)!r}),"
              "entry='evaluators:apart_sleeps')")
    parent = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, **FAULTS})
    pid_file, started = tmp_path / "child.pid", time.monotonic()
    while not pid_file.exists() and time.monotonic() - started < 60:
        time.sleep(0.1)
    child = int(pid_file.read_text())
    assert _alive(child)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)
