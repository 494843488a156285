"""The measured (GPU) evaluator's pieces that run without a GPU: its profile, verdicts, tolerances,
the reference cache, the conventional baseline's reloads, `bench` with measured rows, rank
correlation, and a gpu evaluation on a CPU machine failing as data."""
from __future__ import annotations

import json
import math
import re
import weakref
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import conjugate  # noqa: F401  (selects the interpreter before triton is imported)
from conjugate.cli import main
from conjugate.evaluate import correctness
from conjugate.evaluate.calibrate import ranks, spearman
from conjugate.compiler.buffers import PreparedWeights
from conjugate.evaluate.baselines.conventional import ConventionalRound, Variant
from conjugate.evaluate.correctness import TOLERANCES, ReferenceChecker, Tolerance, check_round, compare_rounds, \
    tolerance_for
from conjugate.compiler.feedback import PartRef
from conjugate.evaluate.pipeline import evaluate
from conjugate.evaluate.evaluators import EvaluatorProfile, ProfileError, TimingSettings, load_profile
from conjugate.evaluate.result import VERDICT_THRESHOLD_PERCENT, Baseline, EvalResult, Metrics, Verdict, VerdictKind
from conjugate.evaluate.rounds import round_inputs
from conjugate.evaluate.timing import Timing
from conjugate.evaluate.worker import IsolatedEvaluator
from conjugate.models import reference_round
from conjugate.roles import Model
from conjugate.plan import load_plan
from conjugate.workload import load_workload
from test_round import _round

ROOT = Path(__file__).resolve().parents[1]
TINY_PATH = ROOT / "examples" / "tiny.toml"
TINY = load_workload(TINY_PATH)
H200_TOML = (ROOT / "evaluators" / "h200.toml").read_text()
CHEAP = {"schema": "conjugate.plan/1"}


# --- profiles -------------------------------------------------------------------------------------

def test_the_h200_profile_loads_and_round_trips():
    p = load_profile("h200")
    assert (p.kind, p.model, p.gpu) == ("gpu", None, "")
    assert p.timing == TimingSettings(replays=200, warmup=20, verdict_calls=10, replays_within_pct=0.2,
                                      ledger_replays=3, baselines=("conventional", "sequential", "streams"))
    assert p.timing.reuse_verdicts  # the default
    assert p.tolerances == {"bf16": {"rel": 0.05, "tie_margin": 0.2}}
    assert p.max_check_params == 10**11 and p.source.endswith("h200.toml")
    assert EvaluatorProfile.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    assert load_profile(ROOT / "evaluators" / "h200.toml") == p


def _edited(tmp_path, old: str, new: str) -> Path:
    text = H200_TOML.replace(old, new, 1)
    assert text != H200_TOML, old
    path = tmp_path / "gpu.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("old,new,expected", [
    ("[timing]\n", "[timing]\ncolour = 1\n", "unknown field 'timing.colour'"),
    ("replays = 200", "replays = 0", "[timing] replays and verdict_calls should be at least 1"),
    ("verdict_calls = 10", "verdict_calls = 0", "[timing] replays and verdict_calls should be at least 1"),
    ("warmup = 20", "warmup = -1", "field 'warmup' should not be negative"),
    ("replays = 200", "replays = 2.5", "field 'replays' should be int"),
    ('"streams"]', '"vllm"]', "field 'timing.baselines' should be a list drawn from"),
    ('baselines = ["conventional", "sequential", "streams"]', 'baselines = "streams"', "field 'timing.baselines'"),
    ("[correctness.bf16]", "[correctness.int8]", "unknown field 'correctness.int8'"),
    ("rel = 0.05\n", "", "[correctness.bf16]: missing field 'rel'"),
    ("tie_margin = 0.2", 'tie_margin = "wide"', "[correctness.bf16]: field 'tie_margin' should be float"),
    ("max_params = 100000000000", "", "[correctness]: missing field 'max_params'"),
    ('baselines = ["conventional", "sequential", "streams"]', 'baselines = [["streams"]]', "field 'timing.baselines'"),
    ("tie_margin = 0.2", "tie_margin = 0.2\natol = 3", "unknown field 'correctness.bf16.atol'"),
    (H200_TOML[H200_TOML.index("[timing]"):H200_TOML.index("[correctness]")], "timing = 3\n",
     "field 'timing' should be a table"),
    ("replays_within_pct = 0.2", "replays_within_pct = -1", "field 'replays_within_pct' should not be negative"),
    ("replays_within_pct = 0.2", "replays_within_pct = 150", "field 'replays_within_pct' is 150"),
    ("replays_within_pct = 0.2", 'replays_within_pct = "tight"', "field 'replays_within_pct' should be float"),
    ("warmup = 20", "warmup = 20\nreuse_verdicts = 1", "field 'timing.reuse_verdicts' should be true or false"),
    ("warmup = 20", "warmup = 20\nbaselines_apart = \"yes\"", "field 'timing.baselines_apart' should be true or false"),
    ("ledger_replays = 3", "ledger_replays = 2.0", "field 'ledger_replays' should be int"),
    ("ledger_replays = 3", "ledger_replays = 5000", "field 'ledger_replays' is 5000"),
])
def test_bad_gpu_profiles_name_the_file_and_field(tmp_path, old, new, expected):
    path = _edited(tmp_path, old, new)
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and expected in message and "\n" not in message


