"""`conjugate plan upgrade`: conjugate.plan/1 plan files rewritten as conjugate.plan/2."""
from __future__ import annotations

import json
from pathlib import Path

from conjugate.errors import PlanError
from conjugate.files import read_json, write_atomic
from conjugate.plan.schema import validate_plan
from conjugate.plan.upgrade import is_v1, upgrade_v1


def upgrade_files(paths: list[Path], out_dir: Path | None) -> list[tuple[Path, Path | None]]:
    """Rewrite v1 plan files as v2: into `out_dir` under their own names, or in place (None). Every
    file is read and checked before any is written; returns (file, written to) pairs, None where a
    file was already v2."""
    done = []
    for path in paths:
        raw = read_json(path, PlanError, "plan file", unique_keys=True)
        if not is_v1(raw):
            validate_plan(raw, str(path))  # a v2 plan is left as it is, but must be one
            done.append((path, None, None))
            continue
        v2 = upgrade_v1(raw, str(path))
        validate_plan(v2, str(path))
        done.append((path, (out_dir / path.name) if out_dir else path, v2))
    for _, target, v2 in done:
        if target is not None:
            target.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(target, json.dumps(v2, indent=2) + "\n")
    return [(path, target) for path, target, _ in done]
