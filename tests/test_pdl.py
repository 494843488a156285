"""Programmatic dependent launch (plan `pdl`): each launch of a model waits for the kernel before it
inside its programs (griddepcontrol.wait) and lets the next one start at the start or end of its
work, its tiles' weights optionally asked of L2 before the wait. Validation, expansion, the generated
source, the round under the interpreter (which runs without it), the heuristic's edits; the PTX is
checked by tests/test_offline_compile.py."""
from __future__ import annotations

import json
import re
from dataclasses import replace

import jsonschema
import pytest
import torch

import conjugate  # noqa: F401  (selects the interpreter before triton is imported)
from conjugate.compiler.buffers import PreparedWeights, RoundBuffers
from conjugate.compiler.codegen import kernel_source
from conjugate.compiler.lower import lower_part
from conjugate.compiler.round import cross_stream_waits, launch_pdl
from conjugate.errors import PlanError, ScheduleError
from conjugate.graph import build_graph
from conjugate.plan import load_plan, validate_plan
from conjugate.plan.schema import plan_hash
from conjugate.plan.expand import expand
from conjugate.plan.launch import Pdl, Split
from conjugate.plan.patch import apply_patch
from conjugate.roles import Model
from test_plan import SCHEMA
from test_round import ROOT, SMALL_TILES, _round


def _streams(**fields) -> dict:
    return load_plan(ROOT / "plans" / "streams.json").to_dict() | {"tiles": SMALL_TILES} | fields


def _pdl(draft: str = "none", target: str = "none", prefetch: bool = False) -> dict:
    return {"draft": {"trigger": draft, "prefetch": prefetch and draft != "none"},
            "target": {"trigger": target, "prefetch": prefetch and target != "none"}}


# -- the plan

def test_plans_without_pdl_keep_their_hash_and_a_pdl_plan_validates_against_the_json_schema():
    plain = validate_plan(_streams())
    assert validate_plan(_streams(pdl=_pdl())).hash == plain.hash
    on = validate_plan(_streams(pdl=_pdl("end", prefetch=True)))
    assert on.hash != plain.hash and on["pdl"]["draft"] == {"trigger": "end", "prefetch": True, "preload": False}
    assert on["pdl"]["target"] == {"trigger": "none", "prefetch": False, "preload": False}
    jsonschema.validate(on.to_dict(), SCHEMA)
    # `preload` came later: hashed only when set, so a pdl plan stored before keeps its hash
    before = on.to_dict()
    for per_model in before["pdl"].values():
        del per_model["preload"]
    assert plan_hash(before) == on.hash
    loaded = validate_plan(apply_patch(on.to_dict(), [{"op": "replace", "path": "/pdl/draft/preload", "value": True}]))
    assert loaded.hash != on.hash and loaded["pdl"]["draft"]["preload"]
    jsonschema.validate(loaded.to_dict(), SCHEMA)


@pytest.mark.parametrize("fields,error", [
    ({"pdl": {"draft": {"trigger": "later"}}}, '$.pdl.draft.trigger: "later" is not one of none, start, end'),
    ({"pdl": {"draft": {"trigger": "end", "prefetch": 1}}}, "$.pdl.draft.prefetch: should be a boolean"),
    ({"pdl": {"draft": {"prefetch": True}}}, "$.pdl.draft.prefetch: prefetches ahead of the wait"),
    ({"pdl": {"draft": {"preload": True}}}, "$.pdl.draft.preload: loads weights ahead of the wait"),
    ({"pdl": {"target": {"trigger": "end", "preload": 0}}}, "$.pdl.target.preload: should be a boolean"),
    ({"pdl": {"draft": "end"}}, "$.pdl.draft: should be an object"),
    ({"pdl": {"both": {}}}, "$.pdl.both: unknown key"),
    ({"pdl": {"draft": {"trigger": "start"}}, "persist": {"draft": {"span": "layer"}}},
     "$.pdl.draft.trigger: 'start' lets a persistent launch's programs start"),
])
def test_bad_pdl_values_are_named(fields, error):
    with pytest.raises(PlanError) as caught:
        validate_plan(_streams(**fields))
    assert any(e.startswith(error) for e in caught.value.errors), caught.value.errors


# -- expansion

def test_each_launch_takes_its_models_pdl_and_a_shared_launch_only_where_both_ask():
    w = _round("llama").workload
    schedule = expand(validate_plan(_streams(pdl=_pdl("end", prefetch=True))), w)
    for launch in schedule.launches:
        draft = launch.parts[0].model == Model.DRAFT
        assert launch.pdl == ("end" if draft else "none")
    shared = load_plan(ROOT / "plans" / "interleave.json").to_dict() | {"tiles": SMALL_TILES}
    for draft, target, expected in (("end", "start", "end"), ("start", "start", "start"), ("end", "none", "none")):
        launches = expand(validate_plan(shared | {"pdl": _pdl(draft, target)}), w).launches
        assert {l.pdl for l in launches if l.cross_model} == {expected}


@pytest.mark.parametrize("pdl,error", [
    ({"trigger": "later"}, '$.overrides[0].pdl.trigger: "later" is not one of none, start, end'),
    ({"prefetch": 1}, "$.overrides[0].pdl.prefetch: should be a boolean"),
    ({"trigger": "none", "prefetch": True}, "$.overrides[0].pdl.prefetch: prefetches ahead of the wait"),
    ({}, "$.overrides[0].pdl: sets none of 'trigger', 'prefetch', 'preload'"),
    ({"trigger": "none", "preload": True}, "$.overrides[0].pdl.preload: loads weights ahead of the wait"),
    ({"preload": "yes"}, "$.overrides[0].pdl.preload: should be a boolean"),
    ("end", "$.overrides[0].pdl: should be an object"),
    ({"when": "end"}, "$.overrides[0].pdl.when: unknown key"),
])
def test_bad_override_pdl_values_are_named(pdl, error):
    with pytest.raises(PlanError) as caught:
        validate_plan(_streams(overrides=[{"match": "d.*.attn", "pdl": pdl}]))
    assert any(e.startswith(error) for e in caught.value.errors), caught.value.errors


