"""Runs op templates as a compiled round does: one part's generated kernel, through the kernel cache."""
from __future__ import annotations

import tempfile
from pathlib import Path

from conjugate.compiler.codegen import KernelCache
from conjugate.compiler.round import CompiledLaunch
from conjugate.compiler.tile import PartCall

_DIRECTORY = tempfile.TemporaryDirectory(prefix="conjugate-test-kernels-")  # removed at exit
_CACHE = KernelCache(Path(_DIRECTORY.name))


def run_part(call: PartCall, num_warps: int = 4, num_stages: int = 2) -> CompiledLaunch:
    """Build the one-part launch of `call` (as CompiledRound does) and run it once."""
    launch = CompiledLaunch.build(0, [call], _CACHE, num_warps=num_warps, num_stages=num_stages)
    launch()
    return launch
