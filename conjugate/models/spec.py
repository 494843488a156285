"""Model shapes of the Llama 3.x, Qwen2/2.5 and Qwen3 families, as their public configs state them."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from conjugate.errors import CheckpointError
from conjugate.files import read_json, shown

FAMILIES = ("llama", "qwen2", "qwen3")
# ModelSpec.from_dict's checks, by the fields' annotations as written (this module's annotations are strings)
_FIELD_KINDS = {"str": str, "int": int, "float": (int, float), "bool": bool}


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3 style frequency-dependent RoPE scaling ("rope_type": "llama3")."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelSpec:
    """One decoder-only model's architecture; weights live elsewhere (models/weights.py)."""

    name: str
    family: str  # one of FAMILIES
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_size: int
    vocab_size: int
    rope_theta: float
    rms_norm_eps: float
    tied_embeddings: bool
    qkv_bias: bool = False  # Qwen2/2.5
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k before RoPE
    rope_scaling: RopeScaling | None = None
    schema_version: int = field(default=1, compare=False)

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"model {self.name}: family {self.family!r} is not one of {FAMILIES}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"model {self.name}: num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")

    # Derived sizes (elements, not bytes).
    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def qkv_size(self) -> int:
        return self.q_size + 2 * self.kv_size

    def projection(self, kind: str) -> tuple[int, int]:
        """(out features N, in features K) of one weight matrix of a GEMM op kind (gate_up: each of two)."""
        h = self.hidden_size
        return {"qkv": (self.qkv_size, h), "o_proj": (h, self.q_size), "gate_up": (self.ffn_size, h),
                "down": (h, self.ffn_size), "lm_head": (self.vocab_size, h)}[kind]

    def num_params(self) -> int:
        h, layers = self.hidden_size, self.num_layers
        per_layer = h * self.qkv_size + self.q_size * h + 3 * h * self.ffn_size + 2 * h
        per_layer += self.qkv_size if self.qkv_bias else 0
        per_layer += 2 * self.head_dim if self.qk_norm else 0
        embed = self.vocab_size * h * (1 if self.tied_embeddings else 2)
        return layers * per_layer + embed + h

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelSpec":
        """The inverse of to_dict; ValueError naming the first field of the wrong type or size."""
        if not isinstance(data, dict):
            raise ValueError(f"a model should be an object, got {shown(data)}")
        _check_kinds(cls, data, "model field")
        data = dict(data)
        scaling = data.get("rope_scaling")
        if scaling is not None:
            if not isinstance(scaling, dict):
                raise ValueError(f"model field 'rope_scaling' should be an object or null, got {shown(scaling)}")
            _check_kinds(RopeScaling, scaling, "model field 'rope_scaling':")
            data["rope_scaling"] = RopeScaling(**scaling)
        return cls(**data)

    @classmethod
    def from_hf_config(cls, path: str | Path) -> "ModelSpec":
        """Read a Hugging Face `config.json` (a checkpoint directory or the file itself)."""
        path = Path(path)
        file = path / "config.json" if path.is_dir() else path
        config = read_json(file, CheckpointError, "config.json")
        if not isinstance(config, dict):
            raise CheckpointError(f"{file}: expected a JSON object")
        return _spec_from_hf(config, file)

    def with_name(self, name: str) -> "ModelSpec":
        return replace(self, name=name)


_HF_MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}

# The largest value of each size in config.json: several times any public model's, far below what
# would exhaust memory while the op graph or the weights are built.
_HF_MAX = {"hidden_size": 65536, "num_hidden_layers": 1024, "num_attention_heads": 1024, "num_key_value_heads": 1024,
           "head_dim": 1024, "intermediate_size": 1 << 20, "vocab_size": 1 << 22, "rms_norm_eps": 0.5,
           "rope_theta": 1e12, "rope_scaling.original_max_position_embeddings": 1 << 24, "rope_scaling.factor": 1024.0,
           "rope_scaling.low_freq_factor": 1024.0, "rope_scaling.high_freq_factor": 1024.0}
_HF_MIN = {"rope_theta": 1.0}  # the smallest: a rotation base under 1 turns every angle to inf or NaN
_LLAMA3_ROPE_KEYS = {"factor": float, "low_freq_factor": float, "high_freq_factor": float,
                     "original_max_position_embeddings": int}


