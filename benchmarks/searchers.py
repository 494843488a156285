"""The search against its own baselines at an equal budget: heuristic MCTS, `random` and `greedy`
(agents/search_baselines.py), each a fresh run on the same workload, evaluator and seed.

    python benchmarks/searchers.py WORKLOAD.toml [...] [--agents heuristic random greedy] [--budget 40]
                                   [--evaluator h200] [--seed 0] [--out DIR (runs/searchers)] [--json OUT.json]
                                   [--time SECONDS] [--step N] [--resume [--carry-baselines]] [--report]
                                   [--confirm ROUNDS]
    python benchmarks/searchers.py --merge CALL.json [...] --json OUT.json
    python benchmarks/searchers.py --plot COMPARISON.json [--out DIR]

Per workload and agent: a search run (as `conjugate search` starts one) into
DIR/<workload>_<agent>.db, then from its history the best latency after each evaluation (in the
order evaluations finished), the best plan and the `sequential` root's latency. The agents of one
workload share one evaluation worker, so its baselines are measured and its kernels compiled once
(each run still evaluates every plan it reaches: their databases are apart, so no run sees another's
results, lessons or best plans). One best-so-far plot per workload (DIR/<workload>_searchers.png).
JSON: {"gpu", "modeled", "workloads": [{"workload", "confirmed_streams_ms"?, "runs": [{"agent", "best_ms",
"sequential_ms", "best_so_far_ms": [...], "evaluations" (plans that passed every check), "settled"
(evaluations the budget spent), "complete", "device", "db", "best_node", "confirmed_ms"?}]}]}.

The runs of a workload take turns, `--step` evaluations each (default 5), so each is about as far on
whenever the command stops, and the kernels one run compiles help the others alike. `--time` bounds
the searches (not `--confirm`, nor an evaluation under way): where a run has evaluations to make,
the worker is started on the `sequential` plan first (its baselines measured, unless carried), then
the seconds left are shared evenly among the workloads not yet done, and a run cut short is stored
`stopped` (its JSON row says "complete": false). `--resume` continues each run from its database in
DIR where one is there (to a larger --budget too), so a comparison can be spread over several
sessions of a machine; a resumed run's agent starts afresh from the stored tree (its seed again), so
its later edits may differ from those of one unbroken run; with `--carry-baselines` a resumed run's
worker takes the torch baselines its database measured on a GPU of this name instead of compiling
them again (`conjugate search --carry-baselines`).
`--report` only reads the databases. `--confirm ROUNDS` then times each run's best plan and the
shipped `streams` plan again in one worker process, in turn, ROUNDS times (per run `confirmed_ms`,
the median; per workload `confirmed_streams_ms`): runs whose evaluations were spread over processes
(resumed, or on other GPUs) differ by the processes' spread, up to a few percent on a busy host.
`--plot COMPARISON.json` measures nothing: it draws DIR/<workload>_searchers.png for each workload of
that JSON, every run it lists (random runs carried from another call included).
`--merge A.json B.json ... --json OUT.json` measures nothing: it joins the JSON of several calls
(one per device call, say) into one comparison, refusing files whose GPU, evaluator, budget or
modeled flag differ, or that hold a workload twice.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path

from common import environment, make_parser, write_json

from conjugate.agents import make_proposer  # noqa: E402
from conjugate.errors import ConjugateError  # noqa: E402
from conjugate.evaluate.evaluators import load_profile  # noqa: E402
from conjugate.evaluate.worker import IsolatedEvaluator  # noqa: E402
from conjugate.paths import shipped_plan  # noqa: E402
from conjugate.plan import load_plan  # noqa: E402
from conjugate.search.databases import open_store  # noqa: E402
from conjugate.search.scoring import scored_by  # noqa: E402
from conjugate.search.report import node_evaluations, passed  # noqa: E402
from conjugate.search.run import Search  # noqa: E402
from conjugate.search.runs import baselines_to_carry, check_workload, run_evaluator_id  # noqa: E402
from conjugate.search.settings import SearchSettings, evaluator_id  # noqa: E402
from conjugate.search.store import NodeStatus, RunStatus, Store  # noqa: E402
from conjugate.workload import load_workload  # noqa: E402


@dataclass
class Opened:
    """One agent's run, open in its database for the rotation."""
    agent: str
    db: Path
    store: Store
    run: Search
    seconds: float = 0.0
    why: str = ""  # why it last stopped: "budget" below the final budget means its turn ended


