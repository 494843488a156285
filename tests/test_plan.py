"""Plan IR: validation with JSON paths, canonical form and hash, JSON Patch, expansion to launches."""
from __future__ import annotations

import copy
import hashlib
import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conjugate.errors import PatchError, PlanError, ScheduleError
from conjugate.graph import KINDS, build_graph
from conjugate.plan import (Launch, Part, apply_patch, check_dependencies, expand, load_plan, patch_plan,
                            validate_plan)
from conjugate.plan.blocks import Stream
from conjugate.plan.schema import ALIGNMENTS, FUSIONS, PATTERNS, plan_hash
from conjugate.plan.upgrade import upgrade_v1
from conjugate.roles import Model
from conjugate.workload import load_workload

ROOT = Path(__file__).resolve().parents[1]
PLANS = sorted(p for p in (ROOT / "plans").glob("*.json") if not p.name.endswith(".schema.json"))
BEST = sorted((ROOT / "benchmarks" / "results" / "plans").glob("*.json"))
V1 = sorted((ROOT / "tests" / "data" / "plans_v1").glob("*.json"))
SCHEMA = json.loads((ROOT / "plans" / "plan.schema.json").read_text())
TINY = load_workload(ROOT / "examples" / "tiny.toml")
BASE = {"schema": "conjugate.plan/2"}
TWO = {"cross": {"streams": "two"}}


def _interleave() -> dict:
    return json.loads((ROOT / "plans" / "interleave.json").read_text())


def _with(raw: dict, **cross) -> dict:
    """`raw` with these cross-block fields set."""
    return raw | {"cross": raw.get("cross", {}) | cross}


def _stream(model: str, **stream) -> dict:
    return {model: {"stream": stream}}


# ---------------------------------------------------------------------------------------------
# validation


def test_shipped_and_best_plans_are_v2_and_valid_under_both_validators():
    assert {p.stem for p in PLANS} == {"sequential", "streams", "interleave", "step"} and len(BEST) == 7
    for path in PLANS + BEST:
        raw = json.loads(path.read_text())
        assert raw["schema"] == "conjugate.plan/2", path.name
        jsonschema.validate(raw, SCHEMA)
        plan = load_plan(path)
        jsonschema.validate(plan.to_dict(), SCHEMA)  # the canonical form too
    assert [load_plan(p).name for p in PLANS] == [p.stem for p in PLANS]


def test_the_committed_json_schema_is_the_generated_one():
    from conjugate.plan.json_schema import main, plan_json_schema

    assert plan_json_schema() == SCHEMA
    assert main(["--check"]) == 0
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


