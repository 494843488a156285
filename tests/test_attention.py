"""Decode/verify attention kernel (interpreter on CPU) against the reference `attention`.

Sequence b's token t sits at position lengths[b] + offset + t; lengths is read at run time, so the
sequences of one batch may differ (ragged). Everything a sequence must not read (the cache past its
own last position) holds junk: 1e4 keys (they would dominate any softmax that read them) and NaN
values.
"""
import pytest
import torch

import conjugate  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)
from conjugate.compiler.attention import SIGNATURE, attn_call
from conjugate.models.reference import attention
from kernel_parts import WRONG_LENGTH_IDS, WRONG_LENGTHS, run_part  # tests/kernel_parts.py


def _junk(k, v, lengths, offset, tokens):
    """Puts junk past each sequence's last valid position lengths[b] + offset + tokens - 1."""
    for b, n in enumerate(lengths):
        k[b, :, n + offset + tokens:] = 1e4
        v[b, :, n + offset + tokens:] = float("nan")


def _inputs(lengths, tokens, offset, heads, kv_heads, hd, dtype, seed=0, s_max=None):
    """q fp32 [B*T, heads*hd] and caches [B, kv_heads, S_max, hd], junk past each sequence's keys."""
    gen = torch.Generator().manual_seed(seed)
    batch = len(lengths)
    s_max = s_max or max(lengths) + offset + tokens + 5  # positions past each sequence's end must be ignored
    q = torch.randn(batch * tokens, heads * hd, generator=gen)
    k = (torch.randn(batch, kv_heads, s_max, hd, generator=gen) * 2).to(dtype)
    v = torch.randn(batch, kv_heads, s_max, hd, generator=gen).to(dtype)
    _junk(k, v, lengths, offset, tokens)
    return q, k, v


def _expected(q, k, v, lengths, tokens, offset, heads, hd):
    """The reference per sequence, each at its own start lengths[b] + offset."""
    rows = []
    for b, n in enumerate(lengths):
        start = n + offset
        qb = q[b * tokens:(b + 1) * tokens].view(1, tokens, heads, hd)
        kb, vb = k[b:b + 1, :, :start + tokens], v[b:b + 1, :, :start + tokens]
        rows.append(attention(qb, kb, vb, start).reshape(tokens, -1))
    return torch.cat(rows)


def _lengths(lengths):
    return torch.tensor(lengths, dtype=torch.int64)


def _run(q, k, v, lengths, *, tokens, offset, heads, kv_heads, hd, block_n, split_kv):
    out = torch.full_like(q, float("nan"))
    call = attn_call(q, k, v, out, _lengths(lengths), batch=len(lengths), tokens=tokens, offset=offset,
                     num_heads=heads, num_kv_heads=kv_heads, head_dim=hd, block_n=block_n, split_kv=split_kv,
                     label="test")
    launch = run_part(call)
    return call, launch, out


def _check(lengths, tokens, offset, heads, kv_heads, hd, block_n, split_kv, dtype=torch.float32, seed=0, tol=1e-4):
    q, k, v = _inputs(lengths, tokens, offset, heads, kv_heads, hd, dtype, seed=seed)
    _, _, out = _run(q, k, v, lengths, tokens=tokens, offset=offset, heads=heads, kv_heads=kv_heads, hd=hd,
                     block_n=block_n, split_kv=split_kv)
    assert not out.isnan().any(), "some output element was not written (or a NaN value was read)"
    torch.testing.assert_close(out, _expected(q, k, v, lengths, tokens, offset, heads, hd), rtol=tol, atol=tol)


# tokens, start, heads, kv_heads, hd, block_n, split_kv  (every sequence at `start`)
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
    _check([start, start], tokens, 0, heads, kv_heads, hd, block_n, split_kv)


# lengths, tokens, offset, heads, kv_heads, hd, block_n, split_kv
RAGGED = [
    ([37, 5, 20], 1, 0, 4, 2, 16, 16, 1),  # decode, GQA 2
    ([37, 5, 20], 1, 2, 8, 2, 16, 16, 3),  # draft step 2, GQA 4, split 3 (seq 1: splits 1, 2 see nothing)
    ([37, 5, 20], 4, 0, 4, 2, 16, 16, 1),  # verify, GQA 2
    ([37, 5, 20], 4, 0, 8, 2, 32, 16, 3),  # verify, GQA 4, hd 32, split 3
    ([37, 5, 20], 4, 3, 4, 1, 16, 16, 3),  # verify rows at a nonzero offset (the kernel takes any offset)
    ([0, 37, 3], 1, 0, 2, 2, 16, 16, 3),  # an empty sequence: its only key is the new token's
    ([0, 37, 3], 4, 0, 4, 2, 16, 32, 3),  # causal among the new tokens of the empty sequence
]


@pytest.mark.parametrize("lengths,tokens,offset,heads,kv_heads,hd,block_n,split_kv", RAGGED)
def test_ragged_matches_reference_per_sequence(lengths, tokens, offset, heads, kv_heads, hd, block_n, split_kv):
    _check(lengths, tokens, offset, heads, kv_heads, hd, block_n, split_kv, seed=4)


