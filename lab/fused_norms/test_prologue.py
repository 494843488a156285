"""prologue.py's variants under the Triton interpreter (CPU): each computes the normalised GEMM torch
does, at the `sequential` plan's target tiles (a K of 2048: 128 row statistics, two prologue steps).

    python -m pytest -q lab/fused_norms
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import importlib.util  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("lab_prologue", HERE / "prologue.py")
prologue = importlib.util.module_from_spec(spec)
spec.loader.exec_module(prologue)


@pytest.mark.parametrize("op", ["qkv", "gate_up"])
def test_every_variant_computes_the_normalised_gemm(op, tmp_path):
    rows = prologue.run_case(op, 5, 2048, 128, "cpu", tmp_path, timed=False)
    assert [r["variant"] for r in rows] == list(prologue.VARIANTS)
    for r in rows:
        assert "error" not in r and r["rel_err"] < 1e-2, r
    assert len({r["programs"] for r in rows}) == 1  # the same grid: only the prologue differs
