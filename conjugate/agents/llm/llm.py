"""The LLM proposer: asks a chat model for plan edits and keeps what validates.

Provider-agnostic: a ChatClient (agents/llm/anthropic.py, agents/llm/openai.py) sends one chat
request and reads its reply through agents/llm/wire.py, the one boundary every reply passes: whatever
arrives becomes a ChatReply or LLMTransientError (worth repeating: rate limits, 5xx, timeouts, lost
connections, malformed bodies) or LLMFatalError (`sdk_error`). The prompts are rendered and the
reply's text read by agents/llm/prompt.py: the text is data, parsed as JSON within size and depth
limits, never executed; every edit is applied and validated before it becomes a Proposal, and a
reply without a valid edit is answered once with the reasons (retry.md).

Time: each request's timeout is the client's own (--llm-timeout) or what is left of the search's
time, whichever is less; retries wait only while time is left. When no reply comes (retries spent,
a fatal error, the time up) propose() raises ProposerUnavailable.

Every request, successful or not, goes to `log_call` as one record with the keys provider, model,
prompt, reply, input_tokens, output_tokens, cost_usd, latency_s and error. Prompt and reply are kept
up to STORED_CHARS characters each, with the original length noted; token counts a reply does not
give as counts are estimated from the text (about four characters a token), so the cost cap holds.
"""
from __future__ import annotations

import fnmatch
import logging
import random
import time
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Protocol

from conjugate.agents.base import LLMCallLog, NodeContext, Proposal, ProposerUnavailable
from conjugate.agents.llm.prompt import Prompts, check_edits, clip, parse_reply
from conjugate.agents.llm.wire import ChatReply, Failure, LLMFatalError, LLMMalformedReply, LLMTransientError
from conjugate.errors import ConjugateError, PlanError
from conjugate.files import read_text
from conjugate.paths import PRICES_FILE, PROMPTS_DIR
from conjugate.plan.patch import patch_plan
from conjugate.plan.schema import Plan, validate_plan
from conjugate.secrets import REDACTED, scrub

log = logging.getLogger(__name__)
MAX_BACKOFF_S = 60.0
DEFAULT_TIMEOUT_S = 600.0  # one request's timeout unless --llm-timeout says otherwise
STORED_CHARS = 64 * 1024  # of a call's prompt and of its reply, kept in its record
ECHOED_CHARS = 16 * 1024  # of an unusable reply, quoted back to the model with the reasons
CHARS_PER_TOKEN = 4  # for estimating token counts a reply does not give
__all__ = ["ChatReply", "Failure", "LLMBudgetExceeded", "LLMFatalError", "LLMMalformedReply", "LLMProposer",
           "LLMTransientError", "ProposerUnavailable", "cost_usd", "http_error", "load_prices", "sdk_error"]


class LLMBudgetExceeded(ConjugateError):
    """The LLM spending reached its cap; raised before a request would be made."""


class ChatClient(Protocol):
    def complete(self, system: str, messages: list[dict], max_tokens: int,
                 time_left_s: float | None = None) -> ChatReply:
        """One chat request (messages: {"role", "content"}) taking at most its own timeout or
        `time_left_s`, whichever is less; raises LLMTransientError or LLMFatalError."""
        ...


def request_timeout(timeout_s: float, time_left_s: float | None) -> float:
    """A request's timeout: the client's own, or the time left when that is less."""
    return timeout_s if time_left_s is None else max(0.001, min(timeout_s, time_left_s))