def test_gpu_profile_tolerance_for_another_dtype(tmp_path):
    path = _edited(tmp_path, "[correctness.bf16]", "[correctness.fp16]")
    assert load_profile(path).tolerances == {"fp16": {"rel": 0.05, "tie_margin": 0.2}}


def test_analytical_profiles_still_need_their_model(tmp_path):
    shipped = (ROOT / "evaluators" / "analytical.toml").read_text()
    path = tmp_path / "a.toml"
    path.write_text(shipped[:shipped.index("[model]")])
    with pytest.raises(ProfileError, match=re.escape(f"{path}: [model]: missing field 'gpu'")):
        load_profile(path)
    path.write_text(shipped.replace('kind = "analytical"', 'kind = "gpu"'))  # a gpu profile may keep one
    assert load_profile(path).model.gpu == "NVIDIA H200"


# --- verdicts, tolerances, timing -----------------------------------------------------------------

PARTS = (PartRef(Model.TARGET, "qkv", ("t.l0.qkv",), 64), PartRef(Model.DRAFT, "attn", ("d.s0.l0.attn",), 8))


@pytest.mark.parametrize("shared,expected", [
    (9.79, "gain"), (9.8, "neutral"), (10.0, "neutral"), (10.2, "neutral"), (10.21, "interference")])
def test_verdict_thresholds(shared, expected):
    assert VERDICT_THRESHOLD_PERCENT == 2.0
    v = Verdict.judge(4, PARTS, shared, (6.0, 4.0), modeled=False)  # separately: 10 us
    assert v.verdict == expected and v.parts == PARTS and v.modeled is False
    assert v.separate_us == 10.0 and v.gain_percent == round((10.0 - shared) / 10.0 * 100, 1)
    assert v.verdict is VerdictKind.of((10.0 - shared) / 10.0 * 100)


def test_verdict_rounds_its_numbers():
    v = Verdict.judge(4, PARTS, 7.123456, (4.56789, 3.33333), modeled=False, launches=(4, 9))
    assert v == Verdict(4, VerdictKind.GAIN, 7.12, 7.9, 9.8, PARTS, False, (4.57, 3.33), (4, 9))
    assert Verdict.from_dict(json.loads(json.dumps(v.to_dict()))) == v


def test_tolerance_for_uses_the_profile_override():
    assert tolerance_for("bf16") == TOLERANCES["bf16"] == tolerance_for("bf16", {})
    overrides = {"bf16": {"rel": 0.1, "tie_margin": 0.3}}
    assert tolerance_for("bf16", overrides) == Tolerance(0.1, 0.3)
    assert tolerance_for("fp16", overrides) == TOLERANCES["fp16"]  # other dtypes keep their defaults
    assert tolerance_for("bf16", load_profile("h200").tolerances) == Tolerance(0.05, 0.2)


