"""The step form (`draft.form: step`) through the product on the CPU: the plan field and its rules,
the schedule's one Step launch, a compiled step round computing the reference round (the task table
run in torch), what it refuses, the analytical model's cost of it and the heuristic's edits."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conjugate.agents.heuristic.form import form_edits
from conjugate.compiler.feedback import CompileError
from conjugate.compiler.round import compile_round
from conjugate.compiler.step.compiled import CompiledStep
from conjugate.errors import PlanError, ScheduleError
from conjugate.evaluate.analytical import STEP, AnalyticalModel, LaunchEstimate, PartCost
from conjugate.evaluate.correctness import compare_rounds
from conjugate.evaluate.evaluators import load_profile
from conjugate.models.reference import make_round_inputs, reference_round
from conjugate.models.weights import random_weights
from conjugate.plan import expand, load_plan, patch_plan, validate_plan
from conjugate.plan.launch import Step
from conjugate.roles import Model
from conjugate.workload import load_workload, workload_from_dict

ROOT = Path(__file__).resolve().parents[1]
TINY = load_workload(ROOT / "examples" / "tiny.toml")


def _step_plan(base: str = "sequential", **cross) -> dict:
    plan = load_plan(ROOT / "plans" / f"{base}.json").to_dict()
    plan["draft"]["form"] = "step"
    plan["cross"].update(cross)
    return plan


def test_the_form_is_the_drafts_and_needs_the_sequential_alignment():
    assert load_plan(ROOT / "plans" / "step.json").model(Model.DRAFT).form == "step"
    with pytest.raises(PlanError, match=r"\$\.target\.form: \"step\".*only be \"launches\""):
        validate_plan(load_plan(ROOT / "plans" / "sequential.json").to_dict() | {"target": {"form": "step"}})
    with pytest.raises(PlanError, match=r"\$\.draft\.form: \"step\".*needs \$\.cross\.alignment \"sequential\""):
        validate_plan(_step_plan(alignment="greedy"))
    with pytest.raises(PlanError, match=r"\$\.draft\.form"):
        validate_plan(_step_plan() | {"draft": {"form": "persistent"}})


def test_a_plan_stored_before_the_form_keeps_its_hash():
    raw = json.loads((ROOT / "plans" / "sequential.json").read_text())
    assert "form" not in raw["draft"]
    stated = json.loads(json.dumps(raw))
    stated["draft"]["form"] = stated["target"]["form"] = "launches"
    assert validate_plan(raw).hash == validate_plan(stated).hash
    assert validate_plan(_step_plan()).hash != validate_plan(raw).hash


@pytest.mark.parametrize("streams", ["one", "two"])
def test_the_schedule_runs_the_draft_as_one_step_launch_first(streams):
    schedule = expand(validate_plan(_step_plan(streams=streams)), TINY)
    first, rest = schedule.launches[0], schedule.launches[1:]
    assert isinstance(first.form, Step) and first.parts[0].kind == "step"
    assert first.stream == ("main" if streams == "one" else "draft")
    draft_ops = [op for launch in schedule.launches for op in launch.ops if op.startswith("d.")]
    assert draft_ops == list(first.ops) and len(first.ops) == TINY.k * (1 + 8 * 2 + 3)  # embed, 2 layers of 8 ops, the head
    assert all(p.model == Model.TARGET for launch in rest for p in launch.parts)
    assert first.bytes == sum(l.bytes for l in expand(load_plan(ROOT / "plans" / "sequential.json"), TINY).launches
                              if l.parts[0].model == Model.DRAFT)


def test_no_draft_op_can_be_pinned_into_a_target_launch():
    plan = _step_plan(overrides=[{"match": "t.l0.qkv", "with": "d.s0.l0.qkv"}])
    with pytest.raises(ScheduleError, match=r"overrides\[0\]\.with: the draft runs as one step launch"):
        expand(validate_plan(plan), TINY)


def _workload(family: str, batch: int = 3):
    return workload_from_dict({"draft": f"tiny-{family}-d", "target": f"tiny-{family}-t", "k": 3,
                               "draft_batch": batch, "target_batch": 2, "context": 9, "dtype": "fp32", "seed": 5},
                              ROOT / f"{family}.toml")


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_a_step_round_computes_the_reference_round(family, tmp_path):
    """Ragged lengths, every family: the step launch's tokens and cache entries are the reference's
    (fp32: exactly the tokens), the target's launches beside it unchanged; no draft logits written."""
    wl = _workload(family)
    draft, target = random_weights(wl.draft, wl.seed, wl.torch_dtype), random_weights(wl.target, wl.seed, wl.torch_dtype)
    inputs = make_round_inputs(draft, target, k=wl.k, draft_batch=wl.draft_batch, target_batch=wl.target_batch,
                               context=wl.context, seed=wl.seed, ragged=True)
    compiled = compile_round(validate_plan(_step_plan()), wl, draft, target, cache_dir=tmp_path)
    assert isinstance(compiled.launches[0], CompiledStep) and compiled.launches[0].spins_ran_out() == 0
    compiled.load(inputs)
    compiled.bufs.poison()
    compiled.run()
    out = compiled.outputs()
    assert out.draft_logits is None and not compiled.writes_logits(Model.DRAFT)
    report = compare_rounds(reference_round(draft, target, inputs), out, wl.dtype,
                            (inputs.draft_lengths, inputs.target_lengths))
    assert report.ok, report.problems
    assert report.near_ties == 0
    manifest = json.loads((compiled.source_dir / "manifest.json").read_text())
    assert manifest["launches"][0]["kernel"] == "conjugate/kernels/step/device.py"
    feedback = compiled.feedback()[0]
    assert feedback.parts[0].kind == "step" and "draft's steps" in feedback.parts[0].label


