"""What a GPU evaluator keeps between evaluations of one workload, inside one worker process:
the weights on the GPU and their compile-time re-layouts, the inputs correctness is checked on,
fresh random inputs for timing, the reference rounds already computed, the device's measured copy
bandwidth and matmul rate (the floor) and the baselines, measured once and re-measured on request.

One session is kept at a time (a new workload replaces it: weights of two 8B targets do not both fit
next to their fp32 references).
"""
from __future__ import annotations

from pathlib import Path

import torch

from conjugate.compiler.buffers import PreparedWeights
from conjugate.compiler.round import device_name
from conjugate.evaluate.correctness import ReferenceChecker, tolerance_for
from conjugate.evaluate.profile import EvaluatorProfile
from conjugate.evaluate.timing import copy_bandwidth_gbs, matmul_tflops
from conjugate.graph import build_graph, graph_totals
from conjugate.models import make_round_inputs
from conjugate.workload import Workload

_DEVICE_RATES: dict[str, dict[str, float]] = {}  # device name -> measured rates, once per process


class GpuSession:
    def __init__(self, workload: Workload, profile: EvaluatorProfile, cache_dir: Path | None):
        self.workload, self.profile, self.cache_dir = workload, profile, cache_dir
        self.device = torch.device("cuda")
        self.gpu = device_name(self.device)
        w = workload
        self.draft, self.target = w.weights("draft", self.device), w.weights("target", self.device)
        self.prepared = (PreparedWeights(self.draft), PreparedWeights(self.target))
        self.inputs = self._inputs(w.seed)
        self.timing_inputs = self._inputs(w.seed + 1)  # fresh random data, not what was checked
        self.check = ReferenceChecker(self.draft, self.target, self.inputs, w.dtype,
                                      tolerance_for(w.dtype, profile.tolerances))
        self.graph = build_graph(w)
        self.baselines: dict[str, dict] = {}

    def _inputs(self, seed: int):
        w = self.workload
        return make_round_inputs(self.draft, self.target, k=w.k, draft_batch=w.draft_batch,
                                 target_batch=w.target_batch, context=w.context, seed=seed, kv_init=w.kv_init)

    def rates(self) -> dict[str, float]:
        """The device's copy bandwidth (GB/s) and bf16 matmul rate (TFLOP/s), measured once."""
        if self.gpu not in _DEVICE_RATES:
            _DEVICE_RATES[self.gpu] = {"copy_bandwidth_gbs": copy_bandwidth_gbs(self.device),
                                       "matmul_tflops": matmul_tflops(self.device)}
        return _DEVICE_RATES[self.gpu]

    def floor(self) -> dict[str, float]:
        """The round's floor: its bytes at copy bandwidth, its FLOPs at the matmul rate, whichever is longer."""
        totals, rates = graph_totals(self.graph), self.rates()
        memory_ms = totals["bytes"] / (rates["copy_bandwidth_gbs"] * 1e9) * 1e3
        compute_ms = totals["flops"] / (rates["matmul_tflops"] * 1e12) * 1e3
        return {"floor_ms": max(memory_ms, compute_ms), "floor_memory_ms": memory_ms, "floor_compute_ms": compute_ms,
                "bytes": totals["bytes"], "flops": totals["flops"], **rates}


_CURRENT: dict[str, GpuSession] = {}


def session_for(workload: Workload, profile: EvaluatorProfile, cache_dir: Path | None) -> GpuSession:
    """This process's session for the workload (and profile), made on first use."""
    key = repr((workload.to_dict(), {k: v for k, v in profile.to_dict().items() if k != "source"}))
    if key not in _CURRENT:
        _CURRENT.clear()
        torch.cuda.empty_cache()
        _CURRENT[key] = GpuSession(workload, profile, cache_dir)
    return _CURRENT[key]
