"""Rules between plan fields, declared once: each checks a canonical plan and writes its JSON Schema
(`if`/`then`, `not`/`allOf`) beside the fields' own."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from conjugate.files import shown_json

Path = tuple[str, ...]  # keys from the plan's root: ("draft", "stream", "sms")


def shown_path(path: Path) -> str:
    return "$." + ".".join(path)


def value_at(plan: dict, path: Path) -> Any:
    for key in path:
        plan = plan[key]
    return plan


def _nest(path: Path, leaf: dict, required: bool) -> dict:
    """A JSON Schema that applies `leaf` at `path` (and, `required`, needs every key on the way)."""
    schema = leaf
    for key in reversed(path):
        schema = {"properties": {key: schema}} | ({"required": [key]} if required else {})
    return schema


@dataclass(frozen=True)
class Needs:
    """A field set to anything but `free` needs another field to be one of `allowed`."""

    path: Path
    free: tuple
    needs: Path
    allowed: tuple
    why: str  # what the field does, which makes the other needed

    def check(self, plan: dict) -> list[str]:
        value = value_at(plan, self.path)
        if value in self.free or value_at(plan, self.needs) in self.allowed:
            return []
        wanted = " or ".join(shown_json(a) for a in self.allowed)
        return [f"{shown_path(self.path)}: {shown_json(value)} {self.why}, so it needs {shown_path(self.needs)} {wanted}"]

    def json_schema(self, default_of: Callable[[Path], Any]) -> dict:
        then_required = default_of(self.needs) not in self.allowed  # a missing field holds its default
        return {"if": _nest(self.path, {"not": {"enum": list(self.free)}}, required=True),
                "then": _nest(self.needs, {"enum": list(self.allowed)}, required=then_required)}


@dataclass(frozen=True)
class Only:
    """A field that takes only some of its type's values here (the target's launch form)."""

    path: Path
    allowed: tuple
    why: str  # why the other values cannot apply

    def check(self, plan: dict) -> list[str]:
        value = value_at(plan, self.path)
        if value in self.allowed:
            return []
        wanted = " or ".join(shown_json(a) for a in self.allowed)
        return [f"{shown_path(self.path)}: {shown_json(value)}: {self.why}, so it can only be {wanted}"]

    def json_schema(self, default_of: Callable[[Path], Any]) -> dict:
        return _nest(self.path, {"enum": list(self.allowed)}, required=False)


@dataclass(frozen=True)
class AtMostOne:
    """Of these fields, at most one may be set to anything but `free`."""

    paths: tuple[Path, ...]
    free: tuple
    why: str

    def check(self, plan: dict) -> list[str]:
        set_ = [p for p in self.paths if value_at(plan, p) not in self.free]
        if len(set_) < 2:
            return []
        return [f"{shown_path(set_[-1])}: {shown_json(value_at(plan, set_[-1]))} {self.why}"]

    def json_schema(self, default_of: Callable[[Path], Any]) -> dict:
        return {"not": {"allOf": [_nest(p, {"not": {"enum": list(self.free)}}, required=True) for p in self.paths]}}
