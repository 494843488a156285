"""Secrets never persist: the scrubber (conjugate/secrets.py), and a search whose LLM server echoes
keys back, checked byte for byte in the database, the logs and every exported file."""
from __future__ import annotations

import contextlib
import io
import json
import logging
import re
import sqlite3
import uuid
from pathlib import Path

import pytest
from sqlalchemy import JSON, String, create_engine

from conjugate.cli import main
from conjugate.evaluate.result import EvalResult, Stage, Status
from conjugate.plan import load_plan, validate_plan
from conjugate.search.runs import eval_key
from conjugate.search.store import Store
from conjugate.search.store.schema import Base
from conjugate.secrets import REDACTED, configured_keys, scrub, scrub_log_records, scrub_tree
from conjugate.workload import load_workload
from test_store import db_url  # noqa: F401  (the fixture: a fresh SQLite file, or a PostgreSQL database)

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "examples" / "tiny.toml"
KEY = "loopback-credential-4f9c2a71"  # the configured OPENAI_API_KEY: shaped like no known key
SK_KEY = "sk-ant-api03-Vq8Lr2Xw5Tn1Kc7Hs4Jd9Bm3Fy6Pz0Ga"  # shaped like a key, configured nowhere
RANDOM_KEY = "Zx81QmR4vT0pLw7YhN3bKc5JdF2sGe9AuW6x"  # an unlabelled random token, configured nowhere
SECRETS = (KEY, SK_KEY, RANDOM_KEY)
HUGE_TILES = [{"op": "replace", "path": "/target/tiles/gate_up",  # validates, then fails to compile
               "value": {"BLOCK_M": 256, "BLOCK_N": 512, "BLOCK_K": 512, "SPLIT_K": 1}}]


# -- the scrubber

@pytest.fixture
def no_keys(monkeypatch):
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)


def test_configured_keys_are_scrubbed_whatever_they_look_like(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "correct horse battery staple")
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", "a1b2c3d4e5")
    text = "server said: correct horse battery staple is wrong (token a1b2c3d4e5)"
    assert scrub(text) == f"server said: {REDACTED} is wrong (token {REDACTED})"


def test_a_key_set_after_start_is_caught_and_stays_caught_once_unset(monkeypatch):
    late = f"late-key-{uuid.uuid4().hex[:12]}"
    assert scrub(f"x {late}") == f"x {late}"  # not configured yet, and shaped like no key
    monkeypatch.setenv("ANTHROPIC_API_KEY", late)
    assert scrub(f"x {late}") == f"x {REDACTED}"
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    assert scrub(f"x {late}") == f"x {REDACTED}" and late in configured_keys()


def test_short_configured_values_are_no_secret(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "EMPTY")  # what local OpenAI-compatible servers are often given
    assert scrub("an EMPTY reply from the server") == "an EMPTY reply from the server"


@pytest.mark.parametrize("secret", [
    "sk-proj-Ab3dE5gH7jK9mN1pQ3sT5vX7zB9dF1hJ", "sk-ant-api03-Vq8Lr2Xw5Tn1Kc7Hs4Jd9Bm3Fy6Pz0Ga-xYzAA",
    "sk-or-v1-0123456789abcdef0123456789abcdef", "sk-0123456789abcdef0123456789abcdef",
    "ghp_Ab3dE5gH7jK9mN1pQ3sT5vX7zB9dF1hJ2kL4", "hf_AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGh",
    "AIzaSyAb3dE5gH7jK9mN1pQ3sT5vX7zB9dF1hJ2", "AKIAIOSFODNN7EXAMPLE",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    RANDOM_KEY, "1HSuTTVvYH1pTew89Rtpeu84Ht3nQEFTYhAX3Ypa_xJs"])
def test_key_shaped_strings_are_scrubbed(no_keys, secret):
    assert scrub(f"echo: {secret}.") == f"echo: {REDACTED}."
    assert scrub(json.dumps({"detail": secret})) == json.dumps({"detail": REDACTED})


@pytest.mark.parametrize("text, expected", [
    ("Authorization: Bearer abc.DEF-ghi_jkl~1234", f"Authorization: Bearer {REDACTED}"),
    ('{"x-api-key": "notakeyshape-but-labelled"}', f'{{"x-api-key": "{REDACTED}"}}'),
    ("https://host/v1?api_key=abcdefghijklmnop&model=m", f"https://host/v1?api_key={REDACTED}&model=m"),
])
def test_labelled_values_are_scrubbed_and_the_label_kept(no_keys, text, expected):
    assert scrub(text) == expected


