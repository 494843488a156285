"""What one plan knob's moves did, wherever search databases measured them: the evidence behind a
heuristic rule, read back from the GPU's trees instead of by hand.

    python lab/experiments/moves.py DB [DB ...] --field /pdl/draft [--context /fusions/draft /sm_limit/target]
                               [--alone] [--json OUT.json]

A move is a measured node whose plan differs from its measured parent's in a field under --field (a
plan path prefix: /pdl/draft, /sm_limit/target, /split_reduce, /tiles/draft/attn ...). Per move: the
database, its run's workload and agent, parent -> child node, both latencies, the gain (parent
latency over child latency, minus one: positive is faster), the field's value before -> after, the
--context fields' values in the parent (what the move was made beside), and `alone` (whether the
move changed nothing but fields under --field; a carried fusion that also switches `pdl` is not
alone; `--alone` lists only those). A move that several databases hold (copies of one run) is listed once. Then per change (before -> after) the count and the mean, least and largest gain.
Seeds and warm starts (edits that replace the whole plan) are not moves. Reads the databases only.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sqlite3
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from search_surrogate import difference, fields_of, replaces_whole_plan  # noqa: E402

NODES = "SELECT id, parent_id, plan, edit, run_id, plan_hash FROM nodes"
MEASURED = "SELECT plan_hash, run_id, latency_ms FROM evaluations WHERE latency_ms IS NOT NULL ORDER BY id"


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


def _value(fields: dict[str, str], prefix: str) -> str:
    """The plan's value under prefix: one field's JSON, several as path=value, or '-' when absent."""
    inside = {p: v for p, v in fields.items() if _under(p, prefix)}
    if not inside:
        return "-"
    if list(inside) == [prefix]:
        return inside[prefix]
    return " ".join(f"{p[len(prefix.rstrip('/')) + 1:]}={v}" for p, v in sorted(inside.items()))


def moves_in(path: Path, field: str, context: list[str]) -> list[dict]:
    """The measured moves under `field` in one search database."""
    with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as db:
        try:
            rows = db.execute(NODES).fetchall()
            measured = db.execute(MEASURED).fetchall()
            runs = {i: (w, a, c) for i, w, a, c in db.execute("SELECT id, workload_name, agent, created_at FROM runs")}
        except sqlite3.DatabaseError as e:
            raise SystemExit(f"error: {path}: not a search database ({e})") from None
    by_run = {(plan_hash, run): ms for plan_hash, run, ms in measured}  # the last evaluation of each
    latency = {}
    for node, _, _, _, run, plan_hash in rows:  # a node's own run's evaluation of its plan (one workload)
        if (plan_hash, run) in by_run:
            latency[node] = by_run[(plan_hash, run)]
    nodes = {node: (parent, plan, edit, run) for node, parent, plan, edit, run, _ in rows}
    moves = []
    for node, (parent, plan, edit, run) in sorted(nodes.items()):
        if node not in latency or parent not in latency or replaces_whole_plan(edit):
            continue  # unmeasured, or a seed or warm start (the whole plan replaced)
        before, after = fields_of(json.loads(nodes[parent][1])), fields_of(json.loads(plan))
        changed = {p for p, _ in difference(before, after)}
        if not any(_under(p, field) for p in changed):
            continue
        workload, agent, created = runs.get(run, ("?", "?", None))
        moves.append({"db": str(path), "workload": workload, "agent": agent, "run_created": created,
                      "parent": parent, "node": node,
                      "parent_ms": latency[parent], "ms": latency[node],
                      "gain": latency[parent] / latency[node] - 1,
                      "before": _value(before, field), "after": _value(after, field),
                      "alone": all(_under(p, field) for p in changed),
                      "context": {c: _value(before, c) for c in context}})
    return moves


def once(moves: list[dict]) -> list[dict]:
    """Each move once: the first database's, where copies of one run (archives) hold it again."""
    seen, out = set(), []
    for m in moves:
        key = (m["workload"], m["agent"], m["run_created"], m["node"])
        if key not in seen:
            seen.add(key)
            out.append(m)
    return out


def summary(moves: list[dict]) -> list[dict]:
    """Per change (before -> after): count, mean, least and largest gain."""
    by_change: dict[tuple[str, str], list[float]] = {}
    for m in moves:
        by_change.setdefault((m["before"], m["after"]), []).append(m["gain"])
    return [{"before": b, "after": a, "count": len(g), "mean_gain": statistics.fmean(g), "min_gain": min(g),
             "max_gain": max(g)} for (b, a), g in sorted(by_change.items(), key=lambda kv: -len(kv[1]))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dbs", nargs="+", type=Path, metavar="DB", help="SQLite search databases")
    parser.add_argument("--field", required=True, help="a plan path prefix, e.g. /pdl/draft")
    parser.add_argument("--context", nargs="*", default=[], help="plan paths whose parent values to show")
    parser.add_argument("--alone", action="store_true", help="only moves that changed nothing but --field")
    parser.add_argument("--json", type=Path, help="write the moves and the summary here")
    args = parser.parse_args()
    if not args.field.startswith("/"):
        parser.error(f"--field {args.field!r}: a plan path starts with '/', e.g. /pdl/draft")
    args.field = args.field.rstrip("/") or "/"
    for path in args.dbs:
        if not path.is_file():
            raise SystemExit(f"error: {path}: no such database file")
    moves = once([m for path in args.dbs for m in moves_in(path, args.field, args.context)
                  if m["alone"] or not args.alone])
    for m in moves:
        context = "  ".join(f"{c}={v}" for c, v in m["context"].items())
        print(f"{m['workload']:22} {m['agent']:9} {m['parent']:>4} -> {m['node']:<4} {m['parent_ms']:8.3f} "
              f"{m['ms']:8.3f} {m['gain'] * 100:+6.1f}%  {m['before']} -> {m['after']}"
              f"{'' if m['alone'] else ' (with other fields)'}  {context}")
    rows = summary(moves)
    print(f"\n{len(moves)} moves under {args.field} in {len(args.dbs)} databases")
    for r in rows:
        print(f"{r['count']:4}x  {r['before']} -> {r['after']}: mean {r['mean_gain'] * 100:+.1f}% "
              f"({r['min_gain'] * 100:+.1f}% .. {r['max_gain'] * 100:+.1f}%)")
    if args.json:
        args.json.write_text(json.dumps({"field": args.field, "databases": [str(p) for p in args.dbs],
                                         "moves": moves, "summary": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
