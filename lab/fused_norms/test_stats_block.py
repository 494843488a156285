"""The norm prologue's row statistics summed with another STATS_BLOCK give the same sums (CPU, the
Triton interpreter): what stats_block.py changes is only how many values a step reads.

    TRITON_INTERPRET=1 python -m pytest -q lab/fused_norms
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from conjugate.kernels import tile  # noqa: E402


@triton.jit
def _sums(stats_ptr, out_ptr, M, width, stride_stats, BLOCK_M: tl.constexpr):
    offs_m = tl.arange(0, BLOCK_M)
    tl.store(out_ptr + offs_m, tile.sum_row_stats(stats_ptr, offs_m, M, width, stride_stats, BLOCK_M), mask=offs_m < M)


@pytest.mark.parametrize("block", [64, 128, 256])
def test_the_sums_do_not_depend_on_the_step(block, monkeypatch):
    monkeypatch.setattr(tile, "STATS_BLOCK", tl.constexpr(block))
    width, rows = 4096, 5  # a hidden size of 4096: 256 statistics a row
    stats = torch.rand(rows, width // 16 + 3)  # a row stride past the statistics
    out = torch.empty(rows)
    _sums[(1,)](stats, out, rows, width, stats.stride(0), BLOCK_M=16)
    torch.testing.assert_close(out, stats[:, :width // 16].sum(dim=1))
