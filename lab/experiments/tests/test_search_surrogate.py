"""lab/experiments/search_surrogate.py: latencies composed from measured moves."""
from __future__ import annotations

import subprocess
import sys

import pytest

from experiment_scripts import load_script  # lab/experiments/tests/experiment_scripts.py

surrogate = load_script("search_surrogate")


def _model():
    f = surrogate.fields_of
    a, b, c = f({"x": 1, "y": 1, "name": "a"}), f({"x": 2, "y": 1, "name": "b"}), f({"x": 1, "y": 2})
    moves = [(surrogate.difference(a, b), 10 / 9 - 1), (surrogate.difference(a, c), 10 / 8 - 1)]
    return surrogate.Surrogate([(a, 10.0), (b, 9.0), (c, 8.0), (a, 10.2)], moves)


def test_a_measured_plan_takes_its_mean_latency_whatever_its_name():
    model = _model()
    assert model.latency({"x": 1, "y": 1, "name": "other"}) == pytest.approx(10.1)
    assert model.latency({"x": 2, "y": 1}) == pytest.approx(9.0)


def test_measured_moves_compose():
    # from b (9 ms) the move that took a to c gains 25%; from c (8 ms) the one that took a to b 11%
    assert _model().latency({"x": 2, "y": 2}) == pytest.approx(7.2)


def test_an_unmeasured_change_takes_a_measured_gain_fixed_per_field_group():
    model = _model()
    latency = model.latency({"x": 1, "y": 1, "z": 5})
    assert latency in [pytest.approx(10.1 / (1 + g)) for g in model.spread]
    # two changed fields of one group (/z/u) take one gain between them, not one each
    grouped = model.latency({"x": 1, "y": 1, "z": {"u": {"a": 1, "b": 2}}})
    assert grouped in [pytest.approx(10.1 / (1 + g)) for g in model.spread]


def test_databases_without_a_measured_move_are_refused():
    with pytest.raises(ValueError, match="no measured plan with a measured parent"):
        surrogate.Surrogate([(surrogate.fields_of({"x": 1}), 1.0)], [])


def test_a_file_that_is_not_a_search_database_is_one_line(tmp_path):
    bad = tmp_path / "bad.db"
    bad.write_text("not a database")
    ran = subprocess.run([sys.executable, str(surrogate.__file__), "examples/tiny.toml", str(bad)], capture_output=True,
                         text=True, timeout=120, cwd=surrogate.ROOT)
    assert ran.returncode == 1 and ran.stderr == f"error: {bad}: not a search database (file is not a database)\n"


def _result(status: str, latency: float | None = None, modeled: bool = False, feedback: tuple = ()):
    from conjugate.evaluate.result import EvalResult, Metrics

    metrics = None if latency is None else Metrics(latency_ms=latency, floor_ms=1.0, floor_ratio=latency,
                                                   bandwidth_gbs=1.0, launches=3, device="NVIDIA H200", sms=132)
    return EvalResult("h", "w", "e", "timing", status, modeled, metrics=metrics, feedback=feedback,
                      error="" if status == "ok" else "logits differ")


def test_evaluations_carry_what_the_gpu_said_of_the_nearest_measured_plan():
    """The agents read the GPU's feedback and a measured (not modeled) result; a plan the GPU found
    failing fails again; the latency stays the surrogate's."""
    from conjugate.compiler.feedback import LaunchFeedback

    f = surrogate.fields_of
    a, b, bad = f({"x": 1, "y": 1}), f({"x": 2, "y": 1}), f({"x": 9, "y": 9})
    spilled = (LaunchFeedback(0, "k_0.py", ()),)
    model = surrogate.Surrogate([(a, 10.0), (b, 9.0)], [(surrogate.difference(a, b), 10 / 9 - 1)],
                                [(a, _result("ok", 10.0, feedback=spilled)), (b, _result("ok", 9.0)),
                                 (bad, _result("incorrect"))])
    assert model.context({"x": 1, "y": 1}) == (model.results[surrogate._key(a)], True)
    nearest, own = model.context({"x": 1, "y": 3})
    assert nearest.feedback == spilled and not own

    class Analytical:
        profile = None

        def evaluate(self, plan, workload_path):
            return _result("ok", 5.0, modeled=True)

    evaluator = surrogate.SurrogateEvaluator(model, Analytical(), 0.0, seed=0)
    near_a = evaluator.evaluate({"x": 1, "y": 3}, None)
    assert not near_a.modeled and near_a.feedback == spilled and near_a.metrics.device == "NVIDIA H200"
    assert near_a.latency_ms == pytest.approx(model.latency({"x": 1, "y": 3}))
    failed = evaluator.evaluate({"x": 9, "y": 9}, None)
    assert failed.status.value == "incorrect" and failed.latency_ms is None


