"""ModelSpec (presets, HF config parsing), checkpoint loading errors, random weights and round inputs."""
from __future__ import annotations

import dataclasses
import json
import math
import os

import pytest
import torch

from conjugate.errors import CheckpointError, ConjugateError
from conjugate.models import reference
from conjugate.models.presets import PRESETS, from_name
from conjugate.models.reference import KVCache, forward, make_round_inputs, reference_round
from conjugate.models.spec import ModelSpec, RopeScaling
from conjugate.models.weights import load_checkpoint, random_weights

PUBLIC = [n for n in PRESETS if not n.startswith("tiny-")]

# ---------------------------------------------------------------------------------------------
# Presets


def test_public_presets_present():
    assert set(PUBLIC) == {"llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "qwen2.5-0.5b", "qwen2.5-1.5b",
                           "qwen2.5-7b", "qwen2.5-14b", "qwen3-0.6b", "qwen3-8b"}
    for name, spec in PRESETS.items():
        assert spec.name == name
        assert spec.num_heads % spec.num_kv_heads == 0


def test_llama_3_1_8b_numbers():
    s = from_name("llama-3.1-8b")
    assert (s.family, s.hidden_size, s.num_layers, s.num_heads, s.num_kv_heads) == ("llama", 4096, 32, 32, 8)
    assert (s.head_dim, s.ffn_size, s.vocab_size) == (128, 14336, 128256)
    assert s.rope_theta == 500000.0 and s.rms_norm_eps == 1e-5 and not s.tied_embeddings
    assert s.rope_scaling == RopeScaling(8.0, 1.0, 4.0, 8192)
    assert not s.qkv_bias and not s.qk_norm
    assert (s.q_size, s.kv_size, s.qkv_size) == (4096, 1024, 6144)


def test_llama_3_2_numbers():
    one, three = from_name("llama-3.2-1b"), from_name("llama-3.2-3b")
    assert (one.hidden_size, one.num_layers, one.num_heads, one.num_kv_heads, one.head_dim, one.ffn_size) == \
        (2048, 16, 32, 8, 64, 8192)
    assert (three.hidden_size, three.num_layers, three.num_heads, three.num_kv_heads, three.head_dim) == \
        (3072, 28, 24, 8, 128)
    for s in (one, three):
        assert s.tied_embeddings and s.vocab_size == 128256
        assert s.rope_scaling == RopeScaling(32.0, 1.0, 4.0, 8192)


def test_qwen2_5_7b_numbers():
    s = from_name("qwen2.5-7b")
    assert (s.family, s.hidden_size, s.num_layers, s.num_heads, s.num_kv_heads) == ("qwen2", 3584, 28, 28, 4)
    assert (s.head_dim, s.ffn_size, s.vocab_size) == (128, 18944, 152064)
    assert s.qkv_bias and not s.qk_norm and not s.tied_embeddings and s.rope_scaling is None
    assert s.rope_theta == 1e6 and s.rms_norm_eps == 1e-6
    small = from_name("qwen2.5-0.5b")
    assert (small.hidden_size, small.num_layers, small.num_heads, small.num_kv_heads, small.head_dim) == \
        (896, 24, 14, 2, 64)
    assert small.tied_embeddings and small.vocab_size == 151936 and small.ffn_size == 4864
    assert from_name("qwen2.5-14b").rms_norm_eps == 1e-5


def test_qwen3_8b_numbers():
    s = from_name("qwen3-8b")
    assert (s.family, s.hidden_size, s.num_layers, s.num_heads, s.num_kv_heads) == ("qwen3", 4096, 36, 32, 8)
    assert (s.head_dim, s.ffn_size, s.vocab_size) == (128, 12288, 151936)
    assert s.qk_norm and not s.qkv_bias and not s.tied_embeddings
    small = from_name("qwen3-0.6b")
    assert small.hidden_size == 1024 and small.head_dim == 128 and small.num_heads * small.head_dim == 2048
    assert small.tied_embeddings


@pytest.mark.parametrize("name,public", [("llama-3.2-1b", 1.24e9), ("llama-3.1-8b", 8.03e9), ("qwen2.5-7b", 7.62e9),
                                         ("qwen3-8b", 8.19e9), ("qwen2.5-0.5b", 0.494e9)])
def test_num_params_matches_public_counts(name, public):
    assert from_name(name).num_params() == pytest.approx(public, rel=0.03)


