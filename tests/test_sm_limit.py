"""One model's stream on part of the GPU's SMs (plan `<model>.stream.sms`, a CUDA green context): validation,
expansion, the limited stream against a stand-in for torch's green contexts, the round under the
interpreter (which runs without it) and the heuristic's edits. The GPU run is lab/knob_variants/README.md's."""
from __future__ import annotations

import sys
from types import ModuleType, SimpleNamespace

import jsonschema
import pytest
import torch

import conjugate  # noqa: F401  (selects the interpreter before triton is imported)
from conjugate.compiler import device as sm_limit
from conjugate.compiler.device import SmLimitUnavailable, limited_stream
from conjugate.errors import PlanError
from conjugate.graph import build_graph
from conjugate.plan import validate_plan
from conjugate.plan.expand import expand
from test_plan import SCHEMA
from test_round import ROOT, _round, _shipped


def _streams(draft=None, target=None, **cross) -> dict:
    """plans/streams.json with small tiles; `draft`/`target`: that model's stream.sms (left out: unset)."""
    plan = _shipped("streams", **cross)
    for model, sms in (("draft", draft), ("target", target)):
        if sms is not None:
            plan[model]["stream"]["sms"] = sms
    return plan


def test_a_limit_is_part_of_the_plan_only_when_set():
    plain = validate_plan(_streams())
    assert [plain.model(m).stream.sms for m in ("draft", "target")] == [0, 0]
    unset = _streams()
    del unset["target"]["stream"]["sms"]
    assert validate_plan(unset).hash == validate_plan(_streams(target=0)).hash == plain.hash  # 0 is the default
    limited = validate_plan(_streams(target=112))
    assert limited.hash != plain.hash
    assert [limited.model(m).stream.sms for m in ("draft", "target")] == [0, 112]
    jsonschema.validate(limited.to_dict(), SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(_streams(target=100), SCHEMA)


@pytest.mark.parametrize("fields, message", [
    ({"target": 100}, "$.target.stream.sms: should be a multiple of 8 (SMs are partitioned in groups of 8)"),
    ({"target": 2048}, "$.target.stream.sms: 2048 is out of range [0, 1024]"),
    ({"target": "112"}, "$.target.stream.sms: should be an integer, got a string"),
    ({"draft": 16, "target": 112}, "$.target.stream.sms: 112 limits both models: at most one"),
    ({"target": 112, "streams": "one"}, "$.target.stream.sms: 112 limits this model's stream to part of the GPU, "
                                        "so it needs $.cross.streams \"two\""),
])
def test_a_bad_limit_is_refused_naming_its_field(fields, message):
    with pytest.raises(PlanError) as refused:
        validate_plan(_streams(**fields))
    assert message in str(refused.value)


def test_a_limit_outside_a_model_s_stream_is_refused_naming_it():
    verify = _streams() | {"verify": {"stream": {"sms": 8}}}  # no third model
    with pytest.raises(PlanError, match=r"\$\.verify: unknown key"):
        validate_plan(verify)
    limit = _streams()
    limit["target"]["stream"]["limit"] = 8
    with pytest.raises(PlanError, match=r"\$\.target\.stream\.limit: unknown key"):
        validate_plan(limit)


def test_the_schedule_carries_the_limit():
    w = _round("llama").workload
    assert expand(validate_plan(_streams(draft=64)), w, build_graph(w)).sm_limits == (("draft", 64),)
    assert expand(validate_plan(_streams()), w, build_graph(w)).sm_limits == ()


def test_limited_rounds_compute_the_reference_round_under_the_interpreter(tmp_path):
    compiled, _ = _round("llama").check(validate_plan(_streams(target=8)), tmp_path)
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

def test_plan_explain_names_the_limited_stream(tmp_path, capsys, monkeypatch):
    import json

    import conjugate.cli
    from conjugate.cli import main

    monkeypatch.setattr(conjugate.cli.out, "width", 200)  # one line a launch
    path = tmp_path / "limited.json"
    path.write_text(json.dumps(_streams(target=112)))
    assert main(["plan", "explain", str(path), "--workload", str(ROOT / "examples" / "tiny.toml")]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "│ draft" in line or "│ target" in line]
    assert rows and all(("│ target (112 SMs)" in row) == ("│ target" in row) for row in rows)
