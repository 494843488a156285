"""EvalResult: what one evaluation of a plan found, as typed data. Failure is data: every stage's
outcome fits here. Dicts appear only at the edges (the worker protocol and the store), through
`to_dict` / `from_dict`."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

from conjugate.compiler.feedback import CompileFailure, LaunchFeedback, PartRef, Resources

RESULT_SCHEMA_VERSION = 2
VERDICT_THRESHOLD_PERCENT = 2.0  # a shared launch this much faster (slower) than its parts: gain (interference)


class Stage(StrEnum):
    VALIDATE = "validate"
    COMPILE = "compile"
    CORRECTNESS = "correctness"
    TIMING = "timing"


class Status(StrEnum):
    OK = "ok"
    INVALID = "invalid"
    COMPILE_ERROR = "compile_error"
    INCORRECT = "incorrect"
    TIMEOUT = "timeout"
    CRASHED = "crashed"
    ERROR = "error"


class VerdictKind(StrEnum):
    GAIN = "gain"
    NEUTRAL = "neutral"
    INTERFERENCE = "interference"

    @classmethod
    def of(cls, gain_percent: float) -> "VerdictKind":
        """The one verdict rule: beyond the threshold either way, else neutral."""
        if gain_percent > VERDICT_THRESHOLD_PERCENT:
            return cls.GAIN
        if gain_percent < -VERDICT_THRESHOLD_PERCENT:
            return cls.INTERFERENCE
        return cls.NEUTRAL


@dataclass(frozen=True)
class Baseline:
    """One baseline's round, measured (or modeled) beside the plan."""
    status: str  # "ok", "incorrect" or "error"
    latency_ms: float | None = None
    p20_ms: float | None = None
    p80_ms: float | None = None
    modeled: bool = False
    error: str = ""
    variants: dict[str, str] = field(default_factory=dict)  # conventional: phase -> the variant it runs
    phase_ms: dict[str, float] = field(default_factory=dict)  # conventional: phase -> its graph's median alone

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Baseline":
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass(frozen=True)
class Metrics:
    """A timed round: its latency, floor, baselines and speedups over them."""
    latency_ms: float
    floor_ms: float
    floor_ratio: float
    bandwidth_gbs: float
    launches: int
    device: str  # the GPU measured on, or the GPU the analytical model stands for
    sms: int  # that GPU's multiprocessors
    baselines: dict[str, Baseline] = field(default_factory=dict)
    speedups: dict[str, float] = field(default_factory=dict)  # baseline name -> its latency / this latency
    p20_ms: float | None = None
    p80_ms: float | None = None
    replays: int | None = None
    floor_memory_ms: float | None = None
    floor_compute_ms: float | None = None
    bytes: int | None = None
    flops: int | None = None
    copy_bandwidth_gbs: float | None = None
    matmul_tflops: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["baselines"] = {name: b.to_dict() for name, b in self.baselines.items()}
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Metrics":
        known = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        known["baselines"] = {name: Baseline.from_dict(b) for name, b in (data.get("baselines") or {}).items()}
        return cls(**known)


