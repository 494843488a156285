"""The searchers compared offline, on a surrogate of the GPU: each plan's latency composed from the
plan edits measured on the GPU, so a search policy can be compared over many seeds in minutes of CPU.

    python lab/experiments/search_surrogate.py WORKLOAD.toml DB [DB ...] [--agents heuristic greedy random]
                                          [--seeds 0 1 2 3] [--budget 40] [--noise 0.002] [--width N]
                                          [--deepen-first] [--frontier-width N] [--exploit-every N]
                                          [--exploit-last SHARE] [--deepen-margin M] [--no-merge-moves]
                                          [--out DIR (runs/surrogate)] [--json OUT.json]

The databases are GPU search runs of the workload (`searchers.py`'s; a node that two databases hold,
copies of one run, counts once, from the copy where it was evaluated; the order of the databases
changes nothing). From them: every measured
plan's latency, and every measured move (a child's difference from its parent, as a set of changed
plan fields) with its gain (parent latency over child latency, minus one). A plan the GPU measured
takes its mean latency; any other takes the latency of the measured plan nearest to it (fewest
changed fields), divided by (1 + gain) for each measured move its difference holds (the largest
moves first), and by (1 + a gain drawn from all measured moves, fixed per field group) for what is
left: edits commute and their gains compose, which is the surrogate's assumption and its limit.
The rest of an evaluation is what the GPU said of the plan, or of the measured plan nearest to it:
its status where the GPU measured this very plan and it failed; otherwise the analytical evaluator's
validity, and the GPU result's ledger, compile feedback (registers, spills) and verdicts, so the
agents read what they would read on the GPU (edits proposed only after a measurement, such as an SM
limit, included; a nearest plan's feedback can name launches this plan lays out otherwise). The
latency gets Gaussian noise of --noise (relative). `--width N`: the edits a run asks for per
expansion, evaluated before it selects again (default: the search's own, SearchSettings.expand_width);
`--deepen-first`: once one of them gains, the rest wait and the run selects again (SearchSettings.deepen_first);
`--frontier-width N`: SearchSettings.frontier_width (default: the search's; 0: no cap);
`--exploit-every N`: SearchSettings.exploit_every (default: the search's; 0: off);
`--exploit-last SHARE`: SearchSettings.exploit_last (default: the search's; 0: off);
`--deepen-margin M`: SearchSettings.deepen_margin (default: the search's);
`--no-merge-moves`: MCTS without SearchSettings.merge_moves (the run's gains offered together).

Per agent and seed a fresh run, as `searchers.py` makes it; its best plan (the fastest the search
measured, noise included) is scored without the noise (`best_ms`). JSON: {"workload", "databases",
"runs": [{"agent", "seed", "best_ms", "best_so_far_ms"}], "summary": {agent: {"mean_best_ms",
"mean_at_half_ms"}}}. The figures are the surrogate's, not the GPU's: they compare policies.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import random
import sqlite3
import statistics
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import searchers  # noqa: E402
from conjugate.cli.arguments import output_file  # noqa: E402
from conjugate.evaluate.evaluators import load_profile  # noqa: E402
from conjugate.evaluate.result import EvalResult  # noqa: E402
from conjugate.evaluate.worker import IsolatedEvaluator  # noqa: E402
from conjugate.paths import shipped_plan  # noqa: E402
from conjugate.plan import load_plan  # noqa: E402
from conjugate.workload import load_workload  # noqa: E402

NODES = ("SELECT n.id, n.parent_id, n.plan, n.edit, e.latency_ms, e.result, r.created_at FROM nodes n "
         "JOIN runs r ON r.id = n.run_id LEFT JOIN evaluations e ON e.plan_hash = n.plan_hash")
NAMING = {"name", "description"}  # top-level fields that do not change what a plan runs


def fields_of(plan: dict, prefix: str = "") -> dict[str, str]:
    """A plan as its leaf fields: path -> JSON value (lists whole)."""
    out = {}
    for key, value in plan.items():
        if not prefix and key in NAMING:
            continue
        path = f"{prefix}/{key}"
        if isinstance(value, dict) and value:
            out |= fields_of(value, path)
        else:
            out[path] = json.dumps(value, sort_keys=True)
    return out


def difference(a: dict[str, str], b: dict[str, str]) -> frozenset:
    """What turns a into b: (path, new value) per changed field, (path, None) per removed one."""
    return frozenset({(p, v) for p, v in b.items() if a.get(p) != v} | {(p, None) for p in a if p not in b})


def replaces_whole_plan(edit: str | None) -> bool:
    """Whether a node's edit replaces the whole plan (a seed or a warm start), not a move."""
    ops = json.loads(edit) if edit else []
    return any(op.get("path") == "" for op in ops)


