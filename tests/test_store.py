"""The search store on SQLite and on PostgreSQL ($CONJUGATE_TEST_POSTGRES_URL; `bash .ci/postgres` prints one)."""
from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, event, select, text
from sqlalchemy.engine import make_url

from conjugate.compiler.feedback import PartRef
from conjugate.errors import ConjugateError
from conjugate.evaluate.result import EvalResult, Metrics, Stage, Status, Verdict, VerdictKind
from conjugate.roles import Model
from conjugate.search.store import SCHEMA_VERSION, NodeStatus, RunStatus, Store, StoreError, owner_id
from conjugate.search.store.schema import Evaluation, Node, VerdictRow

PG_ENV = "CONJUGATE_TEST_POSTGRES_URL"
WORKLOAD = {"name": "tiny", "family": "llama3/llama3", "k": 4}


# -- fixtures: a fresh database per test, on each backend

@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    if request.param == "sqlite":
        yield str(tmp_path / "runs" / "store.db")  # a plain path; the parent folder does not exist yet
        return
    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(f"PostgreSQL store tests need ${PG_ENV} (bash .ci/postgres starts a server and prints one)")
    yield from _fresh_postgres_database(base)


def _fresh_postgres_database(base: str):
    name = f"conjugate_t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(base).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@pytest.fixture
def store(db_url):
    with Store.open(db_url) as opened:
        yield opened


def new_run(store: Store, evaluator: str = "analytical", workload: dict = WORKLOAD, name: str = "run") -> int:
    return store.create_run(name, workload, "examples/tiny.toml", evaluator, "heuristic", 7, {"budget": 3})


def add(store: Store, run_id: int, plan_hash: str, parent_id: int | None = None, **plan) -> tuple[int, bool]:
    edit = None if parent_id is None else [{"op": "replace", "path": "/x", "value": 1}]
    return store.add_node(run_id, {"h": plan_hash, **plan}, plan_hash, parent_id, edit, "why", "heuristic", "tiles",
                          0.5)


def result(latency_ms: float, verdicts: tuple[Verdict, ...] = ()) -> EvalResult:
    metrics = Metrics(latency_ms=latency_ms, floor_ms=1.0, floor_ratio=latency_ms, bandwidth_gbs=100.0, launches=3,
                      device="NVIDIA H200", sms=132, speedups={"sequential": 1.0 / latency_ms})
    return EvalResult("h", "tiny", "analytical", Stage.TIMING, Status.OK, True, metrics, verdicts)


def verdict(launch: int, gain_percent: float) -> Verdict:
    parts = (PartRef(Model.TARGET, "qkv", (f"t.l{launch}.qkv",), 96),
             PartRef(Model.DRAFT, "down", ("d.s0.l0.down",), 8))
    return Verdict.judge(launch, parts, 10.0, (10.0 * (1 + gain_percent / 100),), True)


# -- runs

def test_runs_create_read_and_status(store):
    assert store.latest_run() is None and store.runs() == []
    first = new_run(store, name="a")
    second = new_run(store, evaluator="h200", name="b")
    run = store.run(first)
    assert (run.name, run.workload, run.workload_name, run.evaluator, run.seed, run.settings, run.status) == \
        ("a", WORKLOAD, "tiny", "analytical", 7, {"budget": 3}, RunStatus.RUNNING)
    assert store.run(second).evaluator == "h200" and run.status is RunStatus.RUNNING
    assert run.created_at.utcoffset().total_seconds() == 0  # aware UTC
    assert [r.id for r in store.runs()] == [first, second] and store.latest_run().id == second
    store.set_run_status(first, RunStatus.FINISHED)
    assert store.run(first).status is RunStatus.FINISHED and store.run(first).updated_at >= run.updated_at
    with pytest.raises(StoreError, match="run status 'bogus'"):
        store.set_run_status(first, "bogus")
    with pytest.raises(StoreError):
        store.run(9999)


