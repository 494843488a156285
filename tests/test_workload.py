"""Workload TOML files: the shipped examples, bad input, and checkpoint directories."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from conjugate.errors import WorkloadError
from conjugate.models.presets import PRESETS
from conjugate.models.spec import ModelSpec
from conjugate.paths import DEFAULT_WORKLOAD
from conjugate.workload import Workload, load_workload

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"

# name -> (draft, target, k, draft_batch, target_batch, context, dtype)
EXPECTED = {
    "tiny": ("tiny-llama-d", "tiny-llama-t", 3, 2, 2, 16, "fp32"),
    "llama-1b-8b-b1": ("llama-3.2-1b", "llama-3.1-8b", 4, 1, 1, 1024, "bf16"),
    "llama-1b-8b-b8": ("llama-3.2-1b", "llama-3.1-8b", 4, 8, 8, 1024, "bf16"),
    "llama-1b-8b-b32": ("llama-3.2-1b", "llama-3.1-8b", 3, 32, 32, 1024, "bf16"),
    "llama-1b-3b-b16-ctx4k": ("llama-3.2-1b", "llama-3.2-3b", 3, 16, 16, 4096, "bf16"),
    "qwen25-05b-7b-b8": ("qwen2.5-0.5b", "qwen2.5-7b", 4, 8, 8, 1024, "bf16"),
    "qwen25-15b-14b-b4": ("qwen2.5-1.5b", "qwen2.5-14b", 5, 4, 4, 1024, "bf16"),
    "qwen3-06b-8b-b4": ("qwen3-0.6b", "qwen3-8b", 5, 4, 4, 1024, "bf16"),
}

GOOD = {"name": "t", "draft": "tiny-llama-d", "target": "tiny-llama-t", "k": 3, "draft_batch": 2,
        "target_batch": 2, "context": 16, "dtype": "fp32", "seed": 0}


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string for these values
    return str(value)


def write_workload(path: Path, fields: dict) -> Path:
    path.write_text("".join(f"{key} = {_toml_value(value)}\n" for key, value in fields.items()))
    return path


def with_fields(**changes) -> dict:
    fields = dict(GOOD)
    for key, value in changes.items():
        if value is None:
            fields.pop(key, None)
        else:
            fields[key] = value
    return fields


# ---------------------------------------------------------------------------------------------
# The shipped examples


def test_examples_are_exactly_the_known_ones():
    assert sorted(p.stem for p in EXAMPLES.glob("*.toml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_fields(name):
    draft, target, k, draft_batch, target_batch, context, dtype = EXPECTED[name]
    w = load_workload(EXAMPLES / f"{name}.toml")
    assert isinstance(w, Workload)
    assert w.name == name
    assert (w.draft.name, w.target.name) == (draft, target)
    assert w.draft == PRESETS[draft] and w.target == PRESETS[target]
    assert (w.draft_source, w.target_source) == (draft, target)
    assert (w.k, w.draft_batch, w.target_batch, w.context, w.dtype) == (k, draft_batch, target_batch, context, dtype)
    assert w.seed == 0 and w.kv_init == "random"
    assert w.draft_rows == draft_batch
    assert w.target_rows == target_batch * (k + 1)
    assert w.torch_dtype == {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    assert w.checkpoint_dir("draft") is None and w.checkpoint_dir("target") is None
    assert w.draft.vocab_size <= w.target.vocab_size
    data = w.to_dict()
    assert data["draft"] == PRESETS[draft].to_dict() and data["k"] == k


def test_default_workload_is_tiny():
    assert DEFAULT_WORKLOAD == EXAMPLES / "tiny.toml"
    assert load_workload(DEFAULT_WORKLOAD).name == "tiny"


def test_qwen25_padded_target_vocab_is_accepted():
    w = load_workload(EXAMPLES / "qwen25-05b-7b-b8.toml")
    assert (w.draft.vocab_size, w.target.vocab_size) == (151936, 152064)


def test_name_defaults_to_file_stem_and_optionals(tmp_path):
    w = load_workload(write_workload(tmp_path / "my-round.toml", with_fields(name=None, seed=None)))
    assert w.name == "my-round" and w.seed == 0 and w.kv_init == "random"
    w = load_workload(write_workload(tmp_path / "p.toml", with_fields(kv_init="prefill", seed=7, dtype="fp16")))
    assert (w.kv_init, w.seed, w.dtype, w.torch_dtype) == ("prefill", 7, "fp16", torch.float16)


def test_limits_are_inclusive(tmp_path):
    w = load_workload(write_workload(tmp_path / "lo.toml", with_fields(k=1, draft_batch=1, target_batch=1, context=0)))
    assert (w.k, w.draft_batch, w.target_batch, w.context) == (1, 1, 1, 0)
    w = load_workload(write_workload(tmp_path / "hi.toml",
                                     with_fields(k=16, draft_batch=256, target_batch=256, context=131072)))
    assert (w.k, w.draft_batch, w.target_batch, w.context) == (16, 256, 256, 131072)
    assert w.target_rows == 256 * 17


def test_equal_vocab_mixed_family_is_accepted(tmp_path):
    # tiny-qwen2-d and tiny-llama-t both have 256 tokens
    w = load_workload(write_workload(tmp_path / "w.toml", with_fields(draft="tiny-qwen2-d", target="tiny-llama-t")))
    assert w.draft.vocab_size == w.target.vocab_size == 256


# ---------------------------------------------------------------------------------------------
# Bad input: WorkloadError naming the file and the field


def _raises(path: Path, *fragments: str) -> str:
    with pytest.raises(WorkloadError) as info:
        load_workload(path)
    message = str(info.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert "\n" not in message
    return message


def test_missing_file(tmp_path):
    _raises(tmp_path / "nope.toml", "no such workload file")


def test_malformed_toml(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('draft = "tiny-llama-d"\nk = = 3\n')
    _raises(path, "malformed TOML")


def test_unknown_key(tmp_path):
    _raises(write_workload(tmp_path / "w.toml", with_fields(kk=4)), "'kk'", "unknown field")


@pytest.mark.parametrize("key,value", [("k", "4"), ("k", True), ("k", 4.0), ("context", "1024"),
                                       ("draft_batch", False), ("dtype", 16), ("draft", 1), ("name", 3),
                                       ("seed", "0"), ("kv_init", True), ("weight_init", False)])
def test_wrong_type(tmp_path, key, value):
    _raises(write_workload(tmp_path / "w.toml", with_fields(**{key: value})), f"'{key}'", "should be")


@pytest.mark.parametrize("key", ["draft", "target", "k", "draft_batch", "target_batch", "context", "dtype"])
def test_missing_field(tmp_path, key):
    _raises(write_workload(tmp_path / "w.toml", with_fields(**{key: None})), f"'{key}'", "missing")


@pytest.mark.parametrize("key,value", [("k", 0), ("k", 17), ("k", -1), ("draft_batch", 0), ("draft_batch", 257),
                                       ("target_batch", 0), ("target_batch", 1000), ("context", -1),
                                       ("context", 131073)])
def test_out_of_range(tmp_path, key, value):
    _raises(write_workload(tmp_path / "w.toml", with_fields(**{key: value})), f"'{key}'", str(value))


@pytest.mark.parametrize("dtype", ["bfloat16", "fp8", "BF16", ""])
def test_bad_dtype(tmp_path, dtype):
    _raises(write_workload(tmp_path / "w.toml", with_fields(dtype=dtype)), "'dtype'", "bf16")


@pytest.mark.parametrize("kv_init", ["zeros", "Prefill", ""])
def test_bad_kv_init(tmp_path, kv_init):
    _raises(write_workload(tmp_path / "w.toml", with_fields(kv_init=kv_init)), "'kv_init'", "prefill")


@pytest.mark.parametrize("weight_init", ["Random", "zeros", "safetensors", ""])
def test_bad_weight_init(tmp_path, weight_init):
    _raises(write_workload(tmp_path / "w.toml", with_fields(weight_init=weight_init)), "'weight_init'",
            "checkpoint, random")


@pytest.mark.parametrize("key", ["draft", "target"])
def test_unknown_model_name(tmp_path, key):
    message = _raises(write_workload(tmp_path / "w.toml", with_fields(**{key: "llama-9.9-1t"})),
                      f"'{key}'", "llama-9.9-1t")
    assert "preset" in message


def test_model_name_that_is_a_file_not_a_directory(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"x")
    _raises(write_workload(tmp_path / "w.toml", with_fields(draft="weights.bin")), "'draft'", "weights.bin")


def test_draft_vocab_larger_than_target(tmp_path):
    path = write_workload(tmp_path / "w.toml", with_fields(draft="tiny-qwen2-t", target="tiny-qwen2-d"))
    _raises(path, "'draft'", "272", "256")


def test_public_draft_vocab_larger_than_target(tmp_path):
    path = write_workload(tmp_path / "w.toml", with_fields(draft="qwen2.5-7b", target="qwen2.5-0.5b"))
    _raises(path, "'draft'", "152064", "151936")


def test_workload_path_is_a_directory(tmp_path):
    _raises(tmp_path)


def test_workload_not_utf8(tmp_path):
    path = tmp_path / "w.toml"
    path.write_bytes(b"\xff\xfek = 3\n")
    _raises(path)


# ---------------------------------------------------------------------------------------------
# Checkpoint directories

LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 200,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
    "max_position_embeddings": 128,
    "torch_dtype": "float32",
}


def make_checkpoint(directory: Path, config: dict | None = LLAMA_CONFIG, safetensors: bool = True) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (directory / "config.json").write_text(json.dumps(config))
    if safetensors:
        tensors = all_tensors(directory) if config else {"model.embed_tokens.weight": torch.zeros(8, 4)}
        save_file(tensors, str(directory / "model.safetensors"))
    return directory


def all_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor the checkpoint's config.json asks for, zeros of its shape."""
    from conjugate.models.weights import checkpoint_tensors

    return {name: torch.zeros(shape) for name, shape in checkpoint_tensors(ModelSpec.from_hf_config(directory)).items()}


