"""Typed, read-only views of a canonical plan's blocks: `plan.model(Model.DRAFT)`, `plan.cross`."""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping


def frozen(value: Any) -> Any:
    """A read-only copy: dicts as mapping proxies, lists as tuples."""
    if isinstance(value, dict):
        return MappingProxyType({k: frozen(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(frozen(v) for v in value)
    return value


@dataclass(frozen=True)
class Stream:
    priority: str  # "high": the GPU serves this model's stream first (two streams)
    sms: int  # SMs this model's stream may use (two streams); 0: every SM


@dataclass(frozen=True)
class ModelBlock:
    """One model's own choices."""

    tiles: Mapping[str, Mapping[str, int]]  # op kind -> tile config
    fusions: tuple[str, ...]
    reduce: str  # how a residual GEMM sums its split-K partials: "ordered" | "atomic"
    pdl: str  # programmatic dependent launch trigger: "none" | "start" | "end"
    stream: Stream
    form: str = "launches"  # "launches" | "step" (the draft's k steps as one persistent launch; draft only)
    streamed: tuple[str, ...] = ()  # residual GEMM kinds run by the streamed kernel where alone in a launch

    @classmethod
    def from_dict(cls, data: dict) -> "ModelBlock":
        return cls(frozen(data["tiles"]), tuple(data["fusions"]), data["reduce"], data["pdl"],
                   Stream(**data["stream"]), data.get("form", "launches"), tuple(data.get("streamed", ())))


@dataclass(frozen=True)
class Interleave:
    pattern: str
    ratio: tuple[int, int]  # [target, draft] programs of the "ratio" pattern


@dataclass(frozen=True)
class Override:
    """Launches holding an op that `match` selects: what changes for them (None / empty: nothing)."""

    match: str
    pair: bool | None = None
    with_: str | None = None  # a draft op id pinned into the one matching target launch
    interleave: Interleave | None = None
    tiles: Mapping[str, Mapping[str, Mapping[str, int]]] = field(default_factory=lambda: frozen({}))  # model -> kind -> config
    launch: Mapping[str, int] = field(default_factory=lambda: frozen({}))
    operand_layout: str | None = None
    pdl: str | None = None

    @classmethod
    def from_dict(cls, data: dict) -> "Override":
        inter = data.get("interleave")
        return cls(data["match"], data.get("pair"), data.get("with"),
                   Interleave(inter["pattern"], tuple(inter["ratio"])) if inter else None,
                   frozen(data.get("tiles", {})), frozen(data.get("launch", {})), data.get("operand_layout"),
                   data.get("pdl"))


@dataclass(frozen=True)
class Cross:
    """What the two models share: streams, capture, default launch parameters and placement rules."""

    streams: str
    capture: str
    launch: Mapping[str, int]
    alignment: str
    pairs: Mapping[str, tuple[str, ...]]
    interleave: Interleave
    operand_layout: str
    overrides: tuple[Override, ...]

    @classmethod
    def from_dict(cls, data: dict) -> "Cross":
        inter = data["interleave"]
        return cls(data["streams"], data["capture"], frozen(data["launch"]), data["alignment"], frozen(data["pairs"]),
                   Interleave(inter["pattern"], tuple(inter["ratio"])), data["operand_layout"],
                   tuple(Override.from_dict(o) for o in data["overrides"]))
