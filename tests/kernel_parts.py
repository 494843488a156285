"""Runs op templates as a compiled round does: one part's generated kernel, through the kernel cache."""
from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from conjugate.compiler.cache import KernelCache
from conjugate.compiler.round import CompiledLaunch
from conjugate.compiler.tile import PartCall

_DIRECTORY = tempfile.TemporaryDirectory(prefix="conjugate-test-kernels-")  # removed at exit
_CACHE = KernelCache(Path(_DIRECTORY.name))


def run_part(call: PartCall, num_warps: int = 4, num_stages: int = 2) -> CompiledLaunch:
    """Build the one-part launch of `call` (as CompiledRound does) and run it once."""
    launch = CompiledLaunch.alone(0, call, _CACHE, num_warps=num_warps, num_stages=num_stages)
    launch()
    return launch


# lengths tensors a kernel call must refuse, for batch 2 with 4 tokens per sequence
WRONG_LENGTHS = [
    torch.tensor([4, 4], dtype=torch.int32),  # wrong dtype
    torch.tensor([4.0, 4.0]),  # floating
    torch.tensor([4], dtype=torch.int64),  # too short: the kernel would read past it
    torch.tensor([4, 4, 4], dtype=torch.int64),  # too long
    torch.tensor([[4, 4]], dtype=torch.int64),  # 2-D
    torch.tensor(4, dtype=torch.int64),  # 0-D
    torch.tensor([4] * 8, dtype=torch.int64),  # one per row (batch * tokens), not per sequence
    torch.empty(2, dtype=torch.int64, device="meta"),  # another device
]
WRONG_LENGTH_IDS = ["int32", "float", "short", "long", "2d", "0d", "per_row", "device"]