def open_run(stack: contextlib.ExitStack, workload: Path, agent: str, budget: int, evaluator: IsolatedEvaluator,
             seed: int, db: Path, resume: bool = False, carry: bool = False, width: int | None = None,
             deepen_first: bool = False, frontier_width: int | None = None,
             exploit_every: int | None = None, merge_moves: bool = True,
             exploit_last: float | None = None, deepen_margin: float | None = None) -> Opened:
    """A fresh run in `db`, or (with `resume`) the run stored there, continued by the same agent.
    `width`: edits a fresh run asks for per expansion (default SearchSettings'); `deepen_first`,
    `frontier_width`, `exploit_every`, `exploit_last`, `deepen_margin` and `merge_moves`: its
    SearchSettings' (a resumed run keeps what it stored)."""
    settings = scored_by(SearchSettings(budget=budget, deepen_first=deepen_first, merge_moves=merge_moves),
                         evaluator.profile)
    if width is not None:
        settings = replace(settings, expand_width=width)
    if frontier_width is not None:
        settings = replace(settings, frontier_width=frontier_width)
    if exploit_every is not None:
        settings = replace(settings, exploit_every=exploit_every)
    if exploit_last is not None:
        settings = replace(settings, exploit_last=exploit_last)
    if deepen_margin is not None:
        settings = replace(settings, deepen_margin=deepen_margin)
    w = load_workload(workload)
    if not (resume and db.exists()):
        db.unlink(missing_ok=True)
    store = stack.enter_context(open_store(str(db), create=True))
    stored = store.latest_run()
    if stored is None:
        run = Search.start(store, w.name, w, str(workload.resolve()), evaluator, make_proposer(agent, seed=seed),
                           settings, seed)
    elif stored.agent != agent:
        _refuse(db, f"holds a run of agent {stored.agent}, not {agent}")
    else:  # a finished run too: a larger --budget continues it
        check_workload(stored, w, workload)
        if evaluator_id(evaluator.profile) != run_evaluator_id(stored):
            _refuse(db, f"was scored by {run_evaluator_id(stored)}, not by --evaluator {evaluator.profile.source}")
        proposer = make_proposer(agent, seed=stored.seed)
        carried = baselines_to_carry(store, stored.id, w, run_evaluator_id(stored)) if carry else None
        if carried:  # the worker keeps the first baselines it has for this workload: later runs' are moot
            evaluator.carried = carried
        run = Search(store, stored.id, w, str(workload.resolve()), evaluator, proposer,
                     replace(SearchSettings.from_dict(stored.settings), budget=budget))
        store.set_run_status(stored.id, RunStatus.RUNNING)
    return Opened(agent, db, store, run)


def rotate(opened: list[Opened], budget: int, step: int, deadline: float | None) -> None:
    """The runs take turns, `step` evaluations each, up to `budget`: a deadline then leaves them within
    one step of each other, and none is helped by kernels an earlier run compiled for the same plans
    more than the others are. Each run is stored finished (budget or nothing left) or stopped."""
    if step < 1:
        raise ValueError(f"a turn of {step} evaluations: expected at least 1")
    active = list(opened)
    while active:
        for o in list(active):
            run = o.run
            run.settings = replace(run.settings, budget=min(budget, run.evaluations_done() + step))
            started = time.perf_counter()
            try:
                o.why = run.run_loop(deadline)
            except KeyboardInterrupt:  # Ctrl-C, or a time limit's SIGINT, mid-evaluation: the runs stay resumable
                for other in active:
                    other.store.set_run_status(other.run.run_id, RunStatus.STOPPED)
                raise SystemExit(f"{run.workload.name} {o.agent}: interrupted after {run.evaluations_done()} "
                                 f"evaluations; --resume continues it from {o.db}") from None
            finally:
                o.seconds += time.perf_counter() - started
            done = o.why == "exhausted" or run.evaluations_done() >= budget  # at a deadline too
            if done or o.why != "budget":
                active.remove(o)
                run.settings = replace(run.settings, budget=budget)
                o.store.set_run_status(run.run_id, RunStatus.FINISHED if done else RunStatus.STOPPED)
                print(f"{run.workload.name} {o.agent}: {o.why} after {run.evaluations_done()} evaluations", flush=True)


