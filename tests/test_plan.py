"""Plan IR: validation with JSON paths, canonical form and hash, JSON Patch, expansion to launches."""
from __future__ import annotations

import copy
import json
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
from conjugate.plan.schema import ALIGNMENTS, FUSIONS, PATTERNS, plan_hash
from conjugate.workload import load_workload

ROOT = Path(__file__).resolve().parents[1]
PLANS = sorted(p for p in (ROOT / "plans").glob("*.json") if not p.name.endswith(".schema.json"))
SCHEMA = json.loads((ROOT / "plans" / "plan.schema.json").read_text())
TINY = load_workload(ROOT / "examples" / "tiny.toml")
BASE = {"schema": "conjugate.plan/1"}


def _interleave() -> dict:
    return json.loads((ROOT / "plans" / "interleave.json").read_text())


# ---------------------------------------------------------------------------------------------
# validation


def test_shipped_plans_are_valid_under_both_validators():
    assert {p.stem for p in PLANS} == {"sequential", "streams", "interleave"}
    for path in PLANS:
        jsonschema.validate(json.loads(path.read_text()), SCHEMA)
        assert load_plan(path).name == path.stem


def test_the_benchmark_variants_are_valid_and_expand():
    """lab/experiments/variants/*.json: the plans the lab's experiments measured stay valid as the schema grows."""
    from conjugate.plan.expand import expand
    from conjugate.workload import load_workload

    tiny = load_workload(ROOT / "examples" / "tiny.toml")
    variants = sorted((ROOT / "lab" / "experiments" / "variants").glob("*.json"))
    assert len(variants) >= 10
    for path in variants:
        jsonschema.validate(json.loads(path.read_text()), SCHEMA)
        plan = load_plan(path)
        assert plan.name == path.stem and expand(plan, tiny).launches, path.name


BAD_PLANS = [
    ({"schema": "conjugate.plan/2"}, "$.schema"),
    (dict(BASE, priority="draft"), "$.priority: 'draft' favours one model's stream, so it needs $.streams 'two'"),
    (dict(BASE, streams="two", priority="both"), "$.priority"),
    (dict(BASE, bogus=1), "$.bogus: unknown key"),
    (dict(BASE, alignment="diagonal"), "$.alignment"),
    (dict(BASE, alignment=3), "$.alignment"),
    (dict(BASE, tiles={"target": {"qkv": {"BLOCK_N": 48}}}), "$.tiles.target.qkv.BLOCK_N: 48 is not a power of two"),
    (dict(BASE, tiles={"target": {"qkv": {"BLOCK_N": 1024}}}), "$.tiles.target.qkv.BLOCK_N: 1024 is out of range"),
    (dict(BASE, tiles={"target": {"qkv": {"BLOCK_N": "64"}}}), "$.tiles.target.qkv.BLOCK_N: should be an integer"),
    (dict(BASE, tiles={"target": {"qkv": {"SPLIT_KV": 2}}}), "$.tiles.target.qkv.SPLIT_KV: unknown key"),
    (dict(BASE, tiles={"draft": {"attn": {"BLOCK": 64}}}), "$.tiles.draft.attn.BLOCK: unknown key"),
    (dict(BASE, tiles={"drafts": {}}), "$.tiles.drafts: unknown key"),
    (dict(BASE, tiles={"target": {"mlp": {}}}), "$.tiles.target.mlp: unknown key"),
    (dict(BASE, launch={"num_warps": 3}), "$.launch.num_warps: 3 is not a power of two"),
    (dict(BASE, launch={"num_stages": 0}), "$.launch.num_stages: 0 is out of range"),
    (dict(BASE, interleave={"pattern": "ratio", "ratio": [1]}), "$.interleave.ratio"),
    (dict(BASE, interleave={"pattern": "ratio", "ratio": [1, 0]}), "$.interleave.ratio[1]"),
    (dict(BASE, interleave={"pattern": "zigzag"}), "$.interleave.pattern"),
    (dict(BASE, pairs={"qkv": "attn"}), "$.pairs.qkv: should be a list"),
    (dict(BASE, pairs={"qkv": ["mlp"]}), "$.pairs.qkv[0]"),
    (dict(BASE, fusions={"draft": ["rope_kv+attn"]}), "$.fusions.draft[0]"),
    (dict(BASE, pairs={"qkv": [{"a": 1}]}), "$.pairs.qkv[0]: should be an op kind string, got an object"),
    (dict(BASE, pairs={"attn": ["qkv", ["attn"]]}), "$.pairs.attn[1]: should be an op kind string, got a list"),
    (dict(BASE, fusions={"target": [["lm_head+argmax"]]}), "$.fusions.target[0]: should be a fusion string"),
    (dict(BASE, streams="two", alignment="proportional"), "$.streams"),
    (dict(BASE, split_reduce={"draft": "fast"}), "$.split_reduce.draft"),
    (dict(BASE, split_reduce={"drafts": "atomic"}), "$.split_reduce.drafts: unknown key"),
    (dict(BASE, split_reduce="atomic"), "$.split_reduce: should be an object"),
    (dict(BASE, overrides=[{"pair": False}]), "$.overrides[0].match: required"),
    (dict(BASE, overrides=[{"match": "t.l0.qkv", "with": "t.l1.qkv"}]), "$.overrides[0].with"),
    (dict(BASE, overrides=[{"match": "t.l0.qkv", "pair": "no"}]), "$.overrides[0].pair: should be a boolean"),
    (dict(BASE, overrides=[{"match": "t.*", "colour": 1}]), "$.overrides[0].colour: unknown key"),
    (dict(BASE, overrides={"match": "t.*"}), "$.overrides: should be a list"),
    ([1, 2], "$: should be an object"),
]


