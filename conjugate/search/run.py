"""The search loop: Monte Carlo tree search over plans, every step persisted in the store.

    seed     the sequential plan is the root; the shipped streams and interleave plans (and the best
             plans of earlier runs on this evaluator: this model family's first, then any other's
             translated to this pair, transfer.py) are its children
    select   PUCT with priors and progressive widening (mcts.py) picks the node to expand
    expand   the proposer suggests a few edits of it; each new plan becomes a child (a plan already
             in the run is not added again)
    evaluate each new child, once per plan, workload and evaluator across every run and process
             sharing the database (store claims); a failed plan scores 0 and its error reaches the
             proposer through the context of later expansions
    backprop the reward (the plan's speedup over the sequential baseline) up its path, in the same
             transaction that marks the node evaluated, so a resumed run never counts it twice

A run killed at any point resumes exactly: the tree's statistics live in the store, a node created
but not yet settled is evaluated (or its finished evaluation reused) first, and an evaluation left
"running" by a dead process is taken over.
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable, Protocol

from conjugate.agents.base import Proposal, Proposer, ProposerUnavailable
from conjugate.errors import ConjugateError, PatchError, PlanError, WorkloadError
from conjugate.evaluate.result import CARRIABLE_BASELINES, EvalResult, Stage
from conjugate.graph import build_graph
from conjugate.paths import REWARD_BASELINE, SEED_PLANS, shipped_plan
from conjugate.plan import load_plan, patch_plan, validate_plan
from conjugate.roles import Model
from conjugate.search.context import ContextBuilder, device_of, family_of
from conjugate.search.mcts import MCTS, TreeNode, rebuild
from conjugate.search.moves import MoveMemory, conflict, move_key
from conjugate.search.selection import select
from conjugate.search.store import NodeRecord, NodeStatus, RunRecord, RunStatus, Store, StoreError, owner_id
from conjugate.search.transfer import same_pair_shape, translate_plan
from conjugate.secrets import scrub
from conjugate.workload import Workload


@dataclass(frozen=True)
class SearchSettings:
    budget: int = 20  # evaluations in the run, seeds included
    expand_width: int = 3  # edits asked for per expansion
    c_puct: float = 0.7
    behind_margin: float = 0.05  # a branch this far under the best reward is not expanded (mcts.py)
    deepen_margin: float = 0.005  # a node outgained by this much by an open branch is not widened (mcts.py)
    best_weight: float = 1.0  # a branch's value: its best reward (1) or blended with its mean (mcts.py)
    deepen_first: bool = False  # MCTS: once a child gains by deepen_margin, its unmeasured siblings wait
    frontier_width: int = 0  # MCTS: a node none of whose children gained is widened up to this many (0: no cap)
    exploit_every: int = 0  # MCTS: every this many expansions, the run's best open node is widened instead (0: off)
    exploit_last: float = 0.25  # MCTS: over this share of the budget's end, the run's best open node is widened
    move_memory: int = 2  # with MCTS, a move that lost in this many branches is not offered again (moves.py); 0: off
    merge_moves: bool = True  # with move memory, each expansion also offers the run's gains together (moves.py)
    charge_merges: bool = True  # and the moves of a merge that lost join no later merge (moves.py)
    warm_start: int = 2  # best plans of earlier runs seeded (same evaluator; this model family first)
    stale_after_s: float = 1800.0  # a "running" evaluation older than this is taken over
    evaluator_profile: str = ""  # the profile file the run scores with: a resume loads it again
    evaluator_id: str = ""  # its evaluator_id(): the evaluations' key
    base_url: str = ""  # the LLM server the agent used (--base-url), for a resume

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SearchSettings":
        """The settings a run stored; a field this version does not know is dropped, one it lacks
        takes its default, one of the wrong type or out of range (a negative or non-finite number, a
        budget or expansion width under one) is refused."""
        known = {f.name: f.type for f in fields(cls)}
        # runs stored before these settings: without them (the rest of the tree policy is this version's)
        stored_before = {"behind_margin": 0.0, "move_memory": 0, "deepen_margin": 0.0, "best_weight": 0.5,
                         "merge_moves": False, "charge_merges": False,
                         "exploit_last": 0.0}
        values = stored_before | {k: v for k, v in data.items() if k in known}
        for key, value in values.items():
            kind = {"int": int, "float": (int, float), "str": str, "bool": bool}[known[key]]
            if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
                raise ValueError(f"stored search setting {key!r} is {value!r}")
            least = 1 if key in ("budget", "expand_width") else 0
            if kind is not bool and kind is not str and not (math.isfinite(value) and value >= least):
                raise ValueError(f"stored search setting {key!r} is {value!r}, not a finite number of at least {least}")
            if key == "exploit_last" and value > 1:
                raise ValueError(f"stored search setting {key!r} is {value!r}, not a share of the budget (0 to 1)")
        return cls(**values)


class Evaluator(Protocol):
    """IsolatedEvaluator's interface: one plan on one workload file, never raising."""
    profile: Any

    def evaluate(self, plan: dict, workload_path: str | Path) -> EvalResult: ...


