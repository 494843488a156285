"""EvalResult: what one evaluation of a plan found. Failure is data: every stage's outcome fits here."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

STAGES = ("validate", "compile", "correctness", "timing")
STATUSES = ("ok", "invalid", "compile_error", "incorrect", "timeout", "crashed", "error")


@dataclass(frozen=True)
class EvalResult:
    plan_hash: str
    workload: str
    evaluator: str
    stage: str  # the last stage reached (one of STAGES)
    status: str  # one of STATUSES
    modeled: bool  # True: the timing comes from the analytical model, not from a GPU
    metrics: dict[str, Any] = field(default_factory=dict)  # latency_ms, floor_ms, floor_ratio, speedups, ...
    verdicts: list[dict] = field(default_factory=list)  # per multi-part launch
    feedback: list[dict] = field(default_factory=list)  # compiler feedback: per launch, or the error's data
    checks: dict[str, Any] = field(default_factory=dict)  # the correctness report, or why it was skipped
    artifacts: dict[str, str] = field(default_factory=dict)  # e.g. the generated kernels' directory
    wall_s: float = 0.0
    error: str = ""
    schema_version: int = 1

    def __post_init__(self) -> None:
        if self.stage not in STAGES or self.status not in STATUSES:
            raise ValueError(f"EvalResult: bad stage {self.stage!r} or status {self.status!r}")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "EvalResult":
        return cls(**data)
