"""Evaluation in a worker process: a hung kernel, an illegal memory access or an out-of-memory kills
only the worker. The result records the stage reached and the error; the next evaluation starts a
fresh worker.

Protocol: one JSON object a line. The parent writes a request {"plan", "workload" (a path),
"profile" (the EvaluatorProfile as a dict), "cache_dir", "entry", "refresh_baselines"[,
"carried_baselines"]} to the worker's stdin; the worker answers with {"stage": ...} lines as it
enters each stage and ends with {"result": EvalResult.to_dict()}. `entry` ("module:function")
names the function that evaluates: `conjugate.evaluate.pipeline:evaluate` unless a caller says
otherwise; it is called as
`entry(plan, workload, profile, cache_dir=, on_stage=, session=[, refresh_baselines=True]
[, carried_baselines=...])`, with the one EvaluationSession the worker keeps for all its evaluations.

    python -m conjugate.evaluate.worker     # the worker's own entry point
"""
from __future__ import annotations

import importlib
import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from conjugate.errors import PlanError
from conjugate.evaluate.evaluators import EvaluatorProfile
from conjugate.evaluate.parent_watch import exit_with_parent, parent_env
from conjugate.evaluate.result import EvalResult, Stage, Status
from conjugate.plan import Plan, validate_plan

DEFAULT_ENTRY = "conjugate.evaluate.pipeline:evaluate"


class IsolatedEvaluator:
    """Evaluates plans in a worker subprocess, one at a time, each under a time limit."""

    def __init__(self, profile: EvaluatorProfile, time_limit_s: float | None = None, cache_dir: Path | None = None,
                 entry: str = DEFAULT_ENTRY, env: dict[str, str] | None = None):
        self.profile, self.entry, self.cache_dir = profile, entry, cache_dir
        self.time_limit_s = time_limit_s or profile.time_limit_s
        self.env = {**os.environ, **(env or {})}
        self.carried: dict | None = None  # baselines a resumed search carries from an earlier process (pipeline)
        self._worker: subprocess.Popen | None = None
        self.restarts = 0

    def _start(self) -> subprocess.Popen:
        if self._worker is None or self._worker.poll() is not None:
            self._stderr = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: a chatty worker never blocks
            self._worker = subprocess.Popen([sys.executable, "-m", "conjugate.evaluate.worker"], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=self._stderr, text=True, bufsize=1,
                                            env=parent_env(self.env))
        return self._worker

    def evaluate(self, plan: Plan | dict, workload_path: str | Path, refresh_baselines: bool = False,
                 on_stage=None) -> EvalResult:
        """One plan's EvalResult; `refresh_baselines` re-measures the baselines (GPU); `on_stage` hears
        each stage as the worker enters it. The plan crosses to the worker as a dict; the worker
        validates it."""
        worker = self._start()
        request = {"plan": plan.to_dict() if isinstance(plan, Plan) else plan, "workload": str(workload_path), "profile": self.profile.to_dict(),
                   "cache_dir": str(self.cache_dir) if self.cache_dir else None, "entry": self.entry,
                   "refresh_baselines": refresh_baselines}
        if self.carried:
            request["carried_baselines"] = self.carried
        start, stage = time.monotonic(), Stage.SETUP
        try:
            worker.stdin.write(json.dumps(request) + "\n")
            worker.stdin.flush()
        except BrokenPipeError:
            return self._lost(plan, workload_path, stage, start, Status.CRASHED, "the worker exited before the request")
        selector = selectors.DefaultSelector()
        selector.register(worker.stdout, selectors.EVENT_READ)
        pending = b""
        while True:
            left = self.time_limit_s - (time.monotonic() - start)
            if left <= 0 or not selector.select(timeout=left):
                return self._lost(plan, workload_path, stage, start, Status.TIMEOUT,
                                  f"no result within the time limit of {self.time_limit_s:g} s")
            chunk = os.read(worker.stdout.fileno(), 1 << 16)  # unbuffered: select sees what is unread
            if not chunk:  # the worker died: a crash, an abort, the OOM killer
                return self._lost(plan, workload_path, stage, start, Status.CRASHED, self._exit_reason())
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                message = json.loads(line)
                if "result" in message:
                    result = EvalResult.from_dict(message["result"])
                    if result.status is Status.ERROR:  # an unforeseen failure may leave the GPU unusable
                        self._retire()
                    return result
                if "stage" in message:
                    stage = Stage(message["stage"])
                    if on_stage is not None:
                        on_stage(str(stage))

    def _exit_reason(self) -> str:
        code = self._worker.wait()
        self._stderr.seek(0)
        return f"worker exited with status {code}" + log_tail(self._stderr.read())

    def _retire(self) -> None:
        """Kill the worker; the next evaluation starts a fresh one."""
        if self._worker is not None and self._worker.poll() is None:
            self._worker.kill()
            self._worker.wait()
        self._worker = None
        self.restarts += 1

    def _lost(self, plan: Plan | dict, workload_path, stage: Stage, start: float, status: Status, error: str) -> EvalResult:
        """The worker is gone or hung: kill it, restart on the next call, report what was seen."""
        self._retire()
        return EvalResult(plan_hash=_plan_hash(plan), workload=Path(workload_path).stem, evaluator=self.profile.name,
                          stage=stage, status=status, modeled=self.profile.kind != "gpu",
                          wall_s=round(time.monotonic() - start, 3), error=error)

    def close(self) -> None:
        if self._worker is not None and self._worker.poll() is None:
            self._worker.stdin.close()
            try:
                self._worker.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._worker.kill()
        self._worker = None

    def __enter__(self) -> "IsolatedEvaluator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def log_tail(text: str, lines: int = 3) -> str:
    """": a | b | c": the last lines of a process's log that are not warnings ("" when none)."""
    tail = [line.strip() for line in text.strip().splitlines() if line.strip() and "Warning" not in line][-lines:]
    return f": {' | '.join(tail)}" if tail else ""


def _plan_hash(plan: Plan | dict) -> str:
    """The plan's hash, for a result the worker could not give; "" for a dict that is no valid plan."""
    if isinstance(plan, Plan):
        return plan.hash
    try:
        return validate_plan(plan).hash
    except PlanError:
        return ""


def _serve() -> None:
    """The worker's loop: read requests, evaluate, write stage lines and the result."""
    from conjugate.evaluate.session import EvaluationSession
    from conjugate.workload import load_workload

    exit_with_parent()  # a search killed outright leaves no worker compiling or timing on
    protocol = os.fdopen(os.dup(1), "w")  # the parent reads this; anything else printed goes to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def say(message: dict) -> None:
        protocol.write(json.dumps(message) + "\n")
        protocol.flush()

    session = EvaluationSession()  # what this worker's evaluations share: prepared rounds, baselines, rates
    for line in sys.stdin:
        request = json.loads(line)
        module, name = request["entry"].split(":")
        evaluate = getattr(importlib.import_module(module), name)
        cache_dir = Path(request["cache_dir"]) if request["cache_dir"] else None
        profile = EvaluatorProfile.from_dict(request["profile"])
        extra = {"refresh_baselines": True} if request.get("refresh_baselines") else {}
        if request.get("carried_baselines"):
            extra["carried_baselines"] = request["carried_baselines"]
        result = evaluate(request["plan"], load_workload(request["workload"]), profile,
                          cache_dir=cache_dir, on_stage=lambda stage: say({"stage": stage}), session=session, **extra)
        say({"result": result.to_dict()})


if __name__ == "__main__":
    _serve()
