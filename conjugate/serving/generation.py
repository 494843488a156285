"""A batch of prompts decoded to the end on the caller's thread (`conjugate generate`).

    decoder = SpeculativeDecoder.build(workload, plan, mode="pipelined")
    result = generate(decoder, [[1, 2, 3], [4, 5]], max_new_tokens=32)
    result.outputs   # per prompt: the target model's own continuation (greedy: its argmax tokens)

Any number of prompts: the engine's slots take them in turn. The prompts that fit are prefilled
before the clock starts, so `seconds` and `round_ms` time the decoding loop.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable

from conjugate.serving.decoder import SpeculativeDecoder, check_prompts
from conjugate.serving.engine import Engine
from conjugate.serving.requests import GREEDY, Event, Finished, Request, SamplingParams, Tokens


@dataclass(frozen=True)
class GenerationResult:
    mode: str
    plan: str
    prompts: list[list[int]]
    outputs: list[list[int]]  # per prompt, its generated ids (a stop id, when one ended it, last)
    finish: list[str]  # per prompt: stop (a stop id), length (max_new_tokens)
    rounds: int
    drafts_proposed: int
    drafts_accepted: int
    seconds: float  # the decoding loop, the first prompts' prefill excluded
    prefill_seconds: float
    round_ms: float  # the loop's time per round

    @property
    def tokens(self) -> int:
        return sum(len(o) for o in self.outputs)

    @property
    def acceptance(self) -> float:
        return self.drafts_accepted / self.drafts_proposed if self.drafts_proposed else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict:
        out = asdict(self)
        out["outputs"] = [{"prompt_ids": p, "generated_ids": o, "finish": f}
                          for p, o, f in zip(self.prompts, self.outputs, self.finish)]
        del out["prompts"], out["finish"]
        return out | {"tokens": self.tokens, "acceptance": self.acceptance, "tokens_per_s": self.tokens_per_s}


@dataclass(frozen=True)
class Progress:
    rounds: int
    tokens: int  # emitted so far, over every sequence
    drafts_proposed: int
    drafts_accepted: int
    seconds: float


class _Collected:
    """One prompt's events, gathered."""

    def __init__(self):
        self.ids: list[int] = []
        self.finish: Finished | None = None

    def __call__(self, event: Event) -> None:
        if isinstance(event, Tokens):
            self.ids.extend(event.ids)
        else:
            self.finish = event


def generate(decoder: SpeculativeDecoder, prompts: list[list[int]], max_new_tokens: int,
             sampling: SamplingParams = GREEDY, stop_ids: tuple[int, ...] = (),
             on_progress: Callable[[Progress], None] | None = None) -> GenerationResult:
    """Decode every prompt until it emits one of `stop_ids` or `max_new_tokens` ids."""
    check_prompts(decoder.workload, prompts, max_new_tokens)
    engine = Engine(decoder, stop_ids)  # compiles and captures the round first
    started = time.perf_counter()
    collected = [_Collected() for _ in prompts]
    for prompt, sink in zip(prompts, collected):
        engine.submit(Request(tuple(prompt), max_new_tokens, sampling), sink)
    engine.admit_waiting()
    decoder.synchronize()
    prefill_s, started = time.perf_counter() - started, time.perf_counter()
    if on_progress:
        engine.on_read = lambda: on_progress(Progress(engine.rounds, sum(len(c.ids) for c in collected),
                                                      engine.drafts_proposed, engine.drafts_accepted,
                                                      time.perf_counter() - started))
    engine.run_until_idle()
    decoder.synchronize()
    seconds = time.perf_counter() - started
    return GenerationResult(decoder.mode, decoder.plan_name, [list(p) for p in prompts], [c.ids for c in collected],
                            [c.finish.reason for c in collected], engine.rounds, engine.drafts_proposed,
                            engine.drafts_accepted, seconds, prefill_s, seconds / max(engine.rounds, 1) * 1e3)
