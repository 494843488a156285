"""lab/experiments/knob_variants.py: one plan's variants with one unmeasured launch knob each."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conjugate.plan import load_plan, validate_plan
from experiment_scripts import load_script  # lab/experiments/tests/experiment_scripts.py

ROOT = Path(__file__).resolve().parents[3]
STREAMS = ROOT / "plans" / "streams.json"


def test_each_variant_differs_from_its_plan_in_its_knob_alone():
    script = load_script("knob_variants")
    made, skipped = script.variants(STREAMS, "best")
    assert set(made) == {"pdl-draft-end", "pdl-draft-start", "pdl-draft-end-prefetch", "pdl-both-end",
                         "pdl-draft-start-preload", "pdl-draft-end-preload", "pdl-target-start-preload",
                         "pdl-both-start-preload", "draft-persist-layer", "draft-persist-layer-preload",
                         "target-loops-99", "target-loops-66", "draft-fusions", "draft-mlp", "draft-fusions-no-mlp",
                         "target-sms-120", "target-sms-112", "target-sms-104", "draft-attn-early",
                         "draft-attn-prefetch", "draft-oproj-early", "target-attn-early",
                         "phases-apart", "draft-tickets-layer", "draft-tickets-layer-preload",
                         "draft-tickets-layer-no-prefetch", "draft-tickets-layer-264", "target-tickets-layer",
                         "draft-tickets-layer-sms-48"} and not skipped
    base = load_plan(STREAMS).to_dict()
    for variant, plan in made.items():
        assert plan["name"] == f"best-{variant}"
        changed = {k for k in plan if plan[k] != base[k]} - {"name"}
        loops = {"target-loops-99": "persist", "target-loops-66": "persist"}
        knob = ("overrides" if "overrides" in script.VARIANTS[variant] else "fusions" if variant.startswith("draft-")
                else "streams" if variant == "phases-apart"
                else loops.get(variant, "sm_limit" if variant.startswith("target-sms") else "pdl"))
        if variant.startswith("draft-persist"):  # joined behind barriers: the draft's pdl off too
            knob = {"persist", "pdl"} if base["pdl"]["draft"]["trigger"] != "none" else {"persist"}
        if "tickets" in variant:  # joined: that model's pdl off too (the shipped plan has none)
            knob = {"persist", "sm_limit"} if variant.endswith("sms-48") else {"persist"}
        assert changed == (knob if isinstance(knob, set) else {knob}), variant
        validate_plan(plan)
    assert made["target-sms-112"]["sm_limit"] == {"draft": 0, "target": 112}
    assert made["pdl-draft-start"]["pdl"]["draft"] == {"trigger": "start", "prefetch": False, "preload": False}
    assert made["pdl-both-end"]["pdl"]["target"]["trigger"] == "end"
    assert made["pdl-target-start-preload"]["pdl"] == {"draft": base["pdl"]["draft"], "target": {
        "trigger": "start", "prefetch": False, "preload": True}}  # the draft's as the plan has it
    assert made["target-loops-99"]["persist"]["target"] == {"span": "launch", "order": "grid", "programs": 99,
                                                            "prefetch": True, "preload": False}
    assert made["target-loops-66"]["persist"]["target"]["programs"] == 66
    assert made["draft-persist-layer-preload"]["persist"]["draft"] == {"span": "layer", "order": "grid", "programs": 0,
                                                                        "prefetch": True, "preload": True}
    fused = made["draft-fusions"]["fusions"]
    assert len(fused["draft"]) == 6 and fused["target"] == base["fusions"]["target"]
    assert made["draft-mlp"]["fusions"]["draft"] == ["gate_up+down", "lm_head+argmax"]
    assert "gate_up+down" not in made["draft-fusions-no-mlp"]["fusions"]["draft"]
    assert made["draft-attn-early"]["overrides"] == [{"match": "d.*.rope_kv", "pdl": {"trigger": "start"}},
                                                     {"match": "d.*.attn", "pdl": {"trigger": "end", "prefetch": True}}]
    assert made["target-attn-early"]["overrides"][1]["match"] == "t.*.attn"
    assert made["draft-tickets-layer-264"]["persist"]["draft"] == {"span": "layer", "order": "tickets", "programs": 264,
                                                                    "prefetch": True, "preload": False}
    assert made["target-tickets-layer"]["persist"]["target"]["order"] == "tickets"
    assert made["draft-tickets-layer-sms-48"]["sm_limit"] == {"draft": 48, "target": 0}


def test_phases_apart_puts_a_limited_two_stream_plan_on_one_stream():
    best = ROOT / "benchmarks" / "results" / "plans" / "qwen3-06b-8b-b4.json"
    made, _ = load_script("knob_variants").variants(best, "best")
    base, apart = load_plan(best).to_dict(), made["phases-apart"]
    assert base["streams"] == "two" and base["sm_limit"]["target"] == 96  # the case that needs more than streams
    assert apart["streams"] == "one" and apart["sm_limit"] == {"draft": 0, "target": 0}
    assert {k for k in apart if apart[k] != base[k]} == {"name", "streams", "sm_limit"}
    validate_plan(apart)


def test_a_variant_the_plan_cannot_take_is_skipped_and_named(tmp_path):
    layered = load_plan(STREAMS).to_dict() | {"name": "layered", "persist": {"draft": {"span": "layer"},
                                                          "target": {"span": "launch", "programs": 99}}}
    path = tmp_path / "layered.json"
    path.write_text(json.dumps(layered))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "lab" / "experiments" / "knob_variants.py"), str(path), str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    skipped = dict(line.split(": ", 1) for line in proc.stderr.strip().splitlines())
    assert set(skipped) == {"skipped pdl-draft-end", "skipped pdl-draft-start", "skipped pdl-draft-end-prefetch",
                            "skipped pdl-draft-start-preload", "skipped pdl-draft-end-preload",
                            "skipped pdl-both-start-preload", "skipped draft-persist-layer",
                            "skipped pdl-both-end", "skipped target-loops-99", "skipped draft-attn-early",
                            "skipped draft-attn-prefetch", "skipped draft-oproj-early"}
    assert "joined behind grid barriers" in skipped["skipped draft-attn-early"]
    assert skipped["skipped target-loops-99"] == "the plan has it already"
    assert "$.pdl.draft.trigger" in skipped["skipped pdl-draft-end"]
    assert sorted(p.name for p in out.iterdir()) == ["layered-draft-fusions-no-mlp.json", "layered-draft-fusions.json",
                                                     "layered-draft-mlp.json", "layered-draft-persist-layer-preload.json",
                                                     *(f"layered-draft-tickets-layer{v}.json" for v in (
                                                         "-264", "-no-prefetch", "-preload", "-sms-48", "")),
                                                     "layered-pdl-target-start-preload.json",
                                                     "layered-phases-apart.json",
                                                     "layered-target-attn-early.json",
                                                     "layered-target-loops-66.json",
                                                     "layered-target-sms-104.json", "layered-target-sms-112.json",
                                                     "layered-target-sms-120.json", "layered-target-tickets-layer.json"]