def test_timing_to_dict():
    assert Timing(1.5, 1.4, 1.7, 200).to_dict() == {"median_ms": 1.5, "p20_ms": 1.4, "p80_ms": 1.7, "replays": 200}


def test_spearman_on_known_vectors():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [0.4, 0.3, 0.2, 0.1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3, 4], [2, 1, 4, 3]) == pytest.approx(0.6)  # 1 - 6 * 4 / (4 * 15)
    assert ranks([3.0, 1.0, 2.0, 1.0]) == [3.0, 0.5, 2.0, 0.5]  # ties share their mean rank
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(math.sqrt(0.9))
    assert math.isnan(spearman([5, 5, 5], [1, 2, 3]))


# --- the reference cache and the conventional baseline's reloads -----------------------------------

def _other_inputs(rnd, seed: int):
    return round_inputs(rnd.workload, rnd.draft, rnd.target, seed)


def test_reference_checker_computes_each_reference_once(monkeypatch):
    rnd = _round("llama")
    calls = []

    def counted(*args, **kwargs):
        calls.append(args[3] if len(args) > 3 else kwargs.get("forced"))
        return reference_round(*args, **kwargs)

    monkeypatch.setattr(correctness, "reference_round", counted)
    check = ReferenceChecker(rnd.draft, rnd.target, rnd.inputs, "fp32")
    first = check(rnd.ref)
    assert first.ok and len(calls) == 1
    assert check(rnd.ref).to_dict() == first.to_dict() and len(calls) == 1  # cached
    flipped = replace(rnd.ref, draft_tokens=rnd.ref.draft_tokens.flip(0))  # other draft tokens: another reference
    assert not torch.equal(flipped.draft_tokens, rnd.ref.draft_tokens)
    other = check(flipped)
    assert len(calls) == 2 and not other.ok
    assert check(flipped).to_dict() == other.to_dict() and len(calls) == 2
    n = len(calls)
    assert check_round(rnd.draft, rnd.target, rnd.inputs, flipped, "fp32").to_dict() == other.to_dict()
    assert check_round(rnd.draft, rnd.target, rnd.inputs, rnd.ref, "fp32").to_dict() == first.to_dict()
    assert len(calls) == n + 2  # check_round itself does not cache


def test_conventional_round_reload_computes_the_new_inputs(tmp_path):
    rnd = _round("qwen2")
    conventional = ConventionalRound(rnd.workload, PreparedWeights(rnd.draft), PreparedWeights(rnd.target),
                                     Variant("eager", "sdpa"), Variant("eager", "grouped"))
    conventional.load(rnd.inputs)
    conventional.run()
    assert compare_rounds(rnd.ref, conventional.outputs(), "fp32", rnd.workload.context).ok
    fresh = _other_inputs(rnd, rnd.workload.seed + 1)
    fresh_ref = reference_round(rnd.draft, rnd.target, fresh)
    assert not torch.equal(fresh_ref.target_logits, rnd.ref.target_logits)
    conventional.load(fresh)
    conventional.run()
    report = compare_rounds(fresh_ref, conventional.outputs(), "fp32", rnd.workload.context)
    assert report.ok and report.near_ties == 0, report.problems
    conventional.load(rnd.inputs)  # and back: the first inputs' caches, not what the last round wrote
    conventional.run()
    assert compare_rounds(rnd.ref, conventional.outputs(), "fp32", rnd.workload.context).ok


