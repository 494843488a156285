"""What an evaluating process keeps between evaluations: an explicit session, owned by its caller
(the worker makes one; `evaluate` without one makes a fresh one), in place of process-wide caches.

Per kind of evaluator (measured, modeled) it holds the current workload's RoundSetup (weights and
their compile-time re-layouts, the inputs correctness is checked on, fresh inputs for timing, the
reference checker), that workload's baselines, measured or modeled once and again on request, and
the times of its launches measured for verdicts; and each device's measured copy bandwidth and
matmul rate. One workload per kind at a time: a new
one replaces it (weights of two 8B targets do not both fit next to their fp32 references).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import networkx as nx
import torch

from conjugate.compiler.buffers import PreparedWeights
from conjugate.evaluate.correctness import ReferenceChecker
from conjugate.evaluate.result import Baseline
from conjugate.evaluate.timing import copy_bandwidth_gbs, matmul_tflops
from conjugate.models.reference import RoundInputs
from conjugate.workload import Workload


@dataclass(frozen=True)
class RoundSetup:
    """One workload's round, prepared once for the evaluations of its plans."""
    workload: Workload
    graph: nx.DiGraph
    weights: tuple[PreparedWeights, PreparedWeights]  # draft, target
    inputs: RoundInputs | None = None  # what correctness is checked on; None: not run (shape-only weights)
    timing_inputs: RoundInputs | None = None  # fresh random inputs, not what was checked (measured only)
    check: ReferenceChecker | None = None
    skipped: str = ""  # why the round is not checked numerically, where it is not


@dataclass
class _Current:
    key: str
    setup: RoundSetup
    baselines: dict[str, Baseline] = field(default_factory=dict)
    launch_times: dict[tuple, tuple] = field(default_factory=dict)  # measured.launch_verdicts' known times


class EvaluationSession:
    """State shared by the evaluations of one process; not for use from two threads at once."""

    def __init__(self) -> None:
        self._current: dict[str, _Current] = {}  # evaluator kind -> its current workload
        self._rates: dict[str, dict[str, float]] = {}  # device name -> measured rates

    def setup(self, kind: str, key: str, prepare: Callable[[], RoundSetup]) -> RoundSetup:
        """The current setup of this kind for `key` (workload and profile), prepared on first use."""
        if kind not in self._current or self._current[kind].key != key:
            self._current.pop(kind, None)  # its weights and references go before the new ones arrive
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            self._current[kind] = _Current(key, prepare())
        return self._current[kind].setup

    def baselines(self, kind: str, wanted: tuple[str, ...], refresh: bool,
                  obtain: Callable[[], dict[str, Baseline]]) -> dict[str, Baseline]:
        """The current workload's baselines named `wanted`, obtained once (again when `refresh`)."""
        current = self._current[kind]
        if refresh or not set(wanted) <= set(current.baselines):
            current.baselines = {}
            current.baselines = obtain()
        return {name: current.baselines[name] for name in wanted}

    def launch_times(self, kind: str) -> dict[tuple, tuple]:
        """Times of the current workload's launches measured for verdicts, kept for later plans."""
        return self._current[kind].launch_times

    def device_rates(self, device: torch.device) -> dict[str, float]:
        """The device's copy bandwidth (GB/s) and bf16 matmul rate (TFLOP/s), measured once."""
        name = torch.cuda.get_device_name(device)
        if name not in self._rates:
            self._rates[name] = {"copy_bandwidth_gbs": copy_bandwidth_gbs(device),
                                 "matmul_tflops": matmul_tflops(device)}
        return self._rates[name]
