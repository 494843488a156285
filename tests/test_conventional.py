"""The conventional baseline's static-shape model steps compute the reference round, in every variant."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

import conjugate  # noqa: F401  (selects the interpreter before triton is imported)
from conjugate.compiler.buffers import PreparedWeights
from conjugate.evaluate.baselines.measure import VariantTrial, choose_variants
from conjugate.evaluate.baselines.conventional import ConventionalRound, Variant
from conjugate.evaluate.correctness import compare_rounds
from conjugate.models import make_round_inputs, random_weights, reference_round
from test_round import FAMILIES, _round

EAGER = (Variant("eager", "sdpa"), Variant("eager", "grouped"))
ROWS = (Variant("eager", "efficient"), Variant("eager", "matmul"), Variant("eager", "split"),
        Variant("eager", "reduce"))  # query heads as rows
FLEX = Variant("eager", "flex")  # FlexAttention's unfused form; compiled on a GPU it is a Triton kernel


def _conventional(rnd, draft_variant=EAGER[0], verify_variant=EAGER[0], workload=None, draft=None, target=None):
    return ConventionalRound(workload or rnd.workload, PreparedWeights(draft or rnd.draft),
                             PreparedWeights(target or rnd.target), draft_variant, verify_variant)


def _lengths(inputs):
    return inputs.draft_lengths, inputs.target_lengths


@pytest.mark.parametrize("family,attention", [(f, v) for f in FAMILIES for v in (*EAGER, *ROWS, FLEX)])
def test_static_steps_equal_the_reference(family, attention):
    rnd = _round(family)
    before = rnd.inputs.draft_cache.k.clone(), rnd.inputs.target_cache.v.clone()
    conventional = _conventional(rnd, attention, attention)
    for _ in range(2):  # a second round over the same buffers gives the same result
        conventional.load(rnd.inputs)
        conventional.bufs.poison()
        conventional.run()
        report = compare_rounds(rnd.ref, conventional.outputs(), "fp32", rnd.workload.context)
        assert report.ok and report.near_ties == 0, report.problems
    assert torch.equal(rnd.inputs.draft_cache.k, before[0]) and torch.equal(rnd.inputs.target_cache.v, before[1])


@pytest.mark.parametrize("family", FAMILIES)
def test_ragged_lengths_read_at_run_time(family):
    """Sequences at different lengths in one batch, in both attention variants (one per phase)."""
    rnd = _round(family)
    w = rnd.workload
    inputs = make_round_inputs(rnd.draft, rnd.target, k=w.k, draft_batch=w.draft_batch, target_batch=w.target_batch,
                               context=w.context, seed=w.seed + 7, ragged=True)
    assert len(set(inputs.draft_lengths.tolist()) | set(inputs.target_lengths.tolist())) > 1
    for draft_variant, verify_variant in (EAGER, ROWS[:2], ROWS[2:], (FLEX, FLEX)):
        conventional = _conventional(rnd, draft_variant, verify_variant)
        conventional.load(inputs)
        conventional.run()
        report = compare_rounds(reference_round(rnd.draft, rnd.target, inputs), conventional.outputs(), "fp32",
                                _lengths(inputs))
        assert report.ok and report.near_ties == 0, (draft_variant, report.problems)


def test_torch_compile_for_many_models_in_one_process(monkeypatch):
    """More distinct shapes of a step than dynamo's recompile limit: every one compiled, none eager.
    The default limit (8) is lowered to 2 here, so that three models (three shapes of the draft's step
    and of the target's) pass it. The limit is dynamo's, so dynamo's graphs are compiled by its eager
    backend here (inductor's code for them is what the other tests of this file check)."""
    import torch._dynamo
    torch_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **options: torch_compile(fn, backend="eager", **{
        key: value for key, value in options.items() if key != "mode"}))
    from torch._dynamo.utils import counters

    workload = _round("qwen3").workload
    graphs = counters["stats"]["unique_graphs"]
    low = {key: 2 for key in ("recompile_limit", "accumulated_recompile_limit", "cache_size_limit")
           if hasattr(torch._dynamo.config, key)}
    with torch._dynamo.config.patch(**low):
        for seed in range(3):
            draft, target = random_weights(workload.draft, seed), random_weights(workload.target, seed)
            batch = seed + 1  # a new batch size: new shapes, a new graph for each step
            w = replace(workload, draft_batch=batch, target_batch=batch)
            inputs = make_round_inputs(draft, target, k=w.k, draft_batch=batch, target_batch=batch, context=5,
                                       seed=seed)
            conventional = _conventional(None, Variant("layers", "sdpa"), Variant("layers", "grouped"), w, draft,
                                         target)
            conventional.load(inputs)
            conventional.run()
            assert compare_rounds(reference_round(draft, target, inputs), conventional.outputs(), "fp32", 5).ok
    assert counters["stats"]["unique_graphs"] - graphs >= 2 * 3  # a graph per step shape, past the limit of 2


@pytest.mark.parametrize("attention", [("sdpa", "grouped"), ("matmul", "efficient"), ("split", "split"),
                                       ("reduce", "reduce")])
def test_whole_step_compiled_as_one_graph_writes_the_cache_in_place(attention):
    """The `whole` variant: each step one graph; its cache writes land in the round's own buffers."""
    rnd = _round("llama")
    conventional = _conventional(rnd, Variant("whole", attention[0]), Variant("whole", attention[1]))
    cache = conventional.bufs.target.cache.k
    conventional.load(rnd.inputs)
    conventional.run()
    assert conventional.bufs.target.cache.k is cache
    report = compare_rounds(rnd.ref, conventional.outputs(), "fp32", rnd.workload.context)
    assert report.ok and report.near_ties == 0, report.problems


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_steps_hold_the_bf16_tolerance(family):
    """In bf16 the GEMMs and the cache round to bf16 while norms, softmax and the residual stream
    stay fp32; the round must stay within the bf16 tolerance of the fp32 reference."""
    workload = replace(_round(family).workload, dtype="bf16")
    draft, target = (random_weights(spec, 3, dtype=torch.bfloat16) for spec in (workload.draft, workload.target))
    inputs = make_round_inputs(draft, target, k=workload.k, draft_batch=2, target_batch=2, context=5, seed=3)
    conventional = _conventional(None, *EAGER, workload, draft, target)
    conventional.load(inputs)
    conventional.run()
    assert conventional.bufs.draft.cache.k.dtype == torch.bfloat16
    out = conventional.outputs()
    report = compare_rounds(reference_round(draft, target, inputs, out.draft_tokens), out, "bf16", 5)
    assert report.ok, report.problems
    assert 0 < report.errors["target_logits"] < 0.05  # rounded, so not exact, and within tolerance


def test_variant_names():
    assert Variant.parse("whole-grouped") == Variant("whole", "grouped")
    assert Variant("layers", "sdpa").name == "layers-sdpa"
    assert Variant.parse("tuned-sdpa-bf16") == Variant("tuned", "sdpa", "bf16")
    assert Variant("tuned", "sdpa", "bf16").name == "tuned-sdpa-bf16"
    for bad in ("whole", "layers-flash", "jit-sdpa", "", "whole-sdpa-fp32", "whole-sdpa-fp16", "whole-sdpa-bf16-x"):
        with pytest.raises(ValueError, match="conventional variant"):
            Variant.parse(bad)


def test_a_variant_torch_cannot_build_is_a_failed_trial(monkeypatch):
    """A compile error in one variant leaves the others to compete; the trial says why."""
    from types import SimpleNamespace

    from conjugate.evaluate.baselines import measure as baselines
    from conjugate.evaluate.evaluators import TimingSettings

    class Unbuildable:
        def __init__(self, *args):
            pass

        def capture(self):
            raise RuntimeError("NoValidChoicesError: No choices to select\n(long trace)")

    monkeypatch.setattr(baselines, "ConventionalRound", Unbuildable)
    setup = SimpleNamespace(workload=_round("llama").workload, weights=(None, None))
    trial = baselines.try_variant(setup, Variant("whole", "flex"), TimingSettings())
    assert (trial.variant, trial.correct, trial.built, trial.phase_ms) == ("whole-flex", False, False, {})
    assert trial.problem == "not built: RuntimeError: NoValidChoicesError: No choices to select (long trace)"


@pytest.mark.parametrize("error", [RuntimeError("CUDA error: an illegal memory access was encountered"),
                                   torch.cuda.OutOfMemoryError("CUDA out of memory")])
def test_running_out_of_memory_or_a_cuda_error_is_not_the_variants_fault(monkeypatch, error):
    from types import SimpleNamespace

    from conjugate.evaluate.baselines import measure as baselines
    from conjugate.evaluate.evaluators import TimingSettings

    class Failing:
        def __init__(self, *args):
            pass

        def capture(self):
            raise error

    monkeypatch.setattr(baselines, "ConventionalRound", Failing)
    setup = SimpleNamespace(workload=_round("llama").workload, weights=(None, None))
    with pytest.raises(type(error)):
        baselines.try_variant(setup, Variant("whole", "sdpa"), TimingSettings())


@pytest.mark.parametrize("built, status", [(False, "error"), (True, "incorrect")])
def test_when_no_variant_is_correct_the_baselines_say_what_each_did(monkeypatch, tmp_path, built, status):
    from types import SimpleNamespace

    from conjugate.evaluate.baselines import measure as baselines
    from conjugate.evaluate.evaluators import TimingSettings

    def trial(setup, variant, timing, keep=None):
        problem = "target_logits off" if built else "not built: RuntimeError: no choices"
        return VariantTrial(variant.name, False, {}, problem, built=built)

    monkeypatch.setattr(baselines, "try_variant", trial)
    monkeypatch.setattr(baselines.torch.cuda, "empty_cache", lambda: None)
    setup = SimpleNamespace(workload=_round("llama").workload, weights=(None, SimpleNamespace(weights=SimpleNamespace(
        device=torch.device("cpu")))))
    out = baselines.measure_conventional(setup, TimingSettings(), tmp_path)
    assert set(out) == {"conventional", "streams"} and {b.status for b in out.values()} == {status}
    assert out["streams"].error.startswith("no conventional variant computed the reference round: layers-grouped: ")
    assert out["conventional"].error.count("whole-grouped: ") == 1
    assert not list((tmp_path / "conventional").glob("*.json"))  # nothing kept: the next process tries again


def test_a_choice_kept_before_the_streams_pair_was_chosen_is_made_again(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from conjugate.evaluate.baselines import measure as baselines
    from conjugate.evaluate.evaluators import TimingSettings

    timing = TimingSettings()
    workload = _round("llama").workload
    setup = SimpleNamespace(workload=workload, weights=(None, SimpleNamespace(weights=SimpleNamespace(
        device=torch.device("cpu")))))
    path = baselines.choice_file(workload, "cpu", timing, tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"draft": timing.conventional[0], "verify": timing.conventional[0]}))
    tried = []
    monkeypatch.setattr(baselines, "try_variant", lambda setup, variant, timing, keep: tried.append(variant) or
                        VariantTrial(variant.name, False, {}, "wrong"))
    with pytest.raises(baselines.NoCorrectVariant):
        baselines.chosen_variants(setup, timing, tmp_path)
    assert len(tried) == len(timing.conventional)