def test_num_params_counts_random_weights():
    """num_params() equals the element count of the tensors random_weights builds (tied counted once)."""
    for name in ("tiny-llama-d", "tiny-llama-t", "tiny-qwen2-t", "tiny-qwen3-d"):
        spec = PRESETS[name]
        w = random_weights(spec, seed=0)
        unique = {id(t): t for t in _all_tensors(w)}
        assert sum(t.numel() for t in unique.values()) == spec.num_params(), name


def test_from_name_unknown_lists_known_names():
    with pytest.raises(KeyError) as info:
        from_name("llama-9000")
    message = str(info.value)
    assert "llama-9000" in message
    for name in ("llama-3.1-8b", "qwen2.5-7b", "qwen3-8b"):
        assert name in message


def test_from_name_returns_preset():
    assert from_name("qwen3-8b") is PRESETS["qwen3-8b"]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_dict_round_trip(name):
    spec = PRESETS[name]
    data = spec.to_dict()
    assert data["name"] == name and data["family"] == spec.family
    assert ModelSpec.from_dict(data) == spec
    through_json = ModelSpec.from_dict(json.loads(json.dumps(data)))
    assert through_json == spec and through_json.rope_scaling == spec.rope_scaling
    assert data == spec.to_dict()  # from_dict did not mutate its argument


def test_spec_validation():
    base = PRESETS["tiny-llama-d"]
    with pytest.raises(ValueError, match="family"):
        dataclasses.replace(base, family="mistral")
    with pytest.raises(ValueError, match="num_kv_heads"):
        dataclasses.replace(base, num_heads=4, num_kv_heads=3)
    assert base.with_name("x") == dataclasses.replace(base, name="x") and base.with_name("x") != base


# ---------------------------------------------------------------------------------------------
# from_hf_config


LLAMA31_8B_TF4 = {  # the public meta-llama/Llama-3.1-8B config.json (transformers 4)
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 128000,
    "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0", "use_cache": True, "vocab_size": 128256,
}

QWEN25_7B_TF4 = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151643,
    "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02, "intermediate_size": 18944,
    "max_position_embeddings": 131072, "max_window_layers": 28, "model_type": "qwen2", "num_attention_heads": 28,
    "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 152064,
}

QWEN3_8B_TF4 = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 12288, "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}


def _write_config(directory, config) -> os.PathLike:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _tf5(config: dict) -> dict:
    """The transformers-5 form: rope_theta and rope_scaling folded into rope_parameters."""
    config = dict(config)
    params = dict(config.pop("rope_scaling", None) or {"rope_type": "default"})
    params["rope_theta"] = config.pop("rope_theta")
    config["rope_parameters"] = params
    return config


@pytest.mark.parametrize("style", ["tf4", "tf5"])
@pytest.mark.parametrize("preset,config", [("llama-3.1-8b", LLAMA31_8B_TF4), ("qwen2.5-7b", QWEN25_7B_TF4),
                                           ("qwen3-8b", QWEN3_8B_TF4)])
def test_from_hf_config_equals_preset(tmp_path, preset, config, style):
    config = _tf5(config) if style == "tf5" else config
    directory = _write_config(tmp_path / "ckpt", config)
    spec = ModelSpec.from_hf_config(directory)
    assert spec.name == "ckpt"  # no _name_or_path: the directory's name
    assert spec != PRESETS[preset]
    assert spec.with_name(preset) == PRESETS[preset]
    # the file itself works as well as its directory
    assert ModelSpec.from_hf_config(directory / "config.json") == spec


def test_from_hf_config_llama_3_2_1b_tied(tmp_path):
    config = dict(LLAMA31_8B_TF4, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, head_dim=64,
                  tie_word_embeddings=True, _name_or_path="meta-llama/Llama-3.2-1B",
                  rope_scaling=dict(LLAMA31_8B_TF4["rope_scaling"], factor=32.0))
    spec = ModelSpec.from_hf_config(_write_config(tmp_path, config))
    assert spec.name == "meta-llama/Llama-3.2-1B"
    assert spec.with_name("llama-3.2-1b") == PRESETS["llama-3.2-1b"]


def test_from_hf_config_defaults(tmp_path):
    config = {k: v for k, v in LLAMA31_8B_TF4.items()
              if k not in ("num_key_value_heads", "rope_theta", "rope_scaling", "tie_word_embeddings")}
    spec = ModelSpec.from_hf_config(_write_config(tmp_path, config))
    assert spec.num_kv_heads == 32 and spec.rope_theta == 10000.0 and spec.rope_scaling is None
    assert not spec.tied_embeddings and spec.head_dim == 128