@pytest.mark.parametrize("split_kv", [1, 2])
def test_matches_reference_bf16_cache(split_kv):
    _check([37, 37], 4, 0, 4, 2, 32, 16, split_kv, dtype=torch.bfloat16, seed=1, tol=1e-3)


def test_ragged_bf16_cache():
    _check([37, 5, 20], 1, 1, 4, 2, 32, 16, 3, dtype=torch.bfloat16, seed=5, tol=1e-3)


@pytest.mark.parametrize("split_kv", [5, 17])
def test_partials_hold_the_real_rows_only(split_kv):
    """A draft step with two query heads per KV head: ROWS 16 for the dot products, partials of 2 rows
    (CROWS), merged over 5 splits (unrolled; some see no key of the shortest sequence) or 17 (a loop)."""
    lengths, tokens, offset, heads, kv_heads, hd = [37, 5, 20], 1, 1, 4, 2, 16
    q, k, v = _inputs(lengths, tokens, offset, heads, kv_heads, hd, torch.float32, seed=6)
    call, _, out = _run(q, k, v, lengths, tokens=tokens, offset=offset, heads=heads, kv_heads=kv_heads, hd=hd,
                        block_n=16, split_kv=split_kv)
    assert (call.constexprs["ROWS"], call.constexprs["CROWS"]) == (16, 2)
    assert tuple(call.args["part_o_ptr"].shape) == (len(lengths) * kv_heads, split_kv, 2, hd)
    torch.testing.assert_close(out, _expected(q, k, v, lengths, tokens, offset, heads, hd), rtol=1e-4, atol=1e-4)


def test_second_launch_is_identical_and_counter_resets():
    lengths, tokens, offset, heads, kv_heads, hd = [37, 37], 4, 0, 4, 2, 16
    q, k, v = _inputs(lengths, tokens, offset, heads, kv_heads, hd, torch.float32, seed=2)
    call, launch, out = _run(q, k, v, lengths, tokens=tokens, offset=offset, heads=heads, kv_heads=kv_heads, hd=hd,
                             block_n=16, split_kv=4)
    counter = call.args["counter_ptr"]
    assert counter.tolist() == [0] * (len(lengths) * kv_heads)
    first = out.clone()
    out.fill_(float("nan"))
    launch()
    assert not out.isnan().any(), "second launch left elements unwritten (counter not reset?)"
    assert torch.equal(out, first)
    assert counter.tolist() == [0] * (len(lengths) * kv_heads)


def test_lengths_are_read_at_run_time():
    """One bound launch serves new lengths written into the same tensor (as a captured graph replays)."""
    tokens, offset, heads, kv_heads, hd = 2, 1, 4, 2, 16
    first, second = [5, 30, 12], [20, 2, 31]
    s_max = max(first + second) + offset + tokens + 3
    q, k, v = _inputs(first, tokens, offset, heads, kv_heads, hd, torch.float32, seed=6, s_max=s_max)
    lengths = _lengths(first)
    out = torch.full_like(q, float("nan"))
    call = attn_call(q, k, v, out, lengths, batch=3, tokens=tokens, offset=offset, num_heads=heads,
                     num_kv_heads=kv_heads, head_dim=hd, block_n=16, split_kv=3)
    launch = run_part(call)
    torch.testing.assert_close(out, _expected(q, k, v, first, tokens, offset, heads, hd), rtol=1e-4, atol=1e-4)
    torch.manual_seed(0)
    k.copy_(torch.randn(k.shape) * 2)
    v.copy_(torch.randn(v.shape))
    _junk(k, v, second, offset, tokens)
    lengths.copy_(_lengths(second))
    out.fill_(float("nan"))
    launch()
    assert not out.isnan().any()
    torch.testing.assert_close(out, _expected(q, k, v, second, tokens, offset, heads, hd), rtol=1e-4, atol=1e-4)
    assert call.args["counter_ptr"].tolist() == [0] * (3 * kv_heads)


