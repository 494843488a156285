"""Secrets never persist: the scrubber applied to everything the package stores, logs or exports.

`scrub(text)` replaces with REDACTED, wherever they appear in the text:

- the configured keys: the values of KEY_VARIABLES (what the agents and their SDKs read), whatever
  they look like, from MIN_KEY_CHARS characters on (a shorter value, such as a local server's "x",
  is no secret and would mangle ordinary text);
- anything shaped like an API key: the prefixed forms of the well-known providers (`sk-...` with a
  digit, `sk-ant-...`, `ghp_...`, `hf_...`, `AIza...`, `AKIA...`, JSON Web Tokens), a token of 16 or
  more characters after `Bearer` or after a label such as `x-api-key:` or `api_key=`, and any
  unlabelled run of 32 or more letters, digits, `_` and `-` that mixes upper case, lower case and
  digits as random text does (see `_looks_random`).

Left alone on purpose: hex digests of any length (plan hashes, evaluation keys: no upper case),
UUIDs, op ids, paths, CamelCase identifiers and prose. A provider key made only of hex digits or of
one letter case is therefore caught only when configured.

The configured keys are read from the environment at every call (a few dictionary look-ups), so a
key set after the process started is caught; every value seen is remembered for the life of the
process, so one unset later is still caught. Patterns are compiled once (the configured keys' once
per set of values).

Chokepoints: the store's column types (search/store/schema.py), every log record of the process
(`scrub_log_records`, installed when the package is imported), the search's console lines
(search/live.py, cli.py) and the exported files (search/report.py).
"""
from __future__ import annotations

import logging
import math
import os
import re
from collections import Counter
from functools import lru_cache
from typing import Any

REDACTED = "***"
KEY_VARIABLES = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "OPENAI_API_KEY")
MIN_KEY_CHARS = 8
RANDOM_MIN_CHARS = 32

_TOKEN = r"[A-Za-z0-9_-]"
_PREFIXED = re.compile(
    rf"(?<!{_TOKEN})(?:"
    rf"sk-(?={_TOKEN}*\d){_TOKEN}{{20,}}"  # OpenAI, Anthropic (sk-ant-), OpenRouter (sk-or-), DeepSeek
    r"|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_\w{40,}"  # GitHub
    r"|hf_[A-Za-z0-9]{30,}"  # Hugging Face
    rf"|AIza{_TOKEN}{{35}}"  # Google
    r"|xox[abposr]-[A-Za-z0-9-]{10,}"  # Slack
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}"  # AWS access key ids
    rf"|eyJ{_TOKEN}{{10,}}\.eyJ{_TOKEN}{{10,}}\.{_TOKEN}{{10,}}"  # JSON Web Tokens
    r")")
_LABELLED = re.compile(
    r"(?i)(\bbearer\s+"
    r"|\b(?:x-api-key|api[-_]?key|auth[-_]?token|access[-_]?token|secret[-_]?key|client[-_]?secret|password)"
    r"[\"']?\s*[:=]\s*[\"']?)"
    r"([A-Za-z0-9._~+/-]{16,}=*)")
_CANDIDATE = re.compile(rf"(?<!{_TOKEN}){_TOKEN}{{{RANDOM_MIN_CHARS},}}(?!{_TOKEN})")
_LOWER_WORD = re.compile(r"[a-z]{3,}")
_seen_keys: frozenset[str] = frozenset()


def scrub(text: str) -> str:
    """`text` without the configured keys and without anything shaped like an API key."""
    if len(text) < MIN_KEY_CHARS:
        return text
    keys = _key_pattern(configured_keys())
    if keys is not None:
        text = keys.sub(REDACTED, text)
    text = _PREFIXED.sub(REDACTED, text)
    text = _LABELLED.sub(lambda m: m.group(1) + REDACTED, text)
    return _CANDIDATE.sub(lambda m: REDACTED if _looks_random(m.group()) else m.group(), text)


def scrub_tree(value: Any) -> Any:
    """A JSON-like value (dicts, lists, tuples, strings, numbers) with every string scrubbed, keys included."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        return {scrub_tree(k): scrub_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub_tree(v) for v in value]
    if isinstance(value, tuple):
        return tuple(scrub_tree(v) for v in value)
    return value


def configured_keys() -> frozenset[str]:
    """Every value of KEY_VARIABLES seen in this process so far (MIN_KEY_CHARS or longer)."""
    global _seen_keys
    now = {v for v in (os.environ.get(name, "").strip() for name in KEY_VARIABLES) if len(v) >= MIN_KEY_CHARS}
    if not now <= _seen_keys:
        _seen_keys = _seen_keys | now  # rebound, never mutated: safe to read from any thread
    return _seen_keys


@lru_cache(maxsize=8)
def _key_pattern(keys: frozenset[str]) -> re.Pattern | None:
    if not keys:
        return None
    return re.compile("|".join(re.escape(k) for k in sorted(keys, key=len, reverse=True)))


def _looks_random(token: str) -> bool:
    """Upper case, lower case and digits, alternating often, few runs of lower-case letters (the
    words of an identifier), and near the entropy of random text: a key, not a CamelCase or
    hyphenated name, not a hex digest. Random base62 or base64url text passes: 98% of 32-character
    tokens, 99% of 40, 99.8% of 64. Names rarely do (acronyms run together can, such as
    KMSDataKeyForS3AndEC2Permissions); base64 data does."""
    alnum = token.replace("-", "").replace("_", "")
    if len(alnum) < 0.75 * RANDOM_MIN_CHARS or {_char_class(c) for c in alnum} != {0, 1, 2}:
        return False
    changes = sum(_char_class(a) != _char_class(b) for a, b in zip(alnum, alnum[1:]))
    in_words = sum(len(w) for w in _LOWER_WORD.findall(alnum))
    return (changes >= 0.35 * len(alnum) and in_words < 0.45 * len(alnum)
            and _entropy_bits(alnum) >= 0.8 * math.log2(min(len(alnum), 62)))


def _char_class(c: str) -> int:
    """0 upper case, 1 lower case, 2 digit (`alnum` holds nothing else)."""
    return 0 if c.isupper() else 1 if c.islower() else 2


def _entropy_bits(text: str) -> float:
    n = len(text)
    return -sum(k / n * math.log2(k / n) for k in Counter(text).values())


# -- logs

_FORMATTER = logging.Formatter()


def scrub_log_records() -> None:
    """From now on every log record of this process, whoever logs it, carries a scrubbed message,
    exception text and stack (idempotent)."""
    current = logging.getLogRecordFactory()
    if getattr(current, "scrubs_secrets", False):
        return

    def make_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = current(*args, **kwargs)
        _scrub_record(record)
        return record
    make_record.scrubs_secrets = True
    logging.setLogRecordFactory(make_record)


def _scrub_record(record: logging.LogRecord) -> None:
    try:
        record.msg, record.args = scrub(record.getMessage()), None
    except Exception:  # a bad format or a failing __str__: logging reports it on emit, scrubbed
        record.msg, record.args = scrub_tree(record.msg), scrub_tree(record.args)
    if record.exc_info and not record.exc_text:
        record.exc_text = scrub(_FORMATTER.formatException(record.exc_info))
    if record.stack_info:
        record.stack_info = scrub(record.stack_info)
