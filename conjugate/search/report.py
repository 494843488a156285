"""A run's history and its export: the best plan, its generated kernels, a report (markdown and
JSON: speedups over each baseline, floor ratio, verdicts, the search history), a plot of the best
speedup so far against evaluations, and a script that reproduces the measurement. Whatever it
writes or returns is scrubbed of secrets (conjugate/secrets.py), also when it reads a database
written before the store scrubbed its columns."""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from rich.console import Console

from conjugate.errors import ConjugateError
from conjugate.evaluate.result import EvalResult
from conjugate.search.runs import eval_key, reward_of, run_evaluator_id, run_profile_source, run_workload
from conjugate.search.settings import evaluator_id
from conjugate.paths import DATA_ROOT, EXAMPLES_DIR, PROFILES_DIR
from conjugate.search.store.integrity import check_run
from conjugate.search.store import StoreError
from conjugate.secrets import scrub, scrub_tree
from conjugate.text import visible
from conjugate.workload import Workload, workload_toml

BASELINES = ("conventional", "sequential", "streams")
VERDICTS_SHOWN = 20  # report.md's verdict table, worst first


def node_evaluations(store, run, workload: Workload) -> list[tuple]:
    """(node, its evaluation record or None) for every node of the run, in creation order."""
    key = run_evaluator_id(run)
    return [(n, store.evaluation(eval_key(n.plan_hash, workload, key))) for n in store.nodes(run.id)]


def passed(found) -> bool:
    """An evaluation record that is finished and passed every check."""
    return found is not None and found.done and found.result.status == "ok"


def run_history(store, run, workload: Workload | None = None) -> list[dict]:
    """Every node of the run in creation order, with its evaluation (or status pending); scrubbed, the
    rationales on one line without control characters. A damaged row ends here (integrity.py)."""
    pairs = node_evaluations(store, run, workload or run_workload(run))
    check_run(run, pairs)
    rows = []
    for n, found in pairs:
        r = found.result if found is not None and found.done else None
        rows.append({"node": n.id, "parent": n.parent_id, "depth": n.depth, "kind": n.edit_kind,
                     "proposer": n.proposer, "rationale": visible(n.rationale), "edit": n.edit,
                     "plan_hash": n.plan_hash, "visits": n.visits, **_outcome(r),
                     "finished_at": found.finished_at.isoformat() if found is not None and found.finished_at else None})
    return scrub_tree(rows)


def _outcome(r: EvalResult | None) -> dict:
    """A history row's evaluation columns (status pending while there is no result)."""
    if r is None:
        return {"status": "pending", "stage": "", "error": "", "latency_ms": None, "speedups": {},
                "floor_ratio": None, "reward": None, "modeled": None}
    return {"status": str(r.status), "stage": str(r.stage), "error": r.error, "latency_ms": r.latency_ms,
            "speedups": r.speedups, "floor_ratio": r.metrics.floor_ratio if r.metrics else None,
            "reward": reward_of(r), "modeled": r.modeled}


def best_so_far(history: list[dict]) -> list[float]:
    """The best reward after each evaluation, in the order evaluations finished."""
    done = sorted((h for h in history if h["reward"] is not None), key=lambda h: h["finished_at"] or "")
    best, out = 0.0, []
    for h in done:
        best = max(best, h["reward"])
        out.append(best)
    return out


def best_of(history: list[dict], run) -> dict:
    """The history row of the run's fastest plan that passed every check."""
    ok = [h for h in history if h["status"] == "ok"]
    if not ok:
        raise ConjugateError(f"run {run.id}: no plan was evaluated successfully")
    return min(ok, key=lambda h: h["latency_ms"])


def best_plan(store, run) -> dict:
    """The run's fastest plan, under its exported name."""
    history = run_history(store, run)
    best = best_of(history, run)
    return _named(store.node(best["node"]).plan, run, best["node"], history)


# what export_run writes into its folder (`export` checks first that none is a file the command reads)
EXPORT_FILES = ("best_plan.json", "kernels", "report.json", "report.md", "best_so_far.png", "workload.toml",
                "reproduce.sh")