def test_hashes_ids_and_ordinary_text_are_left_alone(no_keys):
    plan = load_plan(REPO / "plans" / "interleave.json")
    workload = load_workload(TINY)
    kept = [plan.hash, plan.hash[:8], plan.hash.upper(), eval_key(plan.hash, workload, "analytical@0123456789ab"),
            str(uuid.uuid4()), "d.s2.l5.gate_up", "t.l17.attn", "/tmp/pytest-of-me/pytest-3/runs/tiny.db",
            "Qwen3OmniMoeThinkerTextTopKRouter", "HTTPSConnectionPoolMaxRetriesExceeded1",
            "test_an_llm_agent_drives_the_search_and_resumes_against_its_server",
            "task-0123456789-abcdefghijklmnopqrstuvwxyz", "sk-learn", "Bearer short", "api_key: missing",
            "BLOCK_M 64 -> 128 on t.l0.qkv: +3.2% (target programs first)", "launch/num_warps=8 and SPLIT_K=4",
            "edit 1: /target/tiles/qkv/BLOCK_M: 48 is not a power of two"]
    for text in kept:
        assert scrub(text) == text
    assert scrub_tree(plan.to_dict()) == plan.to_dict() and scrub_tree(workload.to_dict()) == workload.to_dict()


def test_scrub_tree_reaches_every_string(no_keys):
    tree = {SK_KEY: [1, 2.5, None, True, (f"a {SK_KEY}", {"k": RANDOM_KEY})]}
    assert scrub_tree(tree) == {REDACTED: [1, 2.5, None, True, (f"a {REDACTED}", {"k": REDACTED})]}


def test_log_records_are_scrubbed_message_and_traceback(no_keys):
    scrub_log_records()  # the package installs it on import; a second call changes nothing
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log = logging.getLogger("conjugate.test_secrets")
    log.addHandler(handler)
    try:
        log.warning("reply held %s", SK_KEY)
        try:
            raise RuntimeError(f"server echoed {RANDOM_KEY}")
        except RuntimeError:
            log.exception("request failed for %s", {"key": SK_KEY})
    finally:
        log.removeHandler(handler)
    text = stream.getvalue()
    assert f"WARNING reply held {REDACTED}" in text and f"RuntimeError: server echoed {REDACTED}" in text
    assert SK_KEY not in text and RANDOM_KEY not in text
    bad = logging.getLogRecordFactory()("x", logging.WARNING, __file__, 1, "held %s and %(", (SK_KEY,), None)
    assert (bad.msg, bad.args) == ("held %s and %(", (REDACTED,))  # a bad format: logging reports it, scrubbed


# -- the store

def test_every_text_and_json_column_is_scrubbed():
    for table in Base.metadata.tables.values():
        for column in table.columns:
            textual = isinstance(getattr(column.type, "impl", column.type), (String, JSON))
            assert not textual or getattr(column.type, "scrubs_secrets", False), f"{table.name}.{column.name}"


def test_store_writes_no_secret_and_reads_stay_consistent(no_keys, monkeypatch, db_url):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    plan = load_plan(REPO / "plans" / "interleave.json")
    echoed = {**plan.to_dict(), "description": f"from {SK_KEY}"}  # cosmetic: the hash stays
    with Store.open(db_url) as store:
        run = store.create_run("r", {"name": "tiny", "family": "llama->llama"}, "/w.toml", "analytical",
                               "openai:m", 0, {"base_url": f"http://h/v1?api_key={KEY}", "note": RANDOM_KEY})
        node, _ = store.add_node(run, echoed, plan.hash, None, [{"op": "test", "path": "/name", "value": KEY}],
                                 f"because {KEY}", "openai:m", "tiles", 0.5)
        store.claim_evaluation("k", plan.hash, run, "me:1", 60)
        store.finish_evaluation("k", EvalResult(plan.hash, "tiny", "analytical", Stage.COMPILE,
                                                Status.COMPILE_ERROR, True, error=f"boom {SK_KEY}"), 0.0)
        store.record_llm_call(run, "openai", "m", f"prompt {KEY}", f"reply {SK_KEY}", 1, 1, 0.0, 0.1,
                              f"LLMFatalError: 401 {RANDOM_KEY}")
        store.add_lesson("analytical", "llama->llama", "tiles", f"{KEY} helps", 0.1, run)
        stored = store.node(node)
        assert store.node_by_hash(run, plan.hash).id == node
        assert store.evaluation("k").result.error == f"boom {REDACTED}"
        assert store.lessons("analytical", "llama->llama") == [f"{REDACTED} helps"]
        best = store.best_plans("analytical", "llama->llama")  # a JSON path query through the scrubbing type
    assert [b["plan_hash"] for b in best] == [plan.hash]
    assert validate_plan(stored.plan).hash == plan.hash and stored.rationale == f"because {REDACTED}"
    data = stored_bytes(db_url)
    assert REDACTED.encode() in data and occurrences(data) == dict.fromkeys(SECRETS, 0)


# -- a search whose LLM server echoes the keys, end to end

def occurrences(data: bytes) -> dict[str, int]:
    return {s: data.count(s.encode()) for s in SECRETS}


def database_bytes(db: Path) -> bytes:
    """The database file and any journal beside it."""
    return b"".join(p.read_bytes() for p in sorted(db.parent.glob(db.name + "*")))


