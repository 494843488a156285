"""How the step table deals an op's weight tiles to the programs: tile by tile round the programs
(the table as it was), cut into balanced runs of K tiles (stream-K) wherever they even out any K
tile, with runs of at least 1, 2 or 4 K tiles, or the product's rule (balanced only where they take
many); how finely an op's K is sliced (`slices_N`: the product's dealing with slices of at least
N K tiles, where the product's are 4, or 2 where 4 leave most programs idle: `finest_split`); and
`narrow`: o_proj and down in 8-column tiles over their whole K (`narrow_gu`: gate_up too; no partial sums;
lab/narrow_tiles). Per
workload the draft phase of `plans/step.json` alone, every variant checked against the fp32 reference
(and for spent spins) before it is timed, all timed in one process, interleaved over three passes.

    python lab/step_dealing/dealing.py examples/qwen25-05b-7b-b8.toml ... --json OUT.json

Lab code: it swaps `balanced_runs`, `MIN_RUN_K_TILES`, `_balance_pays`, `finest_split` and `build` of
conjugate/compiler/step/table.py per variant; nothing in `conjugate/` imports it.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import checked_draft_phase, environment, failure, round_case, time_interleaved  # noqa: E402

import torch  # noqa: E402

from conjugate.compiler.round import compile_round  # noqa: E402
from conjugate.compiler.step import table  # noqa: E402
from conjugate.evaluate.timing import copy_bandwidth_gbs  # noqa: E402
from conjugate.paths import shipped_plan  # noqa: E402
from conjugate.plan import load_plan  # noqa: E402

PRODUCT_RUNS, PRODUCT_MIN, PRODUCT_PAYS = table.balanced_runs, table.MIN_RUN_K_TILES, table._balance_pays
PRODUCT_SPLIT, PRODUCT_BUILD = table.finest_split, table.build
VARIANTS = {"product": None, "round_robin": 0, "balanced_1": 1, "balanced_2": 2, "balanced_4": 4}
SLICES = {"slices_2": 2, "slices_8": 8, "slices_16": 16}  # the shortest K slice, K tiles (product: 4 or 2)
NARROW = {"narrow": {"narrow": True}, "narrow_gu": {"narrow": True, "narrow_gate_up": True}}  # 8-column whole-K
# tiles: o_proj and down, or gate_up too (build's `narrow`, `narrow_gate_up`; lab/narrow_tiles)


def use(variant: str) -> None:
    """The table's dealing for a variant: the product's rule, every op round the programs, or balanced
    runs (of at least N K tiles) wherever they take any K tile off the busiest program; or the product's
    dealing over K slices of at least N tiles."""
    table.finest_split, table.build = PRODUCT_SPLIT, PRODUCT_BUILD
    if variant in NARROW:
        forms = NARROW[variant]
        table.build = lambda *a, narrow=False, narrow_gate_up=False, **k: PRODUCT_BUILD(*a, **forms, **k)
        variant = "product"
    if variant in SLICES:
        shortest = SLICES[variant]
        table.finest_split = lambda *a, min_k_tiles=4: PRODUCT_SPLIT(*a, min_k_tiles=shortest)
        variant = "product"
    minimum = VARIANTS[variant]
    table.balanced_runs = PRODUCT_RUNS if minimum != 0 else (lambda *a, **k: None)
    table.MIN_RUN_K_TILES = minimum or PRODUCT_MIN
    table._balance_pays = PRODUCT_PAYS if minimum is None else (lambda round_robin, balanced: balanced < round_robin)
    table._TABLES.clear()


def most_k_tiles(prog) -> dict:
    """Per op, the most K tiles one program streams in one op instance (step 0, layer 0 / head)."""
    out = {}
    for op in ("qkv", "o_proj", "gate_up", "down", "head"):
        per: dict[int, int] = {}
        for t in prog.tasks:
            if t.op == op and t.step == 0 and t.layer in (0, -1):
                per[t.program] = per.get(t.program, 0) + (t.k_range[1] - t.k_range[0]) // prog.tiles.k
        out[op] = max(per.values())
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="+", type=Path)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS),
                        choices=list(VARIANTS) + list(SLICES) + list(NARROW))
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    device = torch.device("cuda")
    copy_gbs = copy_bandwidth_gbs(device)
    out = {**environment("dealing"), "command": "python " + " ".join(sys.argv), "copy_gbs": copy_gbs, "workloads": []}
    for path in args.workloads:
        case = round_case(path, device)
        wl, draft, target, inputs, graph, check = (case.workload, case.draft, case.target, case.inputs, case.graph,
                                                   case.check)
        floor_ms = case.draft_floor_ms(copy_gbs)
        entry = {"workload": wl.name, "draft": wl.draft.name, "batch": wl.draft_batch, "k": wl.k,
                 "floor_ms": floor_ms, "variants": {}}
        graphs, keep = {}, []
        for variant in args.variants:
            use(variant)
            row: dict = {}
            entry["variants"][variant] = row
            try:
                compiled = compile_round(load_plan(shipped_plan("step")), wl, draft, target, graph=graph)
                compiled.warmup()
                row["check"], phase, step = checked_draft_phase(compiled, inputs, check, device)
                row["most_k_tiles"] = most_k_tiles(step.table)
                if phase is not None:
                    graphs[variant] = phase
                    keep.append(compiled)  # the graph replays its buffers: keep them with it
                    row["ledger"] = step.ledger()
            except Exception as e:  # a variant that fails is a row, not the end of the run
                row["error"] = failure(e)
            print(f"{wl.name} {variant}: {row.get('error') or row.get('check')}", flush=True)
        for variant, timing in time_interleaved(graphs, args.replays, args.passes).items():
            entry["variants"][variant] |= timing
        out["workloads"].append(entry)
        args.json.write_text(json.dumps(out, indent=1))
        compiled = step = None
        del graphs, keep, draft, target, inputs, check, case
        torch.cuda.empty_cache()
    table.balanced_runs, table.MIN_RUN_K_TILES, table._balance_pays = PRODUCT_RUNS, PRODUCT_MIN, PRODUCT_PAYS
    table.finest_split, table.build = PRODUCT_SPLIT, PRODUCT_BUILD
    print(f"\n{'workload':<24} {'floor':>7} " + " ".join(f"{v:>12}" for v in args.variants))
    for e in out["workloads"]:
        cells = " ".join(f"{e['variants'][v].get('ms', float('nan')):12.3f}" for v in args.variants)
        print(f"{e['workload']:<24} {e['floor_ms']:7.3f} {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
