"""A ChatClient over the official `anthropic` SDK (the Messages API).

The key comes from ANTHROPIC_API_KEY only; `base_url` (or ANTHROPIC_BASE_URL) points the client at
another endpoint. The SDK's own retries are off: the proposer retries transient failures itself.
"""
from __future__ import annotations

import os

from conjugate.agents.llm import ChatReply, sdk_error
from conjugate.errors import ConjugateError


class AnthropicClient:
    def __init__(self, model: str, base_url: str | None = None, timeout_s: float = 600.0):
        key = os.environ.get("ANTHROPIC_API_KEY", "")
        if not key:
            raise ConjugateError("anthropic: set ANTHROPIC_API_KEY")
        try:
            import anthropic  # lazily: machines that only evaluate plans lack it
        except ImportError as e:
            raise ConjugateError("anthropic: the 'anthropic' package is not installed (pip install anthropic)") from e
        self.model, self._sdk, self._key = model, anthropic, key
        self._client = anthropic.Anthropic(api_key=key, base_url=base_url, max_retries=0, timeout=timeout_s)

    def complete(self, system: str, messages: list[dict], max_tokens: int) -> ChatReply:
        try:
            message = self._client.messages.create(model=self.model, system=system, messages=messages,
                                                   max_tokens=max_tokens)
        except self._sdk.AnthropicError as e:
            raise sdk_error(self._sdk, e, self._key) from e
        text = "".join(block.text for block in message.content if getattr(block, "type", "") == "text")
        usage = message.usage
        return ChatReply(text, usage.input_tokens or 0, usage.output_tokens or 0)
