"""RoPE + KV-cache write tile under the Triton interpreter against reference.apply_rope / rms_norm.

Token t of sequence b sits at position lengths[b] + offset + t (lengths read at run time, so the
sequences of one batch may differ); the tile writes k, v there and nowhere else.
"""
import conjugate  # noqa: F401  (chooses the interpreter before triton is imported)

import pytest
import torch

from conjugate.compiler.tile import INTERPRETING
from conjugate.compiler.rope import SIGNATURE, rope_kv_call
from conjugate.models.presets import PRESETS
from conjugate.models.reference import apply_rope, rms_norm, rope_cos_sin
from kernel_parts import WRONG_LENGTH_IDS, WRONG_LENGTHS, run_part  # tests/kernel_parts.py

SENTINEL = 7.0


def _reference(spec, qkv, q_norm, k_norm, batch, tokens, start):
    """q [B, T, heads, hd] rotated; k, v [B, kv_heads, T, hd] as the cache should hold them."""
    hd, nh, nkv = spec.head_dim, spec.num_heads, spec.num_kv_heads
    q = qkv[:, :nh * hd].reshape(batch, tokens, nh, hd)
    k = qkv[:, nh * hd:(nh + nkv) * hd].reshape(batch, tokens, nkv, hd)
    v = qkv[:, (nh + nkv) * hd:].reshape(batch, tokens, nkv, hd)
    if spec.qk_norm:
        q, k = rms_norm(q, q_norm, spec.rms_norm_eps), rms_norm(k, k_norm, spec.rms_norm_eps)
    cos, sin = rope_cos_sin(spec, torch.arange(start, start + tokens))
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin).transpose(1, 2), v.transpose(1, 2)


def _written(lengths, offset, tokens, s_max):
    """Per sequence, the cache positions the tile must write (those below s_max)."""
    return [[p for p in range(n + offset, n + offset + tokens) if p < s_max] for n in lengths]


def _caches(spec, s_max, dtype, positions, guard=0):
    """Sentinel everywhere, NaN over the positions the kernel must write. With `guard`, the caches
    are the front of a longer sentinel buffer (guard elements behind them catch stray writes)."""
    batch = len(positions)
    shape = (batch, spec.num_kv_heads, s_max, spec.head_dim)
    numel = batch * spec.num_kv_heads * s_max * spec.head_dim
    mems = [torch.full((numel + guard,), SENTINEL, dtype=dtype) for _ in range(2)]
    caches = [m[:numel].view(shape) for m in mems]
    for c in caches:
        for b, pos in enumerate(positions):
            c[b, :, pos] = float("nan")
    return caches, mems


def _assert_ulp(actual, expected, ulps):
    """Equal, or at most `ulps` units in the last place apart (same-sign finite values)."""
    assert not actual.isnan().any()
    if actual.dtype == torch.float32:
        torch.testing.assert_close(actual, expected.float(), rtol=0 if ulps == 0 else 2e-6, atol=0 if ulps == 0 else 1e-6)
        return
    expected = expected.to(actual.dtype)
    int_view = {torch.bfloat16: torch.int16, torch.float16: torch.int16}[actual.dtype]
    diff = (actual.view(int_view).int() - expected.view(int_view).int()).abs()
    assert diff.max().item() <= ulps, f"max ulp difference {diff.max().item()}"


def _inputs(spec, rows, dtype, seed, row_pad=0):
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(rows, spec.qkv_size + row_pad, generator=gen)[:, :spec.qkv_size]
    q_norm = k_norm = None
    if spec.qk_norm:
        q_norm = (torch.rand(spec.head_dim, generator=gen) + 0.5).to(dtype)
        k_norm = (torch.rand(spec.head_dim, generator=gen) + 0.5).to(dtype)
    return qkv, q_norm, k_norm


def _call(spec, qkv, q_out, k_cache, v_cache, lengths, *, tokens, offset, q_norm, k_norm, block=256):
    cos, sin = rope_cos_sin(spec, torch.arange(k_cache.shape[2]))
    return rope_kv_call(qkv, q_out, k_cache, v_cache, cos, sin, lengths, rows=qkv.shape[0], tokens=tokens,
                        offset=offset, num_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads,
                        head_dim=spec.head_dim, q_norm=q_norm, k_norm=k_norm, eps=spec.rms_norm_eps, block=block)


