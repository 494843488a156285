"""A workload: the configuration of one speculative-decoding round, read from a TOML file.

    name = "llama-1b-8b-b8"
    draft = "llama-3.2-1b"        # a preset name, or a checkpoint directory (relative to this file)
    target = "llama-3.1-8b"
    k = 4                          # draft tokens proposed per round
    draft_batch = 8
    target_batch = 8
    context = 1024                 # tokens already in each KV cache
    dtype = "bf16"                 # bf16 | fp16 | fp32
    seed = 0
    kv_init = "random"             # random | prefill (optional)
    weight_init = "checkpoint"     # checkpoint | random (optional): see WEIGHT_INITS
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from conjugate.errors import CheckpointError, WorkloadError
from conjugate.files import NAME_MAX, is_shown_name, read_toml, shown
from conjugate.models.presets import PRESETS
from conjugate.models.spec import ModelSpec
from conjugate.models.weights import DTYPES, check_checkpoint, checkpoint_files
from conjugate.roles import Model

_FIELDS: dict[str, type] = {"name": str, "draft": str, "target": str, "k": int, "draft_batch": int,
                            "target_batch": int, "context": int, "dtype": str, "seed": int, "kv_init": str,
                            "weight_init": str}
_REQUIRED = ("draft", "target", "k", "draft_batch", "target_batch", "context", "dtype")
LIMITS = {"k": (1, 16), "draft_batch": (1, 256), "target_batch": (1, 256), "context": (0, 131072),
           "seed": (0, 2**63 - 1)}  # a seed seeds torch's generators: a signed 64-bit integer
# How a checkpoint directory's weights come: "checkpoint" loads its safetensors; "random" reads its
# config.json alone and seeds the weights by the workload's seed, as a preset's always are (a pair
# searched, benchmarked and checked by shapes, never decoded with).
WEIGHT_INITS = ("checkpoint", "random")


@dataclass(frozen=True)
class Workload:
    name: str
    draft: ModelSpec
    target: ModelSpec
    k: int
    draft_batch: int
    target_batch: int
    context: int
    dtype: str  # a key of DTYPES
    seed: int = 0
    kv_init: str = "random"
    weight_init: str = "checkpoint"  # one of WEIGHT_INITS
    draft_source: str = ""  # what the file said: a preset name or a checkpoint directory
    target_source: str = ""
    schema_version: int = field(default=1, compare=False)

    @property
    def draft_rows(self) -> int:
        """GEMM rows of one draft decode step."""
        return self.draft_batch

    @property
    def target_rows(self) -> int:
        """GEMM rows of the verify pass: k + 1 tokens per sequence."""
        return self.target_batch * (self.k + 1)

    def cache_bytes(self) -> int:
        """The two models' KV caches at the round's full length, in bytes (the round's reference and
        its buffers each hold a copy)."""
        element = DTYPES[self.dtype].itemsize
        positions = self.context + self.k + 1
        return sum(2 * spec.num_layers * batch * spec.num_kv_heads * positions * spec.head_dim * element
                   for spec, batch in ((self.draft, self.draft_batch), (self.target, self.target_batch)))

    @property
    def torch_dtype(self):
        return DTYPES[self.dtype]

    def checkpoint_dir(self, model: Model) -> Path | None:
        """The model's checkpoint directory, or None for a preset with random weights."""
        source = self.draft_source if model == Model.DRAFT else self.target_source
        return None if source in PRESETS else Path(source)

    def weights(self, model: Model, device="cpu"):
        """The model's weights: loaded from the checkpoint directory the workload names, or seeded
        random for a preset or where the workload declares weight_init = "random"."""
        from conjugate.models.weights import load_checkpoint, random_weights

        spec = self.draft if model == Model.DRAFT else self.target
        directory = self.checkpoint_dir(model)
        if directory is None or self.weight_init == "random":
            return random_weights(spec, self.seed, self.torch_dtype, device)
        return load_checkpoint(directory, self.torch_dtype, device, spec)

    def require_real_weights(self, where: Path | str) -> None:
        """WorkloadError naming `where` (the workload file) and the field when the workload declares its
        weights random: decoding (generate, serve) needs a checkpoint's own weights."""
        if self.weight_init == "random":
            raise WorkloadError(f"{where}: field 'weight_init' is \"random\": decoding needs the checkpoints' own "
                                "weights (a workload of random weights is for search, bench, profile and check)")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["draft"], data["target"] = self.draft.to_dict(), self.target.to_dict()
        if self.weight_init == "checkpoint":  # the default, left out: keys and runs stored before the field hold
            del data["weight_init"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Workload":
        """The inverse of to_dict, for a workload this program checked already (a file goes
        through load_workload)."""
        return cls(**{**data, "draft": ModelSpec.from_dict(data["draft"]), "target": ModelSpec.from_dict(data["target"])})


def workload_toml(workload: Workload) -> str:
    """A workload file that load_workload reads back as this workload."""
    values = {"name": workload.name, "draft": workload.draft_source, "target": workload.target_source,
              "k": workload.k, "draft_batch": workload.draft_batch, "target_batch": workload.target_batch,
              "context": workload.context, "dtype": workload.dtype, "seed": workload.seed, "kv_init": workload.kv_init,
              "weight_init": workload.weight_init}
    return "".join(f"{key} = {_toml_value(value)}\n" for key, value in values.items())


def _toml_value(value: Any) -> str:
    """A TOML integer, or a basic string: backslash, quote and control characters escaped, the rest raw."""
    if isinstance(value, int):
        return str(value)
    escaped = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}
    return '"' + "".join(escaped.get(c) or (f"\\u{ord(c):04X}" if ord(c) < 0x20 or ord(c) == 0x7F else c)
                         for c in value) + '"'


