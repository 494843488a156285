"""Decode/verify attention kernel (interpreter on CPU) against the reference `attention`."""
import pytest
import torch

import conjugate  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)
from conjugate.compiler.attention import SIGNATURE, attn_call, run_attention
from conjugate.models.reference import attention


def _inputs(batch, tokens, start, heads, kv_heads, hd, dtype, seed=0):
    """q fp32 [B*T, heads*hd] and caches [B, kv_heads, S_max, hd] with junk past start + T."""
    gen = torch.Generator().manual_seed(seed)
    s_max = start + tokens + 5  # positions past start + T must be ignored
    q = torch.randn(batch * tokens, heads * hd, generator=gen)
    k = (torch.randn(batch, kv_heads, s_max, hd, generator=gen) * 2).to(dtype)
    v = torch.randn(batch, kv_heads, s_max, hd, generator=gen).to(dtype)
    k[:, :, start + tokens:] = 1e4  # would dominate any softmax that read it
    v[:, :, start + tokens:] = float("nan")
    return q, k, v


def _expected(q, k, v, batch, tokens, start, heads, hd):
    n = start + tokens
    return attention(q.view(batch, tokens, heads, hd), k[:, :, :n], v[:, :, :n], start).reshape(batch * tokens, -1)


def _run(q, k, v, *, batch, tokens, start, heads, kv_heads, hd, block_n, split_kv):
    out = torch.full_like(q, float("nan"))
    call = attn_call(q, k, v, out, batch=batch, tokens=tokens, start=start, num_heads=heads, num_kv_heads=kv_heads,
                     head_dim=hd, block_n=block_n, split_kv=split_kv, label="test")
    run_attention(call)
    return call, out


# tokens, start, heads, kv_heads, hd, block_n, split_kv
CASES = [
    (1, 0, 2, 2, 16, 16, 1),  # decode, first token, MHA
    (1, 37, 4, 2, 16, 16, 1),  # decode, GQA 2, start not a BLOCK_N multiple
    (1, 37, 8, 2, 32, 16, 2),  # decode, GQA 4, hd 32, split 2
    (1, 37, 4, 1, 16, 16, 4),  # decode, GQA 4, split 4
    (4, 0, 2, 2, 16, 16, 1),  # verify from position 0: causal among new tokens only
    (4, 37, 4, 2, 32, 16, 1),  # verify, GQA 2, hd 32
    (4, 37, 4, 2, 16, 16, 2),  # verify, split 2
    (4, 37, 8, 2, 16, 32, 4),  # verify, GQA 4 (ROWS 16), split 4
    (4, 37, 8, 2, 32, 64, 4),  # one 64-key block: splits 1..3 get no keys
    (4, 3, 2, 1, 16, 16, 4),  # 7 keys, split 4: splits 1..3 get no keys
    (1, 2, 4, 4, 16, 16, 4),  # decode, 3 keys, split 4
    (4, 14, 8, 4, 32, 16, 2),  # split 2 = keys [0, 16) + [16, 18): tokens 0, 1 see no key of split 1
]


@pytest.mark.parametrize("tokens,start,heads,kv_heads,hd,block_n,split_kv", CASES)
def test_matches_reference_fp32(tokens, start, heads, kv_heads, hd, block_n, split_kv):
    batch = 2
    q, k, v = _inputs(batch, tokens, start, heads, kv_heads, hd, torch.float32)
    _, out = _run(q, k, v, batch=batch, tokens=tokens, start=start, heads=heads, kv_heads=kv_heads, hd=hd,
                  block_n=block_n, split_kv=split_kv)
    assert not out.isnan().any(), "some output element was not written"
    torch.testing.assert_close(out, _expected(q, k, v, batch, tokens, start, heads, hd), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("split_kv", [1, 2])
def test_matches_reference_bf16_cache(split_kv):
    batch, tokens, start, heads, kv_heads, hd = 2, 4, 37, 4, 2, 32
    q, k, v = _inputs(batch, tokens, start, heads, kv_heads, hd, torch.bfloat16, seed=1)
    _, out = _run(q, k, v, batch=batch, tokens=tokens, start=start, heads=heads, kv_heads=kv_heads, hd=hd,
                  block_n=16, split_kv=split_kv)
    assert not out.isnan().any()
    torch.testing.assert_close(out, _expected(q, k, v, batch, tokens, start, heads, hd), rtol=1e-3, atol=1e-3)


def test_second_launch_is_identical_and_counter_resets():
    batch, tokens, start, heads, kv_heads, hd = 2, 4, 37, 4, 2, 16
    q, k, v = _inputs(batch, tokens, start, heads, kv_heads, hd, torch.float32, seed=2)
    call, out = _run(q, k, v, batch=batch, tokens=tokens, start=start, heads=heads, kv_heads=kv_heads, hd=hd,
                     block_n=16, split_kv=4)
    counter = call.args["counter_ptr"]
    assert counter.tolist() == [0] * (batch * kv_heads)
    first = out.clone()
    out.fill_(float("nan"))
    run_attention(call)
    assert not out.isnan().any(), "second launch left elements unwritten (counter not reset?)"
    assert torch.equal(out, first)
    assert counter.tolist() == [0] * (batch * kv_heads)


def test_strided_q_and_out_rows():
    batch, tokens, start, heads, kv_heads, hd = 2, 2, 5, 4, 2, 16
    q, k, v = _inputs(batch, tokens, start, heads, kv_heads, hd, torch.float32, seed=3)
    q_wide = torch.randn(batch * tokens, heads * hd + 24)
    q_wide[:, :heads * hd] = q
    out_wide = torch.full((batch * tokens, heads * hd + 8), float("nan"))
    out = out_wide[:, :heads * hd]
    call = attn_call(q_wide[:, :heads * hd], k, v, out, batch=batch, tokens=tokens, start=start, num_heads=heads,
                     num_kv_heads=kv_heads, head_dim=hd, block_n=16, split_kv=2)
    assert call.args["stride_q"] == heads * hd + 24 and call.args["stride_o"] == heads * hd + 8
    run_attention(call)
    torch.testing.assert_close(out, _expected(q, k, v, batch, tokens, start, heads, hd), rtol=1e-4, atol=1e-4)
    assert out_wide[:, heads * hd:].isnan().all(), "wrote past the row's heads"


def test_signature_and_programs():
    q, k, v = _inputs(3, 4, 10, 8, 2, 16, torch.float32)
    call = attn_call(q, k, v, torch.empty_like(q), batch=3, tokens=4, start=10, num_heads=8, num_kv_heads=2,
                     head_dim=16, block_n=16, split_kv=4)
    assert call.programs == 3 * 2 * 4
    assert call.constexprs["ROWS"] == 16 and call.constexprs["GROUP"] == 4
    assert SIGNATURE.args[0] == "q_ptr" and SIGNATURE.constexprs[-1] == "DOT_DTYPE"
    assert any(t is call.args["counter_ptr"] for t in call.scratch)


@pytest.mark.parametrize("hd,block_n,match", [(24, 16, "head_dim"), (16, 8, "block_n")])
def test_rejects_invalid_options(hd, block_n, match):
    q, k, v = _inputs(1, 1, 4, 2, 2, hd, torch.float32)
    with pytest.raises(ValueError, match=match):
        attn_call(q, k, v, torch.empty_like(q), batch=1, tokens=1, start=4, num_heads=2, num_kv_heads=2,
                  head_dim=hd, block_n=block_n)