def test_sampling_runs_the_draft_as_launches_and_tables_that_cannot_run_are_refused(tmp_path):
    draft, target = TINY.weights(Model.DRAFT), TINY.weights(Model.TARGET)
    plan = validate_plan(_step_plan())
    sampled = compile_round(plan, TINY, draft, target, cache_dir=tmp_path, sampling=True)  # it reads the logits
    assert not any(isinstance(l, CompiledStep) for l in sampled.launches) and sampled.writes_logits(Model.DRAFT)
    with pytest.raises(ValueError, match="sampling reads the draft's logits"):  # a schedule given as it is
        compile_round(plan, TINY, draft, target, cache_dir=tmp_path, sampling=True, schedule=expand(plan, TINY))
    odd = _workload("llama")
    spec = odd.draft
    w = random_weights(spec, 0, torch.float32)
    w.spec = spec.__class__(**{**spec.__dict__, "head_dim": 48})  # no pairing of 48-dim heads into 16-row halves
    with pytest.raises(CompileError, match="the step table: head_dim 48"):
        compile_round(plan, odd, w, random_weights(odd.target, 0, torch.float32), cache_dir=tmp_path)


def test_the_analytical_model_costs_a_step_launch_without_waves():
    constants = load_profile("analytical").model
    model = AnalyticalModel(constants)
    part = PartCost(STEP, bytes=10**9, flops=0, programs=8)
    expected = 10**9 / (constants.bandwidth_gbs * 1e3 * constants.efficiency["step"])
    assert model.part_us(part) == pytest.approx(expected)  # 8 programs, yet no wave quantization
    assert model.part_us(PartCost("gemm", 10**9, 0, 8)) > model.part_us(PartCost("gemm", 10**9, 0, 264))
    streams = [LaunchEstimate(0, "draft", 3000.0, (3000.0,)), LaunchEstimate(1, "target", 2000.0, (2000.0,))]
    assert model.round_ms(streams) < 5.0  # two streams overlap
    assert model.round_ms(streams, holds_every_sm=True) == pytest.approx(5.0)  # a step launch keeps the target off


def test_the_heuristic_proposes_the_step_form_with_what_it_needs():
    plan = load_plan(ROOT / "plans" / "interleave.json")
    pinned = patch_plan(plan, [{"op": "add", "path": "/cross/overrides/-",
                                "value": {"match": "t.l0.qkv", "with": "d.s0.l0.qkv"}}])
    workload = TINY.to_dict()
    (edit,) = form_edits(pinned, workload)
    assert edit.kind == "form" and "persistent launch" in edit.rationale
    made = patch_plan(pinned, edit.patch)
    assert made.model(Model.DRAFT).form == "step" and made.cross.alignment == "sequential"
    assert all(o.with_ is None for o in made.cross.overrides)
    expand(made, TINY)  # schedules
    (back,) = form_edits(made, workload)
    assert patch_plan(made, back.patch).model(Model.DRAFT).form == "launches"
    assert form_edits(plan, workload | {"draft_batch": 32}) == []
    assert form_edits(load_plan(ROOT / "plans" / "streams.json"), workload) == []  # beside a target stream it lost


def test_plan_explain_names_the_step_launch_by_its_ends(capsys, monkeypatch):
    import conjugate.cli
    from conjugate.cli.main import main

    monkeypatch.setattr(conjugate.cli.out, "width", 200)  # rich sizes tables to the terminal
    assert main(["plan", "explain", str(ROOT / "plans" / "step.json"), "--workload", "tiny"]) == 0
    shown = capsys.readouterr().out
    assert "d:step" in shown and "60 ops: d.s0.embed .. d.s2.argmax" in shown and "d.s1.l0.qkv" not in shown
