"""Damaged rows of a run (hand-edited, or written by something else): `show`, `export`, `search --resume`
and `search --agent replay --replay-from` end in one line naming the database, the table, the row and the
field, with exit status 2 and the database byte for byte as it was (a resume marks nothing running or
stopped, a replay makes no database); a rationale's escape sequences and control characters are shown
as escapes, never sent to the terminal or a report."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from test_cli import REPO
from test_search import cli, env, search_cli, wide_console

FIXTURES = (env, wide_console)  # test_search's, used here by name
BUDGET = 5  # the seeds and one expansion: its first child evaluated, the others left new


@pytest.fixture(scope="module")
def tiny_run(env, tmp_path_factory):
    """A finished run of the tiny workload, and the ids the damage below is aimed at: the root, a node
    left new and its parent, an evaluated node the heuristic made, and the fastest plan (with its
    evaluation row)."""
    db = tmp_path_factory.mktemp("damaged_runs") / "runs.db"
    code, out, err = search_cli(db, env["profile"], BUDGET)
    assert code == 0, out + err
    with contextlib.closing(sqlite3.connect(db)) as c:
        one = lambda sql: c.execute(sql).fetchone()[0]  # noqa: E731
        new = one("SELECT id FROM nodes WHERE status = 'new' ORDER BY id LIMIT 1")
        best_eval, best = c.execute("SELECT e.id, n.id FROM evaluations e JOIN nodes n ON n.plan_hash = e.plan_hash "
                                    "WHERE e.status = 'done' ORDER BY e.latency_ms, n.id LIMIT 1").fetchone()
        ids = {"root": one("SELECT id FROM nodes WHERE parent_id IS NULL"), "new": new,
               "parent": one(f"SELECT parent_id FROM nodes WHERE id = {new}"), "best": best, "best_eval": best_eval,
               "made": one("SELECT id FROM nodes WHERE proposer = 'heuristic' AND status != 'new' ORDER BY id")}
    assert ids["parent"] != ids["root"], ids  # the new node's parent has a parent of its own
    return db, ids


def damaged(tiny_run, tmp: Path, *sql: str) -> tuple[Path, dict]:
    """A copy of the tiny run's database with `sql` applied ({root}, {new}, ... name the fixture's ids)."""
    good, ids = tiny_run
    db = tmp / "runs.db"
    shutil.copy(good, db)
    with contextlib.closing(sqlite3.connect(db)) as c, c:
        for statement in sql:
            c.execute(statement.format(**ids))
    return db, ids


def digest(db: Path) -> str:
    """The database file and its write-ahead log (if any), as bytes."""
    return hashlib.sha256(b"".join(p.read_bytes() for p in (db, Path(f"{db}-wal")) if p.exists())).hexdigest()


def argv_of(command: str, db: Path, out: Path) -> list:
    return {"show": ["show", db], "export": ["export", db, "--out", out],
            "resume": ["search", "--resume", db, "--budget", BUDGET + 4],
            "replay": ["search", "--agent", "replay", "--replay-from", db, "--db", out, "--budget", 2]}[command]


def refused(command: str, db: Path, tmp: Path, *fragments: str, subprocess_s: float | None = None) -> str:
    """Runs the command on the damaged copy: one line on stderr naming the database and the fragments,
    exit status 2, the file unchanged, nothing exported and no resume hint. `subprocess_s`: in a
    subprocess with that timeout (a command that could hang)."""
    before, out = digest(db), tmp / "out"
    argv = argv_of(command, db, out)
    if subprocess_s is None:
        code, stdout, err = cli(*argv)
    else:
        proc = subprocess.run([sys.executable, "-m", "conjugate", *map(str, argv)], cwd=REPO, capture_output=True,
                              text=True, timeout=subprocess_s, env={**os.environ})
        code, stdout, err = proc.returncode, proc.stdout, proc.stderr
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, stdout[-2000:], err[-3000:])
    for fragment in (str(db), *fragments):
        assert fragment in lines[0], (fragment, lines[0])
    assert digest(db) == before and not out.exists() and "resume with" not in stdout
    return lines[0]


# -- parents that loop, a parent that is gone, no tree at all

def test_a_resume_whose_parents_loop_ends_in_one_line_instead_of_walking_forever(tiny_run, tmp_path):
    db, ids = damaged(tiny_run, tmp_path, "UPDATE nodes SET parent_id = {new} WHERE id = {parent}")
    refused("resume", db, tmp_path, f"nodes row {ids['parent']}", "is its own ancestor", subprocess_s=90)


@pytest.mark.parametrize("command", ["show", "resume", "replay"])
def test_a_node_that_is_its_own_parent_is_named(tiny_run, tmp_path, command):
    db, ids = damaged(tiny_run, tmp_path, "UPDATE nodes SET parent_id = id WHERE id = {parent}")
    refused(command, db, tmp_path, f"nodes row {ids['parent']}", "'parent_id'", "is its own ancestor",
            subprocess_s=90 if command == "resume" else None)


def test_show_names_parents_that_loop(tiny_run, tmp_path):
    db, ids = damaged(tiny_run, tmp_path, "UPDATE nodes SET parent_id = {new} WHERE id = {parent}")
    refused("show", db, tmp_path, f"nodes row {ids['parent']}", "is its own ancestor")


@pytest.mark.parametrize("command", ["show", "export", "resume", "replay"])
def test_a_parent_that_does_not_exist_is_named(tiny_run, tmp_path, command):
    db, ids = damaged(tiny_run, tmp_path, "UPDATE nodes SET parent_id = 999 WHERE id = {best}")
    refused(command, db, tmp_path, f"nodes row {ids['best']}: parent 999 does not exist")


def test_a_resume_of_a_run_without_nodes_says_there_is_nothing_to_resume(tiny_run, tmp_path):
    db, _ = damaged(tiny_run, tmp_path, "DELETE FROM nodes")
    refused("resume", db, tmp_path, "run 1 holds no node")


# -- a damaged value in a row

ROWS = [  # (id, SQL, the fragments of the line; {...}: the fixture's ids)
    ("edit-not-a-patch", "UPDATE nodes SET edit = '{{\"op\": 1}}' WHERE id = {made}", "nodes row {made}: field 'edit'"),
    ("edit-op-not-text", "UPDATE nodes SET edit = '[{{\"op\": 1, \"path\": \"/x\"}}]' WHERE id = {made}",
     "nodes row {made}: field 'edit'"),
    ("plan-null", "UPDATE nodes SET plan = 'null' WHERE id = {best}", "nodes row {best}: field 'plan' is null"),
    ("plan-list", "UPDATE nodes SET plan = '[1,2]' WHERE id = {best}", "nodes row {best}: field 'plan' is [1, 2]"),
    ("second-root", "UPDATE nodes SET parent_id = NULL WHERE id = {parent}", "nodes row {parent}: a second root"),
    ("visits-text", "UPDATE nodes SET visits = 'many' WHERE id = {parent}", "nodes row {parent}: field 'visits'"),
    ("visits-negative", "UPDATE nodes SET visits = -3 WHERE id = {root}", "nodes row {root}: field 'visits' is -3"),
    ("visits-infinite", "UPDATE nodes SET visits = 9e999 WHERE id = {root}", "nodes row {root}: field 'visits' is inf"),
    ("value-sum-text", "UPDATE nodes SET value_sum = 'lots' WHERE id = {root}", "nodes row {root}: field 'value_sum'"),
    ("prior-infinite", "UPDATE nodes SET prior = -9e999 WHERE id = {new}", "nodes row {new}: field 'prior'"),
    ("edit-kind", "UPDATE nodes SET edit_kind = 'magic' WHERE id = {new}", "nodes row {new}: field 'edit_kind'"),
    ("node-status", "UPDATE nodes SET status = 'weird' WHERE id = {new}", "nodes row {new}: field 'status'"),
    ("latency-text", "UPDATE evaluations SET latency_ms = 'fast' WHERE id = {best_eval}",
     "evaluations row {best_eval}: field 'latency_ms'"),
    ("reward-negative", "UPDATE evaluations SET reward = -1 WHERE id = {best_eval}",
     "evaluations row {best_eval}: field 'reward'"),
    ("evaluation-status", "UPDATE evaluations SET status = 'weird' WHERE id = {best_eval}",
     "evaluations row {best_eval}: field 'status' is 'weird'"),
    ("best-plan-hash", "UPDATE nodes SET plan = json_set(plan, '$.cross.capture', CASE json_extract(plan, '$.cross.capture') "
                       "WHEN 'graph' THEN 'none' ELSE 'graph' END) WHERE id = {best}",
     "nodes row {best}: field 'plan_hash' is not the hash of its plan"),
    ("best-branch-plan-hash", "UPDATE nodes SET plan = json_set(plan, '$.cross.capture', 'none') WHERE id = {root}",
     "nodes row {root}: field 'plan_hash'"),
    # a node left new is evaluated first by a resume, its result stored under its plan_hash
    ("new-plan-edited", "UPDATE nodes SET plan = json_set(plan, '$.cross.capture', CASE json_extract(plan, '$.cross.capture') "
                        "WHEN 'graph' THEN 'none' ELSE 'graph' END) WHERE id = {new}",
     "nodes row {new}: field 'plan_hash' is not the hash of its plan"),
    ("new-plan-invalid", "UPDATE nodes SET plan = json_set(plan, '$.cross.launch.num_warps', 3) WHERE id = {new}",
     "nodes row {new}: field 'plan' is not a valid plan"),
    ("new-plan-hash", "UPDATE nodes SET plan_hash = 'zzz' WHERE id = {new}",
     "nodes row {new}: field 'plan_hash' is not the hash of its plan"),
    ("result-null", "UPDATE evaluations SET result = NULL WHERE id = {best_eval}",
     "evaluations row {best_eval}: field 'result' is null"),
    ("result-metrics-null", "UPDATE evaluations SET result = json_set(result, '$.metrics', json('null')) "
                            "WHERE id = {best_eval}", "evaluations row {best_eval}: field 'result.metrics' is null"),
    ("result-latency-text", "UPDATE evaluations SET result = json_set(result, '$.metrics.latency_ms', 'fast') "
                            "WHERE id = {best_eval}", "evaluations row {best_eval}: field 'result.metrics.latency_ms'"),
    ("result-latency-negative", "UPDATE evaluations SET result = json_set(result, '$.metrics.latency_ms', -5) "
                                "WHERE id = {best_eval}",
     "evaluations row {best_eval}: field 'result.metrics.latency_ms' is -5"),
    ("settings-profile-number", "UPDATE runs SET settings = json_set(settings, '$.evaluator_profile', 5)",
     "runs row 1: field 'settings': search setting 'evaluator_profile' is 5"),
    ("settings-budget-negative", "UPDATE runs SET settings = json_set(settings, '$.budget', -1)",
     "runs row 1: field 'settings': search setting 'budget' is -1"),
    ("settings-budget-huge", "UPDATE runs SET settings = json_set(settings, '$.budget', 1000000000000)",
     "runs row 1: field 'settings': search setting 'budget' is 1000000000000"),
    ("settings-width-huge", "UPDATE runs SET settings = json_set(settings, '$.expand_width', 5000)",
     "runs row 1: field 'settings': search setting 'expand_width' is 5000"),
    ("seed-text", "UPDATE runs SET seed = 'seven'", "runs row 1: field 'seed' is \"seven\", not an integer"),
    ("result-speedup-text", "UPDATE evaluations SET result = json_set(result, '$.metrics.speedups.sequential', 'x') "
                            "WHERE id = {best_eval}",
     "evaluations row {best_eval}: field 'result.metrics.speedups.sequential'"),
]


@pytest.mark.parametrize("command", ["show", "export", "resume"])
@pytest.mark.parametrize("sql,fragment", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_a_damaged_row_is_named_and_nothing_is_written(tiny_run, tmp_path, command, sql, fragment):
    db, ids = damaged(tiny_run, tmp_path, sql)
    line = refused(command, db, tmp_path, fragment.format(**ids))
    assert line.endswith("a damaged store") or "a damaged store, or one of another schema" in line, line


# -- text from an LLM

ESCAPES = "a\x1b]0;pwned\x07b\x1b[2Jc\n\td\u202e"
SHOWN = r"a\x1b]0;pwned\x07b\x1b[2Jc d\u202e"
ESCAPES_SQL = "'a' || char(27) || ']0;pwned' || char(7) || 'b' || char(27) || '[2Jc' || char(10, 9) || 'd' || " \
              "char(8238)"


def test_visible_keeps_text_on_one_line_and_writes_control_characters_as_escapes():
    from conjugate.text import visible

    assert visible(ESCAPES) == SHOWN and visible("plain  words\nhere é") == "plain words here é"


def test_an_llm_rationale_is_stored_with_its_control_characters_escaped():
    from conjugate.agents.llm.prompt import check_edit
    from conjugate.plan import load_plan

    edit = {"patch": [{"op": "replace", "path": "/cross/capture", "value": "none"}], "rationale": ESCAPES, "kind": "cross"}
    proposal, _ = check_edit(edit, load_plan(REPO / "plans" / "sequential.json"))
    assert proposal.rationale == SHOWN


def test_show_and_export_write_a_stored_rationale_s_escapes_as_text(tiny_run, tmp_path):
    db, ids = damaged(tiny_run, tmp_path, f"UPDATE nodes SET rationale = {ESCAPES_SQL} WHERE id = {{best}}")
    code, out, err = cli("show", db)
    assert code == 0 and SHOWN in out and not any(c in out for c in "\x1b\x07\u202e"), (out, err)
    code, out, err = cli("export", db, "--out", tmp_path / "out")
    assert code == 0, out + err
    for name in ("report.md", "report.json", "best_plan.json"):
        text = (tmp_path / "out" / name).read_text()
        assert not any(c in text for c in "\x1b\x07\u202e"), name
    assert SHOWN in (tmp_path / "out" / "report.md").read_text()
    assert SHOWN in json.loads((tmp_path / "out" / "best_plan.json").read_text())["description"]


def test_the_live_view_shows_an_edit_s_escapes_as_text():
    import io

    from rich.console import Console

    from conjugate.evaluate.result import EvalResult
    from conjugate.search.live import LiveView

    sink = io.StringIO()
    view = LiveView(Console(file=sink, width=300), budget=4)
    view.event("rejected", {"node": 3, "error": f"patch failed: {ESCAPES}"})
    view.event("skipped", {"node": 3, "rationale": ESCAPES})
    failed = EvalResult("h", "tiny", "h200", "compile", "error", False, error=ESCAPES)
    view.event("result", {"node": 4, "result": failed})
    printed = sink.getvalue()
    assert printed.count(SHOWN) == 3 and not any(c in printed for c in "\x1b\x07\u202e"), printed


def test_show_writes_a_stored_error_s_escapes_as_text(tiny_run, tmp_path):
    db, _ = damaged(tiny_run, tmp_path, "UPDATE evaluations SET result = json_set(result, '$.status', 'error', "
                                        f"'$.error', {ESCAPES_SQL}) WHERE id = {{best_eval}}")
    code, out, err = cli("show", db)
    assert code == 0 and SHOWN in out and not any(c in out for c in "\x1b\x07\u202e"), (out, err)


def test_a_replay_of_a_damaged_edit_is_refused_before_a_database_is_made(tiny_run, tmp_path):
    db, ids = damaged(tiny_run, tmp_path, ROWS[0][1])
    refused("replay", db, tmp_path, ROWS[0][2].format(**ids))


# -- a store this user may only read

SETPRIV = shutil.which("setpriv")


# `conjugate` commands in one process (Python and torch started once), each as `python -m conjugate` runs
# it: its exit status, stdout and stderr.
COMMANDS = """
import contextlib, io, json, sys
from conjugate.cli import main
answers = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
    answers.append({"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
print(json.dumps(answers))
"""


def _without_write_access(*commands: list[str]) -> list[SimpleNamespace]:
    """The commands run with no capabilities (root then meets the files' permissions like any user)."""
    proc = subprocess.run([SETPRIV, "--inh-caps=-all", "--bounding-set=-all", sys.executable, "-c", COMMANDS,
                           json.dumps(commands)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [SimpleNamespace(**answer) for answer in json.loads(proc.stdout.splitlines()[-1])]


@pytest.mark.skipif(SETPRIV is None, reason="needs util-linux's setpriv to drop root's capabilities")
def test_a_store_in_a_folder_this_user_only_reads_shows_and_exports(tiny_run, tmp_path):
    """A store in a folder (and file) this user may not write: show and export open it read-only and
    immutable and work, making nothing beside it; a resume fails in one line before it starts an
    evaluator, also for a store outside WAL mode (whose first real write would make its journal in the
    folder); a store whose write-ahead log still holds writes is refused, naming the log, rather than
    shown without them."""
    folder = tmp_path / "shared"
    folder.mkdir()
    db = folder / "runs.db"
    shutil.copy(tiny_run[0], db)
    pending = folder / "pending.db"
    shutil.copy(tiny_run[0], pending)
    writer = sqlite3.connect(pending)  # a write left in the log: the writer still open, as if killed
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("UPDATE runs SET name = 'renamed'")
    writer.commit()
    shutil.copy(f"{pending}-wal", tmp_path / "pending.db-wal")
    writer.close()  # closing checkpoints: put the log back as it was
    shutil.copy(tmp_path / "pending.db-wal", f"{pending}-wal")
    Path(f"{pending}-shm").unlink(missing_ok=True)
    journal = folder / "journal.db"  # a store switched out of WAL mode, its file writable, its folder not
    shutil.copy(tiny_run[0], journal)
    with contextlib.closing(sqlite3.connect(journal)) as c:
        c.execute("PRAGMA journal_mode=DELETE")
    journal.chmod(0o666)
    before = digest(db)
    for path in (db, pending, Path(f"{pending}-wal")):
        path.chmod(0o444)
    folder.chmod(0o555)
    try:
        shown, exported, resumed, in_journal_mode, refused_wal = _without_write_access(
            ["show", str(db)], ["export", str(db), "--out", str(tmp_path / "out")],
            ["search", "--resume", str(db), "--budget", str(BUDGET + 4)],
            ["search", "--resume", str(journal), "--budget", str(BUDGET + 4)], ["show", str(pending)])
        assert shown.returncode == 0 and re.search(r"\d+ nodes, \d+ ok, 0 failed", shown.stdout), shown.stderr
        assert exported.returncode == 0 and (tmp_path / "out" / "best_plan.json").exists(), exported.stderr
        assert resumed.returncode == 2 and resumed.stderr.strip().splitlines() == [
            f"error: {db}: this user may not write it or the files SQLite keeps beside it: a search records its "
            "evaluations there; copy the store where it can be written"], resumed.stderr
        assert in_journal_mode.returncode == 2 and in_journal_mode.stderr.strip().splitlines() == [
            f"error: {journal}: this user may not write its folder {folder.resolve()}: a search records its "
            "evaluations there; copy the store where it can be written"], in_journal_mode.stderr
        assert refused_wal.returncode == 2 and refused_wal.stderr.strip().splitlines() == [
            f"error: {pending}: its write-ahead log pending.db-wal holds writes not yet in the database file, "
            "which this user cannot read without writing beside it: open it where its folder can be written, "
            "or copy both files"], refused_wal.stderr
        assert digest(db) == before and sorted(p.name for p in folder.iterdir()) == [
            "journal.db", "pending.db", "pending.db-wal", "runs.db"]
    finally:
        folder.chmod(0o755)
    with sqlite3.connect(pending) as c:  # where it can be written, the write in the log is there
        assert c.execute("SELECT name FROM runs").fetchone() == ("renamed",)
