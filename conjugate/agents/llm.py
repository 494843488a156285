"""The LLM proposer: renders the prompt templates, asks a chat model for plan edits, validates them.

Provider-agnostic: a ChatClient (agents/anthropic_agent.py, agents/openai_agent.py) sends one chat
request and maps its SDK's failures to LLMTransientError (worth repeating) or LLMFatalError. The
reply is data: parsed as JSON, never executed; every edit is applied and validated before it
becomes a Proposal, and a reply without a valid edit is answered once with the reasons (retry.md).
Every request, successful or not, goes to `log_call` as one record with the keys provider, model,
prompt, reply, input_tokens, output_tokens, cost_usd, latency_s and error.
"""
from __future__ import annotations

import fnmatch
import json
import logging
import random
import re
import string
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from conjugate.agents.base import EDIT_KINDS, LLMCallLog, NodeContext, Proposal
from conjugate.errors import ConjugateError, PlanError
from conjugate.files import read_text
from conjugate.plan.patch import patch_plan
from conjugate.plan.schema import Plan, validate_plan
from conjugate.workload import REPO_ROOT

log = logging.getLogger(__name__)
PROMPTS_DIR = REPO_ROOT / "search" / "prompts"
PRICES_FILE = REPO_ROOT / "search" / "prices.toml"
SCHEMA_FILE = REPO_ROOT / "plans" / "plan.schema.json"
MAX_BACKOFF_S = 60.0
_KEYLIKE = re.compile(r"\bsk-[A-Za-z0-9_\-*]{8,}")  # anything shaped like an API key