def test_checkpoint_dir_relative_to_toml(tmp_path, monkeypatch):
    ckpt = make_checkpoint(tmp_path / "ckpts" / "my-llama")
    workdir = tmp_path / "configs"
    workdir.mkdir()
    path = write_workload(workdir / "w.toml", with_fields(draft="../ckpts/my-llama"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # resolution must not depend on the working directory
    w = load_workload(path)
    assert w.draft == ModelSpec.from_hf_config(ckpt)
    assert w.draft.name == "my-llama" and w.draft.family == "llama"
    assert (w.draft.hidden_size, w.draft.num_heads, w.draft.num_kv_heads, w.draft.head_dim) == (64, 4, 2, 16)
    assert (w.draft.num_layers, w.draft.ffn_size, w.draft.vocab_size) == (2, 128, 200)
    assert w.draft.tied_embeddings and w.draft.rope_scaling is None
    assert w.draft_source == str(ckpt.resolve())
    assert w.checkpoint_dir("draft") == ckpt.resolve()
    assert w.checkpoint_dir("target") is None
    assert w.target == PRESETS["tiny-llama-t"]


def test_checkpoint_dir_as_target_with_sharded_index(tmp_path):
    ckpt = make_checkpoint(tmp_path / "big", dict(LLAMA_CONFIG, vocab_size=300, tie_word_embeddings=False),
                           safetensors=False)
    tensors = sorted(all_tensors(ckpt).items())
    shards = {"model-00001-of-00002.safetensors": dict(tensors[::2]),
              "model-00002-of-00002.safetensors": dict(tensors[1::2])}
    for file, part in shards.items():
        save_file(part, str(ckpt / file))
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {name: file for file, part in shards.items() for name in part}}))
    w = load_workload(write_workload(tmp_path / "w.toml", with_fields(target="big")))
    assert w.target.vocab_size == 300 and not w.target.tied_embeddings
    assert w.checkpoint_dir("target") == ckpt.resolve()


