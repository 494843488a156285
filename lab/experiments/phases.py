"""Each model's phase alone against its byte floor, from `conjugate profile --json` ledgers of plans
whose launches run on one stream (the `phases-apart` variant of a best plan that knob_variants.py
wrote, `benchmarks/knob_variants.py` at f5eb69a^; any plan with both models on one stream will do):

    git show f5eb69a^:benchmarks/knob_variants.py > /tmp/knob_variants.py
    python /tmp/knob_variants.py benchmarks/results/plans/W.json OUTDIR --name best
    conjugate profile examples/W.toml --plan OUTDIR/best-phases-apart.json --json W_apart.json   # GPU
    python lab/experiments/phases.py W_apart.json [...] --json OUT.json                               # CPU

A phase's time is the sum of its launches' times (each counted from the end of the kernel before it
on the stream, so the gaps between launches count too); its floor is its launches' bytes at the copy
bandwidth the ledger measured. The floor issue's aims: each draft phase within 1.5x of its floor,
each verify phase within 1.15x. A launch holding both models' ops (a shared launch) belongs to neither
phase and is refused.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

AIMS = {"draft": 1.5, "target": 1.15}


def phases(ledger_file: Path) -> dict:
    """{"workload", "plan", "round_ms", "draft": {...}, "target": {...}} of one profile JSON."""
    try:
        data = json.loads(ledger_file.read_text())
        ledger = data["ledger"]
        copy_gbs = float(ledger["copy_gbs"])
        launches = [(str(l["kind"]), float(l["us"]), int(l["bytes"])) for l in ledger["launches"]]
        workload, plan, round_us = str(data["workload"]), str(data["plan"]), float(ledger["round_us"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"{ledger_file}: not a `conjugate profile --json` ledger ({type(e).__name__}: {e})")
    if any(" + " in kind for kind, _, _ in launches):
        raise SystemExit(f"{ledger_file}: a launch holds both models' ops: its phases do not separate")
    out = {"workload": workload, "plan": plan, "round_ms": round_us / 1e3}
    for model, aim in AIMS.items():
        mine = [(us, b) for kind, us, b in launches if kind.startswith(f"{model} ")]
        ms = sum(us for us, _ in mine) / 1e3
        floor_ms = sum(b for _, b in mine) / (copy_gbs * 1e9) * 1e3
        out[model] = {"launches": len(mine), "ms": ms, "floor_ms": floor_ms,
                      "ratio": ms / floor_ms if floor_ms else float("inf"), "aim": aim}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ledgers", nargs="+", type=Path, help="`conjugate profile --json` files")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    rows = [phases(path) for path in args.ledgers]
    print(f"{'workload':24} {'draft ms':>9} {'floor':>7} {'ratio':>6} {'verify ms':>10} {'floor':>7} {'ratio':>6}")
    for r in rows:
        d, t = r["draft"], r["target"]
        print(f"{r['workload']:24} {d['ms']:9.3f} {d['floor_ms']:7.3f} {d['ratio']:6.2f} "
              f"{t['ms']:10.3f} {t['floor_ms']:7.3f} {t['ratio']:6.2f}")
    if args.json:
        args.json.write_text(json.dumps({"aims": AIMS, "phases": rows}, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