def _bad(tmp_path, config_text: str):
    file = tmp_path / "config.json"
    file.write_text(config_text)
    with pytest.raises(CheckpointError) as info:
        ModelSpec.from_hf_config(tmp_path)
    message = str(info.value)
    assert str(file) in message
    assert "\n" not in message
    return message


def test_missing_config(tmp_path):
    with pytest.raises(CheckpointError) as info:
        ModelSpec.from_hf_config(tmp_path)
    assert str(tmp_path / "config.json") in str(info.value)
    assert isinstance(info.value, ConjugateError)


def test_malformed_json(tmp_path):
    assert "malformed JSON" in _bad(tmp_path, '{"hidden_size": 4096,')


def test_json_not_an_object(tmp_path):
    assert "object" in _bad(tmp_path, "[1, 2]")


@pytest.mark.parametrize("field", ["hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size",
                                   "vocab_size", "rms_norm_eps"])
def test_missing_field(tmp_path, field):
    config = {k: v for k, v in LLAMA31_8B_TF4.items() if k != field}
    message = _bad(tmp_path, json.dumps(config))
    assert repr(field) in message and "missing" in message


@pytest.mark.parametrize("field,value", [("hidden_size", "4096"), ("hidden_size", 4096.0), ("hidden_size", True),
                                         ("num_hidden_layers", None), ("vocab_size", [128256]),
                                         ("rms_norm_eps", "1e-5")])
def test_wrong_type(tmp_path, field, value):
    message = _bad(tmp_path, json.dumps(dict(LLAMA31_8B_TF4, **{field: value})))
    assert repr(field) in message and repr(value) in message


@pytest.mark.parametrize("model_type", ["mistral", None])
def test_unsupported_model_type(tmp_path, model_type):
    config = dict(LLAMA31_8B_TF4, model_type=model_type)
    message = _bad(tmp_path, json.dumps(config))
    assert "model_type" in message and repr(model_type) in message and "llama" in message


@pytest.mark.parametrize("style", ["tf4", "tf5"])
def test_unsupported_rope_type(tmp_path, style):
    config = dict(LLAMA31_8B_TF4, rope_scaling={"rope_type": "yarn", "factor": 4.0})
    config = _tf5(config) if style == "tf5" else config
    message = _bad(tmp_path, json.dumps(config))
    assert "rope_type" in message and "'yarn'" in message


def test_rope_scaling_missing_key(tmp_path):
    scaling = {k: v for k, v in LLAMA31_8B_TF4["rope_scaling"].items() if k != "low_freq_factor"}
    message = _bad(tmp_path, json.dumps(dict(LLAMA31_8B_TF4, rope_scaling=scaling)))
    assert "rope_scaling" in message and "low_freq_factor" in message


def test_heads_not_multiple_of_kv_heads(tmp_path):
    message = _bad(tmp_path, json.dumps(dict(LLAMA31_8B_TF4, num_key_value_heads=5)))
    assert "num_kv_heads" in message or "num_key_value_heads" in message


@pytest.mark.parametrize("field,value", [
    ("num_key_value_heads", "8"), ("head_dim", "128"), ("rope_theta", "fast"),
    ("num_attention_heads", 0), ("rope_scaling", "llama3"), ("attention_bias", True), ("mlp_bias", True),
])
def test_bad_field_gives_checkpoint_error(tmp_path, field, value):
    message = _bad(tmp_path, json.dumps(dict(LLAMA31_8B_TF4, **{field: value})))
    assert field in message


# ---------------------------------------------------------------------------------------------
# load_checkpoint


def _hf_config_for(spec: ModelSpec) -> dict:
    config = {"model_type": spec.family, "hidden_size": spec.hidden_size, "num_hidden_layers": spec.num_layers,
              "num_attention_heads": spec.num_heads, "num_key_value_heads": spec.num_kv_heads,
              "head_dim": spec.head_dim, "intermediate_size": spec.ffn_size, "vocab_size": spec.vocab_size,
              "rms_norm_eps": spec.rms_norm_eps, "tie_word_embeddings": spec.tied_embeddings,
              "rope_parameters": {"rope_type": "default", "rope_theta": spec.rope_theta}}
    if spec.rope_scaling:
        config["rope_parameters"].update(rope_type="llama3", **dataclasses.asdict(spec.rope_scaling))
    return config


