"""The serving engine: continuous batching (more requests than slots, each still the target's own
greedy decoding, slots refilled as requests end), stop ids, cancellation, its thread, and requests
it refuses. torch's own execution (`conventional`) keeps most cases quick; one compiled plan runs
the same loop under the Triton interpreter."""
from __future__ import annotations

import threading
import warnings

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


def test_a_compiled_plan_serves_more_requests_than_slots(pair, small_tiled):
    """The same loop over a plan's compiled rounds (under the interpreter): five requests, four slots."""
    from conjugate.plan import load_plan

    workload, target = pair("llama")
    engine = Engine(SpeculativeDecoder.build(load_workload(workload), load_plan(small_tiled("interleave")),
                                             "pipelined"))
    prompts, budgets = PROMPTS[:5], [3, 1, 2, 3, 2]
    sinks = _run(engine, prompts, budgets)
    for prompt, budget, sink in zip(prompts, budgets, sinks):
        assert sink.ids == _hf_greedy(target, prompt, budget), prompt


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