BAD_PLANS = [
    ({"schema": "conjugate.plan/3"}, "$.schema"),
    ({"name": "x"}, "$.schema: should be \"conjugate.plan/2\", got null"),
    (dict(BASE, **_stream("draft", priority="high")),
     "$.draft.stream.priority: \"high\" favours this model's stream, so it needs $.cross.streams \"two\""),
    (dict(BASE, **TWO, **_stream("draft", priority="high"), **_stream("target", priority="high")),
     "$.target.stream.priority: \"high\" for both models"),
    (dict(BASE, **TWO, **_stream("draft", priority="first")), "$.draft.stream.priority"),
    (dict(BASE, **_stream("target", sms=64)), "$.target.stream.sms: 64 limits this model's stream"),
    (dict(BASE, **TWO, **_stream("target", sms=60)), "$.target.stream.sms: should be a multiple of 8"),
    (dict(BASE, **TWO, **_stream("target", sms=2048)), "$.target.stream.sms: 2048 is out of range"),
    (dict(BASE, **TWO, **_stream("target", sms=64), **_stream("draft", sms=64)),
     "$.target.stream.sms: 64 limits both models"),
    (dict(BASE, bogus=1), "$.bogus: unknown key"),
    (dict(BASE, draft={"persist": {"span": "layer"}}), "$.draft.persist: unknown key"),
    (dict(BASE, draft={"pdl": {"trigger": "end"}}), "$.draft.pdl: {\"trigger\": \"end\"} is not one of none"),
    (_with(BASE, alignment="diagonal"), "$.cross.alignment"),
    (_with(BASE, alignment=3), "$.cross.alignment"),
    (dict(BASE, target={"tiles": {"qkv": {"BLOCK_N": 48}}}), "$.target.tiles.qkv.BLOCK_N: 48 is not a power of two"),
    (dict(BASE, target={"tiles": {"qkv": {"BLOCK_N": 1024}}}), "$.target.tiles.qkv.BLOCK_N: 1024 is out of range"),
    (dict(BASE, target={"tiles": {"qkv": {"BLOCK_N": "64"}}}), "$.target.tiles.qkv.BLOCK_N: should be an integer"),
    (dict(BASE, target={"tiles": {"qkv": {"BLOCK_N": True}}}), "$.target.tiles.qkv.BLOCK_N: should be an integer"),
    (dict(BASE, target={"tiles": {"qkv": {"SPLIT_KV": 2}}}), "$.target.tiles.qkv.SPLIT_KV: unknown key"),
    (dict(BASE, draft={"tiles": {"attn": {"BLOCK": 64}}}), "$.draft.tiles.attn.BLOCK: unknown key"),
    (dict(BASE, drafts={}), "$.drafts: unknown key"),
    (dict(BASE, target={"tiles": {"mlp": {}}}), "$.target.tiles.mlp: unknown key"),
    (dict(BASE, target="atomic"), "$.target: should be an object"),
    (_with(BASE, launch={"num_warps": 3}), "$.cross.launch.num_warps: 3 is not a power of two"),
    (_with(BASE, launch={"num_stages": 0}), "$.cross.launch.num_stages: 0 is out of range"),
    (_with(BASE, interleave={"pattern": "ratio", "ratio": [1]}), "$.cross.interleave.ratio"),
    (_with(BASE, interleave={"pattern": "ratio", "ratio": [1, 0]}), "$.cross.interleave.ratio[1]"),
    (_with(BASE, interleave={"pattern": "zigzag"}), "$.cross.interleave.pattern"),
    (_with(BASE, pairs={"qkv": "attn"}), "$.cross.pairs.qkv: should be a list"),
    (_with(BASE, pairs={"qkv": ["mlp"]}), "$.cross.pairs.qkv[0]"),
    (_with(BASE, pairs={"qkv": [{"a": 1}]}), "$.cross.pairs.qkv[0]: should be an op kind string, got an object"),
    (_with(BASE, pairs={"attn": ["qkv", ["attn"]]}), "$.cross.pairs.attn[1]: should be an op kind string, got a list"),
    (dict(BASE, draft={"fusions": ["rope_kv+attn"]}), "$.draft.fusions[0]"),
    (dict(BASE, target={"fusions": [["lm_head+argmax"]]}), "$.target.fusions[0]: should be a fusion string"),
    (dict(BASE, target={"reduce": "fast"}), "$.target.reduce"),
    (_with(BASE, streams="two", alignment="proportional"), "$.cross.streams"),
    (_with(BASE, overrides=[{"pair": False}]), "$.cross.overrides[0].match: required"),
    (_with(BASE, overrides=[{"match": "t.l0.qkv", "with": "t.l1.qkv"}]), "$.cross.overrides[0].with"),
    (_with(BASE, overrides=[{"match": "t.l0.qkv", "pair": "no"}]), "$.cross.overrides[0].pair: should be a boolean"),
    (_with(BASE, overrides=[{"match": "t.*", "colour": 1}]), "$.cross.overrides[0].colour: unknown key"),
    (_with(BASE, overrides=[{"match": "t.*", "pdl": {"trigger": "end"}}]), "$.cross.overrides[0].pdl"),
    (_with(BASE, overrides=[{"match": "t.*", "pdl": "late"}]), "$.cross.overrides[0].pdl"),
    (_with(BASE, overrides=[{"match": "t" * 201}]), "$.cross.overrides[0].match: is 201 characters long"),
    (_with(BASE, overrides={"match": "t.*"}), "$.cross.overrides: should be a list"),
    (dict(BASE, name="two\nlines"), "$.name"),
    ([1, 2], "$: should be an object"),
]


@pytest.mark.parametrize("raw,expected", BAD_PLANS, ids=[e for _, e in BAD_PLANS])
def test_bad_plan_names_path_and_reason(raw, expected):
    with pytest.raises(PlanError) as info:
        validate_plan(raw, source="p.json")
    assert str(info.value).startswith("p.json: ")
    assert any(e.startswith(expected) for e in info.value.errors), info.value.errors
    with pytest.raises(jsonschema.ValidationError):  # the generated JSON Schema agrees
        jsonschema.validate(raw, SCHEMA)


def test_good_edge_plans_pass_both_validators():
    good = [dict(BASE, **TWO, **_stream("draft", priority="high"), **_stream("target", sms=96)),
            dict(BASE, **TWO, **_stream("target", priority="high", sms=1024)),
            dict(BASE, draft={"pdl": "end", "reduce": "atomic"}, target={"pdl": "start"}),
            _with(BASE, overrides=[{"match": "t.l0.*", "pdl": "none", "launch": {"num_warps": 8}}])]
    for raw in good:
        jsonschema.validate(raw, SCHEMA)
        assert validate_plan(raw).to_dict() == validate_plan(validate_plan(raw).to_dict()).to_dict()


