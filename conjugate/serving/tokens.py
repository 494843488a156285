"""Text prompts: the target checkpoint's own tokenizer (its tokenizer.json, read by `tokenizers`)."""
from __future__ import annotations

from pathlib import Path

from conjugate.roles import Model
from conjugate.serving.decoder import GenerationError


class Tokenizer:
    def __init__(self, path: Path):
        try:
            from tokenizers import Tokenizer as Backend
        except ImportError as e:
            raise GenerationError("text prompts need the `tokenizers` package (pip install tokenizers); "
                                  "or give --prompt-ids") from e
        try:
            self._backend = Backend.from_file(str(path))
        except Exception as e:  # the library's own error types: a malformed file is the user's input
            raise GenerationError(f"{path}: not a readable tokenizer: {str(e).splitlines()[0]}") from e
        self.path = path

    @classmethod
    def of(cls, workload, required: bool = True) -> "Tokenizer | None":
        """The target checkpoint's tokenizer (the draft's is the same file or absent: see the workload)."""
        directory = workload.checkpoint_dir(Model.TARGET)
        path = directory / "tokenizer.json" if directory else None
        if path is None or not path.is_file():
            if not required:
                return None
            where = f"{directory} has no tokenizer.json" if directory else "the target is a preset with random weights"
            raise GenerationError(f"text prompts need a tokenizer and {where}: give --prompt-ids")
        return cls(path)

    def encode(self, text: str) -> list[int]:
        return self._backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._backend.decode(ids, skip_special_tokens=False)