def load_workload(path: str | Path) -> Workload:
    """Read and check a workload file; every problem raises WorkloadError naming the file and field."""
    return workload_from_dict(read_workload_fields(path), Path(path))


def read_workload_fields(path: str | Path) -> dict[str, Any]:
    """A workload file's fields as written, unchecked (see workload_from_dict)."""
    return read_toml(Path(path), WorkloadError, "workload file")


def workload_from_dict(data: dict[str, Any], path: Path) -> Workload:
    check_fields(data, path)
    weight_init = data.get("weight_init", "checkpoint")
    draft, draft_source = _resolve_model(data["draft"], "draft", path, weight_init)
    target, target_source = _resolve_model(data["target"], "target", path, weight_init)
    check_models(draft, target, path)
    if not same_tokenizer(draft_source, target_source):
        raise WorkloadError(f"{path}: fields 'draft' and 'target': the checkpoints ship different tokenizers "
                            "(tokenizer.json); a draft must propose in the target's tokens")
    return Workload(name=data.get("name", path.stem), draft=draft, target=target, k=data["k"],
                    draft_batch=data["draft_batch"], target_batch=data["target_batch"], context=data["context"],
                    dtype=data["dtype"], seed=data.get("seed", 0), kv_init=data.get("kv_init", "random"),
                    weight_init=weight_init, draft_source=draft_source, target_source=target_source)


def check_models(draft: ModelSpec, target: ModelSpec, path: Path | str) -> None:
    """What the kernels need of the two models: head dims powers of two >= 16, and a draft vocabulary
    the target's covers; WorkloadError naming `path` and the field otherwise."""
    for key, spec in (("draft", draft), ("target", target)):
        if spec.head_dim < 16 or spec.head_dim & (spec.head_dim - 1):
            raise WorkloadError(f"{path}: field {key!r}: head_dim {spec.head_dim} is not a power of two >= 16, "
                                "which the attention and RoPE kernels need")
    if draft.vocab_size > target.vocab_size:
        raise WorkloadError(f"{path}: field 'draft': vocabulary {draft.vocab_size} is larger than the target's "
                            f"{target.vocab_size}; the target must be able to verify every draft token")


