"""RoPE + KV-cache write tile under the Triton interpreter against reference.apply_rope / rms_norm."""
import conjugate  # noqa: F401  (chooses the interpreter before triton is imported)

import pytest
import torch

from conjugate.compiler.tile import INTERPRETING
from conjugate.compiler.rope import rope_kv_call, run_rope_kv
from conjugate.models.presets import PRESETS
from conjugate.models.reference import apply_rope, rms_norm, rope_cos_sin

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


def _caches(spec, batch, s_max, dtype, start, tokens):
    """Sentinel everywhere, NaN over the positions the kernel must write."""
    shape = (batch, spec.num_kv_heads, s_max, spec.head_dim)
    caches = [torch.full(shape, SENTINEL, dtype=dtype) for _ in range(2)]
    for c in caches:
        c[:, :, start:start + tokens] = float("nan")
    return caches


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


def _run(spec_name, batch, tokens, start, dtype, block=256, row_pad=0):
    spec = PRESETS[spec_name]
    gen = torch.Generator().manual_seed(batch * 100 + tokens * 10 + start)
    hd, nh, nkv, rows = spec.head_dim, spec.num_heads, spec.num_kv_heads, batch * tokens
    s_max = start + tokens + 3
    qkv = torch.randn(rows, spec.qkv_size + row_pad, generator=gen)[:, :spec.qkv_size]
    q_norm = k_norm = None
    if spec.qk_norm:
        q_norm = (torch.rand(hd, generator=gen) + 0.5).to(dtype)
        k_norm = (torch.rand(hd, generator=gen) + 0.5).to(dtype)
    q_out = torch.full((rows, nh * hd), float("nan"))
    k_cache, v_cache = _caches(spec, batch, s_max, dtype, start, tokens)
    cos, sin = rope_cos_sin(spec, torch.arange(s_max))
    run_rope_kv(rope_kv_call(qkv, q_out, k_cache, v_cache, cos, sin, rows=rows, tokens=tokens, start=start,
                             num_heads=nh, num_kv_heads=nkv, head_dim=hd, q_norm=q_norm, k_norm=k_norm,
                             eps=spec.rms_norm_eps, block=block))
    q_ref, k_ref, v_ref = _reference(spec, qkv, q_norm, k_norm, batch, tokens, start)
    assert not q_out.isnan().any()
    torch.testing.assert_close(q_out, q_ref.reshape(rows, nh * hd), rtol=2e-6, atol=1e-6)
    _assert_ulp(k_cache[:, :, start:start + tokens], k_ref, ulps=1)
    # v is only cast; the interpreter truncates fp32 -> bf16 where the GPU rounds to nearest even
    _assert_ulp(v_cache[:, :, start:start + tokens], v_ref, ulps=1 if INTERPRETING and dtype == torch.bfloat16 else 0)
    for c in (k_cache, v_cache):  # nothing outside start..start+T-1 moved
        outside = torch.cat([c[:, :, :start], c[:, :, start + tokens:]], dim=2)
        assert (outside == SENTINEL).all()


@pytest.mark.parametrize("spec_name", ["tiny-llama-t", "tiny-qwen3-t"])
@pytest.mark.parametrize("tokens", [1, 4])
@pytest.mark.parametrize("start", [0, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_kv(spec_name, tokens, start, dtype):
    _run(spec_name, batch=2, tokens=tokens, start=start, dtype=dtype)


@pytest.mark.parametrize("block", [16, 512])  # one head per program; a partial last program
@pytest.mark.parametrize("spec_name", ["tiny-llama-t", "tiny-qwen3-t"])
def test_rope_kv_blocks(spec_name, block):
    _run(spec_name, batch=3, tokens=1, start=2, dtype=torch.float16, block=block, row_pad=5)


def test_rope_kv_llama_scaling_matters():
    """The tiny llama preset's scaled frequencies differ from unscaled ones (so the test above sees them)."""
    spec = PRESETS["tiny-llama-t"]
    from dataclasses import replace

    scaled, _ = rope_cos_sin(spec, torch.arange(40))
    plain, _ = rope_cos_sin(replace(spec, rope_scaling=None), torch.arange(40))
    assert spec.rope_scaling is not None and not torch.allclose(scaled, plain)