# --- a gpu evaluation without a GPU ----------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the failure on a machine without CUDA")
def test_a_gpu_evaluation_without_cuda_is_an_error_result(tmp_path):
    r = evaluate(load_plan(ROOT / "plans" / "sequential.json"), TINY, load_profile("h200"), cache_dir=tmp_path)
    assert (r.stage, r.status, r.modeled, r.evaluator) == ("setup", "error", False, "h200")
    assert r.error and not r.metrics


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the failure on a machine without CUDA")
def test_an_error_retires_the_worker(tmp_path):
    with IsolatedEvaluator(load_profile("h200"), time_limit_s=120, cache_dir=tmp_path) as isolated:
        failed = isolated.evaluate(CHEAP, TINY_PATH)
        assert (failed.stage, failed.status) == ("setup", "error") and isolated.restarts == 1
        first_worker = isolated._worker
        assert first_worker is None
        isolated.profile = replace(load_profile("analytical"), max_check_params=0)  # modeled only: quick
        after = isolated.evaluate(CHEAP, TINY_PATH)  # a fresh worker
        assert after.ok and after.modeled and isolated.restarts == 1


# --- the measured flow on this CPU, with the GPU's timing faked --------------------------------------

@pytest.fixture
def fake_gpu(monkeypatch):
    """The measured harness's own check (eager, then 'replayed': eager here), with a fake device,
    fake rates, fake timing and fake baselines, and no warm-up (on the CPU a third run of the round
    under the interpreter, its outputs never read); returns the log of timing and baseline calls."""
    from types import SimpleNamespace

    from conjugate.compiler.buffers import PreparedWeights
    from conjugate.compiler.round import CompiledRound
    from conjugate.evaluate.harness import Timed
    from conjugate.evaluate.measured import MeasuredHarness
    from conjugate.evaluate.session import EvaluationSession, RoundSetup
    from conjugate.graph import build_graph

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(EvaluationSession, "device_rates",
                        lambda self, device: {"copy_bandwidth_gbs": 4000.0, "matmul_tflops": 800.0})
    log = {"time": [], "baselines": 0, "broken": False, "asked": []}

    def prepare(self, w):
        draft, target = w.weights("draft"), w.weights("target")
        inputs = round_inputs(w, draft, target)
        return RoundSetup(w, build_graph(w), (PreparedWeights(draft), PreparedWeights(target)), inputs,
                          round_inputs(w, draft, target, w.seed + 1), tolerance_checker(draft, target, inputs, w))

    def timed(self, compiled, setup):
        log["time"].append(weakref.ref(compiled))
        return Timed(0.5, (), len(compiled.schedule.launches), 0.49, 0.52, 200)

    def baselines(self, setup):
        assert all(ref() is None for ref in log["time"])  # measured before any plan is built and timed
        log["baselines"] += 1
        if log["broken"]:
            raise RuntimeError("out of memory (simulated)")
        return {"conventional": Baseline("ok", 1.0), "sequential": Baseline("incorrect", error="draft token [0, 1]"),
                "streams": Baseline("ok", 0.75)}

    monkeypatch.setattr(MeasuredHarness, "prepare", prepare)
    monkeypatch.setattr(MeasuredHarness, "ready", lambda self, compiled, setup: None)  # warm-up: GPU only
    monkeypatch.setattr(CompiledRound, "warmup", lambda self: None)  # also the one before the replayed check
    monkeypatch.setattr(MeasuredHarness, "time", timed)
    def measured(setup, profile, cache_dir):
        log["asked"].append(profile.timing.baselines)
        return {name: b for name, b in baselines(None, setup).items() if name in profile.timing.baselines}

    monkeypatch.setattr("conjugate.evaluate.measured.measure_baselines", measured)
    return log


def tolerance_checker(draft, target, inputs, w):
    return ReferenceChecker(draft, target, inputs, w.dtype, tolerance_for(w.dtype, load_profile("h200").tolerances))


