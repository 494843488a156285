"""Programmatic dependent launch (plan `<model>.pdl`, an override's `pdl`): each launch of a model waits
for the kernel before it inside its programs (griddepcontrol.wait) and lets the next one start at the
start or end of its work. Validation, expansion, the generated source, the round under the interpreter
(which runs without it), the plan explained; the PTX is checked by tests/test_offline_compile.py.
(PDL prefetch and preload were retired to lab/: tests/test_plan.py refuses a v1 plan setting them.)"""
from __future__ import annotations

import json
from dataclasses import replace

import jsonschema
import pytest
import torch

import conjugate  # noqa: F401  (selects the interpreter before triton is imported)
from conjugate.compiler.buffers import PreparedWeights, RoundBuffers
from conjugate.compiler.codegen import kernel_source
from conjugate.compiler.lower import lower_part
from conjugate.compiler.round import cross_stream_waits, launch_pdl
from conjugate.errors import PlanError
from conjugate.graph import build_graph
from conjugate.plan import validate_plan
from conjugate.plan.schema import plan_hash
from conjugate.plan.expand import expand
from conjugate.plan.launch import Pdl, Split
from conjugate.plan.patch import apply_patch
from conjugate.roles import Model
from test_plan import SCHEMA
from test_round import ROOT, _round, _shipped


def _with_pdl(plan: dict, draft: str | None = None, target: str | None = None) -> dict:
    """`plan` with each model's pdl trigger set where given."""
    for model, trigger in (("draft", draft), ("target", target)):
        if trigger is not None:
            plan[model]["pdl"] = trigger
    return plan


def _streams(draft: str | None = None, target: str | None = None, **cross) -> dict:
    """plans/streams.json with small tiles, the models' pdl triggers and the given `cross` keys."""
    return _with_pdl(_shipped("streams", **cross), draft, target)


# -- the plan