def _hf_tensors(w) -> dict[str, torch.Tensor]:
    """HF tensor names, written out independently of weights.py."""
    out = {"model.embed_tokens.weight": w.embed, "model.norm.weight": w.final_norm}
    if not w.spec.tied_embeddings:
        out["lm_head.weight"] = w.lm_head
    fields = {"attn_norm": "input_layernorm.weight", "mlp_norm": "post_attention_layernorm.weight",
              "wq": "self_attn.q_proj.weight", "wk": "self_attn.k_proj.weight", "wv": "self_attn.v_proj.weight",
              "wo": "self_attn.o_proj.weight", "bq": "self_attn.q_proj.bias", "bk": "self_attn.k_proj.bias",
              "bv": "self_attn.v_proj.bias", "q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight",
              "w_gate": "mlp.gate_proj.weight", "w_up": "mlp.up_proj.weight", "w_down": "mlp.down_proj.weight"}
    for i, layer in enumerate(w.layers):
        for field, hf in fields.items():
            t = getattr(layer, field)
            if t is not None:
                out[f"model.layers.{i}.{hf}"] = t
    return {k: v.contiguous() for k, v in out.items()}


def _write_checkpoint(directory, spec_name="tiny-qwen2-t", seed=3, tensors=None):
    from safetensors.torch import save_file

    spec = PRESETS[spec_name]
    w = random_weights(spec, seed)
    _write_config(directory, _hf_config_for(spec))
    tensors = _hf_tensors(w) if tensors is None else tensors
    save_file(tensors, str(directory / "model.safetensors"))
    return w, _hf_tensors(w)


def _all_tensors(w):
    yield from (w.embed, w.lm_head, w.final_norm)
    for layer in w.layers:
        yield from (t for t in vars(layer).values() if t is not None)


@pytest.mark.parametrize("name", ["tiny-llama-t", "tiny-qwen2-t", "tiny-qwen3-d"])
def test_load_round_trip(tmp_path, name):
    w, _ = _write_checkpoint(tmp_path, name)
    loaded = load_checkpoint(tmp_path, torch.float32)
    assert loaded.spec.with_name(name) == w.spec
    for a, b in zip(_all_tensors(loaded), _all_tensors(w), strict=True):
        assert torch.equal(a, b)
    assert (loaded.lm_head is loaded.embed) == w.spec.tied_embeddings
    bf16 = load_checkpoint(tmp_path)  # default dtype
    assert bf16.dtype == torch.bfloat16 and all(t.dtype == torch.bfloat16 for t in _all_tensors(bf16))
    # an explicit spec overrides config.json
    assert load_checkpoint(tmp_path, torch.float32, spec=w.spec).spec is w.spec


def test_missing_safetensors(tmp_path):
    _write_config(tmp_path, _hf_config_for(PRESETS["tiny-qwen2-t"]))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(tmp_path, torch.float32)
    assert str(tmp_path) in str(info.value) and "model.safetensors" in str(info.value)


@pytest.mark.parametrize("missing", ["lm_head.weight", "model.layers.2.self_attn.k_proj.bias", "model.norm.weight"])
def test_missing_tensor(tmp_path, missing):
    _, tensors = _write_checkpoint(tmp_path)
    del tensors[missing]
    _write_checkpoint(tmp_path, tensors=tensors)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(tmp_path, torch.float32)
    assert repr(missing) in str(info.value) and str(tmp_path) in str(info.value)


def test_shape_mismatch(tmp_path):
    _, tensors = _write_checkpoint(tmp_path)
    name = "model.layers.1.mlp.up_proj.weight"
    tensors[name] = tensors[name][:-1].contiguous()
    _write_checkpoint(tmp_path, tensors=tensors)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(tmp_path, torch.float32)
    message = str(info.value)
    assert repr(name) in message and str(tmp_path / "model.safetensors") in message
    assert "(255, 128)" in message and "(256, 128)" in message


