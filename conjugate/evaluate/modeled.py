"""The modeled evaluator, for machines without a GPU: timing is the analytical cost model's
(analytical.py), and every result says `modeled`. Correctness runs the compiled round against the
reference (under the Triton interpreter where no GPU is) for models up to the profile's
`max_params`; larger rounds are compiled on shape-only weights, so their lowering and kernel
generation are still checked, and the result says the numerical check was skipped.
"""
from __future__ import annotations

from pathlib import Path

import torch

from conjugate.compiler.buffers import PreparedWeights
from conjugate.compiler.round import CompiledRound, compile_round
from conjugate.evaluate.analytical import AnalyticalModel, launch_programs, model_round
from conjugate.evaluate.correctness import ReferenceChecker
from conjugate.evaluate.harness import Timed, speedups
from conjugate.evaluate.ledger import Ledger
from conjugate.evaluate.evaluators import EvaluatorProfile
from conjugate.evaluate.result import Baseline, Metrics
from conjugate.evaluate.rounds import checked_run, round_inputs
from conjugate.evaluate.session import EvaluationSession, RoundSetup
from conjugate.graph import build_graph, graph_totals
from conjugate.models.weights import meta_weights
from conjugate.paths import BASELINE_PLANS, shipped_plan
from conjugate.plan import load_plan
from conjugate.roles import Model
from conjugate.workload import Workload

CHECK_CACHE_BYTES = 2 << 30  # KV caches past this are not checked numerically on a CPU (the reference copies them)


class ModeledHarness:
    modeled = True
    baselines_wanted = BASELINE_PLANS  # the conventional baseline needs a GPU

    def __init__(self, profile: EvaluatorProfile, cache_dir: Path | None, session: EvaluationSession):
        self.profile, self.cache_dir = profile, cache_dir
        self.model = AnalyticalModel(profile.model)

    def unavailable(self) -> str:
        return ""

    def prepare(self, workload: Workload) -> RoundSetup:
        w, graph = workload, build_graph(workload)
        params = w.draft.num_params() + w.target.num_params()
        if params > self.profile.max_check_params:
            return RoundSetup(w, graph, _shapes_only(w), skipped=f"{params:.3g} parameters: over the interpreter's "
                              f"limit of {self.profile.max_check_params:.3g} in {self.profile.source}")
        if w.cache_bytes() > CHECK_CACHE_BYTES:
            return RoundSetup(w, graph, _shapes_only(w), skipped=f"KV caches of {w.cache_bytes() / 2**30:.3g} GiB: "
                              f"over the {CHECK_CACHE_BYTES >> 30} GiB the check holds in memory")
        device = "cuda" if torch.cuda.is_available() else "cpu"  # kernels need GPU tensors where a GPU is
        draft, target = w.weights(Model.DRAFT, device), w.weights(Model.TARGET, device)
        inputs = round_inputs(w, draft, target)
        return RoundSetup(w, graph, (PreparedWeights(draft), PreparedWeights(target)), inputs,
                          check=ReferenceChecker(draft, target, inputs, w.dtype))

    def ready(self, compiled: CompiledRound, setup: RoundSetup) -> None:
        pass

    def check(self, compiled: CompiledRound, setup: RoundSetup) -> dict:
        if setup.check is None:
            return {"skipped": setup.skipped}
        return checked_run(compiled, setup.inputs, setup.check).to_dict()

    def time(self, compiled: CompiledRound, setup: RoundSetup) -> Timed:
        latency_ms, estimates = model_round(self.model, setup.graph, compiled.schedule, launch_programs(compiled))
        parts = {f.launch: f.parts for f in compiled.feedback()}
        verdicts = tuple(e.verdict(parts[e.index]) for e in estimates if len(e.alone_us) > 1)
        ledger = Ledger.modeled(compiled, setup.graph, [e.us for e in estimates], latency_ms * 1e3,
                                self.profile.model.bandwidth_gbs).condensed(modeled=True)
        return Timed(latency_ms, verdicts, len(compiled.schedule.launches), ledger=ledger)

    def baselines(self, setup: RoundSetup, names: tuple[str, ...]) -> dict[str, Baseline]:
        """This project's baseline plans, compiled on shape-only weights and modeled the same way."""
        out = {}
        for name in names:
            compiled = compile_round(load_plan(shipped_plan(name)), setup.workload, *_shapes_only(setup.workload),
                                     cache_dir=self.cache_dir, graph=setup.graph)
            latency_ms, _ = model_round(self.model, setup.graph, compiled.schedule, launch_programs(compiled))
            out[name] = Baseline("ok", latency_ms, modeled=True)
        return out

    def carried(self, carried: dict, workload: Workload) -> dict[str, Baseline]:
        return {}  # modeled in moments: nothing worth carrying

    def metrics(self, timed: Timed, setup: RoundSetup, baselines: dict[str, Baseline]) -> Metrics:
        c, nbytes, latency = self.profile.model, graph_totals(setup.graph)["bytes"], timed.latency_ms
        floor_ms = nbytes / (c.bandwidth_gbs * 1e9) * 1e3
        return Metrics(latency_ms=latency, floor_ms=floor_ms, floor_ratio=latency / floor_ms,
                       bandwidth_gbs=nbytes / (latency * 1e-3) / 1e9, launches=timed.launches, device=c.gpu,
                       sms=c.sms, baselines=baselines, speedups=speedups(baselines, latency), ledger=timed.ledger)


def _shapes_only(w: Workload) -> tuple[PreparedWeights, PreparedWeights]:
    return PreparedWeights(meta_weights(w.draft, w.torch_dtype)), PreparedWeights(meta_weights(w.target, w.torch_dtype))
