"""The LLM proposers over the real anthropic and openai SDKs, against a scripted loopback server;
the replay proposer; make_proposer."""
from __future__ import annotations

import dataclasses
import json
import sys
import types

import pytest

from conjugate.agents import make_proposer
from conjugate.agents.llm.anthropic import AnthropicClient
from conjugate.agents.base import NodeContext, Proposal, ProposerUnavailable
from conjugate.agents.llm.llm import ChatReply, LLMBudgetExceeded, LLMProposer, cost_usd, load_prices
from conjugate.agents.llm.openai import OpenAIClient
from conjugate.agents.llm.prompt import parse_reply
from conjugate.agents.llm.wire import Failure
from conjugate.agents.replay import ReplayProposer
from conjugate.compiler.feedback import LaunchFeedback, PartRef, Resources
from conjugate.errors import ConjugateError
from conjugate.evaluate.result import EvalResult, Metrics, Stage, Status, Verdict, VerdictKind
from conjugate.paths import shipped_plan
from conjugate.plan import load_plan, patch_plan
from conjugate.roles import Model
from loopback import Loopback  # tests/loopback.py (pytest puts tests/ on sys.path)

PROVIDERS = ("anthropic", "openai")
KEYS = {"anthropic": "sk-ant-loopback-K3Y-0123456789", "openai": "sk-loopback-K3Y-9876543210"}
ENV = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}
CLIENTS = {"anthropic": AnthropicClient, "openai": OpenAIClient}

GOOD = [
    {"patch": [{"op": "replace", "path": "/cross/interleave/pattern", "value": "blocked"}],
     "rationale": "target programs first", "kind": "cross"},
    {"patch": [{"op": "replace", "path": "/target/tiles/qkv/BLOCK_M", "value": 128}],
     "rationale": "wider tiles", "kind": "tiles"},
    {"patch": [{"op": "replace", "path": "/cross/launch/num_warps", "value": 8}],
     "rationale": "more warps\nper launch", "kind": "no-such-kind"},
]
BAD = [  # not a power of two, an unknown key, a path that does not exist
    {"patch": [{"op": "replace", "path": "/target/tiles/qkv/BLOCK_M", "value": 48}], "kind": "tiles"},
    {"patch": [{"op": "add", "path": "/target/tiles/qkv/BLOCK_Q", "value": 64}], "kind": "tiles"},
    {"patch": [{"op": "replace", "path": "/target/tiles/nope/BLOCK_M", "value": 64}], "kind": "tiles"},
]


def edits(*items: dict) -> str:
    return json.dumps({"edits": list(items)})


@pytest.fixture(scope="module")
def plan():
    return load_plan(shipped_plan("interleave"))


@pytest.fixture
def context(plan):
    parts = (PartRef(Model.TARGET, "qkv", ("t.l0.qkv",), 96), PartRef(Model.DRAFT, "qkv", ("d.s0.l0.qkv",), 32))
    metrics = Metrics(latency_ms=9.8765, floor_ms=6.45, floor_ratio=1.5312, bandwidth_gbs=2700.0, launches=40,
                      device="NVIDIA H200", sms=132, speedups={"sequential": 1.1325})
    result = EvalResult(plan.hash, "tiny", "analytical", Stage.TIMING, Status.OK, True, metrics,
                        verdicts=(Verdict(7, VerdictKind.INTERFERENCE, 45.0, 40.0, -12.5, parts, True),),
                        feedback=(LaunchFeedback(7, "k_ab.py", parts, Resources(registers=168, spills=4)),))
    return NodeContext(plan=plan.to_dict(), plan_hash=plan.hash, workload={"name": "tiny", "k": 4},
                       evaluator="analytical", device="NVIDIA H200", sms=132, result=result,
                       baselines={"sequential": 11.1}, lessons=["packed layout spills on gate_up"],
                       edit_stats={"tiles": {"n": 3, "mean_gain": 0.02}})


@pytest.fixture(params=PROVIDERS)
def provider(request, monkeypatch):
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL", "OPENAI_API_KEY",
                 "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(ENV[request.param], KEYS[request.param])
    return request.param


@pytest.fixture
def server(provider):
    with Loopback(provider) as s:
        yield s