def test_plans_without_pdl_keep_their_hash_and_a_pdl_plan_validates_against_the_json_schema():
    plain = validate_plan(_streams())
    unset = _streams()
    for model in ("draft", "target"):
        del unset[model]["pdl"]
    assert validate_plan(unset).hash == validate_plan(_streams("none", "none")).hash == plain.hash
    on = validate_plan(_streams("end"))
    assert on.hash != plain.hash
    assert (on.model(Model.DRAFT).pdl, on.model(Model.TARGET).pdl) == ("end", "none")
    jsonschema.validate(on.to_dict(), SCHEMA)
    assert plan_hash(on.to_dict()) == on.hash
    started = validate_plan(apply_patch(on.to_dict(), [{"op": "replace", "path": "/target/pdl", "value": "start"}]))
    assert started.hash != on.hash and started.model(Model.TARGET).pdl == "start"
    jsonschema.validate(started.to_dict(), SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(_streams("later"), SCHEMA)


@pytest.mark.parametrize("plan,error", [
    (_streams("later"), '$.draft.pdl: "later" is not one of none, start, end'),
    (_streams(target=True), "$.target.pdl: true is not one of none, start, end"),
    (_streams({"trigger": "end"}), '$.draft.pdl: {"trigger": "end"} is not one of none, start, end'),  # v1's shape
    (_streams(pdl="end"), "$.cross.pdl: unknown key"),  # a model's knob, not a shared one
])
def test_bad_pdl_values_are_named(plan, error):
    with pytest.raises(PlanError) as caught:
        validate_plan(plan)
    assert any(e.startswith(error) for e in caught.value.errors), caught.value.errors


# -- expansion

def test_each_launch_takes_its_models_pdl_and_a_shared_launch_only_where_both_ask():
    w = _round("llama").workload
    schedule = expand(validate_plan(_streams("end")), w)
    for launch in schedule.launches:
        draft = launch.parts[0].model == Model.DRAFT
        assert launch.pdl == ("end" if draft else "none")
    for draft, target, expected in (("end", "start", "end"), ("start", "start", "start"), ("end", "none", "none")):
        launches = expand(validate_plan(_with_pdl(_shipped("interleave"), draft, target)), w).launches
        assert {l.pdl for l in launches if l.cross_model} == {expected}


@pytest.mark.parametrize("pdl,error", [
    ("later", '$.cross.overrides[0].pdl: "later" is not one of none, start, end'),
    ({"trigger": "end"}, '$.cross.overrides[0].pdl: {"trigger": "end"} is not one of none, start, end'),  # v1's shape
    (None, "$.cross.overrides[0].pdl: null is not one of none, start, end"),
])
def test_bad_override_pdl_values_are_named(pdl, error):
    with pytest.raises(PlanError) as caught:
        validate_plan(_streams(overrides=[{"match": "d.*.attn", "pdl": pdl}]))
    assert any(e.startswith(error) for e in caught.value.errors), caught.value.errors


PER_LAUNCH = [{"match": "d.*.rope_kv", "pdl": "start"},  # releases the attention early
              {"match": "d.*.down", "pdl": "none"}]


def test_an_override_sets_the_pdl_of_the_launches_it_matches():
    w = _round("llama").workload
    plan = validate_plan(_streams("end", overrides=PER_LAUNCH))
    jsonschema.validate(plan.to_dict(), SCHEMA)
    assert plan.hash != validate_plan(_streams("end")).hash
    expected = {"rope_kv": "start", "down": "none"}
    seen = set()
    for launch in expand(plan, w).launches:
        part = launch.parts[0]
        if part.model == Model.TARGET:
            assert launch.pdl == "none"
        else:
            assert launch.pdl == expected.get(part.kind, "end"), part.kind
            seen.add(part.kind)
    assert set(expected) | {"attn"} <= seen
    # a model without pdl: an override gives the launches it matches their trigger
    started = expand(validate_plan(_streams(overrides=[{"match": "d.*.attn", "pdl": "start"}])), w)
    assert {l.pdl for l in started.launches if l.parts[0].model == Model.DRAFT
            and l.parts[0].kind == "attn"} == {"start"}
    assert {l.pdl for l in started.launches if l.parts[0].kind != "attn"} == {"none"}


def _draft_attn(plan: dict) -> set[str]:
    launches = expand(validate_plan(plan), _round("llama").workload).launches
    return {l.pdl for l in launches if l.parts[0].kind == "attn" and l.parts[0].model == Model.DRAFT}


def test_overrides_on_one_launch_the_later_winning():
    off_then_on = [{"match": "d.*.attn", "pdl": "none"}, {"match": "d.*.attn", "pdl": "end"}]
    assert _draft_attn(_streams("start", overrides=off_then_on)) == {"end"}
    assert _draft_attn(_streams("start", overrides=off_then_on[::-1])) == {"none"}
    # a broader later override wins over a narrower earlier one
    assert _draft_attn(_streams(overrides=[{"match": "d.*.attn", "pdl": "end"},
                                           {"match": "d.*", "pdl": "start"}])) == {"start"}


def test_a_launch_of_both_models_takes_an_override_pdl():
    plan = _shipped("interleave", overrides=[{"match": "t.*", "pdl": "end"}])  # neither model asks for pdl
    launches = expand(validate_plan(plan), _round("llama").workload).launches
    assert any(l.cross_model for l in launches)
    assert {l.pdl for l in launches if l.cross_model} == {"end"}
    assert {l.pdl for l in launches if l.parts[0].model == Model.DRAFT and not l.cross_model} == {"none"}


# -- the generated source

def _parts(rnd, plan: dict, count: int = 1):
    w = rnd.workload
    launch = next(l for l in expand(validate_plan(plan), w).launches if l.parts[0].kind == "o_proj")
    bufs = RoundBuffers.allocate(w, PreparedWeights(rnd.draft), PreparedWeights(rnd.target))
    graph = build_graph(w)
    return [lower_part(launch.parts[0], graph, bufs)] * count


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines()]


def _planned_o_proj(model: Model):
    launches = expand(validate_plan(_streams()), _round("llama").workload).launches
    return next(l.parts[0] for l in launches if l.parts[0].kind == "o_proj" and l.parts[0].model == model)


