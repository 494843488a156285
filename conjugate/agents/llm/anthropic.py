"""A ChatClient over the official `anthropic` SDK (the Messages API).

The key comes from ANTHROPIC_API_KEY only; `base_url` (or ANTHROPIC_BASE_URL) points the client at
another endpoint. The SDK's own retries are off: the proposer retries transient failures itself. The
SDK sends the request and raises on an error status; the reply's body is read by agents/llm/wire.py,
never by the SDK's models, so no body can raise anything but the proposer's errors.
"""
from __future__ import annotations

import os
import time

from conjugate.agents.llm.llm import DEFAULT_TIMEOUT_S, request_timeout, sdk_error
from conjugate.agents.llm.wire import ChatReply, anthropic_reply, read_reply
from conjugate.errors import ConjugateError


class AnthropicClient:
    def __init__(self, model: str, base_url: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S):
        key = os.environ.get("ANTHROPIC_API_KEY", "")
        if not key:
            raise ConjugateError("anthropic: set ANTHROPIC_API_KEY")
        try:
            import anthropic  # lazily: machines that only evaluate plans lack it
        except ImportError as e:
            raise ConjugateError("anthropic: the 'anthropic' package is not installed (pip install anthropic)") from e
        self.model, self.timeout_s, self._sdk, self._key = model, timeout_s, anthropic, key
        self._client = anthropic.Anthropic(api_key=key, base_url=base_url, max_retries=0, timeout=timeout_s)

    def complete(self, system: str, messages: list[dict], max_tokens: int,
                 time_left_s: float | None = None) -> ChatReply:
        timeout = request_timeout(self.timeout_s, time_left_s)
        deadline = time.monotonic() + timeout
        try:
            with self._client.messages.with_streaming_response.create(
                    model=self.model, system=system, messages=messages, max_tokens=max_tokens,
                    timeout=timeout) as response:
                return read_reply(response, deadline, anthropic_reply)
        except self._sdk.AnthropicError as e:
            raise sdk_error(self._sdk, e, self._key) from e