def _verify(spec, qkv, q_norm, k_norm, q_out, k_cache, v_cache, lengths, tokens, offset, dtype):
    """Each sequence against the reference at its own start; nothing else in the caches moved.
    Tokens at positions >= S_max are not checked in q_out (the tile writes nothing for them)."""
    hd, nh = spec.head_dim, spec.num_heads
    s_max = k_cache.shape[2]
    written = _written(lengths, offset, tokens, s_max)
    for b, n in enumerate(lengths):
        start, w = n + offset, len(written[b])
        rows = slice(b * tokens, (b + 1) * tokens)
        q_ref, k_ref, v_ref = _reference(spec, qkv[rows], q_norm, k_norm, 1, tokens, start)
        q_b = q_out[rows][:w]
        assert not q_b.isnan().any()
        torch.testing.assert_close(q_b, q_ref.reshape(tokens, nh * hd)[:w], rtol=2e-6, atol=1e-6)
        if w:
            _assert_ulp(k_cache[b, :, start:start + w], k_ref[0, :, :w], ulps=1)
            # v is only cast; the interpreter truncates fp32 -> bf16 where the GPU rounds to nearest even
            _assert_ulp(v_cache[b, :, start:start + w], v_ref[0, :, :w],
                        ulps=1 if INTERPRETING and dtype == torch.bfloat16 else 0)
    for c in (k_cache, v_cache):  # nothing outside each sequence's own positions moved
        outside = torch.ones(c.shape[:3], dtype=torch.bool)
        for b, pos in enumerate(written):
            outside[b, :, pos] = False
        assert (c[outside] == SENTINEL).all(), "wrote a cache entry outside lengths[b] + offset + t"


def _run(spec_name, lengths, tokens, offset, dtype, block=256, row_pad=0, s_max=None, guard=0):
    spec = PRESETS[spec_name]
    rows = len(lengths) * tokens
    qkv, q_norm, k_norm = _inputs(spec, rows, dtype, seed=sum(lengths) * 100 + tokens * 10 + offset, row_pad=row_pad)
    s_max = s_max or max(lengths) + offset + tokens + 3
    q_out = torch.full((rows, spec.num_heads * spec.head_dim), float("nan"))
    (k_cache, v_cache), mems = _caches(spec, s_max, dtype, _written(lengths, offset, tokens, s_max), guard=guard)
    run_part(_call(spec, qkv, q_out, k_cache, v_cache, torch.tensor(lengths, dtype=torch.int64), tokens=tokens,
                   offset=offset, q_norm=q_norm, k_norm=k_norm, block=block))
    _verify(spec, qkv, q_norm, k_norm, q_out, k_cache, v_cache, lengths, tokens, offset, dtype)
    for m in mems:  # nothing behind the caches moved
        assert (m[k_cache.numel():] == SENTINEL).all(), "wrote past the end of the cache"