@dataclass(frozen=True)
class Verdict:
    """A multi-part launch timed (or modeled) against its parts launched separately."""
    launch: int
    verdict: VerdictKind
    shared_us: float
    separate_us: float
    gain_percent: float
    parts: tuple[PartRef, ...]
    modeled: bool
    parts_us: tuple[float, ...] = ()  # each part launched alone (measured verdicts)
    launches: tuple[int, ...] = ()  # every launch this one stands for (the same kernels and grids)
    resources: Resources = Resources()

    @classmethod
    def judge(cls, launch: int, parts: tuple[PartRef, ...], shared_us: float, parts_us: tuple[float, ...],
              modeled: bool, **extra: Any) -> "Verdict":
        separate = sum(parts_us)
        gain = (separate - shared_us) / separate * 100
        return cls(launch, VerdictKind.of(gain), round(shared_us, 2), round(separate, 2), round(gain, 1),
                   tuple(parts), modeled, tuple(round(u, 2) for u in parts_us), **extra)

    def to_dict(self) -> dict[str, Any]:
        return {"launch": self.launch, "verdict": str(self.verdict), "shared_us": self.shared_us,
                "separate_us": self.separate_us, "gain_percent": self.gain_percent,
                "parts": [p.to_dict() for p in self.parts], "modeled": self.modeled,
                "parts_us": list(self.parts_us), "launches": list(self.launches),
                "resources": self.resources.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Verdict":
        return cls(data["launch"], VerdictKind(data["verdict"]), data["shared_us"], data["separate_us"],
                   data["gain_percent"], tuple(PartRef.from_dict(p) for p in data["parts"]), data["modeled"],
                   tuple(data.get("parts_us", ())), tuple(data.get("launches", ())),
                   Resources.from_dict(data.get("resources")))


# Where an evaluation's wall time goes, in order: the workload's setup (weights, inputs, reference
# checker) and baselines (both once per workload and process), the plan's compile and warm-up, its
# correctness checks (with the CUDA-graph capture on a GPU), the timed replays, the verdicts.
STEPS = ("setup", "baselines", "compile", "warmup", "check", "replays", "verdicts")


@dataclass(frozen=True)
class EvalResult:
    plan_hash: str
    workload: str
    evaluator: str
    stage: Stage  # the last stage reached
    status: Status
    modeled: bool  # True: the timing comes from the analytical model, not from a GPU
    metrics: Metrics | None = None  # status ok only
    verdicts: tuple[Verdict, ...] = ()  # per multi-part launch, most interfering first
    feedback: tuple[LaunchFeedback, ...] = ()  # per launch, once the round compiled
    plan_errors: tuple[str, ...] = ()  # status invalid: every problem as 'PATH: reason'
    compile_failure: CompileFailure | None = None  # status compile_error
    checks: dict[str, Any] = field(default_factory=dict)  # the correctness report, or why it was skipped
    artifacts: dict[str, str] = field(default_factory=dict)  # e.g. the generated kernels' directory
    wall_s: float = 0.0
    error: str = ""
    schema_version: int = RESULT_SCHEMA_VERSION
    seconds: dict[str, float] = field(default_factory=dict)  # where wall_s went: step -> seconds (STEPS)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stage", Stage(self.stage))
        object.__setattr__(self, "status", Status(self.status))

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    @property
    def latency_ms(self) -> float | None:
        return self.metrics.latency_ms if self.metrics else None

    @property
    def speedups(self) -> dict[str, float]:
        return self.metrics.speedups if self.metrics else {}

    def to_dict(self) -> dict[str, Any]:
        return {"plan_hash": self.plan_hash, "workload": self.workload, "evaluator": self.evaluator,
                "stage": str(self.stage), "status": str(self.status), "modeled": self.modeled,
                "metrics": self.metrics.to_dict() if self.metrics else None,
                "verdicts": [v.to_dict() for v in self.verdicts], "feedback": [f.to_dict() for f in self.feedback],
                "plan_errors": list(self.plan_errors),
                "compile_failure": self.compile_failure.to_dict() if self.compile_failure else None,
                "checks": self.checks, "artifacts": self.artifacts, "wall_s": self.wall_s, "error": self.error,
                "schema_version": self.schema_version, "seconds": self.seconds}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "EvalResult":
        version = data.get("schema_version")
        if version != RESULT_SCHEMA_VERSION:
            raise ValueError(f"evaluation result of schema version {version}, this conjugate reads "
                             f"version {RESULT_SCHEMA_VERSION}")
        failure = data.get("compile_failure")
        return cls(data["plan_hash"], data["workload"], data["evaluator"], Stage(data["stage"]),
                   Status(data["status"]), data["modeled"],
                   Metrics.from_dict(data["metrics"]) if data.get("metrics") else None,
                   tuple(Verdict.from_dict(v) for v in data.get("verdicts") or ()),
                   tuple(LaunchFeedback.from_dict(f) for f in data.get("feedback") or ()),
                   tuple(data.get("plan_errors") or ()),
                   CompileFailure.from_dict(failure) if failure else None,
                   data.get("checks") or {}, data.get("artifacts") or {}, data.get("wall_s", 0.0),
                   data.get("error", ""), version, data.get("seconds") or {})
