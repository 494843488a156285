"""An IsolatedEvaluator whose worker process outlives it, for tests that run many short searches in-process.

Each `conjugate search` makes an IsolatedEvaluator and closes it at the end, so each search starts a
worker process: some 4 s of CPU (torch, triton, the first round's lazy imports) against about 0.1 s an
evaluation on the fast profile. Where a test is about the search and not the worker's lifetime, the
next evaluator made in the same environment adopts the worker the last one left: every evaluation
still crosses the same protocol to the same worker code. The worker keeps its EvaluationSession across
searches, as it does across the evaluations of one search; its setups and baselines are keyed by
workload and profile, so a search sees what a fresh worker would compute (the modeled baselines are a
function of both). The worker lifecycle itself (started per search, closed at its end, restarted after a
crash or a timeout) stays tested by the tests that do not use this: tests/test_worker.py, and the
searches run in subprocesses or before the `shared_worker` fixture.
"""
from __future__ import annotations

import subprocess

from conjugate.evaluate.worker import IsolatedEvaluator


class SharedWorkerEvaluator(IsolatedEvaluator):
    _idle: dict[tuple, tuple] = {}  # environment -> (worker process, its stderr file), waiting to be adopted

    def _key(self) -> tuple:
        return tuple(sorted((k, v) for k, v in self.env.items() if k != "PYTEST_CURRENT_TEST"))  # pytest's, per test

    def _start(self) -> subprocess.Popen:
        if self._worker is None:
            idle = self._idle.pop(self._key(), None)
            if idle is not None and idle[0].poll() is None:
                self._worker, self._stderr = idle
        return super()._start()

    def close(self) -> None:
        if self._worker is not None and self._worker.poll() is None and self._key() not in self._idle:
            self._idle[self._key()] = (self._worker, self._stderr)  # left for the next evaluator
            self._worker = None
        super().close()

    @classmethod
    def close_idle(cls) -> None:
        while cls._idle:
            worker, _ = cls._idle.popitem()[1]
            worker.stdin.close()
            try:
                worker.wait(timeout=5)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
