"""What the proposer is told about a node: its plan and evaluation, the baselines, the best plans
so far, the edits already tried from it, recent failures, and what earlier runs on this GPU and
model family learned (lessons, per-edit-kind statistics)."""
from __future__ import annotations

from conjugate.agents.base import NodeContext
from conjugate.search.store import NodeRecord, Store


def family_of(workload: dict) -> str:
    """The lessons' key for a workload: its draft and target model families."""
    return f"{workload['draft']['family']}->{workload['target']['family']}"


class ContextBuilder:
    def __init__(self, store: Store, run_id: int, workload: dict, gpu: str):
        self.store, self.run_id, self.workload, self.gpu = store, run_id, workload, gpu
        self.family = family_of(workload)

    def build(self, node: NodeRecord, results: dict[str, dict], nodes: list[NodeRecord]) -> NodeContext:
        """`results`: plan hash -> EvalResult dict of every evaluated node of the run."""
        result = results.get(node.plan_hash)
        children = [n for n in nodes if n.parent_id == node.id]
        return NodeContext(
            plan=node.plan, plan_hash=node.plan_hash, workload=self.workload, gpu=self.gpu, result=result,
            baselines=_baselines(results), best=_best(results, nodes), lessons=self.store.lessons(self.gpu, self.family),
            edit_stats=self.store.edit_stats(self.gpu, self.family),
            tried=[{"patch": c.edit, "kind": c.edit_kind, "status": (results.get(c.plan_hash) or {}).get("status", "new"),
                    "reward": c.best_reward} for c in children],
            failures=_failures(results, nodes))


def _baselines(results: dict[str, dict]) -> dict[str, float]:
    for r in results.values():
        found = (r.get("metrics") or {}).get("baselines")
        if found:
            return {name: b["latency_ms"] for name, b in found.items() if b.get("latency_ms")}
    return {}


def _best(results: dict[str, dict], nodes: list[NodeRecord], limit: int = 3) -> list[dict]:
    ok = [(results[n.plan_hash], n) for n in nodes if results.get(n.plan_hash, {}).get("status") == "ok"]
    ok.sort(key=lambda rn: rn[0]["metrics"]["latency_ms"])
    return [{"plan": n.plan, "latency_ms": r["metrics"]["latency_ms"], "speedups": r["metrics"].get("speedups", {})}
            for r, n in ok[:limit]]


def _failures(results: dict[str, dict], nodes: list[NodeRecord], limit: int = 5) -> list[dict]:
    failed = [(n, results[n.plan_hash]) for n in nodes
              if n.plan_hash in results and results[n.plan_hash]["status"] != "ok"]
    return [{"patch": n.edit, "status": r["status"], "error": r["error"][:300]} for n, r in failed[-limit:]]
