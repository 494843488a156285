"""What the compiler tells the search about a lowered round, as typed data: per launch its kernel
file, its parts (model, op kind, op ids, programs) and, on the GPU, the resources Triton reports;
for a launch that could not be lowered, which launch and part failed and why."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from conjugate.errors import ConjugateError
from conjugate.roles import Model


@dataclass(frozen=True)
class PartRef:
    """One part of a launch: an op, or a fused chain of one model's ops."""
    model: Model
    kind: str  # the unit's main op kind (a fused norm+GEMM is a GEMM part)
    ops: tuple[str, ...]
    programs: int | None = None  # None before lowering

    @property
    def op(self) -> str:
        """The main op's id: the op of the part's kind."""
        return next((o for o in self.ops if o.rsplit(".", 1)[-1] == self.kind), self.ops[-1])

    @property
    def label(self) -> str:
        if self.kind == "step":  # the draft's whole phase: hundreds of ops
            return f"the draft's steps ({len(self.ops)} ops, {self.ops[0]}..{self.ops[-1]})"
        return "+".join(self.ops)

    @classmethod
    def of(cls, part: Any, programs: int | None = None) -> "PartRef":
        """From an expanded launch part (conjugate.plan.expand.Part)."""
        return cls(Model(part.model), part.kind, tuple(part.ops), programs)

    def to_dict(self) -> dict[str, Any]:
        return {"model": str(self.model), "kind": self.kind, "ops": list(self.ops), "programs": self.programs}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PartRef":
        return cls(Model(data["model"]), data["kind"], tuple(data["ops"]), data.get("programs"))


@dataclass(frozen=True)
class Resources:
    """The compiler's report on one kernel (GPU only; None where not known)."""
    registers: int | None = None
    spills: int | None = None
    shared_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"registers": self.registers, "spills": self.spills, "shared_bytes": self.shared_bytes}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "Resources":
        data = data or {}
        return cls(data.get("registers"), data.get("spills"), data.get("shared_bytes"))


@dataclass(frozen=True)
class LaunchFeedback:
    launch: int
    kernel: str  # the generated kernel's file name, k_<digest>.py
    parts: tuple[PartRef, ...]
    resources: Resources = Resources()

    def to_dict(self) -> dict[str, Any]:
        return {"launch": self.launch, "kernel": self.kernel, "parts": [p.to_dict() for p in self.parts],
                "resources": self.resources.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "LaunchFeedback":
        return cls(data["launch"], data["kernel"], tuple(PartRef.from_dict(p) for p in data["parts"]),
                   Resources.from_dict(data.get("resources")))


@dataclass(frozen=True)
class CompileFailure:
    """A launch that could not be lowered or compiled: where (launch, part) and why."""
    launch: int
    part: int | None  # the failing part's index, None when the launch as a whole failed
    parts: tuple[PartRef, ...]  # every part of the launch
    reason: str

    @property
    def failed(self) -> tuple[PartRef, ...]:
        """The parts to blame: the failing part, or all of the launch's."""
        return (self.parts[self.part],) if self.part is not None and 0 <= self.part < len(self.parts) else self.parts

    @property
    def message(self) -> str:
        part = f" part {self.part}" if self.part is not None else ""
        ops = " | ".join(p.label for p in self.failed)
        return f"launch {self.launch}{part}" + (f" ({ops})" if ops else "") + f": {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return {"launch": self.launch, "part": self.part, "parts": [p.to_dict() for p in self.parts],
                "reason": self.reason}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CompileFailure":
        return cls(data["launch"], data.get("part"), tuple(PartRef.from_dict(p) for p in data["parts"]),
                   data["reason"])


class CompileError(ConjugateError):
    """A launch could not be lowered or compiled; carries where and why (a CompileFailure) as data
    for the agent."""

    def __init__(self, failure: CompileFailure):
        self.failure = failure
        super().__init__(failure.message)