def stored(text: str, limit: int = STORED_CHARS) -> str:
    """`text` as a record keeps it: scrubbed of secrets first (a key cut in two would no longer be
    recognised), then its first `limit` characters, and its length when longer."""
    text = scrub(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[... stored {limit} of {len(text)} characters]"


def estimated_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


def redact(text: str, secret: str | None) -> str:
    """`text` without the secret (configured or not) and without anything shaped like an API key."""
    return scrub(text.replace(secret, REDACTED) if secret else text)


def http_error(status: int, message: str, retry_after: str | None = None) -> ConjugateError:
    """An HTTP failure as the proposer's error: 408, 409, 429 and 5xx are worth repeating."""
    message = f"HTTP {status}: {message}"
    if status in (408, 409, 429) or status >= 500:
        try:
            wait = float(retry_after) if retry_after else None
        except ValueError:
            wait = None
        return LLMTransientError(message, wait, Failure.STATUS)
    return LLMFatalError(message)


def sdk_error(sdk: ModuleType, e: Exception, key: str | None) -> ConjugateError:
    """A failure of the anthropic or openai SDK (they share these exception classes) as the
    proposer's error: rate limits, 5xx, timeouts and lost connections are transient; the rest fatal.
    The message carries no key."""
    message = redact(f"{type(e).__name__}: {e}", key)[:500]
    if isinstance(e, sdk.APITimeoutError):
        return LLMTransientError(message, failure=Failure.TIMEOUT)
    if isinstance(e, sdk.APIConnectionError):
        return LLMTransientError(message, failure=Failure.CONNECTION)
    if isinstance(e, sdk.APIStatusError):
        return http_error(e.status_code, message, e.response.headers.get("retry-after"))
    return LLMFatalError(message)


def load_prices(path: Path = PRICES_FILE) -> dict[str, tuple[float, float]]:
    """Model name or glob -> (input, output) US dollars per million tokens; {} if the file is absent."""
    if not path.exists():
        return {}
    try:
        models = tomllib.loads(read_text(path, ConjugateError, "price file")).get("models", {})
        return {name: (float(p["input"]), float(p["output"])) for name, p in models.items()}
    except (tomllib.TOMLDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
        raise ConjugateError(f"{path}: each [models] entry needs numeric input and output prices ({e})") from e


def cost_usd(model: str, input_tokens: int, output_tokens: int, prices: dict[str, tuple[float, float]]) -> float:
    """Exact name first, else the longest matching glob or prefix; 0 for unknown (local) models."""
    if model not in prices:
        hits = [k for k in prices if fnmatch.fnmatchcase(model, k) or model.startswith(k)]
        model = max(hits, key=len, default=None)
    price_in, price_out = prices.get(model, (0.0, 0.0))
    return (input_tokens * price_in + output_tokens * price_out) / 1e6


class LLMProposer:
    """Proposes edits by asking a chat model. Out of propose() come only proposals,
    ProposerUnavailable (no reply came; the reason is also in `last_error`) and LLMBudgetExceeded."""

    def __init__(self, client: ChatClient, provider: str, model: str, log_call: LLMCallLog | None = None,
                 max_cost_usd: float | None = None, spent_usd: float = 0.0, prompts_dir: Path = PROMPTS_DIR,
                 max_retries: int = 4, backoff_s: float = 1.0, max_tokens: int = 16384,
                 prices: dict[str, tuple[float, float]] | None = None):
        self.client, self.provider, self.model, self.name = client, provider, model, f"{provider}:{model}"
        self.log_call, self.max_cost_usd, self.spent_usd = log_call, max_cost_usd, spent_usd
        self.max_retries, self.backoff_s = max_retries, backoff_s
        self.max_tokens = max_tokens  # generous: reasoning models spend part of it thinking
        self.prompts = Prompts(prompts_dir)
        self.prices = load_prices() if prices is None else prices
        if max_cost_usd is not None and not cost_usd(model, 1, 1, self.prices):
            log.warning("%s has no price in %s: the cost cap does not limit it", self.name, PRICES_FILE)
        self.last_error = ""
        self._jitter = random.Random(0)

    def propose(self, context: NodeContext, n: int) -> list[Proposal]:
        if n <= 0:
            return []
        self.last_error = ""
        try:
            current = context.plan if isinstance(context.plan, Plan) else validate_plan(context.plan)
        except PlanError as e:
            self.last_error = f"{self.name}: the node's plan is invalid: {e}"
            return []
        seen = {current.hash: "changes nothing (the plan stays the same)"}
        for t in context.tried:
            try:
                seen.setdefault(patch_plan(current, t.get("patch")).hash, "makes a plan already tried from this node")
            except (ConjugateError, TypeError):
                continue
        system = self.prompts.system_text()
        messages = [{"role": "user", "content": self.prompts.expand_text(context, n)}]
        for attempt in range(2):  # the first reply, then one answer to an invalid reply
            reply = self._request(system, messages, context.deadline)
            edits, reasons = self._read(reply.text, current, seen, n)
            if edits or attempt:
                if not edits:
                    self.last_error = f"{self.name}: no usable edit: {'; '.join(reasons[:3])}"
                return edits
            messages += [{"role": "assistant", "content": clip(reply.text, ECHOED_CHARS) or "(empty reply)"},
                         {"role": "user", "content": self.prompts.retry_text(reasons, n)}]
        return []

    def _read(self, text: str, current: Plan, seen: dict[str, str], n: int) -> tuple[list[Proposal], list[str]]:
        try:
            edits = parse_reply(text)
        except ValueError as e:
            return [], [str(e)]
        return check_edits(edits, current, seen, n) if edits else ([], ['the "edits" list is empty'])

    def _request(self, system: str, messages: list[dict], deadline: float | None) -> ChatReply:
        """One reply, repeating transient failures with exponential backoff while time is left;
        ProposerUnavailable when none came."""
        for attempt in range(self.max_retries + 1):
            try:
                return self._send(system, messages, self._time_left(deadline))
            except LLMTransientError as e:
                self.last_error = f"{self.name}: {e}"
                if attempt < self.max_retries:
                    self._wait(self._delay(attempt, e.retry_after_s), deadline)
            except LLMFatalError as e:
                self.last_error = f"{self.name}: {e}"
                log.error("%s", self.last_error)
                raise ProposerUnavailable(self.last_error) from e
        log.warning("%s (gave up after %d attempts)", self.last_error, self.max_retries + 1)
        raise ProposerUnavailable(f"{self.last_error} (gave up after {self.max_retries + 1} attempts)")

    def _time_left(self, deadline: float | None) -> float | None:
        """Seconds until the search's deadline (None: no deadline); ProposerUnavailable when none are left."""
        if deadline is None:
            return None
        left = deadline - time.monotonic()
        if left <= 0:
            raise ProposerUnavailable(f"{self.name}: the search's time is up" +
                                      (f" (last failure: {self.last_error})" if self.last_error else ""))
        return left

    def _wait(self, delay: float, deadline: float | None) -> None:
        """Sleep before a retry, unless the deadline comes first."""
        if deadline is not None and time.monotonic() + delay >= deadline:
            raise ProposerUnavailable(f"{self.last_error} (no time left to try again)")
        time.sleep(delay)

    def _delay(self, attempt: int, retry_after_s: float | None) -> float:
        delay = max(self.backoff_s * 2 ** attempt, retry_after_s or 0.0)
        return min(delay, MAX_BACKOFF_S) * (1 + 0.25 * self._jitter.random())

    def _send(self, system: str, messages: list[dict], time_left_s: float | None) -> ChatReply:
        if self.max_cost_usd is not None and self.spent_usd >= self.max_cost_usd:
            raise LLMBudgetExceeded(f"{self.name}: LLM spending ${self.spent_usd:.4f} reached the cap "
                                    f"${self.max_cost_usd:.4f}")
        prompt = "\n\n".join([f"[system]\n{system}"] + [f"[{m['role']}]\n{m['content']}" for m in messages])
        record = {"provider": self.provider, "model": self.model, "prompt": stored(prompt), "reply": "",
                  "input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0, "latency_s": 0.0, "error": ""}
        start = time.monotonic()
        try:
            reply = self.client.complete(system, messages, self.max_tokens, time_left_s)
        except (LLMTransientError, LLMFatalError) as e:
            record["error"] = f"{type(e).__name__}: {e}"
            raise
        else:
            record |= self._account(reply, prompt)
            return reply
        finally:
            record["latency_s"] = round(time.monotonic() - start, 3)
            if self.log_call is not None:
                self.log_call(record)

    def _account(self, reply: ChatReply, prompt: str) -> dict:
        """The record's fields for a reply: its text as stored, token counts (estimated where the
        reply gave none), their cost (added to the spending), and notes on what was odd."""
        tokens_in = estimated_tokens(prompt) if reply.input_tokens is None else reply.input_tokens
        tokens_out = estimated_tokens(reply.text) if reply.output_tokens is None else reply.output_tokens
        cost = cost_usd(self.model, tokens_in, tokens_out, self.prices)
        self.spent_usd += cost
        return {"reply": stored(reply.text), "input_tokens": tokens_in, "output_tokens": tokens_out,
                "cost_usd": cost, "error": "; ".join(reply.notes)}
