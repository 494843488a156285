"""The step launch's tuning parameters compared on the draft phase: each variant a set of StepLaunch
options (`attention_buffers`: attention's key/value blocks in flight, 1-4; `mma_depth`: K tiles whose
wgmma a GEMM task keeps in flight, 1-2; `direct_epilogue`: whole gate_up and lm_head tiles' epilogues
from their accumulators, 0-1; `ring_kv`: attention's history through the loader's ring, 0-1),
given as `key=value[,key=value]` (`default`: none).
Per workload the draft phase of `plans/step.json` alone, each variant checked against the fp32
reference (and for spent spins) before it is timed, all timed in one process, interleaved over three
passes, with each variant's in-kernel ledger.

    python lab/step_variants/variants.py examples/qwen3-06b-8b-b4.toml ... \
        --variants default mma_depth=1 attention_buffers=1 --json OUT.json

Lab code: it sets `CompiledStep.use_launch_options` per variant; nothing in `conjugate/` imports it.
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
from conjugate.compiler.step.launch import LAUNCH_OPTIONS  # noqa: E402
from conjugate.evaluate.timing import copy_bandwidth_gbs  # noqa: E402
from conjugate.paths import shipped_plan  # noqa: E402
from conjugate.plan import load_plan  # noqa: E402

FLAGS = ("direct_epilogue", "ring_kv")


def variant(text: str) -> dict[str, int]:
    """`default` or `key=value[,key=value]` as StepLaunch options."""
    if text == "default":
        return {}
    out = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        flag_ok = key not in FLAGS or value in ("0", "1")
        if not sep or key not in LAUNCH_OPTIONS or not value.isdigit() or not flag_ok:
            raise argparse.ArgumentTypeError(f"{text!r}: a variant is 'default' or key=value[,key=value] with keys "
                                             f"{', '.join(LAUNCH_OPTIONS)} and whole-number values")
        out[key] = int(value)
    return out


def kv_read_bytes(wl, spec, lengths) -> int:
    """Bytes of keys and values the draft's k steps read (each step: every cached position, k and v)."""
    per_position = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * 2
    return sum(int(n) + s + 1 for n in lengths for s in range(wl.k)) * per_position


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="+", type=Path)
    parser.add_argument("--variants", nargs="+", default=["default"])
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    try:
        variants = {name: variant(name) for name in args.variants}
    except argparse.ArgumentTypeError as e:
        parser.error(str(e))
    device = torch.device("cuda")
    copy_gbs = copy_bandwidth_gbs(device)
    out = {**environment("step_variants"), "command": "python " + " ".join(sys.argv), "copy_gbs": copy_gbs,
           "workloads": []}
    for path in args.workloads:
        case = round_case(path, device)
        wl, draft, target, inputs, graph, check = (case.workload, case.draft, case.target, case.inputs, case.graph,
                                                   case.check)
        kv_bytes = kv_read_bytes(wl, draft.spec, inputs.draft_lengths)
        entry = {"workload": wl.name, "draft": wl.draft.name, "batch": wl.draft_batch, "k": wl.k,
                 "floor_ms": case.draft_floor_ms(copy_gbs), "kv_floor_us": kv_bytes / copy_gbs / 1e3, "variants": {}}
        graphs, keep = {}, []
        for name, options in variants.items():
            row: dict = {"options": options}
            entry["variants"][name] = row
            try:
                compiled = compile_round(load_plan(shipped_plan("step")), wl, draft, target, graph=graph)
                step = next(l for l in compiled.launches if isinstance(l, CompiledStep))
                step.use_launch_options(**options)
                compiled.warmup()
                kw = step.launch.kwargs
                shown = ("KV_BUFS", "MMA_DEPTH", "DIRECT_EPILOGUE", "RING_KV", "STAGES", "KT_MAX")
                row["kernel"] = {key: kw[key] for key in shown} | {
                    "registers": step.resources.registers, "spills": step.resources.spills}
                row["check"], phase, _ = checked_draft_phase(compiled, inputs, check, device)
                if phase is not None:
                    graphs[name] = phase
                    keep.append(compiled)  # the graph replays its buffers: keep them with it
                    row["ledger"] = step.ledger()
            except Exception as e:  # a variant that fails is a row, not the end of the run
                row["error"] = failure(e)
            print(f"{wl.name} {name}: {row.get('error') or row.get('check')} {row.get('kernel')}", flush=True)
        for name, timing in time_interleaved(graphs, args.replays, args.passes).items():
            entry["variants"][name] |= timing
        out["workloads"].append(entry)
        args.json.write_text(json.dumps(out, indent=1))
        compiled = step = None
        del graphs, keep, draft, target, inputs, check, case
        torch.cuda.empty_cache()
    print(f"\n{'workload':<24} {'floor':>7} {'kv floor':>8} " + " ".join(f"{v:>22}" for v in variants))
    for e in out["workloads"]:
        cells = []
        for name in variants:
            row = e["variants"][name]
            attn = row.get("ledger", {}).get("ops", {}).get("attn", {}).get("work_us", float("nan"))
            cells.append(f"{row.get('ms', float('nan')):7.3f}/{attn:7.0f}us")
        print(f"{e['workload']:<24} {e['floor_ms']:7.3f} {e['kv_floor_us']:7.0f}us " + " ".join(f"{c:>22}" for c in cells))
    print("cells: draft phase ms / attention's work per program (ledger)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
