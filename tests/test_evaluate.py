"""Evaluation: EvalResult, evaluator profiles, the analytical model, the pipeline, `conjugate bench`."""
from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import conjugate  # noqa: F401  (selects the interpreter before triton is imported)
from conjugate.cli import main
from conjugate.compiler.round import CompiledRound
from conjugate.evaluate import modeled
from conjugate.evaluate.analytical import AnalyticalModel, LaunchEstimate, PartCost
from conjugate.evaluate.correctness import ReferenceChecker
from conjugate.evaluate.pipeline import evaluate
from conjugate.evaluate.evaluators import ProfileError, load_profile
from conjugate.evaluate.result import Baseline, EvalResult, Metrics, Verdict, VerdictKind
from conjugate.evaluate.rounds import checked_run, round_inputs
from conjugate.evaluate.session import EvaluationSession
from conjugate.models import make_round_inputs
from conjugate.plan import load_plan, validate_plan
from conjugate.workload import load_workload

ROOT = Path(__file__).resolve().parents[1]
TINY = load_workload(ROOT / "examples" / "tiny.toml")
PROFILE = load_profile("analytical")
SEQUENTIAL = load_plan(ROOT / "plans" / "sequential.json")
QUICK = validate_plan({"schema": "conjugate.plan/2"})  # the default tiles: checked some 3x faster than shipped


@pytest.fixture(scope="module")
def unchecked(tmp_path_factory) -> str:
    """The shipped analytical profile without the interpreter's numerical check (modeled only): a quick
    evaluation where a test asserts nothing the check decides."""
    path = tmp_path_factory.mktemp("profile") / "analytical.toml"
    shipped = (ROOT / "evaluators" / "analytical.toml").read_text()
    path.write_text(re.sub(r"(?m)^max_params = .*$", "max_params = 0", shipped))
    return str(path)


def test_eval_result_round_trip_and_checks():
    metrics = Metrics(1.0, 0.5, 2.0, 100.0, 3, "NVIDIA H200", 132, {"sequential": Baseline("ok", 2.0, modeled=True)},
                      {"sequential": 2.0})
    r = EvalResult("abc", "tiny", "analytical", "timing", "ok", True, metrics=metrics)
    assert EvalResult.from_dict(json.loads(json.dumps(r.to_dict()))) == r and r.ok
    with pytest.raises(ValueError):
        EvalResult("abc", "tiny", "analytical", "linking", "ok", True)


@pytest.mark.parametrize("text,expected", [
    ('name = "x"\nkind = "analytical"\ntime_limit_s = 1\ncolour = 1\n', "unknown field 'colour'"),
    ('name = "x"\nkind = "quantum"\n', "field 'kind' is 'quantum'"),
    ("name = \n", "malformed TOML"),
])
def test_bad_profiles(tmp_path, text, expected):
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(ProfileError, match=expected):
        load_profile(path)


def test_bad_profile_values(tmp_path):
    shipped = (ROOT / "evaluators" / "analytical.toml").read_text()
    for key, line, expected in (("gemm", "gemm = 1.5", "model.efficiency.gemm"),
                                ("sms", 'sms = "many"', "'sms' should be int"),
                                ("max_params", "", "missing field 'max_params'"),
                                ("elementwise", "elementwise = 0.1\nsimd = 0.5", "unknown field 'model.efficiency.simd'")):
        path = tmp_path / "p.toml"
        changed = re.sub(rf"^{key} = .*$", line, shipped, flags=re.M)
        assert changed != shipped
        path.write_text(changed)
        with pytest.raises(ProfileError, match=expected):
            load_profile(path)
    with pytest.raises(ProfileError, match="no evaluator profile named 'nope'; known: analytical"):
        load_profile("nope")


