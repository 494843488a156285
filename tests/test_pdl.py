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
from conjugate.compiler.codegen import NO_PDL, Dispatch, Pdl, kernel_source, persistent_source
from conjugate.compiler.lower import lower_part
from conjugate.compiler.persist import ASSUMED_L2_BYTES, PREFETCH_L2_SHARE
from conjugate.compiler.round import cross_stream_waits, launch_pdl, preload_weights
from conjugate.errors import PlanError, ScheduleError
from conjugate.graph import build_graph
from conjugate.plan import load_plan, validate_plan
from conjugate.plan.schema import plan_hash
from conjugate.plan.expand import expand
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
        assert (launch.pdl, launch.pdl_prefetch) == (("end", True) if draft else ("none", False))
    shared = load_plan(ROOT / "plans" / "interleave.json").to_dict() | {"tiles": SMALL_TILES}
    for draft, target, expected in (("end", "start", "end"), ("start", "start", "start"), ("end", "none", "none")):
        launches = expand(validate_plan(shared | {"pdl": _pdl(draft, target)}), w).launches
        assert {l.pdl for l in launches if l.cross_model} == {expected}
    loops = expand(validate_plan(_streams(pdl=_pdl(target="start"), persist={"target": {"span": "launch"}})), w)
    looped = [l for l in loops.launches if l.persistent]
    assert looped and all(l.pdl == "start" for l in looped)  # a tile loop waits for no one: it may


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
    expected = {"rope_kv": ("start", False), "attn": ("end", True), "down": ("none", False)}
    seen = set()
    for launch in expand(plan, w).launches:
        part = launch.parts[0]
        if part.model == Model.TARGET:
            assert (launch.pdl, launch.pdl_prefetch) == ("none", False)
        else:
            assert (launch.pdl, launch.pdl_prefetch) == expected.get(part.kind, ("end", False)), part.kind
            seen.add(part.kind)
    assert set(expected) <= seen
    # a model prefetching everywhere: an override's trigger 'none' takes its launches' prefetch off too
    quiet = expand(validate_plan(_streams(pdl=_pdl("end", prefetch=True),
                                          overrides=[{"match": "d.*.attn", "pdl": {"trigger": "none"}}])), w)
    assert {(l.pdl, l.pdl_prefetch) for l in quiet.launches if l.parts[0].kind == "attn"
            and l.parts[0].model == Model.DRAFT} == {("none", False)}


def _draft_attn(plan: dict) -> set[tuple[str, bool]]:
    launches = expand(validate_plan(plan), _round("llama").workload).launches
    return {(l.pdl, l.pdl_prefetch) for l in launches if l.parts[0].kind == "attn" and l.parts[0].model == Model.DRAFT}


def test_overrides_on_one_launch_fold_key_by_key_the_later_winning_before_any_check():
    # the prefetch asked first is valid once a later override gives the launches a trigger
    assert _draft_attn(_streams(overrides=[{"match": "d.*.attn", "pdl": {"prefetch": True}},
                                           {"match": "d.*", "pdl": {"trigger": "start"}}])) == {("start", True)}
    # a trigger 'none' undone by a later override: the model's prefetch stands
    assert _draft_attn(_streams(pdl=_pdl("end", prefetch=True),
                                overrides=[{"match": "d.*.attn", "pdl": {"trigger": "none"}},
                                           {"match": "d.*.attn", "pdl": {"trigger": "end"}}])) == {("end", True)}


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


