"""The contract between op templates and the launch code generator.

Every op family (one file in this package) provides a `@triton.jit` tile function

    def <family>_tile(pid, <runtime args...>, <CONSTEXPR args...>)

that computes program `pid` of the op's grid, a TileSignature naming its arguments, and a
`<family>_call(...) -> PartCall` that binds one op's tensors and sizes. A launch of one or more
parts becomes a generated kernel that splits its program ids among the parts' tile functions.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"


@dataclass(frozen=True)
class TileSignature:
    fn: str  # name of the @triton.jit tile function
    module: str  # module defining it, e.g. "conjugate.compiler.gemm"
    args: tuple[str, ...]  # runtime arguments after pid, in order
    constexprs: tuple[str, ...]  # compile-time arguments, in order


@dataclass
class PartCall:
    """One op (or fused chain) bound to its buffers: what a launch needs to run its programs."""

    sig: TileSignature
    args: dict[str, Any]  # name -> tensor, int or float
    constexprs: dict[str, Any]  # name -> int, bool or a triton dtype
    programs: int
    label: str = ""  # op ids, for errors and generated comments
    scratch: list[torch.Tensor] = field(default_factory=list)  # buffers to keep alive

    def __post_init__(self) -> None:
        missing = [a for a in self.sig.args if a not in self.args] + [c for c in self.sig.constexprs if c not in self.constexprs]
        if missing:
            raise ValueError(f"{self.sig.fn}: unbound arguments {missing}")
        if self.programs < 1:
            raise ValueError(f"{self.sig.fn} ({self.label}): no programs")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def dot_dtype(weight_dtype: torch.dtype):
    """The operand type of tl.dot: the weights' own type on the GPU; fp32 under the interpreter,
    whose bf16/fp16 arithmetic is wrong."""
    import triton.language as tl

    if INTERPRETING:
        return tl.float32
    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[weight_dtype]