def test_checkpoint_draft_vocab_larger_than_preset_target(tmp_path):
    make_checkpoint(tmp_path / "ck", dict(LLAMA_CONFIG, vocab_size=1000))
    _raises(write_workload(tmp_path / "w.toml", with_fields(draft="ck")), "'draft'", "1000", "256")


@pytest.mark.parametrize("key", ["draft", "target"])
def test_checkpoint_dir_without_config(tmp_path, key):
    ckpt = make_checkpoint(tmp_path / "ck", config=None)
    message = _raises(write_workload(tmp_path / "w.toml", with_fields(**{key: "ck"})), f"'{key}'", "config.json")
    assert str(ckpt) in message


@pytest.mark.parametrize("key", ["draft", "target"])
def test_checkpoint_dir_without_safetensors(tmp_path, key):
    ckpt = make_checkpoint(tmp_path / "ck", safetensors=False)
    message = _raises(write_workload(tmp_path / "w.toml", with_fields(**{key: "ck"})), f"'{key}'", "safetensors")
    assert str(ckpt) in message


@pytest.mark.parametrize("key", ["draft", "target"])
def test_sharded_index_naming_missing_shard(tmp_path, key):
    ckpt = make_checkpoint(tmp_path / "ck", safetensors=False)
    save_file({"a": torch.zeros(2)}, str(ckpt / "model-00001-of-00002.safetensors"))
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    message = _raises(write_workload(tmp_path / "w.toml", with_fields(**{key: "ck"})), f"'{key}'",
                      "model-00002-of-00002.safetensors")
    assert str(ckpt) in message
    assert "model-00001-of-00002" not in message


