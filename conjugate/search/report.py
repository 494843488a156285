"""A run's history and its export: the best plan, its generated kernels, a report (markdown and
JSON: speedups over each baseline, floor ratio, verdicts, the search history), a plot of the best
speedup so far against evaluations, and a script that reproduces the measurement."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

from rich.console import Console

from conjugate.errors import ConjugateError
from conjugate.search.run import check_workload, eval_key, reward_of, run_evaluator_id
from conjugate.workload import REPO_ROOT, load_workload

BASELINES = ("conventional", "sequential", "streams")


def run_history(store, run) -> list[dict]:
    """Every node of the run in creation order, with its evaluation (or status pending)."""
    workload = load_workload(run.workload_path)
    check_workload(run, workload)
    rows = []
    for n in store.nodes(run.id):
        found = store.evaluation(eval_key(n.plan_hash, workload, run_evaluator_id(run)))
        r = found.result if found is not None and found.done else None
        m = (r or {}).get("metrics") or {}
        rows.append({"node": n.id, "parent": n.parent_id, "depth": n.depth, "kind": n.edit_kind,
                     "proposer": n.proposer, "rationale": n.rationale, "edit": n.edit, "plan_hash": n.plan_hash,
                     "visits": n.visits, "status": r["status"] if r else "pending",
                     "stage": r["stage"] if r else "", "error": r["error"] if r else "",
                     "latency_ms": m.get("latency_ms"), "speedups": m.get("speedups", {}),
                     "floor_ratio": m.get("floor_ratio"), "reward": reward_of(r) if r else None,
                     "modeled": r["modeled"] if r else None, "finished_at": found.finished_at.isoformat()
                     if found is not None and found.finished_at else None})
    return rows


def best_so_far(history: list[dict]) -> list[float]:
    """The best reward after each evaluation, in the order evaluations finished."""
    done = sorted((h for h in history if h["reward"] is not None), key=lambda h: h["finished_at"] or "")
    best, out = 0.0, []
    for h in done:
        best = max(best, h["reward"])
        out.append(best)
    return out


def export_run(store, run, out_dir: Path, console: Console) -> list[Path]:
    history = run_history(store, run)
    ok = [h for h in history if h["status"] == "ok"]
    if not ok:
        raise ConjugateError(f"run {run.id}: no plan was evaluated successfully; nothing to export")
    best = min(ok, key=lambda h: h["latency_ms"])
    node = store.node(best["node"])
    workload = load_workload(run.workload_path)
    result = store.evaluation(eval_key(node.plan_hash, workload, run_evaluator_id(run))).result
    out_dir.mkdir(parents=True, exist_ok=True)
    plan = _named(node.plan, run, best["node"], history)
    written = [_write(out_dir / "best_plan.json", json.dumps(plan, indent=2) + "\n")]
    written.append(_kernels(node.plan, workload, out_dir / "kernels"))
    report = {"run": run.to_dict(), "best": {**best, "plan": plan, "metrics": result["metrics"],
                                             "verdicts": result["verdicts"], "feedback": result["feedback"]},
              "history": history, "best_so_far": best_so_far(history)}
    written.append(_write(out_dir / "report.json", json.dumps(report, indent=1, default=str) + "\n"))
    written.append(_write(out_dir / "report.md", _markdown(run, best, result, history)))
    written.append(_plot(report["best_so_far"], out_dir / "best_so_far.png", run))
    written.append(_write(out_dir / "reproduce.sh", _script(run)))
    (out_dir / "reproduce.sh").chmod(0o755)
    return written


def _named(plan: dict, run, node_id: int, history: list[dict]) -> dict:
    """The plan under a name of its own, its description the branch of edits that made it (both
    cosmetic: the plan's hash is unchanged)."""
    rows = {h["node"]: h for h in history}
    branch, at = [], rows.get(node_id)
    while at is not None:
        branch.append(at["rationale"])
        at = rows.get(at["parent"])
    steps = " -> ".join(reversed(branch))
    return {**plan, "name": f"{run.name}-node{node_id}",
            "description": f"Found by search run {run.id} ({run.agent} agent, {run.evaluator} evaluator): {steps}"}


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _kernels(plan: dict, workload, directory: Path) -> Path:
    """The best plan's generated Triton kernels (lowered on shape-only weights)."""
    from conjugate.compiler.round import compile_round
    from conjugate.models.weights import meta_weights
    from conjugate.plan import validate_plan

    compiled = compile_round(validate_plan(plan), workload, meta_weights(workload.draft, workload.torch_dtype),
                             meta_weights(workload.target, workload.torch_dtype), cache_dir=directory)
    return compiled.source_dir


def _markdown(run, best: dict, result: dict, history: list[dict]) -> str:
    m = result["metrics"]
    what = "MODELED by the analytical evaluator, not measured" if result["modeled"] else f"measured on {m.get('gpu')}"
    lines = [f"# Search run {run.id}: {run.workload_name}", "",
             f"Evaluator `{run.evaluator}` ({what}); agent `{run.agent}`, seed {run.seed}; "
             f"{len(history)} nodes, {sum(1 for h in history if h['status'] == 'ok')} ok.", "",
             f"## Best plan: node {best['node']} (depth {best['depth']})", "",
             f"- round latency: {m['latency_ms']:.3f} ms" + (f" (p20 {m['p20_ms']:.3f}, p80 {m['p80_ms']:.3f}, "
                                                             f"{m['replays']} replays)" if "p20_ms" in m else ""),
             f"- floor ratio: {m['floor_ratio']:.2f} (floor {m['floor_ms']:.3f} ms)"]
    for b in BASELINES:
        base = (m.get("baselines") or {}).get(b, {})
        if base.get("latency_ms"):
            lines.append(f"- vs {b}: {m['speedups'][b]:.3f}x ({base['latency_ms']:.3f} ms)")
    lines += ["", "## Verdicts of its multi-part launches (worst first)", "",
              "| launch | ops | verdict | shared us | separate us | gain % |", "|---|---|---|---|---|---|"]
    for v in result["verdicts"][:20]:
        lines.append(f"| {v['launch']} | {' + '.join(v.get('ops', []))[:80]} | {v['verdict']} | {v['shared_us']} "
                     f"| {v['separate_us']} | {v['gain_percent']} |")
    lines += ["", "## History", "", "| node | parent | kind | status | latency ms | reward | edit |",
              "|---|---|---|---|---|---|---|"]
    for h in history:
        latency = f"{h['latency_ms']:.3f}" if h["latency_ms"] else "-"
        reward = f"{h['reward']:.3f}" if h["reward"] is not None else "-"
        lines.append(f"| {h['node']} | {h['parent'] or '-'} | {h['kind']} | {h['status']} | {latency} | {reward} "
                     f"| {h['rationale'][:90].replace('|', '/')} |")
    return "\n".join(lines) + "\n\nBest-so-far plot: best_so_far.png. Reproduce: reproduce.sh.\n"


def _plot(best: list[float], path: Path, run) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    ax.plot(range(1, len(best) + 1), best, marker="o", markersize=3)
    ax.set_xlabel("evaluations")
    ax.set_ylabel("best speedup over sequential")
    ax.set_title(f"run {run.id}: {run.workload_name} ({run.evaluator}, {run.agent})")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _script(run) -> str:
    """The bench command for the best plan, with the run's workload file and evaluator profile file.
    Paths inside the project are written relative to it, so the script runs on any checkout."""
    evaluator = run.settings.get("evaluator_profile") or run.evaluator  # runs of older versions kept the name only
    return ("#!/usr/bin/env bash\n# Measure the exported best plan again beside the baselines.\nset -euo pipefail\n"
            'here="$(cd "$(dirname "$0")" && pwd)"\n'
            'cd "$(python3 -c \'import conjugate.workload as w; print(w.REPO_ROOT)\')"\n'
            f"conjugate bench {shlex.quote(_in_project(run.workload_path))} --plan \"$here/best_plan.json\" "
            f"--evaluator {shlex.quote(_in_project(evaluator))} --json \"$here/reproduced.json\"\n")


def _in_project(path: str) -> str:
    """A path relative to the project root when it lies inside the project (as given otherwise)."""
    candidate = Path(path) if Path(path).is_absolute() else REPO_ROOT / path
    try:
        return str(candidate.resolve().relative_to(REPO_ROOT)) if candidate.exists() else path
    except ValueError:
        return path