def stored_bytes(db_url: str) -> bytes:
    """A SQLite file's bytes; on PostgreSQL every row of every table as text."""
    if "://" not in db_url:
        return database_bytes(Path(db_url))
    engine = create_engine(db_url)
    try:
        with engine.connect() as c:
            return "".join(str(row) for table in Base.metadata.tables
                           for row in c.exec_driver_sql(f"SELECT t::text FROM {table} t")).encode()
    finally:
        engine.dispose()


def cli(*argv) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue() + err.getvalue()


def reply(*items: dict) -> str:
    return f"Sure, with {KEY} and {SK_KEY}:\n" + json.dumps({"edits": list(items)})


def warps(n: int, why: str) -> dict:
    return {"patch": [{"op": "replace", "path": "/cross/launch/num_warps", "value": n}], "rationale": why,
            "kind": "cross"}


def script_echoes(server) -> None:
    """Every expansion's replies, each echoing the keys: an error body, an answer with only invalid
    edits (its reasons quote the key back in the next prompt), edits whose rationales, values and a
    plan's description carry the keys, one of them failing to compile (a lesson)."""
    server.fail(500, f"upstream refused {KEY} ({SK_KEY}, {RANDOM_KEY})")
    server.reply(reply({"patch": [{"op": "replace", "path": "/cross/alignment", "value": KEY}], "kind": "other"}))
    described = {"patch": [{"op": "replace", "path": "/cross/launch/num_stages", "value": 4},
                           {"op": "replace", "path": "/description", "value": f"by {SK_KEY}"}],
                 "rationale": f"stages, see {RANDOM_KEY}", "kind": "cross"}
    server.reply(reply(warps(8, f"more warps for {KEY}"), described,
                       {"patch": HUGE_TILES, "rationale": f"huge tiles {SK_KEY}", "kind": "tiles"}))
    for n in range(30):
        server.reply(reply(warps(2 ** (n % 5), f"{2 ** (n % 5)} warps ({KEY})"),
                           {"patch": [{"op": "replace", "path": "/cross/launch/num_stages", "value": 1 + n % 8}],
                            "rationale": f"stages {1 + n % 8} {SK_KEY}", "kind": "cross"}))


@pytest.fixture
def log_file(tmp_path):
    """Every record of the package, the SDK and its HTTP client, at DEBUG, into a file."""
    path = tmp_path / "search.log"
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    names = ("conjugate", "openai", "httpx")
    levels = {name: logging.getLogger(name).level for name in names}
    for name in names:
        logging.getLogger(name).setLevel(logging.DEBUG)
        logging.getLogger(name).addHandler(handler)
    yield path
    for name in names:
        logging.getLogger(name).removeHandler(handler)
        logging.getLogger(name).setLevel(levels[name])
    handler.close()


def test_a_search_echoing_keys_stores_logs_and_exports_none(no_keys, monkeypatch, tmp_path, log_file):
    from loopback import Loopback  # tests/loopback.py

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("CONJUGATE_CACHE", str(tmp_path / "cache"))
    fast = re.sub(r"(?m)^max_params\s*=.*$", "max_params = 0", (REPO / "evaluators" / "analytical.toml").read_text())
    (tmp_path / "fast.toml").write_text(fast)
    db, exported = tmp_path / "echo.db", tmp_path / "export"
    with Loopback("openai") as server:
        script_echoes(server)
        code, searched = cli("search", TINY, "--db", db, "--budget", 7, "--evaluator", tmp_path / "fast.toml",
                             "--agent", "openai:loopback-model", "--base-url", server.base_url)
        assert code == 0, searched
    assert {r.headers["authorization"] for r in server.requests} == {f"Bearer {KEY}"}
    code, shown = cli("show", db)
    assert code == 0, shown
    code, written = cli("export", db, "--out", exported)
    assert code == 0, written

    places = {"database": database_bytes(db), "logs": log_file.read_bytes() + (searched + shown + written).encode()}
    places |= {str(p.relative_to(exported)): p.read_bytes() for p in sorted(exported.rglob("*")) if p.is_file()}
    counts = {place: occurrences(data) for place, data in places.items()}
    assert {place: hits for place, hits in counts.items() if any(hits.values())} == {}
    with contextlib.closing(sqlite3.connect(db)) as c:  # the echoes reached the store, scrubbed
        replies = [r for (r,) in c.execute("SELECT reply || prompt || error FROM llm_calls")]
        nodes = c.execute("SELECT plan, plan_hash, rationale FROM nodes").fetchall()
    assert sum(REDACTED in r for r in replies) >= 3
    assert any(REDACTED in rationale for _, _, rationale in nodes)
    assert all(validate_plan(json.loads(plan)).hash == plan_hash for plan, plan_hash, _ in nodes)
    assert {"report.md", "report.json", "best_plan.json", "reproduce.sh"} <= set(places)
