"""RFC 6902 JSON Patch, applied to plans: the edit language of the agents."""
from __future__ import annotations

import copy
import json
from typing import Any

from conjugate.errors import PatchError
from conjugate.files import check_nesting
from conjugate.plan.schema import Plan, validate_plan

MAX_VALUES = 100_000  # values in a patched document (a plan holds hundreds): each copy may double it
_OPS = {"add": ("path", "value"), "remove": ("path",), "replace": ("path", "value"),
        "move": ("from", "path"), "copy": ("from", "path"), "test": ("path", "value")}


def _tokens(pointer: Any, where: str) -> list[str]:
    """RFC 6901 JSON Pointer -> reference tokens."""
    if not isinstance(pointer, str) or (pointer and not pointer.startswith("/")):
        raise PatchError(f"{where}: {json.dumps(pointer)} is not a JSON Pointer (it must start with '/')")
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer.split("/")[1:]]


def _index(container: list, token: str, where: str, allow_end: bool) -> int:
    if token == "-" and allow_end:
        return len(container)
    if not token.isdigit() or (token != "0" and token.startswith("0")):
        raise PatchError(f"{where}: {token!r} is not an array index")
    index = int(token)
    if index > len(container) or (index == len(container) and not allow_end):
        raise PatchError(f"{where}: index {index} is out of range (array has {len(container)} items)")
    return index


def _parent(doc: Any, tokens: list[str], where: str) -> tuple[Any, str]:
    if not tokens:
        raise PatchError(f"{where}: the whole document cannot be the target")
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, where, allow_end=False)]
        else:
            raise PatchError(f"{where}: path not found at {token!r}")
    return node, tokens[-1]


def _get(doc: Any, tokens: list[str], where: str) -> Any:
    if not tokens:
        return doc
    parent, last = _parent(doc, tokens, where)
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(parent, last, where, allow_end=False)]
    raise PatchError(f"{where}: path not found at {last!r}")


def _add(doc: Any, tokens: list[str], value: Any, where: str) -> None:
    parent, last = _parent(doc, tokens, where)
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, where, allow_end=True), value)
    else:
        raise PatchError(f"{where}: cannot add inside a {type(parent).__name__}")


def _remove(doc: Any, tokens: list[str], where: str) -> Any:
    parent, last = _parent(doc, tokens, where)
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list):
        return parent.pop(_index(parent, last, where, allow_end=False))
    raise PatchError(f"{where}: path not found at {last!r}")


def apply_patch(document: Any, patch: Any) -> Any:
    """A new document with the patch applied; the input is left untouched. Atomic: any failing
    operation raises PatchError naming it, and nothing is applied."""
    if not isinstance(patch, list):
        raise PatchError(f"a patch is a list of operations, got {type(patch).__name__}")
    check_nesting(patch, "patch", PatchError)  # before anything copies it recursively
    doc = copy.deepcopy(document)
    room = MAX_VALUES - _count(doc, MAX_VALUES)  # what copies may add: copy after copy would grow exponentially
    for i, op in enumerate(patch):
        doc, room = _apply_one(doc, op, i, room)
    return doc


def _count(value: Any, limit: int) -> int:
    """The values in `value` (itself, and every item and key inside), counted up to just past `limit`."""
    count, pending = 0, [value]
    while pending and count <= limit:
        item = pending.pop()
        count += 1
        if isinstance(item, dict):
            count += len(item)
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return count


def _apply_one(doc: Any, op: Any, i: int, room: int) -> tuple[Any, int]:
    name = op.get("op") if isinstance(op, dict) else None
    if name not in _OPS:
        raise PatchError(f"patch op {i}: 'op' must be one of {', '.join(_OPS)}, got {json.dumps(name)}")
    for member in _OPS[name]:
        if member not in op:
            raise PatchError(f"patch op {i} ({name}): missing member {member!r}")
    where = f"patch op {i} ({name} {op['path']})"
    path = _tokens(op["path"], where)
    if name == "test":
        if _get(doc, path, where) != op["value"]:
            raise PatchError(f"{where}: test failed, value is {json.dumps(_get(doc, path, where))}")
        return doc, room
    if name == "replace":
        _get(doc, path, where)  # must exist
        if not path:
            return copy.deepcopy(op["value"]), room
        _remove(doc, path, where)
        _add(doc, path, copy.deepcopy(op["value"]), where)
    elif name == "add":
        if not path:
            return copy.deepcopy(op["value"]), room
        _add(doc, path, copy.deepcopy(op["value"]), where)
    elif name == "remove":
        _remove(doc, path, where)
    else:
        source = _tokens(op["from"], where)
        if name == "move" and path[:len(source)] == source and path != source:
            raise PatchError(f"{where}: cannot move a value into one of its own children")
        if name == "copy":
            room -= _count(_get(doc, source, where), room)
            if room < 0:
                raise PatchError(f"{where}: the copies make the document larger than {MAX_VALUES} values")
        value = _remove(doc, source, where) if name == "move" else copy.deepcopy(_get(doc, source, where))
        _add(doc, path, value, where)
    return doc, room


def patch_plan(plan: Plan, patch: Any) -> Plan:
    """Apply a JSON Patch to a plan and validate the result (PatchError / PlanError on failure)."""
    return validate_plan(apply_patch(plan.to_dict(), patch), source="patched plan")
