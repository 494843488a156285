"""A run as the store keeps it: the reward and key of an evaluation, the workload, evaluator and baselines
a resume recovers from the stored run, and the edits a replay makes again."""
from __future__ import annotations

import atexit
import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from conjugate.errors import ConjugateError, WorkloadError
from conjugate.evaluate.result import CARRIABLE_BASELINES, EvalResult
from conjugate.models.spec import ModelSpec
from conjugate.paths import REWARD_BASELINE
from conjugate.roles import Model
from conjugate.search.store import RunRecord, Store, StoreError
from conjugate.search.store.integrity import check_run
from conjugate.workload import Workload, check_fields, check_models, load_workload, workload_toml


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
    data = _stored_workload(run)
    where = f"run {run.id}'s stored workload"
    damaged = "a damaged store, or one of another version"
    try:
        check_fields({k: v for k, v in data.items() if k in ("name", "k", "draft_batch", "target_batch", "context",
                                                            "dtype", "seed", "kv_init", "weight_init")}
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


def replay_records(store: Store) -> list[dict]:
    """The edits the latest run of the store made, in order, for the replay proposer."""
    run = store.latest_run()
    if run is None:
        raise ConjugateError(f"{store.url_for_display}: no run to replay")
    nodes = store.nodes(run.id)
    check_run(run, [(n, None) for n in nodes])  # a damaged row: one line naming it (search/store/integrity.py)
    by_id = {n.id: n for n in nodes}
    return [{"parent_hash": by_id[n.parent_id].plan_hash, "patch": n.edit, "rationale": n.rationale,
             "kind": n.edit_kind, "proposer": n.proposer, "prior": n.prior}
            for n in nodes if n.parent_id is not None and n.proposer not in ("seed", "warm-start")]