def make_agent(provider: str, server: Loopback, records: list, **kw) -> LLMProposer:
    client = CLIENTS[provider]("claude-sonnet-5" if provider == "anthropic" else "gpt-5.5",
                               base_url=server.base_url, timeout_s=kw.pop("timeout_s", 1.0))
    kw = {"max_retries": 3, "backoff_s": 0.01, "log_call": records.append} | kw
    return LLMProposer(client, provider, client.model, **kw)


def test_good_reply_gives_valid_proposals(provider, server, context, plan):
    records = []
    server.reply("Here you go:\n```json\n" + edits(*GOOD) + "\n```\n")
    proposals = make_agent(provider, server, records).propose(context, 5)
    assert [p.kind for p in proposals] == ["cross", "tiles", "other"]
    assert proposals[2].rationale == "more warps per launch"
    assert all(isinstance(p, Proposal) and patch_plan(plan, p.patch).hash != plan.hash for p in proposals)
    assert len(server.requests) == 1 and server.requests[0].path.endswith(("/chat/completions", "/messages"))
    (record,) = records
    assert record["error"] == "" and record["input_tokens"] == 120 and record["output_tokens"] == 30
    assert record["cost_usd"] == pytest.approx(cost_usd(record["model"], 120, 30, load_prices()))
    assert record["cost_usd"] > 0
    assert record["reply"].startswith("Here you go") and record["latency_s"] >= 0


def test_n_caps_the_edits(provider, server, context):
    server.reply(edits(*GOOD))
    assert len(make_agent(provider, server, []).propose(context, 2)) == 2


def test_malformed_json_is_retried_once_with_the_reason(provider, server, context):
    server.reply('{"edits": [{"patch": [}')
    server.reply(edits(GOOD[0]))
    proposals = make_agent(provider, server, []).propose(context, 3)
    assert [p.kind for p in proposals] == ["cross"]
    assert len(server.requests) == 2
    second = server.requests[1].text()
    assert "malformed JSON" in second and '{"edits": [{"patch": [}' in second  # the bad reply, then the reason


def test_invalid_edits_are_fed_back_and_valid_ones_kept(provider, server, context):
    server.reply(edits(*BAD))
    server.reply(edits(BAD[0], GOOD[1]))
    proposals = make_agent(provider, server, []).propose(context, 3)
    assert [p.rationale for p in proposals] == ["wider tiles"]
    second = server.requests[1].text()
    assert "edit 1: /target/tiles/qkv/BLOCK_M: 48 is not a power of two" in second
    assert "edit 2: /target/tiles/qkv/BLOCK_Q: unknown key" in second
    assert "edit 3: patch op 0" in second and "path not found" in second


def test_partly_valid_reply_needs_no_retry(provider, server, context, plan):
    no_op = {"patch": [{"op": "replace", "path": "/name", "value": "renamed"}], "kind": "other"}
    server.reply(edits(BAD[0], GOOD[0], GOOD[0], no_op))
    proposals = make_agent(provider, server, []).propose(context, 4)
    assert [p.kind for p in proposals] == ["cross"] and len(server.requests) == 1


class FakeClient:
    """An in-memory ChatClient for the logic that needs no wire."""

    def __init__(self, *texts: str):
        self.texts, self.calls = list(texts), []

    def complete(self, system, messages, max_tokens, time_left_s=None):
        self.calls.append(messages)
        return ChatReply(self.texts.pop(0), 1, 1)


def test_edits_tried_from_the_node_are_dropped(context):
    tried = [{"patch": GOOD[1]["patch"], "kind": "tiles", "status": "ok", "reward": 0.1}]
    client = FakeClient(edits(GOOD[1], GOOD[0]))
    agent = LLMProposer(client, "fake", "m", prices={})
    proposals = agent.propose(dataclasses.replace(context, tried=tried), 3)
    assert [p.kind for p in proposals] == ["cross"]
    assert agent.propose(context, 0) == [] and len(client.calls) == 1


def test_second_invalid_reply_gives_nothing(provider, server, context):
    server.reply("I would rather not.")
    server.reply(edits(BAD[1]))
    assert make_agent(provider, server, []).propose(context, 3) == []
    assert len(server.requests) == 2 and "no JSON object" in server.requests[1].text()


def test_rate_limit_and_server_error_are_retried(provider, server, context):
    records = []
    server.fail(429)
    server.fail(500)
    server.reply(edits(GOOD[0]))
    assert len(make_agent(provider, server, records).propose(context, 2)) == 1
    assert len(server.requests) == 3
    assert ["429" in records[0]["error"], "500" in records[1]["error"], records[2]["error"]] == [True, True, ""]


