"""What differs between the two kinds of evaluator, behind one narrow interface: how a workload's
round is prepared, how a compiled round is checked, and how it is timed and compared with the
baselines. `MeasuredHarness` (measured.py) does it on this process's GPU; `ModeledHarness`
(modeled.py) checks under the Triton interpreter and times with the analytical cost model. The
pipeline (pipeline.py) sequences the stages the same way for both.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from conjugate.compiler.round import CompiledRound
from conjugate.evaluate.result import Baseline, LedgerSummary, Metrics, Verdict
from conjugate.evaluate.session import RoundSetup
from conjugate.workload import Workload


@dataclass(frozen=True)
class Timed:
    """A plan's round timed (or modeled), with the verdicts of its multi-part launches."""
    latency_ms: float
    verdicts: tuple[Verdict, ...]
    launches: int
    p20_ms: float | None = None
    p80_ms: float | None = None
    replays: int | None = None
    seconds: dict[str, float] = field(default_factory=dict)  # "replays", "verdicts", "ledger": how long each took
    ledger: LedgerSummary | None = None  # where the round's time goes


class Harness(Protocol):
    modeled: bool
    baselines_wanted: tuple[str, ...]

    def unavailable(self) -> str:
        """Why this machine cannot evaluate with this profile; "" when it can."""

    def prepare(self, workload: Workload) -> RoundSetup:
        """The workload's round, ready for the plans evaluated on it."""

    def ready(self, compiled: CompiledRound, setup: RoundSetup) -> None:
        """Anything still to compile before the round is checked (raises CompileError)."""

    def check(self, compiled: CompiledRound, setup: RoundSetup) -> dict:
        """The correctness report: "ok" false when the round is wrong, "skipped" when not checked."""

    def time(self, compiled: CompiledRound, setup: RoundSetup) -> Timed:
        """The round's latency and its shared launches' verdicts."""

    def baselines(self, setup: RoundSetup, names: tuple[str, ...]) -> dict[str, Baseline]:
        """The baselines named (of `baselines_wanted`), obtained afresh."""

    def carried(self, carried: dict, workload: Workload) -> dict[str, Baseline]:
        """Those of the baselines an earlier process of the search run measured that stand here
        (baselines.carried_baselines); none for a modeled evaluator."""

    def metrics(self, timed: Timed, setup: RoundSetup, baselines: dict[str, Baseline]) -> Metrics:
        """The timed round against its floor and the baselines."""


def speedups(baselines: dict[str, Baseline], latency_ms: float) -> dict[str, float]:
    """Baseline name -> its latency over the plan's, for every baseline with a latency."""
    return {name: b.latency_ms / latency_ms for name, b in baselines.items() if b.latency_ms}