def _spec_from_hf(config: dict[str, Any], file: Path) -> ModelSpec:
    def field(key: str, kind: type = int, default: Any = None) -> Any:
        value = config.get(key)
        if value is None and default is not None:
            value = default  # absent or null: the family's default
        elif key not in config:
            raise CheckpointError(f"{file}: missing field {key!r}")
        return _hf_value(value, key, kind, file)

    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in _HF_MODEL_TYPES:
        raise CheckpointError(f"{file}: field 'model_type' is {shown(model_type)}; "
                              f"supported: {', '.join(_HF_MODEL_TYPES)}")
    family = _HF_MODEL_TYPES[model_type]
    for key in ("attention_bias", "mlp_bias"):  # Qwen2's q/k/v bias is implied by its model_type
        if config.get(key) and family != "qwen2":
            raise CheckpointError(f"{file}: field {key!r} is {shown(config[key])}; only false is supported "
                                  f"for {model_type} models")
    hidden, heads = field("hidden_size"), field("num_attention_heads")
    kv_heads = field("num_key_value_heads", default=heads)
    if heads % kv_heads:
        raise CheckpointError(f"{file}: field 'num_key_value_heads' is {kv_heads}, which does not divide "
                              f"num_attention_heads {heads}")
    theta, scaling = _rope_from_hf(config, file)
    try:
        return ModelSpec(
            name=_model_name(config, file),
            family=family,
            hidden_size=hidden,
            num_layers=field("num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=field("head_dim", default=hidden // heads),
            ffn_size=field("intermediate_size"),
            vocab_size=field("vocab_size"),
            rope_theta=theta,
            rms_norm_eps=field("rms_norm_eps", float),
            tied_embeddings=field("tie_word_embeddings", bool, default=False),
            qkv_bias=family == "qwen2",
            qk_norm=family == "qwen3",
            rope_scaling=scaling,
        )
    except ValueError as e:
        raise CheckpointError(f"{file}: {e}") from e


def _hf_value(value: Any, key: str, kind: type, file: Path) -> Any:
    """A config.json value of `kind`; a number positive, finite and within _HF_MIN[key].._HF_MAX[key]."""
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value) if abs(value) < 2**1023 else math.inf
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise CheckpointError(f"{file}: field {key!r} should be {kind.__name__}, got {shown(value)}")
    if kind is float and not math.isfinite(value):
        raise CheckpointError(f"{file}: field {key!r} should be a finite number, got {value!r}")
    if kind in (int, float) and value <= 0:
        raise CheckpointError(f"{file}: field {key!r} should be positive, got {shown(value)}")
    if kind in (int, float) and value > _HF_MAX.get(key, math.inf):
        raise CheckpointError(f"{file}: field {key!r} is {shown(value)}, at most {_HF_MAX[key]:g}")
    if kind in (int, float) and value < _HF_MIN.get(key, -math.inf):
        raise CheckpointError(f"{file}: field {key!r} is {shown(value)}, at least {_HF_MIN[key]:g}")
    return value


def _model_name(config: dict[str, Any], file: Path) -> str:
    """`_name_or_path` when the config has one, else the checkpoint directory's name."""
    name = config.get("_name_or_path")
    if name is not None and not isinstance(name, str):
        raise CheckpointError(f"{file}: field '_name_or_path' should be str, got {shown(name)}")
    return name or file.parent.name


def _rope_from_hf(config: dict[str, Any], file: Path) -> tuple[float, RopeScaling | None]:
    """RoPE theta and scaling from either transformers 4 (`rope_theta`, `rope_scaling`) or 5 (`rope_parameters`)."""
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or params
    for key, value in (("rope_parameters", params), ("rope_scaling", scaling)):
        if not isinstance(value, dict):
            raise CheckpointError(f"{file}: field {key!r} should be an object, got {shown(value)}")
    theta = _hf_value(config.get("rope_theta", params.get("rope_theta", 10000.0)), "rope_theta", float, file)
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type != "llama3":
        raise CheckpointError(f"{file}: field 'rope_scaling.rope_type' is {shown(rope_type)}; "
                              "supported: default, llama3")
    values = {key: _rope_value(scaling, key, file) for key in _LLAMA3_ROPE_KEYS}
    if values["high_freq_factor"] <= values["low_freq_factor"]:  # the smoothing between them divides by the gap
        raise CheckpointError(f"{file}: field 'rope_scaling.high_freq_factor' is {values['high_freq_factor']}, "
                              f"it must exceed low_freq_factor {values['low_freq_factor']}")
    return theta, RopeScaling(**values)


def _rope_value(scaling: dict[str, Any], key: str, file: Path) -> float | int:
    if key not in scaling:
        raise CheckpointError(f"{file}: field 'rope_scaling' lacks {key!r}")
    return _hf_value(scaling[key], f"rope_scaling.{key}", _LLAMA3_ROPE_KEYS[key], file)


def _check_kinds(cls, data: dict[str, Any], what: str) -> None:
    """ValueError naming the first of `data`'s fields (of dataclass `cls`) of the wrong type, or a
    number (but a schema version) that is not positive."""
    for f in fields(cls):
        kind, value = _FIELD_KINDS.get(f.type), data.get(f.name)
        if kind is None or f.name not in data:
            continue
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise ValueError(f"{what} {f.name!r} should be {f.type}, got {shown(value)}")
        if f.type in ("int", "float") and f.name != "schema_version" and not value > 0:
            raise ValueError(f"{what} {f.name!r} is {shown(value)}, should be positive")
