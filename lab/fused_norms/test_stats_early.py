"""stats_early.py's main loop under the Triton interpreter (CPU): the norm folded in with its row
statistics loaded first and summed last computes torch's normalised GEMM; a hidden size past what one
load reads is caught by the check, not timed.

    python -m pytest -q lab/fused_norms
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import importlib.util  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from conjugate.kernels import gemm  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the lab scripts import their neighbours


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"lab_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


prologue, stats_early = _load("prologue"), _load("stats_early")


@pytest.mark.parametrize("op", ["qkv", "gate_up"])
def test_the_early_sum_computes_the_normalised_gemm(op, tmp_path, monkeypatch):
    monkeypatch.setattr(gemm, "_accumulate_tile", stats_early._accumulate_tile_early)
    rows = prologue.run_case(op, 5, 4096, 64, "cpu", tmp_path, timed=False)  # 256 statistics a row: one load
    for r in rows:
        assert "error" not in r and r["rel_err"] < 1e-2, r


def test_a_wider_row_fails_the_check(tmp_path, monkeypatch):
    monkeypatch.setattr(gemm, "_accumulate_tile", stats_early._accumulate_tile_early)
    rows = {r["variant"]: r for r in prologue.run_case("qkv", 5, 8192, 64, "cpu", tmp_path, timed=False)}
    assert "error" in rows["stats_in"]  # the statistics past the first 256 were not read
    assert "error" not in rows["plain"] and "error" not in rows["pass"]
