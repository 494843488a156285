"""Launch code generation: the program-id split, the generated source, `conjugate plan compile`."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import conjugate  # noqa: F401  (selects the interpreter before triton is imported)
import triton
import triton.language as tl
from conjugate.cli import main
from conjugate.compiler.codegen import Dispatch, kernel_args, kernel_source
from conjugate.compiler.gemm import gemm_call, gemm_tile
from conjugate.compiler.norm import rmsnorm_call
from conjugate.compiler.tile import TileSignature

ROOT = Path(__file__).resolve().parents[1]


@given(n0=st.integers(1, 300), n1=st.integers(1, 300),
       pattern=st.sampled_from(["blocked", "strided", "ratio"]), a=st.integers(1, 8), b=st.integers(1, 8))
def test_dispatch_gives_every_program_to_exactly_one_part(n0, n1, pattern, a, b):
    d = Dispatch.of(pattern, (a, b), (n0, n1))
    owners = [d.owner(pid, (n0, n1)) for pid in range(n0 + n1)]
    assert sorted(owners) == [(0, i) for i in range(n0)] + [(1, i) for i in range(n1)]
    if pattern == "blocked":
        assert owners[:n0] == [(0, i) for i in range(n0)]
    if pattern == "ratio" and n0 >= a and n1 >= b:  # the first round is a programs of part 0, then b of part 1
        assert [o[0] for o in owners[:a + b]] == [0] * a + [1] * b


def _parts():
    x, w, out = torch.randn(4, 64), torch.randn(32, 64), torch.empty(4, 32)
    return [gemm_call(x, w, out, rows=4, block_n=16, block_k=32),
            rmsnorm_call(torch.randn(4, 64), torch.ones(64), torch.empty(4, 64), rows=4, eps=1e-6, block=64)]


def test_source_is_deterministic_and_readable():
    parts = _parts()
    d = Dispatch.of("ratio", (2, 1), (parts[0].programs, parts[1].programs))
    source = kernel_source(parts, d)
    assert source == kernel_source(_parts(), d)  # independent of the buffers bound
    assert "from conjugate.compiler.gemm import gemm_tile" in source and "rmsnorm_tile(local1" in source
    assert "# part 0: gemm_tile(BLOCK_M=16, BLOCK_N=16, BLOCK_K=32" in source
    compile(source, "<generated>", "exec")
    args, constexprs = kernel_args(parts, d)
    assert args[-1] == parts[0].programs and "P1_BLOCK" in constexprs
    single = kernel_source(parts[:1], None)
    assert "gemm_tile(pid, " in single and "local0" not in single
    with pytest.raises(ValueError):
        kernel_source(parts, None)


@triton.jit
def _no_pid(x, BLOCK: tl.constexpr):
    pass


@triton.jit
def _mixed_tile(pid, x, BLOCK: tl.constexpr, y):
    pass


def test_tile_signature_is_read_from_the_tile_function():
    sig = TileSignature.of(gemm_tile)
    assert (sig.fn, sig.module) == ("gemm_tile", "conjugate.compiler.gemm")
    assert sig.args[:2] == ("x_ptr", "w_ptr") and sig.args[-5:] == ("rope_eps", "w_desc", "w2_desc", "wait_ptr", "wait_count")
    assert "tail_start" in sig.args
    assert sig.constexprs[0] == "BLOCK_M" and "EPILOGUE" in sig.constexprs
    assert sig.constexprs[-6:] == ("STATS_OUT", "STATS_IN", "COPY_OUT", "W_TMA", "PRELOAD_K", "WAIT")
    with pytest.raises(TypeError, match="pid"):
        TileSignature.of(_no_pid)
    with pytest.raises(TypeError, match="precede"):
        TileSignature.of(_mixed_tile)


def test_plan_compile_writes_kernel_sources(tmp_path, capsys):
    out = tmp_path / "kernels"
    code = main(["plan", "compile", str(ROOT / "plans" / "interleave.json"), "--workload",
                 str(ROOT / "examples" / "llama-1b-8b-b8.toml"), "--out", str(out)])
    assert code == 0
    manifest = json.loads((out / "manifest.json").read_text())
    kernels = {entry["kernel"] for entry in manifest["launches"]}
    assert kernels == {p.name for p in out.glob("k_*.py")}
    assert any(len(entry["parts"]) == 2 for entry in manifest["launches"])
    assert "distinct kernels written to" in capsys.readouterr().out
    bad = main(["plan", "compile", str(ROOT / "plans" / "interleave.json"), "--workload",
                str(ROOT / "examples" / "tiny.toml"), "--out", "/dev/null/x"])
    assert bad == 2 and capsys.readouterr().err.startswith(
        "error: --out /dev/null/x: /dev/null is a file, not a folder")