def test_malformed_index(tmp_path):
    ckpt = make_checkpoint(tmp_path / "ck", safetensors=False)
    (ckpt / "model.safetensors.index.json").write_text("{not json")
    _raises(write_workload(tmp_path / "w.toml", with_fields(draft="ck")), "'draft'", "index")


def test_index_weight_map_not_an_object(tmp_path):
    ckpt = make_checkpoint(tmp_path / "ck", safetensors=False)
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": ["model.safetensors"]}))
    _raises(write_workload(tmp_path / "w.toml", with_fields(draft="ck")), "'draft'", "weight_map")


def test_index_weight_map_value_not_a_string(tmp_path):
    ckpt = make_checkpoint(tmp_path / "ck", safetensors=False)
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": 5}}))
    _raises(write_workload(tmp_path / "w.toml", with_fields(draft="ck")), "'draft'", "weight_map")


def test_corrupt_safetensors(tmp_path):
    ckpt = make_checkpoint(tmp_path / "ck")
    (ckpt / "model.safetensors").write_bytes(b"not a safetensors file")
    _raises(write_workload(tmp_path / "w.toml", with_fields(draft="ck")), "'draft'", "safetensors")


@pytest.mark.parametrize("change,fragment", [
    ({"model_type": "mistral"}, "model_type"),
    ({"vocab_size": None}, "vocab_size"),
    ({"hidden_size": "64"}, "hidden_size"),
    ({"num_key_value_heads": 3}, "heads"),
])
def test_bad_config_json(tmp_path, change, fragment):
    config = {k: v for k, v in {**LLAMA_CONFIG, **change}.items() if v is not None}
    ckpt = tmp_path / "ck"
    make_checkpoint(ckpt, config, safetensors=False)
    save_file({"a": torch.zeros(2)}, str(ckpt / "model.safetensors"))
    _raises(write_workload(tmp_path / "w.toml", with_fields(draft="ck")), "'draft'", "config.json", fragment)


def test_malformed_config_json(tmp_path):
    ckpt = make_checkpoint(tmp_path / "ck")
    (ckpt / "config.json").write_text("{")
    _raises(write_workload(tmp_path / "w.toml", with_fields(draft="ck")), "'draft'", "config.json", "malformed")



# ---------------------------------------------------------------------------------------------
# Config-only directories: shapes from config.json, weights declared random (weight_init)

DRAFT_CONFIG = dict(LLAMA_CONFIG, num_hidden_layers=1)
TARGET_CONFIG = dict(LLAMA_CONFIG, num_hidden_layers=1, hidden_size=128, intermediate_size=256,
                     tie_word_embeddings=False)


def config_only_pair(root: Path, **changes) -> Path:
    """A workload of two directories holding config.json alone, declaring its weights random."""
    make_checkpoint(root / "d", DRAFT_CONFIG, safetensors=False)
    make_checkpoint(root / "t", TARGET_CONFIG, safetensors=False)
    fields = dict(draft="d", target="t", k=2, draft_batch=1, target_batch=1, context=8, weight_init="random")
    return write_workload(root / "w.toml", with_fields(**fields | changes))


def test_a_config_only_pair_declared_random_loads_with_seeded_random_weights(tmp_path):
    from conjugate.models.weights import random_weights
    from conjugate.workload import workload_toml

    w = load_workload(config_only_pair(tmp_path))
    assert w.weight_init == "random"
    assert w.draft == ModelSpec.from_hf_config(tmp_path / "d") and w.target.hidden_size == 128
    assert w.checkpoint_dir("target") == (tmp_path / "t").resolve()  # its config.json, its tokenizer
    for model, spec in (("draft", w.draft), ("target", w.target)):
        got, seeded = w.weights(model), random_weights(spec, w.seed)
        assert torch.equal(got.embed, seeded.embed) and torch.equal(got.layers[0].wq, seeded.layers[0].wq)
    reseeded = load_workload(config_only_pair(tmp_path / "s", seed=5)).weights("target")
    assert not torch.equal(reseeded.embed, w.weights("target").embed)  # the workload's seed applies
    again = tmp_path / "again.toml"
    again.write_text(workload_toml(w))
    assert load_workload(again) == w and Workload.from_dict(w.to_dict()) == w


