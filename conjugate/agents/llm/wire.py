"""What a chat endpoint sends back, read within fixed limits: every reply becomes a ChatReply or a
typed error, whatever its status, content type, shape, field types, size, depth or pace.

    read_body       the body's bytes: at most MAX_BODY_BYTES, before the request's deadline
    decode_object   the body as a JSON object: JSON content type, UTF-8, nested at most MAX_DEPTH deep
    anthropic_reply / openai_reply   the protocol's fields, type-checked, as a ChatReply
    json_spans      the balanced {...} spans of a text in one linear pass (the body's depth check, and
                    how agents/llm/prompt.py finds the JSON in a reply's text)

A 2xx body that breaks any of these is an LLMMalformedReply. It counts as transient: the proposer
repeats the request as it does a 5xx, since a body cut short, a proxy's error page or a garbled
transfer says nothing about the prompt; the call's record keeps the reason and an excerpt. Token
counts that are absent or not counts do not fail a reply: they come back as None (the proposer
estimates them from the text) and a bad one leaves a note for the call's record.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Callable, Iterator

from conjugate.errors import ConjugateError

MAX_BODY_BYTES = 2 << 20  # a reply of the proposer's max_tokens is a few hundred KB at most
MAX_DEPTH = 64  # nesting of {} and [] in a body or in a reply's JSON; plans and edits need about 12
MAX_TOKEN_COUNT = 10**9  # larger "counts" are not counts (and would overflow the store's integers)
_STRUCTURE = re.compile(r'[{}\[\]"\\]')


class Failure(StrEnum):
    """The kind of a transient failure: the first words of its message, and so of the call's record."""
    TIMEOUT = "timed out"
    CONNECTION = "connection failed"
    STATUS = "error status"
    MALFORMED = "malformed reply"


class LLMTransientError(ConjugateError):
    """A request that may succeed if repeated: rate limit, server error, timeout, lost connection,
    malformed reply (`failure` says which)."""

    def __init__(self, message: str, retry_after_s: float | None = None, failure: Failure = Failure.CONNECTION):
        super().__init__(f"{failure}: {message}")
        self.failure, self.retry_after_s = failure, retry_after_s


class LLMFatalError(ConjugateError):
    """A request that will not succeed as it is: bad key, no permission, bad request, unknown model."""


class LLMMalformedReply(LLMTransientError):
    """A 2xx reply that is not the protocol's: not JSON, cut short, of the wrong shape or field types,
    too large or nested too deep."""

    def __init__(self, message: str):
        super().__init__(message, None, Failure.MALFORMED)


@dataclass(frozen=True)
class ChatReply:
    text: str
    input_tokens: int | None = 0  # None: not reported as a count (the proposer estimates it)
    output_tokens: int | None = 0
    notes: tuple[str, ...] = ()  # what was odd about a usable reply, for the call's record


@dataclass(frozen=True)
class Span:
    start: int
    end: int  # one past the closing brace; len(text) when the object is never closed
    depth: int  # the deepest nesting of {} and [] inside it, itself included
    closed: bool


def json_spans(text: str, start: int = 0) -> Iterator[Span]:
    """The balanced {...} spans of `text` from `start`, outside one another and in order, in one
    pass over its brackets and quotes: brackets inside JSON strings do not count, text between
    spans is skipped (quotes there included). The last span may be unclosed."""
    depth = peak = opened = 0
    in_string, escaped = False, -1  # escaped: the index of the character a backslash escapes
    for match in _STRUCTURE.finditer(text, start):
        i, c = match.start(), match.group()
        if depth == 0:
            if c == "{":
                opened, depth, peak = i, 1, 1
        elif in_string:
            if i == escaped:
                continue
            if c == "\\":
                escaped = i + 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
            peak = max(peak, depth)
        elif c in "}]":
            depth -= 1
            if depth == 0:
                yield Span(opened, i + 1, peak, True)
    if depth:
        yield Span(opened, len(text), peak, False)