def test_the_streams_baseline_runs_the_pair_chosen_for_two_streams(monkeypatch):
    """conventional runs the phases' own choice; streams the pair chosen on two streams, built apart."""
    from types import SimpleNamespace

    from conjugate.evaluate.baselines import measure as baselines
    from conjugate.evaluate.evaluators import TimingSettings
    from conjugate.evaluate.timing import Timing

    built = []

    class FakeRound:
        def __init__(self, workload, draft, target, draft_variant, verify_variant):
            self.pair = (draft_variant.name, verify_variant.name)
            built.append(self.pair)

        def load(self, inputs):
            pass

        def run(self):
            pass

        run_streams = run

    def checked_build(setup, timing, draft, verify):
        return FakeRound(None, None, None, Variant.parse(draft), Variant.parse(verify)), SimpleNamespace(ok=True), {}

    monkeypatch.setattr(baselines, "_built_and_checked", checked_build)
    monkeypatch.setattr(baselines, "time_round", lambda *a, **k: Timing(1.0, 0.9, 1.1, 50))
    chosen = {"draft": "whole-sdpa", "verify": "whole-split", "streams_draft": "whole-sdpa",
              "streams_verify": "whole-grouped"}
    out = baselines.conventional_baselines(SimpleNamespace(timing_inputs=None), TimingSettings(), chosen)
    assert built == [("whole-sdpa", "whole-split"), ("whole-sdpa", "whole-grouped")]
    assert out["conventional"].variants == {"draft": "whole-sdpa", "verify": "whole-split"}
    assert out["streams"].variants == {"draft": "whole-sdpa", "verify": "whole-grouped"}
    built.clear()
    same = {"draft": "whole-sdpa", "verify": "whole-split"}  # a choice without a pair: the phases' own, built once
    out = baselines.conventional_baselines(SimpleNamespace(timing_inputs=None), TimingSettings(), same)
    assert built == [("whole-sdpa", "whole-split")] and out["streams"].variants == same


