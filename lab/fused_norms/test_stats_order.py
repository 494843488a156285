"""stats_order.py's orders under the Triton interpreter (CPU): the norm folded in with its row
statistics summed before the main loop, or loaded first and summed last, computes torch's normalised
GEMM (split K too, of unequal steps); a hidden size past what one early load reads is caught by the
check, not timed. The product's order (in the loop) has its tests in tests/test_gemm.py.

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


prologue, stats_order = _load("prologue"), _load("stats_order")


def _order(monkeypatch, order: str) -> None:
    monkeypatch.setattr(stats_order, "ORDER", stats_order.tl.constexpr(order))
    monkeypatch.setattr(gemm, "_accumulate_tile", stats_order._accumulate_tile_ordered)


@pytest.mark.parametrize("op", ["qkv", "gate_up"])
def test_the_early_sum_computes_the_normalised_gemm(op, tmp_path, monkeypatch):
    _order(monkeypatch, "early")
    rows = prologue.run_case(op, 5, 4096, 64, "cpu", tmp_path, timed=False)  # 256 statistics a row: one load
    for r in rows:
        assert "error" not in r and r["rel_err"] < 1e-2, r


def test_a_wider_row_fails_the_check(tmp_path, monkeypatch):
    _order(monkeypatch, "early")
    rows = {r["variant"]: r for r in prologue.run_case("qkv", 5, 8192, 64, "cpu", tmp_path, timed=False)}
    assert "error" in rows["stats_in"]  # the statistics past the first 256 were not read
    assert "error" not in rows["plain"] and "error" not in rows["pass"]


@pytest.mark.parametrize("op", ["qkv", "gate_up"])
@pytest.mark.parametrize("split_k", [1, 4])
def test_the_sum_before_the_loop_computes_the_normalised_gemm(op, split_k, tmp_path, monkeypatch):
    _order(monkeypatch, "prologue")
    monkeypatch.setattr(prologue, "sequential_tiles", lambda: {op: {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64,
                                                                    "SPLIT_K": split_k}})
    for r in prologue.run_case(op, 5, 1088, 64, "cpu", tmp_path, timed=False):  # 17 K steps in 4 splits too
        assert "error" not in r and r["rel_err"] < 1e-2, r


def test_the_sass_reader_counts_loads_and_loops_before_the_first_weight_load():
    sass = _load("sass")
    text = """
        /*0010*/                   LDG.E R2, desc[UR4][R4.64] ;
        /*0020*/                   FADD R1, R1, R2 ;
        /*0030*/               @P0 BRA 0x10 ;
        /*0040*/                   BRA 0x60 ;
        /*0050*/                   LDGSTS.E.BYPASS.128 [R16], desc[UR18][R2.64], P0 ;
        /*0060*/                   LDG.E R3, desc[UR4][R6.64] ;
    """
    assert sass.before_first_weight_load(text) == {"loads": 1, "loops": 1}  # a forward branch is no loop
    assert sass.before_first_weight_load("/*0010*/ LDG.E R2, desc[UR4][R4.64] ;")["no_weight_load"]
