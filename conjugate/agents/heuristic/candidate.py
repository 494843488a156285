"""What a heuristic edit is (Candidate), and what a node's result says that several knob families read:
the parts of each launch, the parts a compile failure blames, the time ledger's losses and the
balance of the two streams. Every patch is RFC 6902 over the canonical plan; generators do not
validate (the proposer's freshness filter does) and give each candidate a base score in (0, 1]:
higher comes first."""
from __future__ import annotations

from dataclasses import dataclass

from conjugate.compiler.feedback import PartRef
from conjugate.evaluate.result import EvalResult, KindLoss, LedgerSummary
from conjugate.plan.schema import MODEL_KEYS
from conjugate.plan.tiles import FAMILY_OF
from conjugate.roles import Model


@dataclass(frozen=True)
class Candidate:
    kind: str  # one of EDIT_KINDS: the knob family the patch edits
    patch: list
    rationale: str
    score: float


Launches = dict[int, tuple[PartRef, ...]]  # launch index -> its parts


def launch_parts(result: EvalResult | None) -> Launches:
    """Launch index -> its parts (with their programs), from the compiler feedback of every launch."""
    return {f.launch: f.parts for f in result.feedback} if result else {}


def failed_parts(result: EvalResult) -> tuple[tuple[PartRef, ...], PartRef | None]:
    """(parts a compile failure blames, the head part of its launch); nothing for other failures."""
    failure = result.compile_failure
    if failure is None or not failure.parts:
        return (), None
    return failure.failed, failure.parts[0]


def ledger_of(result: EvalResult | None) -> LedgerSummary | None:
    return result.metrics.ledger if result is not None and result.metrics is not None else None


def loss_shares(ledger: LedgerSummary | None) -> list[tuple[str, str, float, KindLoss]]:
    """(model, op kind, share of the ledger's listed loss, its entry) for every part of every listed kind."""
    if ledger is None:
        return []
    total = sum(max(k.loss_ms, 0.0) for k in ledger.kinds) or 1.0
    return [(model, kind, max(k.loss_ms, 0.0) / total, k) for k in ledger.kinds for model, kind in k.parts
            if model in MODEL_KEYS and kind in FAMILY_OF]


def imbalance(ledger: LedgerSummary | None) -> tuple[str, str, float] | None:
    """(busier model, the other, busier stream's busy time over the other's) from a two-stream
    ledger; None without one."""
    busy = ledger.streams if ledger is not None else {}
    if len(busy) != 2 or not set(busy) <= set(MODEL_KEYS) or min(busy.values()) <= 0:
        return None
    busier = max(busy, key=busy.get)
    other = next(m for m in MODEL_KEYS if m != busier)
    return busier, other, busy[busier] / busy[other]


def fill_by_kind(parts: Launches) -> dict[str, int]:
    """Target kind -> the fewest programs of a launch holding it (a shared launch's parts fill it
    together)."""
    fill: dict[str, int] = {}
    for launch in parts.values():
        total = sum(p.programs or 0 for p in launch)
        for p in launch:
            if p.model is Model.TARGET and p.programs is not None:
                fill[p.kind] = min(fill.get(p.kind, total), total)
    return fill
