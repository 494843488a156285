"""lab/experiments/moves.py: one knob's measured moves read back from search databases."""
from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import pytest

from experiment_scripts import load_script  # lab/experiments/tests/experiment_scripts.py

moves = load_script("moves")


def _plan(trigger: str = "start", fusions=(), sm: int = 0) -> dict:
    return {"name": "p", "pdl": {"draft": {"trigger": trigger}}, "fusions": {"draft": list(fusions)},
            "sm_limit": {"target": sm}}


def _database(path, nodes: dict) -> None:
    """nodes: id -> (plan, parent id, latency or None, edit path); one run, workload w, agent heuristic."""
    with sqlite3.connect(path) as c:
        c.execute("CREATE TABLE runs (id INTEGER, workload_name TEXT, agent TEXT, created_at TEXT)")
        c.execute("CREATE TABLE nodes (id INTEGER, parent_id INTEGER, plan JSON, edit JSON, run_id INTEGER, "
                  "plan_hash TEXT)")
        c.execute("CREATE TABLE evaluations (id INTEGER, plan_hash TEXT, run_id INTEGER, latency_ms FLOAT)")
        c.execute("INSERT INTO runs VALUES (1, 'w', 'heuristic', '2026-12-03 08:00:00')")
        for node, (plan, parent, latency, edit_path) in nodes.items():
            edit = None if edit_path is None else json.dumps([{"op": "replace", "path": edit_path, "value": 0}])
            c.execute("INSERT INTO nodes VALUES (?, ?, ?, ?, 1, ?)", (node, parent, json.dumps(plan), edit, f"h{node}"))
            c.execute("INSERT INTO evaluations VALUES (?, ?, 1, ?)", (node, f"h{node}", latency))
        c.execute("INSERT INTO evaluations VALUES (99, 'h2', 2, 1.0)")  # another run's: not this node's


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "run.db"
    _database(path, {
        1: (_plan(), None, 10.0, None),
        2: (_plan("end"), 1, 8.0, "/pdl/draft/trigger"),  # the move alone, 25% faster
        3: (_plan("end", ["a+b"]), 1, 12.5, "/fusions/draft"),  # with a fusion: not alone, 20% slower
        4: (_plan(sm=96), 1, 9.0, "/sm_limit/target"),  # another knob
        5: (_plan("none"), 1, None, "/pdl/draft/trigger"),  # never measured
        6: (_plan("start", sm=96), 2, 7.0, ""),  # a warm start replaces the whole plan: no move
        7: (_plan("start"), 2, 10.0, "/pdl/draft/trigger"),  # and back: 20% slower
    })
    return path


def test_the_moves_under_a_field_with_their_gains_values_and_context(db):
    found = moves.moves_in(db, "/pdl/draft", ["/sm_limit/target"])
    assert [(m["parent"], m["node"]) for m in found] == [(1, 2), (1, 3), (2, 7)]
    first, fused, back = found
    assert first["gain"] == pytest.approx(0.25) and first["alone"]
    assert (first["before"], first["after"]) == ('trigger="start"', 'trigger="end"')
    assert first["workload"] == "w" and first["agent"] == "heuristic"
    assert fused["gain"] == pytest.approx(-0.2) and not fused["alone"]
    assert back["context"] == {"/sm_limit/target": "0"} and back["after"] == 'trigger="start"'
    one = moves.moves_in(db, "/sm_limit/target", [])
    assert [(m["before"], m["after"]) for m in one] == [("0", "96")]  # a single field: its JSON value


def test_a_prefix_with_several_fields_names_each_and_an_absent_one_reads_dash(db):
    whole = moves.moves_in(db, "/pdl", ["/tiles"])
    assert whole[0]["before"] == 'draft/trigger="start"' and whole[0]["context"] == {"/tiles": "-"}


def test_the_summary_groups_the_moves_by_change(db):
    rows = moves.summary(moves.moves_in(db, "/pdl/draft", []))
    assert rows[0] == {"before": 'trigger="start"', "after": 'trigger="end"', "count": 2,
                       "mean_gain": pytest.approx(0.025), "min_gain": pytest.approx(-0.2),
                       "max_gain": pytest.approx(0.25)}
    assert rows[1]["count"] == 1 and rows[1]["mean_gain"] == pytest.approx(-0.2)


def _run(*args):
    return subprocess.run([sys.executable, str(moves.__file__), *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def test_the_command_prints_each_move_and_writes_json(db, tmp_path):
    out = tmp_path / "moves.json"
    ran = _run(db, "--field", "/pdl/draft", "--alone", "--json", out)
    assert ran.returncode == 0, ran.stderr
    assert "2 moves under /pdl/draft in 1 databases" in ran.stdout
    assert 'trigger="start" -> trigger="end": mean +25.0%' in ran.stdout
    assert [m["node"] for m in json.loads(out.read_text())["moves"]] == [2, 7]


def test_a_copy_of_a_run_counts_its_moves_once(db, tmp_path):
    copy = tmp_path / "copy.db"
    copy.write_bytes(db.read_bytes())
    with sqlite3.connect(copy) as c:  # a later copy of the run: one move more
        c.execute("INSERT INTO nodes VALUES (8, 2, ?, ?, 1, 'h8')",
                  (json.dumps(_plan("none")), json.dumps([{"op": "replace", "path": "/pdl/draft/trigger"}])))
        c.execute("INSERT INTO evaluations VALUES (8, 'h8', 1, 10.0)")
    ran = _run(db, copy, "--field", "/pdl/draft", "--alone")
    assert ran.returncode == 0, ran.stderr
    assert "3 moves under /pdl/draft in 2 databases" in ran.stdout  # 2 and 7 once, 8 from the copy
    assert 'trigger="start" -> trigger="end": mean +25.0%' in ran.stdout


def test_bad_input_is_one_line(tmp_path):
    bad = tmp_path / "bad.db"
    bad.write_text("not a database")
    ran = _run(bad, "--field", "/pdl")
    assert ran.returncode == 1 and ran.stderr.startswith(f"error: {bad}: not a search database")
    assert len(ran.stderr.splitlines()) == 1
    missing = _run(tmp_path / "none.db", "--field", "/pdl")
    assert missing.returncode == 1 and missing.stderr == f"error: {tmp_path / 'none.db'}: no such database file\n"
    no_slash = _run(bad, "--field", "pdl")
    assert no_slash.returncode == 2 and "a plan path starts with '/'" in no_slash.stderr
