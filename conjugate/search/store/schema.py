"""The search store's tables (SQLAlchemy 2 declarative, typed mappings) and the frozen snapshots read from them.

store.py is the only user of the tables; callers see the snapshots (RunRecord, NodeRecord,
EvaluationRecord) and the status enums (RunStatus, NodeStatus), which store.py re-exports. An
evaluation's result is an EvalResult: its JSON column holds `EvalResult.to_dict()`.

Every time column holds timezone-aware UTC; JSON columns use sqlalchemy.JSON so that the same
schema serves SQLite and PostgreSQL. Every text and JSON column scrubs what goes in of secrets
(ScrubbedText, ScrubbedString, ScrubbedJSON: conjugate/secrets.py), writes and query values alike,
so no API key reaches the database whoever writes it; their DDL is that of Text, String and JSON.
Changing a table means bumping SCHEMA_VERSION: the store never migrates silently.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from enum import StrEnum
from typing import Any

from sqlalchemy import JSON, DateTime, ForeignKey, Index, String, Text, TypeDecorator, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from conjugate.evaluate.result import EvalResult
from conjugate.files import shown
from conjugate.secrets import scrub, scrub_tree

# 2: runs.gpu dropped (runs.evaluator holds it), lessons and edit_outcomes keyed by evaluator
# 3: plans of schema conjugate.plan/2, edit kinds by knob family, nodes.slot (the budget's claims)
SCHEMA_VERSION = 3


class RunStatus(StrEnum):
    RUNNING = "running"
    STOPPED = "stopped"
    FINISHED = "finished"
    FAILED = "failed"


class NodeStatus(StrEnum):
    NEW = "new"  # created, not settled yet
    EVALUATED = "evaluated"  # settled with an ok result
    FAILED = "failed"  # settled with a failed result
    EXPANDED = "expanded"  # settled, and the proposer had nothing more to offer from it


class UTCDateTime(TypeDecorator):
    """Aware UTC datetimes on every backend (SQLite keeps no zone: store naive UTC, read it back aware)."""
    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("store: naive datetime; pass timezone-aware UTC")
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class ScrubbedText(TypeDecorator):
    """Text without secrets: each value bound to it is scrubbed on its way to the database."""
    impl = Text
    cache_ok = True
    scrubs_secrets = True

    def process_bind_param(self, value: str | None, dialect: Any) -> str | None:
        return scrub(value) if isinstance(value, str) else value


class ScrubbedString(ScrubbedText):
    """String(length) without secrets."""
    impl = String
    cache_ok = True


class ScrubbedJSON(TypeDecorator):
    """JSON without secrets: every string in the value, keys included, is scrubbed."""
    impl = JSON
    cache_ok = True
    scrubs_secrets = True

    def process_bind_param(self, value: Any, dialect: Any) -> Any:
        return scrub_tree(value)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: ScrubbedJSON(none_as_null=True), list[Any]: ScrubbedJSON(none_as_null=True),
                           datetime: UTCDateTime, str: ScrubbedText}


class Meta(Base):
    __tablename__ = "meta"
    key: Mapped[str] = mapped_column(ScrubbedString(64), primary_key=True)
    value: Mapped[str]


class Run(Base):
    __tablename__ = "runs"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str]
    workload_name: Mapped[str]
    workload: Mapped[dict[str, Any]]
    workload_path: Mapped[str] = mapped_column(ScrubbedText)
    evaluator: Mapped[str] = mapped_column(index=True)  # the evaluator profile's name
    agent: Mapped[str]
    seed: Mapped[int]
    settings: Mapped[dict[str, Any]]
    status: Mapped[str] = mapped_column(ScrubbedString(16))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class Node(Base):
    __tablename__ = "nodes"
    __table_args__ = (UniqueConstraint("run_id", "plan_hash", name="uq_nodes_run_plan"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    plan: Mapped[dict[str, Any]]
    plan_hash: Mapped[str] = mapped_column(ScrubbedString(128))
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("nodes.id"))
    edit: Mapped[list[Any] | None]  # RFC 6902 patch from the parent; None for a root
    rationale: Mapped[str] = mapped_column(ScrubbedText)
    proposer: Mapped[str]
    edit_kind: Mapped[str] = mapped_column(ScrubbedString(32))
    depth: Mapped[int]
    visits: Mapped[int] = mapped_column(default=0)
    value_sum: Mapped[float] = mapped_column(default=0.0)
    best_reward: Mapped[float | None]  # None until a reward was backpropagated through the node
    prior: Mapped[float]
    status: Mapped[str] = mapped_column(ScrubbedString(16))
    slot: Mapped[bool] = mapped_column(default=False)  # holds one of the run's budget of evaluations (claim_slot)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Evaluation(Base):
    __tablename__ = "evaluations"
    id: Mapped[int] = mapped_column(primary_key=True)
    eval_key: Mapped[str] = mapped_column(ScrubbedString(255), unique=True)
    plan_hash: Mapped[str] = mapped_column(ScrubbedString(128), index=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id"))  # the run that claimed it
    owner: Mapped[str]  # "<hostname>:<pid>" of the evaluating process
    status: Mapped[str] = mapped_column(ScrubbedString(16))  # "running" | "done"
    attempts: Mapped[int] = mapped_column(default=1)  # claims so far; take-overs compare-and-swap on it
    result: Mapped[dict[str, Any] | None]  # EvalResult.to_dict()
    reward: Mapped[float | None]
    latency_ms: Mapped[float | None]
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]


class VerdictRow(Base):
    __tablename__ = "verdicts"
    id: Mapped[int] = mapped_column(primary_key=True)
    evaluation_id: Mapped[int] = mapped_column(ForeignKey("evaluations.id"), index=True)
    launch: Mapped[int | None]
    verdict: Mapped[str | None] = mapped_column(ScrubbedString(64))
    gain_percent: Mapped[float | None]
    shared_us: Mapped[float | None]
    separate_us: Mapped[float | None]
    data: Mapped[dict[str, Any]]  # Verdict.to_dict()


class LLMCall(Base):
    __tablename__ = "llm_calls"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id"), index=True)
    provider: Mapped[str]
    model: Mapped[str]
    prompt: Mapped[str] = mapped_column(ScrubbedText)
    reply: Mapped[str] = mapped_column(ScrubbedText)
    input_tokens: Mapped[int]
    output_tokens: Mapped[int]
    cost_usd: Mapped[float]
    latency_s: Mapped[float]
    error: Mapped[str] = mapped_column(ScrubbedText)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Lesson(Base):
    __tablename__ = "lessons"
    __table_args__ = (Index("ix_lessons_evaluator_family", "evaluator", "family"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    evaluator: Mapped[str]
    family: Mapped[str]
    edit_kind: Mapped[str] = mapped_column(ScrubbedString(32))
    text: Mapped[str] = mapped_column(ScrubbedText)
    gain: Mapped[float]
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class EditOutcome(Base):
    __tablename__ = "edit_outcomes"
    __table_args__ = (Index("ix_edit_outcomes_evaluator_family", "evaluator", "family"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    evaluator: Mapped[str]
    family: Mapped[str]
    edit_kind: Mapped[str] = mapped_column(ScrubbedString(32))
    gain: Mapped[float]
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id"))


# -- snapshots: what reads return (frozen; never live ORM objects)

class _Record:
    def to_dict(self) -> dict[str, Any]:
        return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in asdict(self).items()}


@dataclass(frozen=True)
class RunRecord(_Record):
    id: int
    name: str
    workload_name: str
    workload: dict
    workload_path: str
    evaluator: str
    agent: str
    seed: int
    settings: dict
    status: RunStatus
    created_at: datetime
    updated_at: datetime

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", RunStatus(self.status))
        if not isinstance(self.workload, dict) or not isinstance(self.settings, dict):
            raise ValueError(f"run {self.id}: its workload and settings should be JSON objects")


@dataclass(frozen=True)
class NodeRecord(_Record):
    id: int
    run_id: int
    plan: dict
    plan_hash: str
    parent_id: int | None
    edit: list | None
    rationale: str
    proposer: str
    edit_kind: str
    depth: int
    visits: int
    value_sum: float
    best_reward: float | None
    prior: float
    status: NodeStatus
    created_at: datetime

    def __post_init__(self) -> None:
        if self.status not in set(NodeStatus):
            raise ValueError(f"nodes row {self.id}: field 'status' is {shown(self.status)}, not one of "
                             f"{', '.join(NodeStatus)}")
        object.__setattr__(self, "status", NodeStatus(self.status))


@dataclass(frozen=True)
class EvaluationRecord(_Record):
    id: int
    eval_key: str
    plan_hash: str
    run_id: int | None
    owner: str
    status: str
    attempts: int
    result: EvalResult | None  # None while running
    reward: float | None
    latency_ms: float | None
    started_at: datetime
    finished_at: datetime | None

    @property
    def done(self) -> bool:
        return self.status == "done"
