"""A planned launch and its form: what the code generator and the round need to know of it.

A launch's form is one of five types, so a combination no kernel can run cannot be built:

    One(part)                               one part alone
    Step(part)                              the draft's k decode steps, every op of them, as one
                                            persistent launch (kernels/step)
    Streamed(part)                          one residual GEMM (o_proj, down) as the streamed kernel:
                                            whole-K weight tiles streamed by TMA (kernels/streamed.py)
    Split(target, draft, pattern, ratio)    a part of each model, the program ids split between them
    Packed(target, draft, pattern, ratio)   two GEMMs over one block-interleaved weight buffer, one
                                            homogeneous tile loop (compiler/packed.py)

`pdl` says where a programmatic dependent launch lets the next launch start: never (`none`, not launched
that way), right after its wait (`start`), or once its tiles are done (`end`).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from conjugate.roles import Model

PATTERNS = ("blocked", "strided", "ratio")  # how a pair's programs interleave


@dataclass(frozen=True)
class Part:
    """One model's share of a launch: an op, or a fused chain of consecutive ops."""

    model: Model
    ops: tuple[str, ...]
    kind: str  # the unit's main op kind; a fused norm+GEMM is a GEMM part
    fused: tuple[str, ...]  # kinds of every op in the chain
    tiles: dict[str, int]
    atomic_split: bool = False  # a residual GEMM's split-K partials added atomically (plan split_reduce)
    norm_stats: tuple[str, ...] = ()  # norm kinds of the model fused into the next GEMM, which read the row
    # statistics the residual GEMMs write (with atomic split sums, each tile's last split reads its
    # finished rows back for them)
    mlp_fused: bool = False  # the model's MLP is one launch (gate_up+down): with its norm fused too, the o_proj
    # before it copies its finished rows for it (kernels/mlp.py)


@dataclass(frozen=True)
class One:
    part: Part

    @property
    def parts(self) -> tuple[Part, ...]:
        return (self.part,)


@dataclass(frozen=True)
class Step:
    """The draft's whole phase (plan `draft.form: step`): its part holds every draft op of the round."""

    part: Part

    def __post_init__(self):
        if self.part.model != Model.DRAFT:
            raise ValueError("a step launch runs the draft's steps")

    @property
    def parts(self) -> tuple[Part, ...]:
        return (self.part,)


@dataclass(frozen=True)
class Streamed:
    """A residual GEMM alone in its launch, run by the streamed kernel (plan `<model>.streamed`)."""

    part: Part

    @property
    def parts(self) -> tuple[Part, ...]:
        return (self.part,)


@dataclass(frozen=True)
class _Pair:
    """A target part and a draft part sharing one grid: rounds of `ratio` programs (the `ratio`
    pattern), one of each (`strided`), or all of the target's first (`blocked`)."""

    target: Part
    draft: Part
    pattern: str = "blocked"
    ratio: tuple[int, int] = (1, 1)  # [target, draft] programs a round of the `ratio` pattern

    def __post_init__(self):
        if (self.target.model, self.draft.model) != (Model.TARGET, Model.DRAFT):
            raise ValueError("a shared launch holds a target part, then a draft part")
        if self.pattern not in PATTERNS or min(self.ratio) < 1:
            raise ValueError(f"interleave {self.pattern!r} {self.ratio}: a pattern of {PATTERNS}, ratios >= 1")

    @property
    def parts(self) -> tuple[Part, ...]:
        return (self.target, self.draft)


@dataclass(frozen=True)
class Split(_Pair):
    """Each part runs its own tile function on its share of the programs."""


@dataclass(frozen=True)
class Packed(_Pair):
    """Both GEMMs run one tile function, their weights packed into one buffer (operand layout `packed`)."""


Form = One | Step | Streamed | Split | Packed


class Pdl(StrEnum):
    NONE = "none"
    START = "start"
    END = "end"


@dataclass(frozen=True)
class Launch:
    index: int
    form: Form
    stream: str  # "main" in one-stream mode, else the model's name
    num_warps: int
    num_stages: int
    pdl: Pdl = Pdl.NONE
    bytes: int = 0
    flops: int = 0

    @property
    def parts(self) -> tuple[Part, ...]:
        return self.form.parts

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(op for part in self.parts for op in part.ops)

    @property
    def cross_model(self) -> bool:
        return len({p.model for p in self.parts}) > 1
