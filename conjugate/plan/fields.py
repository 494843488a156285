"""Declarative plan fields: each kind of field checks a value into its canonical form and writes
its own JSON Schema, so the checker and plans/plan.schema.json come from one declaration.

`check(value, path, errors)` appends 'PATH: reason' lines to `errors` and returns the canonical
value (the default where the value was unusable, so checking goes on and reports every problem);
`json_schema(defs)` returns the field's JSON Schema, adding named records to `defs`.
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from conjugate.files import NAME_MAX, is_shown_name, shown, shown_json
from conjugate.plan.tiles import is_power_of_two

_PLAIN_KEY = re.compile(r"[A-Za-z0-9_+*]{1,40}")  # a key shown in a JSON path as .key, any other as ["key"]


def member(path: str, key: Any) -> str:
    """The JSON path of an object's member: `$.draft.tiles`, or `$.draft["odd key"]` for a key that is
    not a plain name (spaces, line breaks, punctuation, or too long to show)."""
    key = str(key)
    return f"{path}.{key}" if _PLAIN_KEY.fullmatch(key) else f"{path}[{shown_json(key)}]"


def kind_of(value: Any) -> str:
    """A value's JSON kind, for 'should be X, got Y'."""
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), type(value).__name__ if not isinstance(value, (int, float)) else f"the number {shown(value)}")


@dataclass(frozen=True)
class Choice:
    """One of a few strings."""

    options: tuple[str, ...]
    default: str
    doc: str = ""

    def check(self, value: Any, path: str, errors: list[str]) -> str:
        if value not in self.options or not isinstance(value, str):
            errors.append(f"{path}: {shown_json(value)} is not one of {', '.join(self.options)}")
            return self.default
        return value

    def json_schema(self, defs: dict) -> dict:
        return _doc({"enum": list(self.options), "default": self.default}, self.doc)


@dataclass(frozen=True)
class Integer:
    """An integer within [low, high]; optionally a power of two, or a multiple of `step`."""

    low: int
    high: int
    default: int
    power_of_two: bool = False
    step: int = 1
    why_step: str = ""  # why it must be a multiple of `step`
    doc: str = ""

    def check(self, value: Any, path: str, errors: list[str]) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            errors.append(f"{path}: should be an integer, got {kind_of(value)}")
            return self.default
        if self.power_of_two and not is_power_of_two(value):
            errors.append(f"{path}: {value} is not a power of two")
        elif not self.low <= value <= self.high:
            errors.append(f"{path}: {shown(value)} is out of range [{self.low}, {self.high}]")
        elif value % self.step:
            errors.append(f"{path}: should be a multiple of {self.step} ({self.why_step}), got {value}")
        else:
            return value
        return self.default

    def json_schema(self, defs: dict) -> dict:
        out = {"type": "integer", "minimum": self.low, "maximum": self.high, "default": self.default}
        if self.power_of_two:
            out["enum"] = [1 << n for n in range(self.high.bit_length()) if self.low <= 1 << n <= self.high]
        if self.step > 1:
            out["multipleOf"] = self.step
        return _doc(out, self.doc)


@dataclass(frozen=True)
class Flag:
    default: bool = False
    doc: str = ""

    def check(self, value: Any, path: str, errors: list[str]) -> bool:
        if not isinstance(value, bool):
            errors.append(f"{path}: should be a boolean, got {kind_of(value)}")
            return self.default
        return value

    def json_schema(self, defs: dict) -> dict:
        return _doc({"type": "boolean", "default": self.default}, self.doc)


@dataclass(frozen=True)
class Text:
    """A string; `shown_name`: empty or one that tables show as it is; `prefix`: what it must start with."""

    default: str = ""
    max_length: int | None = None
    shown_name: bool = False
    prefix: str = ""
    prefix_hint: str = ""  # the reason shown when the prefix is missing
    doc: str = ""

    def check(self, value: Any, path: str, errors: list[str]) -> str:
        if not isinstance(value, str):
            errors.append(f"{path}: should be a string, got {kind_of(value)}")
        elif self.shown_name and value and not is_shown_name(value):
            errors.append(f"{path}: is {shown_json(value)}; 1 to {NAME_MAX} printable characters")
        elif self.max_length is not None and len(value) > self.max_length:
            errors.append(f"{path}: is {len(value)} characters long; at most {self.max_length}")
        elif not value.startswith(self.prefix):
            errors.append(f"{path}: {shown_json(value)} {self.prefix_hint}")
        else:
            return value
        return self.default

    def json_schema(self, defs: dict) -> dict:
        out: dict = {"type": "string"}
        limit = NAME_MAX if self.shown_name else self.max_length
        if limit is not None:
            out["maxLength"] = limit
        if self.shown_name:
            out["pattern"] = r"^[^\u0000-\u001f\u007f-\u009f]*$"  # no control character
        if self.prefix:
            out["pattern"] = "^" + re.escape(self.prefix)
        return _doc(out, self.doc)


