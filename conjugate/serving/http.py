"""The OpenAI-compatible HTTP server of `conjugate serve` (FastAPI, run by uvicorn).

    GET  /health                 200 while the engine serves, 503 once it has failed
    GET  /v1/models              the one model served
    GET  /v1/stats               the engine's counters: rounds, drafts proposed and accepted, requests
                                 running and waiting, requests finished by reason (stop, length,
                                 cancelled, error)
    POST /v1/completions         prompt as text or token ids; max_tokens, temperature, top_p, top_k,
                                 seed, stop, stream (server-sent events), stream_options.include_usage,
                                 ignore_eos
    POST /v1/chat/completions    the same for messages, where the tokenizer has a chat template

Each choice also carries `token_ids`, the ids behind its text (a model without a tokenizer has no
text). Bad requests get OpenAI-style errors (`{"error": {"message", "type", "param", "code"}}`) with
a 4xx status, bodies over `max_body` bytes a 413 while they are read; a client that goes away has
its request cancelled. None of these stops the server or touches another request.
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from fastapi import FastAPI, Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from conjugate.serving.chat import ChatTemplate
from conjugate.serving.completions import AsyncPieces, Completions
from conjugate.serving.engine import EngineClosed
from conjugate.serving.requests import RequestError

MAX_BODY = 10 * 1024 * 1024
MAX_TOKENS = 1 << 20


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def response(self) -> JSONResponse:
        return JSONResponse({"error": {"message": self.message, "type": self.kind, "param": self.param,
                                       "code": self.code}}, status_code=self.status)


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")  # fields of the API this server does not read are ignored
    model: str
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int = Field(default=0, ge=0)
    seed: int | None = Field(default=None, ge=0, lt=1 << 63)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: int = Field(default=1, ge=1, le=1)
    ignore_eos: bool = False


class CompletionBody(_Body):
    prompt: str | list[int] | list[str]
    echo: Literal[False] = False


class ChatMessage(BaseModel):
    role: str
    content: str


class ChatBody(_Body):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)


def create_app(service: Completions, chat: ChatTemplate | None = None, max_body: int = MAX_BODY,
               default_max_tokens: int = 16) -> FastAPI:
    app = FastAPI(title="conjugate", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(BodyLimit, limit=max_body)
    engine = service.engine

    @app.exception_handler(ApiError)
    async def api_error(_, e: ApiError):
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(_, e: RequestValidationError):
        first = e.errors()[0] if e.errors() else {}
        where = [str(p) for p in first.get("loc", ()) if p != "body"]
        message = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":
            return ApiError(400, "the body is not valid JSON").response()
        return ApiError(400, f"{'.'.join(where) or 'body'}: {message}", where[0] if where else None).response()

    @app.get("/health")
    async def health():
        if engine.failure:
            raise ApiError(503, f"the engine stopped: {engine.failure}", kind="server_error")
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": service.model, "object": "model", "created": 0,
                                            "owned_by": "conjugate"}]}

    @app.get("/v1/stats")
    async def stats():
        return {"rounds": engine.rounds, "drafts_proposed": engine.drafts_proposed,
                "drafts_accepted": engine.drafts_accepted, "running": engine.busy, "waiting": engine.waiting,
                "finished": dict(engine.finished)}

    @app.post("/v1/completions")
    async def completions(body: CompletionBody, http: HttpRequest):
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            if len(prompt) != 1:
                raise ApiError(400, "one prompt per request", "prompt")
            prompt = prompt[0]
        return await _serve(service, body, prompt, body.max_tokens or default_max_tokens, http, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatBody, http: HttpRequest):
        if chat is None:
            raise ApiError(404, f"model {service.model!r} has no chat template: use /v1/completions", "messages",
                           code="no_chat_template")
        try:
            prompt = chat.render([m.model_dump() for m in body.messages])
        except ValueError as e:
            raise ApiError(400, f"messages: {e}", "messages") from None
        max_tokens = body.max_completion_tokens or body.max_tokens or default_max_tokens
        return await _serve(service, body, prompt, max_tokens, http, chat=True)

    return app


async def _serve(service: Completions, body: _Body, prompt, max_tokens: int, http: HttpRequest, chat: bool):
    if body.model != service.model:
        raise ApiError(404, f"model {body.model!r} does not exist; this server serves {service.model!r}", "model",
                       code="model_not_found")
    try:
        request, stops = service.request(prompt, max_tokens, body.temperature, body.top_p, body.top_k, body.seed,
                                         body.stop, body.ignore_eos)
        pieces = service.open_stream(request, stops)
    except RequestError as e:
        raise ApiError(400, str(e), e.field) from None
    except EngineClosed as e:
        raise ApiError(503, str(e), kind="server_error") from None
    reply = _Reply(service.model, chat)
    if body.stream:
        usage = bool((body.stream_options or {}).get("include_usage"))
        return StreamingResponse(_events(pieces, reply, usage), media_type="text/event-stream")
    return JSONResponse(await _whole(pieces, reply, http))


class _Reply:
    """The JSON objects of one completion, in the chat or the text form."""

    def __init__(self, model: str, chat: bool):
        self.model, self.chat, self.created = model, chat, int(time.time())
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex

    def _object(self, kind: str, choices: list, usage=None) -> dict:
        out = {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}
        return out | ({"usage": _usage(usage)} if usage is not None else {})

    def whole(self, text: str, ids: list[int], finish: str, usage) -> dict:
        choice = {"index": 0, "finish_reason": finish, "logprobs": None, "token_ids": ids}
        if self.chat:
            return self._object("chat.completion", [choice | {"message": {"role": "assistant", "content": text}}],
                                usage)
        return self._object("text_completion", [choice | {"text": text}], usage)

    def chunk(self, text: str, ids, finish: str | None, first: bool) -> dict:
        choice = {"index": 0, "finish_reason": finish, "logprobs": None, "token_ids": list(ids)}
        if self.chat:
            delta = ({"role": "assistant"} if first else {}) | ({"content": text} if text or first else {})
            return self._object("chat.completion.chunk", [choice | {"delta": delta}])
        return self._object("text_completion", [choice | {"text": text}])

    def usage_chunk(self, usage) -> dict:
        return self._object("chat.completion.chunk" if self.chat else "text_completion", [], usage)


def _usage(usage) -> dict:
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens}


def _finish(reason: str) -> str:
    return "length" if reason == "length" else "stop"  # a cancelled request's client is gone


async def _events(pieces: AsyncPieces, reply: _Reply, include_usage: bool):
    """Server-sent events; leaving early (the client went away) cancels the request."""
    async with pieces:
        first = True
        async for piece in pieces:
            if piece.finish_reason == "error":
                failed = ApiError(500, f"the engine failed: {piece.error}", kind="server_error")
                yield f"data: {failed.response().body.decode()}\n\n"
                break
            finish = _finish(piece.finish_reason) if piece.finish_reason else None
            if piece.text or piece.token_ids or finish or first:
                yield f"data: {json.dumps(reply.chunk(piece.text, piece.token_ids, finish, first))}\n\n"
                first = False
        if include_usage:
            yield f"data: {json.dumps(reply.usage_chunk(pieces.usage))}\n\n"
        yield "data: [DONE]\n\n"


async def _whole(pieces: AsyncPieces, reply: _Reply, http: HttpRequest) -> dict:
    """The whole completion; a client that disconnects meanwhile has its request cancelled."""
    import asyncio

    text, ids, finish = "", [], "stop"
    checked = time.monotonic()  # the connection is looked at every half second, pieces arriving or not
    async with pieces:
        iterator = pieces.__aiter__()
        while True:
            step = asyncio.ensure_future(iterator.__anext__())
            while True:
                await asyncio.wait([step], timeout=0.5)
                if time.monotonic() - checked >= 0.5:
                    checked = time.monotonic()
                    if await http.is_disconnected():
                        step.cancel()
                        pieces.close()
                        raise ApiError(499, "the client closed the request")
                if step.done():
                    break
            try:
                piece = step.result()
            except StopAsyncIteration:
                break
            if piece.finish_reason == "error":
                raise ApiError(500, f"the engine failed: {piece.error}", kind="server_error")
            text += piece.text
            ids.extend(piece.token_ids)
            finish = _finish(piece.finish_reason) if piece.finish_reason else finish
    return reply.whole(text, ids, finish, pieces.usage)


class BodyLimit:
    """Refuse a request body over `limit` bytes with a 413: from its Content-Length, or while it is
    read (the body is read here whole, then handed to the app)."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return await self._refuse(send)
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.limit:
                return await self._refuse(send)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # then what the connection says (a disconnect)

        await self.app(scope, replay, send)

    async def _refuse(self, send):
        await ApiError(413, f"the request body is over {self.limit} bytes").response()({"type": "http"}, None, send)
