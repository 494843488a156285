"""How deep attention's key/value pipeline runs in the step kernel: 1 to 4 blocks of 64 keys in the
activation tiles' shared memory (the ring gives up the slots they take). Per workload the draft phase
of `plans/step.json` alone, each depth checked against the fp32 reference (and for spent spins)
before it is timed, all timed in one process, interleaved over three passes, with each depth's
in-kernel ledger (attention's work per program against its KV bytes).

    python lab/step_attention/buffers.py examples/qwen3-06b-8b-b4.toml ... --json OUT.json

Lab code: it sets `CompiledStep.use_attention_buffers` per depth; nothing in `conjugate/` imports it.
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
from conjugate.compiler.step.compiled import CompiledStep  # noqa: E402
from conjugate.evaluate.timing import copy_bandwidth_gbs  # noqa: E402
from conjugate.paths import shipped_plan  # noqa: E402
from conjugate.plan import load_plan  # noqa: E402

DEPTHS = ["default", "1", "2", "3", "4"]


def kv_read_bytes(wl, spec, lengths) -> int:
    """Bytes of keys and values the draft's k steps read (each step: every cached position, k and v)."""
    per_position = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * 2
    return sum(int(n) + s + 1 for n in lengths for s in range(wl.k)) * per_position


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="+", type=Path)
    parser.add_argument("--depths", nargs="+", default=DEPTHS, choices=DEPTHS)
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    device = torch.device("cuda")
    copy_gbs = copy_bandwidth_gbs(device)
    out = {**environment("step_attention"), "command": "python " + " ".join(sys.argv), "copy_gbs": copy_gbs,
           "workloads": []}
    for path in args.workloads:
        case = round_case(path, device)
        wl, draft, target, inputs, graph, check = (case.workload, case.draft, case.target, case.inputs, case.graph,
                                                   case.check)
        kv_bytes = kv_read_bytes(wl, draft.spec, inputs.draft_lengths)
        entry = {"workload": wl.name, "draft": wl.draft.name, "batch": wl.draft_batch, "k": wl.k,
                 "floor_ms": case.draft_floor_ms(copy_gbs), "kv_floor_us": kv_bytes / copy_gbs / 1e3, "depths": {}}
        graphs, keep = {}, []
        for depth in args.depths:
            row: dict = {}
            entry["depths"][depth] = row
            try:
                compiled = compile_round(load_plan(shipped_plan("step")), wl, draft, target, graph=graph)
                step = next(l for l in compiled.launches if isinstance(l, CompiledStep))
                step.use_attention_buffers(None if depth == "default" else int(depth))
                compiled.warmup()
                kw = step.launch.kwargs
                row["kernel"] = {"KV_BUFS": kw["KV_BUFS"], "STAGES": kw["STAGES"], "KT_MAX": kw["KT_MAX"],
                                 "registers": step.resources.registers, "spills": step.resources.spills}
                row["check"], phase, _ = checked_draft_phase(compiled, inputs, check, device)
                if phase is not None:
                    graphs[depth] = phase
                    keep.append(compiled)  # the graph replays its buffers: keep them with it
                    row["ledger"] = step.ledger()
            except Exception as e:  # a depth that fails is a row, not the end of the run
                row["error"] = failure(e)
            print(f"{wl.name} {depth}: {row.get('error') or row.get('check')} {row.get('kernel')}", flush=True)
        for depth, timing in time_interleaved(graphs, args.replays, args.passes).items():
            entry["depths"][depth] |= timing
        out["workloads"].append(entry)
        args.json.write_text(json.dumps(out, indent=1))
        compiled = step = None
        del graphs, keep, draft, target, inputs, check, case
        torch.cuda.empty_cache()
    print(f"\n{'workload':<24} {'floor':>7} {'kv floor':>8} " + " ".join(f"{d:>16}" for d in args.depths))
    for e in out["workloads"]:
        cells = []
        for d in args.depths:
            row = e["depths"][d]
            attn = row.get("ledger", {}).get("ops", {}).get("attn", {}).get("work_us", float("nan"))
            cells.append(f"{row.get('ms', float('nan')):7.3f}/{attn:7.0f}us")
        print(f"{e['workload']:<24} {e['floor_ms']:7.3f} {e['kv_floor_us']:7.0f}us " + " ".join(f"{c:>16}" for c in cells))
    print("cells: draft phase ms / attention's work per program (ledger)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