def _fake_trials(monkeypatch, times: dict[str, tuple[float, float] | None]):
    """try_variant stand-in: a variant is correct with (draft, verify) ms, or wrong (None); its kept
    round is a record of which rounds are alive. Returns that record and the pairs timed."""
    from conjugate.evaluate.baselines import measure as baselines

    alive, paired = {}, []

    class Round:
        def __init__(self, name):
            self.name = name
            alive[name] = True

        def __del__(self):
            alive[self.name] = False

    def trial(setup, variant, timing, keep):
        if times[variant.name] is None:
            return VariantTrial(variant.name, False, {}, "wrong")
        keep[variant.name] = Round(variant.name)
        return VariantTrial(variant.name, True, dict(zip(("draft", "verify"), times[variant.name])))

    def pair(draft, verify, timing):
        paired.append((draft.name, verify.name))
        return sum(times[draft.name]) + sum(times[verify.name])

    monkeypatch.setattr(baselines, "try_variant", trial)
    monkeypatch.setattr(baselines, "pair_on_two_streams", pair)
    monkeypatch.setattr(baselines.torch.cuda, "empty_cache", lambda: None)
    return alive, paired


def test_only_the_fastest_three_per_phase_stay_alive_to_be_paired_on_two_streams(monkeypatch):
    from dataclasses import replace as replaced

    from conjugate.evaluate.baselines import measure as baselines
    from conjugate.evaluate.evaluators import TimingSettings

    a, b, c, d, e, f, g = ("layers-sdpa", "layers-grouped", "whole-sdpa", "whole-grouped", "whole-flex", "whole-split",
                           "whole-efficient")
    times = {a: (1.0, 9.0), b: (2.0, 8.0), c: (3.0, 1.0), d: (9.0, 2.0), e: None, f: (5.0, 5.0), g: (8.0, 7.0)}
    alive, paired = _fake_trials(monkeypatch, times)
    timing = replaced(TimingSettings(), conventional=tuple(times))
    trials, chosen, pairs_ms = baselines.try_all(None, timing)
    assert chosen == {"draft": a, "verify": c, "streams_draft": c, "streams_verify": c}  # 4 + 4 ms: the least
    assert {d for d, _ in paired} == {a, b, c, d, f} and len(paired) == 25  # g: neither phase's top three
    assert alive == {a: False, b: False, c: False, d: False, f: False, g: False}  # g let go at once, others at the end
    assert len(pairs_ms) == 25 and [t.variant for t in trials] == list(times)
    paired.clear()
    no_streams = replaced(timing, baselines=("conventional", "sequential"))
    _, chosen, pairs_ms = baselines.try_all(None, no_streams)
    assert paired == [] and pairs_ms == {}  # nobody wants the streams baseline: no pair timed
    assert chosen == {"draft": a, "verify": c, "streams_draft": a, "streams_verify": c}