CARRIED = "gained elsewhere in this run, so made here too: "  # a carried move's rationale starts so
MERGE_SUFFIX = "+merge"  # a merge's node is recorded as its proposer's name and this (Search._merged)


class SetupFailed(ConjugateError):
    """An evaluation failed before its plan was looked at (no GPU, unreadable weights): every plan
    would fail alike, so the search stops instead of recording it as the plan's failure."""


def reward_of(result: EvalResult) -> float:
    """A plan's speedup over the sequential baseline; 0 for a plan that failed."""
    if not result.ok:
        return 0.0
    speedups = result.speedups
    return float(speedups.get(REWARD_BASELINE) or next(iter(speedups.values()), 0.0))


def eval_key(plan_hash: str, workload: Workload, evaluator_id: str) -> str:
    """What makes two evaluations the same: the plan, the workload and the evaluator (see evaluator_id)."""
    body = json.dumps([plan_hash, workload.to_dict(), evaluator_id], sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()


def baselines_to_carry(store: Store, run_id: int, workload: Workload, evaluator: str) -> dict | None:
    """The torch baselines (`conventional`, `streams`) of the run's latest evaluation that measured
    one of them correct, for a resumed run's evaluator to carry instead of building them again
    (pipeline.evaluate's `carried_baselines`); None when the run has none (modeled, or none yet)."""
    found = [(f, node) for node in store.nodes(run_id)
             for f in [store.evaluation(eval_key(node.plan_hash, workload, evaluator))]
             if f is not None and f.done and f.result is not None and f.result.metrics is not None
             and not f.result.modeled]
    for f, node in sorted(found, key=lambda p: p[0].finished_at or p[0].started_at, reverse=True):
        kept = {name: b.to_dict() for name, b in f.result.metrics.baselines.items()
                if name in CARRIABLE_BASELINES and b.status == "ok"}
        if kept:  # the run that measured it: evaluations are shared by the runs of a database
            when = f", {f.finished_at:%Y-%m-%d %H:%M}" if f.finished_at else ""
            return {"device": f.result.metrics.device, "baselines": kept,
                    "workload": json.loads(json.dumps(workload.to_dict(), default=str)),
                    "from": f"run {f.run_id if f.run_id is not None else run_id}, evaluation of node {node.id}{when}"}
    return None


def evaluator_id(profile) -> str:
    """The profile's name and a digest of its settings: a re-calibrated or edited profile scores
    afresh instead of reusing results of its earlier constants. A measured profile names the GPU it
    measures on (`device`), so its results never stand for another GPU's."""
    settings = {k: v for k, v in profile.to_dict().items() if k != "source" and not (k == "device" and not v)}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return f"{profile.name}@{digest}"


def check_workload(run: RunRecord, workload: Workload, path: str | Path | None = None) -> None:
    """A run's evaluations are keyed by its workload as it was: refuse a workload file edited since (or,
    `path` given, another workload), naming the first field that differs."""
    stored_workload(run)
    differs = _first_difference(workload.to_dict(), _stored_workload(run))
    if differs is None:
        return
    key, now, then = differs
    what = f"field {key!r} is {_short(now)}, the run's {_short(then)}"
    if path is not None:
        raise ConjugateError(f"{path}: not the workload run {run.id} searched ({run.workload_name}): {what}")
    raise ConjugateError(f"{run.workload_path}: the workload changed since run {run.id} started ({what}); "
                         "start a new run for the new workload")


def _first_difference(now: Any, then: Any, key: str = "") -> tuple[str, Any, Any] | None:
    """The first (dotted key, value now, value then) where two workload dicts differ, or None."""
    if isinstance(now, dict) and isinstance(then, dict):
        for k in sorted(set(now) | set(then)):
            found = _first_difference(now.get(k), then.get(k), f"{key}.{k}" if key else k)
            if found is not None:
                return found
        return None
    same = json.dumps(now, sort_keys=True, default=str) == json.dumps(then, sort_keys=True, default=str)
    return None if same else (key, now, then)


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _stored_workload(run: RunRecord) -> dict[str, Any]:
    return {k: v for k, v in run.workload.items() if k != "family"}


def stored_workload(run: RunRecord) -> Workload:
    """The workload as the run stored it, its fields checked as a file's are; StoreError when they
    cannot be read (a damaged store, or one written by another version)."""
    from conjugate.models.spec import ModelSpec
    from conjugate.workload import check_fields, check_models

    data = _stored_workload(run)
    where = f"run {run.id}'s stored workload"
    damaged = "a damaged store, or one of another version"
    try:
        check_fields({k: v for k, v in data.items() if k in ("name", "k", "draft_batch", "target_batch", "context",
                                                            "dtype", "seed", "kv_init")}
                     | {"draft": data.get("draft_source", ""), "target": data.get("target_source", "")}, where)
        specs = {}
        for key in ("draft", "target"):
            try:
                specs[key] = ModelSpec.from_dict(data[key])
            except (TypeError, KeyError, ValueError) as e:
                reason = f"no {e}" if isinstance(e, KeyError) else str(e)
                raise StoreError(f"{where}: field {key!r} cannot be read ({reason}): {damaged}") from None
        check_models(specs["draft"], specs["target"], where)
        return Workload(**{**data, **specs})
    except WorkloadError as e:
        raise StoreError(f"{e}: {damaged}") from None
    except TypeError as e:
        raise StoreError(f"{where} cannot be read ({e}): {damaged}") from None


_GIVE_WORKLOAD = "give its file (conjugate search W --resume DB, conjugate show|export DB --workload W)"


def run_workload(run: RunRecord, given: str | Path | None = None) -> Workload:
    """The workload a stored run searched, checked against the one it stored: the file given, else
    the file the run was started with, else (a database moved to another machine or checkout) the
    workload as the run stored it, where its models are presets or checkpoints still where the run
    found them (their paths are part of the workload, so they must be there in any case)."""
    from conjugate.workload import load_workload

    if given is not None or Path(run.workload_path).exists():
        workload = load_workload(given if given is not None else run.workload_path)
        check_workload(run, workload, given)
        return workload
    try:
        workload = stored_workload(run)
    except StoreError as e:
        raise StoreError(f"{run.workload_path}: no such workload file, and {e}; {_GIVE_WORKLOAD}") from None
    for field_name, model in (("draft", Model.DRAFT), ("target", Model.TARGET)):
        directory = workload.checkpoint_dir(model)
        if directory is not None and not directory.is_dir():
            raise ConjugateError(f"{run.workload_path}: no such workload file, and its field {field_name!r} names a "
                                 f"checkpoint that is not here either ({directory}); the run needs it at that path")
    return workload


def run_workload_file(run: RunRecord, given: str | Path | None = None) -> tuple[Workload, str]:
    """The run's workload (run_workload) and a file holding it for the evaluation worker and the
    processes joining the run: the file given, the run's own, or the stored workload written to a
    file of this process (removed when it exits)."""
    from conjugate.workload import load_workload

    workload = run_workload(run, given)
    if given is not None:
        return workload, str(Path(given).resolve())
    if Path(run.workload_path).exists():
        return workload, run.workload_path
    written = _written(workload)
    try:  # as the worker will read it (checkpoints included)
        check_workload(run, load_workload(written), written)
    except ConjugateError as e:
        raise StoreError(f"run {run.id}'s stored workload does not read back as itself ({e}): a damaged store, "
                         "or one of another version") from None
    return workload, str(written)


def _written(workload: Workload) -> Path:
    import atexit
    import shutil
    import tempfile

    from conjugate.workload import workload_toml

    folder = Path(tempfile.mkdtemp(prefix="conjugate-workload-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = folder / "workload.toml"  # the workload's name may be no file name
    path.write_text(workload_toml(workload))
    return path


def run_profile_source(stored_path: str, name: str) -> str:
    """The run's own profile file, or (a database moved to another machine or checkout, the file not
    there) the shipped profile of its name; the evaluator id check refuses it if its settings differ."""
    return stored_path if stored_path and Path(stored_path).exists() else name


def run_evaluator_id(run: RunRecord) -> str:
    """The evaluator id a stored run keyed its evaluations by."""
    found = run.settings.get("evaluator_id") if isinstance(run.settings, dict) else None
    if not isinstance(found, str) or not found:
        raise StoreError(f"run {run.id}: field 'settings.evaluator_id' is missing or not text: a damaged store")
    return found


class Search:
    def __init__(self, store: Store, run_id: int, workload: Workload, workload_path: str, evaluator: Evaluator,
                 proposer: Proposer, settings: SearchSettings, on_event: Callable[[str, dict], None] | None = None):
        self.store, self.run_id, self.workload, self.workload_path = store, run_id, workload, str(workload_path)
        self.evaluator, self.proposer, self.settings = evaluator, proposer, settings
        self.on_event = on_event or (lambda kind, data: None)
        self.run = store.run(run_id)
        self.context = ContextBuilder(store, self.run, *device_of(evaluator.profile))
        self.mcts = MCTS(c_puct=settings.c_puct, behind_margin=settings.behind_margin,
                         deepen_margin=settings.deepen_margin, best_weight=settings.best_weight,
                         frontier_width=settings.frontier_width)
        self.evaluator_id = settings.evaluator_id or evaluator_id(evaluator.profile)
        self.results: dict[str, EvalResult] = {}  # plan hash -> result of this run's settled nodes
        self.tree: dict[int, TreeNode] = {}

    # -- starting and resuming -------------------------------------------------------------
    @classmethod
    def start(cls, store: Store, name: str, workload: Workload, workload_path: str, evaluator: Evaluator,
              proposer: Proposer, settings: SearchSettings, seed: int, on_event=None) -> "Search":
        data = {**workload.to_dict(), "family": f"{workload.draft.family}->{workload.target.family}"}
        settings = replace(settings, evaluator_id=settings.evaluator_id or evaluator_id(evaluator.profile))
        run_id = store.create_run(name, data, workload_path, evaluator.profile.name, proposer.name, seed,
                                  settings.to_dict())
        try:
            search = cls(store, run_id, workload, workload_path, evaluator, proposer, settings, on_event)
            search._seed()
        except BaseException:  # a run that never started is not left "running"
            store.set_run_status(run_id, RunStatus.STOPPED)
            raise
        return search

    def _seed(self) -> None:
        root_plan = load_plan(shipped_plan(SEED_PLANS[0]))
        root_id, _ = self.store.add_node(self.run_id, root_plan.to_dict(), root_plan.hash, None, None,
                                         "baseline: draft phase, then verify phase", "seed", "other", 1.0)
        seeds = [(load_plan(shipped_plan(n)).to_dict(), f"shipped plan {n}", "seed") for n in SEED_PLANS[1:]]
        seeds += self._warm_starts()
        for plan, why, proposer in seeds:
            try:
                plan = validate_plan(plan)
            except PlanError:  # a warm start from an older schema: not worth failing the run over
                continue
            self.store.add_node(self.run_id, plan.to_dict(), plan.hash, root_id,
                                [{"op": "replace", "path": "", "value": plan.to_dict()}], why, proposer, "other", 1.0)

    def _warm_starts(self) -> list[tuple[dict, str, str]]:
        """The best plans of earlier runs with this evaluator (measured and modeled apart): of this
        model family first, then of any other, their op ids translated to this pair (transfer.py)."""
        family, wanted = family_of(self.run.workload), self.settings.warm_start
        mine = self.store.best_plans(self.run.evaluator, family, wanted, exclude_run=self.run_id)
        others = self.store.best_plans(self.run.evaluator, None, 4 * wanted, exclude_run=self.run_id)
        chosen = [w for w in mine if w["reward"] > 0]  # no failed plan
        chosen += [w for w in others if w["reward"] > 0 and family_of(w["workload"]) != family][:wanted - len(chosen)]
        out, graph = [], None
        for w in chosen[:wanted]:
            plan, why = w["plan"], f"best plan of run {w['run_id']} ({w['workload'].get('name')}): reward {w['reward']:.3f}"
            if not same_pair_shape(w["workload"], self.run.workload):
                graph = graph or build_graph(self.workload)
                plan, why = translate_plan(plan, w["workload"], self.run.workload, graph), why + ", translated to this pair"
            out.append((plan, why, "warm-start"))
        return out

    def _load_tree(self) -> list[NodeRecord]:
        nodes = self.store.nodes(self.run_id)
        for n in nodes:
            found = self.store.evaluation(eval_key(n.plan_hash, self.workload, self.evaluator_id))
            if found is not None and found.done and n.status is not NodeStatus.NEW:
                self.results[n.plan_hash] = found.result
        rows = [{**n.to_dict(), "reward": reward_of(self.results[n.plan_hash]) if n.plan_hash in self.results
                 else None, "closed": n.status is NodeStatus.EXPANDED} for n in nodes]
        self.tree = rebuild(rows)
        return nodes

    # -- the loop --------------------------------------------------------------------------
    def evaluations_done(self) -> int:
        """The run's settled nodes as the store has them: those of earlier sessions (a resumed run) and of
        other processes sharing the run count too. A node is marked expanded only once settled."""
        return sum(1 for n in self.store.nodes(self.run_id) if n.status is not NodeStatus.NEW)

    def _selection(self) -> str:
        """The proposer's selection; with MCTS and exploit_every N, `best` for one expansion in N (counted
        in evaluations, so a resumed run keeps the rhythm): the run's best open node widened, as
        hill-climbing widens it, between the tree policy's choices; with exploit_last, `best` once that
        share of the budget is all that is left."""
        how = getattr(self.proposer, "selection", "mcts")
        every, width = self.settings.exploit_every, max(1, self.settings.expand_width)
        if how != "mcts":
            return how
        done = self.evaluations_done()
        if every > 0 and (done // width) % every == every - 1:
            return "best"
        last = self.settings.exploit_last
        if last > 0 and done >= self.settings.budget - round(self.settings.budget * last):
            return "best"
        return how

    def run_loop(self, deadline: float | None = None) -> str:
        """Search until the budget, the deadline or exhaustion; returns why it stopped."""
        nodes = self._load_tree()
        root_id = min(self.tree)
        for n in nodes:  # resume: what was created but not settled comes first (not siblings left to wait)
            if n.status is NodeStatus.NEW and not self._over(deadline) and not self._waits(n):
                self._evaluate(n)
        while not self._over(deadline):
            root = self.tree[root_id]  # a reload (another process's nodes) replaces the objects
            path = select(self._selection(), self.mcts, root, self.tree, self.run.seed, self.evaluations_done())
            if path == [root] and root.closed:
                return "exhausted"
            try:
                self._expand(path, deadline)
            except ProposerUnavailable as e:  # no answer: the node stays open for a later session
                return "deadline" if self._past(deadline) else f"the agent did not answer: {e}"
        return "deadline" if self._past(deadline) else "budget"

    @staticmethod
    def _past(deadline: float | None) -> bool:
        return deadline is not None and time.monotonic() >= deadline

    def _over(self, deadline: float | None) -> bool:
        return self.evaluations_done() >= self.settings.budget or self._past(deadline)

    def _expand(self, path: list[TreeNode], deadline: float | None = None) -> None:
        leaf = path[-1]
        record = self.store.node(leaf.id)
        if record.status is NodeStatus.NEW:  # not settled yet (another process had its evaluation): settle it first
            self._evaluate(record, deadline)
            return
        self.on_event("expand", {"node": leaf.id, "depth": len(path) - 1})
        context = replace(self.context.build(record, self.results, self.store.nodes(self.run_id)), deadline=deadline)
        memory = self._move_memory()
        width = self.settings.expand_width
        proposals = self.proposer.propose(context, 2 * width if memory else width)  # room for what memory drops
        if memory:
            proposals = self._carried(memory, record, self._remembered(proposals, memory, leaf.id))
            if self.settings.merge_moves:
                proposals = self._merged(memory, record, proposals)
        children = self._add_children(record, proposals, limit=width, merges=memory.merges if memory else set())
        if not children:  # nothing new to offer from here
            leaf.closed = True
            self.store.set_node_status(leaf.id, NodeStatus.EXPANDED)
            return
        for child in children:
            if self._over(deadline) or self._waits(child, {c.id for c in children}):
                return
            self._evaluate(child, deadline)

    def _waits(self, node: NodeRecord, expansion: set[int] | None = None) -> bool:
        """deepen_first: a new node a sibling of which, made in the same expansion (`expansion`: their
        ids; a resume, which cannot tell, counts those made before it), gained over their parent by
        more than deepen_margin is not evaluated now. MCTS then selects again and, the parent being
        outgained (mcts.py), builds on the gain first; the node stays in the tree (unvisited, its
        prior kept) for when selection comes back to it. Without it, each expansion measured all its
        children before selecting again: after a gain, the other edits of that expansion came first.
        Only that expansion's gain counts: a node widened again beside an older gain measures its
        new edits (they would otherwise all wait, and the next expansion ask for more)."""
        if (not self.settings.deepen_first or node.parent_id is None or node.proposer in ("seed", "warm-start")
                or getattr(self.proposer, "selection", "mcts") != "mcts"):
            return False
        parent = self.tree.get(node.parent_id)
        if parent is None or parent.reward is None or parent.reward <= 0:
            return False
        margin = parent.reward * (1 + self.settings.deepen_margin)
        rivals = [c for c in parent.children if c.id != node.id and (c.id in expansion if expansion is not None
                                                                       else c.id < node.id)]
        return any(c.reward is not None and c.reward > margin for c in rivals)

    def _move_memory(self) -> MoveMemory | None:
        """What each move of this run did where it was measured, or None when off: MCTS only (the
        search's baselines, random and greedy, stay as they are), and not for a replay (its recorded
        priors and rationales already carry what the memory did)."""
        if (self.settings.move_memory <= 0 or getattr(self.proposer, "selection", "mcts") != "mcts"
                or self.proposer.name == "replay"):
            return None  # (and None while no move was measured: see the end)
        nodes = self.store.nodes(self.run_id)
        hashes = {n.id: n.plan_hash for n in nodes}
        memory, measured = MoveMemory(), []
        for n in nodes:
            if n.parent_id is None or n.proposer in ("seed", "warm-start") or not n.edit:
                continue
            child, parent = self.results.get(n.plan_hash), self.results.get(hashes[n.parent_id])
            if child is not None and parent is not None and reward_of(parent) > 0:
                gain = reward_of(child) / reward_of(parent) - 1
                memory.add(n.edit, gain, n.edit_kind, n.rationale)
                measured.append((n.edit, gain))
        memory.merges = {move_key(n.edit) for n in nodes if n.edit and n.proposer.endswith(MERGE_SUFFIX)}
        for patch, gain in measured:  # once every move is known; a merge carried elsewhere is the same move
            if self.settings.charge_merges and move_key(patch) in memory.merges:
                memory.charge(patch, gain)
        return memory if memory.gains else None

    def _carried(self, memory: MoveMemory, parent: NodeRecord, proposals: list[Proposal]) -> list[Proposal]:
        """The proposals, led by the move that gained most elsewhere in the run (moves.py) where it
        applies to this node, changes its plan, and is neither proposed nor tried here yet."""
        offered = {move_key(p.patch) for p in proposals}
        plan = validate_plan(parent.plan)
        here = {n.plan_hash for n in self.store.nodes(self.run_id) if n.parent_id == parent.id} | {plan.hash}
        top = max((p.prior for p in proposals if p.prior is not None), default=1.0)
        for move in memory.winners():
            if move_key(move.patch) in offered:
                continue
            try:
                if patch_plan(plan, move.patch).hash in here:
                    continue
            except (PatchError, PlanError):
                continue
            carried = Proposal(move.patch, f"{CARRIED}{move.rationale}"
                               + memory.note(move.patch), move.kind, memory.prior(move.patch, top))
            return [carried] + proposals
        return proposals

    def _merged(self, memory: MoveMemory, parent: NodeRecord, proposals: list[Proposal]) -> list[Proposal]:
        """The proposals, led by one plan making every move that gained in the run (moves.py's gainers,
        the largest gain first) that applies to this node, changes its plan and writes nothing that an
        earlier one or an edit on the node's own path wrote; offered where it holds two moves or more
        and is new to the run. A proposal making one of its moves alone is dropped (the merge holds it)."""
        plan = validate_plan(parent.plan)
        nodes = {n.id: n for n in self.store.nodes(self.run_id)}
        lineage, node = [], parent
        while node is not None:  # the edits that made this node: a merge adds to them, never undoes one
            lineage += [node.edit] if node.edit and node.proposer not in ("seed", "warm-start") else []
            node = nodes.get(node.parent_id)
        merged, made, patch = plan, [], []
        for move in memory.gainers():
            if any(conflict(move.patch, m) for m in lineage + [m.patch for m in made]):
                continue
            try:
                after = patch_plan(merged, move.patch)
            except (PatchError, PlanError):
                continue
            if after.hash != merged.hash:
                merged, made, patch = after, made + [move], patch + move.patch
        if len(made) < 2 or merged.hash in {n.plan_hash for n in nodes.values()}:
            return proposals
        try:  # the moves one after another made what the patch makes at once: checked, not assumed
            if patch_plan(plan, patch).hash != merged.hash:
                return proposals
        except (PatchError, PlanError):
            return proposals
        memory.merges.add(move_key(patch))  # recorded as a merge (_add_children)
        keys = {move_key(m.patch) for m in made}
        top = max((p.prior for p in proposals if p.prior is not None), default=1.0)
        gains = ", ".join(f"{m.gain * 100:+.1f}%" for m in made)
        rationale = (f"the {len(made)} moves that gained in this run, together ({gains} where made): "
                     + "; ".join(m.rationale.removeprefix(CARRIED).split(" (elsewhere")[0][:80] for m in made))
        return [Proposal(patch, rationale, made[0].kind, top)] + [p for p in proposals if move_key(p.patch) not in keys]

    def _remembered(self, proposals: list[Proposal], memory: MoveMemory, parent_id: int) -> list[Proposal]:
        """The proposals without moves that lost everywhere they were made, the others' priors scaled
        by how they did elsewhere (best first)."""
        given = [p.prior for p in proposals if p.prior is not None]
        default = sum(given) / len(given) if given else 1.0  # as MCTS.priors fills a missing prior
        kept = []
        for p in proposals:
            if memory.lost_everywhere(p.patch, self.settings.move_memory):
                self.on_event("skipped", {"node": parent_id, "rationale": p.rationale + memory.note(p.patch)})
            elif memory.knows(p.patch):  # priors are normalised per expansion: no cap needed
                kept.append(replace(p, prior=memory.prior(p.patch, p.prior if p.prior is not None else default),
                                    rationale=p.rationale + memory.note(p.patch)))
            else:
                kept.append(p)
        return sorted(kept, key=lambda p: -(p.prior if p.prior is not None else default))

    def _add_children(self, parent: NodeRecord, proposals: list[Proposal], limit: int | None = None,
                      merges: set[str] = frozenset()) -> list[NodeRecord]:
        """New children of `parent` from the proposals, at most `limit`; a proposal whose move is one of
        `merges` (move keys) is recorded as the proposer's merge (MERGE_SUFFIX)."""
        priors = MCTS.priors([p.prior for p in proposals]) if proposals else []
        children = []
        for proposal, prior in zip(proposals, priors):
            if limit is not None and len(children) >= limit:
                break
            try:
                plan = patch_plan(validate_plan(parent.plan), proposal.patch)
            except (PatchError, PlanError) as e:
                self.on_event("rejected", {"node": parent.id, "error": str(e)})
                continue
            node_id, created = self.store.add_node(self.run_id, plan.to_dict(), plan.hash, parent.id, proposal.patch,
                                                   proposal.rationale, self.proposer.name
                                                   + (MERGE_SUFFIX if move_key(proposal.patch) in merges else ""),
                                                   proposal.kind, prior)
            if created:
                self.tree[node_id] = self.tree[parent.id].add_child(node_id, prior)
                children.append(self.store.node(node_id))
        return children

    def _evaluate(self, node: NodeRecord, deadline: float | None = None) -> None:
        key = eval_key(node.plan_hash, self.workload, self.evaluator_id)
        self.on_event("evaluate", {"node": node.id, "kind": node.edit_kind, "rationale": node.rationale})
        result = self._result(key, node, deadline)
        if result is None:
            return  # another process is still on it; a later pass (or a resume) settles the node
        reward = reward_of(result)
        path = self._tree_node(node).path()
        status = NodeStatus.EVALUATED if result.ok else NodeStatus.FAILED
        settled = self.store.settle(node.id, status, [n.id for n in path], reward)
        if settled:
            self.mcts.backpropagate(path, reward)
            path[-1].reward = reward
            self._learn(node, result, reward)
        self.results[node.plan_hash] = result
        self.on_event("result", {"node": node.id, "result": result, "reward": reward, "settled": settled})

    def _result(self, key: str, node: NodeRecord, deadline: float | None) -> EvalResult | None:
        if self.store.claim_evaluation(key, node.plan_hash, self.run_id, owner_id(), self.settings.stale_after_s):
            result = self.evaluator.evaluate(node.plan, self.workload_path)
            if not result.ok and result.stage is Stage.SETUP:  # the machine's or the workload's, not the plan's
                self.store.release_evaluation(key, owner_id())
                raise SetupFailed(f"{self.workload_path}: the evaluator could not prepare the workload "
                                  f"({result.status}: {scrub(result.error or '')[:300]}); nothing was recorded "
                                  "for the plan")
            try:
                self.store.finish_evaluation(key, result, reward_of(result))
                return result
            except StoreError:  # our claim was taken over and finished by another process: theirs counts
                pass
        wait = self.settings.stale_after_s if deadline is None else max(0.0, min(self.settings.stale_after_s,
                                                                                 deadline - time.monotonic()))
        found = self.store.wait_evaluation(key, wait)
        return found.result if found is not None else None

    def _tree_node(self, node: NodeRecord) -> TreeNode:
        if node.id not in self.tree:  # added by another process sharing the run
            self._load_tree()
        return self.tree[node.id]

    def _learn(self, node: NodeRecord, result: EvalResult, reward: float) -> None:
        """Edit-kind statistics and, for clear wins and losses, a lesson in words; not for a merge, whose
        moves are of several kinds."""
        if node.parent_id is None or node.proposer in ("seed", "warm-start") or node.proposer.endswith(MERGE_SUFFIX):
            return
        parent = self.store.node(node.parent_id)
        parent_result = self.results.get(parent.plan_hash)
        if not parent_result or reward_of(parent_result) <= 0:
            return
        gain = reward / reward_of(parent_result) - 1
        evaluator, family = self.run.evaluator, family_of(self.run.workload)
        self.store.record_edit_outcome(evaluator, family, node.edit_kind, gain, self.run_id)
        if not result.ok:
            text = f"{node.edit_kind} edit failed ({result.status}): {node.rationale} -> {scrub(result.error)[:120]}"
            self.store.add_lesson(evaluator, family, node.edit_kind, text, -1.0, self.run_id)
        elif abs(gain) >= 0.03:
            text = f"{node.rationale}: {gain * 100:+.1f}% on {self.workload.name}"
            self.store.add_lesson(evaluator, family, node.edit_kind, text, gain, self.run_id)


def replay_records(store: Store) -> list[dict]:
    """The edits the latest run of the store made, in order, for the replay proposer."""
    from conjugate.search.integrity import check_run

    run = store.latest_run()
    if run is None:
        raise ConjugateError(f"{store.url_for_display}: no run to replay")
    nodes = store.nodes(run.id)
    check_run(run, [(n, None) for n in nodes])  # a damaged row: one line naming it (search/integrity.py)
    by_id = {n.id: n for n in nodes}
    return [{"parent_hash": by_id[n.parent_id].plan_hash, "patch": n.edit, "rationale": n.rationale,
             "kind": n.edit_kind, "proposer": n.proposer, "prior": n.prior}
            for n in nodes if n.parent_id is not None and n.proposer not in ("seed", "warm-start")]
