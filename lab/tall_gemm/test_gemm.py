"""tall_gemm under the interpreter: ragged rows, columns and K, programs walking several tiles."""
from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pytest  # noqa: E402
import torch  # noqa: E402

from gemm import TallTile, launch  # noqa: E402


@pytest.mark.parametrize("m, n, k, form, sms", [
    (40, 48, 80, TallTile(16, 16, 32, 2, 4, 2, persistent=True), 5),    # 3 x 3 tiles on 5 programs, K tail
    (40, 48, 80, TallTile(16, 16, 32, 2, 4, 2, persistent=False), 5),   # one tile a program
    (33, 20, 64, TallTile(32, 16, 16, 4, 4, 2, persistent=True), 1),    # one program walks all, M and N ragged
    (70, 32, 32, TallTile(16, 32, 16, 3, 4, 2, persistent=True), 2),    # a group cut short at the bottom
])
def test_every_tile_once_against_torch(m, n, k, form, sms):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=gen).bfloat16()
    w = torch.randn(n, k, generator=gen).bfloat16()
    out = torch.full((m, n), float("nan"))
    launch(x, w, out, form, sms)()
    torch.testing.assert_close(out, x.float() @ w.float().T, rtol=1e-3, atol=1e-3)


def test_a_persistent_form_runs_at_most_one_program_an_sm():
    form = TallTile(128, 128, 64, 8, 8, 3, persistent=True)
    assert form.tiles(512, 4096) == 128 and form.programs(512, 4096, 132) == 128
    assert form.programs(512, 14336, 132) == 132
    assert TallTile(128, 128, 64, 8, 8, 3, persistent=False).programs(512, 14336, 132) == 448