def test_the_kernel_waits_before_its_tile_and_releases_the_next_launch_where_asked():
    part = _parts(_round("llama"), _streams())
    plain = _lines(kernel_source(None, part))
    assert not any("gdc_" in line for line in plain)  # Pdl.NONE, the default: the kernel as before
    for trigger in (Pdl.START, Pdl.END):
        text = _lines(kernel_source(None, part, pdl=trigger))
        wait = next(i for i, line in enumerate(text) if line.startswith("gdc_wait()"))
        tile = next(i for i, line in enumerate(text) if line.startswith("gemm_residual_tile(pid, "))
        release = next(i for i, line in enumerate(text) if line.startswith("gdc_launch_dependents()"))
        assert wait < tile  # nothing before the wait
        assert (release == wait + 1) if trigger == "start" else (release > tile and release == len(text) - 1)
        assert "from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait" in text


def test_a_two_part_launch_waits_once_before_either_part():
    parts = _parts(_round("llama"), _streams(), count=2)
    target = _planned_o_proj(Model.TARGET)
    form = Split(target, replace(target, model=Model.DRAFT), "strided")
    text = _lines(kernel_source(form, parts, pdl=Pdl.END))
    wait = next(i for i, line in enumerate(text) if line.startswith("gdc_wait()"))
    assert sum(line.startswith("gdc_wait()") for line in text) == 1 and wait < text.index("if first:")


# -- the round

def test_a_launch_is_dependent_only_on_triton_s_compiler_and_never_after_a_cross_stream_wait(monkeypatch):
    w = _round("llama").workload
    pinned = _streams("end", "end", overrides=[{"match": "t.l1.o_proj", "with": "d.s0.l1.down"}])
    schedule = expand(validate_plan(pinned), w)
    waits = cross_stream_waits(schedule.launches, build_graph(w))
    assert waits
    gpu, cpu = torch.device("meta"), torch.device("cpu")
    assert all(launch_pdl(launch, waits, gpu) == Pdl.NONE for launch in schedule.launches)  # interpreting
    monkeypatch.setattr("conjugate.compiler.round.INTERPRETING", False)
    for launch in schedule.launches:
        expected = Pdl.NONE if launch.index in waits else Pdl.END
        assert launch_pdl(launch, waits, gpu) == expected  # meta buffers: compiled offline
        assert launch_pdl(launch, waits, cpu) == Pdl.NONE


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_pdl_rounds_compute_the_reference_round_under_the_interpreter(family, tmp_path):
    plan = validate_plan(_streams("end", "start"))
    compiled, _ = _round(family).check(plan, tmp_path)
    assert not any(l.pdl for l in compiled.launches)  # the interpreter has no programmatic launch


# -- the plan explained

def test_plan_explain_marks_the_dependent_launches(tmp_path, capsys, monkeypatch):
    import conjugate.cli
    from conjugate.cli import main

    monkeypatch.setattr(conjugate.cli.out, "width", 200)  # one line a launch
    path = tmp_path / "pdl.json"
    path.write_text(json.dumps(_streams("end")))
    assert main(["plan", "explain", str(path), "--workload", str(ROOT / "examples" / "tiny.toml")]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "│ draft" in line or "│ target" in line]
    assert rows and all(("[pdl: release at end]" in row) == ("│ draft" in row) for row in rows)


def test_plan_explain_marks_a_streamed_launch_under_pdl(tmp_path, capsys, monkeypatch):
    import conjugate.cli
    from conjugate.cli import main

    monkeypatch.setattr(conjugate.cli.out, "width", 200)
    plan = _streams("none", "start")
    plan["target"]["streamed"] = ["down"]
    path = tmp_path / "pdl.json"
    path.write_text(json.dumps(plan))
    assert main(["plan", "explain", str(path), "--workload", str(ROOT / "examples" / "tiny.toml")]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "│ target" in line]
    streamed = [row for row in rows if "(streamed kernel)" in row]
    assert streamed and all("t:down (streamed kernel)  [pdl: release at start]" in row for row in streamed)
    assert all("[pdl: release at start]" in row for row in rows)
