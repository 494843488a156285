"""The target checkpoint's end-of-sequence ids: `eos_token_id` of its generation_config.json, else of
its config.json (an id or a list of ids). A preset (random weights) has none."""
from __future__ import annotations

import json

from conjugate.roles import Model
from conjugate.serving.decoder import GenerationError


def checkpoint_stop_ids(workload) -> tuple[int, ...]:
    directory = workload.checkpoint_dir(Model.TARGET)
    if directory is None:
        return ()
    for name in ("generation_config.json", "config.json"):
        path = directory / name
        if not path.is_file():
            continue
        try:
            value = json.loads(path.read_text()).get("eos_token_id")
        except (OSError, ValueError, AttributeError) as e:
            raise GenerationError(f"{path}: not a readable JSON object ({type(e).__name__})") from None
        if value is None:
            continue
        ids = value if isinstance(value, list) else [value]
        if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise GenerationError(f"{path}: field 'eos_token_id' must be a token id or a list of them, got {value!r}")
        return tuple(ids)
    return ()