def test_every_error_is_reported():
    raw = _with(BASE, alignment="x", streams="y", launch={"num_warps": 5})
    errors = pytest.raises(PlanError, validate_plan, raw).value.errors
    assert [e.split(":")[0] for e in errors] == ["$.cross.streams", "$.cross.launch.num_warps", "$.cross.alignment"]


def test_objects_and_lists_in_name_lists_are_plan_errors():
    """Not TypeError (unhashable): each bad item named by its path, beside the other errors."""
    interleave = load_plan(ROOT / "plans" / "interleave.json")
    with pytest.raises(PlanError) as info:
        patch_plan(interleave, [{"op": "replace", "path": "/cross/pairs/qkv", "value": [{"a": 1}]}])
    assert info.value.errors == ["$.cross.pairs.qkv[0]: should be an op kind string, got an object"]
    patch = [{"op": "add", "path": "/draft/fusions", "value": [["attn_norm+qkv"], 3, "attn_norm+qkv", "nope"]},
             {"op": "replace", "path": "/cross/pairs/qkv", "value": ["attn", {"kind": "attn"}, "attn"]}]
    errors = pytest.raises(PlanError, patch_plan, interleave, patch).value.errors
    assert [e.split(":")[0] for e in errors] == ["$.draft.fusions[0]", "$.draft.fusions[1]", "$.draft.fusions[3]",
                                                "$.cross.pairs.qkv[1]"]
    assert "should be a fusion string, got the number 3" in errors[1]
    fine = patch_plan(interleave, [{"op": "replace", "path": "/cross/pairs/qkv", "value": ["attn", "attn"]}])
    assert fine.cross.pairs["qkv"] == ("attn",)


def test_load_plan_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "conjugate.plan/2",\n "name": }')
    with pytest.raises(PlanError, match=r"bad.json: malformed JSON at line 2"):
        load_plan(bad)
    twice = tmp_path / "twice.json"
    twice.write_text('{"schema": "conjugate.plan/2", "draft": {"pdl": "end", "pdl": "none"}}')
    with pytest.raises(PlanError, match="twice.json: .*pdl"):
        load_plan(twice)
    nan = tmp_path / "nan.json"
    nan.write_text('{"schema": "conjugate.plan/2", "cross": {"launch": {"num_stages": NaN}}}')
    with pytest.raises(PlanError, match="nan.json: "):
        load_plan(nan)
    with pytest.raises(PlanError, match="no such plan file"):
        load_plan(tmp_path / "missing.json")


# ---------------------------------------------------------------------------------------------
# typed blocks, canonical form and hash


def test_typed_blocks_read_the_plan():
    best = load_plan(ROOT / "benchmarks" / "results" / "plans" / "llama-1b-8b-b8.json")
    draft, target = best.model(Model.DRAFT), best.model("target")
    assert (draft.pdl, draft.reduce, draft.stream.priority, target.stream.priority) == ("end", "atomic", "high", "normal")
    assert draft.tiles["down"]["SPLIT_K"] == 8 and draft.fusions == ("lm_head+argmax",)
    assert (best.cross.streams, best.cross.alignment, best.cross.overrides) == ("two", "sequential", ())
    with pytest.raises(TypeError):  # read-only
        draft.tiles["down"]["SPLIT_K"] = 1
    inter = load_plan(ROOT / "plans" / "interleave.json")
    assert inter.cross.interleave.pattern == "strided" and "*" in inter.cross.pairs["qkv"]


def test_canonical_form_fills_defaults_and_is_idempotent():
    plan = validate_plan(BASE)
    assert plan.cross.alignment == "sequential" and dict(plan.cross.launch) == {"num_warps": 4, "num_stages": 2}
    assert plan.to_dict()["draft"] == {"tiles": {}, "fusions": [], "reduce": "ordered", "pdl": "none",
                                       "stream": {"priority": "normal", "sms": 0}, "form": "launches",
                                       "streamed": []}
    assert validate_plan(plan.to_dict()) == plan
    for path in PLANS + BEST:
        shipped = load_plan(path)
        assert validate_plan(json.loads(shipped.to_json())).hash == shipped.hash


