"""The contract between op templates and the launch code generator.

Every op family (one file in this package) provides a `@triton.jit` tile function

    def <family>_tile(pid, <runtime args...>, <CONSTEXPR args...>)

that computes program `pid` of the op's grid, its TileSignature (`TileSignature.of(<family>_tile)`,
read from the function's own parameters), and a `<family>_call(...) -> PartCall` that binds one
op's tensors and sizes. A launch of one or more parts becomes a generated kernel that splits its
program ids among the parts' tile functions (round.CompiledLaunch.build).
"""
from __future__ import annotations

import inspect
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

    @classmethod
    def of(cls, tile) -> "TileSignature":
        """The signature of a @triton.jit tile function `(pid, <runtime args>, <CONSTEXPR args>)`;
        a parameter is a constexpr when annotated `tl.constexpr` (Triton's own rule)."""
        fn = tile.fn  # the Python function under JITFunction and the interpreter's wrapper alike
        params = list(inspect.signature(fn).parameters.values())
        if not params or params[0].name != "pid":
            raise TypeError(f"{fn.__name__}: a tile function's first parameter is pid")
        is_constexpr = ["constexpr" in str(p.annotation) for p in params[1:]]
        if is_constexpr != sorted(is_constexpr):
            raise TypeError(f"{fn.__name__}: runtime parameters must precede the constexprs")
        names = [p.name for p in params[1:]]
        args = tuple(n for n, c in zip(names, is_constexpr) if not c)
        return cls(fn.__name__, fn.__module__, args, tuple(names[len(args):]))


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


def triton_dtype(dtype: torch.dtype):
    """Triton's name for a torch floating-point type (bf16, fp16, fp32)."""
    import triton.language as tl

    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[dtype]


def dot_dtype(weight_dtype: torch.dtype):
    """The operand type of tl.dot: the weights' own type on the GPU; fp32 under the interpreter,
    whose bf16/fp16 arithmetic is wrong."""
    return triton_dtype(torch.float32 if INTERPRETING else weight_dtype)
