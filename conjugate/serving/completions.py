"""Completions: text or ids in, text and ids out, through a running engine. The Python API, and what
the HTTP server (http.py) serves.

    with Completions.build(workload, plan) as service:          # the engine's thread runs meanwhile
        done = service.complete("Once upon", max_tokens=32, temperature=0.8, stop=["\\n"])
        done.text, done.finish_reason, done.usage
        for piece in service.stream([1, 2, 3], max_tokens=8):   # Piece(text, token_ids, finish_reason)
            ...

`open_stream` gives the same pieces to asyncio code (an async iterator; closing it cancels the
request). A request ends at a stop id (the checkpoint's end-of-sequence ids unless `ignore_eos`), a
stop string (the text ends before it), or `max_tokens`.
"""
from __future__ import annotations

import asyncio
import queue
from dataclasses import dataclass, field

from conjugate.serving.engine import Engine, Ticket
from conjugate.serving.requests import Event, Finished, Request, RequestError, SamplingParams, Tokens
from conjugate.serving.text import TextStream
from conjugate.serving.tokens import Tokenizer

MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256


@dataclass(frozen=True)
class Piece:
    """What one round added to a completion; the last piece has a finish reason (and maybe no text)."""
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None = None  # stop | length | cancelled | error
    error: str | None = None  # why, when the engine failed


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class Completion:
    """A whole completion, its pieces joined."""
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    usage: Usage | None = None


class _Translator:
    """One request's engine events -> pieces of text (stop strings applied)."""

    def __init__(self, tokenizer: Tokenizer | None, stop: tuple[str, ...], hidden_ids: tuple[int, ...], prompt: int):
        self.text = TextStream(tokenizer, stop, hidden_ids) if tokenizer else None
        self.prompt, self.completion = prompt, 0
        self.stopped_by_string = False

    def piece(self, event: Event) -> Piece:
        if isinstance(event, Tokens):
            text = self.text.push(event.ids) if self.text else ""
            if self.text and self.text.stopped:
                self.stopped_by_string = True
            self.completion += len(event.ids)
            return Piece(text, event.ids)
        reason = "stop" if self.stopped_by_string else event.reason
        return Piece(self.text.finish() if self.text else "", (), reason, event.stats.get("error"))


class Completions:
    def __init__(self, engine: Engine, tokenizer: Tokenizer | None, model: str):
        self.engine, self.tokenizer, self.model = engine, tokenizer, model

    @classmethod
    def build(cls, workload, plan, mode: str = "pipelined", model: str | None = None, **build) -> "Completions":
        """An engine compiled for the workload (Engine.build), the target checkpoint's tokenizer if it has one."""
        engine = Engine.build(workload, plan, mode, **build)
        return cls(engine, Tokenizer.of(workload, required=False), model or workload.name)

    def __enter__(self) -> "Completions":
        self.engine.start()
        return self

    def __exit__(self, *exc) -> None:
        self.engine.close()

    # -- requests --------------------------------------------------------------------------------------
    def request(self, prompt: str | list[int], max_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
                top_k: int = 0, seed: int | None = None, stop: str | list[str] | None = None,
                ignore_eos: bool = False) -> tuple[Request, tuple[str, ...]]:
        """The engine's request and the stop strings, checked (RequestError names the field)."""
        ids = self.encode(prompt)
        stops = _stop_strings(stop)
        if stops and self.tokenizer is None:
            raise RequestError("stop strings need the checkpoint's tokenizer; this model has none", "stop")
        request = Request(tuple(ids), max_tokens, SamplingParams(temperature, top_p, top_k, seed),
                          () if ignore_eos else None)
        self.engine.check(request)
        return request, stops

    def encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestError("text prompts need the checkpoint's tokenizer; this model has none: give token "
                                   "ids", "prompt")
            return self.tokenizer.encode(prompt)
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return list(prompt)
        raise RequestError("prompt: a string or a list of token ids", "prompt")

    def _start(self, request: Request, stops: tuple[str, ...], on_event) -> tuple[Ticket, _Translator]:
        hidden = self.engine.stop_ids if request.stop_ids is None else request.stop_ids
        translator = _Translator(self.tokenizer, stops, hidden, len(request.prompt))
        return self.engine.submit(request, on_event), translator

    # -- the Python API (the engine's thread must be running: `with service:`) ------------------------
    def stream(self, prompt: str | list[int], max_tokens: int = 16, **options):
        """Pieces as rounds emit them (a generator; closing it early cancels the request)."""
        request, stops = self.request(prompt, max_tokens, **options)
        events: queue.Queue[Event] = queue.Queue()
        ticket, translator = self._start(request, stops, events.put)
        try:
            while True:
                event = events.get()
                piece = translator.piece(event)
                if translator.stopped_by_string and isinstance(event, Tokens):
                    ticket.cancel()  # the text is over: the rest of the request is not wanted
                yield piece
                if isinstance(event, Finished):
                    return
        finally:
            ticket.cancel()

    def complete(self, prompt: str | list[int], max_tokens: int = 16, **options) -> Completion:
        """The whole completion, once it has ended."""
        done = Completion()
        for piece in self.stream(prompt, max_tokens, **options):
            done.text += piece.text
            done.token_ids.extend(piece.token_ids)
            done.finish_reason = piece.finish_reason or done.finish_reason
        done.usage = Usage(len(self.encode(prompt)), len(done.token_ids))
        return done

    # -- for asyncio (the HTTP server) ---------------------------------------------------------------
    def open_stream(self, request: Request, stops: tuple[str, ...]) -> "AsyncPieces":
        return AsyncPieces(self, request, stops)


class AsyncPieces:
    """A request's pieces as an async iterator on the caller's event loop; `close()` (or leaving an
    `async with`) cancels the request if it is still running."""

    def __init__(self, service: Completions, request: Request, stops: tuple[str, ...]):
        loop = asyncio.get_running_loop()
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self.ticket, self._translator = service._start(
            request, stops, lambda event: loop.call_soon_threadsafe(self._events.put_nowait, event))
        self.usage = Usage(len(request.prompt), 0)
        self._done = False

    def __aiter__(self):
        return self

    async def __anext__(self) -> Piece:
        if self._done:
            raise StopAsyncIteration
        event = await self._events.get()
        piece = self._translator.piece(event)
        self.usage = Usage(self.usage.prompt_tokens, self._translator.completion)
        if isinstance(event, Finished):
            self._done = True
        elif self._translator.stopped_by_string:
            self.ticket.cancel()
        return piece

    async def __aenter__(self) -> "AsyncPieces":
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if not self._done:
            self.ticket.cancel()


def _stop_strings(stop) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) for s in stops):
        raise RequestError("stop: a string or a list of strings", "stop")
    if len(stops) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_LENGTH for s in stops):
        raise RequestError(f"stop: at most {MAX_STOP_STRINGS} strings of at most {MAX_STOP_LENGTH} characters",
                           "stop")
    return tuple(s for s in stops if s)