def test_each_phase_runs_its_fastest_correct_variant():
    trials = [VariantTrial("a", True, {"draft": 5.0, "verify": 7.0}),
              VariantTrial("b", True, {"draft": 6.0, "verify": 4.0}),
              VariantTrial("c", False, {}, "target_logits off")]
    assert choose_variants(trials) == {"draft": "a", "verify": "b"}
    assert choose_variants(trials[2:]) is None


def test_the_variant_choice_is_kept_per_workload_and_device(tmp_path, monkeypatch):
    """Chosen once (every variant tried), then read back: a later process builds only the chosen ones."""
    from types import SimpleNamespace

    from conjugate.evaluate.baselines import measure as baselines
    from conjugate.evaluate.evaluators import TimingSettings

    tried = []

    timing = TimingSettings()
    fast_ones = dict(zip(timing.conventional[:2], ((5.0, 9.0), (7.0, 4.0))))

    def fake_trial(setup, variant, timing, keep):
        tried.append(variant.name)
        fast = fast_ones.get(variant.name)
        if fast:
            keep[variant.name] = variant.name  # the kept round, here its name
        return VariantTrial(variant.name, fast is not None, dict(zip(("draft", "verify"), fast or ())),
                            "" if fast else "wrong")

    def fake_pair(draft, verify, timing):  # the phase choice overlaps worse than the first variant alone
        return 10.0 if draft == verify == timing_names[0] else 11.0

    timing_names = list(timing.conventional)
    monkeypatch.setattr(baselines, "try_variant", fake_trial)
    monkeypatch.setattr(baselines, "pair_on_two_streams", fake_pair)
    monkeypatch.setattr(baselines.torch.cuda, "empty_cache", lambda: None)
    workload = _round("llama").workload
    setup = SimpleNamespace(workload=workload, weights=(None, SimpleNamespace(weights=SimpleNamespace(
        device=torch.device("cpu")))))
    a, b = timing_names[:2]
    expected = {"draft": a, "verify": b, "streams_draft": a, "streams_verify": a}
    assert baselines.chosen_variants(setup, timing, tmp_path) == expected
    assert tried == list(timing.conventional)
    assert baselines.chosen_variants(setup, timing, tmp_path) == expected
    assert len(tried) == len(timing.conventional)  # read back, nothing tried again
    kept = json.loads(next((tmp_path / "conventional").glob("*.json")).read_text())
    assert kept["streams_pairs_ms"] == {f"{a}/{a}": 10.0, f"{a}/{b}": 11.0, f"{b}/{a}": 11.0, f"{b}/{b}": 11.0}
    other = replace(workload, k=workload.k + 1)  # another workload: chosen afresh
    baselines.chosen_variants(SimpleNamespace(workload=other, weights=setup.weights), timing, tmp_path)
    assert len(tried) == 2 * len(timing.conventional)