def _key(fields: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(sorted(fields.items())).encode()).hexdigest()


def _preference(result: EvalResult) -> tuple:
    """Orders a plan's GPU results, the one the surrogate keeps first: passing before failing, then the
    fastest, then by content (so ties are decided the same way in any order)."""
    latency = (result.latency_ms if result.ok else None) or float("inf")
    return (not result.ok, latency, json.dumps(result.to_dict(), sort_keys=True, default=str))


def _settled(row: tuple) -> tuple:
    """How far a stored node got (its plan's latency stored, its result stored), then its content, so
    that of two rows as far on, the same one is kept in any order."""
    return row[3] is not None, row[4] is not None, json.dumps(row, default=str)


class Surrogate:
    """Latencies from measured plans and moves (see the module docstring)."""

    def __init__(self, measured: list[tuple[dict, float]], moves: list[tuple[frozenset, float]],
                 results: list[tuple[dict, EvalResult]] = ()):
        """`results`: the GPU's result of each plan it evaluated; of a plan evaluated more than once
        (two runs, or databases given in another order), a passing result before a failing one, then
        the fastest: the same whatever the databases' order."""
        self.latencies: dict[str, list[float]] = {}
        self.plans: dict[str, dict[str, str]] = {}
        for fields, latency in measured:
            self.latencies.setdefault(_key(fields), []).append(latency)
            self.plans[_key(fields)] = fields
        self.results: dict[str, EvalResult] = {}
        for fields, result in results:
            known = self.results.get(_key(fields))
            if known is None or _preference(result) < _preference(known):
                self.results[_key(fields)] = result
        self.gains: dict[frozenset, list[float]] = {}
        for move, gain in moves:
            if move:
                self.gains.setdefault(move, []).append(gain)
        self.spread = sorted(g for gains in self.gains.values() for g in gains)
        if not self.plans or not self.spread:
            raise ValueError("the databases hold no measured plan with a measured parent")

    @classmethod
    def from_databases(cls, paths: list[Path]) -> "Surrogate":
        """A node two databases hold (copies of one run, one perhaps further on) counts once, from the
        copy where it is most settled (evaluated, its result stored): the same in any order."""
        rows: dict[tuple, tuple] = {}  # (its run's creation time, node id) -> (parent, plan, edit, latency, result)
        for path in paths:
            with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
                try:
                    found = db.execute(NODES).fetchall()
                except sqlite3.DatabaseError as e:
                    raise sqlite3.DatabaseError(f"{path}: not a search database ({e})") from None
            for i, parent, plan, edit, latency, result, run_created in found:
                row, known = (parent, plan, edit, latency, result), rows.get((run_created, i))
                if known is None or _settled(row) > _settled(known):
                    rows[(run_created, i)] = row
        nodes = {key: (parent, fields_of(json.loads(plan)), latency, replaces_whole_plan(edit), result)
                 for key, (parent, plan, edit, latency, result) in sorted(rows.items(), key=lambda kv: str(kv[0]))}
        measured = [(fields, latency) for _, fields, latency, _, _ in nodes.values() if latency]
        results = [(fields, EvalResult.from_dict(json.loads(result))) for _, fields, _, _, result in nodes.values()
                   if result]
        moves = []
        for (run_created, _), (parent, fields, latency, whole, _) in nodes.items():
            above = nodes.get((run_created, parent))
            if latency and above and above[2] and not whole:  # seeds and warm starts: the whole plan
                moves.append((difference(above[1], fields), above[2] / latency - 1))
        return cls(measured, moves, results)

    def context(self, plan: dict) -> tuple[EvalResult | None, bool]:
        """(the GPU's result of this plan, or of the measured plan nearest to it; whether it is this
        plan's own)."""
        fields = fields_of(plan)
        if _key(fields) in self.results:
            return self.results[_key(fields)], True
        ok = [k for k in self.plans if k in self.results and self.results[k].ok]
        if not ok:
            return None, False
        return self.results[min(ok, key=lambda k: (len(difference(self.plans[k], fields)), k))], False

    def latency(self, plan: dict) -> float:
        fields = fields_of(plan)
        if _key(fields) in self.latencies:
            return statistics.mean(self.latencies[_key(fields)])
        nearest = min(self.plans, key=lambda k: (len(difference(self.plans[k], fields)), k))
        left = set(difference(self.plans[nearest], fields))
        latency = statistics.mean(self.latencies[nearest])
        for move in sorted(self.gains, key=lambda m: (-len(m), sorted(map(str, m)))):
            if move <= left:
                latency /= 1 + statistics.mean(self.gains[move])
                left -= move
        groups: dict[str, list] = {}
        for path, value in left:
            groups.setdefault("/".join(path.split("/")[:3]), []).append((path, value))
        for _, items in sorted(groups.items()):  # divided in one order: the same float in every process
            draw = int(hashlib.sha256(json.dumps(sorted(items, key=str)).encode()).hexdigest(), 16)
            latency /= 1 + self.spread[draw % len(self.spread)]
        return latency