def summary(db: Path, agent: str, workload, path: Path) -> dict:
    """One run's row of the JSON, read from its database (the workload file given: the stored path may
    be another machine's)."""
    if not db.is_file():
        raise SystemExit(f"{db}: no such database")
    with Store.open(db) as store:
        run = store.latest_run()
        if run is None or run.agent != agent:
            _refuse(db, "holds no run" if run is None else f"holds a run of agent {run.agent}, not {agent}")
        check_workload(run, workload, path)
        pairs = node_evaluations(store, run, workload)
        complete = run.status is RunStatus.FINISHED
    nodes, found = [n for n, _ in pairs], [f for _, f in pairs]
    done = sorted((f for f in found if passed(f)), key=lambda f: f.finished_at)
    best, curve = float("inf"), []
    for f in done:
        best = min(best, f.result.latency_ms)
        curve.append(best)
    fastest = min(((n, f) for n, f in zip(nodes, found) if f in done), key=lambda p: p[1].result.latency_ms,
                  default=(None, None))[0]
    root = next((f for n, f in zip(nodes, found) if n.parent_id is None), None)
    root_ms = root.result.latency_ms if passed(root) else None
    return {"agent": agent, "best_ms": curve[-1] if curve else None, "sequential_ms": root_ms,
            "best_so_far_ms": curve, "evaluations": len(done),
            "settled": sum(1 for n in nodes if n.status is not NodeStatus.NEW), "complete": complete,
            "device": done[0].result.metrics.device if done and done[0].result.metrics else None, "db": db.name,
            "best_node": fastest.id if fastest else None}


def best_plan(db: Path, node_id: int) -> dict:
    with Store.open(db) as store:
        return store.node(node_id).plan


def confirm(runs: list[dict], workload: Path, out: Path, evaluator: IsolatedEvaluator, rounds: int) -> float:
    """Each run's best plan and the shipped `streams` plan timed again in one worker process, in turn,
    `rounds` times: latencies that compare across runs whose evaluations were spread over processes.
    Sets each run's `confirmed_ms` (median) and returns `streams`' median."""
    plans = {"streams": load_plan(shipped_plan("streams")).to_dict()}
    plans |= {r["agent"]: best_plan(out / r["db"], r["best_node"]) for r in runs if r["best_node"] is not None}
    times: dict[str, list[float]] = {name: [] for name in plans}
    for turn in range(rounds):
        for name, plan in plans.items():
            result = evaluator.evaluate(plan, workload)
            if result.status != "ok":
                what = "the streams plan" if name == "streams" else f"{name}'s best plan"
                raise SystemExit(f"{workload}: confirming {what}: {result.status}: {result.error}")
            times[name].append(result.latency_ms)
        latest = ", ".join(f"{n} {t[-1]:.3f}" for n, t in times.items())
        print(f"confirm round {turn + 1}/{rounds}: {latest}", flush=True)
    for r in runs:
        r["confirmed_ms"] = statistics.median(times[r["agent"]]) if r["agent"] in times else None
        r["confirmed_all_ms"] = times.get(r["agent"], [])
    return statistics.median(times["streams"])


def _refuse(db: Path, why: str) -> None:
    raise SystemExit(f"{db}: {why}; remove it or give another --out")


