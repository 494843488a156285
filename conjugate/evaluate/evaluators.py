"""Evaluator profiles: the TOML files in evaluators/ that say how an evaluator scores plans.

Two kinds: `analytical` (a roofline model with fitted constants in [model]; every result is
modeled) and `gpu` (measured on the GPU: [timing] replays and warm-up, [correctness] tolerances).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from conjugate.errors import ConjugateError
from conjugate.files import NAME_MAX, is_shown_name, read_toml, shown
from conjugate.paths import PROFILES_DIR

PROFILE_DIR = PROFILES_DIR
KINDS = ("analytical", "gpu")
_MODEL_KEYS = {"gpu": str, "bandwidth_gbs": float, "matmul_tflops": float, "sms": int, "programs_per_sm": int,
               "launch_overhead_us": float, "colocation_penalty": float, "streams_overlap": float}
_FAMILIES = ("gemm", "attn", "elementwise", "step")
# a profile written before the step form may leave `step` out: the value evaluators/analytical.toml
# sets from benchmarks/results/draft_step_h200.json ("analytical_step_efficiency")
OPTIONAL_EFFICIENCY = {"step": 0.434}
# field -> (low, high): the range of every number a profile may hold (none is infinite or NaN)
_BOUNDS: dict[str, tuple[float, float]] = {
    "time_limit_s": (1, 7 * 86400),  # below a second every evaluation would time out
    "max_params": (0, 10**15),
    "bandwidth_gbs": (1, 10**6), "matmul_tflops": (0.001, 10**6), "sms": (1, 10**5), "programs_per_sm": (1, 1024),
    "launch_overhead_us": (0, 10**6), "colocation_penalty": (0, 1), "streams_overlap": (0, 1),
    "replays": (0, 10**6), "warmup": (0, 10**6), "verdict_calls": (0, 10**4),  # 0 replays: refused below
    "replays_within_pct": (0, 100), "ledger_replays": (0, 1000),
    "rel": (1e-6, 1), "tie_margin": (0, 10),  # a relative error under 1e-6 is below fp32's own rounding
}


class ProfileError(ConjugateError):
    """An evaluator profile is missing or malformed."""


@dataclass(frozen=True)
class ModelConstants:
    gpu: str
    bandwidth_gbs: float
    matmul_tflops: float
    sms: int
    programs_per_sm: int
    launch_overhead_us: float
    colocation_penalty: float
    streams_overlap: float
    efficiency: dict[str, float] = field(default_factory=dict)  # op family -> fraction of bandwidth


@dataclass(frozen=True)
class TimingSettings:
    replays: int = 200  # timed replays of the round's CUDA graph (at most, with replays_within_pct)
    warmup: int = 20  # untimed replays first
    verdict_calls: int = 10  # launches per CUDA graph when timing one launch for its verdict
    # stop replaying once the median is known within this percent (timing.median_known_within); 0: all
    replays_within_pct: float = 0.0
    # a launch built as one of an earlier plan of the workload keeps that plan's verdict times
    reuse_verdicts: bool = True
    # replays recorded under the profiler for the plan's time ledger (what the agents are told); 0: none
    ledger_replays: int = 0
    baselines: tuple[str, ...] = ("conventional", "sequential", "streams")
    # `conventional` and `streams` measured in a process of their own (evaluate/baselines/apart.py)
    baselines_apart: bool = False
    # the conventional baseline's variants tried per phase (conventional.py); the fastest correct one runs
    conventional: tuple[str, ...] = ("layers-grouped", "whole-sdpa", "whole-grouped", "whole-split")


@dataclass(frozen=True)
class EvaluatorProfile:
    name: str
    kind: str
    description: str
    time_limit_s: float
    max_check_params: int  # check numerically up to this many parameters (the interpreter is slow)
    model: ModelConstants | None  # the analytical model's constants (kind analytical)
    timing: TimingSettings = field(default_factory=TimingSettings)
    tolerances: dict[str, dict[str, float]] = field(default_factory=dict)  # dtype -> {rel, tie_margin}
    source: str = ""
    device: str = ""  # kind gpu: the GPUs it measures on (part of the device name, e.g. "H200"); "" any

    @property
    def gpu(self) -> str:
        return self.model.gpu if self.model else ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "EvaluatorProfile":
        timing = {**data.get("timing", {})}
        timing["baselines"] = tuple(timing.get("baselines", TimingSettings.baselines))
        timing["conventional"] = tuple(timing.get("conventional", TimingSettings.conventional))
        return cls(**{**data, "model": ModelConstants(**data["model"]) if data.get("model") else None,
                      "timing": TimingSettings(**timing)})


def load_profile(name_or_path: str | Path) -> EvaluatorProfile:
    """A profile by name (evaluators/<name>.toml) or by path."""
    path = Path(name_or_path)
    if path.suffix != ".toml":
        path = PROFILE_DIR / f"{name_or_path}.toml"
        if not path.exists():
            known = ", ".join(sorted(p.stem for p in PROFILE_DIR.glob("*.toml")))
            raise ProfileError(f"--evaluator: no evaluator profile named {str(name_or_path)!r}; known: {known}")
    return _profile(read_toml(path, ProfileError, "evaluator profile"), path)


def _need(data: dict, key: str, kind: type, where: str) -> Any:
    """data[key] checked: present, of its kind, and a number finite and within _BOUNDS."""
    if key not in data:
        raise ProfileError(f"{where}: missing field {key!r}")
    value = data[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = _as_float(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ProfileError(f"{where}: field {key!r} should be {kind.__name__}, got {shown(value)}")
    if kind is float and not math.isfinite(value):
        raise ProfileError(f"{where}: field {key!r} should be a finite number, got {value!r}")
    if kind in (int, float) and value < 0:
        raise ProfileError(f"{where}: field {key!r} should not be negative, got {shown(value)}")
    low, high = _BOUNDS.get(key, (-math.inf, math.inf))
    if kind in (int, float) and not low <= value <= high:
        raise ProfileError(f"{where}: field {key!r} is {shown(value)}, must be in [{low:g}, {high:g}]")
    return value


def _shown_name(data: dict, key: str, where: str) -> str:
    """A name the bench table and its title print as it is (the rule of workload names)."""
    value = _need(data, key, str, where)
    if not is_shown_name(value):
        raise ProfileError(f"{where}: field {key!r} is {shown(value)}; 1 to {NAME_MAX} printable characters")
    return value


def _as_float(value: int) -> float:
    try:
        return float(value)
    except OverflowError:  # an integer past the largest float
        return math.inf if value > 0 else -math.inf


def _dotted(*names: str) -> str:
    """A field's dotted name, quoted for an error line (a key may hold any character)."""
    return shown(".".join(names))


