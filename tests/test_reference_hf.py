"""The pure-PyTorch reference (conjugate.models.reference) against Hugging Face transformers.

Tiny random checkpoints of each supported family are written with `save_pretrained`, then read back
through `ModelSpec.from_hf_config` + `load_checkpoint`, and every output of the reference (logits,
greedy tokens, KV caches) is compared with what transformers computes from the same files.
"""
from __future__ import annotations

import dataclasses
import json
import math
import warnings

import pytest
import torch

from conjugate.errors import CheckpointError

transformers = pytest.importorskip("transformers")
safetensors = pytest.importorskip("safetensors")

from conjugate.models.reference import (KVCache, RoundInputs, draft_phase, forward, reference_round,  # noqa: E402
                                        rope_inv_freq)
from conjugate.models.spec import ModelSpec, RopeScaling  # noqa: E402
from conjugate.models.weights import load_checkpoint  # noqa: E402

FAMILIES = ("llama", "qwen2", "qwen3")
B, CTX, K = 2, 10, 4
ATOL = RTOL = 1e-4

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}


def _hf_config(family: str, *, layers: int = 2, tied: bool = False, theta: float | None = None):
    common = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=256, tie_word_embeddings=tied, rms_norm_eps=1e-5,
                  max_position_embeddings=128)
    if family == "llama":
        # transformers-4 style keyword arguments; transformers 5 folds them into rope_parameters.
        return transformers.LlamaConfig(**common, rope_theta=theta or 500000.0, rope_scaling=dict(LLAMA3_ROPE))
    if family == "qwen2":
        return transformers.Qwen2Config(**common, rope_theta=theta or 1000000.0)
    if family == "qwen3":
        # head_dim 32 != hidden / heads = 16
        return transformers.Qwen3Config(**common, head_dim=32, rope_theta=theta or 1000000.0)
    raise ValueError(family)


_MODEL_CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