def test_persistent_server_error_gives_up(provider, server, context):
    records = []
    for _ in range(3):
        server.fail(500)
    agent = make_agent(provider, server, records, max_retries=2)
    with pytest.raises(ProposerUnavailable, match="gave up after 3 attempts"):  # no answer: the node stays open
        agent.propose(context, 2)
    assert len(server.requests) == 3 and len(records) == 3
    assert all("LLMTransientError" in r["error"] and "500" in r["error"] for r in records)
    assert "500" in agent.last_error


def test_timeout_is_transient(provider, server, context):
    records = []
    server.stall(1.5)
    server.reply(edits(GOOD[1]))
    proposals = make_agent(provider, server, records, timeout_s=0.4).propose(context, 1)
    assert [p.kind for p in proposals] == ["tiles"] and len(server.requests) == 2
    assert Failure.TIMEOUT in records[0]["error"] and records[1]["error"] == ""


def test_auth_failure_is_fatal(provider, server, context):
    records = []
    server.fail(401, "invalid x-api-key")
    agent = make_agent(provider, server, records)
    with pytest.raises(ProposerUnavailable, match="401"):
        agent.propose(context, 2)
    assert len(server.requests) == 1 and "LLMFatalError" in records[0]["error"] and "401" in agent.last_error


def test_cost_cap(provider, server, context):
    records = []
    server.reply(edits(GOOD[0]), **{("input_tokens" if provider == "anthropic" else "prompt_tokens"): 1_000_000})
    agent = make_agent(provider, server, records, max_cost_usd=1.0, spent_usd=0.25)
    assert len(agent.propose(context, 1)) == 1 and agent.spent_usd > 1.0
    with pytest.raises(LLMBudgetExceeded):
        agent.propose(context, 1)
    assert len(server.requests) == 1 and len(records) == 1
    with pytest.raises(LLMBudgetExceeded):  # already spent when constructed
        make_agent(provider, server, [], max_cost_usd=0.5, spent_usd=0.5).propose(context, 1)
    assert len(server.requests) == 1


def test_key_reaches_the_server_but_no_record(provider, server, context):
    records = []
    server.fail(401, f"bad key {KEYS[provider]}")  # a server that echoes the key
    server.fail(429)
    server.reply("not json")
    server.reply(edits(GOOD[0]))
    agent = make_agent(provider, server, records)
    with pytest.raises(ProposerUnavailable) as unavailable:  # the 401
        agent.propose(context, 1)
    assert KEYS[provider] not in str(unavailable.value)
    agent.propose(context, 1)
    sent = {r.headers.get("x-api-key") or r.headers.get("authorization", "").removeprefix("Bearer ")
            for r in server.requests}
    assert sent == {KEYS[provider]}
    assert len(records) == 4 and KEYS[provider] not in json.dumps(records) + agent.last_error
    assert not any(h in json.dumps(records).lower() for h in ("x-api-key\"", "authorization\""))


def test_prompt_holds_the_context(provider, server, context):
    records = []
    server.reply(edits(GOOD[0]))
    make_agent(provider, server, records).propose(context, 3)
    text = server.requests[0].text()
    sent = [server.requests[0].body.get("system")] + [m["content"] for m in server.requests[0].body["messages"]]
    assert all(part in records[0]["prompt"] for part in sent if part)  # the record holds all that was sent
    assert json.dumps(context.plan, indent=1, sort_keys=True) in text  # the plan
    assert '"$id":"conjugate.plan/2"' in text and "tile_gemm" in text  # the schema
    assert '"gain_percent":-12.5' in text and '"spills":4' in text and '"registers":168' in text  # verdicts
    assert "packed layout spills on gate_up" in text and "9.877" in text
    assert "GPU: NVIDIA H200 (132 SMs)" in text and "Evaluator: analytical" in text
    assert '"ops":["t.l0.qkv","d.s0.l0.qkv"]' in text and '"programs":[96,32]' in text
    assert "Propose 3 distinct edits" in text