def _table(value: Any, name: str, where: str) -> dict:
    """A section that must be a TOML table (`[name]`), not a value."""
    if not isinstance(value, dict):
        raise ProfileError(f"{where}: field {name!r} should be a table, got {shown(value)}")
    return value


def _profile(data: dict, path: Path) -> EvaluatorProfile:
    where = str(path)
    for key in data:
        if key not in ("name", "kind", "description", "time_limit_s", "correctness", "model", "timing", "device"):
            raise ProfileError(f"{where}: unknown field {_dotted(key)}")
    kind = _need(data, "kind", str, where)
    if kind not in KINDS:
        raise ProfileError(f"{where}: field 'kind' is {shown(kind)}; supported: {', '.join(KINDS)}")
    correctness = _table(data.get("correctness", {}), "correctness", where)
    return EvaluatorProfile(
        name=_shown_name(data, "name", where), kind=kind,
        description=_need(data, "description", str, where) if "description" in data else "",
        time_limit_s=_need(data, "time_limit_s", float, where),
        max_check_params=_need(correctness, "max_params", int, f"{where}: [correctness]"),
        model=_model(_table(data.get("model", {}), "model", where), where)
        if kind == "analytical" or "model" in data else None,
        timing=_timing(data.get("timing", {}), where), tolerances=_tolerances(correctness, where), source=where,
        device=_need(data, "device", str, where) if "device" in data else "")


