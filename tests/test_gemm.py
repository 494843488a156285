"""The weight-streaming GEMM template under the interpreter: every epilogue, prologue and split-K."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import conjugate  # noqa: F401  (selects the interpreter before triton is imported)
from conjugate.compiler.gemm import STATS_CHUNK, gemm_call
from kernel_parts import run_part  # tests/kernel_parts.py

M, N, K = 10, 300, 200


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(M, K, generator=g), torch.randn(N, K, generator=g) / K ** 0.5,
            torch.randn(N, K, generator=g) / K ** 0.5, torch.randn(N, generator=g))


def _normed(x: torch.Tensor, gain: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gain


@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("block_m,block_n,block_k", [(16, 64, 64), (16, 32, 128)])
def test_store_with_bias(split_k, block_m, block_n, block_k):
    x, w, _, b = _inputs()
    out = torch.full((M, N), float("nan"))
    call = gemm_call(x, w, out, rows=M, bias=b, split_k=split_k, block_m=block_m, block_n=block_n, block_k=block_k)
    for _ in range(2):  # the split-K workspaces and counters clear themselves
        run_part(call)
        torch.testing.assert_close(out, x @ w.T + b, atol=1e-4, rtol=1e-4)
    assert int(call.scratch[0].abs().sum()) == 0  # every counter back to zero


@pytest.mark.parametrize("split_k", [1, 4])
@pytest.mark.parametrize("atomic", [False, True])
def test_residual_add(split_k, atomic):
    """Split-K sums in split order, or each split adding its partial atomically (split_reduce)."""
    x, w, _, _ = _inputs(1)
    residual = torch.randn(M, N)
    out = residual.clone()
    call = gemm_call(x, w, out, rows=M, epilogue="residual", split_k=split_k, block_k=32, atomic_split=atomic)
    run_part(call)
    torch.testing.assert_close(out, residual + x @ w.T, atol=1e-4, rtol=1e-4)
    assert call.constexprs["ATOMIC_SPLIT"] == (atomic and split_k > 1)
    if call.constexprs["ATOMIC_SPLIT"]:
        assert call.scratch[3].numel() == 1  # no workspace for partial sums


def test_an_atomic_split_sum_is_for_the_residual_epilogue_alone():
    x, w, _, b = _inputs()
    out = torch.empty(M, N)
    for bad in (dict(epilogue="store"), dict(epilogue="residual", bias=b), dict(epilogue="residual", norm_eps=1e-5)):
        with pytest.raises(ValueError, match="atomic split-K sum is for the residual epilogue alone"):
            gemm_call(x, w, out, rows=M, split_k=2, atomic_split=True, **bad)


@pytest.mark.parametrize("split_k", [1, 2])
def test_norm_prologue_and_silu_mul(split_k):
    x, w, w2, _ = _inputs(2)
    gain = torch.rand(K) + 0.5
    out = torch.full((M, N), float("nan"))
    # the norm weight is folded into both GEMM weights; the kernel scales rows by 1/rms
    run_part(gemm_call(x, w * gain, out, rows=M, epilogue="silu_mul", w2=w2 * gain, norm_eps=1e-5, split_k=split_k,
                       block_k=64))
    h = _normed(x, gain)
    torch.testing.assert_close(out, F.silu(h @ w.T) * (h @ w2.T), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("split_k,atomic,stats_out", [(1, False, False), (4, False, True), (4, True, True),
                                                     (4, True, False)])
def test_a_residual_gemm_copies_its_finished_rows(split_k, atomic, stats_out):
    """COPY_OUT: the finished rows (splits summed in order, or atomically and read back by each tile's
    last split) go into the copy too, in its type: a fused MLP's input (mlp.py)."""
    x, w, _, _ = _inputs(8)
    residual = torch.randn(M, N)
    out, copy = residual.clone(), torch.full((M, N + 3), float("nan"))[:, :N]  # a row stride of its own
    stats = torch.zeros(M, -(-N // STATS_CHUNK.value))
    call = gemm_call(x, w, out, rows=M, epilogue="residual", split_k=split_k, block_k=32, block_n=32,
                     atomic_split=atomic, stats=stats, stats_out=stats_out, copy=copy)
    assert call.constexprs["COPY_OUT"]
    for _ in range(2):  # the counters are reset: a second launch copies again
        out.copy_(residual)
        copy.fill_(float("nan"))
        run_part(call)
    torch.testing.assert_close(out, residual + x @ w.T, atol=1e-4, rtol=1e-4)
    assert torch.equal(copy, out)
    with pytest.raises(ValueError, match="a copy of the finished rows is the residual epilogue's"):
        gemm_call(x, w, out, rows=M, epilogue="store", copy=copy)
    with pytest.raises(ValueError, match="a copy of the finished rows is the residual epilogue's"):
        gemm_call(x, w, out, rows=M, epilogue="residual", copy=copy[:, :10])


@pytest.mark.parametrize("split_k,atomic", [(1, False), (4, False), (4, True)])
def test_row_statistics_from_a_residual_gemm_feed_the_next_norm(split_k, atomic):
    """A residual GEMM writes its rows' sums of squares per STATS_CHUNK columns (summing its splits in
    order, or atomically with the last split of each tile reading the finished rows back); a norm GEMM
    reading them computes what its own pass over x computes."""
    chunk = STATS_CHUNK.value
    x, w, _, _ = _inputs(3)
    residual = torch.randn(M, N)
    out = residual.clone()
    stats = torch.full((M, -(-N // chunk)), float("nan"))
    call = gemm_call(x, w, out, rows=M, epilogue="residual", split_k=split_k, block_k=32, block_n=32,
                     stats=stats, stats_out=True, atomic_split=atomic)
    assert call.constexprs["ATOMIC_SPLIT"] == atomic
    for _ in range(2):  # the counters are reset: a second launch writes the statistics again
        stats.fill_(float("nan"))
        out.copy_(residual)
        run_part(call)
        assert int(call.args["counter_ptr"].abs().sum()) == 0
    torch.testing.assert_close(out, residual + x @ w.T, atol=1e-4, rtol=1e-4)
    padded = F.pad(out, (0, stats.shape[1] * chunk - N))
    torch.testing.assert_close(stats, padded.pow(2).reshape(M, -1, chunk).sum(-1), atol=1e-3, rtol=1e-4)
    w_next = torch.randn(64, N) / N ** 0.5
    gain = torch.rand(N) + 0.5
    read, passed = torch.empty(M, 64), torch.empty(M, 64)
    run_part(gemm_call(out, w_next * gain, read, rows=M, norm_eps=1e-5, split_k=split_k, block_k=64, stats=stats,
                       stats_in=True))
    run_part(gemm_call(out, w_next * gain, passed, rows=M, norm_eps=1e-5, split_k=split_k, block_k=64))
    torch.testing.assert_close(read, passed, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(read, _normed(out, gain) @ w_next.T, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("k,block_k,split_k", [(256, 32, 2), (320, 32, 3), (200, 16, 4), (100, 64, 4)])
@pytest.mark.parametrize("epilogue", ["store", "silu_mul"])
def test_the_norm_reads_the_whole_rows_statistics_in_every_split(k, block_k, split_k, epilogue):
    """The statistics come a K step at a time inside the main loop: equal splits, three splits, a short
    last split and empty ones (K past what the first splits cover) each sum the whole row."""
    g = torch.Generator().manual_seed(k + split_k)
    x = torch.randn(M, k, generator=g) * 3
    w, w2 = (torch.randn(2, 48, k, generator=g) / k ** 0.5).unbind()
    stats = F.pad(x, (0, -k % STATS_CHUNK.value)).pow(2).reshape(M, -1, STATS_CHUNK.value).sum(-1)
    out = torch.full((M, 48), float("nan"))
    two = epilogue == "silu_mul"
    run_part(gemm_call(x, w, out, rows=M, epilogue=epilogue, w2=w2 if two else None, norm_eps=1e-5,
                       split_k=split_k, block_k=block_k, block_n=16, stats=stats, stats_in=True))
    ref = _normed(x, torch.ones(k)) @ w.T
    if two:
        ref = F.silu(ref) * (_normed(x, torch.ones(k)) @ w2.T)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


def test_row_statistics_bindings():
    x, w, _, _ = _inputs()
    out = torch.empty(M, N)
    stats = torch.empty(M, -(-N // STATS_CHUNK.value))
    with pytest.raises(ValueError, match=r"fp32 \[10, 19\] buffer"):
        gemm_call(x, w, out, rows=M, epilogue="residual", stats=stats[:, :4], stats_out=True)
    with pytest.raises(ValueError, match="written by a residual epilogue, BLOCK_N a multiple of 16"):
        gemm_call(x, w, out, rows=M, epilogue="store", stats=stats, stats_out=True)
    with pytest.raises(ValueError, match="written by a residual epilogue, BLOCK_N a multiple of 16"):
        gemm_call(x, w, out, rows=M, epilogue="residual", block_n=8, stats=stats, stats_out=True)
    with pytest.raises(ValueError, match="read by a norm prologue"):
        gemm_call(x, w, out, rows=M, stats=torch.empty(M, 13), stats_in=True)


@pytest.mark.parametrize("split_k,write_out", [(1, True), (2, False)])
def test_argmax_epilogue_first_index_on_ties(split_k, write_out):
    x, w, _, _ = _inputs(3)
    w[7] = w[5]  # columns 5 and 7 tie on every row; columns 250 and 299 tie across tiles
    w[299] = w[250]
    x[0] = w[5] * 50  # row 0: the tie at 5/7 wins; row 1: the cross-tile tie wins
    x[1] = w[250] * 50
    out = torch.full((M, N), float("nan"))
    tokens = torch.full((M, 3), -1, dtype=torch.int64)
    call = gemm_call(x, w, out, rows=M, epilogue="argmax", tokens=tokens[:, 1], stride_tok=3, block_n=32,
                     write_out=write_out, split_k=split_k, block_k=64)
    for _ in range(2):  # the program counter resets itself
        run_part(call)
        expected = (x @ w.T).argmax(-1)
        assert tokens[:, 1].tolist() == expected.tolist()
        assert tokens[0, 1] == 5 and tokens[1, 1] == 250
        assert (tokens[:, [0, 2]] == -1).all()
    assert torch.isnan(out).all() != write_out


def test_padded_rows_and_strides():
    x, w, _, _ = _inputs(4)
    wide = torch.full((M, N + 20), float("nan"))
    out = wide[:, :N]
    run_part(gemm_call(x, w, out, rows=M, block_m=16, block_n=64))
    torch.testing.assert_close(out, x @ w.T, atol=1e-4, rtol=1e-4)
    assert torch.isnan(wide[:, N:]).all()


def test_bad_bindings():
    x, w, _, _ = _inputs()
    out = torch.empty(M, N)
    with pytest.raises(ValueError, match="w2"):
        gemm_call(x, w, out, rows=M, epilogue="silu_mul")
    with pytest.raises(ValueError, match="tokens"):
        gemm_call(x, w, out, rows=M, epilogue="argmax")


@pytest.mark.parametrize("epilogue, weight_tiles", [("store", 1), ("residual", 1), ("silu_mul", 2), ("rope_kv", 2)])
def test_the_shared_memory_estimate_counts_each_weight_tile_a_stage_loads(epilogue, weight_tiles):
    from types import SimpleNamespace

    from conjugate.compiler.device import shared_memory_estimate
    from conjugate.compiler.gemm import SIGNATURES

    bf16 = torch.empty(0, dtype=torch.bfloat16)
    tile = {"BLOCK_N": 64} if epilogue != "rope_kv" else {"HEAD_DIM": 128}  # a tile is half a head
    part = SimpleNamespace(sig=SIGNATURES[epilogue], args={"x_ptr": torch.empty(0), "w_ptr": bf16},
                           constexprs={"BLOCK_M": 16, "BLOCK_K": 256} | tile)
    x_tile, w_tile = 16 * 256 * 4, 64 * 256 * 2  # fp32 rows in, bf16 weights
    assert shared_memory_estimate(part, 5) == 5 * (x_tile + weight_tiles * w_tile)
