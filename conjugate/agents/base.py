"""The proposer interface: given a node of the plan tree and what is known about it, propose edits.

An edit is an RFC 6902 JSON Patch over the plan (conjugate/plan/patch.py applies it atomically),
with a one-line rationale and an edit kind (one of EDIT_KINDS: the knob family it edits) that the
search keeps statistics for. Proposers never evaluate anything and never raise on bad model output: a reply that does not
validate is data (see agents/llm.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

from conjugate.errors import ConjugateError
from conjugate.evaluate.result import EvalResult
from conjugate.plan.schema import Plan

# one edit kind per knob family of the plan, so the search's statistics per kind compare like with like
EDIT_KINDS = ("tiles", "fusions", "reduce", "pdl", "streams", "form", "streamed", "cross", "other")


@dataclass(frozen=True)
class Proposal:
    patch: list[dict]  # RFC 6902 operations on the plan's JSON
    rationale: str  # one line: why this edit should help
    kind: str = "other"  # one of EDIT_KINDS
    prior: float | None = None  # the proposer's confidence in (0, 1]; None: let the search decide


@dataclass(frozen=True)
class NodeContext:
    """What a proposer sees about the node it expands: its plan, its result (typed) and the
    search's history around it."""
    plan: Plan | dict  # the search's validated Plan; a dict from elsewhere is validated by the proposer
    plan_hash: str
    workload: dict  # Workload.to_dict(), plus "family" (the lessons' key)
    evaluator: str  # the evaluator profile's name (e.g. analytical: every latency is modeled)
    device: str  # the GPU measured on, or the one the analytical model stands for
    sms: int  # that GPU's multiprocessors
    result: EvalResult | None = None  # None if not evaluated
    baselines: dict = field(default_factory=dict)  # name -> latency_ms
    best: list[dict] = field(default_factory=list)  # best plans so far: {"plan", "latency_ms", "speedups"}
    lessons: list[str] = field(default_factory=list)  # short lessons of earlier runs: this evaluator and family
    edit_stats: dict = field(default_factory=dict)  # edit kind -> {"n": count, "mean_gain": float}
    tried: list[dict] = field(default_factory=list)  # this node's children so far: {"patch", "kind", "status", "reward"}
    failures: list[dict] = field(default_factory=list)  # recent failed plans' errors: {"patch", "status", "error"}
    deadline: float | None = None  # time.monotonic() at which the search stops; None: no time limit


class ProposerUnavailable(ConjugateError):
    """The proposer gave no answer: its service failed past retrying, or the search's time ran out.
    Unlike an empty proposal list, it says nothing about the node."""


class Proposer(Protocol):
    """Anything that proposes edits. `name` is recorded with every edit it made."""
    name: str

    def propose(self, context: NodeContext, n: int) -> list[Proposal]:
        """Up to `n` distinct edits of `context.plan`. May return fewer (or none)."""
        ...


LLMCallLog = Callable[[dict], None]  # receives one LLM call's record (see agents/llm.py) to persist
