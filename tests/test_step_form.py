"""The step form (`draft.form: step`) through the product on the CPU: the plan field and its rules,
the schedule's one Step launch, a compiled step round computing the reference round (the task table
run in torch), what it refuses, the analytical model's cost of it and the heuristic's edits."""
from __future__ import annotations

import dataclasses
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
from conjugate.kernels.step.columns import BATCH_PAD
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
    import jsonschema  # plans/plan.schema.json says the same

    schema = json.loads((ROOT / "plans" / "plan.schema.json").read_text())
    jsonschema.validate(_step_plan(), schema)
    for wrong in (_step_plan() | {"target": {"form": "step"}}, _step_plan(alignment="greedy")):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, schema)


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
    assert isinstance(compiled.launches[0], CompiledStep)
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
    from conjugate.models.weights import meta_weights  # the kernel's own table, as a GPU would build it

    def compiled(wl, dtype):
        return compile_round(plan, wl, meta_weights(wl.draft, dtype), meta_weights(wl.target, dtype),
                             cache_dir=tmp_path)

    with pytest.raises(CompileError, match="runs bf16 drafts"):
        compiled(TINY, torch.float32)
    with pytest.raises(CompileError, match="qkv tiles hold 128 rows"):  # the tiny draft's 4 heads of 16
        compiled(TINY, torch.bfloat16)
    b32 = load_workload(ROOT / "examples" / "llama-1b-8b-b32.toml")
    b40 = dataclasses.replace(b32, draft_batch=40)
    with pytest.raises(CompileError, match="1 to 32 draft sequences; this round has 40"):
        compiled(b40, torch.bfloat16)


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
    assert form_edits(plan, workload | {"draft_batch": 32})  # the 32-row tile, checked on a GPU
    assert form_edits(plan, workload | {"draft_batch": BATCH_PAD + 1}) == []  # past the kernel's rows
    assert form_edits(load_plan(ROOT / "plans" / "streams.json"), workload) == []  # beside a target stream it lost


def test_plan_explain_names_the_step_launch_by_its_ends(capsys, monkeypatch):
    import conjugate.cli
    from conjugate.cli.main import main

    monkeypatch.setattr(conjugate.cli.out, "width", 200)  # rich sizes tables to the terminal
    assert main(["plan", "explain", str(ROOT / "plans" / "step.json"), "--workload", "tiny"]) == 0
    shown = capsys.readouterr().out
    assert "d:step" in shown and "60 ops: d.s0.embed .. d.s2.argmax" in shown and "d.s1.l0.qkv" not in shown


def test_a_step_launch_whose_waits_ran_out_fails_its_check(tmp_path, monkeypatch):
    """The kernel's error word (waits that hit their spin limit) fails the round's check whatever its
    tokens say: a wait that stopped waiting may have raced."""
    from conjugate.evaluate.correctness import ReferenceChecker
    from conjugate.evaluate.rounds import checked_run, round_inputs

    draft, target = TINY.weights(Model.DRAFT), TINY.weights(Model.TARGET)
    inputs = round_inputs(TINY, draft, target)
    compiled = compile_round(validate_plan(_step_plan()), TINY, draft, target, cache_dir=tmp_path)
    check = ReferenceChecker(draft, target, inputs, TINY.dtype)
    assert checked_run(compiled, inputs, check).ok
    monkeypatch.setattr(CompiledStep, "spins_ran_out", lambda self: 3)
    report = checked_run(compiled, inputs, check)
    assert not report.ok and any("3 waits ran out of spins" in p for p in report.problems)


def test_the_kv_cache_is_the_stacked_tensor_the_kernel_indexes():
    from conjugate.compiler.buffers import ModelBuffers, PreparedWeights
    from conjugate.compiler.step.compiled import stacked_cache
    from conjugate.models.reference import KVCache

    bufs = ModelBuffers.allocate(PreparedWeights(TINY.weights(Model.DRAFT)), 2, 1, 3, 20, Model.DRAFT)
    both = stacked_cache(bufs)
    assert both.shape[0] == 2 and both[0].data_ptr() == bufs.cache.k.data_ptr()
    assert both[1].data_ptr() == bufs.cache.v.data_ptr()
    bufs.cache = KVCache(bufs.cache.k.clone(), bufs.cache.v.clone())  # two tensors of their own
    with pytest.raises(ValueError, match="halves of one tensor"):
        stacked_cache(bufs)