@pytest.mark.parametrize("dtype", [torch.int8, torch.bool])
def test_a_weight_stored_in_a_non_float_dtype_is_refused_from_the_header(tmp_path, dtype):
    """Converted silently, an int8 or bool weight computed a round that looked right."""
    from conjugate.models.weights import check_checkpoint

    w, tensors = _write_checkpoint(tmp_path)
    name = "model.layers.0.self_attn.o_proj.weight"
    tensors[name] = tensors[name].to(dtype)
    _write_checkpoint(tmp_path, tensors=tensors)
    for read in (lambda: check_checkpoint(tmp_path, w.spec), lambda: load_checkpoint(tmp_path, torch.float32)):
        with pytest.raises(CheckpointError) as info:
            read()
        assert repr(name) in str(info.value) and "dtype" in str(info.value) and "BF16" in str(info.value)


def test_a_weight_holding_nan_is_refused_when_loaded(tmp_path):
    _, tensors = _write_checkpoint(tmp_path)
    name = "model.layers.1.mlp.down_proj.weight"
    tensors[name][3, 5] = float("nan")
    _write_checkpoint(tmp_path, tensors=tensors)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(tmp_path, torch.float32)
    assert repr(name) in str(info.value) and "not finite" in str(info.value)


def test_a_workload_whose_checkpoint_lacks_a_tensor_is_refused_when_read(tmp_path):
    """Every tensor is checked from the headers when the workload is read, before any evaluation."""
    from conjugate.errors import WorkloadError
    from conjugate.workload import load_workload

    checkpoint = tmp_path / "ck"
    checkpoint.mkdir()
    _, tensors = _write_checkpoint(checkpoint)
    del tensors["model.layers.2.self_attn.k_proj.bias"]
    _write_checkpoint(checkpoint, tensors=tensors)
    (tmp_path / "w.toml").write_text('draft = "tiny-qwen2-d"\ntarget = "ck"\nk = 2\ndraft_batch = 1\n'
                                     'target_batch = 1\ncontext = 4\ndtype = "fp32"\n')
    with pytest.raises(WorkloadError) as info:
        load_workload(tmp_path / "w.toml")
    assert "field 'target'" in str(info.value) and "'model.layers.2.self_attn.k_proj.bias'" in str(info.value)


def _shard(tmp_path, tensors):
    """Writes tensors as two shards plus an index; returns the shard paths."""
    from safetensors.torch import save_file

    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for file, part in shards.items():
        save_file({n: tensors[n] for n in part}, str(tmp_path / file))
    weight_map = {n: file for file, part in shards.items() for n in part}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (tmp_path / "model.safetensors").unlink()
    return [tmp_path / f for f in shards]


def test_sharded_loads_like_single(tmp_path):
    w, tensors = _write_checkpoint(tmp_path)
    _shard(tmp_path, tensors)
    loaded = load_checkpoint(tmp_path, torch.float32)
    for a, b in zip(_all_tensors(loaded), _all_tensors(w), strict=True):
        assert torch.equal(a, b)


def test_sharded_index_missing_shard(tmp_path):
    _, tensors = _write_checkpoint(tmp_path)
    first, second = _shard(tmp_path, tensors)
    second.unlink()
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(tmp_path, torch.float32)
    assert str(second) in str(info.value)


def test_malformed_index(tmp_path):
    _, tensors = _write_checkpoint(tmp_path)
    _shard(tmp_path, tensors)
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}}))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(tmp_path, torch.float32)
    assert str(index) in str(info.value) and "weight_map" in str(info.value)


@pytest.mark.parametrize("sharded", [False, True])
def test_corrupt_safetensors(tmp_path, sharded):
    _, tensors = _write_checkpoint(tmp_path)
    target = _shard(tmp_path, tensors)[0] if sharded else tmp_path / "model.safetensors"
    target.write_bytes(torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(0),
                                     dtype=torch.uint8).numpy().tobytes())
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(tmp_path, torch.float32)
    assert str(target) in str(info.value)


@pytest.mark.parametrize("sharded", [False, True])
def test_a_safetensors_file_that_is_a_pipe_is_refused_without_waiting_for_a_writer(tmp_path, sharded):
    _, tensors = _write_checkpoint(tmp_path)
    target = _shard(tmp_path, tensors)[0] if sharded else tmp_path / "model.safetensors"
    target.unlink()
    os.mkfifo(target)
    with pytest.raises(CheckpointError, match="not a regular file") as info:
        load_checkpoint(tmp_path, torch.float32)
    assert str(target) in str(info.value)


# ---------------------------------------------------------------------------------------------
# random_weights


