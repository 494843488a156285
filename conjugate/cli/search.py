"""`conjugate search`: MCTS over a persistent plan tree, started anew or resumed."""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from rich.console import Console

from conjugate.cli.arguments import (MAX_TIMEOUT_S, WORKLOAD_HELP, dollars, duration, evaluator_help, integer, run_id,
                                     run_name, seconds_option, seed, workload_name_or_file)
from conjugate.cli.console import out
from conjugate.cli.devices import require_device
from conjugate.cli.show import show_run
from conjugate.errors import ConjugateError
from conjugate.paths import DEFAULT_WORKLOAD, PROFILES_DIR, RUNS_DIR
from conjugate.search.databases import open_store
from conjugate.search.gpus import Helpers, parse_gpus, pin_this_process
from conjugate.search.settings import LIMITS
from conjugate.search.store.integrity import DAMAGED

if TYPE_CHECKING:
    from conjugate.agents.base import Proposer
    from conjugate.search.run import Search
    from conjugate.search.store import Store

MAX_BUDGET = int(LIMITS["budget"])  # evaluations in one run: the bounds the stored settings are held to
MAX_WIDTH = int(LIMITS["expand_width"])  # edits asked for per expansion
MAX_GPUS = 1024  # a GPU index past this is a typo


def _without_userinfo(url: str) -> str:
    """A base URL as the run may store it: credentials in it (user:password@) are dropped, never kept."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else ""))) \
        if parts.username or parts.password else url


@dataclass(frozen=True)
class AgentSettings:
    """The agent a search command runs: named on the command line, or recorded by the run it resumes."""
    spec: str  # heuristic, replay, anthropic:<model>, openai:<model>
    seed: int
    base_url: str | None  # as given, credentials included (the run stores it without them)
    max_cost_usd: float | None
    replay_from: str | None  # with the replay agent: the database whose edits to replay
    llm_timeout_s: float | None = None  # one LLM request's timeout (the search's time left caps it too)


def cmd_search(args: argparse.Namespace, out: Console) -> int:
    deadline = time.monotonic() + duration(args.time) if args.time else None
    if args.llm_timeout is not None:
        args.llm_timeout = seconds_option(args.llm_timeout, "--llm-timeout")
    args.gpus = parse_gpus(args.gpus) if args.gpus else []
    if any(int(gpu) >= MAX_GPUS for gpu in args.gpus):
        raise ConjugateError(f"--gpus: GPU indices are below {MAX_GPUS}")
    if args.gpus:
        pin_this_process(args.gpus[0])  # before the evaluation worker starts
    return (_resume if args.resume else _start)(args, out, deadline)


def _joiners(args: argparse.Namespace, db: str, deadline: float | None) -> Callable[[int], Helpers] | None:
    """With --gpus, a process per further GPU joining the run once it exists (gpus.py)."""
    if len(args.gpus) < 2:
        return None
    extra = [item for flag, value in (("--base-url", args.base_url), ("--max-llm-cost", args.max_llm_cost),
                                      ("--llm-timeout", args.llm_timeout), ("--replay-from", args.replay_from),
                                      ("--budget", args.budget))
             if value is not None for item in (flag, str(value))]
    extra += ["--carry-baselines"] if args.carry_baselines else []
    extra += [str(args.workload)] if args.workload else []  # a resumed run's workload file, where it moved
    log_dir = Path(db).resolve().parent if "://" not in db else RUNS_DIR
    return lambda run_id: Helpers(db, run_id, args.gpus[1:], log_dir, deadline, extra)


def _start(args: argparse.Namespace, out: Console, deadline: float | None) -> int:
    """A new run of the workload, evaluator and agent the command line names."""
    if args.carry_baselines:
        raise ConjugateError("--carry-baselines: only with --resume (a new run has measured no baselines to carry)")
    if args.run is not None:
        raise ConjugateError(f"--run {args.run}: only with --resume DB (a new run gets the next id)")
    from conjugate.evaluate.evaluators import load_profile
    from conjugate.evaluate.worker import IsolatedEvaluator
    from conjugate.search.run import Search
    from conjugate.search.settings import SearchSettings
    from conjugate.search.scoring import scored_by
    from conjugate.workload import load_workload

    workload_path = str(Path(args.workload or DEFAULT_WORKLOAD).resolve())  # resumed or exported elsewhere
    agent = AgentSettings(args.agent, args.seed, args.base_url, args.max_llm_cost, args.replay_from, args.llm_timeout)
    call_log = _CallLog(None, None)
    proposer = _proposer(agent, call_log)  # a bad --agent fails before a database exists
    workload, profile = load_workload(workload_path), load_profile(args.evaluator)
    require_device(profile)  # before a run exists: it would only stop at its first evaluation
    settings = scored_by(SearchSettings(budget=args.budget or 20, expand_width=args.width,
                                         deepen_first=args.deepen_first,
                                         base_url=_without_userinfo(args.base_url or "")), profile)
    name = args.name or Path(workload_path).stem
    db = args.db or str(RUNS_DIR / f"{name}.db")
    with open_store(db, create=True) as store, IsolatedEvaluator(profile) as evaluator:
        call_log.store = store

        def start() -> Search:
            search = Search.start(store, name, workload, workload_path, evaluator, proposer, settings, agent.seed)
            call_log.run_id = search.run_id
            return search
        return _drive(store, start, out, deadline, _joiners(args, db, deadline))


def _resume(args: argparse.Namespace, out: Console, deadline: float | None) -> int:
    """The latest run of the database (or --run) where it stopped, with its own workload, evaluator
    profile and agent; only the budget, the LLM server and the cost cap may be given anew."""
    from conjugate.evaluate.evaluators import ProfileError, load_profile
    from conjugate.evaluate.worker import IsolatedEvaluator
    from conjugate.search.report import run_history
    from conjugate.search.run import Search
    from conjugate.search.runs import baselines_to_carry, run_evaluator_id, run_profile_source, run_workload_file
    from conjugate.search.settings import SearchSettings, evaluator_id
    from conjugate.search.scoring import scored_by
    from conjugate.search.store import RunStatus, StoreError

    with open_store(args.resume) as store:
        store.check_writable()
        run = store.latest_run() if args.run is None else store.run(args.run)
        if run is None:
            raise ConjugateError(f"{args.resume}: holds no run to resume")
        workload, workload_file = run_workload_file(run, args.workload)
        args.workload = workload_file  # the processes joining on other GPUs read it too
        try:
            stored = SearchSettings.from_dict(run.settings)
        except ValueError as e:
            raise ConjugateError(f"{args.resume}: runs row {run.id}: field 'settings': {e}: {DAMAGED}") from None
        source = run_profile_source(stored.evaluator_profile, run.evaluator)
        if source != stored.evaluator_profile and not (PROFILES_DIR / f"{source}.toml").exists():
            gone = stored.evaluator_profile or "(none stored)"
            raise ConjugateError(f"{args.resume}: run {run.id}: its evaluator profile {gone} is gone and no "
                                 f"shipped profile is named {run.evaluator!r}: give the run's profile file back "
                                 "at that path")
        try:
            profile = load_profile(source)
        except ProfileError as e:  # the run's own file or name, not a command-line option
            raise ConjugateError(f"{args.resume}: run {run.id}: the evaluator profile it stored: "
                                 f"{str(e).removeprefix('--evaluator: ')}") from None
        require_device(profile)  # before the run is marked running
        if evaluator_id(profile) != run_evaluator_id(run):
            raise ConjugateError(f"{profile.source}: the evaluator profile changed since run {run.id} started; "
                                 "start a new run to score with it")
        settings = scored_by(replace(stored, budget=args.budget or stored.budget), profile)
        agent = AgentSettings(run.agent, run.seed, args.base_url or stored.base_url or None,  # the run's own server
                              args.max_llm_cost, args.replay_from, args.llm_timeout)
        proposer = _proposer(agent, _CallLog(store, run.id))
        if not run_history(store, run, workload):  # every row read and checked before the run is marked running
            raise StoreError(f"run {run.id} holds no node, not even its root plan: nothing to resume (start a new run)")
        with IsolatedEvaluator(profile) as evaluator:
            if args.carry_baselines:
                evaluator.carried = baselines_to_carry(store, run.id, workload, run_evaluator_id(run))
                out.print(_carrying(evaluator.carried, run.id))

            def resume() -> Search:
                search = Search(store, run.id, workload, workload_file, evaluator, proposer, settings)
                store.set_run_status(run.id, RunStatus.RUNNING)
                return search
            return _drive(store, resume, out, deadline, _joiners(args, args.resume, deadline))


def _carrying(carried: dict | None, run_id: int) -> str:
    """What --carry-baselines takes, in one line."""
    if carried is None:
        return f"run {run_id} holds no measured conventional or streams baseline to carry: measuring the baselines"
    names = ", ".join(f"{name} {b['latency_ms']:.3f} ms" for name, b in carried["baselines"].items())
    return f"carrying {names} ({carried['from']}, {carried['device']}) where this GPU is the same"


def _drive(store: Store, make: Callable[[], Search], out: Console, deadline: float | None,
           joiners: Callable[[int], Helpers] | None = None) -> int:
    """Make the search and run it (with `joiners`, beside processes on other GPUs); Ctrl-C marks the
    run stopped and says how to resume it, and so does any error that ends it: no run is left
    marked running."""
    from conjugate.search.store import RunStatus, StoreError

    search = None
    try:
        search = make()
        if joiners is None:
            return _run(search, out, deadline)
        with joiners(search.run_id) as helpers:
            out.print(f"GPUs {', '.join(h[0] for h in helpers.procs)} join run {search.run_id}: logs in "
                      f"{helpers.log_dir}")
            code = _run(search, out, deadline)
        for line in helpers.report():
            out.print(line)
        return code
    except (KeyboardInterrupt, Exception) as e:
        if search is not None:
            store.set_run_status(search.run_id, RunStatus.STOPPED)
            if not isinstance(e, StoreError):  # a damaged store would only fail again
                out.print(f"stopped; resume with: conjugate search --resume {store.url_for_display}")
        raise


class _CallLog:
    """Persists each LLM call under the run (known once the run exists)."""

    def __init__(self, store, run_id: int | None):
        self.store, self.run_id = store, run_id

    def __call__(self, record: dict) -> None:
        self.store.record_llm_call(self.run_id, **record)


def _proposer(agent: AgentSettings, call_log: _CallLog) -> Proposer:
    from conjugate.agents import make_proposer
    from conjugate.search.runs import replay_records

    records = None
    if agent.spec == "replay":
        if not agent.replay_from:
            raise ConjugateError("--agent replay needs --replay-from DB (the database of the run to replay)")
        with open_store(agent.replay_from) as recorded:
            records = replay_records(recorded)
    spent = call_log.store.llm_cost(call_log.run_id) if call_log.run_id is not None else 0.0
    return make_proposer(agent.spec, seed=agent.seed, base_url=agent.base_url, log_call=call_log,
                         max_cost_usd=agent.max_cost_usd, spent_usd=spent, replay_records=records,
                         timeout_s=agent.llm_timeout_s)


def _run(search: Search, out: Console, deadline: float | None) -> int:
    """Run the search to its end; exit status 1 when evaluations ran and not one of them succeeded."""
    from conjugate.agents.llm import LLMBudgetExceeded
    from conjugate.search.live import LiveView
    from conjugate.search.store import RunStatus

    out.print(f"run {search.run_id} in {search.store.url_for_display}: {search.workload.name}, agent "
              f"{search.proposer.name}, evaluator {search.evaluator.profile.name}, budget {search.settings.budget}")
    with LiveView(out, search.settings.budget, search.evaluations_done()) as view:
        search.on_event = view.event
        try:
            why = search.run_loop(deadline)
        except LLMBudgetExceeded as e:
            why = f"LLM cost cap reached: {e}"
    status = RunStatus.FINISHED if why in ("budget", "exhausted") else RunStatus.STOPPED
    search.store.set_run_status(search.run_id, status)
    none_ok = _none_succeeded(search)
    out.print(f"search {status} ({why}) after {search.evaluations_done()} evaluations"
              + (": no evaluation succeeded (every plan failed; the failures are below)" if none_ok else ""))
    show_run(search.store, search.store.run(search.run_id), out, limit=5, workload=search.workload)
    return 1 if none_ok else 0


def _none_succeeded(search: Search) -> bool:
    """The run has settled evaluations, and not one of them gave a working plan."""
    results = search.results.values()
    return bool(results) and not any(r.ok for r in results)


def add_command(sub) -> None:
    search = sub.add_parser("search", help="search for the fastest plan: MCTS over a persistent plan tree")
    search.add_argument("workload", nargs="?", type=workload_name_or_file,
                        help=f"{WORKLOAD_HELP} (default: the tiny CPU one); with --resume, the run's workload file "
                             "where the database moved away from it")
    search.add_argument("--db", help="SQLAlchemy URL or SQLite file (default: runs/<name>.db)")
    search.add_argument("--name", type=run_name, help="run name (default: the workload file's stem)")
    search.add_argument("--agent", default="heuristic", help="heuristic (default), random, greedy (the search's "
                        "baselines), replay, anthropic:<model>, openai:<model>")
    search.add_argument("--budget", type=integer(1, MAX_BUDGET), help="evaluations in the run, seeds included "
                        f"(default 20, at most {MAX_BUDGET})")
    search.add_argument("--time", help="stop after this long: 90s, 30m, 2h")
    search.add_argument("--seed", type=seed, default=0, help="seeds the agent's random choices and the tree search's "
                        "tie-breaks (default 0)")
    search.add_argument("--evaluator", default="analytical", help=evaluator_help())
    search.add_argument("--width", type=integer(1, MAX_WIDTH), default=3, help="edits asked for per expansion "
                        f"(default 3, at most {MAX_WIDTH})")
    search.add_argument("--deepen-first", action="store_true", help="once an edit of an expansion gains, "
                        "leave the expansion's other edits for later and build on the gain first")
    search.add_argument("--base-url", help="an OpenAI-compatible server (vLLM, llama.cpp, Ollama) or API proxy")
    search.add_argument("--max-llm-cost", type=dollars, help="stop asking the LLM after this many US dollars")
    search.add_argument("--llm-timeout", metavar="SECONDS", help=f"one LLM request's timeout (default 600, at most "
                        f"{MAX_TIMEOUT_S}; never past what is left of --time)")
    search.add_argument("--replay-from", help="with --agent replay: the database whose edits to replay")
    search.add_argument("--resume", metavar="DB", help="continue the latest run (or --run) of this database")
    search.add_argument("--run", type=run_id, help="with --resume: the id of the run to continue (conjugate show "
                        "DB lists them; default: the latest)")
    search.add_argument("--carry-baselines", action="store_true", help="with --resume: take the torch baselines "
                        "(conventional, streams) the run measured earlier on a GPU of this name instead of compiling "
                        "them again (minutes in a fresh process); results name where they were measured")
    search.add_argument("--gpus", help="search on these GPUs at once, e.g. 0,1: this process on the first, one "
                        "joining the run per other GPU (one tree, one budget)")
    search.set_defaults(func=lambda a: cmd_search(a, out))