def test_ctrl_c_in_a_write_waits_for_its_commit(store):
    """A SIGINT that lands inside a write transaction is raised once it has committed: the write is
    whole and no lock is left held, so the run can be marked stopped at once (Ctrl-C in a search)."""
    run_id = new_run(store)

    def interrupt(_conn, _cursor, statement, *_args):
        if statement.lstrip().upper().startswith("UPDATE RUNS"):
            os.kill(os.getpid(), signal.SIGINT)

    event.listen(Engine, "before_cursor_execute", interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            store.set_run_status(run_id, RunStatus.FINISHED)
    finally:
        event.remove(Engine, "before_cursor_execute", interrupt)
    assert store.run(run_id).status is RunStatus.FINISHED
    start = time.monotonic()
    store.set_run_status(run_id, RunStatus.STOPPED)  # an interrupted transaction would hold the lock (30 s)
    assert store.run(run_id).status is RunStatus.STOPPED and time.monotonic() - start < 5
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_reads_are_frozen_snapshots(store):
    run_id = new_run(store)
    run = store.run(run_id)
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.status = "stopped"
    run.workload["k"] = 99  # changing a snapshot changes nothing stored
    store.set_run_status(run_id, RunStatus.STOPPED)
    assert run.status is RunStatus.RUNNING and store.run(run_id).workload["k"] == 4


# -- the plan tree

def test_add_node_dedupes_and_sets_depth(store):
    run_id, other_run = new_run(store), new_run(store)
    root, created = add(store, run_id, "r")
    child, _ = add(store, run_id, "c", root)
    grandchild, _ = add(store, run_id, "g", child)
    assert created and [store.node(i).depth for i in (root, child, grandchild)] == [0, 1, 2]
    assert add(store, run_id, "c", root, other="ignored") == (child, False)
    assert store.node(child).plan == {"h": "c"} and store.node(child).edit[0]["op"] == "replace"
    assert store.node(root).edit is None and store.node(root).status is NodeStatus.NEW
    assert add(store, other_run, "c")[1]  # the same plan in another run is another node
    assert [n.id for n in store.nodes(run_id)] == [root, child, grandchild]
    assert store.node_by_hash(run_id, "g").id == grandchild and store.node_by_hash(run_id, "zz") is None
    with pytest.raises(StoreError, match="no such node in run"):
        add(store, other_run, "x", parent_id=root)
    store.set_node_status(child, NodeStatus.EXPANDED)
    assert store.node(child).status is NodeStatus.EXPANDED
    with pytest.raises(StoreError, match="node status 'bogus'"):
        store.set_node_status(child, "bogus")


def test_settle_counts_once_sums_and_maxes_in_one_transaction(store):
    run_id = new_run(store)
    root, _ = add(store, run_id, "r")
    child, _ = add(store, run_id, "c", root)
    grandchild, _ = add(store, run_id, "g", child)
    other, _ = add(store, run_id, "o", root)
    assert store.settle(root, NodeStatus.EVALUATED, [root], 1.0)
    assert store.settle(grandchild, NodeStatus.EVALUATED, [grandchild, root, child], 3.0)  # any order
    assert store.settle(child, NodeStatus.FAILED, [root, child], 0.0)
    assert not store.settle(child, NodeStatus.EVALUATED, [root, child], 9.0)  # settled before: nothing changes
    r, c, g = store.node(root), store.node(child), store.node(grandchild)
    assert (r.visits, r.value_sum, r.best_reward) == (3, 4.0, 3.0)
    assert (c.visits, c.value_sum, c.best_reward, c.status) == (2, 3.0, 3.0, NodeStatus.FAILED)
    assert (g.visits, g.value_sum, g.best_reward, g.status) == (1, 3.0, 3.0, NodeStatus.EVALUATED)
    with pytest.raises(StoreError, match="no node 424242"):
        store.settle(other, NodeStatus.EVALUATED, [root, other, 424242], 9.0)
    assert store.node(root).visits == 3 and store.node(other).status is NodeStatus.NEW  # all or nothing
    with pytest.raises(StoreError, match="node status 'bogus'"):
        store.settle(other, "bogus", [other], 1.0)


# -- evaluations

def test_claim_once_then_done(store):
    run_id = new_run(store)
    assert store.claim_evaluation("k1", "h1", run_id, "hostA:1", stale_after_s=600)
    assert not store.claim_evaluation("k1", "h1", run_id, "hostB:2", stale_after_s=600)
    store.finish_evaluation("k1", result(2.5), reward=1.2)
    assert not store.claim_evaluation("k1", "h1", run_id, "hostB:2", stale_after_s=0)
    done = store.evaluation("k1")
    assert (done.status, done.owner, done.reward, done.latency_ms, done.attempts) == ("done", "hostA:1", 1.2, 2.5, 1)
    assert done.finished_at >= done.started_at and store.evaluation("nope") is None


def test_stale_claim_is_taken_over(store):
    run_id, later_run = new_run(store), new_run(store)
    assert store.claim_evaluation("k", "h", run_id, "elsewhere:1", stale_after_s=600)
    time.sleep(0.05)
    assert not store.claim_evaluation("k", "h", later_run, "elsewhere:2", stale_after_s=600)
    assert store.claim_evaluation("k", "h", later_run, "elsewhere:2", stale_after_s=0.01)
    taken = store.evaluation("k")
    assert (taken.owner, taken.run_id, taken.attempts, taken.status) == ("elsewhere:2", later_run, 2, "running")


def test_claim_of_a_dead_process_is_taken_over(store):
    run_id = new_run(store)
    dead = f"{socket.gethostname()}:{_pid_of_exited()}"
    assert store.claim_evaluation("k", "h", run_id, dead, stale_after_s=600)
    assert store.claim_evaluation("k", "h", run_id, owner_id(), stale_after_s=600)  # taken over
    assert store.evaluation("k").owner == owner_id()
    assert not store.claim_evaluation("k", "h", run_id, "x:1", stale_after_s=600)  # this process lives
    assert store.claim_evaluation("k2", "h", run_id, f"another-host:{_pid_of_exited()}", stale_after_s=600)
    assert not store.claim_evaluation("k2", "h", run_id, "x:1", stale_after_s=600)  # can't judge other hosts


def _pid_of_exited() -> int:
    """The pid of a process of this host that has exited (and was reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_claim_of_a_killed_search_is_taken_over(db_url):
    """kill -9 a process holding a claim; resuming claims (and so re-evaluates) that key."""
    with Store.open(db_url) as store:
        run_id = new_run(store)
    code = ("import sys, time; from conjugate.search.store import Store, owner_id; "
            f"s = Store.open({db_url!r}); print(s.claim_evaluation('k', 'h', {run_id}, owner_id(), 600), flush=True); "
            "time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "True"
    finally:
        child.kill()  # SIGKILL
        child.wait()
    with Store.open(db_url) as store:
        assert store.evaluation("k").owner == f"{socket.gethostname()}:{child.pid}"
        assert store.claim_evaluation("k", "h", run_id, owner_id(), stale_after_s=600)


def test_finished_evaluation_is_immutable_and_keeps_verdicts(store, db_url):
    run_id = new_run(store)
    verdicts = (verdict(3, 12.5), verdict(1, -4.0))
    assert [v.verdict for v in verdicts] == [VerdictKind.GAIN, VerdictKind.INTERFERENCE]
    with pytest.raises(StoreError, match="never claimed"):
        store.finish_evaluation("k", result(1.0), 1.0)
    store.claim_evaluation("k", "h", run_id, "a:1", 600)
    store.finish_evaluation("k", result(4.0, verdicts), 1.5)
    with pytest.raises(StoreError, match="immutable"):
        store.finish_evaluation("k", result(1.0), 9.0)
    kept = store.evaluation("k")
    assert (kept.reward, kept.latency_ms, kept.result) == (1.5, 4.0, result(4.0, verdicts))  # typed, as it went in
    rows = _sql(db_url, select(VerdictRow.launch, VerdictRow.verdict, VerdictRow.gain_percent, VerdictRow.data)
                .order_by(VerdictRow.launch))
    assert rows == [(v.launch, str(v.verdict), v.gain_percent, v.to_dict()) for v in (verdicts[1], verdicts[0])]


def test_a_result_of_another_schema_is_refused_in_one_line(store, db_url):
    run_id = new_run(store)
    store.claim_evaluation("k", "h", run_id, "a:1", 600)
    store.finish_evaluation("k", result(1.0), 1.0)
    _sql(db_url, Evaluation.__table__.update().values(result={**result(1.0).to_dict(), "schema_version": 1}))
    with pytest.raises(StoreError) as caught:
        store.evaluation("k")
    assert "evaluation 'k'" in str(caught.value) and "schema version 1" in str(caught.value)


def test_wait_evaluation(store):
    run_id = new_run(store)
    store.claim_evaluation("k", "h", run_id, "a:1", 600)
    start = time.monotonic()
    assert store.wait_evaluation("k", timeout_s=0.3, poll_s=0.05) is None
    assert 0.25 < time.monotonic() - start < 3
    store.finish_evaluation("k", result(1.0), 2.0)
    assert store.wait_evaluation("k", timeout_s=5).reward == 2.0


# -- LLM calls, lessons, edit statistics, best plans

def test_llm_cost_sums_one_run(store):
    run_id, other = new_run(store), new_run(store)
    ids = [store.record_llm_call(run_id, "anthropic", "m", "p", "r", 10, 20, cost, 1.5, "") for cost in (0.01, 0.02)]
    store.record_llm_call(run_id, "openai", "m", "p", "", 5, 0, 0.0, 0.1, "timeout")
    store.record_llm_call(other, "openai", "m", "p", "r", 1, 1, 5.0, 0.1, None)
    assert ids[1] > ids[0]
    assert store.llm_cost(run_id) == pytest.approx(0.03) and store.llm_cost(other) == pytest.approx(5.0)
    assert store.llm_cost(new_run(store)) == 0.0


def test_lessons_order_and_dedupe(store):
    run_id = new_run(store)
    for text_, gain in [("small", 0.5), ("big loss", -3.0), ("medium", 1.0), ("older tie", 2.0), ("newer tie", -2.0),
                        ("big loss", 0.1)]:
        store.add_lesson("h200", "llama", "tiles", text_, gain, run_id)
    store.add_lesson("h200", "qwen", "tiles", "other family", 9.0, None)
    store.add_lesson("analytical", "llama", "tiles", "other evaluator", 9.0, None)
    assert store.lessons("h200", "llama") == ["big loss", "newer tie", "older tie", "medium", "small"]
    assert store.lessons("h200", "llama", limit=2) == ["big loss", "newer tie"]


def test_edit_stats_means(store):
    for kind, gain in [("tiles", 1.0), ("tiles", 3.0), ("pattern", -2.0)]:
        store.record_edit_outcome("h200", "llama", kind, gain, None)
    store.record_edit_outcome("h200", "qwen", "tiles", 50.0, None)
    assert store.edit_stats("h200", "llama") == {"tiles": {"n": 2, "mean_gain": 2.0},
                                                  "pattern": {"n": 1, "mean_gain": -2.0}}
    assert store.edit_stats("analytical", "llama") == {}


def _evaluated(store: Store, run_id: int, plan_hash: str, reward: float | None, latency_ms: float = 1.0) -> None:
    add(store, run_id, plan_hash)
    key = f"{run_id}/{plan_hash}"
    store.claim_evaluation(key, plan_hash, run_id, "a:1", 600)
    if reward is not None:
        store.finish_evaluation(key, result(latency_ms), reward)


def test_best_plans_filters_by_evaluator_family_and_run(store):
    llama, qwen = WORKLOAD, {**WORKLOAD, "family": "qwen3/qwen3"}
    r1, r2 = new_run(store, workload=llama), new_run(store, workload=llama)
    r_qwen, r_h200 = new_run(store, workload=qwen), new_run(store, evaluator="h200", workload=llama)
    r_nofamily = new_run(store, workload={"name": "x"})
    _evaluated(store, r1, "p1", 1.5, latency_ms=3.0)
    _evaluated(store, r1, "p2", 1.1)
    _evaluated(store, r1, "running", None)  # claimed, not done: no reward yet
    _evaluated(store, r2, "p1", 1.7, latency_ms=2.5)  # the same plan, better in another run
    _evaluated(store, r2, "p3", 1.3)
    _evaluated(store, r_qwen, "q1", 9.0)
    _evaluated(store, r_h200, "a1", 9.0)
    _evaluated(store, r_nofamily, "n1", 9.0)
    best = store.best_plans("analytical", "llama3/llama3")
    assert [(b["plan_hash"], b["reward"], b["run_id"]) for b in best] == [("p1", 1.7, r2), ("p3", 1.3, r2),
                                                                          ("p2", 1.1, r1)]
    assert best[0] == {"plan": {"h": "p1"}, "plan_hash": "p1", "reward": 1.7, "latency_ms": 2.5, "workload": llama,
                       "run_id": r2}
    assert [b["plan_hash"] for b in store.best_plans("analytical", "llama3/llama3", exclude_run=r2)] == ["p1", "p2"]
    assert [b["plan_hash"] for b in store.best_plans("analytical", None, limit=3)] == ["q1", "n1", "p1"]
    assert [b["plan_hash"] for b in store.best_plans("h200", "llama3/llama3")] == ["a1"]
    assert store.best_plans("analytical", "qwen3/qwen3", exclude_run=r_qwen) == []


# -- opening: versions, foreign files, unreachable servers

def test_reopen_keeps_data_and_shows_url(db_url):
    with Store.open(db_url) as store:
        run_id = new_run(store)
    with Store.open(db_url) as store:
        assert store.run(run_id).name == "run"
        assert store.url_for_display == _display(db_url)


def _display(db_url: str) -> str:
    """What the store shows of a database: SQLite as a URL; a server URL with its password masked."""
    if "://" not in db_url:
        return f"sqlite:///{db_url}"
    return make_url(db_url).render_as_string(hide_password=True)


@pytest.mark.parametrize("version", ["1", "2"])  # 2: plans of conjugate.plan/1, the edit kinds before knob families
def test_an_earlier_release_store_is_refused_with_the_way_on(db_url, version):
    Store.open(db_url).close()
    _sql(db_url, f"UPDATE meta SET value = '{version}' WHERE key = 'schema_version'")
    with pytest.raises(StoreError) as caught:
        Store.open(db_url)
    message = str(caught.value)
    where = db_url if "://" not in db_url else _display(db_url)  # a SQLite file goes by its path
    assert message.startswith(f"{where}: ") and "\n" not in message
    assert "earlier release" in message
    assert "conjugate export" in message and "conjugate plan upgrade FILE" in message


def test_a_later_release_store_is_refused(db_url):
    Store.open(db_url).close()
    _sql(db_url, f"UPDATE meta SET value = '{SCHEMA_VERSION + 1}' WHERE key = 'schema_version'")
    with pytest.raises(StoreError) as caught:
        Store.open(db_url)
    message = str(caught.value)
    assert f"version {SCHEMA_VERSION + 1}" in message and "earlier release" not in message and "\n" not in message


def test_database_of_something_else_is_refused(db_url):
    _sql(db_url, "CREATE TABLE unrelated (id INTEGER PRIMARY KEY)")
    with pytest.raises(StoreError, match="not a conjugate store"):
        Store.open(db_url)


def test_a_foreign_sqlite_file_is_refused_as_found(tmp_path):
    """Opened to write (search --db), another program's database is not switched to WAL first."""
    songs = tmp_path / "songs.db"
    with contextlib.closing(sqlite3.connect(songs)) as c, c:
        c.execute("CREATE TABLE songs (title text)")
    before = songs.read_bytes()
    with pytest.raises(StoreError, match="not a conjugate store"):
        Store.open(songs)
    assert songs.read_bytes() == before


def test_file_that_is_not_a_database_is_refused(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("this is a text file, not a database\n" * 200)
    with pytest.raises(StoreError) as caught:
        Store.open(notes)
    assert str(caught.value).startswith(str(notes)) and "\n" not in str(caught.value)
    assert isinstance(caught.value, ConjugateError)


def test_unreachable_server_is_one_line_without_password():
    pytest.importorskip("psycopg")
    with pytest.raises(StoreError) as caught:
        Store.open("postgresql+psycopg://someone:s3cret@127.0.0.1:1/nothing")
    message = str(caught.value)
    assert message.startswith("postgresql+psycopg://someone:***@127.0.0.1:1/nothing: ")
    assert "s3cret" not in message and "\n" not in message


def _sql(db_url: str, statement) -> list[tuple] | None:
    """Run one statement on the database as it is; the rows of a query."""
    if "://" not in db_url:
        Path(db_url).parent.mkdir(parents=True, exist_ok=True)
    url = db_url if "://" in db_url else f"sqlite:///{db_url}"
    engine = create_engine(url)
    with engine.begin() as conn:
        found = conn.execute(text(statement) if isinstance(statement, str) else statement)
        rows = [tuple(r) for r in found] if found.returns_rows else None
    engine.dispose()
    return rows


# -- several processes on one database

def _claim_worker(db_url: str, run_id: int, keys: list[str], barrier) -> list[str]:
    with Store.open(db_url) as store:
        barrier.wait(timeout=60)
        return [k for k in keys if store.claim_evaluation(k, "h", run_id, owner_id(), stale_after_s=600)]


def _add_node_worker(db_url: str, run_id: int, root: int, hashes: list[str], barrier) -> dict:
    with Store.open(db_url) as store:
        barrier.wait(timeout=60)
        added = {h: add(store, run_id, h, root) for h in hashes}
        # then settle the same nodes as the other process, each along its path through the shared root
        return {h: (*added[h], store.settle(added[h][0], NodeStatus.EVALUATED, [root, added[h][0]], 1.0))
                for h in hashes}


def _report(queue, target, *args) -> None:
    try:
        queue.put(("ok", target(*args)))
    except BaseException as e:  # the parent shows it instead of waiting for a reply that never comes
        queue.put(("error", repr(e)))


def _in_two_processes(target, *args) -> list:
    ctx = multiprocessing.get_context("spawn")
    barrier, queue = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_report, args=(queue, target, *args, barrier)) for _ in range(2)]
    for proc in procs:
        proc.start()
    replies = [queue.get(timeout=90) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
    assert [kind for kind, _ in replies] == ["ok", "ok"], replies
    return [value for _, value in replies]


def test_two_processes_claim_each_key_exactly_once(db_url):
    with Store.open(db_url) as store:
        run_id = new_run(store)
    keys = [f"key{i}" for i in range(20)]
    won = _in_two_processes(_claim_worker, db_url, run_id, keys)
    assert sorted(won[0] + won[1]) == sorted(keys)  # every key claimed, none twice
    with Store.open(db_url) as store:
        owners = {store.evaluation(k).owner for k in keys}
        assert all(store.evaluation(k).attempts == 1 for k in keys) and owner_id() not in owners


def test_two_processes_adding_and_settling_the_same_plans(db_url):
    with Store.open(db_url) as store:
        run_id = new_run(store)
        root, _ = add(store, run_id, "root")
    hashes = [f"plan{i}" for i in range(10)]
    first, second = _in_two_processes(_add_node_worker, db_url, run_id, root, hashes)
    for h in hashes:
        assert first[h][0] == second[h][0] and first[h][1] != second[h][1]  # one id; exactly one created it
        assert first[h][2] != second[h][2]  # exactly one settled it
    with Store.open(db_url) as store:
        nodes = store.nodes(run_id)
        assert len(nodes) == 1 + len(hashes)  # one node per plan
        assert [n.visits for n in nodes] == [len(hashes)] + [1] * len(hashes)  # each counted once, none lost
        assert nodes[0].value_sum == len(hashes)


# -- races made deterministic: a store call meets another writer's uncommitted row

def _while_uncommitted(db_url: str, statement, call):
    """Run `statement` in an open transaction, start `call` (it must block on that transaction), commit."""
    engine = create_engine(db_url if "://" in db_url else f"sqlite:///{db_url}")
    try:
        with engine.connect() as conn, ThreadPoolExecutor(1) as pool:
            transaction = conn.begin()
            conn.execute(statement)
            future = pool.submit(call)
            time.sleep(0.3)
            assert not future.done(), "the call did not wait for the other writer"
            transaction.commit()
            return future.result(timeout=30)
    finally:
        engine.dispose()


def test_claim_racing_an_uncommitted_claim_loses(store, db_url):
    run_id = new_run(store)
    racer = Evaluation.__table__.insert().values(eval_key="k", plan_hash="h", run_id=run_id, owner="racer:1",
                                                 status="running", attempts=1, started_at=datetime.now(timezone.utc))
    assert not _while_uncommitted(db_url, racer, lambda: store.claim_evaluation("k", "h", run_id, "me:2", 600))
    assert store.evaluation("k").owner == "racer:1"


def test_take_over_racing_an_uncommitted_take_over_loses(store, db_url):
    run_id = new_run(store)
    long_ago = datetime.now(timezone.utc) - timedelta(hours=1)
    store.claim_evaluation("k", "h", run_id, "crashed:1", 600)
    _sql(db_url, Evaluation.__table__.update().values(started_at=long_ago))  # stale now
    racer = (Evaluation.__table__.update().where(Evaluation.eval_key == "k")
             .values(owner="racer:2", attempts=2, started_at=datetime.now(timezone.utc)))
    assert not _while_uncommitted(db_url, racer, lambda: store.claim_evaluation("k", "h", run_id, "me:3", 60))
    assert (store.evaluation("k").owner, store.evaluation("k").attempts) == ("racer:2", 2)


def test_add_node_racing_an_uncommitted_add_gets_that_node(store, db_url):
    run_id = new_run(store)
    racer = Node.__table__.insert().values(
        run_id=run_id, plan={"h": "p"}, plan_hash="p", rationale="", proposer="racer", edit_kind="other", depth=0,
        visits=0, value_sum=0.0, prior=1.0, status="new", created_at=datetime.now(timezone.utc))
    node_id, created = _while_uncommitted(db_url, racer, lambda: add(store, run_id, "p"))
    assert not created and store.node(node_id).proposer == "racer" and len(store.nodes(run_id)) == 1


@pytest.mark.parametrize("during", ["close", "read"])
def test_ctrl_c_while_the_store_closes_or_reads_is_raised_once_and_logs_nothing(tmp_path, caplog, during):
    """A second Ctrl-C of a stopping search can land while a connection closes or is reset: it is
    raised as one KeyboardInterrupt once that is done, and the pool logs no traceback."""
    store = Store.open(tmp_path / "interrupted.db")
    run_id = new_run(store)
    store.run(run_id)  # a pooled connection to close

    def interrupt(*_args):
        os.kill(os.getpid(), signal.SIGINT)

    target, name = (store._engine.pool, "close") if during == "close" else (Engine, "before_cursor_execute")
    event.listen(target, name, interrupt)
    try:
        with caplog.at_level("DEBUG", logger="sqlalchemy"), pytest.raises(KeyboardInterrupt):
            store.close() if during == "close" else store.run(run_id)
    finally:
        event.remove(target, name, interrupt)
        store.close()
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "WARNING")]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with Store.open(tmp_path / "interrupted.db") as again:
        assert again.run(run_id).id == run_id


