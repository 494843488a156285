"""The LLM proposer's words: the prompt templates rendered from a node's context, and the reply
read back as plan edits.

The templates (search/prompts/system.md, expand.md, retry.md) are editable files with $placeholders
(the expand prompt also shows what the benchmarks measured on this GPU model: search/facts.toml,
and the tiles measured fastest for this workload's shapes: search/tiles.json);
`Prompts` fills them with compact JSON (floats to 4 significant digits, long values clipped). A reply
is data: `parse_reply` finds its "edits" list in time linear in the reply's length (at most
MAX_REPLY_CHARS of it, JSON nested at most MAX_DEPTH deep), `check_edits` applies and validates
every edit (the first MAX_EDITS, each of at most MAX_PATCH_OPS operations) and says why each dropped
one was dropped, in the patch's own JSON Pointer paths.

The budget: every section has a cap (items and characters), so a prompt with every section full
stays under PROMPT_BUDGET_CHARS (about 14.5K tokens) besides the current plan's own JSON, which is
sent whole (the edits' JSON Pointers need it).
"""
from __future__ import annotations

import json
import re
import string
from pathlib import Path
from typing import Any, Iterator

from conjugate.agents.base import EDIT_KINDS, NodeContext, Proposal
from conjugate.agents.facts import MAX_FACTS, facts_for, load_facts
from conjugate.agents.heuristic.tile_table import load_tile_tables, tiles_for
from conjugate.agents.llm.wire import MAX_DEPTH, Span, json_spans
from conjugate.compiler.feedback import PartRef, Resources
from conjugate.errors import ConjugateError, PlanError
from conjugate.files import read_text
from conjugate.paths import FACTS_FILE, PLAN_SCHEMA_FILE, PROMPTS_DIR, TILES_FILE
from conjugate.plan.patch import patch_plan
from conjugate.plan.schema import Plan
from conjugate.text import visible

MAX_REPLY_CHARS = 128 * 1024  # twice the text of the proposer's max_tokens (16384)
MAX_RESCANS = 8  # unclosed "{" (in prose) after which a reply is scanned again from the next "{"
MAX_EDITS = 32  # edits of one reply that are read
MAX_PATCH_OPS = 64  # operations of one edit
MAX_MEASURED_TILES = 10  # a draft's and a target's GEMM and attention kinds
PROMPT_BUDGET_CHARS = 58_500  # system and expand prompts with every section full, the current plan aside


def _json(value: Any, limit: int = 0, sort: bool = True) -> str:
    text = json.dumps(_short(value), sort_keys=sort, separators=(",", ":"), default=str)
    return clip(text, limit) if limit else text


def clip(text: str, limit: int) -> str:
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


def _scores(ctx: NodeContext) -> str:
    r = ctx.result
    if r is None:
        return "not evaluated yet"
    out: dict[str, Any] = {"status": r.status, "stage": r.stage, "modeled": r.modeled}
    if r.metrics:
        out |= {k: v for k, v in r.metrics.to_dict().items() if v is not None and k not in _NOT_SCORES}
    if r.error:
        out["error"] = clip(r.error, 600)
    if r.plan_errors:
        out["plan_errors"] = [clip(e, 200) for e in r.plan_errors[:10]]
    return _json(out)


_NOT_SCORES = ("device", "sms", "baselines", "ledger")  # said elsewhere in the prompt


def _ledger(ctx: NodeContext, top: int = 8) -> str:
    """The time ledger's lines: the round against its floor, then the op kinds losing most."""
    r = ctx.result
    if r is None or r.metrics is None or r.metrics.ledger is None:
        return "none (no ledger for this plan)"
    head, *kinds = r.metrics.ledger.lines(top)
    return "\n".join([head] + [f"- {line}" for line in kinds])


def _launch(parts: tuple[PartRef, ...], resources: Resources) -> dict[str, Any]:
    """A launch's parts and (GPU) resources, as the prompt shows them."""
    row = {"ops": [p.label for p in parts], "programs": [p.programs for p in parts]}
    return row | {k: v for k, v in resources.to_dict().items() if v is not None}