def test_the_split_cuts_timed_with_the_choice_are_adopted_by_a_later_process(tmp_path, monkeypatch):
    """The cuts choose_chunks kept when the variants were chosen go into the kept choice; a later
    process reading the choice cuts alike (timed afresh, qwen3's verify phase moved 2% between
    processes); a choice file whose cuts are malformed is chosen again."""
    from types import SimpleNamespace

    from conjugate.evaluate.baselines import measure as baselines
    from conjugate.evaluate.baselines import split_attention as split_module
    from conjugate.evaluate.evaluators import TimingSettings

    timing = TimingSettings()
    cut_key = (4, 6, 32, 8, 1030, 128, torch.bfloat16, "cuda:0")
    tried = []

    def fake_trial(setup, variant, timing, keep):
        tried.append(variant.name)
        split_module._CHOSEN[cut_key] = 3  # as a split variant's build times its cut
        keep[variant.name] = variant.name
        return VariantTrial(variant.name, True, {"draft": 1.0, "verify": 1.0})

    monkeypatch.setattr(split_module, "_CHOSEN", {})
    monkeypatch.setattr(baselines, "try_variant", fake_trial)
    monkeypatch.setattr(baselines, "pair_on_two_streams", lambda draft, verify, timing: 1.0)
    monkeypatch.setattr(baselines.torch.cuda, "empty_cache", lambda: None)
    setup = SimpleNamespace(workload=_round("llama").workload, weights=(None, SimpleNamespace(
        weights=SimpleNamespace(device=torch.device("cpu")))))
    chosen = baselines.chosen_variants(setup, timing, tmp_path)
    path = next((tmp_path / "conventional").glob("*.json"))
    assert json.loads(path.read_text())["split_cuts"] == [[4, 6, 32, 8, 1030, 128, "bfloat16", "cuda:0", 3]]

    monkeypatch.setattr(split_module, "_CHOSEN", {})  # a later process
    assert baselines.chosen_variants(setup, timing, tmp_path) == chosen
    assert len(tried) == len(timing.conventional) and split_module._CHOSEN == {cut_key: 3}

    for bad in ([[4, 6, 32, 8, 1030, 128, "bfloat16", "cuda:0", 0]], [[4, 6, 32, 8, 1030, 128, "nodtype", "cuda:0", 3]],
                [[4, 6, 32, 8, 1030, 128, "bfloat16", "cuda:0"]], ["x"], "x"):
        monkeypatch.setattr(split_module, "_CHOSEN", {})
        kept = json.loads(path.read_text()) | {"split_cuts": bad}
        path.write_text(json.dumps(kept))
        before = len(tried)
        assert baselines.chosen_variants(setup, timing, tmp_path) == chosen
        assert len(tried) == before + len(timing.conventional), bad  # chosen again