PER_LAUNCH = [{"match": "d.*.rope_kv", "pdl": {"trigger": "start"}},  # releases the attention early
              {"match": "d.*.attn", "pdl": {"prefetch": True}},  # which asks L2 for its keys and values first
              {"match": "d.*.down", "pdl": {"trigger": "none"}}]


def test_an_override_sets_the_pdl_of_the_launches_it_matches_key_by_key():
    w = _round("llama").workload
    plan = validate_plan(_streams(pdl=_pdl("end"), overrides=PER_LAUNCH))
    jsonschema.validate(plan.to_dict(), SCHEMA)
    assert plan.hash != validate_plan(_streams(pdl=_pdl("end"))).hash
    expected = {"rope_kv": "start", "attn": "end", "down": "none"}
    seen = set()
    for launch in expand(plan, w).launches:
        part = launch.parts[0]
        if part.model == Model.TARGET:
            assert launch.pdl == "none"
        else:
            assert launch.pdl == expected.get(part.kind, "end"), part.kind
            seen.add(part.kind)
    assert set(expected) <= seen
    # a model prefetching everywhere: an override's trigger 'none' takes its launches' prefetch off too
    quiet = expand(validate_plan(_streams(pdl=_pdl("end", prefetch=True),
                                          overrides=[{"match": "d.*.attn", "pdl": {"trigger": "none"}}])), w)
    assert {l.pdl for l in quiet.launches if l.parts[0].kind == "attn"
            and l.parts[0].model == Model.DRAFT} == {"none"}


def _draft_attn(plan: dict) -> set[str]:
    launches = expand(validate_plan(plan), _round("llama").workload).launches
    return {l.pdl for l in launches if l.parts[0].kind == "attn" and l.parts[0].model == Model.DRAFT}


def test_overrides_on_one_launch_fold_key_by_key_the_later_winning_before_any_check():
    # the prefetch asked first is valid once a later override gives the launches a trigger
    assert _draft_attn(_streams(overrides=[{"match": "d.*.attn", "pdl": {"prefetch": True}},
                                           {"match": "d.*", "pdl": {"trigger": "start"}}])) == {"start"}
    # a trigger 'none' undone by a later override: the model's prefetch stands
    assert _draft_attn(_streams(pdl=_pdl("end", prefetch=True),
                                overrides=[{"match": "d.*.attn", "pdl": {"trigger": "none"}},
                                           {"match": "d.*.attn", "pdl": {"trigger": "end"}}])) == {"end"}


def test_a_launch_of_both_models_takes_an_override_pdl_beside_a_persistent_draft():
    shared = load_plan(ROOT / "plans" / "interleave.json").to_dict() | {"tiles": SMALL_TILES}
    plan = shared | {"persist": {"draft": {"span": "layer"}},
                     "overrides": [{"match": "t.*", "pdl": {"trigger": "end"}}]}
    launches = expand(validate_plan(plan), _round("llama").workload).launches
    assert {l.pdl for l in launches if l.cross_model} == {"end"}  # never joined: no barrier to wait at


@pytest.mark.parametrize("fields,error", [
    ({"overrides": [{"match": "d.*.attn", "pdl": {"prefetch": True}}]},
     "$.overrides[0].pdl.prefetch: prefetches ahead of the wait of a programmatic dependent launch"),
    ({"pdl": _pdl("end"), "overrides": [{"match": "d.*", "pdl": {"prefetch": True}},
                                        {"match": "d.*.attn", "pdl": {"trigger": "none"}}]},
     "$.overrides[0].pdl.prefetch: prefetches ahead of the wait"),
    ({"persist": {"draft": {"span": "layer"}}, "overrides": [{"match": "d.*.attn", "pdl": {"trigger": "end"}}]},
     "$.overrides[0].pdl.trigger: 'end' on draft launches, which $.persist.draft.span 'layer' joins"),
])
def test_an_override_pdl_the_launches_cannot_take_is_refused_at_expansion(fields, error):
    with pytest.raises(ScheduleError, match=re.escape(error)):
        expand(validate_plan(_streams(**fields)), _round("llama").workload)


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
    plan = load_plan(ROOT / "plans" / "streams.json").to_dict() | {"tiles": SMALL_TILES}
    pinned = plan | {"pdl": _pdl("end", "end"),
                     "overrides": [{"match": "t.l1.o_proj", "with": "d.s0.l1.down"}]}
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
    plan = validate_plan(_streams(pdl=_pdl("end", "start", prefetch=True)))
    compiled, _ = _round(family).check(plan, tmp_path)
    assert not any(l.pdl for l in compiled.launches)  # the interpreter has no programmatic launch


# -- the heuristic

def test_plan_explain_marks_the_dependent_launches(tmp_path, capsys, monkeypatch):
    import conjugate.cli
    from conjugate.cli import main

    monkeypatch.setattr(conjugate.cli.out, "width", 200)  # one line a launch
    path = tmp_path / "pdl.json"
    path.write_text(json.dumps(_streams(pdl=_pdl("end", prefetch=True))))
    assert main(["plan", "explain", str(path), "--workload", str(ROOT / "examples" / "tiny.toml")]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "│ draft" in line or "│ target" in line]
    assert rows and all(("[pdl: release at end]" in row) == ("│ draft" in row) for row in rows)