def _verdicts(ctx: NodeContext, limit: int = 15) -> str:
    """Shared launches, largest |gain| first, with their compiler feedback."""
    r = ctx.result
    if r is None or not r.verdicts:
        return "none (no shared launch measured)"
    feedback = {f.launch: f for f in r.feedback}
    rows = []
    for v in sorted(r.verdicts, key=lambda v: -abs(v.gain_percent)):
        f = feedback.get(v.launch)
        resources = v.resources if v.resources != Resources() or f is None else f.resources
        overlap = {} if v.overlap_us is None else {
            "overlap_us": v.overlap_us, "vs_overlap": v.overlap_verdict, "gain_vs_overlap_percent": v.overlap_gain_percent}
        rows.append({"launch": v.launch, "verdict": v.verdict, "gain_percent": v.gain_percent,
                     "shared_us": v.shared_us, "separate_us": v.separate_us} | overlap
                    | _launch(f.parts if f else v.parts, resources))
    return _bullets(rows, limit, lambda row: _json(row, sort=False))


def _feedback(ctx: NodeContext, limit: int = 10) -> str:
    r = ctx.result
    if r is None or not (r.feedback or r.compile_failure):
        return "none"
    lines = []
    if r.compile_failure:
        lines.append(f"compile error at {r.compile_failure.message}")
    spills = [f for f in r.feedback if f.resources.spills]
    if r.feedback:
        lines.append(f"{len(r.feedback)} launches; {len(spills)} with register spills")
    lines += [f"- {_json({'launch': f.launch} | _launch(f.parts, f.resources), 400)}" for f in spills[:limit]]
    if len(spills) > limit:
        lines.append(f"- ... and {len(spills) - limit} more")
    return "\n".join(lines)


def _pick(entry: dict, keys: tuple[str, ...]) -> str:
    return _json({k: entry.get(k) for k in keys}, 500)


def _best(entry: dict) -> str:
    plan = {k: v for k, v in (entry.get("plan") or {}).items() if k not in ("name", "description")}
    return (f"latency_ms={_json(entry.get('latency_ms'))} speedups={_json(entry.get('speedups') or {})}"
            f"\n  {_json(plan, 4000)}")


class Prompts:
    """The editable templates under `directory`: system.md, expand.md and retry.md ($placeholders)."""

    def __init__(self, directory: Path = PROMPTS_DIR, schema_file: Path = PLAN_SCHEMA_FILE,
                 facts_file: Path = FACTS_FILE, tiles_file: Path = TILES_FILE):
        self.system, self.expand, self.retry = (
            string.Template(read_text(Path(directory) / f"{n}.md", ConjugateError, "prompt template"))
            for n in ("system", "expand", "retry"))
        self.facts = load_facts(facts_file)
        self.tiles = load_tile_tables(tiles_file)
        self.schema = _json(json.loads(read_text(schema_file, ConjugateError, "plan schema")))
        self.kinds = ", ".join(EDIT_KINDS)

    def system_text(self) -> str:
        return self.system.safe_substitute(kinds=self.kinds)

    def expand_text(self, ctx: NodeContext, n: int) -> str:
        return self.expand.safe_substitute(
            plan=json.dumps(ctx.plan.to_dict() if isinstance(ctx.plan, Plan) else ctx.plan, indent=1, sort_keys=True), schema=self.schema, n=n, kinds=self.kinds,
            workload=_json(ctx.workload), device=ctx.device, sms=ctx.sms, evaluator=ctx.evaluator,
            scores=_scores(ctx),
            baselines=_json(ctx.baselines) if ctx.baselines else "none measured",
            ledger=_ledger(ctx), verdicts=_verdicts(ctx), feedback=_feedback(ctx), best=_bullets(ctx.best, 3, _best),
            lessons=_bullets(ctx.lessons, 20, lambda s: clip(str(s), 300)),
            edit_stats=_bullets(sorted(ctx.edit_stats.items()), 20, lambda kv: f"{kv[0]}: {_json(kv[1])}"),
            tried=_bullets(ctx.tried, 20, lambda t: _pick(t, ("kind", "status", "reward", "patch"))),
            failures=_bullets(ctx.failures, 8, lambda f: _pick(f, ("status", "error", "patch"))),
            facts=self._facts(ctx.device), tiles=self._tiles(ctx))

    def _facts(self, device: str) -> str:
        found = facts_for(device, self.facts)
        if not found:
            return f"none recorded for {device or 'this device'}"
        dates = sorted(f.date for f in found)
        return (f"{found[0].gpu}, {dates[0]} to {dates[-1]} (each with its command and commit in search/facts.toml):\n"
                + _bullets([f.says for f in found], MAX_FACTS))

    def _tiles(self, ctx: NodeContext) -> str:
        tiles = tiles_for(ctx.device, self.tiles)
        if tiles is None or not ctx.workload:
            return f"none recorded for {ctx.device or 'this device'}"
        try:
            found = tiles.found(ctx.workload)
        except (KeyError, TypeError, ValueError):  # a context without the models' shapes
            return "none: this workload's shapes are not known here"
        if not found:
            return "none of this workload's shapes measured"
        tables = [t for t in (tiles.own, *tiles.siblings) if any(t is table for _, _, table in found)]
        heads = [f"{t.device}, {t.date} ({clip(t.source, 200)})" + ("" if tiles.is_own(t) else
                 ", a GPU of this chip: its tiles for the shapes this GPU's table lacks") for t in tables]
        lines = [f"{model} {measured.describe()}" + ("" if tiles.is_own(table) else f" [{table.device}]")
                 for model, measured, table in found]
        return "; ".join(heads) + ":\n" + _bullets(lines, MAX_MEASURED_TILES)

    def retry_text(self, reasons: list[str], n: int) -> str:
        reasons_text = _bullets(reasons, 20, lambda s: clip(s, 400))
        return self.retry.safe_substitute(reasons=reasons_text, n=n, kinds=self.kinds)


