"""The fused MLP template (plan fusion gate_up+down) under the interpreter."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import conjugate  # noqa: F401  (selects the interpreter before triton is imported)
from conjugate.compiler.gemm import STATS_CHUNK, gemm_call
from conjugate.compiler.mlp import mlp_call
from kernel_parts import run_part  # tests/kernel_parts.py

M, H, FFN = 5, 96, 200  # an ffn size that no block size divides, a hidden size BLOCK_K=64 does not


def _weights(seed: int = 0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    gate, up = (torch.randn(FFN, H, generator=g) / H ** 0.5 for _ in range(2))
    down = torch.randn(H, FFN, generator=g) / FFN ** 0.5
    return gate.to(dtype), up.to(dtype), down.to(dtype)


def _expected(h, residual, gate, up, down, act_dtype):
    act = (F.silu(h @ gate.float().T) * (h @ up.float().T)).to(act_dtype).float()
    return residual + act @ down.float().T


@pytest.mark.parametrize("block_m,block_f,block_k", [(16, 32, 64), (16, 64, 32), (32, 128, 128)])
def test_the_mlp_adds_into_the_residual_stream(block_m, block_f, block_k):
    gate, up, down = _weights()
    g = torch.Generator().manual_seed(1)
    h, residual = torch.randn(M, H, generator=g), torch.randn(M, H, generator=g)
    out = residual.clone()
    call = mlp_call(h, gate, up, down, out, rows=M, act_dtype=torch.float32, block_m=block_m, block_f=block_f,
                    block_k=block_k)
    assert call.programs == -(-M // block_m) * -(-FFN // block_f)
    run_part(call)
    torch.testing.assert_close(out, _expected(h, residual, gate, up, down, torch.float32), atol=1e-4, rtol=1e-4)


def test_activations_are_rounded_as_the_separate_launches_store_them():
    """bf16 weights: the fused launch gives what the separate gate_up (activations stored in bf16) and
    down launches give, not the unrounded product."""
    gate, up, down = _weights(2, torch.bfloat16)
    g = torch.Generator().manual_seed(3)
    h, residual = torch.randn(M, H, generator=g).to(torch.bfloat16), torch.randn(M, H, generator=g)
    fused, separate = residual.clone(), residual.clone()
    run_part(mlp_call(h, gate, up, down, fused, rows=M, act_dtype=torch.bfloat16, block_f=32, block_k=32))
    act = torch.empty(M, FFN, dtype=torch.bfloat16)
    run_part(gemm_call(h, gate, act, rows=M, epilogue="silu_mul", w2=up))
    run_part(gemm_call(act, down, separate, rows=M, epilogue="residual"))
    torch.testing.assert_close(fused, separate, atol=1e-5, rtol=1e-5)
    unrounded = _expected(h.float(), residual, gate, up, down, torch.float32)
    assert (fused - unrounded).abs().max() > 100 * (fused - separate).abs().max()


def test_a_fused_norm_reads_the_row_statistics_and_a_copy_of_the_rows():
    """mlp_norm+gate_up+down: x a copy of the residual rows, the norm weight folded into gate and up,
    the sums of squares from the statistics the o_proj wrote; as the fused-norm gate_up and the down
    launches compute it."""
    gate, up, down = _weights(6)
    g = torch.Generator().manual_seed(7)
    residual, gain = torch.randn(M, H, generator=g), 1 + 0.1 * torch.randn(H, generator=g)
    chunks = -(-H // STATS_CHUNK.value)
    stats = torch.zeros(M, chunks)
    stats[:, :H // STATS_CHUNK.value] = residual.pow(2).reshape(M, -1, STATS_CHUNK.value).sum(-1)
    folded_gate, folded_up = gate * gain, up * gain
    fused = residual.clone()
    call = mlp_call(residual.clone(), folded_gate, folded_up, down, fused, rows=M, act_dtype=torch.float32,
                    norm_eps=1e-6, stats=stats, block_f=32, block_k=32)
    assert call.constexprs["NORM"]
    run_part(call)
    h = residual * torch.rsqrt(residual.pow(2).mean(-1, keepdim=True) + 1e-6) * gain
    torch.testing.assert_close(fused, _expected(h, residual, gate, up, down, torch.float32), atol=1e-4, rtol=1e-4)


def test_row_statistics_of_the_finished_rows_feed_the_next_norm():
    gate, up, down = _weights(4)
    g = torch.Generator().manual_seed(5)
    h, residual = torch.randn(M, H, generator=g), torch.randn(M, H, generator=g)
    out, chunks = residual.clone(), -(-H // STATS_CHUNK.value)
    stats = torch.full((M, chunks), float("nan"))
    call = mlp_call(h, gate, up, down, out, rows=M, act_dtype=torch.float32, stats=stats, stats_out=True,
                    block_f=32, block_k=32)
    for _ in range(2):  # the counter clears itself for the next launch
        out.copy_(residual)
        run_part(call)
        expected = _expected(h, residual, gate, up, down, torch.float32)
        torch.testing.assert_close(stats, expected.pow(2).reshape(M, chunks, -1).sum(-1), atol=1e-3, rtol=1e-4)
    assert int(call.scratch[0].abs().sum()) == 0


def test_refuses_what_it_cannot_fuse():
    gate, up, down = _weights()
    h, out = torch.zeros(M, H), torch.zeros(M, H)
    with pytest.raises(ValueError, match="reads x while adding into the residual stream"):
        mlp_call(out, gate, up, down, out, rows=M, act_dtype=torch.float32)
    with pytest.raises(ValueError, match=r"x \(5, 95\) is not 5 contiguous rows of 96"):
        mlp_call(h[:, :95], gate, up, down, out, rows=M, act_dtype=torch.float32)
    with pytest.raises(ValueError, match="not an MLP's"):
        mlp_call(h, gate, up, down.T, out, rows=M, act_dtype=torch.float32)
    with pytest.raises(ValueError, match="fp32 residual stream"):
        mlp_call(h, gate, up, down, out.to(torch.bfloat16), rows=M, act_dtype=torch.float32)
    with pytest.raises(ValueError, match=r"row statistics need an fp32 \[5, 6\] buffer"):
        mlp_call(h, gate, up, down, out, rows=M, act_dtype=torch.float32, stats_out=True, block_k=32)
    with pytest.raises(ValueError, match=r"row statistics need an fp32 \[5, 6\] buffer"):
        mlp_call(h, gate, up, down, out, rows=M, act_dtype=torch.float32, norm_eps=1e-6, stats=torch.zeros(M, 5))
    with pytest.raises(ValueError, match="BLOCK_K 8 is not a multiple"):
        mlp_call(h, gate, up, down, out, rows=M, act_dtype=torch.float32, stats=torch.zeros(M, 6),
                 stats_out=True, block_k=8)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: the interpreter runs programs one at a time")
def test_on_a_gpu_the_fused_chain_gives_the_separate_launches_result():
    """Programs at once (counters, read-backs, atomics): an o_proj summing split-K atomically, writing the
    row statistics and the copy of its rows, then mlp_norm+gate_up+down over that copy, against the o_proj
    and the fused-norm gate_up and down launches; bf16 weights, launched 40 times."""
    dev, rows, hid, ffn, q = "cuda", 4, 1024, 3072, 2048
    g = torch.Generator(device=dev).manual_seed(0)

    def weight(n, k):
        return (torch.randn(n, k, device=dev, generator=g) / k ** 0.5).bfloat16()

    wo, gate, up, down = weight(hid, q), weight(ffn, hid), weight(ffn, hid), weight(hid, ffn)
    attn = torch.randn(rows, q, device=dev, generator=g).bfloat16()
    residual = torch.randn(rows, hid, device=dev, generator=g)
    chunks = -(-hid // STATS_CHUNK.value)
    x1, x2, copy, act = residual.clone(), residual.clone(), torch.empty(rows, hid, device=dev).bfloat16(), \
        torch.empty(rows, ffn, device=dev).bfloat16()
    s1, s2 = torch.zeros(rows, chunks, device=dev), torch.zeros(rows, chunks, device=dev)
    tiles = dict(block_m=16, block_n=64, block_k=64, split_k=8)
    fused = [gemm_call(attn, wo, x1, rows=rows, epilogue="residual", atomic_split=True, stats=s1, stats_out=True,
                       copy=copy, **tiles),
             mlp_call(copy, gate, up, down, x1, rows=rows, act_dtype=torch.bfloat16, norm_eps=1e-6, stats=s1,
                      block_f=32, block_k=128)]
    separate = [gemm_call(attn, wo, x2, rows=rows, epilogue="residual", atomic_split=True, stats=s2, stats_out=True,
                          **tiles),
                gemm_call(x2, gate, act, rows=rows, epilogue="silu_mul", w2=up, norm_eps=1e-6, stats=s2,
                          stats_in=True, block_n=32),
                gemm_call(act, down, x2, rows=rows, epilogue="residual", atomic_split=True, split_k=8, block_k=64)]
    for _ in range(40):
        x1.copy_(residual)
        x2.copy_(residual)
        for call in fused:
            run_part(call)
        for call in separate:
            run_part(call)
        torch.cuda.synchronize()
        torch.testing.assert_close(x1, x2, atol=2e-3, rtol=2e-3)
    assert int(fused[1].scratch[0].abs().sum()) == 0 and int(fused[0].args["counter_ptr"].abs().sum()) == 0