def test_hash_ignores_key_order_set_order_and_cosmetics():
    raw = _interleave()
    shuffled = json.loads(json.dumps(raw, sort_keys=True))
    shuffled["cross"]["pairs"]["attn"] = list(reversed(shuffled["cross"]["pairs"]["attn"]))
    shuffled["name"], shuffled["description"] = "renamed", "other words"
    assert validate_plan(shuffled).hash == validate_plan(raw).hash
    ratio = _with(raw, interleave={"pattern": "blocked", "ratio": [3, 1]})  # ratio means nothing unless pattern is ratio
    assert validate_plan(ratio).hash == validate_plan(_with(raw, interleave={"pattern": "blocked"})).hash
    assert validate_plan(_with(raw, alignment="greedy")).hash != validate_plan(raw).hash
    assert len({load_plan(p).hash for p in PLANS + BEST}) == len(PLANS + BEST)


def test_hash_is_the_canonical_json_with_defaults_filled():
    """v2 hashes start fresh: stating a default changes nothing, and the hash is stable across releases."""
    plan = load_plan(ROOT / "plans" / "streams.json")
    stated = _with(json.loads((ROOT / "plans" / "streams.json").read_text()), capture="graph", overrides=[])
    stated["draft"] |= {"reduce": "ordered", "stream": {"priority": "normal", "sms": 0}}
    assert validate_plan(stated).hash == plan.hash
    body = {k: v for k, v in plan.to_dict().items() if k not in ("name", "description")}
    for model in ("draft", "target"):  # added after plans were stored: at their defaults, not hashed
        assert body[model].pop("form") == "launches" and body[model].pop("streamed") == []
    assert plan.hash == hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert plan_hash(plan.to_dict()) == plan.hash
    step = json.loads((ROOT / "plans" / "streams.json").read_text())
    step["draft"]["form"] = "step"
    step["cross"]["alignment"] = "sequential"
    aligned = json.loads((ROOT / "plans" / "streams.json").read_text())
    aligned["cross"]["alignment"] = "sequential"
    assert validate_plan(step).hash != validate_plan(aligned).hash  # a form that is set is hashed


# ---------------------------------------------------------------------------------------------
# conversion from conjugate.plan/1


def test_every_v1_fixture_converts_to_its_committed_v2_plan():
    assert {p.name for p in V1} == {"streams.json", "interleave.json", "best-llama-1b-8b-b8.json"}
    committed = {"streams.json": ROOT / "plans" / "streams.json", "interleave.json": ROOT / "plans" / "interleave.json",
                 "best-llama-1b-8b-b8.json": ROOT / "benchmarks" / "results" / "plans" / "llama-1b-8b-b8.json"}
    for path in V1:
        v1 = json.loads(path.read_text())
        assert v1["schema"] == "conjugate.plan/1"
        converted = load_plan(path)  # converted on read
        assert converted.to_dict() == load_plan(committed[path.name]).to_dict()
        assert converted.data["schema"] == "conjugate.plan/2"
        jsonschema.validate(upgrade_v1(v1), SCHEMA)


def test_v1_knobs_land_in_their_blocks():
    v1 = {"schema": "conjugate.plan/1", "streams": "two", "priority": "target", "split_reduce": {"draft": "atomic"},
          "pdl": {"draft": {"trigger": "end", "prefetch": False}}, "sm_limit": {"draft": 96},
          "persist": {"target": {"span": "none", "programs": 0, "prefetch": True}},
          "tiles": {"target": {"qkv": {"SPLIT_K": 2}}}, "fusions": {"draft": ["lm_head+argmax"]},
          "overrides": [{"match": "d.s0.*", "pdl": {"trigger": "none", "preload": False}}]}
    plan = validate_plan(v1)
    draft, target = plan.model(Model.DRAFT), plan.model(Model.TARGET)
    assert (draft.reduce, draft.pdl, draft.stream, draft.fusions) == ("atomic", "end", Stream("normal", 96),
                                                                      ("lm_head+argmax",))
    assert target.stream.priority == "high" and target.tiles["qkv"]["SPLIT_K"] == 2
    assert plan.cross.streams == "two" and plan.cross.overrides[0].pdl == "none"


@pytest.mark.parametrize("v1,field", [
    ({"persist": {"draft": {"span": "layer"}}}, "$.persist.draft.span"),
    ({"persist": {"target": {"span": "none", "order": "tickets"}}}, "$.persist.target.order"),
    ({"persist": {"target": {"preload": True}}}, "$.persist.target.preload"),
    ({"pdl": {"draft": {"trigger": "end", "prefetch": True}}}, "$.pdl.draft.prefetch"),
    ({"pdl": {"target": {"trigger": "start", "preload": True}}}, "$.pdl.target.preload"),
    ({"overrides": [{"match": "d.*", "pdl": {"trigger": "end", "preload": True}}]}, "$.overrides[0].pdl.preload"),
])
def test_v1_plans_using_a_retired_knob_are_refused_naming_it(v1, field):
    with pytest.raises(PlanError) as info:
        validate_plan({"schema": "conjugate.plan/1"} | v1, source="old.json")
    assert len(info.value.errors) == 1
    assert info.value.errors[0].startswith(f"{field}: ") and "retired" in info.value.errors[0]
    assert str(info.value).startswith("old.json: ")


