"""One model's stream on part of the GPU's SMs (plan `sm_limit`, a CUDA green context): validation,
expansion, the limited stream against a stand-in for torch's green contexts, the round under the
interpreter (which runs without it) and the heuristic's edits. The GPU run is benchmarks/knob_variants.py's."""
from __future__ import annotations

import random
import sys
from dataclasses import replace
from types import ModuleType, SimpleNamespace

import jsonschema
import pytest
import torch

import conjugate  # noqa: F401  (selects the interpreter before triton is imported)
from conjugate.agents.heuristic import candidates, persist_edits
from conjugate.agents.heuristic_edits import sm_limit_edits
from conjugate.compiler import device as sm_limit
from conjugate.compiler.device import SmLimitUnavailable, limited_stream
from conjugate.errors import PlanError
from conjugate.evaluate.result import EvalResult, LedgerSummary
from conjugate.graph import build_graph
from conjugate.plan import load_plan, validate_plan
from conjugate.plan.expand import expand
from conjugate.plan.patch import apply_patch
from test_plan import SCHEMA
from test_round import ROOT, SMALL_TILES, _round


def _streams(**fields) -> dict:
    return load_plan(ROOT / "plans" / "streams.json").to_dict() | {"tiles": SMALL_TILES} | fields


def test_a_limit_is_part_of_the_plan_only_when_set():
    plain = validate_plan(_streams())
    assert plain["sm_limit"] == {"draft": 0, "target": 0}
    assert validate_plan(_streams(sm_limit={"target": 0})).hash == plain.hash  # plans stored before keep theirs
    limited = validate_plan(_streams(sm_limit={"target": 112}))
    assert limited.hash != plain.hash and limited["sm_limit"] == {"draft": 0, "target": 112}
    jsonschema.validate(limited.to_dict(), SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(_streams(sm_limit={"target": 100}), SCHEMA)


@pytest.mark.parametrize("fields, message", [
    ({"sm_limit": {"target": 100}},
     "$.sm_limit.target: should be a multiple of 8 (SMs are partitioned in groups of 8)"),
    ({"sm_limit": {"target": 2048}}, "$.sm_limit.target: 2048 is out of range [0, 1024]"),
    ({"sm_limit": {"target": "112"}}, "$.sm_limit.target: should be an integer, got a string"),
    ({"sm_limit": {"draft": 16, "target": 112}}, "$.sm_limit: limits both models: at most one"),
    ({"sm_limit": {"verify": 8}}, "$.sm_limit"),
    ({"sm_limit": {"target": 112}, "persist": {"target": {"span": "layer"}}},
     "$.sm_limit.target: limits a model persistent with barriers ($.persist.target.span 'layer')"),
    ({"sm_limit": {"target": 112}, "streams": "one"}, "$.sm_limit.target: limits one model's stream to part of the "
                                                      "GPU, so it needs $.streams 'two'"),
])
def test_a_bad_limit_is_refused_naming_its_field(fields, message):
    with pytest.raises(PlanError) as refused:
        validate_plan(_streams(**fields))
    assert message in str(refused.value)


def test_the_schedule_carries_the_limit():
    w = _round("llama").workload
    assert expand(validate_plan(_streams(sm_limit={"draft": 64})), w, build_graph(w)).sm_limits == (("draft", 64),)
    assert expand(validate_plan(_streams()), w, build_graph(w)).sm_limits == ()


def test_limited_rounds_compute_the_reference_round_under_the_interpreter(tmp_path):
    compiled, _ = _round("llama").check(validate_plan(_streams(sm_limit={"target": 8})), tmp_path)
    assert compiled._green == []  # no GPU, no green context: the streams are the interpreter's


# -- the limited stream, against a stand-in for torch.cuda.green_contexts

@pytest.fixture
def green(monkeypatch):
    """torch.cuda.green_contexts as a stand-in: records the contexts made; `with_stream` picks the API."""
    made = []

    class Context:
        def __init__(self, num_sms, device_id):
            self.num_sms, self.device_id, self.current = num_sms, device_id, False
            made.append(self)

        def set_context(self):
            self.current = True

        def pop_context(self):
            self.current = False

    module = ModuleType("torch.cuda.green_contexts")
    module.SUPPORTED = True
    module.GreenContext = SimpleNamespace(create=lambda num_sms, device_id: Context(num_sms, device_id))
    monkeypatch.setitem(sys.modules, "torch.cuda.green_contexts", module)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(multi_processor_count=132))
    return SimpleNamespace(module=module, made=made, Context=Context)


def test_a_limited_stream_is_its_green_contexts(green):
    with pytest.raises(SmLimitUnavailable, match="gives a green context no stream of its own"):
        limited_stream(torch.device("cuda", 0), 112)  # a release whose stream is the context's only while current
    green.Context.Stream = lambda self: f"stream of {self.num_sms}"
    context, stream = limited_stream(torch.device("cuda", 1), 112)
    assert (context.num_sms, context.device_id, stream) == (112, 1, "stream of 112") and not context.current


