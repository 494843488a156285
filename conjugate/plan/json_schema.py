"""plans/plan.schema.json, generated from the plan's declaration (conjugate/plan/schema.py).

    python -m conjugate.plan.json_schema            # rewrite plans/plan.schema.json
    python -m conjugate.plan.json_schema --check    # exit 1 where the committed file differs
"""
from __future__ import annotations

import argparse
import json
import sys

from conjugate.files import write_generated
from conjugate.paths import PLAN_SCHEMA_FILE as SCHEMA_FILE
from conjugate.plan.fields import Record
from conjugate.plan.schema import PLAN, RULES, SCHEMA


def _default_at(path: tuple[str, ...]):
    field: Record = PLAN
    for key in path:
        field = field.fields[key]
    return field.default


def plan_json_schema() -> dict:
    """The JSON Schema (draft 2020-12) of a conjugate.plan/2 plan: its fields and the rules between them."""
    defs: dict = {}
    body = PLAN.json_schema(defs)
    rules = [rule.json_schema(_default_at) for rule in RULES]
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA,
            "title": "Conjugate cross-model plan"} | body | {"allOf": rules, "$defs": dict(sorted(defs.items()))}


def schema_text() -> str:
    return json.dumps(plan_json_schema(), indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conjugate.plan.json_schema", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether the committed file is current")
    args = parser.parse_args(argv)
    return write_generated(SCHEMA_FILE, schema_text(), "python -m conjugate.plan.json_schema", args.check)

if __name__ == "__main__":
    sys.exit(main())
