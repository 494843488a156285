"""The conventional baselines measured in a process of their own (`[timing] baselines_apart`).

Once a CUDA graph holding some of torch's kernels (its softmax, `where`, cuDNN or math SDPA: the
conventional baseline's graphs hold them) has been captured, every CUDA graph of the process replays
about 0.2 us per launch slower on the H200 (lab/experiments/graph_step.py). A plan's round served by this
project never shares a process with those graphs; measured beside them, it pays for them. Apart,
each side is timed in the state it runs in: the conventional round with its own graphs (as a torch
serving engine runs it), the plans and the `sequential` baseline without them.

The child prepares the workload as the evaluator does (same seeded weights, inputs and reference:
the first evaluation of a workload loads its weights twice, once in each process), measures
`conventional` and `streams`, and writes them as JSON to a file the parent names; a child that fails
or runs out of time gives error baselines that say why, and the evaluation goes on. The child has
CHILD_SHARE of the profile's time limit (the evaluation that waits for it has the whole limit), and
exits as soon as its parent is gone (a worker killed at its time limit leaves no child running).

    python -m conjugate.evaluate.baselines.apart_child     # the child: one JSON request on stdin
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from conjugate.evaluate.evaluators import EvaluatorProfile
from conjugate.evaluate.parent_watch import parent_env
from conjugate.evaluate.result import Baseline
from conjugate.evaluate.worker import log_tail
from conjugate.workload import Workload

CHILD = "conjugate.evaluate.baselines.apart_child"
DEFAULT_ENTRY = f"{CHILD}:conventional_alone"
NAMES = ("conventional", "streams")
CHILD_SHARE = 0.8  # of the profile's time limit: the parent's evaluation must finish inside all of it


def measure_apart(workload: Workload, profile: EvaluatorProfile, cache_dir: Path | None,
                  entry: str = DEFAULT_ENTRY, env: dict[str, str] | None = None) -> dict[str, Baseline]:
    """name -> Baseline for the conventional baselines the profile wants, measured in a child process
    (`entry`: "module:function", called as entry(workload, profile, cache_dir))."""
    wanted = [n for n in NAMES if n in profile.timing.baselines]
    limit_s = CHILD_SHARE * profile.time_limit_s
    with tempfile.TemporaryDirectory(prefix="conjugate-baselines-") as scratch:
        out = Path(scratch) / "baselines.json"
        request = {"workload": workload.to_dict(), "profile": profile.to_dict(), "entry": entry, "out": str(out),
                   "cache_dir": str(cache_dir) if cache_dir else None}
        with tempfile.TemporaryFile(mode="w+") as log:  # a file, not a pipe: a chatty child never blocks
            try:
                done = subprocess.run([sys.executable, "-m", CHILD],
                                      input=json.dumps(request), stdout=log, stderr=subprocess.STDOUT, text=True,
                                      timeout=limit_s, env=parent_env({**os.environ, **(env or {})}))
                problem = "" if done.returncode == 0 else f"exited with status {done.returncode}"
            except subprocess.TimeoutExpired:
                problem = f"ran past its time limit ({limit_s:g} s, {CHILD_SHARE:.0%} of the profile's)"
            log.seek(0)
            tail = log_tail(log.read())
        if not problem:
            try:
                measured = json.loads(out.read_text())
                return {name: Baseline.from_dict(measured[name]) for name in wanted}
            except (OSError, ValueError, KeyError, TypeError) as error:
                problem = f"wrote no readable result ({type(error).__name__}: {error})"
    why = f"the conventional baselines' own process {problem}" + tail[:400]
    return {name: Baseline("error", error=why) for name in wanted}
