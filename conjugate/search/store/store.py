"""The persistent search store: runs, the plan tree, evaluations, LLM calls and lessons (SQLAlchemy 2).

Concurrency rules (after Optuna's BaseStorage):

- Several processes, on one host or several, may share one database: a SQLite file or a
  PostgreSQL server. Each process opens its own Store (a forked child drops the inherited pool).
- Reads return snapshots: frozen dataclasses (RunRecord, NodeRecord, EvaluationRecord) or plain
  data, never live ORM objects. A snapshot does not follow later changes; read again for news.
- claim_evaluation makes sure only one process evaluates a given eval_key: a claim is an INSERT
  under a UNIQUE key, a take-over a compare-and-swap UPDATE on the claim's attempt count. A
  "running" claim is taken over when older than stale_after_s, or when its owner
  ("<hostname>:<pid>", see owner_id()) names a process of this host that no longer exists.
- Finished evaluations are immutable: finish_evaluation on a done key raises StoreError.
- Tree statistics change only through atomic SQL updates (visits = visits + 1), never by
  read-modify-write, so concurrent settlements all count.
- Results go in as EvalResult and come back as EvalResult; the JSON column holds its to_dict().
- SQLite: WAL journal, a 30 s busy timeout, writes in BEGIN IMMEDIATE transactions, retried with
  backoff on "database is locked". PostgreSQL: READ COMMITTED, retried on deadlock/serialization.
- Ctrl-C during a transaction (a read or a write) or while the store closes takes effect once it has
  ended: an interrupted write would keep the write lock, and the run could not be marked stopped; an
  interrupted connection close or reset is logged by the pool with a traceback.
- claim_slot hands out a run's budget of evaluations one node at a time, under a lock on the run's
  row, so processes sharing a run never evaluate more than its budget together.
- The schema carries SCHEMA_VERSION in table `meta`; a database of another version is refused,
  never migrated (one written by an earlier release: its best plan is exported and upgraded).
- Nothing here takes an API key, and none is stored: every text and JSON column scrubs the values
  bound to it, writes and query values alike (schema.py, conjugate/secrets.py).
"""
from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import threading
import time
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable, TypeVar
from urllib.parse import quote

from sqlalchemy import Engine, case, create_engine, delete, event, func, inspect, select, text, update
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, NoSuchModuleError
from sqlalchemy.orm import Session, sessionmaker

from conjugate.errors import ConjugateError
from conjugate.evaluate.result import EvalResult, Verdict
from conjugate.search.store.schema import (SCHEMA_VERSION, Base, EditOutcome, Evaluation, EvaluationRecord, LLMCall,
                                           Lesson, Meta, Node, NodeRecord, NodeStatus, Run, RunRecord, RunStatus,
                                           VerdictRow, utcnow)

SQLITE_BUSY_S = 30.0
WRITE_TRIES = 8
RETRY_SQLSTATES = ("40001", "40P01")  # PostgreSQL serialization failure, deadlock
T = TypeVar("T")
E = TypeVar("E", RunStatus, NodeStatus)
__all__ = ["SCHEMA_VERSION", "Store", "StoreError", "RunRecord", "NodeRecord", "EvaluationRecord", "RunStatus",
           "NodeStatus", "owner_id"]


class StoreError(ConjugateError):
    """The store cannot be opened or reached, or was asked for something its rules forbid."""