def export_run(store, run, out_dir: Path, console: Console, workload_file: str | None = None) -> list[Path]:
    from conjugate.plan import validate_plan

    workload = run_workload(run, workload_file)
    history = run_history(store, run, workload)
    best = best_of(history, run)
    node = store.node(best["node"])
    result = store.evaluation(eval_key(node.plan_hash, workload, run_evaluator_id(run))).result
    plan = _named(node.plan, run, best["node"], history)
    validate_plan(node.plan, f"{store.url_for_display} run {run.id} node {best['node']}")  # before anything is written
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [_write(out_dir / "best_plan.json", json.dumps(plan, indent=2) + "\n")]
    written.append(_kernels(scrub_tree(node.plan), workload, out_dir / "kernels"))  # its manifest holds the plan
    report = scrub_tree({"run": run.to_dict(), "best": {**best, "plan": plan, "metrics": result.metrics.to_dict(),
                                                        "verdicts": [v.to_dict() for v in result.verdicts],
                                                        "feedback": [f.to_dict() for f in result.feedback]},
                         "history": history, "best_so_far": best_so_far(history)})
    written.append(_write(out_dir / "report.json", json.dumps(report, indent=1, default=str) + "\n"))
    written.append(_write(out_dir / "report.md", _markdown(run, best, result, history)))
    written.append(_plot(report["best_so_far"], out_dir / "best_so_far.png", run))
    if workload_file is not None or Path(run.workload_path).exists():
        workload_word = _portable(str(Path(workload_file).resolve()) if workload_file else run.workload_path)
        (out_dir / "workload.toml").unlink(missing_ok=True)  # an earlier export's, from a moved database
    else:  # the run's own file is gone (a moved database): the export carries the workload
        written.append(_write(out_dir / "workload.toml", workload_toml(workload)))
        workload_word = '"$here/workload.toml"'
    written.append(_write(out_dir / "reproduce.sh", _script(run, workload_word)))
    (out_dir / "reproduce.sh").chmod(0o755)
    return written


def _named(plan: dict, run, node_id: int, history: list[dict]) -> dict:
    """The plan under a name of its own, its description the branch of edits that made it (both
    cosmetic: the plan's hash is unchanged)."""
    rows = {h["node"]: h for h in history}
    branch, at, seen = [], rows.get(node_id), set()
    while at is not None:
        if at["node"] in seen:
            raise StoreError(f"run {run.id}: node {at['node']} is its own ancestor: a damaged store")
        seen.add(at["node"])
        branch.append(at["rationale"])
        at = rows.get(at["parent"])
    steps = " -> ".join(reversed(branch))
    return scrub_tree({**plan, "name": f"{run.name}-node{node_id}",
                       "description": f"Found by search run {run.id} ({run.agent} agent, {run.evaluator} evaluator): "
                                      f"{steps}"})


def _write(path: Path, text: str) -> Path:
    """Every text file of an export is written here, scrubbed."""
    path.write_text(scrub(text))
    return path


def _kernels(plan: dict, workload, directory: Path) -> Path:
    """The best plan's generated Triton kernels (lowered on shape-only weights)."""
    from conjugate.compiler.round import compile_round
    from conjugate.models.weights import meta_weights
    from conjugate.plan import validate_plan

    compiled = compile_round(validate_plan(plan), workload, meta_weights(workload.draft, workload.torch_dtype),
                             meta_weights(workload.target, workload.torch_dtype), cache_dir=directory)
    return compiled.source_dir