def excerpt(data: bytes | str, limit: int = 120) -> str:
    """The start of a body, for a one-line error."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return repr(text[:limit] + ("..." if len(text) > limit else ""))


def read_body(chunks: Iterator[bytes], deadline: float, limit: int = MAX_BODY_BYTES) -> bytes:
    """The body's bytes: LLMMalformedReply past `limit`, LLMTransientError past `deadline`
    (time.monotonic()) or when the transfer fails."""
    body = bytearray()
    while True:
        try:
            chunk = next(chunks, None)
        except Exception as e:  # the HTTP library's own errors: the SDKs wrap them only while sending
            raise LLMTransientError(f"the reply broke off: {type(e).__name__}: {e}") from e
        if chunk is None:
            return bytes(body)
        body += chunk
        if len(body) > limit:
            raise LLMMalformedReply(f"the reply is larger than {limit} bytes")
        if time.monotonic() > deadline:
            raise LLMTransientError("the reply arrived too slowly: its timeout passed while it was read",
                                    failure=Failure.TIMEOUT)


def _is_json_type(content_type: str) -> bool:
    media = content_type.split(";")[0].strip().lower()
    return not media or media == "application/json" or media.endswith("+json")


def decode_object(body: bytes, content_type: str) -> dict:
    """The body as a JSON object, or LLMMalformedReply saying what it is instead."""
    if not _is_json_type(content_type):
        raise LLMMalformedReply(f"content type {content_type!r}, not JSON: {excerpt(body)}")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise LLMMalformedReply(f"the body is not UTF-8 ({e.reason} at byte {e.start})") from e
    if not text.lstrip().startswith("{"):
        raise LLMMalformedReply(f"the body is not a JSON object: {excerpt(text)}")
    if max((s.depth for s in json_spans(text)), default=0) > MAX_DEPTH:
        raise LLMMalformedReply(f"the body is nested deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(text)  # an object: the text starts with "{"
    except (ValueError, RecursionError) as e:  # JSONDecodeError; a number past int's digit limit
        raise LLMMalformedReply(f"the body is not JSON ({e}): {excerpt(text)}") from e


def _kind(value: Any) -> str:
    """What a JSON value is, in words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    names = {str: "a string", int: "a number", float: "a number", list: "a list", dict: "an object"}
    return names.get(type(value), type(value).__name__)


def _field(data: dict, key: str, where: str, want: type | tuple[type, ...], wanted: str) -> Any:
    """data[key], or LLMMalformedReply naming the field when it is absent or of another type."""
    if key not in data:
        raise LLMMalformedReply(f'"{where}{key}" is missing')
    value = data[key]
    if not isinstance(value, want) or isinstance(value, bool):
        raise LLMMalformedReply(f'"{where}{key}" is {_kind(value)}, not {wanted}')
    return value


def _count(value: Any) -> int | None:
    """A token count, or None for anything else (a string, a negative or fractional number, a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not value.is_integer():
        return None
    return int(value) if 0 <= value <= MAX_TOKEN_COUNT else None


def _with_usage(text: str, body: dict, input_key: str, output_key: str) -> ChatReply:
    """The reply with its usage block's counts; None (and a note) where a count is not one."""
    usage = body.get("usage")
    if usage is None:
        return ChatReply(text, None, None)
    if not isinstance(usage, dict):
        return ChatReply(text, None, None, (f'"usage" is {_kind(usage)}, not an object; tokens estimated',))
    counts, notes = [], []
    for key in (input_key, output_key):
        value = usage.get(key)
        counts.append(_count(value))
        if counts[-1] is None and value is not None:
            notes.append(f'"usage.{key}" is {json.dumps(value)[:40]}, not a token count; estimated')
    return ChatReply(text, *counts, tuple(notes))


def anthropic_reply(body: dict) -> ChatReply:
    """A Messages API reply: the text of its text blocks, and its usage."""
    content = _field(body, "content", "", list, "a list of blocks")
    texts = []
    for i, block in enumerate(content):
        if not isinstance(block, dict):
            raise LLMMalformedReply(f'"content[{i}]" is {_kind(block)}, not an object')
        if block.get("type") == "text":
            texts.append(_field(block, "text", f"content[{i}].", str, "a string"))
    return _with_usage("".join(texts), body, "input_tokens", "output_tokens")


def openai_reply(body: dict) -> ChatReply:
    """A Chat Completions reply: its first choice's message content (null: no text), and its usage."""
    choices = _field(body, "choices", "", list, "a list")
    if not choices or not isinstance(choices[0], dict):
        raise LLMMalformedReply(f'"choices[0]" is {_kind(choices[0]) if choices else "missing"}, not an object')
    message = _field(choices[0], "message", "choices[0].", dict, "an object")
    text = message.get("content")
    if text is not None and not isinstance(text, str):
        raise LLMMalformedReply(f'"choices[0].message.content" is {_kind(text)}, not a string')
    return _with_usage(text or "", body, "prompt_tokens", "completion_tokens")


def read_reply(response: Any, deadline: float, shape: Callable[[dict], ChatReply]) -> ChatReply:
    """An SDK's streamed 2xx response (headers, iter_bytes) as a ChatReply of the protocol `shape`."""
    body = read_body(iter(response.iter_bytes()), deadline)
    return shape(decode_object(body, response.headers.get("content-type", "")))
