"""Model weights: seeded random, or loaded from a Hugging Face checkpoint (config.json + safetensors).

Linear weights keep the Hugging Face layout [out_features, in_features]; the compiler re-lays them.
"""
from __future__ import annotations

import hashlib
import math
import stat
from dataclasses import dataclass
from pathlib import Path

import torch

from conjugate.errors import CheckpointError
from conjugate.files import read_json, shown
from conjugate.models.spec import ModelSpec

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor  # [H]
    wq: torch.Tensor  # [q_size, H]
    wk: torch.Tensor  # [kv_size, H]
    wv: torch.Tensor  # [kv_size, H]
    wo: torch.Tensor  # [H, q_size]
    mlp_norm: torch.Tensor  # [H]
    w_gate: torch.Tensor  # [F, H]
    w_up: torch.Tensor  # [F, H]
    w_down: torch.Tensor  # [H, F]
    bq: torch.Tensor | None = None  # [q_size]   (Qwen2)
    bk: torch.Tensor | None = None  # [kv_size]
    bv: torch.Tensor | None = None  # [kv_size]
    q_norm: torch.Tensor | None = None  # [head_dim] (Qwen3)
    k_norm: torch.Tensor | None = None  # [head_dim]


@dataclass
class ModelWeights:
    spec: ModelSpec
    embed: torch.Tensor  # [V, H]
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # [H]
    lm_head: torch.Tensor  # [V, H]; the same tensor as `embed` when embeddings are tied

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.device


def _hf_names(spec: ModelSpec, i: int) -> dict[str, str]:
    """LayerWeights field -> Hugging Face tensor name for layer i."""
    p = f"model.layers.{i}."
    names = {
        "attn_norm": p + "input_layernorm.weight",
        "wq": p + "self_attn.q_proj.weight",
        "wk": p + "self_attn.k_proj.weight",
        "wv": p + "self_attn.v_proj.weight",
        "wo": p + "self_attn.o_proj.weight",
        "mlp_norm": p + "post_attention_layernorm.weight",
        "w_gate": p + "mlp.gate_proj.weight",
        "w_up": p + "mlp.up_proj.weight",
        "w_down": p + "mlp.down_proj.weight",
    }
    if spec.qkv_bias:
        names.update(bq=p + "self_attn.q_proj.bias", bk=p + "self_attn.k_proj.bias", bv=p + "self_attn.v_proj.bias")
    if spec.qk_norm:
        names.update(q_norm=p + "self_attn.q_norm.weight", k_norm=p + "self_attn.k_norm.weight")
    return names


def _layer_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    h, f, q, kv, hd = spec.hidden_size, spec.ffn_size, spec.q_size, spec.kv_size, spec.head_dim
    shapes = {"attn_norm": (h,), "wq": (q, h), "wk": (kv, h), "wv": (kv, h), "wo": (h, q),
              "mlp_norm": (h,), "w_gate": (f, h), "w_up": (f, h), "w_down": (h, f)}
    if spec.qkv_bias:
        shapes.update(bq=(q,), bk=(kv,), bv=(kv,))
    if spec.qk_norm:
        shapes.update(q_norm=(hd,), k_norm=(hd,))
    return shapes


# ---------------------------------------------------------------------------------------------
# Seeded random weights


