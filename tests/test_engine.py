"""The serving engine: continuous batching (more requests than slots, each still the target's own
greedy decoding, slots refilled as requests end), stop ids, cancellation, its thread, and requests
it refuses. torch's own execution (`conventional`) keeps most cases quick; one compiled plan runs
the same loop under the Triton interpreter, compiled to sample."""
from __future__ import annotations

import threading
import warnings
from pathlib import Path

import pytest
import torch

from conjugate.serving import Engine, Finished, Request, RequestError, SamplingParams, SpeculativeDecoder, Tokens
from conjugate.serving.engine import EngineClosed
from conjugate.workload import load_workload

transformers = pytest.importorskip("transformers")
from test_generate import _hf_greedy, _workload, pair, small_tiled  # noqa: E402,F401

EAGER = ("eager-sdpa", "eager-sdpa")
PROMPTS = [[3], [250, 4, 4, 90], [11, 12, 13, 14, 15, 16], [7, 7], [1, 2, 3], [40, 41, 42, 43, 44], [9]]
BUDGETS = [12, 2, 3, 5, 1, 4, 2]  # tokens per request: some end early, freeing their slot


class Sink:
    """A request's events, and the engine round at which it finished."""

    def __init__(self, engine: Engine | None = None):
        self.engine, self.ids, self.finish, self.finished_at = engine, [], None, None
        self.done = threading.Event()

    def __call__(self, event):
        if isinstance(event, Tokens):
            assert self.finish is None, "tokens after the finish"
            self.ids.extend(event.ids)
        else:
            assert isinstance(event, Finished) and self.finish is None, "one finish per request"
            self.finish = event
            self.finished_at = self.engine.rounds if self.engine else None
            self.done.set()


def _engine(workload: str, mode: str, plan="conventional", stop_ids=()) -> Engine:
    from conjugate.evaluate.baselines.conventional import Variant

    variants = tuple(Variant.parse(v) for v in EAGER)
    return Engine(SpeculativeDecoder.build(load_workload(workload), plan, mode, variants=variants), stop_ids)


def _run(engine: Engine, prompts, budgets) -> list[Sink]:
    sinks = [Sink(engine) for _ in prompts]
    for prompt, budget, sink in zip(prompts, budgets, sinks):
        engine.submit(Request(tuple(prompt), budget), sink)
    engine.run_until_idle()
    return sinks


@pytest.mark.parametrize("mode", ["simple", "pipelined"])
def test_more_requests_than_slots_each_decode_as_the_target_alone(pair, mode):
    """Seven requests through 2 (simple) or 4 (pipelined) slots: each the target's greedy decoding,
    and a request queued behind the first ones finishes before the longest of those."""
    workload, target = pair("qwen3")
    engine = _engine(workload, mode)
    sinks = _run(engine, PROMPTS, BUDGETS)
    for prompt, budget, sink in zip(PROMPTS, BUDGETS, sinks):
        assert sink.ids == _hf_greedy(target, prompt, budget), (mode, prompt)
        assert sink.finish.reason == "length"
        assert (sink.finish.prompt_tokens, sink.finish.completion_tokens) == (len(prompt), budget)
    slots = engine.decoder.capacity
    assert slots < len(PROMPTS)
    queued = sinks[slots:]  # admitted only once a slot was freed
    assert min(s.finished_at for s in queued) < sinks[0].finished_at  # the first request asks for the most
    assert engine.busy == 0 and engine.waiting == 0
    assert 0 <= engine.drafts_accepted <= engine.drafts_proposed and engine.drafts_proposed > 0


def test_a_stop_id_ends_a_request_where_transformers_would(pair):
    workload, target = pair("llama")
    prompt, budget = [250, 4, 4, 90], 6
    greedy = _hf_greedy(target, prompt, budget)
    stop = greedy[2]  # the third token the target emits
    ends = greedy.index(stop)
    engine = _engine(workload, "pipelined", stop_ids=(stop,))
    sink, other = _run(engine, [prompt, [3]], [budget, 3])
    assert sink.ids == greedy[:ends + 1] and sink.finish.reason == "stop"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = target.generate(torch.tensor([prompt]), max_new_tokens=budget, do_sample=False, eos_token_id=stop,
                             pad_token_id=0)[0, len(prompt):].tolist()
    assert sink.ids == hf[:len(sink.ids)] and hf[len(sink.ids) - 1] == stop
    assert other.finish.reason in ("length", "stop")
    # a request's own stop ids replace the engine's: none at all runs to max_tokens
    again = Sink()
    engine.submit(Request(tuple(prompt), budget, stop_ids=()), again)
    engine.run_until_idle()
    assert again.ids == greedy and again.finish.reason == "length"