def test_the_kernel_waits_before_its_tile_and_releases_the_next_launch_where_asked():
    part = _parts(_round("llama"), _streams())
    plain = _lines(kernel_source(part, None))
    assert not any("gdc_" in line for line in plain)  # NO_PDL, the default: the kernel as before
    for trigger in ("start", "end"):
        text = _lines(kernel_source(part, None, pdl=Pdl(trigger, prefetch=True)))
        wait = next(i for i, line in enumerate(text) if line.startswith("gdc_wait()"))
        tile = next(i for i, line in enumerate(text) if line.startswith("gemm_tile(pid, "))
        prefetch = next(i for i, line in enumerate(text) if line.startswith("gemm_prefetch(pid, "))
        release = next(i for i, line in enumerate(text) if line.startswith("gdc_launch_dependents()"))
        assert prefetch < wait < tile  # weights first (nothing writes them), then nothing before the wait
        assert (release == wait + 1) if trigger == "start" else (release > tile and release == len(text) - 1)
        assert "from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait" in text
    bare = _lines(kernel_source(part, None, pdl=Pdl("end")))
    assert not any("prefetch" in line for line in bare) and "gdc_wait()" in " ".join(bare)
    with pytest.raises(ValueError, match="pdl trigger"):
        Pdl("soon")


def test_a_two_part_launch_prefetches_each_parts_own_tile_and_waits_once():
    parts = _parts(_round("llama"), _streams(), count=2)
    text = _lines(kernel_source(parts, Dispatch.of("strided", (1, 1), (4, 4)), pdl=Pdl("end", prefetch=True)))
    assert sum(line.startswith("gdc_wait()") for line in text) == 1
    first, other = text.index("if first:"), text.index("if not first:")
    assert text[first + 1].startswith("gemm_prefetch(local0, ") and text[other + 1].startswith("gemm_prefetch(local1, ")
    assert other < next(i for i, line in enumerate(text) if line.startswith("gdc_wait()"))
    packed = _lines(kernel_source(parts, Dispatch.of("strided", (1, 1), (4, 4)), packed=True,
                                  pdl=Pdl("end", prefetch=True)))
    assert not any("prefetch" in line for line in packed)  # one call for both: no per-part prefetch


def test_gemm_tiles_that_preload_their_weights_wait_themselves_and_the_dispatcher_does_not():
    """pdl.preload: the tile loads its first weight step, waits, and at `start` releases the next
    launch after its wait (released before, every later launch of a chain would start at once)."""
    started, ended = (_parts(_round("llama"), _streams())[0] for _ in range(2))
    assert preload_weights([started], 4, release=True) and preload_weights([ended], 4, release=False)
    assert started.constexprs["PRELOAD_K"] >= 16 and started.constexprs["WAIT"] == 2
    assert ended.constexprs["WAIT"] == 1
    text = _lines(kernel_source([started], None, pdl=Pdl("start", preload=True)))
    assert not any(line.startswith(("gdc_wait()", "gdc_launch_dependents()")) for line in text)
    text = _lines(kernel_source([ended], None, pdl=Pdl("end", preload=True)))
    assert not any(line.startswith("gdc_wait()") for line in text) and text[-1].startswith("gdc_launch_dependents()")
    with pytest.raises(ValueError, match="needs a programmatic dependent launch"):
        kernel_source([started], None)
    with pytest.raises(ValueError, match="waits for the kernel before once"):
        persistent_source([started], pdl=Pdl("start", preload=True))
    plain = _parts(_round("llama"), _streams())[0]
    with pytest.raises(ValueError, match="wait for the kernel before in their tiles, or neither"):
        kernel_source([started, plain], Dispatch.of("strided", (1, 1), (4, 4)), pdl=Pdl("start", preload=True))


def test_a_launch_preloads_in_every_part_or_in_none():
    from conjugate.compiler.norm import rmsnorm_call

    gemm = _parts(_round("llama"), _streams())[0]
    x = torch.randn(4, 64)
    norm = rmsnorm_call(x, torch.ones(64), torch.empty_like(x), rows=4, eps=1e-5)
    before = dict(gemm.constexprs)
    assert not preload_weights([gemm, norm], 4, release=True)
    assert gemm.constexprs == before and gemm.constexprs["WAIT"] == 0  # undone: the dispatcher waits