def _tensor_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _randn(shape, std: float, seed: int, name: str, dtype: torch.dtype, device) -> torch.Tensor:
    gen = torch.Generator(device=device).manual_seed(_tensor_seed(seed, name))
    out = torch.empty(shape, dtype=dtype, device=device)
    chunk = max(1, (1 << 26) // max(1, math.prod(shape[1:])))  # bound the fp32 temporary
    for start in range(0, shape[0], chunk):
        rows = min(chunk, shape[0] - start)
        tmp = torch.randn((rows, *shape[1:]), generator=gen, device=device, dtype=torch.float32)
        out[start:start + rows] = (tmp * std).to(dtype)
    return out


def random_weights(spec: ModelSpec, seed: int, dtype: torch.dtype = torch.float32, device="cpu") -> ModelWeights:
    """Deterministic for (spec, seed, device). Std 1/sqrt(fan_in), residual branches scaled by
    1/sqrt(2 * layers), so the residual stream stays O(1) through every layer. Embedding rows have
    norm 0.3: with tied embeddings a larger one makes every token predict itself."""
    device = torch.device(device)
    branch = 1.0 / math.sqrt(2 * spec.num_layers)

    def w(name: str, shape, std: float) -> torch.Tensor:
        return _randn(shape, std, seed, f"{spec.name}/{name}", dtype, device)

    def norm(name: str, size: int) -> torch.Tensor:
        return 1.0 + w(name, (size,), 0.1)

    layers = []
    for i in range(spec.num_layers):
        tensors = {}
        for field_name, shape in _layer_shapes(spec).items():
            key = f"l{i}.{field_name}"
            if field_name.endswith("norm"):
                tensors[field_name] = norm(key, shape[0])
            elif field_name.startswith("b"):
                tensors[field_name] = w(key, shape, 0.1)
            else:
                std = 1.0 / math.sqrt(shape[1]) * (branch if field_name in ("wo", "w_down") else 1.0)
                tensors[field_name] = w(key, shape, std)
        layers.append(LayerWeights(**tensors))
    embed = w("embed", (spec.vocab_size, spec.hidden_size), 0.3 / math.sqrt(spec.hidden_size))
    lm_head = embed if spec.tied_embeddings else w("lm_head", (spec.vocab_size, spec.hidden_size), 1.0 / math.sqrt(spec.hidden_size))
    return ModelWeights(spec, embed, layers, norm("final_norm", spec.hidden_size), lm_head)


def meta_weights(spec: ModelSpec, dtype: torch.dtype = torch.bfloat16) -> ModelWeights:
    """Shapes and dtypes without memory (the `meta` device): enough to lower and generate kernels."""
    def empty(*shape: int) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device="meta")

    layers = [LayerWeights(**{f: empty(*s) for f, s in _layer_shapes(spec).items()}) for _ in range(spec.num_layers)]
    embed = empty(spec.vocab_size, spec.hidden_size)
    lm_head = embed if spec.tied_embeddings else empty(spec.vocab_size, spec.hidden_size)
    return ModelWeights(spec, embed, layers, empty(spec.hidden_size), lm_head)


# ---------------------------------------------------------------------------------------------
# Hugging Face checkpoints


def checkpoint_files(directory: Path) -> dict[str, Path]:
    """Tensor name -> safetensors file, from `model.safetensors` or a sharded index."""
    index = directory / "model.safetensors.index.json"
    if index.exists():
        contents = read_json(index, CheckpointError, "index file")
        weight_map = contents.get("weight_map") if isinstance(contents, dict) else None
        if weight_map is None:
            raise CheckpointError(f"{index}: malformed index (needs a 'weight_map' object)")
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise CheckpointError(f"{index}: field 'weight_map' should map tensor names to file names")
        for name, file in weight_map.items():  # a shard is a file of this folder: no path, no "..", no NUL
            if not file or file in (".", "..") or "/" in file or "\\" in file or "\0" in file:
                raise CheckpointError(f"{index}: field 'weight_map' maps {shown(name)} to {shown(file)}, which is "
                                      "not the name of a file in the checkpoint's folder")
        return {name: directory / file for name, file in weight_map.items()}
    single = directory / "model.safetensors"
    if not single.exists():
        raise CheckpointError(f"{directory}: no model.safetensors or model.safetensors.index.json")
    from safetensors import safe_open

    with _open_safetensors(single, safe_open) as f:
        return {name: single for name in f.keys()}


def _open_safetensors(path: Path, safe_open):
    if not path.exists():
        raise CheckpointError(f"{path}: missing safetensors file")
    if not stat.S_ISREG(path.stat().st_mode):  # opening a pipe would wait for a writer forever
        raise CheckpointError(f"{path}: not a regular file (a pipe, socket or device), expected a safetensors file")
    try:
        return safe_open(str(path), framework="pt")
    except Exception as e:  # safetensors raises its own SafetensorError on corrupt headers
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from e


FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")  # safetensors' names of the dtypes a weight may be stored in


class _TensorReader:
    """Reads named tensors from a checkpoint, opening each shard once."""

    def __init__(self, directory: Path, dtype: torch.dtype, device):
        from safetensors import safe_open

        self._safe_open = safe_open
        self.files = checkpoint_files(directory)
        self.directory, self.dtype, self.device = directory, dtype, device
        self._open: dict[Path, object] = {}

    def _shard(self, name: str) -> tuple[Path, object]:
        if name not in self.files:
            raise CheckpointError(f"{self.directory}: tensor {name!r} is missing from the checkpoint")
        path = self.files[name]
        if path not in self._open:
            self._open[path] = _open_safetensors(path, self._safe_open).__enter__()
        return path, self._open[path]

    def check(self, name: str, shape: tuple[int, ...]) -> None:
        """From the shard's header only: the tensor is there, of this shape, in a float dtype."""
        path, shard = self._shard(name)
        try:
            part = shard.get_slice(name)
            found, dtype = tuple(part.get_shape()), part.get_dtype()
        except Exception as e:
            raise CheckpointError(f"{path}: cannot read tensor {name!r} ({e})") from e
        if found != shape:
            raise CheckpointError(f"{path}: tensor {name!r} has shape {found}, config.json implies {shape}")
        if dtype not in FLOAT_DTYPES:
            raise CheckpointError(f"{path}: tensor {name!r} has dtype {dtype}; weights are one of "
                                  f"{', '.join(FLOAT_DTYPES)}")

    def get(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        self.check(name, shape)
        path, shard = self._shard(name)
        try:
            tensor = shard.get_tensor(name).to(device=self.device, dtype=self.dtype)
        except Exception as e:
            raise CheckpointError(f"{path}: cannot read tensor {name!r} ({e})") from e
        if not torch.isfinite(tensor).all():
            raise CheckpointError(f"{path}: tensor {name!r} holds values that are not finite (inf or NaN)")
        return tensor

    def close(self) -> None:
        for handle in self._open.values():
            handle.__exit__(None, None, None)


def checkpoint_tensors(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint of this model holds: its name -> its shape."""
    shapes = _layer_shapes(spec)
    out = {n: shapes[f] for i in range(spec.num_layers) for f, n in _hf_names(spec, i).items()}
    vh = (spec.vocab_size, spec.hidden_size)
    out |= {"model.embed_tokens.weight": vh, "model.norm.weight": (spec.hidden_size,)}
    return out if spec.tied_embeddings else out | {"lm_head.weight": vh}


def check_checkpoint(directory: str | Path, spec: ModelSpec) -> None:
    """Every tensor the model needs is in the checkpoint with its shape and a float dtype, read from
    the shards' headers alone (CheckpointError naming the file and tensor otherwise)."""
    reader = _TensorReader(Path(directory), torch.float32, torch.device("cpu"))
    try:
        for name, shape in checkpoint_tensors(spec).items():
            reader.check(name, shape)
    finally:
        reader.close()


def load_checkpoint(directory: str | Path, dtype: torch.dtype = torch.bfloat16, device="cpu",
                    spec: ModelSpec | None = None) -> ModelWeights:
    directory = Path(directory)
    spec = spec or ModelSpec.from_hf_config(directory)
    reader = _TensorReader(directory, dtype, torch.device(device))
    try:
        tensors = {name: reader.get(name, shape) for name, shape in checkpoint_tensors(spec).items()}
    finally:
        reader.close()
    layers = [LayerWeights(**{f: tensors[n] for f, n in _hf_names(spec, i).items()}) for i in range(spec.num_layers)]
    embed = tensors["model.embed_tokens.weight"]
    lm_head = embed if spec.tied_embeddings else tensors["lm_head.weight"]
    return ModelWeights(spec, embed, layers, tensors["model.norm.weight"], lm_head)
