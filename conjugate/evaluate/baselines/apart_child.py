"""The process that measures the conventional baselines apart (apart.py): it reads one JSON request on
stdin, prepares the workload as the evaluator does, measures, writes the baselines as JSON to the
file the request names, and exits as soon as its parent is gone.

    python -m conjugate.evaluate.baselines.apart_child
"""
from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

from conjugate.evaluate.baselines.measure import measure_conventional
from conjugate.evaluate.evaluators import EvaluatorProfile
from conjugate.evaluate.measured import MeasuredHarness
from conjugate.evaluate.parent_watch import exit_with_parent
from conjugate.evaluate.result import Baseline
from conjugate.evaluate.session import EvaluationSession
from conjugate.files import write_atomic
from conjugate.workload import Workload


def conventional_alone(workload: Workload, profile: EvaluatorProfile, cache_dir: Path | None) -> dict[str, Baseline]:
    """`conventional` and `streams` in a process that prepares the workload for them alone."""
    setup = MeasuredHarness(profile, cache_dir, EvaluationSession()).prepare(workload)
    return measure_conventional(setup, profile.timing, cache_dir)


def _serve() -> None:
    exit_with_parent()
    request = json.loads(sys.stdin.read())
    module, _, function = request["entry"].partition(":")
    measure = getattr(importlib.import_module(module), function)
    profile = EvaluatorProfile.from_dict(request["profile"])
    cache_dir = Path(request["cache_dir"]) if request["cache_dir"] else None
    baselines = measure(Workload.from_dict(request["workload"]), profile, cache_dir)
    write_atomic(Path(request["out"]), json.dumps({name: b.to_dict() for name, b in baselines.items()}))


if __name__ == "__main__":
    _serve()
