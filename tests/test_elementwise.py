"""Embed, argmax and RMSNorm tiles under the Triton interpreter against plain PyTorch."""
import conjugate  # noqa: F401  (chooses the interpreter before triton is imported)

import pytest
import torch

from conjugate.compiler.embed import argmax_call, embed_call
from conjugate.compiler.norm import rmsnorm_call
from conjugate.models.reference import rms_norm
from kernel_parts import run_part  # tests/kernel_parts.py

VOCAB, HIDDEN = 50, 40  # HIDDEN is not a multiple of the blocks used


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("stride_tok", [1, 3])
@pytest.mark.parametrize("tok_dtype", [torch.int64, torch.int32])
def test_embed(dtype, stride_tok, tok_dtype):
    gen = torch.Generator().manual_seed(0)
    rows = 5
    table = torch.randn(VOCAB, HIDDEN, generator=gen).to(dtype)
    tokens = torch.randint(0, VOCAB, (rows * stride_tok,), generator=gen).to(tok_dtype)
    x = torch.full((rows, HIDDEN + 8), float("nan"))  # padded rows: row stride != HIDDEN
    call = embed_call(tokens, table, x, rows=rows, stride_tok=stride_tok, block=16)
    assert call.programs == rows * 3
    run_part(call)
    expected = table[tokens[::stride_tok].long()].float()  # [rows, HIDDEN]
    assert torch.equal(x[:, :HIDDEN], expected)
    assert x[:, HIDDEN:].isnan().all()  # the padding is not written


def _argmax_logits() -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 100, generator=gen)  # vocab 100: the last 32-chunk is partial
    logits[1, 3] = logits[1, 70] = 9.0  # tie across chunks: index 3 must win
    logits[2, 40] = logits[2, 45] = 9.0  # tie within one chunk: index 40 must win
    logits[3, 99] = 9.0  # maximum in the masked tail chunk
    logits[4] = float("-inf")  # all equal: index 0, like torch
    logits[5, 64] = logits[5, 96] = 9.0  # tie at chunk starts
    return logits


def test_argmax():
    logits = _argmax_logits()
    rows = logits.shape[0]
    out = torch.full((rows, 3), -1, dtype=torch.int64)  # write column 1 of a [rows, 3] token buffer
    run_part(argmax_call(logits, out[:, 1], rows=rows, vocab=100, stride_out=3, block=32))
    assert torch.equal(out[:, 1], logits.argmax(-1))
    assert out[:, 1].tolist()[1:6] == [3, 40, 99, 0, 64]
    assert (out[:, 0] == -1).all() and (out[:, 2] == -1).all()


def test_argmax_padded_rows():
    gen = torch.Generator().manual_seed(2)
    buf = torch.randn(4, 300, generator=gen)
    logits = buf[:, :257]  # row stride 300, vocab 257
    out = torch.full((4,), -1, dtype=torch.int64)
    run_part(argmax_call(logits, out, rows=4, vocab=257, block=64))
    assert torch.equal(out, logits.argmax(-1))


@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16])
def test_rmsnorm(wdtype):
    gen = torch.Generator().manual_seed(3)
    rows, eps = 5, 1e-5
    x = torch.randn(rows, HIDDEN + 4, generator=gen)[:, :HIDDEN] * 3.0  # row stride HIDDEN + 4
    weight = torch.randn(HIDDEN, generator=gen).to(wdtype)
    out = torch.full((rows, HIDDEN), float("nan"))
    run_part(rmsnorm_call(x, weight, out, rows=rows, eps=eps, block=16))
    assert not out.isnan().any()
    torch.testing.assert_close(out, rms_norm(x, weight, eps), rtol=1e-5, atol=1e-5)


def test_rmsnorm_rows_subset():
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(4, HIDDEN, generator=gen)
    weight = torch.rand(HIDDEN, generator=gen) + 0.5
    out = torch.full((4, HIDDEN), float("nan"))
    run_part(rmsnorm_call(x, weight, out, rows=3, eps=1e-6, block=64))  # block clamps to 64 > HIDDEN
    torch.testing.assert_close(out[:3], rms_norm(x[:3], weight, 1e-6), rtol=1e-5, atol=1e-5)
    assert out[3].isnan().all()