def test_a_declaration_is_not_a_fallback(tmp_path):
    """Random where declared, even beside safetensors; loaded where not; a default workload's dict as
    runs stored before the field wrote it."""
    make_checkpoint(tmp_path / "full")  # zeros
    declared = load_workload(write_workload(tmp_path / "r.toml", with_fields(draft="full", weight_init="random")))
    assert declared.weights("draft").embed.abs().sum() > 0
    loaded = load_workload(write_workload(tmp_path / "c.toml", with_fields(draft="full", weight_init="checkpoint")))
    assert loaded.weights("draft").embed.abs().sum() == 0
    assert loaded == load_workload(write_workload(tmp_path / "n.toml", with_fields(draft="full")))
    assert "weight_init" not in loaded.to_dict() and Workload.from_dict(loaded.to_dict()) == loaded
    assert declared.to_dict() != loaded.to_dict()  # evaluations of the two are keyed apart


@pytest.mark.parametrize("weight_init", [None, "checkpoint"])
def test_a_config_only_directory_without_the_declaration_is_refused(tmp_path, weight_init):
    path = config_only_pair(tmp_path, weight_init=weight_init)
    message = _raises(path, "'draft'", "model.safetensors", 'weight_init = "random"')
    assert str(tmp_path / "d") in message


def test_config_only_pairs_are_held_to_the_pair_checks(tmp_path):
    path = config_only_pair(tmp_path)
    (tmp_path / "d" / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0}}}')
    (tmp_path / "t" / "tokenizer.json").write_text('{"model": {"vocab": {"b": 0}}}')
    _raises(path, "'draft' and 'target'", "different tokenizers")
    (tmp_path / "t" / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0}}}')
    assert load_workload(path).weight_init == "random"
    (tmp_path / "d" / "config.json").write_text(json.dumps(dict(DRAFT_CONFIG, vocab_size=300)))
    _raises(path, "'draft'", "300", "200")


def test_decoding_refuses_weights_declared_random(tmp_path, monkeypatch, capsys):
    from conjugate.cli import main
    from conjugate.serving import tokens

    path = config_only_pair(tmp_path)
    with pytest.raises(WorkloadError, match="'weight_init'") as info:
        load_workload(path).require_real_weights(path)
    assert str(path) in str(info.value)
    load_workload(DEFAULT_WORKLOAD).require_real_weights(DEFAULT_WORKLOAD)  # presets and checkpoints decode

    def loads(*args, **kwargs):
        raise AssertionError("generate loaded a tokenizer before refusing")

    monkeypatch.setattr(tokens.Tokenizer, "of", loads)
    for command in (["generate", str(path), "--prompt-ids", "1,2"], ["serve", str(path), "--port", "1"]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and str(path) in err and "'weight_init'" in err


def test_check_and_search_run_on_a_config_only_pair(tmp_path, monkeypatch, capsys):
    import sqlite3

    from conjugate.cli import main
    from conjugate.search.databases import open_store
    from conjugate.search.runs import run_workload_file

    monkeypatch.setenv("CONJUGATE_CACHE", str(tmp_path / "cache"))
    path = config_only_pair(tmp_path)
    assert main(["check", str(path), "--plan", "streams", "--limit", "1"]) == 0
    assert "equals the reference round" in " ".join(capsys.readouterr().out.split())  # on random weights
    fast = tmp_path / "fast.toml"  # the analytical evaluator, modeled only: quick
    fast.write_text((REPO / "evaluators" / "analytical.toml").read_text().replace("max_params = 5000000",
                                                                                   "max_params = 0"))
    db = tmp_path / "s.db"
    assert main(["search", str(path), "--db", str(db), "--budget", "2", "--evaluator", str(fast)]) == 0
    with sqlite3.connect(db) as con:
        assert con.execute("select count(*) from evaluations").fetchone()[0] == 2
    searched = load_workload(path)
    path.rename(tmp_path / "moved.toml")  # a resume then hands its worker the workload the run stored
    with open_store(str(db)) as store:
        stored, file = run_workload_file(store.latest_run())
    assert stored == searched and load_workload(file) == searched