def test_preload_lapses_without_a_trigger_and_reaches_the_compiled_launch(monkeypatch):
    w = _round("llama").workload
    on = {"trigger": "end", "prefetch": False, "preload": True}
    launches = expand(validate_plan(_streams(pdl={"draft": on})), w).launches
    assert {(l.pdl, l.pdl_preload) for l in launches} == {("end", True), ("none", False)}
    monkeypatch.setattr("conjugate.compiler.round.INTERPRETING", False)
    draft = next(l for l in launches if l.pdl_preload)
    assert launch_pdl(draft, {}, torch.device("meta")) == Pdl("end", preload=True)
    # an override's preload where its launches end with no trigger: refused, naming it
    plan = _streams(overrides=[{"match": "t.*.o_proj", "pdl": {"preload": True}}])
    with pytest.raises(ScheduleError, match=re.escape("$.overrides[0].pdl.preload: loads weights ahead of the wait")):
        expand(validate_plan(plan), w)
    plan = _streams(pdl={"draft": on}, overrides=[{"match": "d.*.attn", "pdl": {"trigger": "none"}}])
    attn = [l for l in expand(validate_plan(plan), w).launches if l.parts[0].kind == "attn" and l.parts[0].model
            == Model.DRAFT]
    assert attn and all((l.pdl, l.pdl_preload) == ("none", False) for l in attn)


def test_a_tile_loop_waits_before_its_loop_and_a_grid_with_barriers_refuses_pdl():
    part = _parts(_round("llama"), _streams())
    text = _lines(persistent_source(part, pdl=Pdl("end", prefetch=True)))
    wait = text.index("gdc_wait()  # the kernel before this one has ended; its writes are visible")
    loops = [i for i, line in enumerate(text) if line.startswith("while tile < ")]
    assert len(loops) == 2 and loops[0] < wait < loops[1]  # the prefetch loop, the wait, the tile loop
    assert text[-1] == "gdc_launch_dependents()  # this program's tiles are done"
    with pytest.raises(ValueError, match="barriers cannot be a programmatic dependent launch"):
        persistent_source(part * 2, pdl=Pdl("start"))


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
    assert all(launch_pdl(launch, waits, gpu) == NO_PDL for launch in schedule.launches)  # interpreting
    monkeypatch.setattr("conjugate.compiler.round.INTERPRETING", False)
    for launch in schedule.launches:
        expected = NO_PDL if launch.index in waits else Pdl("end")
        assert launch_pdl(launch, waits, gpu) == expected  # meta buffers: compiled offline
        assert launch_pdl(launch, waits, cpu) == NO_PDL
    prefetching = expand(validate_plan(plan | {"pdl": _pdl("end", prefetch=True)}), w).launches[1]
    assert launch_pdl(prefetching, {}, gpu) == Pdl("end", prefetch=True)
    huge = replace(prefetching, bytes=int(PREFETCH_L2_SHARE * ASSUMED_L2_BYTES) + 1)
    assert launch_pdl(huge, {}, gpu) == Pdl("end")  # more than half the L2: its prefetch would evict itself


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
    assert rows and all(("[pdl: release at end, prefetch]" in row) == ("│ draft" in row) for row in rows)


def test_plan_explain_marks_launches_that_preload(tmp_path, capsys, monkeypatch):
    import conjugate.cli
    from conjugate.cli import main

    monkeypatch.setattr(conjugate.cli.out, "width", 600)  # a persistent layer's parts on one line too
    plan = _streams(pdl={"target": {"trigger": "start", "preload": True}}, persist={"draft": {"span": "layer",
                                                                                              "preload": True}})
    path = tmp_path / "preload.json"
    path.write_text(json.dumps(plan))
    assert main(["plan", "explain", str(path), "--workload", str(ROOT / "examples" / "tiny.toml")]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "│ draft" in line or "│ target" in line]
    assert any("parts in sequence, preload]" in row for row in rows if "│ draft" in row)
    assert rows and all("[pdl: release at start, preload]" in row for row in rows if "│ target" in row)