@pytest.mark.parametrize("raw,expected", BAD_PLANS, ids=[e for _, e in BAD_PLANS])
def test_bad_plan_names_path_and_reason(raw, expected):
    with pytest.raises(PlanError) as info:
        validate_plan(raw, source="p.json")
    assert str(info.value).startswith("p.json: ")
    assert any(e.startswith(expected) for e in info.value.errors), info.value.errors
    with pytest.raises(jsonschema.ValidationError):  # the shipped JSON Schema agrees
        jsonschema.validate(raw, SCHEMA)


def test_every_error_is_reported():
    raw = dict(BASE, alignment="x", streams="y", launch={"num_warps": 5})
    errors = pytest.raises(PlanError, validate_plan, raw).value.errors
    assert [e.split(":")[0] for e in errors] == ["$.alignment", "$.streams", "$.launch.num_warps"]


def test_objects_and_lists_in_name_lists_are_plan_errors():
    """Not TypeError (unhashable): each bad item named by its path, beside the other errors."""
    interleave = load_plan(ROOT / "plans" / "interleave.json")
    with pytest.raises(PlanError) as info:
        patch_plan(interleave, [{"op": "replace", "path": "/pairs/qkv", "value": [{"a": 1}]}])
    assert info.value.errors == ["$.pairs.qkv[0]: should be an op kind string, got an object"]
    patch = [{"op": "add", "path": "/fusions/draft", "value": [["attn_norm+qkv"], 3, "attn_norm+qkv", "nope"]},
             {"op": "replace", "path": "/pairs/qkv", "value": ["attn", {"kind": "attn"}, "attn"]}]
    errors = pytest.raises(PlanError, patch_plan, interleave, patch).value.errors
    assert [e.split(":")[0] for e in errors] == ["$.pairs.qkv[1]", "$.fusions.draft[0]", "$.fusions.draft[1]",
                                                "$.fusions.draft[3]"]
    assert "should be a fusion string, got the number 3" in errors[2]
    fine = patch_plan(interleave, [{"op": "replace", "path": "/pairs/qkv", "value": ["attn", "attn"]}])
    assert fine["pairs"]["qkv"] == ["attn"]


def test_load_plan_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "conjugate.plan/1",\n "name": }')
    with pytest.raises(PlanError, match=r"bad.json: malformed JSON at line 2"):
        load_plan(bad)
    with pytest.raises(PlanError, match="no such plan file"):
        load_plan(tmp_path / "missing.json")


# ---------------------------------------------------------------------------------------------
# canonical form and hash


def test_canonical_form_fills_defaults_and_is_idempotent():
    plan = validate_plan(BASE)
    assert plan["alignment"] == "sequential" and plan["launch"] == {"num_warps": 4, "num_stages": 2}
    assert validate_plan(plan.to_dict()) == plan
    for path in PLANS:
        shipped = load_plan(path)
        assert validate_plan(json.loads(shipped.to_json())).hash == shipped.hash