def searches(path: Path, name: str, args: argparse.Namespace, end: float | None, left: int,
             shared: IsolatedEvaluator) -> list[dict]:
    """Each agent's run on one workload, all scored by one evaluation worker, taking turns (rotate);
    this workload has its share of the time left, one of `left` workloads. With a time bound and a run
    to go on, the worker is started first on the `sequential` plan (its baselines measured, unless
    carried), so no run's share is spent on what every run uses. Runs not finished when anything
    stops the command are stored stopped."""
    with contextlib.ExitStack() as stack:
        opened: list[Opened] = []
        try:
            for agent in args.agents:
                opened.append(open_run(stack, path, agent, args.budget, shared, args.seed,
                                       args.out / f"{name}_{agent}.db", args.resume, args.carry_baselines,
                                       deepen_first=args.deepen_first))
            if end is not None and any(o.run.evaluations_done() < args.budget for o in opened):
                shared.evaluate(load_plan(shipped_plan("sequential")).to_dict(), path)
            deadline = None if end is None else time.monotonic() + (end - time.monotonic()) / left
            rotate(opened, args.budget, args.step, deadline)
        except BaseException as e:
            for o in opened:
                if o.why != "exhausted" and o.run.evaluations_done() < args.budget:
                    o.store.set_run_status(o.run.run_id, RunStatus.STOPPED)
            if isinstance(e, KeyboardInterrupt):
                raise SystemExit(f"{name}: interrupted before its searches began; --resume continues") from None
            raise
    w = load_workload(path)
    return [{**summary(o.db, o.agent, w, path), "seconds": o.seconds} for o in opened]


def plot(name: str, runs: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    for r in runs:
        ax.plot(range(1, len(r["best_so_far_ms"]) + 1), r["best_so_far_ms"], label=r["agent"])
    ax.set_xlabel("evaluations")
    ax.set_ylabel("best round latency (ms)")
    ax.set_title(name)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_comparison(path: Path, out: Path) -> None:
    """OUT/<workload>_searchers.png for each workload of a comparison JSON (a call's, a merged one, or
    one with runs carried from other calls), every run it lists."""
    try:
        workloads = json.loads(path.read_text())["workloads"]
        named = [(w["workload"], w["runs"]) for w in workloads]
        if not all(isinstance(r["agent"], str) and r["best_so_far_ms"] for _, runs in named for r in runs):
            raise ValueError("a run without agent or best_so_far_ms")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"error: {path}: not a searchers comparison ({e})") from None
    out.mkdir(parents=True, exist_ok=True)
    for name, runs in named:
        plot(name, runs, out / f"{name}_searchers.png")
        print(out / f"{name}_searchers.png")


def merge(paths: list[Path]) -> dict:
    """One comparison from the JSON of several calls: {"gpu", "evaluator", "budget", "modeled",
    "commands": [each call's], "workloads": [every call's, in order]}. SystemExit naming the file that
    is no such JSON, differs from the first in GPU, evaluator, budget or modeled, or repeats a workload."""
    out: dict | None = None
    for path in paths:
        try:
            part = json.loads(path.read_text())
            same = {key: part[key] for key in ("gpu", "evaluator", "budget", "modeled")}
            command, workloads = part["command"], [dict(w) for w in part["workloads"]]
            names = [w["workload"] for w in workloads]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise SystemExit(f"--merge {path}: not a JSON this script wrote ({type(error).__name__}: {error})")
        if out is None:
            out = same | {"commands": [], "workloads": []}
        differ = [key for key, value in same.items() if out[key] != value]
        if differ:
            raise SystemExit(f"--merge {path}: its {', '.join(differ)} differ from {paths[0]}'s")
        twice = sorted(set(names) & {w["workload"] for w in out["workloads"]}) or sorted(
            {n for n in names if names.count(n) > 1})
        if twice:
            raise SystemExit(f"--merge {path}: {', '.join(twice)} twice")
        out["commands"].append(command)
        out["workloads"] += workloads
    return out