def owner_id() -> str:
    """This process as an evaluation owner: "<hostname>:<pid>"."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Store:
    """The search's database. Concurrency rules: see the module docstring (claims, snapshots, immutability)."""

    def __init__(self, engine: Engine, url: URL, where: str):
        self._engine, self._url, self._where, self._pid = engine, url, where, os.getpid()
        self._reader = sessionmaker(engine, expire_on_commit=False)
        self._writer = sessionmaker(engine.execution_options(store_write=True), expire_on_commit=False)

    @classmethod
    def open(cls, target: str | Path, create: bool = True) -> "Store":
        """A SQLAlchemy URL, or a plain file path (a SQLite file). With `create`, parent folders and the
        store's tables are made where missing and a SQLite file is switched to WAL; without, nothing is
        written: a database that is not a conjugate store, or an empty one, is refused as found, and a
        SQLite file this process may not write is read read-only (Store._immutable)."""
        url = _url(target, create)
        where = url.database if _is_sqlite_file(url) else url.render_as_string(hide_password=True)
        try:
            return cls._checked(_engine(url, where, wal=create), url, where, create)
        except StoreError as e:
            if create or not _is_sqlite_file(url) or not _refused_read_only(e):
                raise
            return cls._immutable(url, where)

    @classmethod
    def _checked(cls, engine: Engine, url: URL, where: str, create: bool) -> "Store":
        """The store on `engine` once its schema is checked (with `create`, made where missing); closed
        if that fails."""
        store = cls(engine, url, where)
        try:
            if create:
                store._write(store._check_schema)
            else:
                store._read(lambda s: store._check_schema(s, create=False))
        except BaseException:
            store.close()
            raise
        return store

    @classmethod
    def _immutable(cls, url: URL, where: str) -> "Store":
        """A SQLite store that even a read refused for want of write access (a WAL store's readers make a
        shared-memory file beside it): opened read-only and immutable, so a store in a folder this user
        only reads shows and exports; refused where its write-ahead log holds writes the file lacks."""
        wal = Path(f"{Path(url.database).expanduser()}-wal")
        if wal.exists() and wal.stat().st_size > 0:
            raise StoreError(f"{where}: its write-ahead log {wal.name} holds writes not yet in the database file, "
                             "which this user cannot read without writing beside it: open it where its folder "
                             "can be written, or copy both files")
        return cls._checked(_engine(_read_only(url), where, wal=False), url, where, create=False)

    @property
    def url_for_display(self) -> str:
        return self._url.render_as_string(hide_password=True)

    def close(self) -> None:
        """Close every pooled connection; a Ctrl-C meanwhile is raised once they are closed (the pool
        would otherwise log it with a traceback, as a failure to close a connection)."""
        with _interrupts_held():
            self._engine.dispose()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- runs

    def create_run(self, name: str, workload: dict, workload_path: str, evaluator: str, agent: str, seed: int,
                   settings: dict) -> int:
        return self._write(lambda s: _insert(s, Run(
            name=name, workload_name=str(workload.get("name", "")), workload=workload,
            workload_path=str(workload_path), evaluator=evaluator, agent=agent, seed=int(seed),
            settings=settings, status=RunStatus.RUNNING)))

    def run(self, run_id: int) -> RunRecord:
        return self._read(lambda s: _snapshot(RunRecord, _get(s, Run, run_id)))

    def runs(self) -> list[RunRecord]:
        return self._read(lambda s: [_snapshot(RunRecord, r) for r in s.scalars(select(Run).order_by(Run.id))])

    def latest_run(self) -> RunRecord | None:
        stmt = select(Run).order_by(Run.id.desc()).limit(1)
        return self._read(lambda s: _snapshot(RunRecord, s.scalar(stmt)))

    def check_writable(self) -> None:
        """Refuse, before anything starts, a store this process may not update (a resume records every
        evaluation there): a write transaction that changes no row; for a SQLite file outside WAL mode
        its folder (where SQLite makes its rollback journal at the first real write); on PostgreSQL
        every privilege the search's writes need (SEARCH_WRITES), so that a role that may update the
        run but not add its nodes is refused before it evaluates, not at its first new node (and its
        reads: SELECT on every table)."""
        if self._url.get_backend_name() == "postgresql":
            missing = self._read(_missing_privileges)
            if missing:
                raise StoreError(f"{self._where}: this role lacks {', '.join(missing)}: a search records its "
                                 "evaluations there; grant them, or copy the store where they are held")
        refused = ""
        try:
            self._write(lambda s: s.execute(update(Run).where(Run.id.is_(None)).values(name=Run.name)))
            if _is_sqlite_file(self._url) and self._read(_journal_mode) != "wal":
                folder = Path(self._url.database).expanduser().resolve().parent
                refused = "" if os.access(folder, os.W_OK) else f"its folder {folder}"
        except StoreError as e:
            if not _refused_read_only(e):
                raise
            refused = "it or the files SQLite keeps beside it"
        if refused:
            raise StoreError(f"{self._where}: this user may not write {refused}: a search records its "
                             "evaluations there; copy the store where it can be written")

    def set_run_status(self, run_id: int, status: RunStatus) -> None:
        self._update_one(Run, run_id, status=_choice("run status", RunStatus, status), updated_at=utcnow())

    # -- the plan tree

    def add_node(self, run_id: int, plan: dict, plan_hash: str, parent_id: int | None, edit: list | None,
                 rationale: str, proposer: str, edit_kind: str, prior: float) -> tuple[int, bool]:
        """(node id, created). A plan already in the run gives its node, also when added concurrently."""
        def add(s: Session) -> tuple[int, bool]:
            found = s.scalar(select(Node.id).where(Node.run_id == run_id, Node.plan_hash == plan_hash))
            if found is not None:
                return found, False
            depth = _child_depth(s, run_id, parent_id)
            return _insert(s, Node(run_id=run_id, plan=plan, plan_hash=plan_hash, parent_id=parent_id, edit=edit,
                                   rationale=rationale, proposer=proposer, edit_kind=edit_kind, depth=depth,
                                   prior=float(prior), status=NodeStatus.NEW)), True
        try:
            return self._write(add)
        except IntegrityError as e:  # a concurrent add of the same plan won: its node is this one
            found = self.node_by_hash(run_id, plan_hash)
            if found is None:
                raise self._error(e) from e
            return found.id, False

    def node(self, node_id: int) -> NodeRecord:
        return self._read(lambda s: _snapshot(NodeRecord, _get(s, Node, node_id)))

    def nodes(self, run_id: int) -> list[NodeRecord]:
        stmt = select(Node).where(Node.run_id == run_id).order_by(Node.id)
        return self._read(lambda s: [_snapshot(NodeRecord, n) for n in s.scalars(stmt)])

    def node_by_hash(self, run_id: int, plan_hash: str) -> NodeRecord | None:
        stmt = select(Node).where(Node.run_id == run_id, Node.plan_hash == plan_hash)
        return self._read(lambda s: _snapshot(NodeRecord, s.scalar(stmt)))

    def claim_slot(self, run_id: int, node_id: int, budget: int) -> bool:
        """One of the run's `budget` evaluations for the node: True when the node holds a slot (taken now or
        before: a resumed node keeps its own), False when every slot is taken. Atomic across processes:
        the run's row is locked (SQLite: the write transaction) while its slots are counted."""
        def claim(s: Session) -> bool:
            s.execute(select(Run.id).where(Run.id == run_id).with_for_update())
            held = s.scalar(select(Node.slot).where(Node.id == node_id, Node.run_id == run_id))
            if held is None:
                raise StoreError(f"no nodes row {node_id} in run {run_id}")
            if held:
                return True
            if s.scalar(_slots(run_id)) >= budget:
                return False
            s.execute(update(Node).where(Node.id == node_id).values(slot=True),
                      execution_options={"synchronize_session": False})
            return True
        return self._write(claim)

    def slots_claimed(self, run_id: int) -> int:
        """How many of the run's nodes hold a slot of its budget (every settled node holds one)."""
        return int(self._read(lambda s: s.scalar(_slots(run_id))))

    def settled_count(self, run_id: int) -> int:
        """How many of the run's nodes are settled (evaluated, failed or expanded)."""
        stmt = select(func.count()).select_from(Node).where(Node.run_id == run_id, Node.status != NodeStatus.NEW)
        return int(self._read(lambda s: s.scalar(stmt)))

    def set_node_status(self, node_id: int, status: NodeStatus) -> None:
        self._update_one(Node, node_id, status=_choice("node status", NodeStatus, status))

    def settle(self, node_id: int, status: NodeStatus, path_ids: list[int], reward: float) -> bool:
        """Exactly once per node, in one transaction: mark a "new" node evaluated (or failed) and,
        for each id of its path: visits + 1, value_sum + reward, best_reward = max(best, reward).
        False (nothing changed) if it was settled before, so a resumed search never counts an
        evaluation twice; an unknown path id changes nothing and raises StoreError."""
        status = _choice("node status", NodeStatus, status)
        reward = float(reward)
        best = case((Node.best_reward.is_(None), reward), (Node.best_reward < reward, reward),
                    else_=Node.best_reward)
        values = dict(visits=Node.visits + 1, value_sum=Node.value_sum + reward, best_reward=best)

        def apply(s: Session) -> bool:
            marked = s.execute(update(Node).where(Node.id == node_id, Node.status == NodeStatus.NEW)
                               .values(status=status, slot=True))
            if marked.rowcount != 1:
                return False
            for path_id in sorted(path_ids):  # one lock order, so concurrent paths cannot deadlock
                _execute_one(s, update(Node).where(Node.id == path_id).values(**values), f"node {path_id}")
            return True
        return self._write(apply)

    # -- evaluations

    def claim_evaluation(self, eval_key: str, plan_hash: str, run_id: int, owner: str, stale_after_s: float) -> bool:
        """True: the caller owns the evaluation now and must evaluate. False: done, or a live owner has it."""
        args = (eval_key, plan_hash, run_id, owner, stale_after_s)
        try:
            return self._write(lambda s: _claim(s, *args))
        except IntegrityError:  # a concurrent claim inserted the key first: judge that claim
            return self._write(lambda s: _claim(s, *args))

    def finish_evaluation(self, eval_key: str, result: EvalResult, reward: float) -> None:
        """Store the result, its reward and latency, and one verdicts row per verdict of the result."""
        latency = result.latency_ms

        def finish(s: Session) -> None:
            row = s.scalar(select(Evaluation).where(Evaluation.eval_key == eval_key).with_for_update())
            if row is None or row.status == "done":
                why = "was never claimed" if row is None else "is finished, and finished evaluations are immutable"
                raise StoreError(f"evaluation {eval_key!r} {why}")
            row.status, row.result, row.reward, row.finished_at = "done", result.to_dict(), float(reward), utcnow()
            row.latency_ms = None if latency is None else float(latency)
            s.add_all(_verdict_row(row.id, v) for v in result.verdicts)
        self._write(finish)

    def release_evaluation(self, eval_key: str, owner: str) -> None:
        """Give up a claim that found nothing to store: the evaluation is as if never claimed."""
        self._write(lambda s: s.execute(delete(Evaluation).where(Evaluation.eval_key == eval_key,
                                                                 Evaluation.status == "running",
                                                                 Evaluation.owner == owner)))

    def evaluation(self, eval_key: str) -> EvaluationRecord | None:
        stmt = select(Evaluation).where(Evaluation.eval_key == eval_key)
        return self._read(lambda s: self._evaluation(s.scalar(stmt)))

    def wait_evaluation(self, eval_key: str, timeout_s: float, poll_s: float = 0.2) -> EvaluationRecord | None:
        """The evaluation once done; None if it is not done within timeout_s."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = self.evaluation(eval_key)
            if found is not None and found.done:
                return found
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(poll_s, left))

    # -- LLM calls, lessons, edit statistics

    def record_llm_call(self, run_id: int | None, provider: str, model: str, prompt: str, reply: str,
                        input_tokens: int, output_tokens: int, cost_usd: float, latency_s: float,
                        error: str | None) -> int:
        return self._write(lambda s: _insert(s, LLMCall(
            run_id=run_id, provider=provider, model=model, prompt=prompt, reply=reply or "",
            input_tokens=int(input_tokens or 0), output_tokens=int(output_tokens or 0),
            cost_usd=float(cost_usd or 0.0), latency_s=float(latency_s or 0.0), error=error or "")))

    def llm_cost(self, run_id: int) -> float:
        stmt = select(func.coalesce(func.sum(LLMCall.cost_usd), 0.0)).where(LLMCall.run_id == run_id)
        return float(self._read(lambda s: s.scalar(stmt)))

    def add_lesson(self, evaluator: str, family: str, edit_kind: str, text: str, gain: float,
                   run_id: int | None) -> None:
        self._write(lambda s: _insert(s, Lesson(evaluator=evaluator, family=family, edit_kind=edit_kind, text=text,
                                                gain=float(gain), run_id=run_id)))

    def lessons(self, evaluator: str, family: str, limit: int = 10) -> list[str]:
        """Distinct lesson texts, largest |gain| first, then newest."""
        stmt = (select(Lesson.text).where(Lesson.evaluator == evaluator, Lesson.family == family)
                .order_by(func.abs(Lesson.gain).desc(), Lesson.created_at.desc(), Lesson.id.desc()))
        return _distinct(self._read(lambda s: list(s.scalars(stmt))), lambda t: t, limit)

    def lessons_elsewhere(self, evaluator: str, family: str, limit: int = 10) -> list[str]:
        """Lessons of other model families with this evaluator, each prefixed with its family, in
        the order `lessons` gives them."""
        stmt = (select(Lesson.family, Lesson.text).where(Lesson.evaluator == evaluator, Lesson.family != family)
                .order_by(func.abs(Lesson.gain).desc(), Lesson.created_at.desc(), Lesson.id.desc()))
        rows = self._read(lambda s: s.execute(stmt).all())
        return _distinct([f"(on {fam}) {text}" for fam, text in rows], lambda t: t, limit)

    def record_edit_outcome(self, evaluator: str, family: str, edit_kind: str, gain: float,
                            run_id: int | None) -> None:
        self._write(lambda s: _insert(s, EditOutcome(evaluator=evaluator, family=family, edit_kind=edit_kind,
                                                     gain=float(gain), run_id=run_id)))

    def edit_stats(self, evaluator: str, family: str | None) -> dict[str, dict]:
        """edit kind -> {"n": outcomes recorded, "mean_gain": their mean gain}; over every family
        when `family` is None."""
        stmt = (select(EditOutcome.edit_kind, func.count(), func.avg(EditOutcome.gain))
                .where(EditOutcome.evaluator == evaluator).group_by(EditOutcome.edit_kind))
        if family is not None:
            stmt = stmt.where(EditOutcome.family == family)
        rows = self._read(lambda s: s.execute(stmt).all())
        return {kind: {"n": int(n), "mean_gain": float(mean)} for kind, n, mean in rows}

    def best_plans(self, evaluator: str, family: str | None, limit: int = 5,
                   exclude_run: int | None = None) -> list[dict]:
        """The best evaluated plans of the runs scored by `evaluator` (of workload family `family` when
        given), unique by hash.

        A plan's reward is that of the done evaluation its run claimed (evaluations.run_id, plan_hash),
        joined to that run's node of the same plan_hash; an evaluation a run reused from another run
        counts for the run that did it. Rows: plan, plan_hash, reward, latency_ms, workload, run_id.
        """
        stmt = (select(Node.plan, Evaluation.plan_hash, Evaluation.reward, Evaluation.latency_ms, Run.workload,
                       Run.id.label("run_id"))
                .join(Node, (Node.run_id == Evaluation.run_id) & (Node.plan_hash == Evaluation.plan_hash))
                .join(Run, Run.id == Evaluation.run_id)
                .where(Run.evaluator == evaluator, Evaluation.status == "done", Evaluation.reward.is_not(None))
                .order_by(Evaluation.reward.desc(), Evaluation.id))
        if family is not None:
            stmt = stmt.where(Run.workload["family"].as_string() == family)
        if exclude_run is not None:
            stmt = stmt.where(Run.id != exclude_run)
        rows = self._read(lambda s: [dict(r._mapping) for r in s.execute(stmt)])
        return _distinct(rows, lambda r: r["plan_hash"], limit)

    # -- plumbing

    def _check_schema(self, s: Session, create: bool = True) -> None:
        conn = s.connection()
        if conn.dialect.name == "postgresql" and create:  # serialise schema creation between processes
            conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7146359)")
        tables = set(inspect(conn).get_table_names())
        if not tables and not create:
            raise StoreError(f"{self._where}: an empty database, not a conjugate store")
        if not tables:
            Base.metadata.create_all(conn)
            s.add(Meta(key="schema_version", value=str(SCHEMA_VERSION)))
            return
        meta_columns = {c["name"] for c in inspect(conn).get_columns("meta")} if "meta" in tables else set()
        if not {"key", "value"} <= meta_columns:
            raise StoreError(f"{self._where}: a database with tables but no 'meta' table of keys and values: "
                             "not a conjugate store")
        found = s.scalar(select(Meta.value).where(Meta.key == "schema_version"))
        if found != str(SCHEMA_VERSION):
            raise StoreError(_other_version(self._where, found))
        missing = sorted(set(Base.metadata.tables) - tables)
        if missing:
            raise StoreError(f"{self._where}: a store of schema version {found} without its table {missing[0]!r}: "
                             "not a conjugate store, or a damaged one (start a new database)")

    def _evaluation(self, row: Evaluation | None) -> EvaluationRecord | None:
        if row is None:
            return None
        values = {f.name: getattr(row, f.name) for f in fields(EvaluationRecord)}
        try:
            values["result"] = EvalResult.from_dict(row.result) if row.result is not None else None
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise StoreError(f"{self._where}: evaluation {row.eval_key!r}: unreadable result: {_first_line(e)}") from e
        return EvaluationRecord(**values)

    def _update_one(self, table: type, row_id: int, **values: Any) -> None:
        stmt = update(table).where(table.id == row_id).values(**values)
        self._write(lambda s: _execute_one(s, stmt, f"{table.__tablename__} row {row_id}"))

    def _read(self, fn: Callable[[Session], T]) -> T:
        self._after_fork()
        try:
            with _interrupts_held(), self._reader() as s, s.begin():
                return fn(s)
        except DBAPIError as e:
            raise self._error(e) from e
        except ValueError as e:  # a stored value this schema cannot decode: JSON, a status, a date
            raise StoreError(f"{self._where}: a row that cannot be read ({_first_line(e)}): "
                             "a damaged store, or one of another schema") from e

    def _write(self, fn: Callable[[Session], T]) -> T:
        """Run fn in one write transaction, retried with backoff while the database is busy."""
        self._after_fork()
        for attempt in range(WRITE_TRIES):
            try:
                with _interrupts_held(), self._writer.begin() as s:
                    return fn(s)
            except IntegrityError:
                raise
            except DBAPIError as e:
                if attempt == WRITE_TRIES - 1 or not _retryable(e):
                    raise self._error(e) from e
                time.sleep(min(2.0, 0.05 * 2 ** attempt) * random.uniform(0.5, 1.5))
        raise AssertionError("unreachable")

    def _after_fork(self) -> None:
        if os.getpid() != self._pid:  # never use a parent's pooled connections
            self._engine.dispose(close=False)
            self._pid = os.getpid()

    def _error(self, e: DBAPIError) -> StoreError:
        lines = str(e.orig).strip().splitlines() or [type(e.orig).__name__]
        return StoreError(f"{self._where}: {lines[0]}")


# -- helpers (module level, so that transactions stay small functions)

@contextlib.contextmanager
def _interrupts_held():
    """In the main thread, a Ctrl-C (SIGINT, under Python's default handler) during the block is raised
    as KeyboardInterrupt when the block ends, not inside it."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield  # another thread, a handler of the caller's own, or already held by an enclosing block
        return
    caught: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, _frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if caught:
            raise KeyboardInterrupt


def _url(target: str | Path, create: bool = True) -> URL:
    """The URL of `target`; with `create`, a SQLite file's folders are made, else the file must exist."""
    text = str(target)
    if "://" not in text:  # a plain file path: SQLite
        url = URL.create("sqlite", database=str(Path(text).expanduser()))
    else:
        try:
            url = make_url(text)
        except ArgumentError as e:
            raise StoreError(f"{text}: not a database URL") from e
    if _is_sqlite_file(url):
        path = Path(url.database).expanduser()
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
        elif path.is_dir():
            raise StoreError(f"{url.database}: a directory, not a database file")
        elif not path.exists():
            raise StoreError(f"{url.database}: no such database file")
    return url


def _other_version(where: str, found: str | None) -> str:
    """Why a store of another schema version is refused, and how to carry on from it."""
    if found is not None and found.isdigit() and int(found) < SCHEMA_VERSION:
        return (f"{where}: written by an earlier release of conjugate (store schema version {found}, this release "
                f"reads version {SCHEMA_VERSION}): export its best plan with the earlier release (`conjugate export`), "
                "convert it with `conjugate plan upgrade FILE`, and start a new search from it")
    return (f"{where}: store schema version {found or 'unknown'}, this release reads version {SCHEMA_VERSION} "
            "(stores are never migrated: open it with the release that wrote it, or start a new database)")


def _journal_mode(s: Session) -> str:
    return str(s.connection().exec_driver_sql("PRAGMA journal_mode").scalar()).lower()


# What a search writes, by table (store methods: set_run_status, add_node and its updates, claim_evaluation,
# finish_evaluation with its verdicts, release_evaluation, the LLM calls, lessons and edit outcomes)
SEARCH_WRITES = {Run: ("UPDATE",), Node: ("INSERT", "UPDATE"), Evaluation: ("INSERT", "UPDATE", "DELETE"),
                 VerdictRow: ("INSERT",), LLMCall: ("INSERT",), Lesson: ("INSERT",), EditOutcome: ("INSERT",)}


def search_privileges() -> list[tuple[str, str]]:
    """(privilege, table) for everything a search does: SELECT on every table of the store (its reads,
    and the rows an insert returns or an update or delete finds), then SEARCH_WRITES."""
    reads = [("SELECT", table.name) for table in Base.metadata.sorted_tables]
    return reads + [(privilege, table.__tablename__) for table, privileges in SEARCH_WRITES.items()
                    for privilege in privileges]


def _missing_privileges(s: Session) -> list[str]:
    """PostgreSQL: each privilege a search needs (search_privileges) that this role lacks, as 'INSERT on
    nodes' (a table's id sequence too, 'USAGE on nodes_id_seq', where rows are added)."""
    missing = []
    for privilege, name in search_privileges():
        if not s.scalar(text("SELECT has_table_privilege(:t, :p)"), {"t": name, "p": privilege}):
            missing.append(f"{privilege} on {name}")
        if privilege != "INSERT":
            continue
        sequence = s.scalar(text("SELECT pg_get_serial_sequence(:t, 'id')"), {"t": name})
        if sequence and not s.scalar(text("SELECT has_sequence_privilege(:q, 'USAGE')"), {"q": sequence}):
            missing.append(f"USAGE on {sequence.split('.')[-1]}")
    return missing


def _refused_read_only(e: StoreError) -> bool:
    """Whether a read failed because this process may not write the SQLite file or its folder."""
    text = str(e.__cause__ or e)
    return "readonly database" in text or "unable to open database file" in text


def _read_only(url: URL) -> URL:
    """The SQLite file opened read-only and immutable: no lock, journal or shared-memory file is made (nor
    read: Store._immutable refuses a file whose write-ahead log holds writes)."""
    path = quote(str(Path(url.database).expanduser().resolve()))
    return URL.create("sqlite", database=f"file:{path}", query={"mode": "ro", "immutable": "1", "uri": "true"})


def _is_sqlite_file(url: URL) -> bool:
    return url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:")


def _engine(url: URL, where: str, wal: bool = True) -> Engine:
    try:
        if url.get_backend_name() == "sqlite":
            engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_S})
            _sqlite_events(engine, wal)
            return engine
        timeout = url.get_driver_name() == "psycopg" and "connect_timeout" not in url.query
        args = {"connect_timeout": 10} if timeout else {}
        return create_engine(url, pool_pre_ping=True, pool_size=2, max_overflow=4, connect_args=args)
    except (ArgumentError, NoSuchModuleError, ImportError) as e:
        raise StoreError(f"{where}: cannot use this database: {e}") from e