def test_the_measured_flow_measures_the_baselines_once_then_checks_twice_and_times(fake_gpu, tmp_path):
    from conjugate.evaluate.session import EvaluationSession

    session, profile, heard = EvaluationSession(), load_profile("h200"), []
    r = evaluate(CHEAP, TINY, profile, cache_dir=tmp_path, on_stage=heard.append, session=session)
    assert r.ok and not r.modeled and heard == ["setup", "validate", "compile", "correctness", "timing"]
    assert r.checks["ok"] and r.checks["eager"]["ok"] and r.checks["replayed"]["ok"]
    m = r.metrics
    assert (m.device, m.sms, m.latency_ms, m.p20_ms, m.replays) == ("NVIDIA H200", 132, 0.5, 0.49, 200)
    assert m.speedups == {"conventional": 2.0, "streams": 1.5} and m.baselines["sequential"].status == "incorrect"
    assert m.copy_bandwidth_gbs == 4000.0 and m.floor_ratio == pytest.approx(0.5 / m.floor_ms)
    assert fake_gpu["baselines"] == 1
    fake_gpu["broken"] = True
    failed = evaluate(CHEAP, TINY, profile, cache_dir=tmp_path, refresh_baselines=True, session=session)
    assert failed.ok and failed.metrics.speedups == {}  # the plan's own measurement stands
    assert {b.status for b in failed.metrics.baselines.values()} == {"error"}
    assert "out of memory (simulated)" in failed.metrics.baselines["streams"].error
    again = evaluate(CHEAP, TINY, profile, cache_dir=tmp_path, session=session)
    assert fake_gpu["baselines"] == 2 and again.metrics.baselines == failed.metrics.baselines  # not retried
    assert EvalResult.from_dict(json.loads(json.dumps(again.to_dict()))) == again


class _InProcess:
    """IsolatedEvaluator's interface in this process, one session, carrying what `carried` holds."""

    def __init__(self, profile, cache_dir):
        from conjugate.evaluate.session import EvaluationSession

        self.profile, self.cache_dir, self.session, self.carried = profile, cache_dir, EvaluationSession(), None

    def evaluate(self, plan, workload_path, **kwargs):
        return evaluate(plan, load_workload(workload_path), self.profile, cache_dir=self.cache_dir,
                        session=self.session, carried_baselines=self.carried)


def test_a_resumed_run_carries_the_torch_baselines_it_measured(fake_gpu, tmp_path, monkeypatch):
    from conjugate.agents import make_proposer
    from conjugate.search.run import Search
    from conjugate.search.runs import baselines_to_carry, eval_key, run_evaluator_id
    from conjugate.search.settings import SearchSettings
    from conjugate.search.store import NodeStatus, Store, owner_id

    profile = load_profile("h200")
    with Store.open(tmp_path / "runs.db", create=True) as store:
        search = Search.start(store, "carry", TINY, str(TINY_PATH), _InProcess(profile, tmp_path),
                              make_proposer("heuristic"), SearchSettings(budget=2), 0)
        run = store.run(search.run_id)
        assert baselines_to_carry(store, run.id, TINY, run_evaluator_id(run)) is None  # nothing measured yet
        first, second = store.nodes(run.id)[:2]
        for node, conventional in ((first, 0.5), (second, 0.6)):  # two evaluations as an earlier process stored them
            key = eval_key(node.plan_hash, TINY, run_evaluator_id(run))
            assert store.claim_evaluation(key, node.plan_hash, run.id, owner_id(), 60.0)
            result = _measured(node.plan["name"], 0.25)
            result.metrics.baselines["conventional"] = Baseline("ok", conventional)
            store.finish_evaluation(key, result, 1.0)
            store.settle(node.id, NodeStatus.EVALUATED, [node.id], 1.0)
        carried = json.loads(json.dumps(baselines_to_carry(store, run.id, TINY, run_evaluator_id(run))))
    assert carried["device"] == "NVIDIA H200" and carried["baselines"]["conventional"]["latency_ms"] == 0.6
    assert set(carried["baselines"]) == {"conventional", "streams"}  # the latest evaluation's; never sequential
    assert re.fullmatch(rf"run {run.id}, evaluation of node {second.id}, \d{{4}}-\d\d-\d\d \d\d:\d\d",
                        carried["from"])
    resumed = _InProcess(profile, tmp_path)  # a fresh process: nothing measured yet
    resumed.carried = carried
    states = []
    monkeypatch.setattr("conjugate.evaluate.measured.enter_torch_graph_state", states.append)
    r = resumed.evaluate(CHEAP, TINY_PATH)
    assert fake_gpu["asked"] == [("sequential",)]  # only what was not carried is measured
    assert states == [torch.device("cuda")]  # its plans timed as beside the baselines it did not build
    assert r.ok and r.metrics.speedups == pytest.approx({"conventional": 0.6 / 0.5, "streams": 0.3 / 0.5})
    assert {n: b.carried for n, b in r.metrics.baselines.items()} == {
        "conventional": carried["from"], "streams": carried["from"], "sequential": ""}
    assert EvalResult.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    evaluate(CHEAP, TINY, profile, cache_dir=tmp_path, session=resumed.session, carried_baselines=carried,
             refresh_baselines=True)
    assert fake_gpu["asked"][-1] == ("conventional", "sequential", "streams")  # asked afresh: all measured


