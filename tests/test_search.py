"""The search end to end on the tiny workload, scored by the analytical model (numerical check off):
the CLI, kill -9 and Ctrl-C then resume, resume exactness, two processes on one database, replay,
warm starts and edit statistics across runs, show and export, bad input, and the failure path."""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

import conjugate.cli
from conjugate.agents import Proposal, make_proposer
from conjugate.cli import main
from conjugate.evaluate.pipeline import evaluate
from conjugate.evaluate.evaluators import load_profile
from conjugate.evaluate.result import Baseline, EvalResult, Metrics, Stage, Status
from conjugate.graph import build_graph
from conjugate.plan import Plan, expand, load_plan, patch_plan, validate_plan
from conjugate.search.context import ContextBuilder, family_of
from conjugate.search.moves import MERGE_SUFFIX, MoveMemory, merged, move_key
from conjugate.search import seeding
from conjugate.search.run import Search
from conjugate.search.runs import eval_key, replay_records, reward_of, run_evaluator_id
from conjugate.search.settings import LIMITS, SearchSettings, evaluator_id
from conjugate.search.store import NodeStatus, Store
from conjugate.workload import load_workload
from scripts import load_script  # tests/scripts.py

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "examples" / "tiny.toml"
WORKLOAD = load_workload(TINY)
EVALUATOR = "analytical"  # the name of the fast profile too: it is the analytical profile, unchecked
FAMILY = "llama->llama"
SHIPPED = {name: load_plan(REPO / "plans" / f"{name}.json").hash for name in ("sequential", "streams", "interleave")}
BASE_BUDGET = 8
# A tile shape far over a program's shared memory: the plan validates and expands, and fails to compile.
HUGE_TILES = [{"op": "replace", "path": "/target/tiles/gate_up",
               "value": {"BLOCK_M": 256, "BLOCK_N": 512, "BLOCK_K": 512, "SPLIT_K": 1}}]


# -- fixtures and helpers

FAST: dict[str, str] = {}  # the fast profile's evaluator id (its evaluations' key), set by `env`