def test_a_limit_this_machine_cannot_give_says_why(green, monkeypatch):
    with pytest.raises(SmLimitUnavailable,
                       match="136 SMs: this GPU has 132, so the limit leaves the other stream none"):
        limited_stream(torch.device("cuda", 0), 136)

    def refuse(num_sms, device_id):
        raise RuntimeError("CUDA driver error: operation not supported\nmore")
    monkeypatch.setattr(green.module, "GreenContext", SimpleNamespace(create=refuse))
    with pytest.raises(SmLimitUnavailable, match="^112 SMs: CUDA driver error: operation not supported$"):
        limited_stream(torch.device("cuda", 0), 112)
    monkeypatch.setattr(green.module, "SUPPORTED", False)
    with pytest.raises(SmLimitUnavailable, match="built without CUDA green contexts"):
        limited_stream(torch.device("cuda", 0), 112)
    assert sm_limit.__doc__  # the module says what it needs


# -- the heuristic

def _ledger(draft_ms: float, target_ms: float) -> LedgerSummary:
    return LedgerSummary(10.0, 5.0, 0.0, False, {"draft": draft_ms, "target": target_ms}, ())


def test_the_heuristic_limits_the_less_busy_stream_and_then_moves_the_limit():
    plan = validate_plan(_streams())
    wide = sm_limit_edits(plan, 132, _ledger(8.3, 6.0))  # the draft's stream 1.38x as busy: deeper limits first
    assert [c.patch[0] for c in wide] == [{"op": "replace", "path": "/sm_limit/target", "value": n}
                                          for n in (104, 96, 112)]
    assert wide[0].score > wide[1].score > wide[2].score and "draft's kernels have 28" in wide[0].rationale
    near = sm_limit_edits(plan, 132, _ledger(7.0, 6.0))  # 1.17x: a few SMs, scored lower
    assert [c.patch[0]["value"] for c in near] == [120, 112] and near[0].score < wide[0].score
    assert sm_limit_edits(plan, 132, _ledger(7.04, 6.90)) == []  # balanced: measured slower on the H200
    assert {c.patch[0]["path"] for c in sm_limit_edits(plan, 132, _ledger(5.0, 9.0))} == {"/sm_limit/draft"}
    assert [c.patch[0]["value"] for c in sm_limit_edits(plan, 132)] == [120, 112]  # no ledger: the target
    limited = validate_plan(apply_patch(plan.to_dict(), near[1].patch))
    moves = sm_limit_edits(limited, 132)
    assert sorted(c.patch[0]["value"] for c in moves) == [0, 104, 120]
    still_less_busy = {c.patch[0]["value"]: c.score for c in sm_limit_edits(limited, 132, _ledger(8.0, 6.5))}
    assert still_less_busy[104] > still_less_busy[120]  # the limited stream can yield more
    nearly = {c.patch[0]["value"]: c.score for c in sm_limit_edits(limited, 132, _ledger(6.8, 6.6))}
    assert still_less_busy[104] > nearly[104] > nearly[120]  # far from balance the next step ranks high
    now_busier = {c.patch[0]["value"]: c.score for c in sm_limit_edits(limited, 132, _ledger(6.0, 7.0))}
    assert now_busier[120] > now_busier[104]  # it yielded too much
    for c in moves:
        validate_plan(apply_patch(limited.to_dict(), c.patch))
    assert sm_limit_edits(validate_plan(load_plan(ROOT / "plans" / "sequential.json").to_dict()), 132) == []
    layered = validate_plan(_streams(persist={"target": {"span": "layer"}}))
    assert sm_limit_edits(layered, 132) == []  # refused with barriers: never proposed
    assert not [c for c in persist_edits(limited, 132) if c.patch[0]["path"] == "/persist/target"
                and c.patch[0]["value"]["span"] in ("layer", "step")]
    measured = EvalResult("h", "tiny", "h200", "timing", "ok", False, checks={"ok": True})
    assert "/sm_limit/target" in {c.patch[0]["path"] for c in candidates(plan, measured, 132, random.Random(0))}
    for unmeasured in (replace(measured, modeled=True), None):  # a model ignores the limit
        assert not [c for c in candidates(plan, unmeasured, 132, random.Random(0)) if "sm_limit" in c.patch[0]["path"]]


def test_plan_explain_names_the_limited_stream(tmp_path, capsys, monkeypatch):
    import json

    import conjugate.cli
    from conjugate.cli import main

    monkeypatch.setattr(conjugate.cli.out, "width", 200)  # one line a launch
    path = tmp_path / "limited.json"
    path.write_text(json.dumps(_streams(sm_limit={"target": 112})))
    assert main(["plan", "explain", str(path), "--workload", str(ROOT / "examples" / "tiny.toml")]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "│ draft" in line or "│ target" in line]
    assert rows and all(("│ target (112 SMs)" in row) == ("│ target" in row) for row in rows)