@torch.no_grad()
def _reinit(model: torch.nn.Module, seed: int) -> None:
    """HF's std-0.02 init gives near-constant logits; use O(1) activations so argmax means something."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():  # tied parameters are listed once (as embed_tokens)
        noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
        if p.ndim == 2:
            std = 1.0 if "embed_tokens" in name else 1.0 / math.sqrt(p.shape[1])
            p.copy_(noise * std)
        elif "norm" in name:
            p.copy_(1.0 + 0.1 * noise)
        else:  # biases
            p.copy_(0.1 * noise)


def _make_model(family: str, seed: int, **kw):
    config = _hf_config(family, **kw)
    config._attn_implementation = "eager"
    model = getattr(transformers, _MODEL_CLASSES[family])(config)
    _reinit(model, seed)
    return model.eval()


def _save(model, directory, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(directory, **kw)
    return directory


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """(family, role) -> (directory, HF model). role: 'draft' (2 layers) or 'target' (3 layers, other seed)."""
    made = {}

    def get(family: str, role: str = "draft"):
        if (family, role) not in made:
            seed = {"draft": 1, "target": 2, "tied": 3}[role]
            kw = {"layers": 3} if role == "target" else {"tied": True} if role == "tied" else {}
            model = _make_model(family, seed=100 * FAMILIES.index(family) + seed, **kw)
            directory = _save(model, tmp_path_factory.mktemp(f"{family}-{role}"))
            made[family, role] = directory, model
        return made[family, role]

    return get


@torch.no_grad()
def _hf_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    return model(input_ids=tokens, use_cache=False).logits.float()


@torch.no_grad()
def _hf_greedy(model, prefix: torch.Tensor, k: int):
    """Greedy decoding, recomputing the full sequence each step: tokens [B, k], last-position logits [B, k, V]."""
    seq, toks, logits = prefix, [], []
    for _ in range(k):
        last = _hf_logits(model, seq)[:, -1]
        nxt = last.argmax(-1)
        toks.append(nxt)
        logits.append(last)
        seq = torch.cat([seq, nxt[:, None]], 1)
    return torch.stack(toks, 1), torch.stack(logits, 1)


def _hf_cache_layer(cache, i: int):
    if hasattr(cache, "layers"):
        return cache.layers[i].keys, cache.layers[i].values
    return cache.key_cache[i], cache.value_cache[i]


def _tokens(gen_seed: int, *shape: int, vocab: int = 256) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(gen_seed))


def _prefilled(w, prompt: torch.Tensor, max_len: int, dtype=torch.float32) -> KVCache:
    cache = KVCache.empty(w.spec, prompt.shape[0], max_len, dtype, "cpu")
    forward(w, prompt, cache, 0)
    return cache


# ---------------------------------------------------------------------------------------------
# Spec read-back


@pytest.mark.parametrize("family", FAMILIES)
def test_spec_from_saved_config(ckpt, family):
    directory, model = ckpt(family)
    spec = ModelSpec.from_hf_config(directory)
    assert spec.family == family
    assert (spec.hidden_size, spec.num_layers, spec.num_heads, spec.num_kv_heads) == (64, 2, 4, 2)
    assert (spec.ffn_size, spec.vocab_size, spec.tied_embeddings) == (128, 256, False)
    assert spec.head_dim == (32 if family == "qwen3" else 16)
    assert spec.qkv_bias == (family == "qwen2")
    assert spec.qk_norm == (family == "qwen3")
    assert spec.rms_norm_eps == pytest.approx(1e-5)
    assert spec.rope_theta == (500000.0 if family == "llama" else 1000000.0)
    if family == "llama":
        assert spec.rope_scaling == RopeScaling(8.0, 1.0, 4.0, 16)
    else:
        assert spec.rope_scaling is None
    # The reference's inverse frequencies equal the HF rotary embedding's (llama3 scaling included).
    torch.testing.assert_close(rope_inv_freq(spec), model.model.rotary_emb.inv_freq.float(), atol=0, rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# Full-sequence logits and the KV cache


@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_logits_and_kv_cache_match_hf(ckpt, family):
    directory, model = ckpt(family)
    w = load_checkpoint(directory, torch.float32)
    seq = _tokens(7, B, CTX + 3)
    cache = KVCache.empty(w.spec, B, CTX + 5, torch.float32, "cpu")
    logits = forward(w, seq, cache, 0)
    with torch.no_grad():
        out = model(input_ids=seq, use_cache=True)
    torch.testing.assert_close(logits, out.logits.float(), atol=ATOL, rtol=RTOL)
    hf_cache = getattr(out, "cache", None) or out.past_key_values
    t = seq.shape[1]
    for i in range(w.spec.num_layers):
        hk, hv = _hf_cache_layer(hf_cache, i)
        assert hk.shape == (B, w.spec.num_kv_heads, t, w.spec.head_dim)
        torch.testing.assert_close(cache.k[i, :, :, :t], hk.float(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(cache.v[i, :, :, :t], hv.float(), atol=1e-5, rtol=1e-5)
    # nothing written beyond the sequence
    assert not cache.k[:, :, :, t:].any() and not cache.v[:, :, :, t:].any()


def test_llama3_rope_scaling_matters(ckpt):
    """Sanity for the llama test: dropping the llama3 scaling changes the logits visibly at these positions."""
    directory, model = ckpt("llama")
    w = load_checkpoint(directory, torch.float32)
    unscaled = dataclasses.replace(w, spec=dataclasses.replace(w.spec, rope_scaling=None))
    seq = _tokens(8, B, CTX + K + 1)
    ref = forward(unscaled, seq, KVCache.empty(unscaled.spec, B, seq.shape[1], torch.float32, "cpu"), 0)
    hf = _hf_logits(model, seq)
    assert (ref - hf).abs().max() > 1e-2


def test_incremental_decode_equals_full_forward(ckpt):
    """Cached decoding one token at a time gives the same logits as one pass over the whole sequence."""
    directory, _ = ckpt("qwen3")
    w = load_checkpoint(directory, torch.float32)
    seq = _tokens(9, B, CTX + K)
    full = forward(w, seq, KVCache.empty(w.spec, B, seq.shape[1], torch.float32, "cpu"), 0)
    cache = _prefilled(w, seq[:, :CTX], seq.shape[1])
    steps = [forward(w, seq[:, t:t + 1], cache, t)[:, 0] for t in range(CTX, seq.shape[1])]
    torch.testing.assert_close(torch.stack(steps, 1), full[:, CTX:], atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# Draft phase (greedy decode) and verify phase (reference_round)


@pytest.mark.parametrize("family", FAMILIES)
def test_draft_phase_matches_hf_greedy(ckpt, family):
    directory, model = ckpt(family)
    w = load_checkpoint(directory, torch.float32)
    prompt = _tokens(11, B, CTX)  # positions 0..CTX-1
    last = _tokens(12, B)  # the last accepted token, at position CTX
    cache = _prefilled(w, prompt, CTX + K + 1)
    tokens, logits = draft_phase(w, last, cache, CTX, K)
    assert tokens.shape == (B, K) and logits.shape == (B, K, 256)

    hf_tokens, hf_logits = _hf_greedy(model, torch.cat([prompt, last[:, None]], 1), K)
    assert torch.equal(tokens, hf_tokens)
    torch.testing.assert_close(logits, hf_logits, atol=ATOL, rtol=RTOL)
    assert torch.equal(logits.argmax(-1), tokens)
    # the greedy tokens are not degenerate (the re-initialisation made argmax meaningful)
    assert len(set(tokens.flatten().tolist())) > 1

    # the cache now holds positions 0..CTX+K-1 (the last token and the first K-1 drafts), like HF's
    full = torch.cat([prompt, last[:, None], tokens[:, :-1]], 1)
    with torch.no_grad():
        out = model(input_ids=full, use_cache=True)
    hf_cache = getattr(out, "cache", None) or out.past_key_values
    for i in range(w.spec.num_layers):
        hk, hv = _hf_cache_layer(hf_cache, i)
        torch.testing.assert_close(cache.k[i, :, :, :CTX + K], hk.float(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(cache.v[i, :, :, :CTX + K], hv.float(), atol=1e-5, rtol=1e-5)
    assert not cache.k[:, :, :, CTX + K:].any()


@pytest.mark.parametrize("family", FAMILIES)
def test_reference_round_matches_hf(ckpt, family):
    d_dir, d_model = ckpt(family, "draft")
    t_dir, t_model = ckpt(family, "target")
    draft, target = load_checkpoint(d_dir, torch.float32), load_checkpoint(t_dir, torch.float32)
    assert target.spec.num_layers == 3 and draft.spec.num_layers == 2
    d_prompt, t_prompt = _tokens(21, B, CTX), _tokens(22, B + 1, CTX)
    last = _tokens(23, B)
    verify = _tokens(24, B + 1, K + 1)
    inputs = RoundInputs(last, verify, _prefilled(draft, d_prompt, CTX + K + 1),
                         _prefilled(target, t_prompt, CTX + K + 1), torch.full((B,), CTX), torch.full((B + 1,), CTX))
    out = reference_round(draft, target, inputs)

    assert out.target_logits.shape == (B + 1, K + 1, 256)
    hf_target = _hf_logits(t_model, torch.cat([t_prompt, verify], 1))[:, -(K + 1):]
    torch.testing.assert_close(out.target_logits, hf_target, atol=ATOL, rtol=RTOL)
    assert torch.equal(out.target_tokens, hf_target.argmax(-1))
    assert torch.equal(out.target_tokens, out.target_logits.argmax(-1))

    hf_tokens, hf_logits = _hf_greedy(d_model, torch.cat([d_prompt, last[:, None]], 1), K)
    assert torch.equal(out.draft_tokens, hf_tokens)
    torch.testing.assert_close(out.draft_logits, hf_logits, atol=ATOL, rtol=RTOL)

    # the two checkpoints really are different models
    assert not torch.allclose(_hf_logits(d_model, verify), _hf_logits(t_model, verify), atol=1e-2)


# ---------------------------------------------------------------------------------------------
# Checkpoint variants: sharded, low precision, tied embeddings


@pytest.mark.parametrize("family", FAMILIES)
def test_sharded_checkpoint_equals_single_file(ckpt, family, tmp_path):
    directory, model = ckpt(family)
    sharded = _save(model, tmp_path / "sharded", max_shard_size="20KB")
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert not (sharded / "model.safetensors").exists()

    single_w, sharded_w = load_checkpoint(directory, torch.float32), load_checkpoint(sharded, torch.float32)
    assert torch.equal(single_w.embed, sharded_w.embed) and torch.equal(single_w.lm_head, sharded_w.lm_head)
    seq = _tokens(31, B, CTX)
    a = forward(single_w, seq, KVCache.empty(single_w.spec, B, CTX, torch.float32, "cpu"), 0)
    b = forward(sharded_w, seq, KVCache.empty(sharded_w.spec, B, CTX, torch.float32, "cpu"), 0)
    assert torch.equal(a, b)
    torch.testing.assert_close(b, _hf_logits(model, seq), atol=ATOL, rtol=RTOL)


def _all_tensors(w):
    yield from (w.embed, w.lm_head, w.final_norm)
    for layer in w.layers:
        yield from (t for t in vars(layer).values() if t is not None)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("family", FAMILIES)
def test_low_precision_loading(ckpt, family, dtype):
    directory, _ = ckpt(family)
    w32, w16 = load_checkpoint(directory, torch.float32), load_checkpoint(directory, dtype)
    tensors = list(_all_tensors(w16))
    assert w16.dtype == dtype and all(t.dtype == dtype for t in tensors)
    assert len(tensors) == len(list(_all_tensors(w32)))
    seq = _tokens(41, B, CTX + K)
    ref32 = forward(w32, seq, KVCache.empty(w32.spec, B, seq.shape[1], torch.float32, "cpu"), 0)
    cache16 = KVCache.empty(w16.spec, B, seq.shape[1], dtype, "cpu")
    ref16 = forward(w16, seq, cache16, 0)
    assert ref16.dtype == torch.float32 and cache16.k.dtype == dtype  # fp32 arithmetic, low-precision cache
    assert torch.isfinite(ref16).all()
    rel = (ref16 - ref32).norm() / ref32.norm()
    assert 0 < rel < 2e-2


@pytest.mark.parametrize("family", FAMILIES)
def test_tied_embeddings_match_hf(ckpt, family):
    directory, model = ckpt(family, "tied")
    from safetensors import safe_open

    with safe_open(str(directory / "model.safetensors"), framework="pt") as f:
        assert "lm_head.weight" not in set(f.keys())
    w = load_checkpoint(directory, torch.float32)
    assert w.spec.tied_embeddings and w.lm_head is w.embed
    seq = _tokens(51, B, CTX)
    logits = forward(w, seq, KVCache.empty(w.spec, B, CTX, torch.float32, "cpu"), 0)
    torch.testing.assert_close(logits, _hf_logits(model, seq), atol=ATOL, rtol=RTOL)
    last = _tokens(52, B)
    cache = _prefilled(w, seq, CTX + K + 1)
    tokens, _ = draft_phase(w, last, cache, CTX, K)
    hf_tokens, _ = _hf_greedy(model, torch.cat([seq, last[:, None]], 1), K)
    assert torch.equal(tokens, hf_tokens)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_attention_bias_checkpoint_is_refused(family, tmp_path):
    """Llama/Qwen3 checkpoints with attention_bias=true carry q/k/v *and* o_proj biases: unsupported, refused."""
    config = _hf_config(family)
    config.attention_bias = True
    config._attn_implementation = "eager"
    model = getattr(transformers, _MODEL_CLASSES[family])(config)
    _reinit(model, seed=61)
    model.eval()
    directory = _save(model, tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match="attention_bias"):
        load_checkpoint(directory, torch.float32)