def test_random_weights_deterministic():
    spec = PRESETS["tiny-qwen3-t"]
    a, b, c = random_weights(spec, 7), random_weights(spec, 7), random_weights(spec, 8)
    pairs = list(zip(_all_tensors(a), _all_tensors(b), _all_tensors(c), strict=True))
    assert all(torch.equal(x, y) for x, y, _ in pairs)
    assert all(not torch.equal(x, z) for x, _, z in pairs)
    # different tensors of one model are not copies of each other
    assert not torch.equal(a.layers[0].wq, a.layers[1].wq)
    lo = random_weights(spec, 7, torch.bfloat16)
    assert lo.dtype == torch.bfloat16 and torch.equal(lo.layers[0].wq, a.layers[0].wq.to(torch.bfloat16))


def test_random_weights_shapes_and_tied():
    tied, untied = random_weights(PRESETS["tiny-llama-d"], 0), random_weights(PRESETS["tiny-qwen2-t"], 0)
    assert tied.lm_head is tied.embed
    assert untied.lm_head is not untied.embed and not torch.equal(untied.lm_head, untied.embed)
    s = untied.spec
    layer = untied.layers[0]
    assert len(untied.layers) == s.num_layers
    assert layer.wq.shape == (s.q_size, s.hidden_size) and layer.wk.shape == (s.kv_size, s.hidden_size)
    assert layer.wo.shape == (s.hidden_size, s.q_size) and layer.w_down.shape == (s.hidden_size, s.ffn_size)
    assert layer.bq.shape == (s.q_size,) and layer.q_norm is None
    q3 = random_weights(PRESETS["tiny-qwen3-d"], 0).layers[0]
    assert q3.q_norm.shape == (32,) and q3.bq is None