def test_openai_compatible_server_needs_no_key(monkeypatch, context):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with Loopback("openai") as server:
        server.reply(edits(GOOD[0]), prompt_tokens=10**7)
        records = []
        agent = make_proposer("openai:qwen2.5-coder-32b", base_url=server.base_url, log_call=records.append)
        assert agent.name == "openai:qwen2.5-coder-32b"
        assert [p.kind for p in agent.propose(context, 1)] == ["cross"]
        request = server.requests[0]
        assert request.headers["authorization"] == "Bearer not-needed" and request.body["max_tokens"] > 0
        assert records[0]["cost_usd"] == 0.0  # a local model


def test_openai_proper_gets_max_completion_tokens(monkeypatch, context):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", KEYS["openai"])
    client = OpenAIClient("gpt-5.5")  # OpenAI's own API: its reasoning models reject max_tokens
    with Loopback("openai") as server:
        client._client = client._client.with_options(base_url=server.base_url)
        server.reply("hi")
        assert client.complete("system", [{"role": "user", "content": "x"}], 99).text == "hi"
        assert server.requests[0].body["max_completion_tokens"] == 99 and "max_tokens" not in server.requests[0].body


def test_missing_keys_are_one_line_errors(monkeypatch):
    for name in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConjugateError, match="^anthropic: set ANTHROPIC_API_KEY$"):
        make_proposer("anthropic:claude-sonnet-5")
    with pytest.raises(ConjugateError, match="OPENAI_API_KEY"):
        make_proposer("openai:gpt-5")


def test_parse_reply_is_tolerant():
    body = edits(GOOD[0])
    assert parse_reply(f"Sure.\n```json\n{body}\n```") == parse_reply(f"text {body} more {{}}") == [GOOD[0]]
    assert parse_reply('{"note": {"a": 1}} then ' + body) == [GOOD[0]]
    for text, reason in (("", "no JSON object"), ('{"moves": []}', 'no "edits"'), ('{"edits": [', "malformed")):
        with pytest.raises(ValueError, match=reason):
            parse_reply(text)


def test_prices_match_exact_glob_prefix_and_unknown():
    prices = {"gpt-5": (1.0, 10.0), "gpt-5-mini": (0.25, 2.0), "claude-sonnet-4*": (3.0, 15.0)}
    assert cost_usd("gpt-5", 10**6, 10**6, prices) == 11.0
    assert cost_usd("gpt-5-mini-2025-08-07", 10**6, 0, prices) == 0.25
    assert cost_usd("claude-sonnet-4-5-20250929", 0, 10**6, prices) == 15.0
    assert cost_usd("llama3.1:8b", 10**6, 10**6, prices) == 0.0
    assert load_prices()  # the shipped file parses


def test_replay_order_parent_and_cap(context):
    rec = [{"parent_hash": h, "patch": [{"op": "test", "path": "/schema", "value": i}], "rationale": f"r{i}",
            "kind": "tiles", "proposer": "openai:gpt-5"} for i, h in enumerate(["a", "b", "a", "a"])]
    agent = ReplayProposer(rec)
    def at(plan_hash: str) -> NodeContext:
        return NodeContext(plan={}, plan_hash=plan_hash, workload={}, evaluator="analytical", device="", sms=1)
    assert agent.name == "replay"
    assert [p.rationale for p in agent.propose(at("a"), 2)] == ["r0", "r2"]
    assert [p.rationale for p in agent.propose(at("a"), 5)] == ["r3"]
    assert agent.propose(at("a"), 5) == [] and agent.propose(at("c"), 5) == []
    assert [(p.rationale, p.kind) for p in agent.propose(at("b"), 1)] == [("r1", "tiles")]


def test_make_proposer_specs(monkeypatch):
    fake = types.ModuleType("conjugate.agents.heuristic")
    fake.HeuristicProposer = lambda seed: types.SimpleNamespace(name="heuristic", seed=seed)
    monkeypatch.setitem(sys.modules, "conjugate.agents.heuristic", fake)
    assert make_proposer("heuristic", seed=7).seed == 7
    assert make_proposer("replay", replay_records=[{"parent_hash": "a", "patch": []}]).name == "replay"
    with pytest.raises(ConjugateError, match="replay"):
        make_proposer("replay")
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEYS["anthropic"])
    monkeypatch.setenv("OPENAI_API_KEY", KEYS["openai"])
    assert make_proposer("anthropic:claude-opus-5-5").name == "anthropic:claude-opus-5-5"
    assert make_proposer("openai:gpt-5", max_cost_usd=2.0).name == "openai:gpt-5"
    for spec in ("x", "openai:", "gemini:pro", ""):
        with pytest.raises(ConjugateError) as e:
            make_proposer(spec)
        assert str(e.value) == (f"--agent: unknown agent {spec!r}; use heuristic, random, greedy, replay, "
                                "anthropic:<model> or openai:<model>")


