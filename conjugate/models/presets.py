"""Presets: the exact public shapes of the supported checkpoints, plus tiny test models of each family."""
from __future__ import annotations

from conjugate.models.spec import ModelSpec, RopeScaling

_LLAMA32_ROPE = RopeScaling(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)
_LLAMA31_ROPE = RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)


def _llama(name, hidden, layers, heads, kv, head_dim, ffn, tied, rope, vocab=128256) -> ModelSpec:
    return ModelSpec(name, "llama", hidden, layers, heads, kv, head_dim, ffn, vocab, 500000.0, 1e-5, tied, rope_scaling=rope)


def _qwen2(name, hidden, layers, heads, kv, ffn, vocab, tied, eps=1e-6) -> ModelSpec:
    return ModelSpec(name, "qwen2", hidden, layers, heads, kv, hidden // heads, ffn, vocab, 1000000.0, eps, tied, qkv_bias=True)


def _qwen3(name, hidden, layers, heads, kv, ffn, tied, vocab=151936) -> ModelSpec:
    return ModelSpec(name, "qwen3", hidden, layers, heads, kv, 128, ffn, vocab, 1000000.0, 1e-6, tied, qk_norm=True)


_PUBLIC = [
    _llama("llama-3.2-1b", 2048, 16, 32, 8, 64, 8192, True, _LLAMA32_ROPE),
    _llama("llama-3.2-3b", 3072, 28, 24, 8, 128, 8192, True, _LLAMA32_ROPE),
    _llama("llama-3.1-8b", 4096, 32, 32, 8, 128, 14336, False, _LLAMA31_ROPE),
    _qwen2("qwen2.5-0.5b", 896, 24, 14, 2, 4864, 151936, True),
    _qwen2("qwen2.5-1.5b", 1536, 28, 12, 2, 8960, 151936, True),
    _qwen2("qwen2.5-7b", 3584, 28, 28, 4, 18944, 152064, False),
    _qwen2("qwen2.5-14b", 5120, 48, 40, 8, 13824, 152064, False, eps=1e-5),
    _qwen3("qwen3-0.6b", 1024, 28, 16, 8, 3072, True),
    _qwen3("qwen3-8b", 4096, 36, 32, 8, 12288, False),
]

# Tiny models for the CPU and the Triton interpreter: same families and features, toy sizes.
_TINY_ROPE = RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64)
_TINY = [
    ModelSpec("tiny-llama-d", "llama", 64, 2, 4, 2, 16, 128, 256, 500000.0, 1e-5, True, rope_scaling=_TINY_ROPE),
    ModelSpec("tiny-llama-t", "llama", 128, 3, 4, 2, 32, 256, 256, 500000.0, 1e-5, False, rope_scaling=_TINY_ROPE),
    ModelSpec("tiny-qwen2-d", "qwen2", 64, 2, 4, 2, 16, 128, 256, 1000000.0, 1e-6, True, qkv_bias=True),
    ModelSpec("tiny-qwen2-t", "qwen2", 128, 3, 4, 2, 32, 256, 272, 1000000.0, 1e-6, False, qkv_bias=True),
    ModelSpec("tiny-qwen3-d", "qwen3", 64, 2, 4, 2, 32, 128, 256, 1000000.0, 1e-6, True, qk_norm=True),
    ModelSpec("tiny-qwen3-t", "qwen3", 128, 3, 4, 2, 32, 256, 256, 1000000.0, 1e-6, False, qk_norm=True),
]

PRESETS: dict[str, ModelSpec] = {spec.name: spec for spec in _PUBLIC + _TINY}


def from_name(name: str) -> ModelSpec:
    """The preset of that name; KeyError listing the known names for another."""
    if name not in PRESETS:
        raise KeyError(f"unknown model preset {name!r}; known: {', '.join(sorted(PRESETS))}")
    return PRESETS[name]