def test_length_past_the_cache_reads_no_key_beyond_s_max():
    """A sequence whose last tokens would sit at or past S_max reads keys 0 .. S_max - 1 only: its
    in-range tokens still match the reference, its others see every key, and nothing past the cache
    (NaN / 1e4 right behind the last sequence's last plane) is read."""
    tokens, heads, kv_heads, hd, s_max = 4, 4, 2, 16, 20
    lengths = [6, 18]  # sequence 1: positions 18, 19 in range, 20, 21 past the cache
    batch = len(lengths)
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(batch * tokens, heads * hd, generator=gen)
    n = batch * kv_heads * s_max * hd
    k_mem = torch.full((n + 4 * s_max * hd,), 1e4)  # guard region after the cache
    v_mem = torch.full((n + 4 * s_max * hd,), float("nan"))
    k, v = k_mem[:n].view(batch, kv_heads, s_max, hd), v_mem[:n].view(batch, kv_heads, s_max, hd)
    k.copy_(torch.randn(k.shape, generator=gen) * 2)
    v.copy_(torch.randn(v.shape, generator=gen))
    _junk(k, v, lengths, 0, tokens)  # only sequence 0 has room for junk
    for split_kv in (1, 3):
        _, _, out = _run(q, k, v, lengths, tokens=tokens, offset=0, heads=heads, kv_heads=kv_heads, hd=hd,
                         block_n=16, split_kv=split_kv)
        assert not out.isnan().any(), f"split {split_kv}: read past the cache or left rows unwritten"
        ref0 = _expected(q[:tokens], k[:1], v[:1], lengths[:1], tokens, 0, heads, hd)
        torch.testing.assert_close(out[:tokens], ref0, rtol=1e-4, atol=1e-4)
        # sequence 1: tokens 0, 1 (positions 18, 19) as the reference has them; tokens 2, 3 (past
        # the cache) see every key 0 .. S_max - 1
        q1 = q[tokens:].view(1, tokens, heads, hd)
        ref1 = attention(q1[:, :2], k[1:], v[1:], lengths[1]).reshape(2, -1)
        torch.testing.assert_close(out[tokens:tokens + 2], ref1, rtol=1e-4, atol=1e-4)
        full = attention(q1[:, 2:], k[1:], v[1:], s_max - 1).reshape(2, -1)  # both rows see every key
        torch.testing.assert_close(out[tokens + 2:], full, rtol=1e-4, atol=1e-4)


def test_strided_q_and_out_rows():
    lengths, tokens, offset, heads, kv_heads, hd = [5, 9], 2, 1, 4, 2, 16
    q, k, v = _inputs(lengths, tokens, offset, heads, kv_heads, hd, torch.float32, seed=3)
    rows = len(lengths) * tokens
    q_wide = torch.randn(rows, heads * hd + 24)
    q_wide[:, :heads * hd] = q
    out_wide = torch.full((rows, heads * hd + 8), float("nan"))
    out = out_wide[:, :heads * hd]
    call = attn_call(q_wide[:, :heads * hd], k, v, out, _lengths(lengths), batch=len(lengths), tokens=tokens,
                     offset=offset, num_heads=heads, num_kv_heads=kv_heads, head_dim=hd, block_n=16, split_kv=2)
    assert call.args["stride_q"] == heads * hd + 24 and call.args["stride_o"] == heads * hd + 8
    run_part(call)
    torch.testing.assert_close(out, _expected(q, k, v, lengths, tokens, offset, heads, hd), rtol=1e-4, atol=1e-4)
    assert out_wide[:, heads * hd:].isnan().all(), "wrote past the row's heads"


def test_signature_and_programs():
    q, k, v = _inputs([10, 10, 10], 4, 0, 8, 2, 16, torch.float32)
    lengths = _lengths([10, 3, 7])
    call = attn_call(q, k, v, torch.empty_like(q), lengths, batch=3, tokens=4, offset=0, num_heads=8, num_kv_heads=2,
                     head_dim=16, block_n=16, split_kv=4)
    assert call.programs == 3 * 2 * 4
    assert call.constexprs["ROWS"] == 16 and call.constexprs["GROUP"] == 4
    assert SIGNATURE.args[0] == "q_ptr" and SIGNATURE.constexprs[-1] == "DOT_DTYPE"
    assert "lengths_ptr" in SIGNATURE.args and "offset" in SIGNATURE.args and "start" not in SIGNATURE.args
    assert call.args["lengths_ptr"] is lengths and call.args["offset"] == 0
    assert any(t is call.args["counter_ptr"] for t in call.scratch)


@pytest.mark.parametrize("hd,block_n,match", [(24, 16, "head_dim"), (16, 8, "block_n")])
def test_rejects_invalid_options(hd, block_n, match):
    q, k, v = _inputs([4], 1, 0, 2, 2, hd, torch.float32)
    with pytest.raises(ValueError, match=match):
        attn_call(q, k, v, torch.empty_like(q), _lengths([4]), batch=1, tokens=1, offset=0, num_heads=2,
                  num_kv_heads=2, head_dim=hd, block_n=block_n)


@pytest.mark.parametrize("lengths", WRONG_LENGTHS, ids=WRONG_LENGTH_IDS)
def test_rejects_wrong_lengths(lengths):
    q, k, v = _inputs([4, 4], 4, 0, 2, 2, 16, torch.float32)
    with pytest.raises(ValueError, match="lengths"):
        attn_call(q, k, v, torch.empty_like(q), lengths, batch=2, tokens=4, offset=0, num_heads=2, num_kv_heads=2,
                  head_dim=16)


def test_rejects_offset_past_the_cache():
    q, k, v = _inputs([0], 1, 0, 2, 2, 16, torch.float32, s_max=8)
    with pytest.raises(ValueError, match="offset"):
        attn_call(q, k, v, torch.empty_like(q), _lengths([0]), batch=1, tokens=1, offset=8, num_heads=2,
                  num_kv_heads=2, head_dim=16)
    with pytest.raises(ValueError, match="offset"):
        attn_call(q, k, v, torch.empty_like(q), _lengths([0]), batch=1, tokens=1, offset=-1, num_heads=2,
                  num_kv_heads=2, head_dim=16)