def print_table(out: dict) -> None:
    print(f"{'workload':24} {'agent':10} {'sequential':>10} {'best':>8} {'confirmed':>9} {'evals':>5}")
    for w in out["workloads"]:
        for r in w["runs"]:
            cells = [("-" if r.get(k) is None else f"{r[k]:.3f}") for k in ("sequential_ms", "best_ms", "confirmed_ms")]
            print(f"{w['workload']:24} {r['agent']:10} {cells[0]:>10} {cells[1]:>8} {cells[2]:>9} {r['evaluations']:5d}"
                  f"{'' if r['complete'] else '  (cut short)'}")
        if "confirmed_streams_ms" in w:
            print(f"{w['workload']:24} {'streams':10} {'':>10} {'':>8} {w['confirmed_streams_ms']:9.3f}")


def main() -> None:
    parser = make_parser(__doc__)
    parser.add_argument("workloads", nargs="*", type=Path)
    parser.add_argument("--agents", nargs="+", default=["heuristic", "random", "greedy"])
    parser.add_argument("--budget", type=int, default=40)
    parser.add_argument("--evaluator", default="h200")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/searchers"))
    parser.add_argument("--time", type=float, help="seconds for the whole command, shared among the workloads")
    parser.add_argument("--deepen-first", action="store_true",
                        help="MCTS: once an edit of an expansion gains, the others wait (SearchSettings.deepen_first)")
    parser.add_argument("--step", type=int, default=5, help="evaluations a run makes in its turn (default 5)")
    parser.add_argument("--resume", action="store_true", help="continue the runs whose databases are in --out")
    parser.add_argument("--carry-baselines", action="store_true",
                        help="with --resume: the torch baselines each database measured, not compiled again")
    parser.add_argument("--report", action="store_true", help="only read the databases in --out: no search")
    parser.add_argument("--confirm", type=int, default=0, metavar="ROUNDS",
                        help="time each run's best plan and `streams` again in one process, in turn, ROUNDS times")
    parser.add_argument("--merge", nargs="+", type=Path, metavar="CALL.json",
                        help="measure nothing: join these calls' JSON into --json")
    parser.add_argument("--plot", type=Path, metavar="COMPARISON.json",
                        help="measure nothing: one best-so-far plot per workload of this JSON, all its runs, in --out")
    args = parser.parse_args()
    if args.plot:
        return plot_comparison(args.plot, args.out)
    if args.merge:
        if not args.json:
            parser.error("--merge needs --json (the joined file)")
        out = merge(args.merge)
        write_json(args.json, out)
        return print_table(out)
    if not args.workloads:
        parser.error("name at least one workload file")
    if args.step < 1:
        parser.error(f"--step {args.step}: a run's turn is at least one evaluation")
    end = None if args.time is None else time.monotonic() + args.time
    args.out.mkdir(parents=True, exist_ok=True)
    out = {**environment("searchers"), "gpu": None, "evaluator": args.evaluator, "budget": args.budget,
           "workloads": []}  # "gpu": the device the runs name (the GPU modeled, for a model evaluator)
    for index, path in enumerate(args.workloads):
        name = load_workload(path).name
        row = {"workload": name}
        with contextlib.ExitStack() as stack:
            shared = None if args.report and not args.confirm else stack.enter_context(
                IsolatedEvaluator(load_profile(args.evaluator)))
            if args.report:
                runs = [summary(args.out / f"{name}_{agent}.db", agent, load_workload(path), path)
                    for agent in args.agents]
            else:
                runs = searches(path, name, args, end, len(args.workloads) - index, shared)
            if args.confirm:
                row["confirmed_streams_ms"] = confirm(runs, path, args.out, shared, args.confirm)
        plot(name, runs, args.out / f"{name}_searchers.png")
        out["workloads"].append({**row, "runs": runs})
        out["gpu"] = out["gpu"] or next((r["device"] for r in runs if r.get("device")), None)
        out["modeled"] = load_profile(args.evaluator).kind != "gpu"  # then "gpu" is the GPU modeled
        write_json(args.json, out)
    print_table(out)


if __name__ == "__main__":
    try:
        main()
    except ConjugateError as e:  # bad input: one line, no traceback
        raise SystemExit(f"error: {e}") from None
