"""Misbehaving LLM endpoints, through the real SDK clients against a loopback server of each
protocol: every misbehaviour of TABLE becomes a retried, fed-back or noted failure that the call's
record keeps, and never crashes a proposer or a search; reply parsing stays linear in the reply's
length and bounded in depth; stored prompts and replies are capped; a search given --time against a
hung endpoint ends within its promise; no run is left marked running."""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import re
import sqlite3
import time
from pathlib import Path

import pytest

import conjugate.cli
import conjugate.evaluate.worker
from conjugate.agents import make_proposer
from conjugate.agents.llm.anthropic import AnthropicClient
from conjugate.agents.base import NodeContext, ProposerUnavailable
from conjugate.agents.llm.llm import STORED_CHARS, LLMProposer, stored
from conjugate.agents.llm.openai import OpenAIClient
from conjugate.agents.llm.prompt import MAX_REPLY_CHARS, parse_reply
from conjugate.agents.llm.wire import MAX_DEPTH, Failure
from conjugate.cli import main
from conjugate.evaluate.pipeline import evaluate
from conjugate.evaluate.evaluators import load_profile
from conjugate.paths import shipped_plan
from conjugate.plan import load_plan
from conjugate.search.run import Search
from conjugate.search.settings import SearchSettings
from conjugate.search.store import Store
from conjugate.workload import load_workload
from loopback import Loopback, Request, anthropic_reply, error_body, openai_reply

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "examples" / "tiny.toml"
PROVIDERS = ("anthropic", "openai")
MODELS = {"anthropic": "claude-sonnet-5", "openai": "gpt-5.5"}  # both priced: costs are not 0
KEYS = {"anthropic": "sk-ant-faults-0123456789", "openai": "sk-faults-9876543210"}
CLIENTS = {"anthropic": AnthropicClient, "openai": OpenAIClient}
TIMEOUT_S = 5.0  # the clients' timeout in the table: ample for a loopback reply on a busy machine
HANG_TIMEOUT_S = 0.5  # theirs where the endpoint hangs
EVAL_LIMIT_S = 2  # the evaluator profile's time limit in the search tests
STALL_S = 90.0  # a hung endpoint's delay: far past any search's --time here, far short of the 600 s default

GOOD = {"patch": [{"op": "replace", "path": "/cross/interleave/pattern", "value": "blocked"}],
        "rationale": "target programs first", "kind": "cross"}
OTHER = {"patch": [{"op": "replace", "path": "/cross/launch/num_warps", "value": 8}],
         "rationale": "more warps", "kind": "tiles"}


def edits(*items: dict) -> str:
    return json.dumps({"edits": list(items)})


# -- a loopback server that can also misbehave below the JSON level

@dataclasses.dataclass
class Raw:
    """A response sent as it is: any bytes, any content type; or `close` (no response at all) or
    `cut` (headers promising more body than is sent, then the connection closed)."""
    payload: bytes = b""
    content_type: str = "application/json"
    action: str = "send"


class FaultLoopback(Loopback):
    """Loopback whose script may hold Raw responses (pushed with status and a Raw body)."""

    def _handler(self):
        base, server = super()._handler(), self

        class Handler(base):
            def do_POST(self) -> None:
                head = server.script[0] if server.script else None
                if head is None or not isinstance(head.body, Raw):
                    return super().do_POST()
                self.rfile.read(int(self.headers.get("content-length") or 0))
                scripted = server._take(Request(self.path, {k.lower(): v for k, v in self.headers.items()}, {}))
                raw: Raw = scripted.body
                self.close_connection = True
                if raw.action == "close":
                    return
                declared = len(raw.payload) + (1000 if raw.action == "cut" else 0)
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.send_response(scripted.status)
                    self.send_header("content-type", raw.content_type)
                    self.send_header("content-length", str(declared))
                    self.end_headers()
                    self.wfile.write(raw.payload)

        return Handler


def raw(payload: bytes | str = b"", content_type: str = "application/json", action: str = "send"):
    data = payload.encode() if isinstance(payload, str) else payload
    return lambda provider, server: server.push(200, Raw(data, content_type, action))


def reply_body(provider: str, text: str, usage: object = None) -> dict:
    body = (anthropic_reply if provider == "anthropic" else openai_reply)(text)
    if usage is not None:
        body["usage"] = usage
    return body


