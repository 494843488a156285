"""Measured facts about plan edits on a GPU model, for the LLM agents' prompt: what this project's
benchmarks found (search/facts.toml), shown when the evaluating GPU's name holds a [[gpu]] table's
`device`. A file that does not parse, or a table missing a field, is an error naming the file and
the field.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from conjugate.errors import ConjugateError
from conjugate.files import check_table, read_toml, shown
from conjugate.paths import FACTS_FILE

MAX_FACTS = 12
MAX_FACT_CHARS = 300


@dataclass(frozen=True)
class GpuFacts:
    device: str  # a part of the device name, e.g. "H200"
    date: str
    source: str
    facts: tuple[str, ...]


def load_facts(path: Path = FACTS_FILE) -> tuple[GpuFacts, ...]:
    data = read_toml(Path(path), ConjugateError, "facts file")
    tables = data.get("gpu", [])
    if set(data) - {"gpu"} or not isinstance(tables, list):
        raise ConjugateError(f"{path}: expected only [[gpu]] tables, got {', '.join(sorted(data)) or 'nothing'}")
    return tuple(_table(t, f"{path}: gpu[{i}]") for i, t in enumerate(tables))


def _table(table, where: str) -> GpuFacts:
    check_table(table, where, ("device", "date", "source", "facts"), ("device", "date", "source"))
    facts = table.get("facts")
    if not isinstance(facts, list) or not facts or not all(isinstance(f, str) and f.strip() for f in facts):
        raise ConjugateError(f"{where}: field 'facts' should be a non-empty list of sentences, got {shown(facts)}")
    if len(facts) > MAX_FACTS or max(map(len, facts)) > MAX_FACT_CHARS:
        raise ConjugateError(f"{where}: field 'facts' holds at most {MAX_FACTS} sentences of at most "
                             f"{MAX_FACT_CHARS} characters (the prompt's budget)")
    return GpuFacts(table["device"], table["date"], table["source"], tuple(facts))


def facts_for(device: str, facts: tuple[GpuFacts, ...]) -> GpuFacts | None:
    """The first table whose `device` the device name holds as whole words (case-insensitive: "H20"
    is not an H200), else None."""
    from conjugate.evaluate.measured import names_device

    return next((f for f in facts if device and names_device(f.device, device)), None)
