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

import pytest
from scripts import load_script  # tests/scripts.py

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


class _FakeStore:
    def __init__(self):
        self.status = {}

    def set_run_status(self, run_id, status):
        self.status[run_id] = status


class _FakeRun:
    """A search that evaluates one plan per tick of a shared clock until its budget or the deadline."""

    def __init__(self, run_id: int, clock: list, order: list, plans: int = 99):
        from conjugate.search.settings import SearchSettings
        self.run_id, self.clock, self.order, self.plans = run_id, clock, order, plans
        self.settings, self.done = SearchSettings(budget=1), 0
        self.workload = type("W", (), {"name": "w"})()

    def evaluations_done(self) -> int:
        return self.done

    def run_loop(self, deadline=None) -> str:
        while self.done < self.settings.budget:
            if deadline is not None and self.clock[0] >= deadline:
                return "deadline"
            if self.done == self.plans:
                return "exhausted"
            self.done += 1
            self.clock[0] += 1
            self.order.append(self.run_id)
        return "deadline" if deadline is not None and self.clock[0] >= deadline else "budget"  # as Search does


def test_runs_take_turns_so_a_deadline_leaves_them_level():
    from conjugate.search.store import RunStatus
    searchers = load_script("searchers")
    clock, order = [0], []
    opened = [searchers.Opened(agent, Path(f"{agent}.db"), _FakeStore(), _FakeRun(i, clock, order))
              for i, agent in enumerate(("heuristic", "random", "greedy"))]
    searchers.rotate(opened, budget=40, step=5, deadline=None)
    assert order[:15] == [0] * 5 + [1] * 5 + [2] * 5 and len(order) == 120
    assert all(o.store.status[o.run.run_id] is RunStatus.FINISHED and o.run.settings.budget == 40 for o in opened)
    clock, order = [0], []  # 32 evaluations' time: run 0 reaches 15, run 1 has only 7 plans, run 2 stops at 10
    opened = [searchers.Opened(a, Path(f"{a}.db"), _FakeStore(), _FakeRun(i, clock, order, plans=7 if i == 1 else 99))
              for i, a in enumerate(("heuristic", "random", "greedy"))]
    searchers.rotate(opened, budget=40, step=5, deadline=32)
    assert [o.run.done for o in opened] == [15, 7, 10] and [o.why for o in opened] == ["deadline", "exhausted",
                                                                                         "deadline"]
    assert [o.store.status[o.run.run_id] for o in opened] == [RunStatus.STOPPED, RunStatus.FINISHED,
                                                              RunStatus.STOPPED]


def test_a_run_that_reaches_its_budget_as_the_deadline_passes_is_finished_and_a_turn_is_one_evaluation_or_more():
    from conjugate.search.store import RunStatus
    searchers = load_script("searchers")
    clock, order = [0], []
    run = _FakeRun(0, clock, order)
    opened = [searchers.Opened("greedy", Path("g.db"), _FakeStore(), run)]
    searchers.rotate(opened, budget=10, step=5, deadline=10)  # the tenth evaluation ends at the deadline
    assert run.done == 10 and opened[0].store.status[0] is RunStatus.FINISHED
    with pytest.raises(ValueError, match="at least 1"):
        searchers.rotate(opened, budget=20, step=0, deadline=None)
    ran = subprocess.run([sys.executable, str(SCRIPT), str(TINY), "--step", "0"], capture_output=True, text=True,
                         timeout=120)
    assert ran.returncode == 2 and "--step 0: a run's turn is at least one evaluation" in ran.stderr