def test_tuned_step_compiled_with_autotuning_computes_the_reference():
    """`tuned`: the whole step under inductor's autotuning mode, still the reference round."""
    rnd = _round("qwen3")
    conventional = _conventional(rnd, Variant("tuned", "sdpa"), Variant("tuned", "grouped"))
    conventional.load(rnd.inputs)
    conventional.run()
    report = compare_rounds(rnd.ref, conventional.outputs(), "fp32", rnd.workload.context)
    assert report.ok and report.near_ties == 0, report.problems


@pytest.mark.parametrize("family", FAMILIES)
def test_a_bf16_residual_stream_rounds_more_and_is_judged_by_the_same_check(family):
    """`-bf16`: the residual stream in the weights' dtype, as engines keep it. In bf16 it rounds after
    every add, so its logits differ from the fp32 stream's; the bf16 check still passes at this depth."""
    workload = replace(_round(family).workload, dtype="bf16")
    draft, target = (random_weights(spec, 3, dtype=torch.bfloat16) for spec in (workload.draft, workload.target))
    inputs = make_round_inputs(draft, target, k=workload.k, draft_batch=2, target_batch=2, context=5, seed=3)
    logits = {}
    for residual in ("fp32", "bf16"):
        conventional = _conventional(None, Variant("eager", "sdpa", residual), Variant("eager", "grouped", residual),
                                     workload, draft, target)
        conventional.load(inputs)
        conventional.run()
        out = conventional.outputs()
        report = compare_rounds(reference_round(draft, target, inputs, out.draft_tokens), out, "bf16", 5)
        assert report.ok, (residual, report.problems)
        logits[residual] = out.target_logits
    assert not torch.equal(logits["fp32"], logits["bf16"])