def test_the_prompt_carries_ledger_and_overlap_within_its_budget(provider, server, context, plan, monkeypatch):
    """Through the provider's wire: the time ledger, the verdicts against two streams and the tiles
    measured for the workload's shapes reach the model, and with every section at its cap the prompt
    stays inside its stated budget."""
    from dataclasses import replace

    from conjugate.agents.llm import prompt
    from conjugate.agents.llm.prompt import PROMPT_BUDGET_CHARS
    from conjugate.agents.heuristic.tile_table import TILE_KEYS, MeasuredTile, TileTable, measured_shapes
    from conjugate.evaluate.result import KindLoss, LedgerSummary
    from conjugate.paths import EXAMPLES_DIR
    from conjugate.workload import load_workload

    workload = load_workload(EXAMPLES_DIR / "qwen25-15b-14b-b4.toml").to_dict()
    every_shape = tuple(MeasuredTile(kind, shape, {key: 4096 for key in TILE_KEYS[kind]}, 12345.6, 23456.7)
                        for model in (Model.DRAFT, Model.TARGET)
                        for kind, shape in measured_shapes(workload, model).items())
    monkeypatch.setattr(prompt, "load_tile_tables", lambda path: (TileTable("H200", "2026-12-01", "s" * 5000,
                                                                            every_shape),))

    ledger = LedgerSummary(9.8765, 6.45, 0.04, False, {"main": 9.8},
                           tuple(KindLoss(f"target {k} + draft {d}", 28, 1.0 + i / 10, 0.6, 0.6 / (1.0 + i / 10))
                                 for i, (k, d) in enumerate(zip(["qkv", "down", "attn", "gate_up", "o_proj"] * 2,
                                                                ["down", "attn", "o_proj", "qkv", "gate_up"] * 2))))
    parts = context.result.verdicts[0].parts
    verdicts = tuple(Verdict.judge(i, parts, 20.0 + i, (15.0, 10.0), modeled=False, overlap_us=18.0) for i in range(40))
    result = replace(context.result, metrics=replace(context.result.metrics, ledger=ledger), verdicts=verdicts)
    long = "x" * 5000
    full = replace(context, result=result, lessons=[long] * 50, workload=workload,
                   best=[{"plan": plan.to_dict() | {"overrides": [{"match": f"t.l{i}.*", "pair": False}
                                                                   for i in range(200)]},
                          "latency_ms": 8.0, "speedups": {"sequential": 1.3}}] * 10,
                   tried=[{"patch": [{"op": "add", "path": "/cross/overrides/-", "value": {"match": long}}], "kind": "cross",
                           "status": "ok", "reward": 1.2}] * 50,
                   failures=[{"patch": [{"op": "add", "path": "/x", "value": long}], "status": "compile_error",
                              "error": long}] * 50,
                   edit_stats={f"kind{i}": {"n": 5, "mean_gain": 0.01} for i in range(50)})
    server.reply(edits(GOOD[0]))
    make_agent(provider, server, []).propose(full, 3)
    text = server.requests[0].text()
    assert "round 9.877 ms (measured; GPU idle 0.040 ms) = 1.53x its floor 6.450 ms" in text
    assert "- target qkv + draft down: 1.000 ms in 28 launches at 60% of copy bandwidth" in text
    assert '"overlap_us":18.0' in text and '"vs_overlap":"interference"' in text
    from conjugate.agents.facts import facts_for, load_facts
    assert all(f.says in text for f in facts_for("NVIDIA H200", load_facts()))
    assert "- target attn (batch=4 tokens=6 heads=40 kv_heads=8 head_dim=128 context=1024) alone 12345.6 us" in text
    sent = sum(len(part) for part in [server.requests[0].body.get("system")] +
               [m["content"] for m in server.requests[0].body["messages"]] if isinstance(part, str))
    plan_json = len(json.dumps(full.plan, indent=1, sort_keys=True))
    assert sent - plan_json <= PROMPT_BUDGET_CHARS, sent - plan_json
