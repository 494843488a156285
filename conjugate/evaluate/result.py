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
    SETUP = "setup"  # the workload prepared (weights, reference) and the baselines measured: not the plan's doing
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
    carried: str = ""  # measured by an earlier process of the same search run (which, when): not in this one

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Baseline":
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


CARRIABLE_BASELINES = ("conventional", "streams")  # torch.compile'd: a fresh process takes minutes to build them


@dataclass(frozen=True)
class KindLoss:
    """One op kind's launches in a round: their time against what their bytes take at copy bandwidth."""
    kind: str  # "draft qkv"; a shared launch's kind names its parts: "target gate_up + draft qkv"
    launches: int
    ms: float
    floor_ms: float  # its bytes at the copy bandwidth
    bandwidth_fraction: float  # achieved bandwidth over the copy bandwidth

    @property
    def loss_ms(self) -> float:
        return self.ms - self.floor_ms

    @property
    def parts(self) -> list[tuple[str, str]]:
        """(model, op kind) of each part: [("target", "gate_up"), ("draft", "qkv")]."""
        return [tuple(part.split(" ", 1)) for part in self.kind.split(" + ")]  # type: ignore[misc]


@dataclass(frozen=True)
class LedgerSummary:
    """Where a round's time goes, condensed for the agents (evaluate/ledger.py has the whole ledger):
    the op kinds that lose most against their bytes' floor, and each stream's busy time. Measured
    from the GPU's kernel records, or modeled per launch by the analytical model."""
    round_ms: float
    floor_ms: float
    idle_ms: float  # no kernel running (0 when modeled: the model has no gaps)
    modeled: bool
    streams: dict[str, float]  # the plan's stream -> ms its launches ran
    kinds: tuple[KindLoss, ...]  # the biggest losses first

    def lines(self, top: int = 6) -> list[str]:
        """A few lines of text: the round against its floor, then the biggest losses."""
        how = "modeled" if self.modeled else f"measured; GPU idle {self.idle_ms:.3f} ms"
        head = (f"round {self.round_ms:.3f} ms ({how}) = {self.round_ms / self.floor_ms:.2f}x its floor "
                f"{self.floor_ms:.3f} ms; " + ", ".join(f"stream {name} busy {ms:.3f} ms"
                                                       for name, ms in self.streams.items()))
        return [head] + [f"{k.kind}: {k.ms:.3f} ms in {k.launches} launches at {k.bandwidth_fraction:.0%} of copy "
                         f"bandwidth, {k.loss_ms:.3f} ms over its floor" for k in self.kinds[:top]]

    def to_dict(self) -> dict[str, Any]:
        return {"round_ms": self.round_ms, "floor_ms": self.floor_ms, "idle_ms": self.idle_ms,
                "modeled": self.modeled, "streams": dict(self.streams),
                "kinds": [{f.name: getattr(k, f.name) for f in fields(k)} for k in self.kinds]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "LedgerSummary":
        return cls(data["round_ms"], data["floor_ms"], data["idle_ms"], data["modeled"], dict(data["streams"]),
                   tuple(KindLoss(**k) for k in data["kinds"]))


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
    ledger: LedgerSummary | None = None  # where the round's time goes

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["baselines"] = {name: b.to_dict() for name, b in self.baselines.items()}
        out["ledger"] = self.ledger.to_dict() if self.ledger else None
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Metrics":
        known = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        known["baselines"] = {name: Baseline.from_dict(b) for name, b in (data.get("baselines") or {}).items()}
        known["ledger"] = LedgerSummary.from_dict(data["ledger"]) if data.get("ledger") else None
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
    # the same parts launched at once, each on a stream of its own: what two streams would give
    overlap_us: float | None = None
    overlap_gain_percent: float | None = None  # the shared launch against overlap_us
    overlap_verdict: VerdictKind | None = None  # the one verdict rule applied to overlap_gain_percent

    @classmethod
    def judge(cls, launch: int, parts: tuple[PartRef, ...], shared_us: float, parts_us: tuple[float, ...],
              modeled: bool, overlap_us: float | None = None, **extra: Any) -> "Verdict":
        separate = sum(parts_us)
        gain = (separate - shared_us) / separate * 100
        overlap = {}
        if overlap_us:
            against = (overlap_us - shared_us) / overlap_us * 100
            overlap = {"overlap_us": round(overlap_us, 2), "overlap_gain_percent": round(against, 1),
                       "overlap_verdict": VerdictKind.of(against)}
        return cls(launch, VerdictKind.of(gain), round(shared_us, 2), round(separate, 2), round(gain, 1),
                   tuple(parts), modeled, tuple(round(u, 2) for u in parts_us), **extra, **overlap)

    def to_dict(self) -> dict[str, Any]:
        return {"launch": self.launch, "verdict": str(self.verdict), "shared_us": self.shared_us,
                "separate_us": self.separate_us, "gain_percent": self.gain_percent,
                "parts": [p.to_dict() for p in self.parts], "modeled": self.modeled,
                "parts_us": list(self.parts_us), "launches": list(self.launches),
                "resources": self.resources.to_dict(), "overlap_us": self.overlap_us,
                "overlap_gain_percent": self.overlap_gain_percent,
                "overlap_verdict": str(self.overlap_verdict) if self.overlap_verdict else None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Verdict":
        overlap = data.get("overlap_verdict")
        return cls(data["launch"], VerdictKind(data["verdict"]), data["shared_us"], data["separate_us"],
                   data["gain_percent"], tuple(PartRef.from_dict(p) for p in data["parts"]), data["modeled"],
                   tuple(data.get("parts_us", ())), tuple(data.get("launches", ())),
                   Resources.from_dict(data.get("resources")), data.get("overlap_us"),
                   data.get("overlap_gain_percent"), VerdictKind(overlap) if overlap else None)


# Where an evaluation's wall time goes, in order: the workload's setup (weights, inputs, reference
# checker) and baselines (both once per workload and process), the plan's compile and warm-up, its
# correctness checks (with the CUDA-graph capture on a GPU), the timed replays, the verdicts, the
# ledger (the round's kernels recorded under the profiler).
STEPS = ("setup", "baselines", "compile", "warmup", "check", "replays", "verdicts", "ledger")


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