@dataclass(frozen=True)
class Names:
    """A set of names drawn from `options`, written as a list; canonical: sorted, without repeats
    (`any` collapses the set to itself)."""

    options: tuple[str, ...]
    item: str  # "an op kind", for errors
    any: str | None = None
    doc: str = ""

    @property
    def default(self) -> list:
        return []

    def check(self, value: Any, path: str, errors: list[str]) -> list[str]:
        if not isinstance(value, list):
            errors.append(f"{path}: should be a list of {self.item}s, got {kind_of(value)}")
            return []
        allowed = self.options + ((self.any,) if self.any else ())
        chosen = set()
        for i, v in enumerate(value):
            if not isinstance(v, str):  # an object or a list here is an error, not a set member
                errors.append(f"{path}[{i}]: should be {self.item} string, got {kind_of(v)}")
            elif v not in allowed:
                errors.append(f"{path}[{i}]: {shown_json(v)} is not one of {', '.join(allowed)}")
            else:
                chosen.add(v)
        return [self.any] if self.any in chosen else sorted(chosen)

    def json_schema(self, defs: dict) -> dict:
        options = list(self.options) + ([self.any] if self.any else [])
        return _doc({"type": "array", "items": {"enum": options}, "default": []}, self.doc)


@dataclass(frozen=True)
class IntPair:
    """Two integers, such as a [target, draft] ratio."""

    item: Integer
    what: str  # "[target, draft]"
    doc: str = ""

    @property
    def default(self) -> list[int]:
        return [self.item.default, self.item.default]

    def check(self, value: Any, path: str, errors: list[str]) -> list[int]:
        if not (isinstance(value, list) and len(value) == 2):
            errors.append(f"{path}: should be a list of two integers {self.what}, got {shown_json(value)}")
            return self.default
        return [self.item.check(v, f"{path}[{i}]", errors) for i, v in enumerate(value)]

    def json_schema(self, defs: dict) -> dict:
        return _doc({"type": "array", "items": self.item.json_schema(defs), "minItems": 2, "maxItems": 2}, self.doc)


@dataclass(frozen=True)
class Record:
    """An object of named fields. `fill`: a missing field takes its default; otherwise the canonical
    form holds only the fields given (tile configs, overrides). `finish` tidies the canonical dict."""

    fields: dict[str, Any]
    doc: str = ""
    fill: bool = True
    required: dict[str, str] = field(default_factory=dict)  # field -> what to write there
    finish: Callable[[dict], dict] | None = None
    ref: str = ""  # a name: the JSON Schema defines it once, under $defs

    @property
    def default(self) -> dict:
        return {key: copy.deepcopy(f.default) for key, f in self.fields.items()} if self.fill else {}

    def check(self, value: Any, path: str, errors: list[str]) -> dict:
        if not isinstance(value, dict):
            errors.append(f"{path}: should be an object, got {kind_of(value)}")
            return self.default
        for key in value:
            if key not in self.fields:
                errors.append(f"{member(path, key)}: unknown key; allowed: {', '.join(self.fields)}")
        for key, what in self.required.items():
            if key not in value:
                errors.append(f"{member(path, key)}: required: {what}")
        out = {}
        for key, f in self.fields.items():
            if key in value or isinstance(f, Const):  # a missing constant is an error, not a default
                out[key] = f.check(value.get(key), member(path, key), errors)
            elif self.fill:
                out[key] = copy.deepcopy(f.default)
        return self.finish(out) if self.finish else out

    def json_schema(self, defs: dict) -> dict:
        out = {"type": "object", "additionalProperties": False,
               "properties": {key: f.json_schema(defs) for key, f in self.fields.items()}}
        required = [key for key, f in self.fields.items() if isinstance(f, Const)] + list(self.required)
        if required:
            out["required"] = required
        if not self.ref:
            return _doc(out, self.doc)
        defs[self.ref] = _doc(out, self.doc)
        return {"$ref": f"#/$defs/{self.ref}"}


@dataclass(frozen=True)
class ListOf:
    item: Record
    doc: str = ""

    @property
    def default(self) -> list:
        return []

    def check(self, value: Any, path: str, errors: list[str]) -> list:
        if not isinstance(value, list):
            errors.append(f"{path}: should be a list, got {kind_of(value)}")
            return []
        return [self.item.check(v, f"{path}[{i}]", errors) for i, v in enumerate(value)]

    def json_schema(self, defs: dict) -> dict:
        return _doc({"type": "array", "items": self.item.json_schema(defs), "default": []}, self.doc)


@dataclass(frozen=True)
class Const:
    value: str
    doc: str = ""

    @property
    def default(self) -> str:
        return self.value

    def check(self, value: Any, path: str, errors: list[str]) -> str:
        if value != self.value:
            errors.append(f"{path}: should be {shown_json(self.value)}, got {shown_json(value)}")
        return self.value

    def json_schema(self, defs: dict) -> dict:
        return _doc({"const": self.value}, self.doc)


def _doc(schema: dict, doc: str) -> dict:
    return {"description": doc, **schema} if doc else schema