def test_baselines_are_carried_only_for_their_workload_and_gpu():
    from conjugate.evaluate.baselines.measure import carried_baselines

    ok = {"status": "ok", "latency_ms": 1.0, "modeled": False}
    carried = {"device": "NVIDIA H200", "from": "run 1", "workload": json.loads(json.dumps(TINY.to_dict())),
               "baselines": {"conventional": ok, "streams": ok | {"status": "incorrect"}, "sequential": ok}}
    wanted = ("conventional", "sequential", "streams")
    kept = carried_baselines(carried, "NVIDIA H200", TINY, wanted)
    assert list(kept) == ["conventional"] and kept["conventional"].carried == "run 1"  # never sequential: cheap
    assert carried_baselines(carried, "NVIDIA H100 80GB HBM3", TINY, wanted) == {}
    other = load_workload(ROOT / "examples" / "qwen25-05b-7b-b8.toml")
    assert carried_baselines(carried, "NVIDIA H200", other, wanted) == {}
    assert carried_baselines(carried, "NVIDIA H200", TINY, ("sequential",)) == {}
    again = carried | {"from": "run 2", "baselines": {"conventional": kept["conventional"].to_dict()}}
    assert carried_baselines(again, "NVIDIA H200", TINY, wanted)["conventional"].carried == "run 1"  # first seen


