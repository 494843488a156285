"""Carrying plans across model pairs: op ids translated to the new pair's layers and draft steps."""
from __future__ import annotations

from pathlib import Path

import pytest

from conjugate.graph import build_graph
from conjugate.plan import expand, validate_plan
from conjugate.search.seeding import same_pair_shape, scale_layer, translate_op_pattern, translate_plan
from conjugate.workload import load_workload

ROOT = Path(__file__).resolve().parents[1]
BIG = load_workload(ROOT / "examples" / "llama-1b-8b-b8.toml").to_dict()  # 32-layer target, 16-layer draft, k 4


def _pair(target_layers: int, draft_layers: int, k: int) -> dict:
    return {"target": {"num_layers": target_layers}, "draft": {"num_layers": draft_layers}, "k": k}


@pytest.mark.parametrize("layer,source,target,expected", [
    (0, 32, 28, 0), (31, 32, 28, 27), (16, 32, 48, 24), (15, 16, 28, 27), (3, 4, 1, 0), (5, 1, 4, 3)])
def test_a_layer_keeps_its_relative_depth(layer, source, target, expected):
    assert scale_layer(layer, source, target) == expected


@pytest.mark.parametrize("pattern,expected", [
    ("t.l31.down", "t.l27.down"),  # the last target layer stays the last
    ("t.l16.*", "t.l14.*"),
    ("d.s3.l15.qkv", "d.s1.l27.qkv"),  # step past the new k: the last step; the draft's last layer
    ("d.s1.*", "d.s1.*"),
    ("d.s6.*", "d.s1.*"),
    ("t.l1?.qkv", "t.l1?.qkv"),  # a glob over the layer number is left to match what exists
    ("t.*", "t.*"), ("t.lm_head", "t.lm_head"), ("d.s0.embed", "d.s0.embed"),
])
def test_op_patterns_are_translated(pattern, expected):
    assert translate_op_pattern(pattern, BIG, _pair(28, 28, 2)) == expected


def test_a_translated_plan_expands_on_the_new_pair_and_drops_pins_it_lacks():
    tiny = load_workload(ROOT / "examples" / "tiny.toml")  # 3-layer target, 2-layer draft, k 3
    graph = build_graph(tiny)
    plan = validate_plan({"schema": "conjugate.plan/1", "alignment": "proportional", "overrides": [
        {"match": "t.l31.qkv", "with": "d.s3.l15.qkv"},  # the last layer and step: the tiny pair's last ones
        {"match": "t.l16.gate_up", "pair": False},
        {"match": "t.l0.down", "with": "d.s0.l0.nope"}]})  # no such op anywhere: dropped
    out = translate_plan(plan.to_dict(), BIG, tiny.to_dict(), graph)
    assert out["cross"]["overrides"] == [{"match": "t.l2.qkv", "with": "d.s2.l1.qkv"}, {"match": "t.l1.gate_up", "pair": False}]
    schedule = expand(validate_plan(out), tiny, graph)
    pinned = next(l for l in schedule.launches if "t.l2.qkv" in l.ops)
    assert "d.s2.l1.qkv" in pinned.ops
    assert plan.to_dict()["cross"]["overrides"][0]["match"] == "t.l31.qkv"  # the source plan is untouched


def test_pairs_of_one_shape_need_no_translation():
    assert same_pair_shape(BIG, BIG) and not same_pair_shape(BIG, _pair(32, 16, 5))