def test_merge_joins_the_calls_and_refuses_what_does_not_belong_together(tmp_path):
    """--merge: one comparison from per-call JSON, in order; a file of another GPU, budget or evaluator,
    a workload twice, or a file that is no such JSON: a one-line error naming the file, nothing written."""
    def call(name: str, workloads: list[str], **changed) -> Path:
        run = {"agent": "greedy", "best_ms": 1.0, "sequential_ms": 2.0, "confirmed_ms": 1.0, "evaluations": 40,
               "complete": True, "best_so_far_ms": [2.0, 1.0]}
        data = {"gpu": "NVIDIA H200", "evaluator": "h200_quick.toml", "budget": 40, "modeled": False,
                "command": f"searchers.py {name}", "workloads": [{"workload": w, "runs": [run]} for w in workloads]}
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(data | changed))
        return path

    def merge(*paths: Path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(SCRIPT), "--merge", *map(str, paths), "--json",
                               str(tmp_path / "out.json")], capture_output=True, text=True, timeout=120)

    done = merge(call("a", ["q3"]), call("b", ["b8", "c2k"]))
    assert done.returncode == 0, done.stderr
    out = json.loads((tmp_path / "out.json").read_text())
    assert [w["workload"] for w in out["workloads"]] == ["q3", "b8", "c2k"]
    assert out["commands"] == ["searchers.py a", "searchers.py b"] and out["gpu"] == "NVIDIA H200"
    assert out["budget"] == 40 and out["modeled"] is False and "c2k" in done.stdout
    (tmp_path / "out.json").unlink()
    bad = tmp_path / "bad.json"
    bad.write_text('{"gpu": "NVIDIA H200"}')
    failed = merge(call("a", ["q3"]), call("c", ["b8"], budget=60))
    assert failed.returncode == 1 and failed.stderr.strip().splitlines() == [
        f"--merge {tmp_path / 'c.json'}: its budget differ from {tmp_path / 'a.json'}'s"]
    assert not (tmp_path / "out.json").exists()
    for paths, said in [((call("a", ["q3"]), call("d", ["b8"], gpu="NVIDIA B300")), "d.json: its gpu differ"),
                        ((call("a", ["q3"]), call("e", ["q3"])), "e.json: q3 twice"),
                        ((call("f", ["q3", "q3"]),), "f.json: q3 twice"),
                        ((call("a", ["q3"]), bad), "bad.json: not a JSON this script wrote")]:
        with pytest.raises(SystemExit, match=said):
            load_script("searchers").merge(list(paths))


def test_plot_draws_every_run_of_a_comparison_and_refuses_other_files(tmp_path, monkeypatch):
    """--plot: one PNG per workload with every run listed (a carried one too); a file that is not a
    comparison: one line naming it, nothing drawn."""
    runs = [{"agent": a, "best_so_far_ms": [3.0, 2.0, 1.5]} for a in ("heuristic", "greedy", "random")]
    good = tmp_path / "cmp.json"
    good.write_text(json.dumps({"workloads": [{"workload": w, "runs": runs} for w in ("q3", "b8")]}))
    done = subprocess.run([sys.executable, str(SCRIPT), "--plot", str(good), "--out", str(tmp_path / "p")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == ["b8_searchers.png", "q3_searchers.png"]
    assert (tmp_path / "p" / "q3_searchers.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    drawn = []
    searchers = load_script("searchers")
    monkeypatch.setattr(searchers, "plot", lambda name, runs, path: drawn.append((name, [r["agent"] for r in runs])))
    searchers.plot_comparison(good, tmp_path / "again")
    assert drawn == [(w, ["heuristic", "greedy", "random"]) for w in ("q3", "b8")]  # every run, carried ones too
    for text in ('{"workloads": [{"workload": "q3", "runs": [{"agent": "greedy"}]}]}', "not json", "[]"):
        good.write_text(text)
        with pytest.raises(SystemExit, match=f"^error: {re.escape(str(good))}: not a searchers comparison"):
            searchers.plot_comparison(good, tmp_path / "none")
    assert not (tmp_path / "none").exists()


def test_a_fresh_run_takes_the_width_it_is_given(tmp_path, monkeypatch):
    """open_run's `width` (search_surrogate.py --width): the edits a fresh run asks for per expansion."""
    import contextlib
    from types import SimpleNamespace

    from conjugate.evaluate.evaluators import load_profile
    from conjugate.search.settings import SearchSettings

    searchers = load_script("searchers")
    started = []

    def start(store, name, workload, path, evaluator, proposer, settings, seed):
        started.append(settings)
        raise KeyboardInterrupt  # nothing more to see

    monkeypatch.setattr(searchers.Search, "start", staticmethod(start))
    evaluator = SimpleNamespace(profile=load_profile("analytical"))
    for width, expected in ((1, 1), (None, SearchSettings().expand_width)):
        with contextlib.ExitStack() as stack, pytest.raises(KeyboardInterrupt):
            searchers.open_run(stack, TINY, "heuristic", 40, evaluator, 0, tmp_path / f"w{width}.db", width=width)
        assert started[-1].expand_width == expected and started[-1].budget == 40
