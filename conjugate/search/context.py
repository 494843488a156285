"""What the proposer is told about a node: its plan and evaluation, the GPU, the baselines, the best
plans so far, the edits already tried from it, recent failures, and what earlier runs with this
evaluator learned (lessons, per-edit-kind statistics): on this model family first; a family with
few lessons of its own hears those of other families, and one with no statistics of its own gets
the statistics of every family."""
from __future__ import annotations

from conjugate.agents.base import NodeContext
from conjugate.evaluate.result import EvalResult
from conjugate.plan import Plan
from conjugate.search.store import NodeRecord, RunRecord, Store

FALLBACK_SMS = 132  # an H100/H200's multiprocessors: a GPU profile's count until a measurement names its GPU


def family_of(workload: dict) -> str:
    """The lessons' key for a workload: its draft and target model families."""
    return f"{workload['draft']['family']}->{workload['target']['family']}"


def device_of(profile) -> tuple[str, int]:
    """(GPU name, multiprocessors) an evaluator profile stands for before anything is measured: the
    analytical model's GPU, or a GPU profile's device pattern with FALLBACK_SMS."""
    if profile.model is not None:
        return profile.model.gpu, profile.model.sms
    return profile.device or "unknown GPU", FALLBACK_SMS


class ContextBuilder:
    def __init__(self, store: Store, run: RunRecord, device: str, sms: int):
        """`device`, `sms`: the GPU the evaluator stands for, until a result names the one measured on."""
        self.store, self.run, self.device, self.sms = store, run, device, sms
        self.family = family_of(run.workload)

    def build(self, node: NodeRecord, plan: Plan, results: dict[str, EvalResult], nodes: list[NodeRecord]) -> NodeContext:
        """`plan`: the node's, validated; `results`: plan hash -> result of every evaluated node of the run;
        `nodes`: the run's."""
        children = [n for n in nodes if n.parent_id == node.id]
        device, sms = _measured_device(results) or (self.device, self.sms)
        return NodeContext(
            plan=plan, plan_hash=plan.hash, workload=self.run.workload, evaluator=self.run.evaluator,
            device=device, sms=sms, result=results.get(node.plan_hash), baselines=_baselines(results),
            best=_best(results, nodes), lessons=self._lessons(),
            edit_stats=self.store.edit_stats(self.run.evaluator, self.family)
            or self.store.edit_stats(self.run.evaluator, None),
            tried=[{"patch": c.edit, "kind": c.edit_kind, "status": _status(results.get(c.plan_hash)),
                    "reward": c.best_reward} for c in children],
            failures=_failures(results, nodes))


    def _lessons(self, limit: int = 10) -> list[str]:
        own = self.store.lessons(self.run.evaluator, self.family, limit)
        if len(own) >= limit:
            return own
        return own + self.store.lessons_elsewhere(self.run.evaluator, self.family, limit - len(own))


def _measured_device(results: dict[str, EvalResult]) -> tuple[str, int] | None:
    return next(((r.metrics.device, r.metrics.sms) for r in results.values() if r.metrics), None)


def _status(result: EvalResult | None) -> str:
    return str(result.status) if result else "new"


def _baselines(results: dict[str, EvalResult]) -> dict[str, float]:
    for r in results.values():
        if r.metrics and r.metrics.baselines:
            return {name: b.latency_ms for name, b in r.metrics.baselines.items() if b.latency_ms}
    return {}


def _best(results: dict[str, EvalResult], nodes: list[NodeRecord], limit: int = 3) -> list[dict]:
    ok = [(results[n.plan_hash], n) for n in nodes if n.plan_hash in results and results[n.plan_hash].ok]
    ok.sort(key=lambda rn: rn[0].latency_ms)
    return [{"plan": n.plan, "latency_ms": r.latency_ms, "speedups": r.speedups} for r, n in ok[:limit]]


def _failures(results: dict[str, EvalResult], nodes: list[NodeRecord], limit: int = 5) -> list[dict]:
    failed = [(n, results[n.plan_hash]) for n in nodes if n.plan_hash in results and not results[n.plan_hash].ok]
    return [{"patch": n.edit, "status": str(r.status), "error": r.error[:300]} for n, r in failed[-limit:]]