def _markdown(run, best: dict, result: EvalResult, history: list[dict]) -> str:
    m = result.metrics
    what = (f"MODELED by the analytical evaluator for {m.device}, not measured" if result.modeled
            else f"measured on {m.device}")
    spread = f" (p20 {m.p20_ms:.3f}, p80 {m.p80_ms:.3f}, {m.replays} replays)" if m.p20_ms is not None else ""
    lines = [f"# Search run {run.id}: {run.workload_name}", "",
             f"Evaluator `{run.evaluator}` ({what}); agent `{run.agent}`, seed {run.seed}; "
             f"{len(history)} nodes, {sum(1 for h in history if h['status'] == 'ok')} ok.", "",
             f"## Best plan: node {best['node']} (depth {best['depth']})", "",
             f"- round latency: {m.latency_ms:.3f} ms{spread}",
             f"- floor ratio: {m.floor_ratio:.2f} (floor {m.floor_ms:.3f} ms)"]
    for b in BASELINES:
        base = m.baselines.get(b)
        if base is not None and base.latency_ms and b in m.speedups:
            carried = f", carried from {base.carried}" if base.carried else ""
            lines.append(f"- vs {b}: {m.speedups[b]:.3f}x ({base.latency_ms:.3f} ms{carried})")
    lines += ["", "## Verdicts of its multi-part launches (worst first)", "",
              "| launch | ops | verdict | shared us | separate us | gain % |", "|---|---|---|---|---|---|"]
    worst_first = sorted(result.verdicts, key=lambda v: (v.gain_percent, v.launch))
    for v in worst_first[:VERDICTS_SHOWN]:
        ops = " + ".join(p.label for p in v.parts)[:80]
        lines.append(f"| {v.launch} | {ops} | {v.verdict} | {v.shared_us} | {v.separate_us} | {v.gain_percent} |")
    if len(worst_first) > VERDICTS_SHOWN:
        lines += ["", f"{len(worst_first) - VERDICTS_SHOWN} more not shown (report.json holds every verdict)."]
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
    ax.set_title(scrub(f"run {run.id}: {run.workload_name} ({run.evaluator}, {run.agent})"))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _script(run, workload_word: str) -> str:
    """The bench command for the best plan, with the run's workload file and evaluator profile file.
    It runs from any directory, on a checkout or an installed wheel, with no environment activated:
    the interpreter is the one that exported the run (python3 on PATH where that is gone); a file
    the package ships (a workload of examples/, a profile of evaluators/) is named in the data folder
    of the conjugate it imports, any other file by its path as the run recorded it (or as given to
    export); a run whose workload file is gone gets the workload.toml the export wrote beside it."""
    evaluator = run_profile_source(run.settings.get("evaluator_profile", ""), run.evaluator)
    if evaluator == run.evaluator and run.settings.get("evaluator_profile") and not _same_settings(run):
        evaluator = run.settings["evaluator_profile"]  # gone, and the shipped one scores otherwise: say which
    return ("#!/usr/bin/env bash\n# Measure the exported best plan again beside the baselines.\nset -euo pipefail\n"
            'here="$(cd "$(dirname "$0")" && pwd)"\n'
            f"python={shlex.quote(sys.executable)}  # the interpreter that exported the run\n"
            '[ -x "$python" ] || python=python3  # on another machine: the one on PATH\n'
            'data="$("$python" -c \'import conjugate.paths as p; print(p.DATA_ROOT)\')"  # its examples/, evaluators/\n'
            f"\"$python\" -m conjugate bench {workload_word} --plan \"$here/best_plan.json\" "
            f"--evaluator {_portable(evaluator)} --json \"$here/reproduced.json\"\n")


def _same_settings(run) -> bool:
    """Whether the shipped profile of the run's evaluator name has the settings the run scored with."""
    from conjugate.evaluate.evaluators import load_profile

    try:
        return evaluator_id(load_profile(run.evaluator)) == run_evaluator_id(run)
    except ConjugateError:  # no shipped profile of that name
        return False


def _portable(path: str) -> str:
    """A shell word for a file: "$data"/<folder>/<name> when it is a shipped workload or evaluator
    profile (a relative path is read from the data folder), otherwise the path as given."""
    candidate = Path(path) if Path(path).is_absolute() else DATA_ROOT / path
    for folder in (EXAMPLES_DIR, PROFILES_DIR):
        try:
            inside = candidate.resolve().relative_to(folder.resolve())
        except ValueError:
            continue
        if candidate.exists():
            return '"$data"/' + shlex.quote(f"{folder.name}/{inside}")
    return shlex.quote(path)
