"""A ChatClient over the official `openai` SDK (Chat Completions), for OpenAI or any compatible server.

The key comes from OPENAI_API_KEY only. With a `base_url` (or OPENAI_BASE_URL) pointing at an
OpenAI-compatible server (vLLM, llama.cpp, Ollama) the key may be absent. The SDK's own retries are
off: the proposer retries transient failures itself.
"""
from __future__ import annotations

import os

from conjugate.agents.llm import ChatReply, sdk_error
from conjugate.errors import ConjugateError

NO_KEY = "not-needed"  # what a local server receives when no key is set


class OpenAIClient:
    def __init__(self, model: str, base_url: str | None = None, timeout_s: float = 600.0):
        base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        key = os.environ.get("OPENAI_API_KEY", "")
        if not key and not base_url:
            raise ConjugateError("openai: set OPENAI_API_KEY (or give a base URL of an OpenAI-compatible server)")
        try:
            import openai  # lazily: machines that only evaluate plans lack it
        except ImportError as e:
            raise ConjugateError("openai: the 'openai' package is not installed (pip install openai)") from e
        self.model, self._sdk, self._key = model, openai, key
        self._client = openai.OpenAI(api_key=key or NO_KEY, base_url=base_url, max_retries=0, timeout=timeout_s)
        # OpenAI's own API wants max_completion_tokens (its reasoning models reject max_tokens);
        # compatible servers reliably know max_tokens.
        self._limit = "max_tokens" if base_url else "max_completion_tokens"

    def complete(self, system: str, messages: list[dict], max_tokens: int) -> ChatReply:
        try:
            response = self._client.chat.completions.create(
                model=self.model, messages=[{"role": "system", "content": system}, *messages],
                **{self._limit: max_tokens})
        except self._sdk.OpenAIError as e:
            raise sdk_error(self._sdk, e, self._key) from e
        text = (response.choices[0].message.content or "") if response.choices else ""
        usage = response.usage
        tokens = (usage.prompt_tokens or 0, usage.completion_tokens or 0) if usage else (0, 0)
        return ChatReply(text, *tokens)