def test_a_cancelled_request_ends_and_the_others_carry_on(pair):
    workload, target = pair("qwen3")
    engine = _engine(workload, "simple")
    tickets, sinks = [], [Sink(engine) for _ in range(3)]

    def cancel_after_first(event):
        sinks[0](event)
        if isinstance(event, Tokens):
            tickets[0].cancel()

    for i, (prompt, sink) in enumerate(zip(PROMPTS[:3], [cancel_after_first, sinks[1], sinks[2]])):
        tickets.append(engine.submit(Request(tuple(prompt), 6), sink))
    tickets[2].cancel()  # still queued: it never starts
    engine.run_until_idle()
    assert sinks[0].finish.reason == "cancelled" and 0 < len(sinks[0].ids) < 6
    assert sinks[2].finish.reason == "cancelled" and sinks[2].ids == []
    assert sinks[1].ids == _hf_greedy(target, PROMPTS[1], 6) and sinks[1].finish.reason == "length"


def test_the_engine_thread_serves_concurrent_submitters_and_closes_cleanly(pair):
    workload, target = pair("qwen3")
    engine = _engine(workload, "pipelined")
    engine.start()
    sinks = [Sink() for _ in PROMPTS]
    threads = [threading.Thread(target=engine.submit, args=(Request(tuple(p), b), s))
               for p, b, s in zip(PROMPTS, BUDGETS, sinks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(s.done.wait(120) for s in sinks)
    for prompt, budget, sink in zip(PROMPTS, BUDGETS, sinks):
        assert sink.ids == _hf_greedy(target, prompt, budget)
    late = Sink()
    engine.submit(Request((5, 6), engine.context - 1 - engine.k), late)  # long: likely running at the close
    engine.close()
    assert late.finish is not None and late.finish.reason in ("cancelled", "length")
    with pytest.raises(EngineClosed):
        engine.submit(Request((1,), 1), Sink())


def test_requests_it_cannot_serve_are_refused_naming_the_field(pair):
    workload, _ = pair("qwen3")
    engine = _engine(workload, "simple")
    vocab, context = engine.workload.draft.vocab_size, engine.context
    for request, field in [(Request((), 2), "prompt"), (Request((vocab,), 2), "prompt"), (Request((-1,), 2), "prompt"),
                           (Request((1,), 0), "max_tokens"), (Request((1,), context), "max_tokens"),
                           (Request(tuple([1] * context), 1), "max_tokens"),
                           (Request((1,), 2, SamplingParams(temperature=0.5)), "temperature")]:
        with pytest.raises(RequestError) as refused:
            engine.submit(request, Sink())
        assert refused.value.field == field, request
    assert engine.waiting == 0
    for bad, field in [(dict(temperature=float("nan")), "temperature"), (dict(top_p=0.0), "top_p"),
                       (dict(top_k=-1), "top_k"), (dict(seed=-5), "seed"), (dict(temperature=True), "temperature")]:
        with pytest.raises(RequestError) as refused:
            SamplingParams(**bad)
        assert refused.value.field == field


def test_stop_ids_come_from_the_target_checkpoint(tmp_path):
    """generation_config.json's eos_token_id first, else config.json's; an id or a list; a bad value
    is refused naming the file and field; a preset has none."""
    from conjugate.serving.decoder import GenerationError
    from conjugate.serving.stop_ids import checkpoint_stop_ids

    class Pair:  # the one thing checkpoint_stop_ids asks of a workload
        def __init__(self, directory):
            self.directory = directory

        def checkpoint_dir(self, model):
            return self.directory

    (tmp_path / "config.json").write_text('{"eos_token_id": 7}')
    assert checkpoint_stop_ids(Pair(tmp_path)) == (7,)
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": [3, 9]}')
    assert checkpoint_stop_ids(Pair(tmp_path)) == (3, 9)
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": "end"}')
    with pytest.raises(GenerationError, match="generation_config.json.*eos_token_id"):
        checkpoint_stop_ids(Pair(tmp_path))
    assert checkpoint_stop_ids(Pair(None)) == ()


# ---------------------------------------------------------------------------------------------
# sampling


def _sampling_engine(workload: str, plan="conventional", mode="pipelined") -> Engine:
    from conjugate.evaluate.baselines.conventional import Variant

    variants = tuple(Variant.parse(v) for v in EAGER)
    return Engine(SpeculativeDecoder.build(load_workload(workload), plan, mode, variants=variants, sampling=True))


def _binned_p_value(tokens: list[int], probs: torch.Tensor) -> float:
    """Chi-square p-value of `tokens` drawn from `probs` [V], cells merged (likeliest first) until
    each expects at least 5 draws; tokens of probability 0 must not occur."""
    from test_sampling import _chi2_sf

    counts = torch.bincount(torch.tensor(tokens), minlength=probs.shape[0]).double()
    assert counts[probs == 0].sum() == 0
    n, order = len(tokens), torch.argsort(probs, descending=True)
    bins, observed, expected = [], 0.0, 0.0
    for v in order.tolist():
        if probs[v] == 0:
            break
        observed, expected = observed + counts[v].item(), expected + probs[v].item() * n
        if expected >= 5:
            bins.append((observed, expected))
            observed, expected = 0.0, 0.0
    if expected:  # the tail joins the last bin
        last = bins.pop()
        bins.append((last[0] + observed, last[1] + expected))
    stat = sum((o - e) ** 2 / e for o, e in bins)
    return _chi2_sf(stat, len(bins) - 1)


@pytest.fixture(scope="module")
def unlike_pair(pair, tmp_path_factory):
    """(workload file, HF target): qwen3's target with a draft of its own, not derived from it, so
    that the draft's next-token distribution is far from the target's (total variation about 0.5)."""
    from test_reference_hf import _make_model, _save

    workload, target = pair("qwen3")
    root = tmp_path_factory.mktemp("unlike")
    _save(target, root / "target")
    _save(_make_model("qwen3", seed=99, layers=1), root / "draft")
    return _workload(root, "draft", "target", k=1, draft_batch=8, target_batch=8), target


def test_sampled_tokens_follow_the_targets_distribution_not_the_drafts(unlike_pair):
    """200 seeds, one token each at temperature 1: the tokens' frequencies fit the target's own
    next-token distribution by a chi-square test at significance 1e-3 and do not fit the draft's
    (the seeds are fixed: the test is deterministic). About half the drafts are rejected, so the
    residual draw makes up much of the sample."""
    workload, target = unlike_pair
    engine = _sampling_engine(workload)
    prompt = [250, 4, 4, 90]
    sinks = _run_requests(engine, [Request(tuple(prompt), 1, SamplingParams(temperature=1.0, seed=seed))
                                   for seed in range(200)])
    tokens = [s.ids[0] for s in sinks]
    with torch.no_grad():
        p = target(torch.tensor([prompt])).logits[0, -1].float().softmax(-1)
    draft = transformers.AutoModelForCausalLM.from_pretrained(Path(workload).parent / "draft").eval()
    with torch.no_grad():
        q = draft(torch.tensor([prompt])).logits[0, -1].float().softmax(-1)
    assert _binned_p_value(tokens, p) > 1e-3
    assert _binned_p_value(tokens, q) < 1e-3  # the test can tell the two apart
    assert 0.2 < engine.drafts_accepted / engine.drafts_proposed < 0.8


def test_a_seed_fixes_a_requests_tokens_whatever_is_batched_beside_it(pair):
    workload, target = pair("llama")
    engine = _sampling_engine(workload)
    request = Request((3, 1, 4), 8, SamplingParams(temperature=1.0, seed=11))
    alone = _run_requests(engine, [request])[0]
    others = [Request((9, 9), 6, SamplingParams(temperature=0.7, seed=s)) for s in range(3)]
    crowded = _run_requests(engine, others[:2] + [request] + others[2:])[2]
    assert alone.ids == crowded.ids and len(alone.ids) == 8
    reseeded = _run_requests(engine, [Request((3, 1, 4), 8, SamplingParams(temperature=1.0, seed=12))])[0]
    assert reseeded.ids != alone.ids
    greedy = _run_requests(engine, [Request((3, 1, 4), 8)])[0]  # temperature 0 beside nothing: greedy
    assert greedy.ids == _hf_greedy(target, [3, 1, 4], 8)


def test_a_compiled_sampling_round_serves_greedy_and_sampled_requests(pair, small_tiled):
    """The loop over a plan's compiled rounds (under the interpreter), compiled to sample (logits
    kept): five requests through four slots; temperature-0 ones are still the target's greedy
    decoding, the sampled one is reproducible by its seed."""
    from conjugate.plan import load_plan

    workload, target = pair("llama")
    engine = Engine(SpeculativeDecoder.build(load_workload(workload), load_plan(small_tiled("interleave")),
                                             "pipelined", sampling=True))
    requests = [Request((3,), 3), Request((250, 4, 4, 90), 3, SamplingParams(temperature=1.0, seed=4)),
                Request((11, 12, 13), 2), Request((7, 7), 2), Request((40, 41, 42, 43, 44), 1)]
    first = _run_requests(engine, requests)
    for request, sink in zip(requests, first):
        if request.sampling.greedy:
            assert sink.ids == _hf_greedy(target, list(request.prompt), request.max_tokens)
    again = _run_requests(engine, requests[1:2])[0]
    assert again.ids == first[1].ids and len(again.ids) == 3


def _run_requests(engine: Engine, requests: list[Request]) -> list[Sink]:
    sinks = [Sink(engine) for _ in requests]
    for request, sink in zip(requests, sinks):
        engine.submit(request, sink)
    engine.run_until_idle()
    return sinks


def test_a_failed_round_ends_every_request_with_the_error_and_refuses_more(pair, monkeypatch):
    workload, _ = pair("qwen3")
    engine = _engine(workload, "simple")

    def broken(*args):
        raise RuntimeError("unspecified launch failure\nmore detail")

    monkeypatch.setattr(engine.decoder, "run_round", broken)
    sinks = [Sink() for _ in range(3)]
    for sink in sinks:
        engine.submit(Request((1, 2), 4), sink)
    engine.start()
    assert all(s.done.wait(30) for s in sinks)
    assert {s.finish.reason for s in sinks} == {"error"}
    assert sinks[0].finish.stats["error"] == engine.failure == "RuntimeError: unspecified launch failure"
    with pytest.raises(EngineClosed, match="unspecified launch failure"):
        engine.submit(Request((1,), 1), Sink())
    engine.close()