class SurrogateEvaluator:
    """The analytical evaluator's results, their latency and speedup the surrogate's (plus noise)."""

    def __init__(self, surrogate: Surrogate, analytical: IsolatedEvaluator, noise: float, seed: int,
                 memo: dict | None = None):
        self.surrogate, self.analytical, self.noise = surrogate, analytical, noise
        self.profile = analytical.profile
        self.rng = random.Random(seed)
        self.memo = {} if memo is None else memo  # analytical results by plan, shared across runs
        self.sequential_ms = surrogate.latency(load_plan(shipped_plan("sequential")).to_dict())

    def evaluate(self, plan: dict, workload_path):
        key = _key(fields_of(plan))
        if key not in self.memo:
            self.memo[key] = self.analytical.evaluate(plan, workload_path)
        result = self.memo[key]
        gpu, own = self.surrogate.context(plan)
        if own and not gpu.ok:
            return replace(gpu, plan_hash=result.plan_hash)
        if not result.ok:
            return result
        latency = self.surrogate.latency(plan) * (1 + self.rng.gauss(0, self.noise))
        metrics = replace(result.metrics, latency_ms=latency, speedups={"sequential": self.sequential_ms / latency})
        if gpu is None or not gpu.ok:
            return replace(result, metrics=metrics)
        metrics = replace(metrics, ledger=gpu.metrics.ledger, device=gpu.metrics.device, sms=gpu.metrics.sms)
        return replace(result, modeled=False, metrics=metrics, feedback=gpu.feedback, verdicts=gpu.verdicts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", type=Path)
    parser.add_argument("databases", nargs="+", type=Path)
    parser.add_argument("--agents", nargs="+", default=["heuristic", "greedy", "random"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3])
    parser.add_argument("--budget", type=int, default=40)
    parser.add_argument("--noise", type=float, default=0.002, help="relative latency noise (default 0.2%%)")
    parser.add_argument("--width", type=int, help="edits per expansion (default: the search's)")
    parser.add_argument("--deepen-first", action="store_true", help="MCTS: siblings of a gain wait (SearchSettings)")
    parser.add_argument("--frontier-width", type=int, help="MCTS: children of a node without a gain before it is "
                                                           "widened by visits (default: the search's; 0: no cap)")
    parser.add_argument("--exploit-every", type=int, help="MCTS: one expansion in N widens the run's best open node "
                                                          "(default: the search's; 0: off)")
    parser.add_argument("--exploit-last", type=float, help="MCTS: over this share of the budget's end, widen the "
                                                          "run's best open node (default: the search's; 0: off)")
    parser.add_argument("--deepen-margin", type=float, help="MCTS: a gain over this share of a node's reward "
                                                            "deepens past it (default: the search's)")
    parser.add_argument("--no-merge-moves", action="store_true",
                        help="MCTS: do not offer the run's gains together (SearchSettings.merge_moves)")
    parser.add_argument("--out", type=Path, default=Path("runs/surrogate"))
    parser.add_argument("--json", type=output_file)
    args = parser.parse_args()
    if args.width is not None and args.width < 1:
        parser.error(f"--width {args.width}: at least one edit per expansion")
    if args.frontier_width is not None and args.frontier_width < 0:
        parser.error(f"--frontier-width {args.frontier_width}: 0 (no cap) or more")
    if args.exploit_every is not None and args.exploit_every < 0:
        parser.error(f"--exploit-every {args.exploit_every}: 0 (off) or more")
    if args.exploit_last is not None and not 0 <= args.exploit_last <= 1:
        parser.error(f"--exploit-last {args.exploit_last}: a share of the budget, 0 (off) to 1")
    if args.deepen_margin is not None and not 0 <= args.deepen_margin < 1:
        parser.error(f"--deepen-margin {args.deepen_margin}: a share of a node's reward, 0 to under 1")
    for path in args.databases:
        if not path.is_file():
            raise SystemExit(f"{path}: no such database")
    try:
        surrogate = Surrogate.from_databases(args.databases)
    except sqlite3.DatabaseError as e:
        raise SystemExit(f"error: {e}") from None
    except ValueError as e:
        raise SystemExit(f"error: {', '.join(map(str, args.databases))}: {e}") from None
    workload = load_workload(args.workload)
    args.out.mkdir(parents=True, exist_ok=True)
    runs, memo = [], {}
    with IsolatedEvaluator(load_profile("analytical")) as analytical:
        for agent in args.agents:
            for seed in args.seeds:
                evaluator = SurrogateEvaluator(surrogate, analytical, args.noise, seed, memo)
                db = args.out / f"{workload.name}_{agent}_{seed}.db"
                db.unlink(missing_ok=True)
                with contextlib.ExitStack() as stack:
                    opened = searchers.open_run(stack, args.workload, agent, args.budget, evaluator, seed, db,
                                                width=args.width, deepen_first=args.deepen_first,
                                                frontier_width=args.frontier_width,
                                                exploit_every=args.exploit_every, exploit_last=args.exploit_last,
                                                deepen_margin=args.deepen_margin, merge_moves=not args.no_merge_moves)
                    searchers.rotate([opened], args.budget, args.budget, None)
                row = searchers.summary(db, agent, workload, args.workload)
                node = row["best_node"]
                best = None if node is None else surrogate.latency(searchers.best_plan(db, node))
                runs.append({"agent": agent, "seed": seed, "best_ms": best, "best_so_far_ms": row["best_so_far_ms"]})
    if any(r["best_ms"] is None for r in runs):
        raise SystemExit(f"error: {workload.name}: a run had no plan that passed; see {args.out}")
    half = args.budget // 2
    summary = {agent: {"mean_best_ms": statistics.mean(r["best_ms"] for r in runs if r["agent"] == agent),
                       "mean_at_half_ms": statistics.mean(r["best_so_far_ms"][min(half, len(r["best_so_far_ms"])) - 1]
                                                          for r in runs if r["agent"] == agent)}
               for agent in args.agents}
    out = {"workload": workload.name, "databases": [str(p) for p in args.databases], "budget": args.budget,
           "seeds": args.seeds, "noise": args.noise, "width": args.width,
           "deepen_first": args.deepen_first, "frontier_width": args.frontier_width,
           "exploit_every": args.exploit_every, "exploit_last": args.exploit_last, "deepen_margin": args.deepen_margin,
           "merge_moves": not args.no_merge_moves,
           "command": " ".join(sys.argv),
           "runs": runs, "summary": summary}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{'agent':10} {'mean best':>9} {f'mean at {half}':>11}  (surrogate ms, {len(args.seeds)} seeds)")
    for agent, row in summary.items():
        print(f"{agent:10} {row['mean_best_ms']:9.3f} {row['mean_at_half_ms']:11.3f}")


if __name__ == "__main__":
    main()