def test_malformed_v1_blocks_are_refused_naming_them():
    for v1, field in (({"split_reduce": "atomic"}, "$.split_reduce: should be an object"),
                      ({"split_reduce": {"drafts": "atomic"}}, "$.split_reduce.drafts: unknown key"),
                      ({"priority": "both"}, "$.priority"), ({"bogus": 1}, "$.bogus: unknown key")):
        with pytest.raises(PlanError, match=re.escape(field)):
            validate_plan({"schema": "conjugate.plan/1"} | v1, source="old.json")


def test_plan_upgrade_command_rewrites_v1_files(tmp_path, capsys):
    from conjugate.cli import main

    for path in V1:
        shutil.copy(path, tmp_path / path.name)
    inputs = [str(tmp_path / p.name) for p in V1]
    assert main(["plan", "upgrade", *inputs, "--out", str(tmp_path / "v2")]) == 0
    for path in V1:
        written = json.loads((tmp_path / "v2" / path.name).read_text())
        assert written["schema"] == "conjugate.plan/2" and written["name"] == json.loads(path.read_text())["name"]
        assert validate_plan(written).hash == load_plan(path).hash
    assert main(["plan", "upgrade", inputs[0], "--in-place"]) == 0
    assert json.loads(Path(inputs[0]).read_text())["schema"] == "conjugate.plan/2"
    assert main(["plan", "upgrade", inputs[0], "--in-place"]) == 0  # already v2: left as it is
    assert "already v2" in capsys.readouterr().out
    retired = tmp_path / "retired.json"
    retired.write_text(json.dumps({"schema": "conjugate.plan/1", "persist": {"draft": {"span": "step"}}}))
    before = retired.read_text()
    assert main(["plan", "upgrade", str(retired), inputs[1], "--in-place"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "retired.json" in err and "$.persist.draft.span" in err
    assert retired.read_text() == before
    assert json.loads(Path(inputs[1]).read_text())["schema"] == "conjugate.plan/1"  # nothing written when one fails


# ---------------------------------------------------------------------------------------------
# JSON Patch (RFC 6902)


def test_patch_operations():
    doc = {"a": {"b": [1, 2, 3]}, "c~d": 1, "e/f": 2}
    assert apply_patch(doc, [{"op": "add", "path": "/a/b/1", "value": 9}])["a"]["b"] == [1, 9, 2, 3]
    assert apply_patch(doc, [{"op": "add", "path": "/a/b/-", "value": 9}])["a"]["b"] == [1, 2, 3, 9]
    assert apply_patch(doc, [{"op": "remove", "path": "/a/b/0"}])["a"]["b"] == [2, 3]
    assert apply_patch(doc, [{"op": "replace", "path": "/c~0d", "value": 5}])["c~d"] == 5
    assert apply_patch(doc, [{"op": "move", "from": "/e~1f", "path": "/g"}]) == {"a": {"b": [1, 2, 3]}, "c~d": 1, "g": 2}
    assert apply_patch(doc, [{"op": "copy", "from": "/a/b", "path": "/h"}])["h"] == [1, 2, 3]
    assert apply_patch(doc, [{"op": "test", "path": "/a/b/2", "value": 3}]) == doc
    assert doc == {"a": {"b": [1, 2, 3]}, "c~d": 1, "e/f": 2}  # input untouched


@pytest.mark.parametrize("patch,expected", [
    ([{"op": "replace", "path": "/nope", "value": 1}], "patch op 0 (replace /nope): path not found"),
    ([{"op": "remove", "path": "/a/b/7"}], "index 7 is out of range"),
    ([{"op": "add", "path": "/a/b/x", "value": 1}], "'x' is not an array index"),
    ([{"op": "test", "path": "/a/b/0", "value": 5}], "test failed"),
    ([{"op": "frobnicate", "path": "/a"}], "'op' must be one of"),
    ([{"op": "add", "path": "/a"}], "missing member 'value'"),
    ([{"op": "add", "path": "a", "value": 1}], "is not a JSON Pointer"),
    ([{"op": "move", "from": "/a", "path": "/a/b/0"}], "into one of its own children"),
    ({"op": "add"}, "a patch is a list"),
])
def test_patch_errors(patch, expected):
    doc = {"a": {"b": [1, 2, 3]}}
    with pytest.raises(PatchError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        apply_patch(doc, patch)


def test_a_patch_of_copies_into_their_own_source_stays_small_and_fast():
    """Each copy of /a into /a doubles it: 40 of them (a reply of 2 KB) would make 2**40 values."""
    patch = [{"op": "copy", "from": "/a", "path": f"/a/x{i}"} for i in range(40)]
    with pytest.raises(PatchError, match=r"patch op 1\d \(copy /a/x1\d\): the copies make the document larger"):
        apply_patch({"a": {"b": [1, 2, 3]}}, patch)
    many = apply_patch({"a": 1}, [{"op": "copy", "from": "/a", "path": f"/x{i}"} for i in range(2000)])
    assert len(many) == 2001  # many small copies are fine


def test_patch_is_atomic_and_plan_patch_validates():
    plan = load_plan(ROOT / "plans" / "interleave.json")
    before = plan.to_dict()
    with pytest.raises(PatchError):
        patch_plan(plan, [{"op": "replace", "path": "/cross/alignment", "value": "greedy"},
                          {"op": "remove", "path": "/nope"}])
    assert plan.to_dict() == before
    edited = patch_plan(plan, [{"op": "replace", "path": "/cross/alignment", "value": "greedy"}])
    assert edited.cross.alignment == "greedy" and edited.hash != plan.hash
    with pytest.raises(PlanError, match=r"\$.target.tiles.qkv.BLOCK_K: 100 is not a power of two"):
        patch_plan(plan, [{"op": "add", "path": "/target/tiles/qkv", "value": {"BLOCK_K": 100}}])


# ---------------------------------------------------------------------------------------------
# expansion


def _ops_once(schedule, graph) -> None:
    ops = [op for launch in schedule.launches for op in launch.ops]
    assert sorted(ops) == sorted(graph.nodes)


@pytest.mark.parametrize("workload", sorted((ROOT / "examples").glob("*.toml")), ids=lambda p: p.stem)
def test_shipped_plans_expand_on_every_workload(workload):
    w = load_workload(workload)
    graph = build_graph(w)
    for path in PLANS:
        schedule = expand(load_plan(path), w, graph)
        _ops_once(schedule, graph)
        assert schedule.summary()["bytes"] == sum(graph.nodes[n]["op"].bytes for n in graph.nodes)
        assert [l.index for l in schedule.launches] == list(range(len(schedule.launches)))


def test_sequential_streams_and_interleave_shapes():
    graph = build_graph(TINY)
    seq = expand(load_plan(ROOT / "plans" / "sequential.json"), TINY, graph)
    models = [l.parts[0].model for l in seq.launches]
    assert all(len(l.parts) == 1 for l in seq.launches)
    assert models == sorted(models)  # every draft launch, then every target launch
    assert {l.stream for l in seq.launches} == {"main"}
    streams = expand(load_plan(ROOT / "plans" / "streams.json"), TINY, graph)
    assert {(l.stream, l.parts[0].model) for l in streams.launches} == {("draft", "draft"), ("target", "target")}
    inter = load_plan(ROOT / "plans" / "interleave.json")
    schedule = expand(inter, TINY, graph)
    cross = [l for l in schedule.launches if l.cross_model]
    assert len(cross) >= len(schedule.launches) // 3
    for launch in cross:
        target, draft = launch.parts
        allowed = inter.cross.pairs[target.kind]
        assert "*" in allowed or draft.kind in allowed, (target.kind, draft.kind)
        assert launch.form.pattern == "strided"


def test_fusions_make_chained_parts():
    graph = build_graph(TINY)
    plan = validate_plan(dict(BASE, target={"fusions": ["final_norm+lm_head", "lm_head+argmax"]}))
    schedule = expand(plan, TINY, graph)
    last = schedule.launches[-1].parts[0]
    assert last.ops == ("t.final_norm", "t.lm_head", "t.argmax") and last.kind == "lm_head"
    assert last.tiles == {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 1}
    unfused = expand(validate_plan(BASE), TINY, graph)
    assert len(unfused.launches) == len(schedule.launches) + 2


def test_overrides_pair_tiles_launch_and_warnings():
    raw = _interleave()
    raw["cross"]["overrides"] = [
        {"match": "t.l1.*", "pair": False},
        {"match": "t.l0.attn", "tiles": {"target": {"attn": {"SPLIT_KV": 4, "num_warps": 8}}},
         "interleave": {"pattern": "ratio", "ratio": [3, 1]}},
        {"match": "t.l0.attn", "launch": {"num_stages": 4}},
        {"match": "t.l99.*", "pair": False},
    ]
    schedule = expand(validate_plan(raw), TINY)
    for launch in schedule.launches:
        if any(op.startswith("t.l1.") for op in launch.ops):
            assert not launch.cross_model
    attn = next(l for l in schedule.launches if "t.l0.attn" in l.ops)
    assert attn.parts[0].tiles["SPLIT_KV"] == 4 and attn.num_warps == 8 and attn.num_stages == 4
    assert attn.form.pattern == "ratio" and attn.form.ratio == (3, 1)
    assert schedule.warnings == ("$.cross.overrides[3].match: 't.l99.*' matches no op of this workload",)


def test_pin_places_draft_op_in_target_launch():
    raw = _interleave()
    raw["cross"]["overrides"] = [{"match": "t.l2.down", "with": "d.s0.l1.down"}]
    schedule = expand(validate_plan(raw), TINY)
    launch = next(l for l in schedule.launches if "t.l2.down" in l.ops)
    assert launch.parts[1].ops == ("d.s0.l1.down",)


@pytest.mark.parametrize("overrides,expected", [
    ([{"match": "t.l0.qkv", "with": "d.s2.l0.down"}, {"match": "t.l2.qkv", "with": "d.s0.l0.down"}],
     r"runs d\.s\d\.\S+ before its dependency d\.s\d"),
    ([{"match": "t.l*.qkv", "with": "d.s0.l0.down"}], "must select exactly one target launch, it selects 3"),
    ([{"match": "t.l0.qkv", "with": "d.s9.l0.down"}], "'d.s9.l0.down' is not a draft op of this workload"),
    ([{"match": "t.l0.qkv", "with": "d.s0.l0.down"}, {"match": "t.l0.qkv", "with": "d.s1.l0.down"}],
     "pinned into the same target launch"),
])
def test_impossible_pins_are_rejected(overrides, expected):
    raw = _with(_interleave(), overrides=overrides)
    with pytest.raises(ScheduleError, match=expected):
        expand(validate_plan(raw), TINY)


def test_dependency_check_names_both_ops():
    graph = build_graph(TINY)
    schedule = expand(validate_plan(dict(BASE, draft={"fusions": ["attn_norm+qkv"]})), TINY, graph)
    launches = list(schedule.launches)
    launches[1], launches[2] = replace(launches[2], index=1), replace(launches[1], index=2)
    with pytest.raises(ScheduleError, match=r"launch 1 runs d\.s0\.l0\.rope_kv before its dependency d\.s0\.l0\.qkv"):
        check_dependencies(graph, tuple(launches))
    original = schedule.launches
    with pytest.raises(ScheduleError, match="never scheduled"):
        check_dependencies(graph, original[:-1])
    with pytest.raises(ScheduleError, match="scheduled twice"):
        check_dependencies(graph, original + (replace(original[-1], index=len(original)),))


# A hypothesis strategy over valid plans: every one must expand to a schedule that keeps every
# dependency and runs every op exactly once.
_kind_lists = st.one_of(st.just(["*"]), st.lists(st.sampled_from(KINDS), max_size=4))
_plans = st.fixed_dictionaries({
    "schema": st.just("conjugate.plan/2"),
    "draft": st.fixed_dictionaries({"fusions": st.lists(st.sampled_from(FUSIONS), unique=True)}),
    "target": st.fixed_dictionaries({"fusions": st.lists(st.sampled_from(FUSIONS), unique=True)}),
    "cross": st.fixed_dictionaries({
        "alignment": st.sampled_from(ALIGNMENTS),
        "pairs": st.dictionaries(st.sampled_from(KINDS), _kind_lists, max_size=6),
        "interleave": st.fixed_dictionaries({"pattern": st.sampled_from(PATTERNS),
                                             "ratio": st.lists(st.integers(1, 8), min_size=2, max_size=2)}),
        "overrides": st.lists(st.fixed_dictionaries({"match": st.sampled_from(["t.l0.*", "t.l1.qkv", "t.*", "d.s1.*"]),
                                                     "pair": st.booleans()}), max_size=3),
    }),
})


@settings(max_examples=60, deadline=None)
@given(raw=_plans)
def test_random_valid_plans_expand_to_valid_schedules(raw):
    plan = validate_plan(raw)
    jsonschema.validate(copy.deepcopy(raw), SCHEMA)
    graph = build_graph(TINY)
    schedule = expand(plan, TINY, graph)  # expand() itself checks every dependency
    _ops_once(schedule, graph)
    if plan.cross.alignment == "sequential":
        assert not any(l.cross_model for l in schedule.launches)


def test_pins_with_two_streams_make_a_mixed_plan():
    """Two streams with a pinned draft op: that one launch is shared, on the target's stream; the
    streams wait for each other around it and nowhere else."""
    from conjugate.compiler.round import cross_stream_waits

    raw = _with(BASE, streams="two", overrides=[{"match": "t.l1.o_proj", "with": "d.s1.l0.down"}])
    jsonschema.validate(raw, SCHEMA)
    graph = build_graph(TINY)
    schedule = expand(validate_plan(raw), TINY, graph)
    shared = [l for l in schedule.launches if l.cross_model]
    assert [l.ops for l in shared] == [("t.l1.o_proj", "d.s1.l0.down")] and shared[0].stream == "target"
    waits = cross_stream_waits(schedule.launches, graph)
    before = max(l.index for l in schedule.launches if l.index < shared[0].index and l.stream == "draft")
    after = min(l.index for l in schedule.launches if l.index > shared[0].index and l.stream == "draft")
    assert waits[shared[0].index] == (before,) and waits[after] == (shared[0].index,)
    assert set(waits) <= {shared[0].index} | {l.index for l in schedule.launches if l.stream == "draft"}
    assert cross_stream_waits(expand(validate_plan(_with(BASE, streams="two")), TINY, graph).launches, graph) == {}


def test_pins_need_one_launch_per_unit():
    twice = _with(dict(BASE, draft={"fusions": ["attn_norm+qkv"]}), alignment="proportional",
                  overrides=[{"match": "t.l0.qkv", "with": "d.s0.l0.attn_norm"}, {"match": "t.l1.qkv", "with": "d.s0.l0.qkv"}])
    with pytest.raises(ScheduleError, match="already pinned into another target launch"):
        expand(validate_plan(twice), TINY)


def test_stream_priority_and_sms_become_the_schedules_priority_and_limits():
    """A model's `stream.priority` 'high' makes its stream the one the GPU serves first; its `stream.sms`
    limits its stream's SMs. The serving loop's phase plan drops both with the second stream."""
    from conjugate.compiler.round import stream_priority
    from conjugate.serving.decoder import phase_plan

    streams = json.loads((ROOT / "plans" / "streams.json").read_text())
    favoured = validate_plan(streams | _stream("draft", priority="high") | _stream("target", sms=96))
    plain = validate_plan(streams)
    assert favoured.hash != plain.hash
    schedule = expand(favoured, TINY, build_graph(TINY))
    assert schedule.priority == "draft" and schedule.sm_limits == (("target", 96),)
    assert {l.stream for l in schedule.launches} == {"draft", "target"}
    assert (stream_priority(schedule, Model.DRAFT), stream_priority(schedule, Model.TARGET)) == (-1, 0)
    plain_schedule = expand(plain, TINY, build_graph(TINY))
    assert (plain_schedule.priority, plain_schedule.sm_limits) == ("none", ())
    assert (stream_priority(plain_schedule, Model.DRAFT), stream_priority(plain_schedule, Model.TARGET)) == (0, 0)
    phases = phase_plan(favoured)  # what the serving loop runs phase by phase: one stream, no priority
    assert phases.cross.streams == "one" and {phases.model(m).stream for m in Model} == {Stream("normal", 0)}


def test_reduce_marks_the_residual_gemms():
    plan = load_plan(ROOT / "plans" / "streams.json")
    atomic = validate_plan(plan.to_dict() | {"draft": plan.to_dict()["draft"] | {"reduce": "atomic"}})
    assert atomic.hash != plan.hash and atomic.model(Model.TARGET).reduce == "ordered"
    parts = [p for l in expand(atomic, TINY).launches for p in l.parts]
    marked = {(p.model.value, p.kind) for p in parts if p.atomic_split}
    assert marked == {("draft", "o_proj"), ("draft", "down")}


def test_pdl_triggers_per_model_shared_launches_and_overrides():
    raw = _with(dict(_interleave(), draft={"pdl": "end"}, target={"pdl": "start"}),
                overrides=[{"match": "t.l0.*", "pdl": "none"}, {"match": "d.s0.l0.qkv", "pdl": "start"}])
    schedule = expand(validate_plan(raw), TINY)
    for launch in schedule.launches:
        models = {p.model for p in launch.parts}
        if any(op.startswith("t.l0.") for op in launch.ops) and "d.s0.l0.qkv" not in launch.ops:
            assert launch.pdl == "none"
        elif "d.s0.l0.qkv" in launch.ops:
            assert launch.pdl == "start"
        else:
            assert launch.pdl == ("end" if Model.DRAFT in models else "start"), launch.ops
