"""A ChatClient over the official `openai` SDK (Chat Completions), for OpenAI or any compatible server.

The key comes from OPENAI_API_KEY only. With a `base_url` (or OPENAI_BASE_URL) pointing at an
OpenAI-compatible server (vLLM, llama.cpp, Ollama) the key may be absent. The SDK's own retries are
off: the proposer retries transient failures itself. The SDK sends the request and raises on an
error status; the reply's body is read by agents/llm/wire.py, never by the SDK's models, so no body can
raise anything but the proposer's errors.
"""
from __future__ import annotations

import os
import time

from conjugate.agents.llm.llm import DEFAULT_TIMEOUT_S, request_timeout, sdk_error
from conjugate.agents.llm.wire import ChatReply, openai_reply, read_reply
from conjugate.errors import ConjugateError

NO_KEY = "not-needed"  # what a local server receives when no key is set


class OpenAIClient:
    def __init__(self, model: str, base_url: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S):
        base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        key = os.environ.get("OPENAI_API_KEY", "")
        if not key and not base_url:
            raise ConjugateError("openai: set OPENAI_API_KEY (or give a base URL of an OpenAI-compatible server)")
        try:
            import openai  # lazily: machines that only evaluate plans lack it
        except ImportError as e:
            raise ConjugateError("openai: the 'openai' package is not installed (pip install openai)") from e
        self.model, self.timeout_s, self._sdk, self._key = model, timeout_s, openai, key
        self._client = openai.OpenAI(api_key=key or NO_KEY, base_url=base_url, max_retries=0, timeout=timeout_s)
        # OpenAI's own API wants max_completion_tokens (its reasoning models reject max_tokens);
        # compatible servers reliably know max_tokens.
        self._limit = "max_tokens" if base_url else "max_completion_tokens"

    def complete(self, system: str, messages: list[dict], max_tokens: int,
                 time_left_s: float | None = None) -> ChatReply:
        timeout = request_timeout(self.timeout_s, time_left_s)
        deadline = time.monotonic() + timeout
        try:
            with self._client.chat.completions.with_streaming_response.create(
                    model=self.model, messages=[{"role": "system", "content": system}, *messages],
                    timeout=timeout, **{self._limit: max_tokens}) as response:
                return read_reply(response, deadline, openai_reply)
        except self._sdk.OpenAIError as e:
            raise sdk_error(self._sdk, e, self._key) from e