def _sqlite_events(engine: Engine, wal: bool) -> None:
    """Per connection: busy timeout, foreign keys, and (`wal`: a store this process may create) the
    WAL journal, a setting the file keeps, so later opens of a store find it there; a file with tables
    but no 'meta' table is another program's, refused as found."""
    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # the driver's own BEGIN off: _begin below emits it
        cursor = dbapi_conn.cursor()
        tables = {row[0] for row in cursor.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        wal_here = wal and (not tables or "meta" in tables)
        for pragma in ("journal_mode=WAL" if wal_here else None, f"busy_timeout={int(SQLITE_BUSY_S * 1000)}",
                       "foreign_keys=ON", "synchronous=NORMAL"):
            if pragma is None:
                continue
            cursor.execute(f"PRAGMA {pragma}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:  # writers take the write lock up front: no lock upgrade, no deadlock
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("store_write") else "BEGIN")


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _retryable(e: DBAPIError) -> bool:
    text = str(e.orig).lower()
    return "database is locked" in text or "database is busy" in text or \
        getattr(e.orig, "sqlstate", None) in RETRY_SQLSTATES


def _snapshot(cls: type[T], row: Any) -> T | None:
    return None if row is None else cls(**{f.name: getattr(row, f.name) for f in fields(cls)})


def _insert(s: Session, row: Any) -> int:
    s.add(row)
    s.flush()
    return row.id


def _get(s: Session, table: type, row_id: int) -> Any:
    row = s.get(table, row_id)
    if row is None:
        raise StoreError(f"no {table.__tablename__} row {row_id}")
    return row


def _execute_one(s: Session, stmt: Any, what: str) -> None:
    if s.execute(stmt, execution_options={"synchronize_session": False}).rowcount != 1:
        raise StoreError(f"no {what}")


def _choice(what: str, enum: type[E], value: str) -> E:
    try:
        return enum(value)
    except ValueError:
        raise StoreError(f"{what} {value!r}: expected one of {', '.join(enum)}") from None


def _slots(run_id: int) -> Any:
    return select(func.count()).select_from(Node).where(Node.run_id == run_id, Node.slot.is_(True))


def _child_depth(s: Session, run_id: int, parent_id: int | None) -> int:
    if parent_id is None:
        return 0
    parent = s.get(Node, parent_id)
    if parent is None or parent.run_id != run_id:
        raise StoreError(f"node parent {parent_id}: no such node in run {run_id}")
    return parent.depth + 1


def _claim(s: Session, eval_key: str, plan_hash: str, run_id: int, owner: str, stale_after_s: float) -> bool:
    row = s.scalar(select(Evaluation).where(Evaluation.eval_key == eval_key))
    if row is None:
        _insert(s, Evaluation(eval_key=eval_key, plan_hash=plan_hash, run_id=run_id, owner=owner, status="running",
                              attempts=1, started_at=utcnow()))
        return True
    age_s = (utcnow() - row.started_at).total_seconds()
    if row.status == "done" or (age_s <= stale_after_s and not _owner_gone(row.owner)):
        return False
    swap = (update(Evaluation).where(Evaluation.id == row.id, Evaluation.status == "running",
                                     Evaluation.attempts == row.attempts)
            .values(owner=owner, run_id=run_id, started_at=utcnow(), attempts=row.attempts + 1))
    return s.execute(swap, execution_options={"synchronize_session": False}).rowcount == 1


def _owner_gone(owner: str) -> bool:
    """True when owner is "<this host>:<pid>" and that process no longer runs."""
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) <= 0:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:  # a zombie has exited too
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def _verdict_row(evaluation_id: int, v: Verdict) -> VerdictRow:
    return VerdictRow(evaluation_id=evaluation_id, launch=v.launch, verdict=str(v.verdict),
                      gain_percent=v.gain_percent, shared_us=v.shared_us, separate_us=v.separate_us, data=v.to_dict())


def _distinct(items: list, key: Callable[[Any], Any], limit: int) -> list:
    seen, out = set(), []
    for item in items:
        if key(item) not in seen and len(out) < limit:
            seen.add(key(item))
            out.append(item)
    return out