def test_split_count_cuts_the_cache_until_the_gpu_is_full():
    from conjugate.evaluate.baselines.split_attention import cut, split_count

    assert split_count(1029, 8) == 32  # 256 problems, chunks of 37 keys
    assert split_count(1029, 64) == 4
    assert split_count(4100, 128) == 2
    assert split_count(40, 1) == 1  # chunks never shorter than 32 keys
    assert cut(1029, 7) == (147, 147) and cut(1029, 1) == (1029, 1029)  # 7 divides 1029: equal chunks
    assert cut(1029, 8) == (133, 128) and cut(1029, 32) == (37, 32)  # else chunks overlapping a little
    for capacity in (8, 37, 1029, 1030, 4100):
        for chunks in range(1, min(capacity, 200) + 1):
            chunk, stride = cut(capacity, chunks)
            assert (chunks - 1) * stride + chunk == capacity and 0 < stride <= chunk
            assert chunk < -(-capacity // chunks) + chunks  # little overlap


@pytest.mark.parametrize("chunks", [1, 2, 3, 4, 5])
def test_split_attention_over_uneven_cuts_counts_each_key_once(chunks):
    """Capacity 8 in 3 chunks is chunks of 4 keys every 2: the overlap is masked in the earlier chunk."""
    from conjugate.evaluate.baselines.conventional import _grouped_attention
    from conjugate.evaluate.baselines.split_attention import split_attention, split_mask

    gen = torch.Generator().manual_seed(chunks)
    b, t, heads, kv_heads, capacity, hd = 3, 2, 4, 2, 8, 16
    q = torch.randn(b, t, heads, hd, generator=gen)
    k, v = (torch.randn(b, kv_heads, capacity, hd, generator=gen) for _ in range(2))
    positions = torch.tensor([[0], [3], [6]]) + torch.arange(t)
    visible = torch.arange(capacity)[None, None, :] <= positions[:, :, None]
    got = split_attention(q, k, v, split_mask(visible, heads, kv_heads, torch.float32, chunks))
    torch.testing.assert_close(got, _grouped_attention(q, k, v, visible), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family,garbage", [(f, g) for f in FAMILIES for g in (False, True)])
def test_split_attention_combines_chunks_some_all_masked(family, garbage, monkeypatch):
    """The cache cut into chunks of 2-4 keys, ragged lengths: the chunks past a sequence's length are
    all masked and weigh nothing (`garbage`: whatever the kernel wrote there, +inf or NaN); the
    combined result is the reference round's."""
    from conjugate.evaluate.baselines import split_attention as split_module

    monkeypatch.setattr(split_module, "SPLIT_MIN_KEYS", 2)
    if garbage:
        chunk_attention = split_module.chunk_attention

        def writes_garbage_where_all_masked(q, k, v, bias):
            out, lse = chunk_attention(q, k, v, bias)
            masked = torch.isinf(bias).all(-1)
            assert masked.any()  # some chunk of some row sees nothing
            return out.masked_fill(masked[..., None], float("nan")), lse.masked_fill(masked, float("inf"))

        monkeypatch.setattr(split_module, "chunk_attention", writes_garbage_where_all_masked)
    rnd = _round(family)
    w = rnd.workload
    inputs = make_round_inputs(rnd.draft, rnd.target, k=w.k, draft_batch=w.draft_batch, target_batch=w.target_batch,
                               context=w.context, seed=w.seed + 7, ragged=True)
    split = Variant("eager", "split")
    conventional = _conventional(rnd, split, split)
    assert conventional.draft_step.chunks > 1 and conventional.verify_step.chunks > 1
    conventional.load(inputs)
    conventional.run()
    out = conventional.outputs()
    assert torch.isfinite(out.target_logits).all()
    report = compare_rounds(reference_round(rnd.draft, rnd.target, inputs), out, "fp32", _lengths(inputs))
    assert report.ok and report.near_ties == 0, report.problems


def test_on_a_gpu_the_split_is_timed_once_per_shape_and_the_fastest_kept(monkeypatch):
    """choose_chunks times every cut it knows (here with a stand-in clock whose fastest is 8 chunks) and
    keeps the choice per shape, so a second step of that shape times nothing."""
    from conjugate.evaluate.baselines import split_attention as split_module

    monkeypatch.setattr(split_module, "_CHOSEN", {})
    monkeypatch.setattr(split_module, "COLD_SETS", 2)  # two caches a timed call, to keep the test short
    timed, results = [], []

    def clock(fn, device):
        fn()  # the split attention runs, over random data, for this cut
        chunks = split_module.chunk_counts(1029)[len(timed)]
        timed.append(chunks)
        return abs(chunks - 8) + 1.0

    args = (2, 3, 8, 2, 1029, 16, torch.float32, torch.device("cpu"))
    results.append(split_module.choose_chunks(*args, time_us=clock))
    cuts = [1, 2, 3, 4, 6, 8, 12, 16, 32]  # 24 chunks would read 1.47x the keys, 48 chunks 1.96x
    assert timed == cuts and results == [8]
    results.append(split_module.choose_chunks(*args, time_us=clock))
    assert timed == cuts and results == [8, 8]
    assert split_module.chosen_cuts() == {"B2 T3 heads8 kv2 capacity1029 hd16": 8}
    assert split_module.choose_chunks(*args) == split_module.split_count(1029, 2 * 2)  # no clock, no GPU: the rule


def test_split_cuts_the_cache_by_a_view_op_compilers_follow():
    """The chunks are unfold views of the cache: cut by as_strided, inductor's whole-step graph ran
    nearly twice the kernels and the H200's verify phase took 18% longer (the module's note)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from conjugate.evaluate.baselines.split_attention import split_attention, split_mask

    b, t, heads, kv_heads, capacity, hd = 2, 3, 8, 2, 1029, 16
    q = torch.randn(b, t, heads, hd)
    k, v = torch.randn(b, kv_heads, capacity, hd), torch.randn(b, kv_heads, capacity, hd)
    positions = torch.arange(capacity - t, capacity).expand(b, t)
    visible = torch.arange(capacity)[None, None, :] <= positions[:, :, None]
    for chunks in (3, 4):  # equal chunks, and chunks that overlap
        mask = split_mask(visible, heads, kv_heads, torch.float32, chunks)
        ops = {str(n.target) for n in make_fx(split_attention)(q, k, v, mask).graph.nodes if n.op == "call_function"}
        assert "aten.unfold.default" in ops and not any("as_strided" in op for op in ops), sorted(ops)


def test_each_cut_is_timed_over_caches_too_large_for_the_l2_cache(monkeypatch):
    """A timed call streams COLD_BYTES of distinct caches (a model's layers read theirs from memory;
    one cache timed again and again stays in the L2 cache and favours other cuts), and no more than
    COLD_SETS of them."""
    from conjugate.evaluate.baselines import split_attention as split_module

    monkeypatch.setattr(split_module, "_CHOSEN", {})
    monkeypatch.setattr(split_module, "COLD_BYTES", 5 << 20)
    seen = []
    monkeypatch.setattr(split_module, "split_attention",
                        lambda q, k, v, mask: seen.append((k.data_ptr(), v.data_ptr(), k.nbytes + v.nbytes)))

    def clock(fn, device):
        seen.clear()
        fn()
        assert len({ptr for k, v, _ in seen for ptr in (k, v)}) == 2 * len(seen)  # every cache its own
        return 1.0

    one_cache = 2 * 2 * 2 * 1029 * 16 * 4  # K and V: B=2, 2 KV heads, 1029 slots, head dim 16, fp32
    split_module.choose_chunks(2, 3, 8, 2, 1029, 16, torch.float32, torch.device("cpu"), time_us=clock)
    assert len(seen) == 10 and {n for *_, n in seen} == {one_cache} and 9 * one_cache < 5 << 20 <= 10 * one_cache
    monkeypatch.setattr(split_module, "COLD_SETS", 4)
    split_module._CHOSEN.clear()
    split_module.choose_chunks(2, 3, 8, 2, 1029, 16, torch.float32, torch.device("cpu"), time_us=clock)
    assert len(seen) == 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the memory-efficient kernel runs on CUDA")
def test_on_cuda_the_chunk_kernel_agrees_with_its_cpu_form_and_fully_masked_chunks_weigh_nothing():
    """The CUDA branch of chunk_attention (the aten memory-efficient op and its log-sum-exp) against
    the explicit CPU form, with ragged lengths so that some chunks see no key."""
    from conjugate.evaluate.baselines import split_attention as split_module

    gen = torch.Generator().manual_seed(0)
    b, t, heads, kv_heads, capacity, hd = 3, 5, 8, 2, 192, 64
    q = torch.randn(b, t, heads, hd, generator=gen).bfloat16()
    k, v = (torch.randn(b, kv_heads, capacity, hd, generator=gen).bfloat16() for _ in range(2))
    positions = torch.tensor([[3], [100], [186]]) + torch.arange(t)
    visible = torch.arange(capacity)[None, None, :] <= positions[:, :, None]
    mask = split_module.split_mask(visible, heads, kv_heads, torch.bfloat16, 6)  # chunks of 32 keys
    assert not mask[1].all()
    on_cpu = split_module.split_attention(q, k, v, mask)
    on_gpu = split_module.split_attention(q.cuda(), k.cuda(), v.cuda(), tuple(m.cuda() for m in mask))
    assert torch.isfinite(on_gpu).all()
    torch.testing.assert_close(on_gpu.cpu().float(), on_cpu.float(), atol=2e-2, rtol=2e-2)