_FENCE = re.compile(r"```[A-Za-z]*[ \t]*\n?(.*?)```", re.S)


def parse_reply(text: str) -> list:
    """The "edits" list of the reply's JSON (a fenced block, else the first object that has one);
    raises ValueError saying what is wrong."""
    if len(text) > MAX_REPLY_CHARS:
        raise ValueError(f"the reply is {len(text)} characters long; keep it under {MAX_REPLY_CHARS}")
    first_error, found = "", False
    for chunk in [m.group(1) for m in _FENCE.finditer(text)] + [text]:
        for obj, error in _objects(chunk):
            first_error = first_error or error
            if isinstance(obj, dict) and isinstance(obj.get("edits"), list):
                return obj["edits"]
            found = found or not error
    raise ValueError(first_error or ('the JSON object has no "edits" list' if found else "no JSON object in the reply"))


def _objects(chunk: str) -> Iterator[tuple[Any, str]]:
    """Each {...} span of the chunk decoded: (value, "") or (None, why it is not usable JSON). After
    an unclosed span (a stray "{" before the JSON) the chunk is scanned again from the next "{", at
    most MAX_RESCANS times, so the work stays linear in the chunk's length."""
    start = 0
    for _ in range(MAX_RESCANS + 1):
        span = None
        for span in json_spans(chunk, start):
            yield _decode(chunk, span)
        if span is None or span.closed:
            return
        start = span.start + 1


def _decode(chunk: str, span: Span) -> tuple[Any, str]:
    if span.depth > MAX_DEPTH:
        return None, f"the JSON is nested deeper than {MAX_DEPTH} levels"
    try:
        return json.loads(chunk[span.start:span.end]), ""
    except json.JSONDecodeError as e:
        at = span.start + e.pos
        line, column = chunk.count("\n", 0, at) + 1, at - chunk.rfind("\n", 0, at)
        return None, f"malformed JSON ({e.msg} at line {line} column {column})"
    except ValueError as e:  # a number past int's digit limit
        return None, f"malformed JSON ({e})"


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
    if len(patch) > MAX_PATCH_OPS:
        raise ValueError(f'"patch" has {len(patch)} operations; at most {MAX_PATCH_OPS} are read')
    new = patch_plan(current, patch)
    kind = edit.get("kind") if edit.get("kind") in EDIT_KINDS else "other"
    rationale = clip(visible(edit.get("rationale") or ""), 300)  # one line, control characters escaped
    return Proposal(patch=patch, rationale=rationale, kind=kind), new.hash


def check_edits(edits: list, current: Plan, seen: dict[str, str], n: int) -> tuple[list[Proposal], list[str]]:
    """The valid, distinct edits (at most n) and a reason for each one dropped. `seen` maps plan
    hashes already taken to why they are not new; it is updated."""
    valid, reasons = [], []
    if len(edits) > MAX_EDITS:
        reasons.append(f"only the first {MAX_EDITS} of {len(edits)} edits were read")
    for i, edit in enumerate(edits[:MAX_EDITS], 1):
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
