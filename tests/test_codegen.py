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
from conjugate.compiler.codegen import Dispatch, dispatch_of, kernel_args, kernel_source
from conjugate.compiler.gemm import gemm_call
from conjugate.compiler.norm import rmsnorm_call
from conjugate.compiler.tile import TileSignature
from conjugate.kernels.gemm import gemm_residual_tile
from conjugate.plan.launch import One, Packed, Part, Split
from conjugate.roles import Model

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


def _planned(model: Model, kind: str) -> Part:
    return Part(model, (f"{model.value[0]}.l0.{kind}",), kind, (kind,), {})


def _split(pattern: str = "ratio", ratio: tuple[int, int] = (2, 1)) -> Split:
    return Split(_planned(Model.TARGET, "qkv"), _planned(Model.DRAFT, "attn_norm"), pattern, ratio)


def test_source_is_deterministic_and_readable():
    parts = _parts()
    form = _split()
    source = kernel_source(form, parts)
    assert source == kernel_source(form, _parts())  # independent of the buffers bound
    assert "from conjugate.kernels.gemm import gemm_tile" in source and "rmsnorm_tile(local1" in source
    assert "# part 0: gemm_tile(BLOCK_M=16, BLOCK_N=16, BLOCK_K=32" in source
    compile(source, "<generated>", "exec")
    d = dispatch_of(form, parts)
    assert d == Dispatch.of("ratio", (2, 1), (parts[0].programs, parts[1].programs))
    args, constexprs = kernel_args(parts, d, launch_bytes=123)
    assert args[-2:] == [parts[0].programs, 123] and "P1_BLOCK" in constexprs
    single = kernel_source(One(_planned(Model.TARGET, "qkv")), parts[:1])
    assert "gemm_tile(pid, " in single and "local0" not in single
    assert single == kernel_source(None, parts[:1])  # a part bound outside a plan: the same kernel


def test_a_packed_launch_runs_one_tile_function_with_arguments_chosen_per_program():
    x, w, out = torch.randn(4, 64), torch.randn(32, 64), torch.empty(4, 32)
    calls = [gemm_call(x, w, out, rows=4, block_n=16, block_k=32) for _ in range(2)]
    packed = Packed(_planned(Model.TARGET, "qkv"), _planned(Model.DRAFT, "qkv"), "strided")
    source = kernel_source(packed, calls)
    assert "tl.where(first, p0_x_ptr, p1_x_ptr)" in source and source.count("\n    gemm_tile(") == 1
    with pytest.raises(ValueError, match="one tile function"):
        kernel_source(packed, _parts())


def test_illegal_forms_cannot_be_built():
    target, draft = _planned(Model.TARGET, "qkv"), _planned(Model.DRAFT, "qkv")
    with pytest.raises(ValueError, match="target part, then a draft part"):
        Split(draft, target)
    with pytest.raises(ValueError, match="pattern"):
        Split(target, draft, "diagonal")
    assert Split(target, draft).parts == (target, draft) and One(target).parts == (target,)


def _kernel_parameters(source: str) -> int:
    head = source[source.index("def kernel("):source.index("):\n")]
    return sum(1 for p in head.removeprefix("def kernel(").replace("\n", " ").split(",") if p.strip())


@pytest.mark.parametrize("epilogue", ["store", "residual", "silu_mul", "argmax"])
def test_a_one_part_gemm_launch_has_few_kernel_parameters(epilogue):
    x, w, out = torch.randn(4, 64), torch.randn(32, 64), torch.empty(4, 32)
    extra = {"silu_mul": dict(w2=torch.randn(32, 64)), "argmax": dict(tokens=torch.empty(4, dtype=torch.int64))}
    call = gemm_call(x, w, out, rows=4, epilogue=epilogue, block_n=16, block_k=32, **extra.get(epilogue, {}))
    assert _kernel_parameters(kernel_source(None, [call])) <= 30


@triton.jit
def _no_pid(x, BLOCK: tl.constexpr):
    pass


@triton.jit
def _mixed_tile(pid, x, BLOCK: tl.constexpr, y):
    pass


def test_tile_signature_is_read_from_the_tile_function():
    sig = TileSignature.of(gemm_residual_tile)
    assert (sig.fn, sig.module) == ("gemm_residual_tile", "conjugate.kernels.gemm")
    assert sig.args[:3] == ("x_ptr", "w_ptr", "out_ptr") and sig.args[-3:] == ("blk_stride", "blk_pairs", "tail_start")
    assert sig.constexprs[0] == "BLOCK_M" and sig.constexprs[-4:] == ("ATOMIC_SPLIT", "STATS_OUT", "COPY_OUT",
                                                                      "DOT_DTYPE")
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