@pytest.mark.parametrize("spec_name", ["tiny-llama-t", "tiny-qwen3-t"])
@pytest.mark.parametrize("tokens", [1, 4])
@pytest.mark.parametrize("start", [0, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_kv(spec_name, tokens, start, dtype):
    _run(spec_name, [start, start], tokens=tokens, offset=0, dtype=dtype)


@pytest.mark.parametrize("block", [16, 512])  # one head per program; a partial last program
@pytest.mark.parametrize("spec_name", ["tiny-llama-t", "tiny-qwen3-t"])
def test_rope_kv_blocks(spec_name, block):
    _run(spec_name, [2, 2, 2], tokens=1, offset=0, dtype=torch.float16, block=block, row_pad=5)


@pytest.mark.parametrize("spec_name", ["tiny-llama-t", "tiny-qwen3-t"])
@pytest.mark.parametrize("tokens,offset", [(1, 0), (1, 2), (4, 0), (4, 1)])
def test_rope_kv_ragged(spec_name, tokens, offset):
    """Sequences at different lengths: each at its own positions, each checked on its own."""
    _run(spec_name, [37, 5, 20], tokens=tokens, offset=offset, dtype=torch.bfloat16)


@pytest.mark.parametrize("block", [16, 512])
def test_rope_kv_ragged_blocks(block):
    _run("tiny-qwen3-t", [0, 9, 3], tokens=4, offset=0, dtype=torch.float32, block=block, row_pad=3)


@pytest.mark.parametrize("lengths,offset", [
    ([3, 8], 0),  # sequence 1 (last): positions 8, 9 written, 10, 11 past the cache
    ([8, 3], 0),  # the same, first: a stray write would land in the next plane
    ([7, 40], 1),  # sequence 1 wholly past the cache
    ([1 << 20, 2], 0),  # far past
])
def test_rope_kv_length_past_the_cache_writes_nothing_out_of_bounds(lengths, offset):
    spec_name, tokens, s_max = "tiny-llama-t", 4, 10
    spec = PRESETS[spec_name]
    _run(spec_name, lengths, tokens=tokens, offset=offset, dtype=torch.float32, s_max=s_max,
         guard=4 * spec.num_kv_heads * s_max * spec.head_dim)


def test_rope_kv_lengths_are_read_at_run_time():
    """One bound launch writes at the new positions after the lengths tensor changes in place."""
    spec, tokens, offset, dtype, s_max = PRESETS["tiny-qwen3-t"], 2, 1, torch.float32, 24
    first, second = [4, 15, 0], [12, 2, 20]
    qkv, q_norm, k_norm = _inputs(spec, len(first) * tokens, dtype, seed=11)
    q_out = torch.full((qkv.shape[0], spec.num_heads * spec.head_dim), float("nan"))
    (k_cache, v_cache), _ = _caches(spec, s_max, dtype, _written(first, offset, tokens, s_max))
    lengths = torch.tensor(first, dtype=torch.int64)
    launch = run_part(_call(spec, qkv, q_out, k_cache, v_cache, lengths, tokens=tokens, offset=offset,
                            q_norm=q_norm, k_norm=k_norm))
    _verify(spec, qkv, q_norm, k_norm, q_out, k_cache, v_cache, first, tokens, offset, dtype)
    for c in (k_cache, v_cache):
        c.fill_(SENTINEL)
        for b, pos in enumerate(_written(second, offset, tokens, s_max)):
            c[b, :, pos] = float("nan")
    lengths.copy_(torch.tensor(second))
    q_out.fill_(float("nan"))
    launch()
    _verify(spec, qkv, q_norm, k_norm, q_out, k_cache, v_cache, second, tokens, offset, dtype)


def test_rope_kv_signature():
    assert "lengths_ptr" in SIGNATURE.args and "offset" in SIGNATURE.args and "start" not in SIGNATURE.args


@pytest.mark.parametrize("lengths", WRONG_LENGTHS, ids=WRONG_LENGTH_IDS)
def test_rope_kv_rejects_wrong_lengths(lengths):
    spec, tokens = PRESETS["tiny-llama-t"], 4
    qkv, _, _ = _inputs(spec, 2 * tokens, torch.float32, seed=0)
    q_out = torch.empty(qkv.shape[0], spec.num_heads * spec.head_dim)
    (k_cache, v_cache), _ = _caches(spec, 12, torch.float32, [[], []])
    with pytest.raises(ValueError, match="lengths"):
        _call(spec, qkv, q_out, k_cache, v_cache, lengths, tokens=tokens, offset=0, q_norm=None, k_norm=None)


def test_rope_kv_rejects_offset_past_the_cache_or_tables():
    spec, tokens = PRESETS["tiny-llama-t"], 1
    qkv, _, _ = _inputs(spec, 2, torch.float32, seed=0)
    q_out = torch.empty(2, spec.num_heads * spec.head_dim)
    (k_cache, v_cache), _ = _caches(spec, 8, torch.float32, [[], []])
    lengths = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(ValueError, match="past the cache"):
        _call(spec, qkv, q_out, k_cache, v_cache, lengths, tokens=tokens, offset=8, q_norm=None, k_norm=None)
    cos, sin = rope_cos_sin(spec, torch.arange(6))  # shorter than the cache: a run-time position could pass it
    with pytest.raises(ValueError, match="tables"):
        rope_kv_call(qkv, q_out, k_cache, v_cache, cos, sin, lengths, rows=2, tokens=tokens, offset=0,
                     num_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim)


def test_rope_kv_llama_scaling_matters():
    """The tiny llama preset's scaled frequencies differ from unscaled ones (so the test above sees them)."""
    spec = PRESETS["tiny-llama-t"]
    from dataclasses import replace

    scaled, _ = rope_cos_sin(spec, torch.arange(40))
    plain, _ = rope_cos_sin(replace(spec, rope_scaling=None), torch.arange(40))
    assert spec.rope_scaling is not None and not torch.allclose(scaled, plain)