def test_hash_ignores_key_order_set_order_and_cosmetics():
    raw = _interleave()
    shuffled = json.loads(json.dumps(raw, sort_keys=True))
    shuffled["pairs"]["attn"] = list(reversed(shuffled["pairs"]["attn"]))
    shuffled["name"], shuffled["description"] = "renamed", "other words"
    assert validate_plan(shuffled).hash == validate_plan(raw).hash
    raw["interleave"] = {"pattern": "blocked", "ratio": [3, 1]}  # ratio means nothing unless pattern is ratio
    assert validate_plan(raw).hash == validate_plan(dict(raw, interleave={"pattern": "blocked"})).hash
    changed = dict(raw, alignment="greedy")
    assert validate_plan(changed).hash != validate_plan(raw).hash
    assert len({load_plan(p).hash for p in PLANS}) == len(PLANS)


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
        patch_plan(plan, [{"op": "replace", "path": "/alignment", "value": "greedy"},
                          {"op": "remove", "path": "/nope"}])
    assert plan.to_dict() == before
    edited = patch_plan(plan, [{"op": "replace", "path": "/alignment", "value": "greedy"}])
    assert edited["alignment"] == "greedy" and edited.hash != plan.hash
    with pytest.raises(PlanError, match=r"\$.tiles.target.qkv.BLOCK_K: 100 is not a power of two"):
        patch_plan(plan, [{"op": "replace", "path": "/tiles/target/qkv/BLOCK_K", "value": 100}])


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
        allowed = inter["pairs"][target.kind]
        assert "*" in allowed or draft.kind in allowed, (target.kind, draft.kind)
        assert launch.pattern == "strided"


def test_fusions_make_chained_parts():
    graph = build_graph(TINY)
    plan = validate_plan(dict(BASE, fusions={"target": ["final_norm+lm_head", "lm_head+argmax"]}))
    schedule = expand(plan, TINY, graph)
    last = schedule.launches[-1].parts[0]
    assert last.ops == ("t.final_norm", "t.lm_head", "t.argmax") and last.kind == "lm_head"
    assert last.tiles == {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 1}
    unfused = expand(validate_plan(BASE), TINY, graph)
    assert len(unfused.launches) == len(schedule.launches) + 2