def key_of(plan_hash: str) -> str:
    return eval_key(plan_hash, WORKLOAD, FAST["id"])


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A fast evaluator profile (the shipped analytical one without the interpreter's numerical check)
    and a kernel cache of this module's own, for in-process calls and subprocesses alike."""
    root = tmp_path_factory.mktemp("search")
    text = (REPO / "evaluators" / "analytical.toml").read_text()
    fast = re.sub(r"(?m)^max_params\s*=.*$", "max_params = 0", text)
    assert "max_params = 0" in fast
    (root / "fast.toml").write_text(fast)
    FAST["id"] = evaluator_id(load_profile(root / "fast.toml"))
    old = os.environ.get("CONJUGATE_CACHE")
    os.environ["CONJUGATE_CACHE"] = str(root / "cache")
    yield {"profile": root / "fast.toml"}
    if old is None:
        os.environ.pop("CONJUGATE_CACHE", None)
    else:
        os.environ["CONJUGATE_CACHE"] = old


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    monkeypatch.setattr(conjugate.cli.out, "width", 200)


@pytest.fixture(autouse=True)
def searches_share_workers(shared_worker):
    """The many short in-process searches below share worker processes (tests/shared_worker.py); base_run,
    made before this, and the searches in subprocesses each start their own, as a search does."""


def cli(*argv) -> tuple[int, str, str]:
    """conjugate.cli.main in this process; (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def search_cli(db: Path, profile: Path, budget: int, *extra) -> tuple[int, str, str]:
    return cli("search", TINY, "--db", db, "--budget", budget, "--evaluator", profile, *extra)


def spawn(log: Path, *argv) -> subprocess.Popen:
    """`python -m conjugate ...` as a subprocess, its output into `log`."""
    with open(log, "w") as f:
        return subprocess.Popen([sys.executable, "-m", "conjugate", *map(str, argv)], cwd=REPO, stdout=f,
                                stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def done_evaluations(db: Path) -> int:
    try:
        with contextlib.closing(sqlite3.connect(db, timeout=30)) as c:
            return c.execute("SELECT count(*) FROM evaluations WHERE status = 'done'").fetchone()[0]
    except sqlite3.OperationalError:  # not created yet
        return 0


def wait_for_done(db: Path, proc: subprocess.Popen, at_least: int, log: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while done_evaluations(db) < at_least:
        assert proc.poll() is None, f"the search exited early ({proc.returncode}):\n{log.read_text()}"
        assert time.monotonic() < deadline, f"no {at_least} evaluations within {timeout_s} s:\n{log.read_text()}"
        time.sleep(0.05)


def evaluation_rows(db: Path) -> dict[str, dict]:
    """eval_key -> the evaluations row, as stored."""
    with contextlib.closing(sqlite3.connect(db, timeout=30)) as c:
        c.row_factory = sqlite3.Row
        return {r["eval_key"]: dict(r) for r in c.execute("SELECT * FROM evaluations")}


def tree(db: Path, run_id: int | None = None):
    """(run, nodes) of a run (default: the latest)."""
    with Store.open(db) as store:
        run = store.run(run_id) if run_id else store.latest_run()
        return run, store.nodes(run.id)


def settled(nodes) -> list:
    return [n for n in nodes if n.status != "new"]


def assert_settled_and_consistent(db: Path, nodes) -> dict[int, dict]:
    """Every settled node has a done evaluation that its status agrees with, and every node's stored
    statistics are exactly those of the settled nodes below it (each settlement backpropagated once
    along its path). Returns node id -> result of the settled nodes."""
    results = {}
    with Store.open(db) as store:
        for n in settled(nodes):
            found = store.evaluation(key_of(n.plan_hash))
            assert found is not None and found.done, n
            assert n.status in (NodeStatus.EVALUATED, NodeStatus.FAILED, NodeStatus.EXPANDED)
            assert n.status is not NodeStatus.EVALUATED or found.result.ok
            assert n.status is not NodeStatus.FAILED or not found.result.ok
            results[n.id] = found.result
    parent = {n.id: n.parent_id for n in nodes}
    visits, values, best = Counter(), Counter(), {}
    for node_id, result in results.items():
        at = node_id
        while at is not None:
            visits[at] += 1
            values[at] += reward_of(result)
            best[at] = max(best.get(at, 0.0), reward_of(result))
            at = parent[at]
    for n in nodes:
        assert n.visits == visits[n.id], (n.id, n.visits, visits[n.id])
        assert n.value_sum == pytest.approx(values[n.id]), n.id
        assert n.best_reward == (pytest.approx(best[n.id]) if n.id in best else None), n.id
    return results


def assert_profile_used(results, profile: Path) -> None:
    """Every result came from the fast profile (its check is skipped, naming the profile file)."""
    for r in results:
        assert str(profile) in r.checks.get("skipped", ""), r.checks


class InProcessEvaluator:
    """The Evaluator interface without a worker process: the pipeline in this process."""

    def __init__(self, profile_path: Path, fail_all: bool = False):
        self.profile, self.fail_all, self.calls = load_profile(profile_path), fail_all, []
        self.after = None  # called once, after the first evaluation

    def evaluate(self, plan: Plan, workload_path) -> EvalResult:
        self.calls.append(plan.hash)
        if self.fail_all:
            return EvalResult(plan_hash=self.calls[-1], workload="tiny", evaluator=self.profile.name,
                              stage=Stage.COMPILE, status=Status.CRASHED, modeled=True,
                              error="worker exited with status -11")
        result = evaluate(plan.to_dict(), load_workload(workload_path), self.profile)  # as the worker gets it
        after, self.after = self.after, None
        if after:
            after()
        return result


class ScriptedProposer:
    """Proposes the scripted patches of a plan hash once each; remembers every context it was given."""
    name = "scripted"

    def __init__(self, script: dict[str, list[Proposal]]):
        self.script, self.contexts = dict(script), []

    def propose(self, context, n: int) -> list[Proposal]:
        self.contexts.append(context)
        return self.script.pop(context.plan_hash, [])[:n]


@pytest.fixture(scope="module")
def base_run(env, tmp_path_factory):
    """One heuristic search of BASE_BUDGET evaluations through the CLI, the workload named relative to
    the working directory; later tests read or copy it."""
    db = tmp_path_factory.mktemp("base") / "base.db"
    with contextlib.chdir(REPO):
        code, out, err = cli("search", TINY.relative_to(REPO), "--db", db, "--budget", BASE_BUDGET,
                             "--evaluator", env["profile"])
    return {"db": db, "code": code, "out": out, "err": err}


# -- 1. the CLI end to end

def test_search_end_to_end(env, base_run):
    assert base_run["code"] == 0, base_run["err"]
    db = base_run["db"]
    run, nodes = tree(db)
    assert run.status == "finished" and run.evaluator == EVALUATOR and run.agent == "heuristic"
    assert run.workload_path == str(TINY) and run.settings["evaluator_profile"] == str(env["profile"])
    assert len(settled(nodes)) == BASE_BUDGET
    results = assert_settled_and_consistent(db, nodes)
    assert_profile_used(results.values(), env["profile"])
    root = nodes[0]
    assert root.parent_id is None and root.plan_hash == SHIPPED["sequential"] and root.visits == BASE_BUDGET
    seeds = {n.plan_hash for n in nodes if n.parent_id == root.id and n.proposer == "seed"}
    assert seeds == {SHIPPED["streams"], SHIPPED["interleave"]}
    assert reward_of(results[root.id]) == pytest.approx(1.0)
    assert max(reward_of(r) for r in results.values()) > 1.0
    assert any(n.proposer == "heuristic" and n.depth >= 1 for n in settled(nodes))
    out = base_run["out"]
    assert f"search finished (budget) after {BASE_BUDGET} evaluations" in out
    progress = re.findall(r"^\[(\d+)/(\d+)\] node", out, re.M)
    assert [int(d) for d, _ in progress] == list(range(1, BASE_BUDGET + 1))


# -- 2. kill -9, then --resume

def test_kill_9_then_resume_loses_nothing_and_repeats_nothing(env, tmp_path):
    db, log, budget = tmp_path / "killed.db", tmp_path / "killed.log", 10
    proc = spawn(log, "search", TINY, "--db", db, "--budget", budget, "--evaluator", env["profile"])
    try:
        wait_for_done(db, proc, 3, log)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    before = evaluation_rows(db)
    done_before = {k: r for k, r in before.items() if r["status"] == "done"}
    in_flight = {k for k, r in before.items() if r["status"] != "done"}
    assert len(done_before) >= 3 and len(in_flight) <= 1
    _, nodes_before = tree(db)
    settled_before = len(settled(nodes_before))

    code, out, err = cli("search", "--resume", db)
    assert code == 0, err
    after = evaluation_rows(db)
    for key, row in done_before.items():  # finished evaluations are immutable: same row, same result
        assert after[key] == row
    assert all(r["status"] == "done" for r in after.values())
    retried = {k for k, r in after.items() if r["attempts"] != 1}
    assert retried <= in_flight and all(after[k]["attempts"] == 2 for k in retried)
    run, nodes = tree(db)
    assert run.status == "finished"
    assert len(settled(nodes)) == budget and nodes[0].visits == budget
    results = assert_settled_and_consistent(db, nodes)
    assert_profile_used(results.values(), env["profile"])  # the resume scored with the run's own profile
    hashes = [n.plan_hash for n in settled(nodes)]
    assert sorted(r["plan_hash"] for r in after.values()) == sorted(hashes)  # each plan evaluated once
    progress = [int(d) for d in re.findall(r"^\[(\d+)/10\] node", out, re.M)]
    assert progress == list(range(settled_before + 1, budget + 1))  # counted on from the stored state


# -- 3. resume exactness without a kill

def test_resume_continues_the_stored_tree_exactly(env, tmp_path):
    db = tmp_path / "parts.db"
    assert search_cli(db, env["profile"], 5)[0] == 0
    run, first = tree(db)
    rows_first = evaluation_rows(db)
    assert first[0].visits == 5 and run.status == "finished"

    code, out, err = cli("search", "--resume", db, "--budget", 8)
    assert code == 0, err
    run, nodes = tree(db)
    assert nodes[0].visits == 8 and len(settled(nodes)) == 8 and run.status == "finished"
    assert all(after == rows_first[k] for k, after in evaluation_rows(db).items() if k in rows_first)
    assert all(r["attempts"] == 1 for r in evaluation_rows(db).values())
    assert_settled_and_consistent(db, nodes)
    assert "after 8 evaluations" in out

    # the same search in one go builds the same tree with the same statistics
    whole = tmp_path / "whole.db"
    assert search_cli(whole, env["profile"], 8)[0] == 0
    _, uninterrupted = tree(whole)
    shape = lambda ns: [(n.id, n.parent_id, n.plan_hash, n.status, n.visits, round(n.value_sum, 9))  # noqa: E731
                        for n in ns]
    assert shape(nodes) == shape(uninterrupted)


def test_a_resume_reads_settings_of_another_version(env, tmp_path):
    """A stored setting this version does not know is dropped; one of the wrong type is one line."""
    import sqlite3

    db = tmp_path / "settings.db"
    assert search_cli(db, env["profile"], 3)[0] == 0
    with contextlib.closing(sqlite3.connect(db)) as con, con:
        settings = json.loads(con.execute("select settings from runs").fetchone()[0])
        con.execute("update runs set settings = ?", (json.dumps(settings | {"retired_knob": 1}),))
    code, _, err = cli("search", "--resume", db, "--budget", 4)
    assert code == 0, err
    with contextlib.closing(sqlite3.connect(db)) as con, con:
        con.execute("update runs set settings = ?", (json.dumps(settings | {"c_puct": "wide"}),))
    assert_one_line_error(*cli("search", "--resume", db, "--budget", 5)[::2], str(db), "'c_puct'")


def test_a_run_that_fails_to_start_is_not_left_running(env, tmp_path, monkeypatch):
    def broken(*args):
        raise RuntimeError("seeding failed")

    monkeypatch.setattr(seeding, "seed", broken)
    db = tmp_path / "unstarted.db"
    with Store.open(db) as store, pytest.raises(RuntimeError, match="seeding failed"):
        Search.start(store, "x", WORKLOAD, str(TINY), InProcessEvaluator(env["profile"]), make_proposer("heuristic"),
                     SearchSettings(budget=2), seed=0)
    run, _ = tree(db)
    assert run.status == "stopped"


# -- 4. two searches on one database

def test_two_searches_on_one_database_never_evaluate_a_plan_twice(env, tmp_path):
    db, budget = tmp_path / "shared.db", 6
    procs = [spawn(tmp_path / f"s{seed}.log", "search", TINY, "--db", db, "--budget", budget, "--evaluator",
                   env["profile"], "--seed", seed, "--name", f"seed{seed}") for seed in (0, 1)]
    for seed, proc in enumerate(procs):
        assert proc.wait(timeout=240) == 0, (tmp_path / f"s{seed}.log").read_text()
    rows = evaluation_rows(db)
    assert all(r["attempts"] == 1 and r["status"] == "done" for r in rows.values())
    with Store.open(db) as store:
        runs = store.runs()
        assert sorted(r.name for r in runs) == ["seed0", "seed1"] and {r.status for r in runs} == {"finished"}
        trees = {r.id: store.nodes(r.id) for r in runs}
    hashes = set()
    for nodes in trees.values():
        assert len(settled(nodes)) == budget
        assert_settled_and_consistent(db, nodes)
        hashes |= {n.plan_hash for n in settled(nodes)}
    by_hash = Counter(r["plan_hash"] for r in rows.values())
    assert set(by_hash) == hashes and set(by_hash.values()) == {1}
    for seed_hash in SHIPPED.values():  # evaluated once, by one of the runs; the other reused it
        assert by_hash[seed_hash] == 1
        assert all(any(n.plan_hash == seed_hash for n in settled(nodes)) for nodes in trees.values())


def test_two_processes_sharing_one_run_stop_at_its_budget(env, tmp_path):
    db, budget = tmp_path / "one_run.db", 10
    assert search_cli(db, env["profile"], 3)[0] == 0
    procs = [spawn(tmp_path / f"r{i}.log", "search", "--resume", db, "--budget", budget) for i in (0, 1)]
    for i, proc in enumerate(procs):
        assert proc.wait(timeout=240) == 0, (tmp_path / f"r{i}.log").read_text()
    run, nodes = tree(db)
    assert run.status == "finished"
    assert budget <= len(settled(nodes)) <= budget + 1  # each process may start one evaluation at the end
    assert_settled_and_consistent(db, nodes)
    rows = evaluation_rows(db)
    assert all(r["attempts"] == 1 for r in rows.values())
    assert sorted(r["plan_hash"] for r in rows.values()) == sorted(n.plan_hash for n in settled(nodes))


# -- 5. replay

def test_replay_proposes_the_recorded_edits_in_order(env, base_run, tmp_path):
    db = tmp_path / "replayed.db"
    code, _, err = search_cli(db, env["profile"], BASE_BUDGET, "--agent", "replay", "--replay-from", base_run["db"])
    assert code == 0, err
    _, original = tree(base_run["db"])
    run, replayed = tree(db)
    assert run.agent == "replay" and len(settled(replayed)) == BASE_BUDGET
    assert [(n.id, n.parent_id, n.plan_hash, n.edit, n.edit_kind) for n in replayed] == \
           [(n.id, n.parent_id, n.plan_hash, n.edit, n.edit_kind) for n in original]
    assert {n.proposer for n in replayed if n.depth > 0} <= {"seed", "replay"}
    with Store.open(base_run["db"]) as store:
        records = replay_records(store)
    assert [r["patch"] for r in records] == [n.edit for n in original if n.proposer == "heuristic"]


def test_a_seed_reproduces_the_search_edit_for_edit(env, base_run, tmp_path):
    """The same seed (the default, 0) on the same workload and evaluator: the same edits, in the same
    order, under the same parents; another seed reaches the run, whose proposer orders near-equal edits
    by it (test_heuristic.py: a short run's first edits may have no near-equal rival to reorder)."""
    def edits(db: Path) -> list[tuple]:
        return [(n.id, n.parent_id, n.plan_hash, n.edit, n.edit_kind, n.proposer) for n in tree(db)[1]]

    again = tmp_path / "again.db"
    assert search_cli(again, env["profile"], BASE_BUDGET, "--seed", 0)[0] == 0
    assert edits(again) == edits(base_run["db"])
    other = tmp_path / "other.db"
    assert search_cli(other, env["profile"], BASE_BUDGET, "--seed", 7)[0] == 0
    assert tree(other)[0].seed == 7 and tree(base_run["db"])[0].seed == 0


def test_replay_of_a_longer_run_is_exact(env, tmp_path):
    """Replayed with their recorded priors, a 20-evaluation run's edits rebuild the same tree (records do
    not say which edits came in one expansion, so much longer runs can part: agents/replay.py)."""
    def run(db: Path, proposer) -> list[tuple]:
        with Store.open(db) as store:
            search = Search.start(store, "long", WORKLOAD, str(TINY), InProcessEvaluator(env["profile"]), proposer,
                                  SearchSettings(budget=20), seed=0)
            search.run_loop()
            return [(n.id, n.parent_id, n.plan_hash) for n in store.nodes(search.run_id)]

    original = run(tmp_path / "a.db", make_proposer("heuristic"))
    with Store.open(tmp_path / "a.db") as store:
        records = replay_records(store)
    assert run(tmp_path / "b.db", make_proposer("replay", replay_records=records)) == original


def test_a_small_budget_stays_with_the_branches_that_measure_best(env, tmp_path):
    """Past the seeds, the search expands no branch whose best is clearly behind the run's best
    (`behind_margin`); with margin 0 (runs stored before it) it widens the behind root as before."""
    def behind_expansions(margin: float) -> tuple[int, int]:
        with Store.open(tmp_path / f"m{margin}.db") as store:
            search = Search.start(store, "margin", WORKLOAD, str(TINY), InProcessEvaluator(env["profile"]),
                                  make_proposer("heuristic"), SearchSettings(budget=14, behind_margin=margin), seed=0)
            search.run_loop()
            nodes = store.nodes(search.run_id)
            key = run_evaluator_id(store.run(search.run_id))
            found = {n.id: store.evaluation(eval_key(n.plan_hash, WORKLOAD, key)) for n in nodes}
            rewards = {i: reward_of(f.result) for i, f in found.items() if f is not None and f.done}
        seeds = [n for n in nodes if n.proposer == "seed"]
        best = max(rewards[n.id] for n in seeds)
        behind = {n.id for n in seeds if rewards[n.id] < 0.95 * best}
        parents = [n.parent_id for n in nodes if n.proposer != "seed"]
        return sum(p in behind for p in parents), len(parents)

    pruned, later = behind_expansions(0.05)
    assert later >= 8 and pruned == 0
    unpruned, _ = behind_expansions(0.0)
    assert unpruned >= 3


def test_one_command_searches_on_several_gpus(env, tmp_path, monkeypatch):
    """--gpus 0,1: this process on GPU 0, a process joining the run on GPU 1; one tree, one budget
    (give or take the evaluation each extra process has in flight), the helper's output logged."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # restored afterwards: the command pins this process
    db = tmp_path / "gpus.db"
    # a budget that outlasts the second process's start (torch's import) on a loaded machine
    code, out, err = search_cli(db, env["profile"], 60, "--gpus", "0,1")
    assert code == 0, err
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"
    log = tmp_path / "search-run1-gpu1.log"
    assert "GPU 1: helper exited 0" in out and str(log) in out and "run 1" in log.read_text()
    run, nodes = tree(db)
    with Store.open(db) as store:
        owners = {store.evaluation(key_of(n.plan_hash)).owner for n in settled(nodes)}
    assert len(owners) == 2 and 60 <= len(settled(nodes)) <= 61 and run.status == "finished"
    code, _, err = search_cli(tmp_path / "bad.db", env["profile"], 3, "--gpus", "0,0")
    assert code != 0 and "--gpus: '0,0' is not a comma-separated list of distinct GPU indices" in err
    assert len(err.strip().splitlines()) == 1


# -- 6. lessons, edit statistics and warm starts across runs

def test_a_new_pair_starts_from_what_other_pairs_learned(env, base_run, tmp_path):
    """A pair of another family (and another k) is seeded with the best plans of the earlier run,
    translated to its op ids, and hears that run's lessons and edit statistics."""
    db = tmp_path / "other_pair.db"
    shutil.copy(base_run["db"], db)
    pair = tmp_path / "qwen2-tiny.toml"
    pair.write_text('name = "qwen2-tiny"\ndraft = "tiny-qwen2-d"\ntarget = "tiny-qwen2-t"\nk = 2\n'
                    'draft_batch = 2\ntarget_batch = 2\ncontext = 16\ndtype = "fp32"\nseed = 0\n')
    with Store.open(db) as store:
        first = store.latest_run()
        store.add_lesson(EVALUATOR, FAMILY, "tiles", "target down: SPLIT_K 4 -> 2 gained 3%", 0.03, first.id)
        lessons_first = store.lessons(EVALUATOR, FAMILY)
        stats_first = store.edit_stats(EVALUATOR, FAMILY)
    with contextlib.chdir(REPO):
        code, out, err = cli("search", pair, "--db", db, "--budget", 4, "--evaluator", env["profile"])
    assert code == 0, err
    with Store.open(db) as store:
        second = store.latest_run()
        nodes = store.nodes(second.id)
        context = ContextBuilder(store, second, "NVIDIA H200", 132).build(nodes[0], validate_plan(nodes[0].plan), {}, nodes)
    assert family_of(second.workload) == "qwen2->qwen2" != FAMILY and second.id != first.id
    warm = [n for n in nodes if n.proposer == "warm-start"]
    assert warm and all("translated to this pair" in n.rationale and f"run {first.id}" in n.rationale for n in warm)
    new_pair = load_workload(pair)
    for n in warm:  # every translated plan expands on the new pair
        expand(validate_plan(n.plan), new_pair, build_graph(new_pair))
    assert lessons_first and context.lessons[:len(lessons_first)] == [f"(on {FAMILY}) {t}" for t in lessons_first]
    assert context.edit_stats == stats_first  # the new family has none yet: every family's


def test_a_second_run_learns_from_the_first(env, base_run, tmp_path):
    db = tmp_path / "two_runs.db"
    shutil.copy(base_run["db"], db)
    with Store.open(db) as store:
        first = store.latest_run()
        stats = store.edit_stats(EVALUATOR, FAMILY)
        best = [b for b in store.best_plans(EVALUATOR, FAMILY, SearchSettings().warm_start) if b["reward"] > 0]
    assert family_of(first.workload) == FAMILY and stats and all(s["n"] >= 1 for s in stats.values())
    assert best and best[0]["run_id"] == first.id and best[0]["reward"] > 1.0
    assert search_cli(db, env["profile"], 6)[0] == 0

    with Store.open(db) as store:
        second = store.latest_run()
        nodes = store.nodes(second.id)
        assert second.id != first.id
        stats_after = store.edit_stats(EVALUATOR, FAMILY)
        context = ContextBuilder(store, second, "NVIDIA H200", 132).build(nodes[0], validate_plan(nodes[0].plan), {}, nodes)
        lessons = store.lessons(EVALUATOR, FAMILY)
        reused = {h: store.evaluation(key_of(h)) for h in (b["plan_hash"] for b in best)}
    assert all(stats_after[k]["n"] >= s["n"] for k, s in stats.items())  # kept, and added to
    assert context.edit_stats == stats_after and context.lessons == lessons
    root = nodes[0]
    warm = {n.plan_hash for n in nodes if n.parent_id == root.id and n.proposer == "warm-start"}
    assert warm == {b["plan_hash"] for b in best} - set(SHIPPED.values())
    assert Counter(n.plan_hash for n in nodes).most_common(1)[0][1] == 1  # no plan twice in the run
    for b in best:  # a shipped best plan stays the shipped seed; none is evaluated again
        assert any(n.plan_hash == b["plan_hash"] and n.status != "new" for n in nodes)
        assert reused[b["plan_hash"]].attempts == 1 and reused[b["plan_hash"]].run_id == first.id
    assert len(settled(nodes)) == 6


# -- 7. show and export

def test_show_and_export(env, base_run, tmp_path):
    db = base_run["db"]
    code, out, err = cli("show", db)
    assert code == 0, err
    run, nodes = tree(db)
    with Store.open(db) as store:
        results = {n.id: store.evaluation(key_of(n.plan_hash)).result for n in settled(nodes)}
    best = min((n for n in settled(nodes) if results[n.id].ok), key=lambda n: results[n.id].latency_ms)
    assert "runs in" in out and "heuristic" in out and "finished" in out
    assert f"run {run.id}: best plans (modeled)" in out and f"{len(nodes)} nodes" in out
    assert re.search(rf"│ {best.id} +│", out)

    target = tmp_path / "export"
    with contextlib.chdir(tmp_path):  # elsewhere than the search ran
        code, out, err = cli("export", db, "--out", target)
    assert code == 0, err
    plan = json.loads((target / "best_plan.json").read_text())
    assert validate_plan(plan).hash == best.plan_hash
    assert plan["name"] == f"{run.name}-node{best.id}" and best.rationale in plan["description"]
    kernels = target / "kernels"
    assert list(kernels.rglob("k_*.py")) and list(kernels.rglob("manifest.json"))
    report_md = (target / "report.md").read_text()
    assert "MODELED" in report_md and f"node {best.id}" in report_md
    report = json.loads((target / "report.json").read_text())
    assert len(report["history"]) == len(nodes) and report["best"]["node"] == best.id
    assert report["best"]["plan"] == plan
    curve = report["best_so_far"]
    assert len(curve) == len(settled(nodes)) and curve == sorted(curve) and curve[-1] > 1.0
    assert (target / "best_so_far.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    script = target / "reproduce.sh"
    assert os.access(script, os.X_OK)
    text = script.read_text()
    # the shipped workload is named in the installed package's data folder; the profile outside it by its path
    assert ' "$data"/examples/tiny.toml ' in text and str(env["profile"]) in text and "best_plan.json" in text
    ran = subprocess.run(["bash", str(script)], capture_output=True, text=True, cwd="/", timeout=300)
    assert ran.returncode == 0, ran.stderr
    reproduced = json.loads((target / "reproduced.json").read_text())
    assert reproduced["plans"][0]["result"]["plan_hash"] == best.plan_hash



def test_floor_script_reads_the_best_plan_of_a_database(env, base_run, tmp_path):
    db = base_run["db"]
    run, nodes = tree(db)
    with Store.open(db) as store:
        found = {n.id: store.evaluation(key_of(n.plan_hash)) for n in settled(nodes)}
    best = min((n for n in settled(nodes) if found[n.id].result.ok), key=lambda n: found[n.id].result.latency_ms)
    streams = next(n for n in nodes if n.plan_hash == SHIPPED["streams"])
    row = load_script("floor").best_row(TINY, [db], tmp_path / "plans")
    assert (row["node"], row["best_ms"]) == (best.id, found[best.id].result.latency_ms)
    assert row["streams_ms"] == found[streams.id].result.latency_ms and row["evaluations"] == BASE_BUDGET
    assert row["measured"] == found[best.id].finished_at.date().isoformat()  # which session's baselines
    assert validate_plan(json.loads(Path(row["best_plan"]).read_text())).hash == best.plan_hash
    assert row["lineage"][0].endswith("baseline: draft phase, then verify phase")
    assert best.rationale in row["lineage"][-1]


def test_floor_script_takes_conventional_from_another_run_when_the_best_ones_evaluator_skipped_it(
        env, base_run, tmp_path):
    """An evaluator that does not measure `conventional` (h200_quick; the tiny profile here) leaves the
    best plan's row without it: the row takes the latest one another run of the workload measured
    itself, and says where."""
    floor = load_script("floor")
    own = floor.best_row(TINY, [base_run["db"]], tmp_path / "plans")
    assert own["conventional_ms"] is None and "conventional_from" not in own
    other = tmp_path / "other.db"  # as if a run whose evaluator measured it
    shutil.copy(base_run["db"], other)
    measured = []
    with contextlib.closing(sqlite3.connect(other)) as con, con:
        for key, text, finished in con.execute("SELECT id, result, finished_at FROM evaluations").fetchall():
            result = json.loads(text or "{}")
            baselines = result.get("metrics", {}).get("baselines", {})
            if "sequential" in baselines:
                ms = 2 * baselines["sequential"]["latency_ms"] + key
                baselines["conventional"] = {**baselines["sequential"], "latency_ms": ms}
                con.execute("UPDATE evaluations SET result = ? WHERE id = ?", (json.dumps(result), key))
                measured.append((finished, ms))
    assert measured
    row = floor.best_row(TINY, [base_run["db"], other], tmp_path / "plans")  # equal bests: the first database's
    assert row["db"] == str(base_run["db"]) and row["best_ms"] == own["best_ms"]
    assert row["conventional_ms"] == max(measured)[1]
    assert row["conventional_from"].startswith(f"{other}, run 1, evaluation of node ")


# -- 8. Ctrl-C

def test_ctrl_c_stops_and_a_resume_finishes(env, tmp_path):
    db, log, budget = tmp_path / "interrupted.db", tmp_path / "interrupted.log", 6
    proc = spawn(log, "search", TINY, "--db", db, "--budget", budget, "--evaluator", env["profile"])
    try:
        wait_for_done(db, proc, 1, log)
        proc.send_signal(signal.SIGINT)
        # 130, or (rarely, by CPython's own exit path) death by the signal: a shell reports both as 130
        assert proc.wait(timeout=60) in (130, -signal.SIGINT), log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    match = re.search(r"stopped; resume with: conjugate search --resume (\S+)", text)
    assert match, text
    run, nodes = tree(db)
    assert run.status == "stopped" and len(settled(nodes)) < budget

    code, out, err = cli("search", "--resume", match.group(1))
    assert code == 0, err
    run, nodes = tree(db)
    assert run.status == "finished" and len(settled(nodes)) == budget
    assert_settled_and_consistent(db, nodes)
    attempts = [r["attempts"] for r in evaluation_rows(db).values()]
    assert sum(a != 1 for a in attempts) <= 1 and max(attempts) <= 2


# -- 9. bad input

def assert_one_line_error(code: int, err: str, *fragments: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def test_bad_input_ends_in_one_line_and_exit_2(env, tmp_path):
    db = tmp_path / "bad.db"
    code, _, err = cli("search", TINY, "--db", db, "--time", "garbage", "--evaluator", env["profile"])
    assert_one_line_error(code, err, "--time", "garbage")

    text = tmp_path / "notes.txt"
    text.write_text("not a database\n")
    assert_one_line_error(*cli("search", "--resume", text)[::2], str(text))

    missing = tmp_path / "missing.db"
    assert_one_line_error(*cli("search", "--resume", missing)[::2], str(missing))
    assert not missing.exists()  # a read-only command creates no database
    assert_one_line_error(*cli("show", missing)[::2], str(missing))
    assert not missing.exists()

    empty = tmp_path / "empty.db"
    Store.open(empty).close()
    assert_one_line_error(*cli("search", "--resume", empty)[::2], str(empty), "no run")

    old = tmp_path / "v1.db"  # a store of schema version 1 (runs.gpu, lessons.gpu): refused, never migrated
    shutil.copy(empty, old)
    with contextlib.closing(sqlite3.connect(old)) as c, c:
        c.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    for command in (("show", old), ("search", "--resume", old), ("export", old, "--out", tmp_path / "x")):
        assert_one_line_error(*cli(*command)[::2], str(old), "earlier release", "conjugate plan upgrade FILE")

    code, _, err = cli("search", TINY, "--db", db, "--agent", "nonsense", "--evaluator", env["profile"])
    assert_one_line_error(code, err, "'nonsense'", "heuristic", "replay", "anthropic:<model>", "openai:<model>")
    assert not db.exists()  # a bad agent fails before any database is made

    with pytest.raises(SystemExit) as exit_info:  # argparse: a budget of 0 is not silently 20
        main(["search", str(TINY), "--db", str(db), "--budget", "0"])
    assert exit_info.value.code == 2


def test_export_of_a_run_without_an_ok_plan_is_refused(env, tmp_path):
    db = tmp_path / "failed.db"
    with Store.open(db) as store:
        search = Search.start(store, "failing", WORKLOAD, str(TINY), InProcessEvaluator(env["profile"], fail_all=True),
                              make_proposer("heuristic"), SearchSettings(budget=3), seed=0)
        assert search.run_loop() == "budget"
        assert {n.status for n in store.nodes(search.run_id)} == {"failed"}
    code, _, err = cli("export", db, "--out", tmp_path / "out")
    assert_one_line_error(code, err, "no plan was evaluated successfully")
    assert not (tmp_path / "out").exists()


# -- 10. the failure path

def test_a_failing_edit_scores_0_and_its_error_reaches_the_next_context(env, tmp_path):
    bad = Proposal(HUGE_TILES, "huge target gate_up tiles", "tiles", 0.9)
    proposer = ScriptedProposer({SHIPPED["sequential"]: [bad]})
    evaluator = InProcessEvaluator(env["profile"])
    db = tmp_path / "failing_edit.db"
    with Store.open(db) as store:
        search = Search.start(store, "failure", WORKLOAD, str(TINY), evaluator, proposer,
                              SearchSettings(budget=10), seed=0)
        assert search.run_loop() == "exhausted"  # the script ran out and every node was closed
        nodes = store.nodes(search.run_id)
        failed = [n for n in nodes if n.proposer == "scripted"]
        assert len(failed) == 1 and failed[0].status in ("failed", "expanded")
        found = store.evaluation(key_of(failed[0].plan_hash))
        lessons = store.lessons(EVALUATOR, FAMILY)
        stats = store.edit_stats(EVALUATOR, FAMILY)
        later_run = Search.start(store, "later", WORKLOAD, str(TINY), evaluator, make_proposer("heuristic"),
                                 SearchSettings(warm_start=10), seed=0)  # warm starts: every earlier plan
        seeded = {n.plan_hash for n in store.nodes(later_run.run_id)}
    assert failed[0].plan_hash not in seeded  # a failed plan is no warm start
    assert seeded == set(SHIPPED.values())
    result = found.result
    assert (result.stage, result.status) == (Stage.COMPILE, Status.COMPILE_ERROR) and found.reward == 0.0
    assert "shared memory" in result.error and result.compile_failure is not None
    node = failed[0]
    assert node.visits == 1 and node.value_sum == 0.0 and node.best_reward == 0.0 and node.edit == HUGE_TILES
    assert sorted(evaluator.calls) == sorted(n.plan_hash for n in nodes)  # each plan evaluated once
    assert_settled_and_consistent(db, nodes)

    first = proposer.contexts.index(next(c for c in proposer.contexts if c.plan_hash == SHIPPED["sequential"]))
    later = proposer.contexts[first + 1:]
    assert later and proposer.contexts[first].failures == []
    for context in proposer.contexts:  # the GPU the analytical profile stands for, and the evaluator apart
        assert (context.evaluator, context.device, context.sms) == (EVALUATOR, "NVIDIA H200", 132)
    for context in later:  # every later expansion hears of the failure
        assert context.failures == [{"patch": HUGE_TILES, "status": "compile_error", "error": result.error[:300]}]
        assert any(lesson.startswith("tiles edit failed (compile_error)") for lesson in context.lessons)
    assert stats["tiles"] == {"n": 1, "mean_gain": -1.0}
    assert any("tiles edit failed" in lesson for lesson in lessons)
    root_again = [c for c in later if c.plan_hash == SHIPPED["sequential"]]
    assert root_again and {"patch": HUGE_TILES, "kind": "tiles", "status": "compile_error", "reward": 0.0} \
        in root_again[0].tried


def test_a_node_another_process_held_is_settled_before_it_is_expanded(env, tmp_path):
    """While the root is evaluated, a live process elsewhere claims the streams seed's evaluation: the
    loop waits for it (stale_after_s) and moves on; when selection reaches the unsettled node it takes
    the stale claim over and settles it, rather than expanding a node that never counted. (The tree
    policy to the end: the best-node selection of exploit_last, like greedy's, picks evaluated nodes only.)"""
    evaluator = InProcessEvaluator(env["profile"])
    key = key_of(SHIPPED["streams"])
    with Store.open(tmp_path / "held.db") as store:
        search = Search.start(store, "held", WORKLOAD, str(TINY), evaluator, make_proposer("heuristic"),
                              SearchSettings(budget=6, stale_after_s=2.0, exploit_last=0.0), seed=0)
        evaluator.after = lambda: store.claim_evaluation(key, SHIPPED["streams"], search.run_id, "elsewhere:1", 1800)
        events = []
        search.on_event = lambda kind, data: events.append((kind, data.get("node")))
        assert search.run_loop() == "budget"
        streams = store.node_by_hash(search.run_id, SHIPPED["streams"])
        nodes = store.nodes(search.run_id)
        assert store.evaluation(key).attempts == 2 and search.evaluations_done() == 6
    assert events.index(("evaluate", streams.id)) < events.index(("evaluate", 3)) < \
        events.index(("result", streams.id))  # given up on once, settled later
    assert ("expand", streams.id) not in events[:events.index(("result", streams.id))]
    assert streams.status != "new" and len(settled(nodes)) == 6
    assert_settled_and_consistent(tmp_path / "held.db", nodes)


def test_reward_and_evaluation_key():
    metrics = Metrics(latency_ms=1.0, floor_ms=0.5, floor_ratio=2.0, bandwidth_gbs=100.0, launches=3,
                      device="NVIDIA H200", sms=132, speedups={"sequential": 1.25, "streams": 0.9})
    ok = EvalResult("h", "tiny", "analytical", Stage.TIMING, Status.OK, True, metrics)
    assert reward_of(ok) == 1.25
    assert reward_of(replace(ok, metrics=replace(metrics, speedups={"streams": 0.9}))) == 0.9  # no sequential
    assert reward_of(EvalResult("h", "tiny", "analytical", Stage.COMPILE, Status.COMPILE_ERROR, True)) == 0.0
    key = eval_key("h", WORKLOAD, "analytical")
    assert key == eval_key("h", load_workload(TINY), "analytical")
    assert len({key, eval_key("h2", WORKLOAD, "analytical"), eval_key("h", WORKLOAD, "h200")}) == 3


def test_an_edited_profile_is_a_different_evaluator(tmp_path):
    """A re-calibrated profile keys its evaluations afresh; where the file lives does not matter."""
    shipped = load_profile("analytical")
    copy = tmp_path / "analytical.toml"
    copy.write_text((REPO / "evaluators" / "analytical.toml").read_text())
    assert evaluator_id(load_profile(copy)) == evaluator_id(shipped)
    refitted = replace(shipped, model=replace(shipped.model, launch_overhead_us=shipped.model.launch_overhead_us + 1))
    assert evaluator_id(refitted) != evaluator_id(shipped) and evaluator_id(shipped).startswith("analytical@")


def test_an_llm_agent_drives_the_search_and_resumes_against_its_server(env, tmp_path, monkeypatch):
    """`--agent openai:<model> --base-url` end to end: the real SDK against a loopback server, every
    call stored without the key, the base URL kept for a resume (its credentials dropped)."""
    from loopback import Loopback

    secret = "sk-test-search-0123456789"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    edits = {"edits": [{"patch": [{"op": "replace", "path": "/cross/launch/num_warps", "value": w}],
                        "rationale": f"{w} warps", "kind": "cross"} for w in (2, 8)]}
    db = tmp_path / "llm.db"
    with Loopback("openai") as server:
        for _ in range(30):
            server.reply(json.dumps(edits))
        url = server.base_url.replace("http://", "http://user:hunter2@")
        code, _, err = search_cli(db, env["profile"], 5, "--agent", "openai:loopback-model", "--base-url", url)
        assert code == 0, err
        asked = len(server.requests)
        code, _, err = cli("search", "--resume", db, "--budget", 7)
        assert code == 0, err
        assert len(server.requests) > asked  # the resume asked the run's own server
    # the resumed requests went to the stored URL, without its credentials, with the key from the env
    assert all(r.headers["authorization"] == f"Bearer {secret}" for r in server.requests[asked:])
    with Store.open(db) as store:
        run = store.latest_run()
        nodes = store.nodes(run.id)
    assert run.agent == "openai:loopback-model" and run.settings["base_url"] == server.base_url
    assert len(settled(nodes)) == 7 and any(n.proposer == "openai:loopback-model" for n in nodes)
    with sqlite3.connect(db) as c:
        calls = c.execute("SELECT provider, model, prompt, reply, error FROM llm_calls").fetchall()
        dump = "\n".join(line for line in c.iterdump())
    assert len(calls) == len(server.requests) and all(p == "openai" and e == "" for p, _, _, _, e in calls)
    assert secret not in dump and "hunter2" not in dump


def test_a_resume_refuses_an_edited_workload_or_profile(env, tmp_path):
    """A run's evaluations are keyed by its workload and evaluator settings as they were: editing either
    file and resuming (or showing) is refused in one line, not silently scored anew or shown empty."""
    workload, profile, db = tmp_path / "w.toml", tmp_path / "p.toml", tmp_path / "edit.db"
    workload.write_text(TINY.read_text())
    profile.write_text(Path(env["profile"]).read_text())
    assert cli("search", workload, "--db", db, "--budget", 3, "--evaluator", profile)[0] == 0

    profile.write_text(re.sub(r"(?m)^launch_overhead_us = .*$", "launch_overhead_us = 9.0", profile.read_text()))
    assert_one_line_error(*cli("search", "--resume", db, "--budget", 4)[::2], str(profile), "profile changed")
    with sqlite3.connect(db) as raw:  # the run's stored profile path now names a folder, not a profile
        raw.execute("UPDATE runs SET settings = json_set(settings, '$.evaluator_profile', ?)", (str(tmp_path),))
    code, _, err = cli("search", "--resume", db, "--budget", 4)
    assert (code, err.strip()) == (2, f"error: {db}: run 1: the evaluator profile it stored: no evaluator profile named "
                                      f"{str(tmp_path)!r}; known: " + err.split("; known: ")[-1].strip())
    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE runs SET settings = json_set(settings, '$.evaluator_profile', ?)", (str(profile),))
    workload.write_text(TINY.read_text().replace("seed = 0", "seed = 7"))
    assert_one_line_error(*cli("search", "--resume", db, "--budget", 4)[::2], str(workload), "workload changed")
    assert_one_line_error(*cli("show", db)[::2], str(workload), "workload changed")


def test_a_database_moved_away_from_its_workload_file_shows_exports_and_resumes(env, tmp_path):
    """A committed or copied database outlives the checkout it was made in: with its workload file gone,
    show, export and resume use the workload the run stored (its models are presets); a file given
    with --workload / the positional argument relocates it and must be the same workload."""
    workload, db = tmp_path / "w.toml", tmp_path / "moved.db"
    workload.write_text(TINY.read_text())
    assert cli("search", workload, "--db", db, "--budget", 3, "--evaluator", env["profile"])[0] == 0
    workload.unlink()

    code, out, err = cli("show", db)
    assert code == 0 and "3 nodes, 3 ok" in out, err
    code, out, err = cli("export", db, "--out", tmp_path / "ex")
    assert code == 0 and (tmp_path / "ex" / "best_plan.json").exists(), err
    assert load_workload(tmp_path / "ex" / "workload.toml") == WORKLOAD  # the export carries it
    assert '"$here/workload.toml"' in (tmp_path / "ex" / "reproduce.sh").read_text()
    code, out, err = cli("search", "--resume", db, "--budget", 4)
    assert code == 0, err
    code, out, err = cli("search", TINY, "--resume", db, "--budget", 5)  # the same workload, given elsewhere
    assert code == 0, err
    code, out, err = cli("show", db, "--workload", TINY)
    assert code == 0 and "5 ok, 0 failed" in out, out + err  # evaluated, not crashed on the lost file

    assert cli("export", db, "--out", tmp_path / "ex2", "--workload", TINY)[0] == 0
    assert not (tmp_path / "ex2" / "workload.toml").exists() and str(TINY.name) in (tmp_path / "ex2" / "reproduce.sh").read_text()
    other = tmp_path / "other.toml"
    other.write_text(TINY.read_text().replace("seed = 0", "seed = 7"))
    for argv in (("export", db, "--out", tmp_path / "ex3", "--workload", other), ("show", db, "--workload", other),
                 ("search", other, "--resume", db, "--budget", 6)):
        assert_one_line_error(*cli(*argv)[::2], str(other), "not the workload run 1 searched",
                              "field 'seed' is 7, the run's 0")


def test_a_moved_run_whose_checkpoint_is_gone_names_the_field_and_the_path(tmp_path):
    from types import SimpleNamespace

    from conjugate.errors import ConjugateError
    from conjugate.search.runs import run_workload

    stored = replace(WORKLOAD, draft_source=str(tmp_path / "gone-checkpoint"))
    run = SimpleNamespace(id=1, workload_name=stored.name, workload_path=str(tmp_path / "gone.toml"),
                          workload={**stored.to_dict(), "family": FAMILY})
    with pytest.raises(ConjugateError, match=r"gone\.toml: no such workload file, and its field 'draft' names a "
                                             r"checkpoint that is not here either \(.*gone-checkpoint\); the run "
                                             r"needs it at that path"):
        run_workload(run)
    with_presets = SimpleNamespace(**{**vars(run), "workload": {**WORKLOAD.to_dict(), "family": FAMILY}})
    assert run_workload(with_presets) == WORKLOAD  # rebuilt from what the run stored


def test_a_resume_falls_back_to_the_profile_of_its_name_where_its_file_is_gone(tmp_path):
    """A copy of a shipped profile, gone by the resume: the shipped one of its name scores the rest (the
    same settings, so the same evaluations' key); a profile file of other settings, gone: refused."""
    copy, db, small = tmp_path / "analytical.toml", tmp_path / "profile.db", tmp_path / "small.toml"
    copy.write_text((REPO / "evaluators" / "analytical.toml").read_text())
    # tiny with one sequence drafting one token: the copy checks each round under the interpreter, quicker
    small.write_text(re.sub(r"(?m)^(k|draft_batch|target_batch) = .*$", r"\1 = 1", TINY.read_text()))
    assert cli("search", small, "--db", db, "--budget", 1, "--evaluator", copy)[0] == 0
    copy.unlink()
    code, out, err = cli("search", "--resume", db, "--budget", 2)
    assert code == 0, err
    assert "2 ok, 0 failed" in cli("show", db)[1]

    edited, db2 = tmp_path / "edited.toml", tmp_path / "edited.db"
    shipped = (REPO / "evaluators" / "analytical.toml").read_text()
    edited.write_text(re.sub(r"(?m)^launch_overhead_us = .*$", "launch_overhead_us = 9.0",
                             re.sub(r"(?m)^max_params = .*$", "max_params = 0", shipped)))  # unchecked: quick
    assert cli("search", TINY, "--db", db2, "--budget", 1, "--evaluator", edited)[0] == 0
    edited.unlink()
    assert_one_line_error(*cli("search", "--resume", db2, "--budget", 2)[::2], "profile changed")


# Moves that commute, each with the factor it puts on the round's latency wherever it is made.
LANDSCAPE = [([{"op": "replace", "path": "/draft/tiles/qkv/BLOCK_N", "value": 32}], 1.05),
             ([{"op": "replace", "path": "/draft/tiles/o_proj/BLOCK_N", "value": 32}], 1.04),
             ([{"op": "replace", "path": "/draft/reduce", "value": "atomic"}], 0.97),
             ([{"op": "replace", "path": "/target/tiles/qkv/BLOCK_N", "value": 32}], 0.99),
             ([{"op": "replace", "path": "/draft/tiles/down/BLOCK_N", "value": 32}], 1.0)]


def _holds(plan: Plan | dict, move: list[dict]) -> bool:
    _, *keys = move[0]["path"].split("/")
    value = plan.to_dict() if isinstance(plan, Plan) else plan
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value == move[0]["value"]


class LandscapeEvaluator:
    """Latency: the plan's layout (two streams 0.8 ms, else 1 ms) times the factor of each move of its
    landscape (LANDSCAPE unless given) it holds; the sequential baseline 2 ms."""

    def __init__(self, profile_path: Path, landscape: list = LANDSCAPE):
        self.profile, self.landscape = load_profile(profile_path), landscape

    def evaluate(self, plan: Plan, workload_path) -> EvalResult:
        latency = 0.8 if plan["cross"]["streams"] == "two" else 1.0
        for move, factor in self.landscape:
            latency *= factor if _holds(plan, move) else 1.0
        metrics = Metrics(latency, 0.5, latency / 0.5, 100.0, 3, "none", 1,
                          {"sequential": Baseline("ok", 2.0, modeled=True)}, {"sequential": 2.0 / latency})
        return EvalResult(plan.hash, "tiny", self.profile.name, Stage.TIMING, Status.OK, True,
                          metrics=metrics)


class LandscapeProposer:
    """Offers every LANDSCAPE move the plan does not hold yet, the harmful ones first and most confidently."""
    name = "landscape"

    def propose(self, context, n: int) -> list[Proposal]:
        return [Proposal(move, f"move {i}", "tiles", 0.9 if factor > 1 else 0.5)
                for i, (move, factor) in enumerate(LANDSCAPE) if not _holds(context.plan, move)][:n]


def test_move_memory_stops_offering_a_move_that_lost_wherever_it_was_made(env, tmp_path):
    """MCTS with move memory makes each harmful move at most `move_memory` times (it commutes with the
    others, so every branch offers it again); without it the same budget keeps re-trying them and
    ends no better."""
    def run(memory: int) -> tuple[Counter, float]:
        with Store.open(tmp_path / f"moves{memory}.db") as store:
            search = Search.start(store, "moves", WORKLOAD, str(TINY), LandscapeEvaluator(env["profile"]),
                                  LandscapeProposer(), SearchSettings(budget=30, move_memory=memory), seed=0)
            search.run_loop()
            nodes = store.nodes(search.run_id)
            made = Counter(n.rationale.split(" (")[0] for n in nodes if n.proposer == "landscape")
            best = min(search.results[n.plan_hash].latency_ms for n in nodes if n.plan_hash in search.results)
        return made, best

    remembered, best_remembered = run(2)
    forgetful, best_forgetful = run(0)
    assert remembered["move 0"] <= 2 and remembered["move 1"] <= 2, remembered
    assert forgetful["move 0"] + forgetful["move 1"] >= 8, forgetful
    assert best_remembered == pytest.approx(0.8 * 0.97 * 0.99) and best_remembered <= best_forgetful


class SiblingProposer:
    """Offers the two good moves (LANDSCAPE 2 and 3) only where the plan holds neither, so that one
    branch holds each and no proposal ever makes both; elsewhere only the harmful moves."""
    name = "siblings"

    def propose(self, context, n: int) -> list[Proposal]:
        good = [2, 3] if not any(_holds(context.plan, LANDSCAPE[i][0]) for i in (2, 3)) else []
        return [Proposal(LANDSCAPE[i][0], f"move {i}", "tiles", 0.5 if i in good else 0.9)
                for i in good + [0, 1] if not _holds(context.plan, LANDSCAPE[i][0])][:n]


def test_a_move_that_gained_in_one_branch_is_made_in_the_others(env, tmp_path):
    """MCTS with move memory carries the move that gained most elsewhere to the node it expands: the
    plan holding both good moves is found though the proposer never offers them together; without
    the memory it never is."""
    def run(memory: int) -> tuple[float, list[str]]:
        with Store.open(tmp_path / f"carried{memory}.db") as store:
            search = Search.start(store, "carried", WORKLOAD, str(TINY), LandscapeEvaluator(env["profile"]),
                                  SiblingProposer(), SearchSettings(budget=16, move_memory=memory), seed=0)
            search.run_loop()
            nodes = store.nodes(search.run_id)
            best = min(search.results[n.plan_hash].latency_ms for n in nodes if n.plan_hash in search.results)
        return best, [n.rationale for n in nodes]

    both = 0.8 * 0.97 * 0.99
    best, rationales = run(2)
    assert best == pytest.approx(both)
    carried = [r for r in rationales if r.startswith("gained elsewhere in this run, so made here too: move ")]
    assert carried and all("(elsewhere in this run: +" in r for r in carried)
    assert not any("move 0" in r or "move 1" in r for r in carried)  # only moves that gained are carried
    assert run(0)[0] > both * 1.005


class GainFirstProposer:
    """Offers the good LANDSCAPE moves the plan lacks first, then the harmful ones: three per node."""
    name = "gain-first"

    def propose(self, context, n: int) -> list[Proposal]:
        order = sorted(range(len(LANDSCAPE)), key=lambda i: LANDSCAPE[i][1])
        return [Proposal(LANDSCAPE[i][0], f"move {i}", "tiles", 0.9 if LANDSCAPE[i][1] < 1 else 0.5)
                for i in order if not _holds(context.plan, LANDSCAPE[i][0])][:n]


def test_deepen_first_builds_on_a_gain_before_measuring_its_siblings(env, tmp_path):
    """With deepen_first, once an edit of an expansion gains, the expansion's other edits wait as new
    nodes and the search builds on the gain: both good moves are held two evaluations after the
    seeds, where measuring every sibling first takes four (the second good move and a neutral one
    beside the first). The waiting nodes stay in the tree; a
    resume does not settle them first, selection comes back to them."""
    both = 0.8 * 0.97 * 0.99

    def run(deepen_first: bool, budget: int) -> tuple[list[float], Search, Store]:
        store = Store.open(tmp_path / f"deepen{deepen_first}.db")
        search = Search.start(store, "deepen", WORKLOAD, str(TINY), LandscapeEvaluator(env["profile"]),
                              GainFirstProposer(), SearchSettings(budget=budget, move_memory=0,
                                                                  deepen_first=deepen_first), seed=0)
        search.run_loop()
        settled = sorted((n for n in store.nodes(search.run_id) if n.status is not NodeStatus.NEW),
                         key=lambda n: store.evaluation(key_of(n.plan_hash)).finished_at)
        return [search.results[n.plan_hash].latency_ms for n in settled], search, store

    deep, search, store = run(True, 5)
    plain, _, plain_store = run(False, 7)
    plain_store.close()
    assert deep[3:] == [pytest.approx(0.8 * 0.97), pytest.approx(both)]  # after sequential, streams, interleave
    assert plain[3:] == [pytest.approx(0.8 * 0.97), pytest.approx(0.8 * 0.99), pytest.approx(0.8),
                         pytest.approx(both)]  # the neutral move 4 measured first
    waiting = [n for n in store.nodes(search.run_id) if n.status is NodeStatus.NEW]
    assert sorted(n.rationale for n in waiting) == ["move 1", "move 3", "move 4", "move 4"]
    assert all(search._waits(n) for n in waiting)
    # only a gain of the same expansion makes a node wait: a node widened again beside an older gain
    # measures its new edits
    assert not any(search._waits(n, {n.id}) for n in waiting)
    store.close()
    with Store.open(tmp_path / "deepenTrue.db") as store:  # a resume goes on from the best, not the waiting
        resumed = Search(store, search.run_id, WORKLOAD, str(TINY), LandscapeEvaluator(env["profile"]),
                         GainFirstProposer(), replace(search.settings, budget=6))
        resumed.run_loop()
        new = [n for n in store.nodes(search.run_id) if n.status is not NodeStatus.NEW][-1]
        assert new.id not in {n.id for n in waiting}
        resumed.settings = replace(resumed.settings, budget=30)
        resumed.run_loop()
        assert {n.id for n in waiting} & {n.id for n in store.nodes(search.run_id) if n.status is not NodeStatus.NEW}


def test_exploit_every_widens_the_best_open_node_one_expansion_in_n(env, tmp_path):
    """exploit_every N: the tree policy picks, except one expansion in N (counted in evaluations, so a
    resume keeps the rhythm), which widens the run's best open node as hill-climbing would; with N 1
    every expansion does: no node measured before a new one and still open at the end (so open when
    the new one was made) was faster than its parent."""
    with Store.open(tmp_path / "exploit.db") as store:
        search = Search.start(store, "exploit", WORKLOAD, str(TINY), LandscapeEvaluator(env["profile"]),
                              GainFirstProposer(), SearchSettings(budget=4, exploit_every=3, exploit_last=0.0), seed=0)
        rhythm = [search._selection(done) for done in range(12)]
        assert rhythm == ["mcts"] * 6 + ["best"] * 3 + ["mcts"] * 3
    with Store.open(tmp_path / "exploit1.db") as store:
        search = Search.start(store, "exploit", WORKLOAD, str(TINY), LandscapeEvaluator(env["profile"]),
                              SiblingProposer(), SearchSettings(budget=12, move_memory=0, exploit_every=1), seed=0)
        search.run_loop()
        nodes = sorted(store.nodes(search.run_id), key=lambda n: n.id)
        latency = {n.id: search.results[n.plan_hash].latency_ms for n in nodes if n.plan_hash in search.results}
        grown = [n for n in nodes if n.proposer == "siblings"]
        assert len(grown) >= 6
        open_at_end = {i for i, t in search.tree.items() if not t.closed}
        for n in grown:
            earlier = [i for i in latency if i < n.id and i in open_at_end and store.node(i).parent_id != n.parent_id]
            assert all(latency[n.parent_id] <= latency[i] for i in earlier)
        exploited = [n.parent_id for n in grown]
    with Store.open(tmp_path / "exploit0.db") as store:  # the tree policy alone widens otherwise
        search = Search.start(store, "exploit", WORKLOAD, str(TINY), LandscapeEvaluator(env["profile"]),
                              SiblingProposer(), SearchSettings(budget=12, move_memory=0, exploit_last=0.0), seed=0)
        search.run_loop()
        assert [n.parent_id for n in sorted(store.nodes(search.run_id), key=lambda n: n.id)
                if n.proposer == "siblings"] != exploited
    assert SearchSettings.from_dict({"budget": 9}).exploit_every == 0  # a run stored before the setting


def test_exploit_last_widens_the_best_open_node_over_the_budget_s_end(env, tmp_path):
    """exploit_last: the tree policy picks until that share of the budget is left, then every expansion
    widens the run's best open node; off (0) for runs stored before the setting; greedy and random
    keep their own selection."""
    with Store.open(tmp_path / "last.db") as store:
        search = Search.start(store, "last", WORKLOAD, str(TINY), LandscapeEvaluator(env["profile"]),
                              GainFirstProposer(), SearchSettings(budget=12, exploit_last=0.25), seed=0)
        picks = [search._selection(done) for done in range(12)]
        assert picks == ["mcts"] * 9 + ["best"] * 3
        search.settings = replace(search.settings, budget=10, exploit_last=0.7)  # 3 left to the tree policy
        assert [search._selection(done) for done in (2, 3)] == ["mcts", "best"]
        search.settings = replace(search.settings, exploit_last=0.0)
        assert search._selection(3) == "mcts"  # off: the tree policy to the end
        search.proposer = make_proposer("random", seed=0)
        search.settings = replace(search.settings, exploit_last=0.25)
        assert search._selection(3) == "uniform"
    assert SearchSettings().exploit_last == 0.25
    assert SearchSettings.from_dict({"budget": 9}).exploit_last == 0.0  # a run stored before the setting
    for wrong in (-0.5, 1.5):
        with pytest.raises(ValueError, match=f"search setting 'exploit_last' is {wrong}"):
            SearchSettings.from_dict({"budget": 9, "exploit_last": wrong})


# Small gains: each move alone gains 0.3% (under the deepen margin of 0.5%, over MERGE_GAIN), two lose.
SMALL_GAINS = [([{"op": "replace", "path": f"/{model}/tiles/{op}/BLOCK_N", "value": 32}], factor)
               for model, op, factor in (("draft", "qkv", 0.997), ("draft", "o_proj", 0.997),
                                         ("target", "qkv", 0.997), ("target", "o_proj", 0.997),
                                         ("draft", "down", 1.05), ("target", "down", 1.05))]


class SmallGainsProposer:
    """Offers every SMALL_GAINS move the plan lacks, one harmful move first, and nothing else."""
    name = "small-gains"

    def propose(self, context, n: int) -> list[Proposal]:
        order = [4, 0, 1, 2, 3, 5]
        return [Proposal(SMALL_GAINS[i][0], f"move {i}", "tiles", 0.9 if i == 4 else 0.5)
                for i in order if not _holds(context.plan, SMALL_GAINS[i][0])][:n]


def test_the_run_s_small_gains_are_offered_together(env, tmp_path):
    """With merge_moves an expansion also offers every move that gained in the run, together: gains
    each under the deepen margin, which MCTS does not build on one by one, are held together within
    the budget, and no harmful move joins them; without it, the same budget ends with fewer of them."""
    def run(merge: bool, budget: int = 11) -> tuple[float, list]:
        with Store.open(tmp_path / f"merge{merge}.db") as store:
            evaluator = LandscapeEvaluator(env["profile"], SMALL_GAINS)
            search = Search.start(store, "merge", WORKLOAD, str(TINY), evaluator, SmallGainsProposer(),
                                  SearchSettings(budget=budget, merge_moves=merge), seed=0)
            search.run_loop()
            nodes = store.nodes(search.run_id)
            best = min(search.results[n.plan_hash].latency_ms for n in nodes if n.plan_hash in search.results)
        return best, nodes

    every_gain = 0.8 * 0.997 ** 4
    best, nodes = run(True)
    assert best == pytest.approx(every_gain)
    merges = [n for n in nodes if n.proposer == "small-gains" + MERGE_SUFFIX]
    assert merges and all(n.rationale.startswith("the ") and " moves that gained in this run, together (+0.3%, +0.3%"
                          in n.rationale for n in merges)
    assert all(len(n.edit) >= 2 and not any(op["path"].startswith("/draft/tiles/down") for op in n.edit)
               for n in merges)  # the harmful move never joins a merge
    without, _ = run(False)
    assert without > every_gain * 1.002


def _merged(search: Search, memory: MoveMemory, node, proposals: list[Proposal]) -> list[Proposal]:
    """moves.merged as an expansion of `node` calls it."""
    return merged(memory, node, validate_plan(node.plan), {n.id: n for n in search.store.nodes(search.run_id)},
                  proposals)


class ClashEvaluator(LandscapeEvaluator):
    """SMALL_GAINS, except that moves 0 and 1 together make the round 6% slower."""

    def evaluate(self, plan: Plan, workload_path) -> EvalResult:
        result = super().evaluate(plan, workload_path)
        if not all(_holds(plan, SMALL_GAINS[i][0]) for i in (0, 1)):
            return result
        latency = result.metrics.latency_ms * 1.06
        return replace(result, metrics=replace(result.metrics, latency_ms=latency,
                                                speedups={"sequential": 2.0 / latency}))


def test_a_merge_that_lost_is_not_made_again(env, tmp_path, monkeypatch):
    """Two moves that gain alone and lose together: the first merge holding both loses, and its
    moves join no later merge (MoveMemory.charge); without the charge the clash is merged again
    in the same budget."""
    def merges(budget: int = 16) -> list:
        with Store.open(tmp_path / f"clash{len(list(tmp_path.iterdir()))}.db") as store:
            search = Search.start(store, "clash", WORKLOAD, str(TINY), ClashEvaluator(env["profile"], SMALL_GAINS),
                                  SmallGainsProposer(), SearchSettings(budget=budget), seed=0)
            search.run_loop()
            return [n for n in store.nodes(search.run_id) if n.proposer.endswith(MERGE_SUFFIX)]

    charged = merges()
    clashing = [n for n in charged if all(op in n.edit for op in SMALL_GAINS[0][0] + SMALL_GAINS[1][0])]
    assert len(clashing) == 1
    # the charge turns off merging only for the clash's moves: moves 2 and 3 are still merged later
    assert any(n.edit == SMALL_GAINS[2][0] + SMALL_GAINS[3][0] for n in charged if n.id > clashing[0].id)
    monkeypatch.setattr(MoveMemory, "charge", lambda self, merge, gain: None)
    uncharged = merges()
    assert len([n for n in uncharged if all(op in n.edit for op in SMALL_GAINS[0][0] + SMALL_GAINS[1][0])]) >= 2


def test_a_merge_is_recorded_as_such_and_charged_wherever_it_lost(env, tmp_path):
    """A merge's node carries the proposer's name and MERGE_SUFFIX, teaches no edit-kind statistics
    (its moves are of several kinds), and is charged where it lost even as a move carried to another
    branch (same patch, the proposer's plain name): its moves join no later merge, the others do."""
    with Store.open(tmp_path / "charged.db") as store:
        evaluator = ClashEvaluator(env["profile"], SMALL_GAINS)
        search = Search.start(store, "merge", WORKLOAD, str(TINY), evaluator, SmallGainsProposer(),
                              SearchSettings(budget=3), seed=0)
        search.run_loop()
        streams = next(n for n in store.nodes(search.run_id) if n.rationale == "shipped plan streams")

        def child(parent, patch: list[dict], proposer: str):
            plan = patch_plan(validate_plan(parent.plan), patch)
            node_id, _ = store.add_node(search.run_id, plan.to_dict(), plan.hash, parent.id, patch, "r", proposer,
                                        "tiles", 0.5)
            search.results[plan.hash] = evaluator.evaluate(plan, TINY)
            return store.node(node_id)

        holds_1 = child(streams, SMALL_GAINS[1][0], "small-gains")
        for i in (0, 2, 3):
            child(streams, SMALL_GAINS[i][0], "small-gains")
        merge = SMALL_GAINS[0][0] + SMALL_GAINS[2][0]
        made = child(streams, merge, "small-gains" + MERGE_SUFFIX)  # gained where made
        stats = store.edit_stats(search.run.evaluator, None)
        search._learn(made, search.results[made.plan_hash], reward_of(search.results[made.plan_hash]))
        assert store.edit_stats(search.run.evaluator, None) == stats
        memory = search._move_memory(store.nodes(search.run_id))
        assert move_key(merge) in memory.merges and not memory.in_lost_merge
        child(holds_1, merge, "small-gains")  # carried beside move 1: the clash, 6% slower
        memory = search._move_memory(store.nodes(search.run_id))
        assert memory.in_lost_merge == {move_key(SMALL_GAINS[0][0]), move_key(SMALL_GAINS[2][0])}
        assert {move_key(m.patch) for m in memory.gainers()} == {move_key(SMALL_GAINS[i][0]) for i in (1, 3)}
        search.settings = replace(search.settings, charge_merges=False)  # as a run stored before the charge
        assert not search._move_memory(store.nodes(search.run_id)).in_lost_merge


def test_a_merge_is_offered_only_when_new_and_replaces_its_moves_alone(env, tmp_path):
    with Store.open(tmp_path / "merge_new.db") as store:
        search = Search.start(store, "merge", WORKLOAD, str(TINY), LandscapeEvaluator(env["profile"], SMALL_GAINS),
                              SmallGainsProposer(), SearchSettings(budget=3), seed=0)
        search.run_loop()
        streams = next(n for n in store.nodes(search.run_id) if n.rationale == "shipped plan streams")
        memory = MoveMemory()
        for i in (0, 1):
            memory.add(SMALL_GAINS[i][0], 0.003, "tiles", f"move {i}")
        alone = [Proposal(SMALL_GAINS[i][0], f"move {i}", "tiles", 0.5) for i in (0, 2)]
        merged = _merged(search, memory, streams, alone)
        assert [p.patch for p in merged] == [SMALL_GAINS[0][0] + SMALL_GAINS[1][0], SMALL_GAINS[2][0]]
        assert move_key(merged[0].patch) in memory.merges
        plan = patch_plan(validate_plan(streams.plan), merged[0].patch)
        store.add_node(search.run_id, plan.to_dict(), plan.hash, streams.id, merged[0].patch, "r", "test", "tiles", 0.5)
        assert _merged(search, memory, streams, alone) == alone  # the merged plan is in the run already


def test_a_merge_leaves_the_edits_of_the_node_s_path_alone(env, tmp_path):
    """A move that gained elsewhere but writes what an edit on the node's path wrote (the draft's
    `pdl` released at the start, where the path released it at the end) joins no merge there."""
    with Store.open(tmp_path / "merge_path.db") as store:
        search = Search.start(store, "merge", WORKLOAD, str(TINY), LandscapeEvaluator(env["profile"], SMALL_GAINS),
                              SmallGainsProposer(), SearchSettings(budget=3), seed=0)
        search.run_loop()
        streams = next(n for n in store.nodes(search.run_id) if n.rationale == "shipped plan streams")
        start = [{"op": "replace", "path": "/draft/pdl", "value": "start"}]
        end = [{"op": "replace", "path": "/draft/pdl", "value": "end"}]
        plan = patch_plan(validate_plan(streams.plan), end)
        node_id, _ = store.add_node(search.run_id, plan.to_dict(), plan.hash, streams.id, end, "end", "test",
                                    "pdl", 0.5)
        memory = MoveMemory()
        memory.add(start, 0.05, "pdl", "start")
        memory.add(SMALL_GAINS[0][0], 0.003, "tiles", "move 0")
        memory.add(SMALL_GAINS[1][0], 0.003, "tiles", "move 1")
        merged = _merged(search, memory, store.node(node_id), [])
        assert len(merged) == 1 and merged[0].patch == SMALL_GAINS[0][0] + SMALL_GAINS[1][0]
        memory.add(SMALL_GAINS[1][0], -0.01, "tiles", "move 1")  # lost clearly once: one move is left
        assert _merged(search, memory, store.node(node_id), []) == []
        # at the streams node itself the release at the start is the largest gain and joins
        merged = _merged(search, MoveMemory({move_key(start): [0.05], move_key(SMALL_GAINS[0][0]): [0.003]},
                                           {move_key(start): (start, "pdl", "start"),
                                            move_key(SMALL_GAINS[0][0]): (SMALL_GAINS[0][0], "tiles", "move 0")}),
                                store.node(streams.id), [])
        assert merged and merged[0].patch == start + SMALL_GAINS[0][0]


def test_stored_settings_read_back_and_refuse_the_wrong_type():
    settings = SearchSettings(budget=9, deepen_first=True)
    assert SearchSettings.from_dict(json.loads(json.dumps(settings.to_dict()))) == settings
    assert SearchSettings.from_dict({"budget": 9}).deepen_first is False  # a run stored before the setting
    assert SearchSettings.from_dict({"budget": 9}).merge_moves is False and SearchSettings().merge_moves
    assert SearchSettings.from_dict({"budget": 9, "merge_moves": True}).charge_merges is False  # stored before it
    for key, value in (("deepen_first", 1), ("deepen_first", "yes"), ("budget", True), ("c_puct", "0.7"),
                       ("budget", 0), ("expand_width", 0), ("c_puct", -5), ("behind_margin", float("nan")),
                       ("budget", LIMITS["budget"] + 1), ("expand_width", LIMITS["expand_width"] + 1),
                       ("warm_start", 10 ** 12), ("stale_after_s", float("inf"))):
        with pytest.raises(ValueError, match=f"search setting '{key}' is"):
            SearchSettings.from_dict({**settings.to_dict(), key: value})
        with pytest.raises(ValueError, match=f"search setting '{key}' is"):
            SearchSettings(**{**settings.to_dict(), key: value})  # made in code, as a command makes them


@pytest.mark.filterwarnings("ignore:Glyph")  # the plot's font lacks the rocket
def test_a_moved_run_with_an_odd_name_resumes_from_the_workload_it_stored(env, tmp_path):
    """A workload name that is no file name, with characters TOML escapes differently from JSON: the
    file written for the worker (and the export's workload.toml) reads back as the run's workload."""
    workload, db = tmp_path / "w.toml", tmp_path / "odd.db"
    workload.write_text(TINY.read_text().replace('name = "tiny"', 'name = "llama/tiny \\"q\\" \U0001F680"'))
    assert cli("search", workload, "--db", db, "--budget", 3, "--evaluator", env["profile"])[0] == 0
    workload.unlink()
    code, out, err = cli("search", "--resume", db, "--budget", 4)
    assert code == 0, err
    assert "4 ok, 0 failed" in cli("show", db)[1]
    assert cli("export", db, "--out", tmp_path / "ex")[0] == 0
    assert load_workload(tmp_path / "ex" / "workload.toml").name == 'llama/tiny "q" \U0001F680'


def test_a_workload_mismatch_names_the_nested_field(env, tmp_path):
    from types import SimpleNamespace

    from conjugate.errors import ConjugateError
    from conjugate.search.runs import check_workload

    stored = WORKLOAD.to_dict()
    stored["draft"] = {**stored["draft"], "rms_norm_eps": 1e-3}
    run = SimpleNamespace(id=1, workload_name="tiny", workload_path="w.toml", workload=stored)
    with pytest.raises(ConjugateError, match=r"field 'draft.rms_norm_eps' is 1e-05, the run's 0.001"):
        check_workload(run, WORKLOAD)


def test_reproduce_sh_names_a_profile_that_scores_as_the_run_did(env, tmp_path):
    """A moved run's reproduce.sh: its profile file is gone; the shipped profile of its name scores
    otherwise (the fast profile skips the check), so the script keeps the run's own path rather than
    silently measuring with other settings; a second export leaves no stale workload.toml."""
    workload, profile, db = tmp_path / "w.toml", tmp_path / "fast.toml", tmp_path / "repro.db"
    workload.write_text(TINY.read_text())
    profile.write_text(Path(env["profile"]).read_text())
    assert cli("search", workload, "--db", db, "--budget", 3, "--evaluator", profile)[0] == 0
    workload.unlink()
    profile.unlink()
    assert cli("export", db, "--out", tmp_path / "ex")[0] == 0
    script = (tmp_path / "ex" / "reproduce.sh").read_text()
    assert str(profile) in script and '"$here/workload.toml"' in script
    assert cli("export", db, "--out", tmp_path / "ex", "--workload", TINY)[0] == 0
    assert not (tmp_path / "ex" / "workload.toml").exists()
