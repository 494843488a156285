"""One search on several GPUs of a host: `conjugate search ... --gpus 0,1,2`.

This process searches on the first GPU listed; for each other GPU a process of its own joins the
same run (`conjugate search --resume DB --run ID`, with CUDA_VISIBLE_DEVICES naming its GPU), so the
processes share one tree and one budget through the database (each evaluation is claimed once).
A helper's output goes to a log file beside the database; when this process ends, so do they.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from conjugate.errors import ConjugateError


def parse_gpus(text: str) -> list[str]:
    """'0,1,3' -> ['0', '1', '3']: distinct non-negative device indices, or a one-line error."""
    gpus = [g.strip() for g in text.split(",")]
    if not all(g.isdigit() for g in gpus) or len(set(gpus)) != len(gpus):
        raise ConjugateError(f"--gpus: {text!r} is not a comma-separated list of distinct GPU indices (e.g. 0,1)")
    return gpus


def pin_this_process(gpu: str) -> None:
    """This process (and the evaluation worker it starts) sees only `gpu`. Before any CUDA use."""
    os.environ["CUDA_VISIBLE_DEVICES"] = gpu


class Helpers:
    """Processes joining run `run_id` of database `db`, one per GPU; a context that waits for them
    (terminating them if this process stops early)."""

    def __init__(self, db: str, run_id: int, gpus: list[str], log_dir: Path, deadline: float | None,
                 extra: list[str]):
        self.db, self.run_id, self.gpus, self.log_dir = db, run_id, gpus, log_dir
        self.deadline, self.extra = deadline, extra
        self.procs: list[tuple[str, subprocess.Popen, Path]] = []

    def log_path(self, gpu: str) -> Path:
        return self.log_dir / f"search-run{self.run_id}-gpu{gpu}.log"

    def __enter__(self) -> "Helpers":
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for gpu in self.gpus:
            argv = [sys.executable, "-m", "conjugate", "search", "--resume", self.db, "--run", str(self.run_id)]
            if self.deadline is not None:
                argv += ["--time", f"{max(self.deadline - time.monotonic(), 1.0):.0f}s"]
            log = self.log_path(gpu)
            with open(log, "w") as sink:
                proc = subprocess.Popen(argv + self.extra, stdout=sink, stderr=subprocess.STDOUT,
                                        env={**os.environ, "CUDA_VISIBLE_DEVICES": gpu})
            self.procs.append((gpu, proc, log))
        return self

    def __exit__(self, kind, *rest) -> None:
        for _, proc, _ in self.procs:
            if kind is not None:  # this process stopped early: so do the helpers
                proc.terminate()
            proc.wait()

    def report(self) -> list[str]:
        """One line per helper: its GPU, exit status and log."""
        return [f"GPU {gpu}: helper exited {proc.returncode}; its log: {log}" for gpu, proc, log in self.procs]
