"""Measured facts about plan knobs (search/facts.toml), each with its provenance: the GPU, the date,
the command that measured it (`how`) and the commit that recorded it.

The heuristic reads its measured thresholds here (`figure`), and the LLM prompt shows the sentences
(`says`) of the facts measured on the GPU it runs on (`facts_for`). A file that does not parse, or
an entry missing a field, is an error naming the file, the entry and the field.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from conjugate.agents.base import EDIT_KINDS
from conjugate.errors import ConjugateError
from conjugate.files import check_table, read_toml, shown
from conjugate.paths import FACTS_FILE

MAX_FACTS = 12  # sentences shown per GPU: the prompt's budget
MAX_FACT_CHARS = 300
KNOBS = tuple(k for k in EDIT_KINDS if k != "other") + ("search",)  # what a fact may be about
EFFECTS = ("win", "loss", "neutral")
PAPER_MECHANISMS = ("cross",)  # knobs of the design itself: cross-model shared launches, packed layouts
PROVENANCE = ("gpu", "date", "commit", "how")
_REQUIRED = ("id", "knob", "effect") + PROVENANCE
_OPTIONAL = ("result", "says", "note", "value")


@dataclass(frozen=True)
class Fact:
    id: str
    knob: str  # one of KNOBS
    effect: str  # one of EFFECTS
    gpu: str  # a word of the device name, e.g. "H200"
    date: str
    commit: str
    how: str  # the command that measured it
    result: str = ""  # the file it wrote, under benchmarks/results/
    says: str = ""  # the sentence the prompt shows; "" keeps it out of the prompt
    note: str = ""  # why the code does what it does with it
    value: float | None = None  # the figure a rule reads


def load_facts(path: Path = FACTS_FILE) -> tuple[Fact, ...]:
    data = read_toml(Path(path), ConjugateError, "facts file")
    entries = data.get("fact", [])
    if set(data) - {"fact"} or not isinstance(entries, list):
        raise ConjugateError(f"{path}: expected only [[fact]] entries, got {', '.join(sorted(data)) or 'nothing'}")
    facts = tuple(_fact(e, f"{path}: fact[{i}]") for i, e in enumerate(entries))
    _check_set(facts, path)
    return facts


def _fact(entry, where: str) -> Fact:
    check_table(entry, where, _REQUIRED + _OPTIONAL, _REQUIRED)
    for key, allowed in (("knob", KNOBS), ("effect", EFFECTS)):
        if entry[key] not in allowed:
            raise ConjugateError(f"{where}: field '{key}' is {shown(entry[key])}, not one of {', '.join(allowed)}")
    if not all(isinstance(entry.get(k, ""), str) for k in ("result", "says", "note")):
        raise ConjugateError(f"{where}: fields 'result', 'says' and 'note' should be strings")
    if len(entry.get("says", "")) > MAX_FACT_CHARS:
        raise ConjugateError(f"{where}: field 'says' should be one sentence of at most {MAX_FACT_CHARS} characters")
    value = entry.get("value")
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ConjugateError(f"{where}: field 'value' should be a number, got {shown(value)}")
    return Fact(**{k: v for k, v in entry.items()} | {"value": None if value is None else float(value)})


def _check_set(facts: tuple[Fact, ...], path: Path) -> None:
    """Ids unique; at most MAX_FACTS sentences a GPU (the prompt's budget)."""
    ids = [f.id for f in facts]
    if twice := sorted({i for i in ids if ids.count(i) > 1}):
        raise ConjugateError(f"{path}: fact ids used twice: {', '.join(twice)}")
    for gpu in {f.gpu for f in facts}:
        if sum(1 for f in facts if f.gpu == gpu and f.says) > MAX_FACTS:
            raise ConjugateError(f"{path}: at most {MAX_FACTS} facts a GPU may have a 'says' sentence (the "
                                 f"prompt's budget); {gpu} has more")


def facts_for(device: str, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    """The facts with a sentence for the prompt measured on a GPU whose name the device name holds as
    whole words (case-insensitive: "H20" is not an H200)."""
    from conjugate.evaluate.measured import names_device

    return tuple(f for f in facts if f.says and device and names_device(f.gpu, device))


@functools.cache
def shipped_facts() -> dict[str, Fact]:
    """The shipped file's facts by id (read once)."""
    return {f.id: f for f in load_facts()}


def figure(fact_id: str) -> float:
    """The measured value a rule reads, by the fact's id."""
    value = shipped_facts()[fact_id].value
    if value is None:
        raise ConjugateError(f"{FACTS_FILE}: fact {fact_id!r} has no value")
    return value


def sentence(fact_id: str) -> str:
    """A shipped fact's sentence, for a rationale that cites it."""
    return shipped_facts()[fact_id].says