class LLMTransientError(ConjugateError):
    """A request that may succeed if repeated: rate limit, server error, timeout, lost connection."""

    def __init__(self, message: str, retry_after_s: float | None = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class LLMFatalError(ConjugateError):
    """A request that will not succeed as it is: bad key, no permission, bad request, unknown model."""


class LLMBudgetExceeded(ConjugateError):
    """The LLM spending reached its cap; raised before a request would be made."""


@dataclass(frozen=True)
class ChatReply:
    text: str
    input_tokens: int = 0
    output_tokens: int = 0


class ChatClient(Protocol):
    def complete(self, system: str, messages: list[dict], max_tokens: int) -> ChatReply:
        """One chat request (messages: {"role", "content"}); raises LLMTransientError or LLMFatalError."""
        ...


def redact(text: str, secret: str | None) -> str:
    """`text` without the secret and without anything shaped like an API key."""
    return _KEYLIKE.sub("***", text.replace(secret, "***") if secret else text)


def http_error(status: int, message: str, retry_after: str | None = None) -> ConjugateError:
    """An HTTP failure as the proposer's error: 408, 409, 429 and 5xx are worth repeating."""
    if status in (408, 409, 429) or status >= 500:
        try:
            wait = float(retry_after) if retry_after else None
        except ValueError:
            wait = None
        return LLMTransientError(message, wait)
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


def _json(value: Any, limit: int = 0, sort: bool = True) -> str:
    text = json.dumps(_short(value), sort_keys=sort, separators=(",", ":"), default=str)
    return _clip(text, limit) if limit else text


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _short(value: Any) -> Any:
    """Floats to 4 significant digits, recursively."""
    if isinstance(value, float):
        return float(f"{value:.4g}")
    if isinstance(value, dict):
        return {k: _short(v) for k, v in value.items()}
    return [_short(v) for v in value] if isinstance(value, list) else value


def _bullets(items: list, limit: int, fmt=str, empty: str = "none") -> str:
    lines = [f"- {fmt(x)}" for x in items[:limit]]
    if len(items) > limit:
        lines.append(f"- ... and {len(items) - limit} more")
    return "\n".join(lines) or empty


_VERDICT_KEYS = ("launch", "verdict", "gain_percent", "shared_us", "separate_us", "ops", "programs",
                 "registers", "spills")


def _scores(ctx: NodeContext) -> str:
    r = ctx.result
    if not r:
        return "not evaluated yet"
    out = {k: r.get(k) for k in ("status", "stage", "modeled")}
    out |= {k: v for k, v in (r.get("metrics") or {}).items() if isinstance(v, (int, float, str, dict))}
    if r.get("error"):
        out["error"] = _clip(str(r["error"]), 600)
    return _json(out)


def _verdicts(ctx: NodeContext, limit: int = 15) -> str:
    """Shared launches, largest |gain| first, joined with their compiler feedback."""
    r = ctx.result or {}
    feedback = {f.get("launch"): f for f in r.get("feedback") or [] if isinstance(f, dict)}
    rows = [{k: m[k] for k in _VERDICT_KEYS if k in m}
            for v in r.get("verdicts") or [] if isinstance(v, dict) for m in [feedback.get(v.get("launch"), {}) | v]]
    rows.sort(key=lambda row: -abs(row.get("gain_percent") or 0))
    return _bullets(rows, limit, lambda row: _json(row, sort=False), "none (no shared launch measured)")


def _feedback(ctx: NodeContext, limit: int = 10) -> str:
    items = [f for f in (ctx.result or {}).get("feedback") or [] if isinstance(f, dict)]
    if not items:
        return "none"
    notable = [{k: v for k, v in f.items() if k != "kernel"} for f in items if f.get("reason") or f.get("spills")]
    head = f"{len(items)} entries; {len(notable)} with a compile error or register spills"
    return head + ("\n" + _bullets(notable, limit, lambda f: _json(f, 400)) if notable else "")


def _pick(entry: dict, keys: tuple[str, ...]) -> str:
    return _json({k: entry.get(k) for k in keys}, 500)


def _best(entry: dict) -> str:
    plan = {k: v for k, v in (entry.get("plan") or {}).items() if k not in ("name", "description")}
    return (f"latency_ms={_json(entry.get('latency_ms'))} speedups={_json(entry.get('speedups') or {})}"
            f"\n  {_json(plan, 4000)}")


class Prompts:
    """The editable templates under `directory`: system.md, expand.md and retry.md ($placeholders)."""

    def __init__(self, directory: Path = PROMPTS_DIR, schema_file: Path = SCHEMA_FILE):
        self.system, self.expand, self.retry = (
            string.Template(read_text(Path(directory) / f"{n}.md", ConjugateError, "prompt template"))
            for n in ("system", "expand", "retry"))
        self.schema = _json(json.loads(read_text(schema_file, ConjugateError, "plan schema")))
        self.kinds = ", ".join(EDIT_KINDS)

    def system_text(self) -> str:
        return self.system.safe_substitute(kinds=self.kinds)

    def expand_text(self, ctx: NodeContext, n: int) -> str:
        return self.expand.safe_substitute(
            plan=json.dumps(ctx.plan, indent=1, sort_keys=True), schema=self.schema, n=n, kinds=self.kinds,
            workload=_json(ctx.workload), gpu=ctx.gpu, scores=_scores(ctx),
            baselines=_json(ctx.baselines) if ctx.baselines else "none measured",
            verdicts=_verdicts(ctx), feedback=_feedback(ctx), best=_bullets(ctx.best, 3, _best),
            lessons=_bullets(ctx.lessons, 20, lambda s: _clip(str(s), 300)),
            edit_stats=_bullets(sorted(ctx.edit_stats.items()), 20, lambda kv: f"{kv[0]}: {_json(kv[1])}"),
            tried=_bullets(ctx.tried, 20, lambda t: _pick(t, ("kind", "status", "reward", "patch"))),
            failures=_bullets(ctx.failures, 8, lambda f: _pick(f, ("status", "error", "patch"))))

    def retry_text(self, reasons: list[str], n: int) -> str:
        reasons_text = _bullets(reasons, 20, lambda s: _clip(s, 400))
        return self.retry.safe_substitute(reasons=reasons_text, n=n, kinds=self.kinds)


_FENCE = re.compile(r"```[A-Za-z]*[ \t]*\n?(.*?)```", re.S)


def parse_reply(text: str) -> list:
    """The "edits" list of the reply's JSON (a fenced block, else the first object that has one);
    raises ValueError saying what is wrong."""
    decoder, first_error, found = json.JSONDecoder(), "", False
    for chunk in [m.group(1) for m in _FENCE.finditer(text)] + [text]:
        start = chunk.find("{")
        while start != -1:
            try:
                obj, end = decoder.raw_decode(chunk, start)
            except json.JSONDecodeError as e:
                first_error = first_error or f"malformed JSON ({e.msg} at line {e.lineno} column {e.colno})"
                start = chunk.find("{", start + 1)
                continue
            if isinstance(obj, dict) and isinstance(obj.get("edits"), list):
                return obj["edits"]
            found, start = True, chunk.find("{", end)
    raise ValueError(first_error or ('the JSON object has no "edits" list' if found else "no JSON object in the reply"))


def _reason(e: Exception) -> str:
    """A validation error, its '$.a.b[0]' paths written as JSON Pointers like the patch's."""
    if isinstance(e, TypeError):  # e.g. an object where the schema wants a string
        return f"a value of the wrong type ({e}); see the schema"
    errors = e.errors if isinstance(e, PlanError) else [str(e)]
    out = []
    for err in errors[:5]:
        path, sep, why = err.partition(": ")
        if path.startswith("$"):
            err = (re.sub(r"\[(\d+)\]", r".\1", path[1:]).replace(".", "/") or "/") + sep + why
        out.append(err)
    return "; ".join(out)


def check_edit(edit: Any, current: Plan) -> tuple[Proposal, str]:
    """A reply's edit as a Proposal and the hash of the plan it makes; raises on anything invalid."""
    if not isinstance(edit, dict):
        raise ValueError('should be an object {"patch", "rationale", "kind"}')
    patch = [edit["patch"]] if isinstance(edit.get("patch"), dict) else edit.get("patch")
    if not isinstance(patch, list) or not patch:
        raise ValueError('"patch" should be a non-empty list of RFC 6902 operations')
    new = patch_plan(current, patch)
    kind = edit.get("kind") if edit.get("kind") in EDIT_KINDS else "other"
    rationale = _clip(" ".join(str(edit.get("rationale") or "").split()), 300)
    return Proposal(patch=patch, rationale=rationale, kind=kind), new.hash


def check_edits(edits: list, current: Plan, seen: dict[str, str], n: int) -> tuple[list[Proposal], list[str]]:
    """The valid, distinct edits (at most n) and a reason for each one dropped. `seen` maps plan
    hashes already taken to why they are not new; it is updated."""
    valid, reasons = [], []
    for i, edit in enumerate(edits, 1):
        try:
            proposal, digest = check_edit(edit, current)
        except (ConjugateError, ValueError, TypeError) as e:  # TypeError: unhashable values in lists
            reasons.append(f"edit {i}: {_reason(e)}")
            continue
        if digest in seen:
            reasons.append(f"edit {i}: {seen[digest]}")
            continue
        seen[digest] = f"makes the same plan as edit {i}"
        valid.append(proposal)
    return valid[:n], reasons


class LLMProposer:
    """Proposes edits by asking a chat model. Never raises out of propose() except LLMBudgetExceeded;
    a failed request leaves its reason in `last_error`."""

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
        try:
            current = validate_plan(context.plan)
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
            reply = self._request(system, messages)
            if reply is None:
                return []
            edits, reasons = self._read(reply.text, current, seen, n)
            if edits or attempt:
                return edits
            messages += [{"role": "assistant", "content": reply.text or "(empty reply)"},
                         {"role": "user", "content": self.prompts.retry_text(reasons, n)}]
        return []

    def _read(self, text: str, current: Plan, seen: dict[str, str], n: int) -> tuple[list[Proposal], list[str]]:
        try:
            edits = parse_reply(text)
        except ValueError as e:
            return [], [str(e)]
        return check_edits(edits, current, seen, n) if edits else ([], ['the "edits" list is empty'])

    def _request(self, system: str, messages: list[dict]) -> ChatReply | None:
        """One reply, repeating transient failures with exponential backoff; None if none came."""
        for attempt in range(self.max_retries + 1):
            try:
                return self._send(system, messages)
            except LLMTransientError as e:
                self.last_error = f"{self.name}: {e}"
                if attempt < self.max_retries:
                    time.sleep(self._delay(attempt, e.retry_after_s))
            except LLMFatalError as e:
                self.last_error = f"{self.name}: {e}"
                log.error("%s", self.last_error)
                return None
        log.warning("%s (gave up after %d attempts)", self.last_error, self.max_retries + 1)
        return None

    def _delay(self, attempt: int, retry_after_s: float | None) -> float:
        delay = max(self.backoff_s * 2 ** attempt, retry_after_s or 0.0)
        return min(delay, MAX_BACKOFF_S) * (1 + 0.25 * self._jitter.random())

    def _send(self, system: str, messages: list[dict]) -> ChatReply:
        if self.max_cost_usd is not None and self.spent_usd >= self.max_cost_usd:
            raise LLMBudgetExceeded(f"{self.name}: LLM spending ${self.spent_usd:.4f} reached the cap "
                                    f"${self.max_cost_usd:.4f}")
        prompt = "\n\n".join([f"[system]\n{system}"] + [f"[{m['role']}]\n{m['content']}" for m in messages])
        record = {"provider": self.provider, "model": self.model, "prompt": prompt, "reply": "",
                  "input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0, "latency_s": 0.0, "error": ""}
        start = time.monotonic()
        try:
            reply = self.client.complete(system, messages, self.max_tokens)
        except (LLMTransientError, LLMFatalError) as e:
            record["error"] = f"{type(e).__name__}: {e}"
            raise
        else:
            cost = cost_usd(self.model, reply.input_tokens, reply.output_tokens, self.prices)
            self.spent_usd += cost
            record |= {"reply": reply.text, "input_tokens": reply.input_tokens,
                       "output_tokens": reply.output_tokens, "cost_usd": cost}
            return reply
        finally:
            record["latency_s"] = round(time.monotonic() - start, 3)
            if self.log_call is not None:
                self.log_call(record)