def test_overrides_pair_tiles_launch_and_warnings():
    raw = _interleave()
    raw["overrides"] = [
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
    assert attn.pattern == "ratio" and attn.ratio == (3, 1)
    assert schedule.warnings == ("$.overrides[3].match: 't.l99.*' matches no op of this workload",)


def test_pin_places_draft_op_in_target_launch():
    raw = _interleave()
    raw["overrides"] = [{"match": "t.l2.down", "with": "d.s0.l1.down"}]
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
    raw = dict(_interleave(), overrides=overrides)
    with pytest.raises(ScheduleError, match=expected):
        expand(validate_plan(raw), TINY)


def test_dependency_check_names_both_ops():
    graph = build_graph(TINY)
    schedule = expand(validate_plan(dict(BASE, fusions={"draft": ["attn_norm+qkv"]})), TINY, graph)
    launches = list(schedule.launches)
    launches[1], launches[2] = replace(launches[2], index=1), replace(launches[1], index=2)
    with pytest.raises(ScheduleError, match=r"launch 1 runs d\.s0\.l0\.rope_kv before its dependency d\.s0\.l0\.qkv"):
        check_dependencies(graph, tuple(launches))
    part = lambda *ops: Part("draft", ops, "qkv", ("qkv",), {})  # noqa: E731
    same = Launch(1, (part("d.s0.l0.attn_norm", "d.s0.l0.qkv"), part("d.s0.l0.rope_kv")), "main", "strided",
                  (1, 1), "separate", 4, 2, 0, 0)
    original = schedule.launches
    assert original[1].ops == ("d.s0.l0.attn_norm", "d.s0.l0.qkv") and original[2].ops == ("d.s0.l0.rope_kv",)
    with pytest.raises(ScheduleError, match=r"launch 1 runs d\.s0\.l0\.rope_kv before its dependency d\.s0\.l0\.qkv "
                                            r"\(same launch, another part\)"):
        check_dependencies(graph, (original[0], same) + original[3:])
    with pytest.raises(ScheduleError, match="never scheduled"):
        check_dependencies(graph, original[:-1])
    with pytest.raises(ScheduleError, match="scheduled twice"):
        check_dependencies(graph, original + (replace(original[-1], index=len(original)),))


# A hypothesis strategy over valid plans: every one must expand to a schedule that keeps every
# dependency and runs every op exactly once.
_kind_lists = st.one_of(st.just(["*"]), st.lists(st.sampled_from(KINDS), max_size=4))
_plans = st.fixed_dictionaries({
    "schema": st.just("conjugate.plan/1"),
    "alignment": st.sampled_from(ALIGNMENTS),
    "pairs": st.dictionaries(st.sampled_from(KINDS), _kind_lists, max_size=6),
    "interleave": st.fixed_dictionaries({"pattern": st.sampled_from(PATTERNS),
                                         "ratio": st.lists(st.integers(1, 8), min_size=2, max_size=2)}),
    "fusions": st.fixed_dictionaries({"draft": st.lists(st.sampled_from(FUSIONS), unique=True),
                                      "target": st.lists(st.sampled_from(FUSIONS), unique=True)}),
    "overrides": st.lists(st.fixed_dictionaries({"match": st.sampled_from(["t.l0.*", "t.l1.qkv", "t.*", "d.s1.*"]),
                                                 "pair": st.booleans()}), max_size=3),
})


@settings(max_examples=60, deadline=None)
@given(raw=_plans)
def test_random_valid_plans_expand_to_valid_schedules(raw):
    plan = validate_plan(raw)
    jsonschema.validate(copy.deepcopy(raw), SCHEMA)
    graph = build_graph(TINY)
    schedule = expand(plan, TINY, graph)  # expand() itself checks every dependency
    _ops_once(schedule, graph)
    if plan["alignment"] == "sequential":
        assert not any(l.cross_model for l in schedule.launches)


def test_pins_with_two_streams_make_a_mixed_plan():
    """Two streams with a pinned draft op: that one launch is shared, on the target's stream; the
    streams wait for each other around it and nowhere else."""
    from conjugate.compiler.round import cross_stream_waits

    raw = dict(BASE, streams="two", overrides=[{"match": "t.l1.o_proj", "with": "d.s1.l0.down"}])
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
    assert cross_stream_waits(expand(validate_plan(dict(BASE, streams="two")), TINY, graph).launches, graph) == {}


def test_pins_need_one_launch_per_unit():
    twice = dict(BASE, alignment="proportional", fusions={"draft": ["attn_norm+qkv"]},
                 overrides=[{"match": "t.l0.qkv", "with": "d.s0.l0.attn_norm"}, {"match": "t.l1.qkv", "with": "d.s0.l0.qkv"}])
    with pytest.raises(ScheduleError, match="already pinned into another target launch"):
        expand(validate_plan(twice), TINY)


def test_stream_priority_is_a_two_stream_knob_that_keeps_older_hashes():
    """`priority` names the model whose stream the GPU serves first; unset, a plan hashes as it did
    before the key existed, so stored runs still find their plans."""
    from conjugate.compiler.round import stream_priority
    from conjugate.roles import Model

    streams = json.loads((ROOT / "plans" / "streams.json").read_text())
    favoured = validate_plan(dict(streams, priority="draft"))
    jsonschema.validate(dict(streams, priority="draft"), SCHEMA)
    assert validate_plan(streams)["priority"] == "none"
    assert validate_plan(dict(streams, priority="none")).hash == validate_plan(streams).hash
    assert favoured.hash != validate_plan(streams).hash != validate_plan(dict(streams, priority="target")).hash
    assert validate_plan(streams).hash == plan_hash({k: v for k, v in validate_plan(streams).data.items()
                                                     if k != "priority"})
    schedule = expand(favoured, TINY, build_graph(TINY))
    assert schedule.priority == "draft" and {l.stream for l in schedule.launches} == {"draft", "target"}
    assert (stream_priority(schedule, Model.DRAFT), stream_priority(schedule, Model.TARGET)) == (-1, 0)
    plain = expand(validate_plan(streams), TINY, build_graph(TINY))
    assert (stream_priority(plain, Model.DRAFT), stream_priority(plain, Model.TARGET)) == (0, 0)
    from conjugate.serving.decoder import phase_plan

    phases = phase_plan(favoured)  # what the serving loop runs phase by phase: one stream, no priority
    assert (phases["streams"], phases["priority"]) == ("one", "none")


def test_split_reduce_keeps_earlier_hashes_and_marks_the_residual_gemms():
    from conjugate.plan import expand
    from conjugate.workload import load_workload

    plan = load_plan(ROOT / "plans" / "streams.json")
    ordered = validate_plan(plan.to_dict() | {"split_reduce": {"draft": "ordered", "target": "ordered"}})
    atomic = validate_plan(plan.to_dict() | {"split_reduce": {"draft": "atomic"}})
    assert ordered.hash == plan.hash != atomic.hash and atomic["split_reduce"] == {"draft": "atomic", "target": "ordered"}
    parts = [p for l in expand(atomic, load_workload(ROOT / "examples" / "tiny.toml")).launches for p in l.parts]
    marked = {(p.model.value, p.kind) for p in parts if p.atomic_split}
    assert marked == {("draft", "o_proj"), ("draft", "down")}