def test_carry_baselines_is_for_a_resumed_run_only(tmp_path, capsys):
    assert main(["search", str(TINY_PATH), "--db", str(tmp_path / "x.db"), "--carry-baselines"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: --carry-baselines: only with --resume (a new run has measured no baselines to carry)"
    assert not (tmp_path / "x.db").exists()
    assert main(["search", str(TINY_PATH), "--db", str(tmp_path / "x.db"), "--run", "3"]) == 2  # not ignored
    assert capsys.readouterr().err.strip() == "error: --run 3: only with --resume DB (a new run gets the next id)"
    assert not (tmp_path / "x.db").exists()
    db, unchecked = tmp_path / "modeled.db", tmp_path / "analytical.toml"
    unchecked.write_text(re.sub(r"(?m)^max_params = .*$", "max_params = 0",  # modeled only: quick
                                (ROOT / "evaluators" / "analytical.toml").read_text()))
    assert main(["search", str(TINY_PATH), "--db", str(db), "--budget", "1", "--evaluator", str(unchecked)]) == 0
    capsys.readouterr()
    assert main(["search", "--resume", str(db), "--carry-baselines"]) == 0
    assert "holds no measured conventional or streams baseline to carry: measuring the baselines" in \
        capsys.readouterr().out


# --- bench with measured rows ----------------------------------------------------------------------

def _measured(plan: str, latency: float, **changes) -> EvalResult:
    baselines = {name: Baseline("ok", ms)
                 for name, ms in (("conventional", 0.5), ("sequential", 0.4), ("streams", 0.3))}
    metrics = Metrics(latency, latency / 1.8, 1.8, 4000.0, 40, "NVIDIA H200", 132, baselines,
                      {name: b.latency_ms / latency for name, b in baselines.items()}, latency * 0.98, latency * 1.03,
                      200)
    return EvalResult("h", "tiny", "h200", "timing", "ok", False, metrics=replace(metrics, **changes),
                      checks={"ok": True})


def test_bench_with_a_gpu_profile(monkeypatch, capsys, tmp_path):
    requests = []

    def fake(self, plan, workload_path, refresh_baselines=False, on_stage=None):
        requests.append((plan["name"], refresh_baselines))
        for stage in ("validate", "compile", "correctness", "timing"):
            on_stage(stage)  # the progress line follows the worker's stages
        if plan["name"] == "streams":
            return EvalResult("h", "tiny", "h200", "correctness", "incorrect", False, checks={"ok": False},
                              error="target token [0, 0]: 1, reference 2")
        return _measured(plan["name"], 0.25)

    monkeypatch.setattr(IsolatedEvaluator, "evaluate", fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # bench refuses a GPU profile without one
    out = tmp_path / "bench.json"
    # exit status 1: one plan came back incorrect (the table says which and why)
    assert main(["bench", str(TINY_PATH), "--evaluator", "h200", "--remeasure", "--json", str(out)]) == 1
    assert requests == [("sequential", True), ("streams", False), ("interleave", False)]
    printed = capsys.readouterr().out
    assert "measured on NVIDIA H200" in printed and "MODELED" not in printed
    for text in ("p20-p80", "vs conventional", "vs sequential", "vs streams", "0.245-0.258", "2.00x", "1.60x",
                 "1.20x", "incorrect at correctness"):
        assert text in printed, text
    assert "GPU only" not in printed
    data = json.loads(out.read_text())
    assert data["modeled"] is False and data["evaluator"] == "h200"
    main(["bench", str(TINY_PATH), "--evaluator", "h200"])
    assert [r for _, r in requests[3:]] == [False, False, False]  # without --remeasure: never


def test_bench_names_a_failed_baseline(monkeypatch, capsys):
    def fake(self, plan, workload_path, refresh_baselines=False, on_stage=None):
        baselines = {"conventional": Baseline("incorrect", error="target cache k: worst (1, 2)"),
                     "sequential": Baseline("ok", 0.4)}
        return _measured(plan["name"], 0.25, baselines=baselines, speedups={"sequential": 0.4 / 0.25})

    monkeypatch.setattr(IsolatedEvaluator, "evaluate", fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert main(["bench", str(TINY_PATH), "--evaluator", "h200"]) == 0
    printed = capsys.readouterr().out
    assert "baseline conventional: incorrect: target cache k: worst (1, 2)" in printed
    assert "baseline sequential" not in printed


def test_a_gpu_profile_measures_only_on_its_device(monkeypatch, tmp_path):
    assert load_profile("h200").device == "H200"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    r = evaluate(load_plan(ROOT / "plans" / "sequential.json"), TINY, load_profile("h200"), cache_dir=tmp_path)
    assert (r.stage, r.status) == ("setup", "error") and not r.metrics
    assert "field 'device' is 'H200'" in r.error and "NVIDIA H100 80GB HBM3" in r.error
    with pytest.raises(ProfileError, match="field 'device' should be str"):
        load_profile(_edited(tmp_path, 'device = "H200"', "device = 200"))


def test_the_device_is_part_of_the_evaluator_id(tmp_path):
    from conjugate.search.settings import evaluator_id

    h100 = load_profile(_edited(tmp_path, 'device = "H200"', 'device = "H100"'))
    anywhere = load_profile(_edited(tmp_path, 'device = "H200"', ""))
    ids = {evaluator_id(load_profile("h200")), evaluator_id(h100), evaluator_id(anywhere)}
    assert len(ids) == 3 and anywhere.device == ""


@pytest.mark.parametrize("wanted,device,expected", [
    ("H200", "NVIDIA H200", True), ("h200", "NVIDIA H200", True), ("H20", "NVIDIA H200", False),
    ("H100 80GB", "NVIDIA H100 80GB HBM3", True), ("", "NVIDIA H200", True), ("H200", "NVIDIA H200 NVL", True)])
def test_a_profile_device_names_whole_words(wanted, device, expected):
    from conjugate.evaluate.measured import names_device

    assert names_device(wanted, device) is expected


# --- what an evaluation's time went to, and verdict times kept between plans -----------------------

def test_a_result_says_where_its_time_went(tmp_path):
    r = evaluate(CHEAP, TINY, load_profile("analytical"), cache_dir=tmp_path)
    assert r.ok and {"setup", "baselines", "compile", "warmup", "check"} <= set(r.seconds)
    assert all(v >= 0 for v in r.seconds.values()) and sum(r.seconds.values()) <= r.wall_s + 0.01
    assert EvalResult.from_dict(json.loads(json.dumps(r.to_dict()))).seconds == r.seconds


def test_verdicts_measure_only_launches_not_measured_before(tmp_path, monkeypatch):
    """A plan whose shared launches were timed for an earlier plan of the workload reuses those times."""
    from conjugate.compiler.round import compile_round
    from conjugate.evaluate import measured

    calls = []

    def fake_time(launch, **how):
        calls.append(launch)
        if isinstance(launch, tuple):  # the parts at once (the fake `concurrently`)
            return 1000.0
        return 10.0 + len(calls)  # each measurement a new number: reuse shows as equal verdicts

    monkeypatch.setattr(measured, "time_per_call", fake_time)
    monkeypatch.setattr(measured, "concurrently", lambda fns, device: ("at once", tuple(fns)))
    monkeypatch.setattr(measured, "fork_join_us", lambda *args: 1.5)
    monkeypatch.setattr(measured, "l2_flush_bytes", lambda device: 0)
    rnd = _round("llama")
    plan = load_plan(ROOT / "plans" / "interleave.json")
    compiled = compile_round(plan, rnd.workload, rnd.draft, rnd.target, cache_dir=tmp_path)
    known: dict = {}
    first = measured.launch_verdicts(compiled, 10, known)
    measured_once = len(calls)
    assert first and measured_once == 2 * len(known) + sum(len(v[1]) for v in known.values())  # shared, overlap
    assert sum(1 for c in calls if isinstance(c, tuple)) == len(known) and all(v.overlap_us for v in first)
    assert all(v.overlap_us == 1000.0 - 1.5 for v in first)  # less the fork and join measured once
    again = compile_round(plan, rnd.workload, rnd.draft, rnd.target, cache_dir=tmp_path)  # another plan's round
    assert measured.launch_verdicts(again, 10, known) == first and len(calls) == measured_once
    assert measured.launch_verdicts(again, 10, {}) != first and len(calls) == 2 * measured_once  # nothing known


def test_replays_stop_once_the_median_is_pinned(monkeypatch):
    """Steady times stop after the first check (50 replays); noisy ones run to the cap."""
    import random

    from conjugate.evaluate import timing

    def fake_cuda(times):
        source = iter(times)

        class Event:
            def __init__(self, enable_timing=False):
                pass

            def record(self):
                pass

            def elapsed_time(self, end):
                return next(source)

        monkeypatch.setattr(timing.torch.cuda, "Event", Event)
        monkeypatch.setattr(timing.torch.cuda, "synchronize", lambda *a: None)

    rng = random.Random(0)
    calls = []
    enough = timing.median_known_within(0.1, at_least=50)
    fake_cuda([10 + rng.gauss(0, 0.01) for _ in range(1000)])  # 0.1% noise: pinned at once
    steady = timing.time_replays(lambda: calls.append(1), replays=200, warmup=5, enough=enough)
    assert steady.replays == 50 and len(calls) == 55 and steady.median_ms == pytest.approx(10, rel=1e-3)
    fake_cuda([10 + rng.gauss(0, 1.0) for _ in range(1000)])  # 10% noise: never within 0.1%
    noisy = timing.time_replays(lambda: None, replays=200, warmup=0, enough=enough)
    assert noisy.replays == 200
    fake_cuda([10.0] * 300)
    assert timing.time_replays(lambda: None, replays=120, warmup=0).replays == 120  # no `enough`: every replay
    assert not enough([10.0] * 49)  # too few to judge
