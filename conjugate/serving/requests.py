"""What a client asks of the serving engine, and what the engine answers.

A `Request` is a prompt of token ids, how to sample (`SamplingParams`) and when to stop; the engine
answers it with `Tokens` events as rounds emit them and exactly one `Finished` at the end. Stop
strings are text, so they are the text layer's (serving/text.py): the engine sees ids only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from conjugate.errors import ConjugateError

MAX_TOP_K = 1 << 20  # past any vocabulary
SEED_RANGE = (0, (1 << 63) - 1)


class RequestError(ConjugateError):
    """A request the engine cannot serve; `field` names what about it (an HTTP 400's `param`)."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class SamplingParams:
    """How a request's tokens are drawn. Temperature 0 is greedy decoding (the target's argmax), the
    same tokens as the greedy path; otherwise tokens follow the target's distribution at this
    temperature, cut to its `top_k` most likely tokens (0: all) and then to the smallest most likely
    set holding `top_p` of the mass. `seed` fixes the draws (per position of the sequence, so the
    same request gives the same tokens whatever else is batched beside it); None: the engine picks one."""
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def __post_init__(self):
        if not (_number(self.temperature) and 0.0 <= self.temperature <= 100.0):
            raise RequestError(f"temperature {self.temperature!r}: a number in [0, 100]", "temperature")
        if not (_number(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise RequestError(f"top_p {self.top_p!r}: a number in (0, 1]", "top_p")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or not 0 <= self.top_k <= MAX_TOP_K:
            raise RequestError(f"top_k {self.top_k!r}: an integer in [0, {MAX_TOP_K}] (0: off)", "top_k")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]):
            raise RequestError(f"seed {self.seed!r}: an integer in [{SEED_RANGE[0]}, {SEED_RANGE[1]}]", "seed")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


GREEDY = SamplingParams()



@dataclass(frozen=True)
class Request:
    """`stop_ids`: token ids that end the sequence (emitted, then the sequence stops); None: the
    checkpoint's end-of-sequence ids, () none."""
    prompt: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams = GREEDY
    stop_ids: tuple[int, ...] | None = None


def check_request(prompt, max_tokens, vocab: int, k: int, context: int) -> None:
    """Refuse a prompt and token budget that a round of this vocabulary, k and KV capacity (context)
    cannot serve, naming the request's field."""
    if not prompt:
        raise RequestError("the prompt is empty", "prompt")
    if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab for t in prompt):
        raise RequestError(f"token ids must be integers in 0..{vocab - 1}", "prompt")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise RequestError(f"max_tokens {max_tokens!r}: an integer of at least 1", "max_tokens")
    need = len(prompt) - 1 + max_tokens + k
    if need > context:
        raise RequestError(f"{len(prompt)} prompt tokens + {max_tokens} new + k = {k} need a KV capacity of "
                           f"{need}; the context is {context}", "max_tokens")


FinishReason = Literal["stop", "length", "cancelled", "error"]


@dataclass(frozen=True)
class Tokens:
    """Ids a round emitted for the request, in order (a stop id, when one ended it, is the last)."""
    ids: tuple[int, ...]


@dataclass(frozen=True)
class Finished:
    """The request's end: `stop` (a stop id, or a stop string the text layer found), `length`
    (max_tokens), `cancelled` (the client went away or cancelled it, or the engine closed), `error`
    (a round failed: `stats["error"]` says why; the engine serves no more)."""
    reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    stats: dict = field(default_factory=dict)  # rounds it took part in, drafts proposed and accepted


Event = Tokens | Finished