def _model(model: dict, where: str) -> ModelConstants:
    unknown = set(model) - set(_MODEL_KEYS) - {"efficiency"}
    if unknown:
        raise ProfileError(f"{where}: unknown field {_dotted('model', sorted(unknown)[0])}")
    values = {k: _need(model, k, t, f"{where}: [model]") for k, t in _MODEL_KEYS.items()}
    _shown_name(model, "gpu", f"{where}: [model]")  # the bench title's "MODELED for <gpu>"
    efficiency = _table(model.get("efficiency", {}), "model.efficiency", where)
    for extra in set(efficiency) - set(_FAMILIES):
        raise ProfileError(f"{where}: unknown field {_dotted('model.efficiency', extra)}")
    efficiency = OPTIONAL_EFFICIENCY | efficiency
    for family in _FAMILIES:
        e = _need(efficiency, family, float, f"{where}: [model.efficiency]")
        if not 0 < e <= 1:
            raise ProfileError(f"{where}: field 'model.efficiency.{family}' should be in (0, 1], got {e}")
    return ModelConstants(**values, efficiency={f: float(efficiency[f]) for f in _FAMILIES})


def _timing(timing: dict, where: str) -> TimingSettings:
    allowed = ("replays", "warmup", "verdict_calls", "baselines", "conventional", "replays_within_pct",
               "reuse_verdicts", "ledger_replays", "baselines_apart")
    _table(timing, "timing", where)
    for key in timing:
        if key not in allowed:
            raise ProfileError(f"{where}: unknown field {_dotted('timing', key)}")
    values = {k: _need(timing, k, int, f"{where}: [timing]") for k in allowed[:3] + ("ledger_replays",) if k in timing}
    if "replays_within_pct" in timing:
        values["replays_within_pct"] = _need(timing, "replays_within_pct", float, f"{where}: [timing]")
    for key in ("reuse_verdicts", "baselines_apart"):
        if key in timing:
            if not isinstance(timing[key], bool):
                raise ProfileError(f"{where}: field 'timing.{key}' should be true or false, got {shown(timing[key])}")
            values[key] = timing[key]
    if values.get("replays", 1) < 1 or values.get("verdict_calls", 1) < 1:
        raise ProfileError(f"{where}: [timing] replays and verdict_calls should be at least 1")
    baselines = timing.get("baselines", list(TimingSettings.baselines))
    if not isinstance(baselines, list) or not all(b in TimingSettings.baselines for b in baselines):
        raise ProfileError(f"{where}: field 'timing.baselines' should be a list drawn from "
                           f"{', '.join(TimingSettings.baselines)}, got {shown(baselines)}")
    if len(set(baselines)) < len(baselines):  # [] stays allowed: plans timed alone (benchmarks/README.md)
        raise ProfileError(f"{where}: field 'timing.baselines' names a baseline twice: {shown(baselines)}")
    variants = timing.get("conventional", list(TimingSettings.conventional))
    if not isinstance(variants, list) or not variants or not all(_is_variant(v) for v in variants):
        from conjugate.evaluate.baselines.conventional import ATTENTION, COMPILES, RESIDUALS

        raise ProfileError(f"{where}: field 'timing.conventional' should be a non-empty list of variants "
                           f"<{'|'.join(COMPILES)}>-<{'|'.join(ATTENTION)}>[-{'|'.join(RESIDUALS[1:])}], "
                           f"got {shown(variants)}")
    return TimingSettings(**values, baselines=tuple(baselines), conventional=tuple(variants))


def _is_variant(name) -> bool:
    from conjugate.evaluate.baselines.conventional import Variant

    try:
        Variant.parse(name)
    except (ValueError, AttributeError):
        return False
    return True


def _tolerances(correctness: dict, where: str) -> dict[str, dict[str, float]]:
    out = {}
    for key, value in correctness.items():
        if key == "max_params":
            continue
        if key not in ("fp32", "fp16", "bf16"):
            raise ProfileError(f"{where}: unknown field {_dotted('correctness', key)}")
        _table(value, f"correctness.{key}", where)
        for extra in set(value) - {"rel", "tie_margin"}:
            raise ProfileError(f"{where}: unknown field {_dotted('correctness', key, extra)}")
        out[key] = {k: _need(value, k, float, f"{where}: [correctness.{key}]") for k in ("rel", "tie_margin")}
    return out