def _claim_slots(db: str, run_id: int, node_ids: list[int], budget: int, start, out) -> None:
    """A process of a search sharing the run: claims a slot for each of its nodes in turn."""
    with Store.open(db) as store:
        start.wait()
        out.put([node_id for node_id in node_ids if store.claim_slot(run_id, node_id, budget)])


def test_two_processes_never_claim_more_than_the_budget(tmp_path):
    """Two processes on one run claim budget slots at once: together exactly the budget, each node at most
    once; a node that holds a slot keeps it (a resume evaluates it), and no other node gets one."""
    db, budget = str(tmp_path / "budget.db"), 7
    with Store.open(db) as store:
        run_id = new_run(store)
        root, _ = store.add_node(run_id, {"n": "root"}, "root", None, None, "r", "seed", "other", 1.0)
        ids = [store.add_node(run_id, {"n": i}, f"h{i}", root, None, "r", "test", "other", 1.0)[0] for i in range(20)]
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_claim_slots, args=(db, run_id, part, budget, start, out))
             for part in (ids[:10], ids[10:])]
    for p in procs:
        p.start()
    start.set()
    claimed = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    won = claimed[0] + claimed[1]
    assert len(won) == budget and len(set(won)) == budget
    with Store.open(db) as store:
        assert store.slots_claimed(run_id) == budget
        assert store.claim_slot(run_id, won[0], budget)  # held: kept
        assert not store.claim_slot(run_id, next(i for i in ids if i not in won), budget)
        assert not store.claim_slot(run_id, root, budget)
        store.settle(won[0], NodeStatus.EVALUATED, [root, won[0]], 1.0)
        assert store.settled_count(run_id) == 1 and store.slots_claimed(run_id) == budget