def test_a_table_of_more_programs_than_the_gpu_has_is_refused_on_meta(tmp_path):
    """Offline (meta buffers) the table is checked against a Hopper GPU's SMs, not its own size."""
    from conjugate.models.weights import meta_weights

    wl = load_workload(ROOT / "examples" / "qwen3-06b-8b-b4.toml")
    plan = _step_plan()
    plan["draft"]["stream"]["sms"] = 512
    plan["cross"]["streams"] = "two"
    with pytest.raises(CompileError, match="512 programs"):
        compile_round(validate_plan(plan), wl, meta_weights(wl.draft, wl.torch_dtype),
                      meta_weights(wl.target, wl.torch_dtype), cache_dir=tmp_path)


def _step_result(plan, status, stage, **fields):
    from conjugate.evaluate.result import EvalResult

    return EvalResult(plan.hash, TINY.name, "h200", stage, status, False, **fields)


def test_the_heuristic_reads_a_step_plans_results_without_tiles_for_its_step_part():
    """A step launch's feedback (it spills, as Triton counts on the GPU) and its failures: no tile edit
    for a part without tiles; a failed step launch is undone first; nothing the step launch does not
    read, nor a second stream, is proposed for a step plan."""
    import random

    from conjugate.agents.heuristic import candidates
    from conjugate.agents.heuristic.repair import repair_edits
    from conjugate.agents.heuristic.tiles import spill_edits
    from conjugate.compiler.feedback import CompileFailure, LaunchFeedback, PartRef, Resources
    from conjugate.evaluate.result import Stage, Status

    plan = load_plan(ROOT / "plans" / "step.json")
    step_part = PartRef.of(expand(plan, TINY).launches[0].parts[0], 132)
    spilled = _step_result(plan, Status.OK, Stage.TIMING,
                           feedback=(LaunchFeedback(0, "device.py", (step_part,), Resources(168, 8, 221_000)),))
    assert spill_edits(plan, spilled) == []
    failed = _step_result(plan, Status.COMPILE_ERROR, Stage.COMPILE,
                          compile_failure=CompileFailure(0, 0, (step_part,), "the step kernel needs a Hopper GPU"))
    first = repair_edits(plan, failed)[0]
    assert first.kind == "form" and first.score == 1.0
    assert patch_plan(plan, first.patch).model(Model.DRAFT).form == "launches"
    wrong = _step_result(plan, Status.INCORRECT, Stage.CORRECTNESS)  # no part blamed: still a likely cause
    assert any(c.kind == "form" for c in repair_edits(plan, wrong))
    for result in (None, spilled):
        for c in candidates(plan, result, 132, random.Random(0), TINY.to_dict()):
            paths = [op["path"] for op in c.patch]
            assert not any(p.startswith(("/draft/tiles", "/draft/fusions", "/draft/pdl", "/draft/reduce"))
                           for p in paths), c
            assert {"path": "/cross/streams", "op": "replace", "value": "two"} not in c.patch, c


def test_a_profile_from_before_the_step_form_loads_with_its_measured_efficiency(tmp_path):
    text = (ROOT / "evaluators" / "analytical.toml").read_text()
    old = tmp_path / "old.toml"
    old.write_text("\n".join(line for line in text.splitlines() if not line.startswith("step =")) + "\n")
    assert load_profile(old).model.efficiency["step"] == load_profile("analytical").model.efficiency["step"]


def test_launch_options_rebuild_the_gpu_launch_under_a_digest_of_their_own():
    """Lab variants retune the step launch (attention's depth, the GEMMs' wgmma depth): the rebuilt
    launch carries them, and its digest (a compiled kernel's key) differs from the default's; the CPU
    simulation has no launch to tune."""
    from conjugate.compiler.buffers import ModelBuffers, PreparedWeights
    from conjugate.models.presets import from_name
    from conjugate.models.weights import meta_weights

    bufs = ModelBuffers.allocate(PreparedWeights(meta_weights(from_name("qwen3-0.6b"), torch.bfloat16)), 4, 1, 1, 80,
                                 Model.DRAFT)
    step = CompiledStep.build(0, bufs, 132, "main")
    default = (step.digest, step.launch.kwargs["KV_BUFS"], step.launch.kwargs["MMA_DEPTH"])
    step.use_launch_options(attention_buffers=3, mma_depth=1)
    assert (step.launch.kwargs["KV_BUFS"], step.launch.kwargs["MMA_DEPTH"]) == (3, 1) and step.digest != default[0]
    step.use_launch_options()
    assert (step.digest, step.launch.kwargs["KV_BUFS"], step.launch.kwargs["MMA_DEPTH"]) == default
    cpu = CompiledStep.build(0, ModelBuffers.allocate(PreparedWeights(random_weights(TINY.draft, 0)), 2, 1, 1, 40,
                                                      Model.DRAFT), 8, "main")
    with pytest.raises(ValueError, match="CPU simulation"):
        cpu.use_launch_options(mma_depth=1)