def test_a_plan_evaluated_twice_keeps_the_same_result_in_any_order():
    """Passing before failing, then the fastest: what the agents read of a plan two databases hold
    does not depend on the order the databases were given in."""
    f = surrogate.fields_of
    a, b = f({"x": 1}), f({"x": 2})
    slow, fast, failed = _result("ok", 10.5), _result("ok", 10.0), _result("incorrect")
    kept = set()
    for results in ([slow, fast, failed], [failed, fast, slow], [fast, failed, slow]):
        model = surrogate.Surrogate([(a, 10.0), (b, 9.0)], [(surrogate.difference(a, b), 0.1)],
                                    [(a, r) for r in results])
        kept.add(model.results[surrogate._key(a)].latency_ms)
    assert kept == {10.0}
    only_failed = surrogate.Surrogate([(a, 10.0), (b, 9.0)], [(surrogate.difference(a, b), 0.1)], [(a, failed)])
    assert not only_failed.results[surrogate._key(a)].ok


def test_databases_give_latencies_moves_and_the_gpu_results(tmp_path):
    """The columns the surrogate reads, as a search database holds them: a node's plan, edit and the
    evaluation of its plan (latency and the whole result)."""
    import json
    import sqlite3

    db = tmp_path / "run.db"
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE runs (id INTEGER, created_at TEXT)")
        c.execute("INSERT INTO runs VALUES (1, '2026-12-03 08:00:00')")
        c.execute("CREATE TABLE nodes (id INTEGER, parent_id INTEGER, plan JSON, edit JSON, run_id INTEGER, "
                  "plan_hash TEXT)")
        c.execute("CREATE TABLE evaluations (plan_hash TEXT, latency_ms FLOAT, result JSON)")
        plans = {1: ({"x": 1}, None, 10.0, "ok"), 2: ({"x": 2}, 1, 8.0, "ok"), 3: ({"x": 3}, 1, None, "incorrect")}
        for node, (plan, parent, latency, status) in plans.items():
            edit = None if parent is None else json.dumps([{"op": "replace", "path": "/x", "value": plan["x"]}])
            c.execute("INSERT INTO nodes VALUES (?, ?, ?, ?, 1, ?)", (node, parent, json.dumps(plan), edit, f"h{node}"))
            result = _result(status, latency).to_dict()
            c.execute("INSERT INTO evaluations VALUES (?, ?, ?)", (f"h{node}", latency, json.dumps(result)))
    model = surrogate.Surrogate.from_databases([db])
    assert model.latency({"x": 2}) == pytest.approx(8.0)
    assert model.gains == {surrogate.difference(surrogate.fields_of({"x": 1}), surrogate.fields_of({"x": 2})): [0.25]}
    failed, own = model.context({"x": 3})
    assert own and failed.status.value == "incorrect"
    nearest, own = model.context({"x": 2, "y": 1})
    assert not own and nearest.latency_ms == 8.0
    copy = tmp_path / "copy.db"  # an archive's second copy of the same run counts once
    copy.write_bytes(db.read_bytes())
    twice = surrogate.Surrogate.from_databases([db, copy])
    assert twice.gains == model.gains and twice.latencies == model.latencies
    earlier = tmp_path / "earlier.db"  # a copy taken before node 2 was evaluated: in either order, node 2 counts
    earlier.write_bytes(db.read_bytes())
    with sqlite3.connect(earlier) as c:
        c.execute("DELETE FROM evaluations WHERE plan_hash = 'h2'")
    for order in ([earlier, db], [db, earlier]):
        both = surrogate.Surrogate.from_databases(order)
        assert both.gains == model.gains and both.latencies == model.latencies
        assert both.context({"x": 2})[0].latency_ms == 8.0


def test_a_width_of_no_edit_is_refused(tmp_path):
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    refused = subprocess.run([sys.executable, str(root / "lab" / "experiments" / "search_surrogate.py"),
                              str(root / "examples" / "tiny.toml"), str(tmp_path / "w1.db"), "--width", "0"],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--width 0: at least one edit per expansion" in refused.stderr