def test_random_weights_deep_model_stays_finite(monkeypatch):
    spec = dataclasses.replace(PRESETS["qwen2.5-14b"], hidden_size=128, num_heads=4, num_kv_heads=2, head_dim=32,
                               ffn_size=256, vocab_size=512)
    assert spec.num_layers == 48
    w = random_weights(spec, seed=1, dtype=torch.bfloat16)
    rms_in: list[float] = []
    original = reference.rms_norm

    def spy(x, weight, eps):
        if weight.shape[-1] == spec.hidden_size:  # residual-stream norms, not q/k norms
            rms_in.append(x.float().pow(2).mean().sqrt().item())
        return original(x, weight, eps)

    monkeypatch.setattr(reference, "rms_norm", spy)
    tokens = torch.randint(0, spec.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    cache = KVCache.empty(spec, 2, 16, torch.bfloat16, "cpu")
    logits = forward(w, tokens, cache, 0)
    assert len(rms_in) == 2 * spec.num_layers + 1
    final_rms = rms_in[-1]
    assert all(math.isfinite(r) for r in rms_in)
    assert 0.1 < final_rms < 100 and max(rms_in) < 100
    assert torch.isfinite(logits).all() and torch.isfinite(cache.k.float()).all()
    assert 0.1 < logits.std().item() < 100
    assert logits.argmax(-1).unique().numel() > 1


# ---------------------------------------------------------------------------------------------
# make_round_inputs and reference_round


@pytest.fixture(scope="module")
def pair():
    return random_weights(PRESETS["tiny-qwen2-d"], 0), random_weights(PRESETS["tiny-qwen2-t"], 1)


@pytest.mark.parametrize("kv_init", ["random", "prefill"])
def test_make_round_inputs_shapes(pair, kv_init):
    draft, target = pair
    inputs = make_round_inputs(draft, target, k=3, draft_batch=2, target_batch=5, context=6, seed=0, kv_init=kv_init)
    assert inputs.k == 3
    assert inputs.draft_lengths.tolist() == [6, 6] and inputs.target_lengths.tolist() == [6] * 5
    assert inputs.draft_last_tokens.shape == (2,) and inputs.verify_tokens.shape == (5, 4)
    ds, ts = draft.spec, target.spec
    assert inputs.draft_cache.k.shape == (ds.num_layers, 2, ds.num_kv_heads, 10, ds.head_dim)
    assert inputs.target_cache.v.shape == (ts.num_layers, 5, ts.num_kv_heads, 10, ts.head_dim)
    for tok in (inputs.draft_last_tokens, inputs.verify_tokens):
        assert tok.dtype == torch.int64 and 0 <= tok.min() and tok.max() < ds.vocab_size
    for cache in (inputs.draft_cache, inputs.target_cache):
        for buf in (cache.k, cache.v):
            assert buf.dtype == draft.dtype
            assert torch.isfinite(buf).all()
            assert (buf[:, :, :, :6].abs().sum(-1) > 0).all()  # every filled slot holds data
            assert not buf[:, :, :, 6:].any()


def test_make_round_inputs_random_is_unit_normal(pair):
    inputs = make_round_inputs(*pair, k=2, draft_batch=2, target_batch=2, context=8, seed=0)
    filled = inputs.target_cache.k[:, :, :, :8]
    assert abs(filled.mean().item()) < 0.1 and abs(filled.std().item() - 1) < 0.1


def test_make_round_inputs_prefill_is_a_real_prefill(pair):
    """The prefilled target cache, extended by reference_round, matches a fresh forward of the same prompt."""
    draft, target = pair
    inputs = make_round_inputs(draft, target, k=2, draft_batch=1, target_batch=2, context=5, seed=3, kv_init="prefill")
    # the V of layer 0 is linear in the normed embeddings: recover each prompt token from it
    v0 = inputs.target_cache.v[0]  # [B, kv, S, hd]
    s = target.spec
    normed = reference.rms_norm(target.embed.float(), target.layers[0].attn_norm, s.rms_norm_eps)
    all_v = (normed @ target.layers[0].wv.float().t() + target.layers[0].bv.float())  # [V, kv_size]
    prompt = torch.stack([torch.cdist(v0[b].transpose(0, 1).reshape(-1, s.kv_size)[:5], all_v).argmin(-1)
                          for b in range(2)])
    fresh = KVCache.empty(s, 2, 8, torch.float32, "cpu")
    forward(target, prompt, fresh, 0)
    torch.testing.assert_close(fresh.k, inputs.target_cache.k, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fresh.v, inputs.target_cache.v, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kv_init", ["random", "prefill"])
def test_make_round_inputs_deterministic(pair, kv_init):
    kw = dict(k=3, draft_batch=2, target_batch=3, context=4, kv_init=kv_init)
    a, b, c = (make_round_inputs(*pair, seed=s, **kw) for s in (5, 5, 6))
    for x, y, z in [(a.draft_last_tokens, b.draft_last_tokens, c.draft_last_tokens),
                    (a.verify_tokens, b.verify_tokens, c.verify_tokens),
                    (a.draft_cache.k, b.draft_cache.k, c.draft_cache.k),
                    (a.target_cache.v, b.target_cache.v, c.target_cache.v)]:
        assert torch.equal(x, y)
        assert not torch.equal(x, z)


def test_make_round_inputs_context_zero(pair):
    inputs = make_round_inputs(*pair, k=2, draft_batch=1, target_batch=1, context=0, seed=0, kv_init="prefill")
    assert inputs.draft_cache.k.shape[3] == 3 and not inputs.draft_cache.k.any()
    out = reference_round(*pair, inputs)
    assert out.draft_tokens.shape == (1, 2) and out.target_logits.shape == (1, 3, 272)


@pytest.mark.parametrize("kv_init", ["bogus", "Prefill", ""])
def test_make_round_inputs_bad_kv_init(pair, kv_init):
    with pytest.raises(ValueError, match="kv_init"):
        make_round_inputs(*pair, k=2, draft_batch=1, target_batch=1, context=3, seed=0, kv_init=kv_init)


@pytest.mark.parametrize("kv_init", ["random", "prefill"])
def test_reference_round_leaves_inputs_and_writes_positions(pair, kv_init):
    draft, target = pair
    k, ctx = 3, 5
    inputs = make_round_inputs(draft, target, k=k, draft_batch=2, target_batch=3, context=ctx, seed=1, kv_init=kv_init)
    before = {n + t: getattr(c, t).clone() for n, c in (("d", inputs.draft_cache), ("t", inputs.target_cache))
              for t in ("k", "v")}
    last, verify = inputs.draft_last_tokens.clone(), inputs.verify_tokens.clone()
    out = reference_round(draft, target, inputs)

    for n, c in (("d", inputs.draft_cache), ("t", inputs.target_cache)):
        for t in ("k", "v"):
            assert torch.equal(getattr(c, t), before[n + t]), f"input cache {n}.{t} was modified"
    assert torch.equal(inputs.draft_last_tokens, last) and torch.equal(inputs.verify_tokens, verify)
    assert out.draft_cache.k is not inputs.draft_cache.k and out.target_cache.k is not inputs.target_cache.k

    assert out.draft_tokens.shape == (2, k) and out.draft_logits.shape == (2, k, 256)
    assert out.target_logits.shape == (3, k + 1, 272) and torch.equal(out.target_tokens, out.target_logits.argmax(-1))
    for t in ("k", "v"):
        d, tg = getattr(out.draft_cache, t), getattr(out.target_cache, t)
        # the prefix is untouched
        assert torch.equal(d[:, :, :, :ctx], before["d" + t][:, :, :, :ctx])
        assert torch.equal(tg[:, :, :, :ctx], before["t" + t][:, :, :, :ctx])
        # target writes context..context+k; draft writes context..context+k-1 and not context+k
        assert (tg[:, :, :, ctx:ctx + k + 1].abs().sum(-1) > 0).all()
        assert (d[:, :, :, ctx:ctx + k].abs().sum(-1) > 0).all()
        assert not d[:, :, :, ctx + k].any()

    # consistency: the draft's cache equals a fresh forward over last token + first k-1 drafts
    fresh = inputs.draft_cache.clone()
    forward(draft, torch.cat([inputs.draft_last_tokens[:, None], out.draft_tokens[:, :-1]], 1), fresh, ctx)
    torch.testing.assert_close(fresh.k, out.draft_cache.k, atol=1e-5, rtol=1e-5)
    # and the draft tokens are the argmax of the draft logits
    assert torch.equal(out.draft_tokens, out.draft_logits.argmax(-1))


def test_ragged_round_is_each_sequence_alone(pair):
    """Sequences at different lengths: each one's round equals its round alone, and nothing past a
    sequence's length (noise there) is read."""
    draft, target = pair
    k, ctx = 2, 9
    inputs = make_round_inputs(draft, target, k=k, draft_batch=3, target_batch=3, context=ctx, seed=4, ragged=True)
    assert len(set(inputs.target_lengths.tolist())) > 1 and len(set(inputs.draft_lengths.tolist())) > 1
    assert all(ctx // 2 <= n <= ctx for n in inputs.target_lengths.tolist() + inputs.draft_lengths.tolist())
    out = reference_round(draft, target, inputs)
    for b in range(3):
        d_len, t_len = int(inputs.draft_lengths[b]), int(inputs.target_lengths[b])
        t_cache = KVCache(inputs.target_cache.k[:, b:b + 1, :, :t_len].clone(),
                          inputs.target_cache.v[:, b:b + 1, :, :t_len].clone())
        t_cache = KVCache(torch.cat([t_cache.k, torch.zeros_like(inputs.target_cache.k[:, b:b + 1, :, :k + 1])], 3),
                          torch.cat([t_cache.v, torch.zeros_like(inputs.target_cache.v[:, b:b + 1, :, :k + 1])], 3))
        alone = forward(target, inputs.verify_tokens[b:b + 1], t_cache, t_len)
        torch.testing.assert_close(out.target_logits[b:b + 1], alone, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out.target_cache.k[:, b, :, t_len:t_len + k + 1], t_cache.k[:, 0, :, t_len:],
                                   atol=1e-6, rtol=1e-6)
        d_cache = KVCache(inputs.draft_cache.k[:, b:b + 1].clone(), inputs.draft_cache.v[:, b:b + 1].clone())
        tokens, _ = reference.draft_phase(draft, inputs.draft_last_tokens[b:b + 1], d_cache,
                                          torch.tensor([d_len]), k)
        assert torch.equal(out.draft_tokens[b:b + 1], tokens)


def test_workload_weights_come_from_its_checkpoint(tmp_path):
    from conjugate.workload import workload_from_dict

    _write_checkpoint(tmp_path / "ckpt", spec_name="tiny-qwen2-t", seed=99)
    workload = workload_from_dict({"draft": "tiny-qwen2-d", "target": "ckpt", "k": 2, "draft_batch": 1,
                                   "target_batch": 1, "context": 4, "dtype": "fp32", "seed": 0}, tmp_path / "w.toml")
    loaded = workload.weights("target")
    expected = random_weights(from_name("tiny-qwen2-t"), 99)
    assert torch.equal(loaded.layers[1].wq, expected.layers[1].wq)
    assert not torch.equal(loaded.layers[1].wq, random_weights(workload.target, 0).layers[1].wq)
    assert torch.equal(workload.weights("draft").embed, random_weights(workload.draft, 0).embed)  # a preset