def check_fields(data: dict[str, Any], path: Path | str) -> None:
    """A workload's fields as a file gives them (models named by preset or directory): known, of their
    types, within their limits; WorkloadError naming `path` and the field otherwise."""
    for key, value in data.items():
        if key not in _FIELDS:
            raise WorkloadError(f"{path}: unknown field {key!r}; known: {', '.join(_FIELDS)}")
        kind = _FIELDS[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise WorkloadError(f"{path}: field {key!r} should be {kind.__name__}, got {shown(value)}")
    for key in _REQUIRED:
        if key not in data:
            raise WorkloadError(f"{path}: missing field {key!r}")
    name = data.get("name", "-")
    if not is_shown_name(name):
        raise WorkloadError(f"{path}: field 'name' is {shown(name)}; 1 to {NAME_MAX} printable characters")
    for key, (low, high) in LIMITS.items():
        if key in data and not low <= data[key] <= high:
            raise WorkloadError(f"{path}: field {key!r} is {shown(data[key])}, must be in [{low}, {high}]")
    if data["dtype"] not in DTYPES:
        raise WorkloadError(f"{path}: field 'dtype' is {shown(data['dtype'])}; one of {', '.join(DTYPES)}")
    kv_init = data.get("kv_init", "random")
    if kv_init not in ("random", "prefill"):
        raise WorkloadError(f"{path}: field 'kv_init' is {shown(kv_init)}; one of random, prefill")
    weight_init = data.get("weight_init", "checkpoint")
    if weight_init not in WEIGHT_INITS:
        raise WorkloadError(f"{path}: field 'weight_init' is {shown(weight_init)}; one of {', '.join(WEIGHT_INITS)}")


def same_tokenizer(draft_source: str, target_source: str) -> bool:
    """False when both models are checkpoints whose tokenizer.json files differ (a preset has none)."""
    files = [Path(source) / "tokenizer.json" for source in (draft_source, target_source) if source not in PRESETS]
    if len(files) < 2 or not all(f.is_file() for f in files):
        return True
    return files[0].read_bytes() == files[1].read_bytes()


def _resolve_model(value: str, key: str, path: Path, weight_init: str) -> tuple[ModelSpec, str]:
    if value in PRESETS:
        return PRESETS[value], value
    try:
        directory = (path.parent / value).resolve() if "\0" not in value else None  # no path holds a NUL
        is_directory = directory is not None and directory.is_dir()
    except (OSError, RuntimeError) as e:  # a symlink loop, a name too long
        raise WorkloadError(f"{path}: field {key!r}: {shown(value)}: {getattr(e, 'strerror', None) or e}") from None
    if not is_directory:
        raise WorkloadError(f"{path}: field {key!r}: {shown(value)} is neither a model preset nor a checkpoint "
                            f"directory (presets: conjugate models)")
    spec = None
    try:
        spec = ModelSpec.from_hf_config(directory)
        if weight_init == "checkpoint":
            _check_weights(directory, spec)
    except CheckpointError as e:
        hint = _RANDOM_HINT if spec is not None and not _holds_weights(directory) else ""
        raise WorkloadError(f"{path}: field {key!r}: {e}{hint}") from e
    return spec, str(directory)


def _check_weights(directory: Path, spec: ModelSpec) -> None:
    """Every shard the checkpoint names exists, and holds every tensor, shaped and typed as a weight
    (headers only); CheckpointError otherwise."""
    for shard in sorted(set(checkpoint_files(directory).values())):
        if not shard.exists():  # only an index names shards; a single model.safetensors was opened
            raise CheckpointError(f"{directory / 'model.safetensors.index.json'}: field 'weight_map' names "
                                  f"a missing safetensors shard, {shard}")
    check_checkpoint(directory, spec)


_RANDOM_HINT = ' (to use its config.json alone, with seeded random weights, declare weight_init = "random")'


def _holds_weights(directory: Path) -> bool:
    return any((directory / name).exists() for name in ("model.safetensors", "model.safetensors.index.json"))