def usage_of(provider: str, input_count, output_count) -> dict:
    keys = ("input_tokens", "output_tokens") if provider == "anthropic" else ("prompt_tokens", "completion_tokens")
    return dict(zip(keys, (input_count, output_count)))


def body(make):
    """A 200 JSON response whose body `make(provider)` builds."""
    return lambda provider, server: server.push(200, make(provider))


def text_reply(text: str):
    return lambda provider, server: server.reply(text)


def with_usage(input_count, output_count):
    return lambda provider, server: server.push(
        200, reply_body(provider, edits(GOOD), usage_of(provider, input_count, output_count)))


def wrong_types(provider: str) -> dict:
    if provider == "anthropic":
        return {"content": "not a list of blocks", "usage": {"input_tokens": 1, "output_tokens": 1}}
    return {"choices": [{"message": {"content": 42}}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}


def blocks_not_objects(provider: str) -> dict:
    return {"content": [1, 2]} if provider == "anthropic" else {"choices": ["a choice"]}


def no_text(provider: str) -> dict:
    """A well-formed reply without any text: only a thinking block, or a null message content."""
    if provider == "anthropic":
        return reply_body(provider, "") | {"content": [{"type": "thinking", "thinking": "hmm", "signature": "s"}]}
    body = reply_body(provider, "")
    body["choices"][0]["message"]["content"] = None
    return body


def huge_body(provider: str) -> bytes:
    return json.dumps(reply_body(provider, edits(GOOD) + " " * (8 << 20))).encode()


DEEP = 100_000
RETRIED, FED_BACK, NOTED = "retried", "fed back", "noted"
# name, what becomes of it, the failure the record keeps (retried), what the record (noted) or the next
# prompt (fed back) says, script
TABLE = [
    ("non-JSON 200", RETRIED, Failure.MALFORMED, raw("upstream hiccup, try later")),
    ("HTML error page", RETRIED, Failure.MALFORMED, raw("<html>502 Bad Gateway</html>", "text/html")),
    ("truncated JSON", RETRIED, Failure.MALFORMED, raw('{"id": "msg_1", "content": [{"type": "te')),
    ("JSON list", RETRIED, Failure.MALFORMED, raw('[{"edits": []}]')),
    ("JSON string", RETRIED, Failure.MALFORMED, raw('"edits"')),
    ("JSON null", RETRIED, Failure.MALFORMED, raw("null")),
    ("empty body", RETRIED, Failure.MALFORMED, raw("")),
    ("text/plain content type", RETRIED, Failure.MALFORMED, raw(edits(GOOD), "text/plain")),
    ("not UTF-8", RETRIED, Failure.MALFORMED, raw(b'{"content": "\xff\xfe"}')),
    ("wrong field types", RETRIED, Failure.MALFORMED, body(wrong_types)),
    ("missing fields", RETRIED, Failure.MALFORMED, raw('{"id": "x", "type": "message"}')),
    ("items not objects", RETRIED, Failure.MALFORMED, body(blocks_not_objects)),
    ("non-numeric usage", NOTED, 'is "many", not a token count', with_usage("many", "lots")),
    ("negative usage", NOTED, "is -5, not a token count", with_usage(-5, -7)),
    ("absurd usage", NOTED, "not a token count", with_usage(10**30, 1.5)),
    ("usage not an object", NOTED, '"usage" is a list', lambda p, s: s.push(200, reply_body(p, edits(GOOD), [1]))),
    ("huge reply (8 MB)", RETRIED, Failure.MALFORMED, lambda p, s: s.push(200, Raw(huge_body(p)))),
    ("deeply nested body", RETRIED, Failure.MALFORMED,
     raw('{"content": ' + "[" * DEEP + "]" * DEEP + "}")),
    ("deeply nested reply", FED_BACK, f"nested deeper than {MAX_DEPTH}",
     text_reply('{"edits": ' + "[" * 5000 + "]" * 5000 + "}")),
    ("many braces", FED_BACK, f"nested deeper than {MAX_DEPTH}", text_reply("{" * (MAX_REPLY_CHARS - 10))),
    ("many balanced braces", FED_BACK, 'no "edits" list', text_reply("{}" * (MAX_REPLY_CHARS // 2 - 5))),
    ("reply text too long", FED_BACK, "characters long", text_reply(edits(GOOD) + " " * MAX_REPLY_CHARS)),
    ("no JSON in the text", FED_BACK, "no JSON object", text_reply("I would rather not.")),
    ("no text at all", FED_BACK, "no JSON object", body(no_text)),
    ("hang past the timeout", RETRIED, Failure.TIMEOUT, lambda p, s: s.stall(HANG_TIMEOUT_S + 0.7)),
    ("500", RETRIED, Failure.STATUS, lambda p, s: s.fail(500)),
    ("503", RETRIED, Failure.STATUS, lambda p, s: s.fail(503)),
    ("429", RETRIED, Failure.STATUS, lambda p, s: s.push(429, error_body(p, 429, "slow down"), headers={"retry-after": "0"})),
    ("connection closed", RETRIED, Failure.CONNECTION, raw(action="close")),
    ("body cut short", RETRIED, Failure.CONNECTION, raw(edits(GOOD)[:20], action="cut")),
]


@pytest.fixture(params=PROVIDERS)
def provider(request, monkeypatch):
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL", "OPENAI_API_KEY",
                 "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ANTHROPIC_API_KEY" if request.param == "anthropic" else "OPENAI_API_KEY", KEYS[request.param])
    return request.param


@pytest.fixture(scope="module")
def context() -> NodeContext:
    plan = load_plan(shipped_plan("interleave"))
    return NodeContext(plan=plan.to_dict(), plan_hash=plan.hash, workload={"name": "tiny", "k": 3},
                       evaluator="analytical", device="NVIDIA H200", sms=132)


def make_agent(provider: str, server: Loopback, records: list, timeout_s: float = TIMEOUT_S, **kw) -> LLMProposer:
    client = CLIENTS[provider](MODELS[provider], base_url=server.base_url, timeout_s=timeout_s)
    return LLMProposer(client, provider, client.model, log_call=records.append, backoff_s=0.01, **kw)


def assert_capped(records: list[dict]) -> None:
    for record in records:
        for field in ("prompt", "reply"):
            assert len(record[field]) <= STORED_CHARS + 100, (field, len(record[field]))


# -- 1. the table, at the proposer

@pytest.mark.parametrize("name, outcome, says, script", TABLE, ids=[row[0] for row in TABLE])
def test_misbehaviour_is_survived_and_recorded(provider, context, name, outcome, says, script):
    records = []
    with FaultLoopback(provider) as server:
        script(provider, server)
        if outcome != NOTED:
            server.reply(edits(GOOD))
        timeout_s = HANG_TIMEOUT_S if name.startswith("hang") else TIMEOUT_S
        proposals = make_agent(provider, server, records, timeout_s).propose(context, 2)
        requests = server.requests
    assert [p.kind for p in proposals] == ["cross"]  # survived, and the good reply after it was used
    first = records[0]
    if outcome == RETRIED:  # recorded, then repeated as a transient failure
        assert len(records) == len(requests) == 2 and records[1]["error"] == ""
        assert first["error"].startswith(("LLMTransientError", "LLMMalformedReply")) and f": {says}: " in first["error"], first
        assert first["reply"] == "" and first["cost_usd"] == 0
    elif outcome == FED_BACK:  # a reply that arrived: its reason goes back to the model once
        assert len(records) == len(requests) == 2 and first["error"] == ""
        assert says in requests[1].text(), requests[1].text()[-600:]
    else:  # usable, with a note; the counts it did not give are estimated, so the cost cap still holds
        assert len(records) == len(requests) == 1 and says in first["error"], first
        assert 0 < first["input_tokens"] < 10**9 and 0 < first["output_tokens"] < 10**9 and first["cost_usd"] > 0
    assert_capped(records)


def test_a_persistent_misbehaviour_makes_the_proposer_unavailable(provider, context):
    records = []
    with FaultLoopback(provider) as server:
        for _ in range(3):
            raw("<html>maintenance</html>")(provider, server)
        agent = make_agent(provider, server, records, max_retries=2)
        with pytest.raises(ProposerUnavailable, match="not a JSON object.*gave up after 3 attempts"):
            agent.propose(context, 2)
    assert len(records) == 3 and all("LLMMalformedReply" in r["error"] for r in records)


def test_the_search_deadline_bounds_a_request_and_its_retries(provider, context):
    """A client timeout of 600 s, a hung endpoint, one second left: the proposer gives up at the deadline."""
    records = []
    with FaultLoopback(provider) as server:
        server.stall(STALL_S)
        agent = make_agent(provider, server, records, timeout_s=600)
        start = time.monotonic()
        with pytest.raises(ProposerUnavailable, match="time is up|no time left"):
            agent.propose(dataclasses.replace(context, deadline=start + 1.0), 2)
        took = time.monotonic() - start
    assert 0.9 <= took < STALL_S, took  # cut at the deadline, not at the endpoint's answer
    assert len(records) == 1 and Failure.TIMEOUT in records[0]["error"] and records[0]["latency_s"] < STALL_S


def test_llm_timeout_reaches_the_client(provider, context):
    records = []
    with FaultLoopback(provider) as server:
        server.stall(STALL_S)
        server.reply(edits(GOOD))
        agent = make_proposer(f"{provider}:{MODELS[provider]}", base_url=server.base_url, log_call=records.append,
                              timeout_s=0.3)
        agent.backoff_s = 0.01
        assert [p.kind for p in agent.propose(context, 1)] == ["cross"]
    assert Failure.TIMEOUT in records[0]["error"] and records[0]["latency_s"] < STALL_S  # 0.3 s, not 600


# -- 2. parsing: linear in the reply's length, bounded in depth; storing: capped

PATHOLOGICAL = {  # each about MAX_REPLY_CHARS long; the answer, if any, comes last
    "open braces": "{" * (MAX_REPLY_CHARS - 200),
    "nested objects": '{"a":' * ((MAX_REPLY_CHARS - 200) // 5),
    "open strings": '{"k": "' * ((MAX_REPLY_CHARS - 200) // 7),
    "balanced braces": "{}" * ((MAX_REPLY_CHARS - 200) // 2),
    "stray brace, then quotes": "{ " + '"x" ' * ((MAX_REPLY_CHARS - 200) // 4),
    "open fences": "```json\n{\n" * ((MAX_REPLY_CHARS - 200) // 10),
}


@pytest.mark.parametrize("name", PATHOLOGICAL)
def test_parsing_is_linear_and_bounded(name):
    text = PATHOLOGICAL[name] + "\n" + edits(GOOD)
    assert len(text) <= MAX_REPLY_CHARS
    start = time.perf_counter()
    try:
        found = parse_reply(text)
    except ValueError as e:  # refused with a reason, never RecursionError
        found = str(e)
    took = time.perf_counter() - start
    assert took < 2.5, (name, took)  # a quadratic scan of this length takes minutes
    assert found == [GOOD] or "nested deeper" in found or "malformed JSON" in found, found


def test_a_stray_brace_before_the_answer_is_skipped():
    assert parse_reply("Consider {this. Here it is: " + edits(GOOD)) == [GOOD]
    assert parse_reply('The "edits" {go} here: ```json\n' + edits(GOOD) + "\n```") == [GOOD]
    with pytest.raises(ValueError, match=f"nested deeper than {MAX_DEPTH}"):
        parse_reply('{"edits": ' + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1) + "}")
    assert parse_reply('{"edits": [' + json.dumps(GOOD) + "]" + " " * 10 + "}") == [GOOD]


def test_stored_prompts_and_replies_are_capped_with_their_size(provider, context):
    records = []
    long_reply = edits(GOOD) + " pad" * 25_000  # 100 000 characters: read in full, stored in part
    with FaultLoopback(provider) as server:
        server.reply(long_reply)
        assert [p.kind for p in make_agent(provider, server, records).propose(context, 1)] == ["cross"]
    assert records[0]["reply"].startswith(long_reply[:1000])
    assert records[0]["reply"].endswith(f"[... stored {STORED_CHARS} of {len(long_reply)} characters]")
    assert_capped(records)
    assert stored("x" * 10) == "x" * 10 and len(stored("y" * 10**6)) < STORED_CHARS + 100


# -- 3. the search: survives, stops resumable, keeps its time, never stays "running"

class InProcessEvaluator:
    """IsolatedEvaluator's interface in this process (fast: no worker to start)."""

    def __init__(self, profile, *args, **kwargs):
        self.profile = profile

    def evaluate(self, plan: dict, workload_path, **kwargs):
        return evaluate(plan, load_workload(workload_path), self.profile)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


@pytest.fixture(scope="module")
def profile(tmp_path_factory) -> Path:
    """The analytical profile without the interpreter's check, and a short time limit."""
    text = (REPO / "evaluators" / "analytical.toml").read_text()
    text = re.sub(r"(?m)^max_params\s*=.*$", "max_params = 0", text)
    text = re.sub(r"(?m)^time_limit_s\s*=.*$", f"time_limit_s = {EVAL_LIMIT_S}", text)
    path = tmp_path_factory.mktemp("faults") / "fast.toml"
    path.write_text(text)
    return path


@pytest.fixture
def search_env(monkeypatch, tmp_path, provider):
    monkeypatch.setenv("CONJUGATE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(conjugate.cli.out, "width", 200)
    monkeypatch.setattr(LLMProposer, "_delay", lambda self, attempt, retry_after_s: 0.01)
    return tmp_path


def cli(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def run_row(db: Path) -> tuple[str, list[str], int]:
    """(the latest run's status, its root node's status list, LLM calls recorded)."""
    with contextlib.closing(sqlite3.connect(db)) as c:
        run_id, status = c.execute("SELECT id, status FROM runs ORDER BY id DESC LIMIT 1").fetchone()
        nodes = [s for (s,) in c.execute("SELECT status FROM nodes WHERE run_id = ? ORDER BY id", (run_id,))]
        calls = c.execute("SELECT count(*) FROM llm_calls WHERE run_id = ?", (run_id,)).fetchone()[0]
    return status, nodes, calls


def llm_calls(db: Path) -> list[tuple[str, str, str, float]]:
    with contextlib.closing(sqlite3.connect(db)) as c:
        return c.execute("SELECT prompt, reply, error, latency_s FROM llm_calls ORDER BY id").fetchall()


def test_a_search_survives_misbehaviours_and_an_agent_that_stops_answering(search_env, profile, provider,
                                                                          monkeypatch):
    """Misbehaviours between good replies, a hang among them (--llm-timeout 1.5): the search goes on.
    Then only 503s: the run stops, resumable, the node it asked about open; a resume against a healthy
    server finishes it."""
    monkeypatch.setattr(conjugate.evaluate.worker, "IsolatedEvaluator", InProcessEvaluator)
    db, agent = search_env / "faults.db", f"{provider}:{MODELS[provider]}"
    with FaultLoopback(provider) as server:
        for script in (raw("null"), body(wrong_types), text_reply("{" * 50_000), with_usage("many", -1),
                       lambda p, s: s.stall(STALL_S)):
            script(provider, server)
            server.reply(edits(GOOD, OTHER))
        for _ in range(5):
            server.fail(503)
        code, out, err = cli("search", TINY, "--db", db, "--budget", 30, "--evaluator", profile, "--agent", agent,
                             "--base-url", server.base_url, "--llm-timeout", "1.5")
        asked = len(server.requests)
    assert code == 0, err
    said = " ".join(out.split())  # the console wraps long lines
    assert "search stopped (the agent did not answer" in said and "503" in said and "gave up after 5" in said
    status, nodes, calls = run_row(db)
    assert status == "stopped" and calls == asked == 2 * 5 + 5  # the misbehaviours, the good replies, the 503s
    assert nodes[0] != "expanded"  # the node the agent did not answer for stays open
    stored_calls = llm_calls(db)
    errors = [e for _, _, e, _ in stored_calls]
    assert "not a JSON object" in errors[0] and ", not a" in errors[2]
    assert any('"many"' in e for e in errors) and all("503" in e for e in errors[-5:])
    hang = next(c for c in stored_calls if Failure.TIMEOUT in c[2])
    assert 1.4 <= hang[3] < STALL_S  # --llm-timeout reached the client (its default is 600 s)
    assert all(len(p) <= STORED_CHARS + 100 and len(r) <= STORED_CHARS + 100 for p, r, _, _ in stored_calls)

    with FaultLoopback(provider) as server:
        for _ in range(20):
            server.reply(edits(GOOD, OTHER))
        code, out, err = cli("search", "--resume", db, "--budget", 6, "--base-url", server.base_url)
    assert code == 0, err
    assert run_row(db)[0] == "finished" and "search finished" in out


def test_an_unexpected_error_leaves_no_run_running(search_env, profile, provider, monkeypatch):
    def broken(self, context, n):
        raise RuntimeError("a bug in a proposer")

    monkeypatch.setattr(conjugate.evaluate.worker, "IsolatedEvaluator", InProcessEvaluator)
    monkeypatch.setattr(LLMProposer, "propose", broken)
    db = search_env / "bug.db"
    with pytest.raises(RuntimeError, match="a bug in a proposer"):
        cli("search", TINY, "--db", db, "--evaluator", profile, "--agent", f"{provider}:{MODELS[provider]}",
            "--base-url", "http://127.0.0.1:9")
    assert run_row(db)[0] == "stopped"


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon", "1e999"])
def test_llm_timeout_must_be_positive_and_finite(search_env, profile, value):
    db = search_env / "never.db"
    code, _, err = cli("search", TINY, "--db", db, "--evaluator", profile, f"--llm-timeout={value}")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: --llm-timeout:") and value in lines[0], err
    assert not db.exists()


def test_search_time_is_kept_against_a_hung_endpoint(search_env, profile, provider):
    """--time 3 and an endpoint that answers only after STALL_S (the client's own timeout: 600 s):
    the search stops at its deadline, cutting the hung request, with the real worker-isolated
    evaluator. The bounds hold on a loaded machine: whatever the machine's pace, a search that waited
    for the endpoint would take STALL_S at least, one that kept its time far less."""
    promise_s, db = 3.0, search_env / "hung.db"
    with Store.open(db) as store:  # the seeds evaluated beforehand: the agent is asked at once
        evaluator = InProcessEvaluator(load_profile(profile))
        Search.start(store, "seeds", load_workload(TINY), str(TINY), evaluator, make_proposer("heuristic"),
                     SearchSettings(budget=3), seed=0).run_loop()
    with FaultLoopback(provider) as server:
        for _ in range(3):
            server.stall(STALL_S)
        start = time.monotonic()
        code, out, err = cli("search", TINY, "--db", db, "--evaluator", profile, "--time", promise_s,
                             "--agent", f"{provider}:{MODELS[provider]}", "--base-url", server.base_url)
        took = time.monotonic() - start
        asked = len(server.requests)
    assert code == 0, err
    assert asked >= 1 and promise_s - 0.5 <= took < STALL_S, took  # asked, waited for, then cut at the deadline
    assert "search stopped (deadline)" in " ".join(out.split()) and run_row(db)[0] == "stopped"
    hung = [latency for _, _, e, latency in llm_calls(db) if Failure.TIMEOUT in e]
    assert hung and max(hung) < STALL_S
    print(f"--time {promise_s:g} against a hung endpoint: ended after {took:.2f} s")


def test_a_second_ctrl_c_while_a_hung_request_is_closed_ends_in_one_line(tmp_path):
    """The `conjugate search` process itself, its LLM request hanging: Ctrl-C, then Ctrl-C again while
    the request and the store are being closed. One line, exit 130, the run left resumable."""
    import os
    import signal
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    profile = tmp_path / "unchecked.toml"  # the seeds scored without the interpreter's check: the LLM is asked soon
    profile.write_text(re.sub(r"(?m)^max_params\s*=.*$", "max_params = 0", (root / "evaluators" / "analytical.toml").read_text()))
    with Loopback("openai") as server:
        server.stall(120)
        db = tmp_path / "run.db"
        env = dict(os.environ, OPENAI_API_KEY="sk-test", PYTHONPATH=str(root))
        search = subprocess.Popen([sys.executable, "-m", "conjugate", "search", "--agent", "openai:m", "--base-url",
                                   server.base_url, "--db", str(db), "--budget", "5", "--evaluator", str(profile)], env=env, cwd=tmp_path,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 240
        while not server.requests and time.monotonic() < deadline and search.poll() is None:
            time.sleep(0.1)  # the seeds are evaluated; the first LLM request hangs
        assert server.requests, search.communicate(timeout=30)
        time.sleep(0.3)
        search.send_signal(signal.SIGINT)
        time.sleep(0.2)
        search.send_signal(signal.SIGINT)
        _, err = search.communicate(timeout=120)
    assert search.returncode == 130 and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    assert main(["show", str(db)]) == 0  # the store is whole