def test_analytical_model_shapes():
    model = AnalyticalModel(PROFILE.model)
    slots = model.slots
    full, spill = PartCost("gemm", 10**8, 0, slots), PartCost("gemm", 10**8, 0, slots + 1)
    assert model.part_us(spill) > 1.9 * model.part_us(full)  # a second, nearly empty wave
    assert model.part_us(PartCost("gemm", 2 * 10**8, 0, slots)) > model.part_us(full)
    assert model.part_us(PartCost("gemm", 10, 10**12, slots)) > 1000  # compute-bound
    # a target part one wave short, with a small draft part beside it: modeled as a gain
    target, draft = PartCost("gemm", 5 * 10**7, 0, slots // 2), PartCost("attn", 5 * 10**6, 0, slots // 4)
    shared = model.launch_us([target, draft])
    assert shared < model.launch_us([target]) + model.launch_us([draft])


def test_pipeline_checks_and_models_the_tiny_round(tmp_path):
    r = evaluate(SEQUENTIAL, TINY, PROFILE, cache_dir=tmp_path)
    assert r.ok and r.stage == "timing" and r.modeled and r.checks["ok"] is True
    assert r.metrics.latency_ms > r.metrics.floor_ms > 0
    assert (r.metrics.device, r.metrics.sms) == (PROFILE.model.gpu, PROFILE.model.sms)
    assert set(r.metrics.baselines) == {"sequential", "streams"} and r.metrics.baselines["sequential"].modeled
    assert r.feedback and Path(r.artifacts["kernels"]).is_dir()
    inter = evaluate(load_plan(ROOT / "plans" / "interleave.json"), TINY, PROFILE, cache_dir=tmp_path)
    assert inter.ok and inter.verdicts and all(v.modeled and len(v.parts) == 2 for v in inter.verdicts)
    assert {v.verdict for v in inter.verdicts} <= set(VerdictKind)
    assert EvalResult.from_dict(json.loads(json.dumps(inter.to_dict()))) == inter


def test_pipeline_stops_at_the_failing_stage(tmp_path, monkeypatch):
    bad = evaluate({"schema": "conjugate.plan/2", "cross": {"alignment": "diagonal"}}, TINY, PROFILE,
                   cache_dir=tmp_path)
    assert (bad.stage, bad.status) == ("validate", "invalid") and "$.cross.alignment" in bad.error
    assert any(e.startswith("$.cross.alignment") for e in bad.plan_errors) and not bad.feedback
    huge = {"schema": "conjugate.plan/2", "target": {"tiles": {"down": {"BLOCK_M": 256, "BLOCK_N": 512,
                                                                       "BLOCK_K": 512}}}}
    failed = evaluate(huge, TINY, PROFILE, cache_dir=tmp_path)
    assert (failed.stage, failed.status) == ("compile", "compile_error")
    assert [p.label for p in failed.compile_failure.failed] == ["t.l0.down"]
    assert "shared memory" in failed.compile_failure.reason and not failed.plan_errors

    outputs = CompiledRound.outputs

    def corrupted(self):
        out = outputs(self)
        out.target_tokens[0, 0] = (out.target_tokens[0, 0] + 1) % TINY.target.vocab_size
        return out

    monkeypatch.setattr(CompiledRound, "outputs", corrupted)
    wrong = evaluate(QUICK, TINY, PROFILE, cache_dir=tmp_path)
    assert (wrong.stage, wrong.status) == ("correctness", "incorrect") and "target token [0, 0]" in wrong.error
    assert wrong.feedback and not wrong.metrics


def test_pipeline_never_raises(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("model exploded")

    monkeypatch.setattr(modeled, "model_round", broken)
    r = evaluate(QUICK, TINY, PROFILE, cache_dir=tmp_path)
    assert (r.stage, r.status) == ("timing", "error") and "model exploded" in r.error


def test_a_session_prepares_each_workload_once_and_keeps_its_baselines(tmp_path, monkeypatch):
    prepared, obtained = [], []
    prepare, baselines = modeled.ModeledHarness.prepare, modeled.ModeledHarness.baselines
    monkeypatch.setattr(modeled.ModeledHarness, "prepare", lambda self, w: prepared.append(w.name) or prepare(self, w))
    monkeypatch.setattr(modeled.ModeledHarness, "baselines",
                        lambda self, s, names: obtained.append(1) or baselines(self, s, names))
    session = EvaluationSession()
    first = evaluate(QUICK, TINY, PROFILE, cache_dir=tmp_path, session=session)
    again = evaluate(QUICK, TINY, PROFILE, cache_dir=tmp_path, session=session)
    assert first.ok and again.ok and (len(prepared), len(obtained)) == (1, 1)
    assert first.checks["ok"] and again.checks["ok"]  # checked numerically, the second on the kept setup
    assert again.metrics.baselines == first.metrics.baselines
    evaluate(QUICK, TINY, PROFILE, cache_dir=tmp_path, session=session, refresh_baselines=True)
    assert (len(prepared), len(obtained)) == (1, 2)
    evaluate(QUICK, TINY, replace(PROFILE, max_check_params=0), cache_dir=tmp_path, session=session)
    assert (len(prepared), len(obtained)) == (2, 3)  # another profile: the workload prepared anew
    evaluate(QUICK, TINY, PROFILE, cache_dir=tmp_path)  # no session: a fresh one
    assert len(prepared) == 3


def test_round_inputs_are_the_workloads(tmp_path):
    draft, target = TINY.weights("draft"), TINY.weights("target")
    ours = round_inputs(TINY, draft, target, seed=5)
    theirs = make_round_inputs(draft, target, k=TINY.k, draft_batch=TINY.draft_batch, target_batch=TINY.target_batch,
                               context=TINY.context, seed=5, kv_init=TINY.kv_init)
    assert torch.equal(ours.verify_tokens, theirs.verify_tokens)
    assert torch.equal(ours.draft_cache.k, theirs.draft_cache.k)
    assert torch.equal(round_inputs(TINY, draft, target).verify_tokens,
                       make_round_inputs(draft, target, k=TINY.k, draft_batch=TINY.draft_batch,
                                         target_batch=TINY.target_batch, context=TINY.context,
                                         seed=TINY.seed).verify_tokens)


def test_a_checked_run_never_checks_stale_outputs(tmp_path, monkeypatch):
    from conjugate.compiler.round import compile_round

    draft, target = TINY.weights("draft"), TINY.weights("target")
    inputs = round_inputs(TINY, draft, target)
    compiled = compile_round(QUICK, TINY, draft, target, cache_dir=tmp_path)
    check = ReferenceChecker(draft, target, inputs, TINY.dtype)
    assert checked_run(compiled, inputs, check).ok
    monkeypatch.setattr(CompiledRound, "run_eager", lambda self: None)  # a round that writes nothing
    stale = checked_run(compiled, inputs, check)
    assert not stale.ok and any("token" in p for p in stale.problems)


def test_modeled_verdicts_follow_the_one_rule():
    parts = ()
    for shared, kind in ((9.7, "gain"), (10.0, "neutral"), (10.3, "interference")):
        v = LaunchEstimate(3, "main", shared, (6.0, 4.0)).verdict(parts)
        assert (v.launch, v.verdict, v.modeled, v.separate_us, v.parts_us) == (3, kind, True, 10.0, (6.0, 4.0))


def test_verdicts_also_compare_with_the_parts_on_two_streams(tmp_path):
    """A shared launch is judged against its parts back to back and against them overlapped on
    streams of their own (modeled: the longest plus the share of the rest two streams do not hide)."""
    model = AnalyticalModel(PROFILE.model)
    overlap = model.overlap_us((6.0, 4.0))
    assert overlap == pytest.approx(6.0 + (1 - PROFILE.model.streams_overlap) * 4.0)
    v = LaunchEstimate(3, "main", 8.0, (6.0, 4.0), overlap).verdict(())
    assert v.verdict is VerdictKind.GAIN and v.overlap_us == round(overlap, 2)
    assert v.overlap_gain_percent == round((overlap - 8.0) / overlap * 100, 1)
    assert v.overlap_verdict is VerdictKind.of(v.overlap_gain_percent)
    assert Verdict.from_dict(json.loads(json.dumps(v.to_dict()))) == v
    assert LaunchEstimate(3, "main", 8.0, (6.0, 4.0)).verdict(()).overlap_verdict is None
    old = {k: x for k, x in v.to_dict().items() if not k.startswith("overlap")}  # stored before overlap existed
    assert Verdict.from_dict(old).overlap_us is None
    r = evaluate(load_plan(ROOT / "plans" / "interleave.json"), load_workload(ROOT / "examples" / "llama-1b-8b-b8.toml"), PROFILE, cache_dir=tmp_path)
    assert r.verdicts and all(x.overlap_us and x.overlap_verdict is not None for x in r.verdicts)
    assert all(x.overlap_us <= x.separate_us for x in r.verdicts)


def test_large_rounds_compile_on_shapes_and_skip_the_numerical_check(tmp_path):
    big = load_workload(ROOT / "examples" / "qwen25-05b-7b-b8.toml")
    r = evaluate(SEQUENTIAL, big, PROFILE, cache_dir=tmp_path)
    assert r.ok and "skipped" in r.checks and r.metrics.floor_ratio > 1
    small_limit = replace(PROFILE, max_check_params=0)
    assert "skipped" in evaluate(SEQUENTIAL, TINY, small_limit, cache_dir=tmp_path).checks


def test_bench_command(tmp_path, capsys, unchecked, shared_worker):
    """Every shipped plan beside the baselines, modeled only (bench with its numerical check: the next test;
    the shipped plans checked on this workload: the pipeline test and the next)."""
    out = tmp_path / "bench.json"
    assert main(["bench", str(ROOT / "examples" / "tiny.toml"), "--evaluator", unchecked, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "MODELED" in printed and "interleave" in printed
    data = json.loads(out.read_text())
    assert data["modeled"] is True and [p["plan"] for p in data["plans"]] == ["sequential", "streams", "interleave"]
    speedups = [p["result"]["metrics"]["speedups"] for p in data["plans"]]
    assert speedups[0]["sequential"] == pytest.approx(1.0) and speedups[1]["streams"] == pytest.approx(1.0)
    assert "conventional" not in speedups[2] and "GPU only" in printed  # the conventional baseline needs a GPU
    assert main(["bench", str(ROOT / "examples" / "tiny.toml"), "--evaluator", "nope"]) == 2


def test_bench_takes_shipped_plans_by_name(capsys, unchecked, shared_worker):
    assert main(["bench", str(ROOT / "examples" / "tiny.toml"), "--plan", "streams", "--evaluator", unchecked]) == 0
    printed = capsys.readouterr().out
    assert "streams" in printed and "interleave" not in printed


def test_bench_names_a_plan_file_whose_plan_keeps_a_seed_name(tmp_path, capsys, unchecked, shared_worker):
    best = tmp_path / "best-of-search.json"
    best.write_text((ROOT / "plans" / "streams.json").read_text())  # an exported best plan keeps its seed's name
    out = tmp_path / "bench.json"
    assert main(["bench", str(ROOT / "examples" / "tiny.toml"), "--plan", "streams", "--plan", str(best),
                 "--evaluator", unchecked, "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["plans"]
    assert [(p["plan"], p["label"]) for p in rows] == [("streams", "streams"), ("streams", "best-of-search (streams)")]
    assert "best-of-search (streams)" in capsys.readouterr().out


def test_calibration_fits_known_constants(tmp_path):
    from conjugate.evaluate.analytical import model_round
    from conjugate.evaluate.calibrate import fit, loss, make_case

    truth = replace(PROFILE.model, launch_overhead_us=4.0,
                    efficiency={"gemm": 0.5, "attn": 0.3, "elementwise": 0.05})
    cases = []
    for workload in (TINY, load_workload(ROOT / "examples" / "qwen25-05b-7b-b8.toml")):
        for name in ("sequential", "streams", "interleave"):
            case = make_case(load_plan(ROOT / "plans" / f"{name}.json"), workload, 1.0, tmp_path)
            measured = model_round(AnalyticalModel(truth), case.graph, case.schedule, case.programs)[0]
            cases.append(replace(case, measured_ms=measured))
    start = replace(PROFILE.model, launch_overhead_us=1.0, efficiency={"gemm": 0.9, "attn": 0.9, "elementwise": 0.5})
    fitted = fit(start, cases)
    assert loss(fitted, cases) < loss(start, cases) / 20


def test_calibrate_command(tmp_path, capsys):
    measured = tmp_path / "measured.json"
    measured.write_text(json.dumps({"workloads": [{"workload": "tiny", "plans": [
        {"plan": "sequential", "median_ms": 0.30}, {"plan": "streams", "median_ms": 0.20},
        {"plan": "interleave", "median_ms": 0.25}]}]}))
    fitted = tmp_path / "fitted.toml"
    assert main(["calibrate", "--from", str(measured), "--out", str(fitted)]) == 0
    assert "fitted 3 rounds" in capsys.readouterr().out
    profile = load_profile(fitted)
    assert profile.kind == "analytical" and str(measured) in fitted.read_text()
    (tmp_path / "bad.json").write_text('{"rows": []}')
    assert main(["calibrate", "--from", str(tmp_path / "bad.json"), "--out", str(fitted)]) == 2
    assert "not a measured-rounds file" in capsys.readouterr().err


def test_calibrate_refuses_a_gpu_profile(tmp_path, capsys):
    """A GPU profile has no analytical constants to fit: one line naming --evaluator, not a traceback."""
    measured = tmp_path / "measured.json"
    measured.write_text(json.dumps({"workloads": [{"workload": "tiny", "plans": [
        {"plan": "sequential", "median_ms": 0.30}]}]}))
    assert main(["calibrate", "--from", str(measured), "--evaluator", "h200", "--out", str(tmp_path / "f.toml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --evaluator: profile 'h200'") and "no [model] table" in err
    assert err.count("\n") == 1 and not (tmp_path / "f.toml").exists()


def test_profile_dict_round_trip():
    from conjugate.evaluate.evaluators import EvaluatorProfile

    changed = replace(PROFILE, max_check_params=7)
    assert EvaluatorProfile.from_dict(json.loads(json.dumps(changed.to_dict()))) == changed
