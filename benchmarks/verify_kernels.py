"""#49's record: the verify-phase kernels' shapes against the copy rate, and each workload's verify
phase alone against its byte floor, in the JSON #49 names.

    python benchmarks/verify_kernels.py examples/llama-1b-8b-b32.toml [...] \
        --sweeps benchmarks/results/kernel_sweep_b32_h100.json [...] --json OUT.json      # a GPU
    python benchmarks/verify_kernels.py --sweeps SWEEP.json [...] --json OUT.json       # no GPU: shapes only

`shapes`: every shape of the kernel sweeps given (`kernel_sweep.py`, whose `--batches`, `--ks` and
`--contexts` take the serving sizes), each at its best tile: {"kind": "gemm" | "attention", "model",
"op", "rows", "context", "ms", "bytes", "bw_fraction", "tile", "sweep"}, where rows are the GEMM's
activation rows or attention's batch x tokens, and bw_fraction the bytes over the time against the
sweep's copy rate, from a cold L2 (a sweep's numbers, converted; its GPU and commit are the sweep's).
`phases`: per workload the `sequential` plan compiled, its round checked against the fp32 reference
(ragged lengths), then the target's phase (the verify pass) alone timed as a CUDA graph (median of
--replays) against the target's bytes at the measured copy rate: {"workload", "verify_floor_ms",
"verify_ms", "ratio", "check"}. With `--streamed`, the same plan with the target's o_proj and down
run by the streamed kernel (`target.streamed`) too, checked, and both phases timed in --passes
interleaved passes: "variants": {"sequential" | "streamed": {"verify_ms", "passes_ms", "check"}}, and
"verify_ms" the sequential plan's median of its passes. `--pdl start` (or `end`) adds each of those
plans again with the target's launches programmatic dependent ones released there, as
"sequential+pdl=start" and "streamed+pdl=start", timed in the same interleaved passes. A variant whose
round does not fit in the GPU's memory beside the ones before it is a variant with its "error", untimed.
`--model draft` times the draft's phase instead (its k steps; `--streamed` and `--pdl` then change the
draft's launches), its fields named "draft_floor_ms", "draft_ms" and "rows" the draft's batch.
`--fusions F ...` adds each plan again with these fusions of the model's ("+fused"; e.g. the norms
folded into their GEMMs, which `sequential` leaves apart); `--fused-tiles KIND.KEY=VALUE ...` sets tile
keys of the fused twins only (qkv+rope_kv runs whole heads, 128 columns, where `sequential`'s qkv tile
is 64 wide: `qkv.SPLIT_K=4` keeps its program count). `--tuned` adds each plan again with the tiles
search/tiles.json lists for the model's shapes on this GPU ("+tuned"; the heuristic's lookup: its own
table, then its chip's other's; the row's "table_tiles" names them), where `sequential` keeps one tile a
kind whatever the rows. `--ledger` then profiles each timed variant's phase (its replays' kernel
records, the evaluator's ledger over the phase's launches): "ledger": {"round_us", "floor_us",
"busy_us", "kinds": [{"kind", "launches", "us", "bytes", "bandwidth_fraction", "floor_us", "programs"},
...]}, longest first: where it loses (programs: the kind's grid sizes).
"""
from __future__ import annotations

import gc
import json
from dataclasses import dataclass
from pathlib import Path

from common import environment, failure, make_parser, require_gpu, round_case, write_json


def shape_rows(sweep: dict, source: str) -> list[dict]:
    """A kernel sweep's shapes as #49's rows, each at its best tile (the shipped one where none beat it);
    with the sweep's `--read`, `read_bw_fraction`: what a launch reading the same bytes reached alone."""
    rows = []
    for s in sweep["shapes"]:
        best = s.get("best") or s["shipped"]
        fields = s["fields"]
        attention = s["kind"] == "attn"
        rows.append({"kind": "attention" if attention else "gemm", "model": s["model"], "op": s["kind"],
                     "rows": fields["batch"] * fields["tokens"] if attention else fields["rows"],
                     "context": fields["context"] if attention else None, "ms": best["us"] / 1e3,
                     "bytes": s["bytes"], "bw_fraction": best["share_of_copy"], "tile": best["plan_keys"],
                     "workloads": s["workloads"], "sweep": source}
                    | ({"read_bw_fraction": s["read"]["share_of_copy"]} if "us" in s.get("read", {}) else {}))
    return rows


@dataclass(frozen=True)
class Comparison:
    """What one workload's phase is timed as: which model's phase, the plans beside `sequential`, how often."""
    model: str = "target"
    streamed: bool = False  # also with the model's o_proj and down streamed
    pdl: tuple[str, ...] = ()  # also each plan with the model's launches PDL released there
    replays: int = 100
    passes: int = 3  # interleaved passes where plans are compared
    ledger: bool = False  # profile each timed variant's phase: its time per op kind
    fusions: tuple[str, ...] = ()  # also each plan with these fusions of the model's added
    fused_tiles: tuple[tuple[str, str, int], ...] = ()  # (kind, key, value) set in the fused twins' tiles
    tuned: bool = False  # also each plan with the GPU's tile table's tiles for the model's shapes

    @property
    def label(self) -> str:
        """The phase's name in the JSON's fields: the target's is the verify pass."""
        return "verify" if self.model == "target" else "draft"

    def plans(self, sequential, table_tiles: dict[str, dict] | None = None) -> dict:
        """The plans compared, by name; with `tuned`, each also with `table_tiles` (kind -> tile keys,
        table_tiles()) set in the model's tiles, as "+tuned", right after it, where that changes a tile
        (not a rope-fused qkv's or a fused MLP's, nor the kinds --fused-tiles set in a fused twin;
        streamed launches take no tile)."""
        plans = self._plans(sequential)
        if not self.tuned or not table_tiles:
            return plans
        from conjugate.agents.heuristic.tiles import takes_table_tile

        out = {}
        chosen = {kind for kind, _, _ in self.fused_tiles}
        for name, plan in plans.items():
            tiles = json.loads(json.dumps(plan[self.model]["tiles"]))
            for kind, tile in table_tiles.items():
                if takes_table_tile(plan, self.model, kind) and not (name.endswith("+fused") and kind in chosen):
                    tiles[kind] = tiles.get(kind, {}) | tile  # (the kinds --fused-tiles set in a fused twin kept)
            out[name] = plan
            if tiles != plan[self.model]["tiles"]:  # a twin the table leaves as it is would be timed for nothing
                out[f"{name}+tuned"] = self.edited(plan, tiles=tiles)
        return out

    def _plans(self, sequential) -> dict:
        """`sequential`, streamed, under each PDL trigger, each with its fused twin: as named."""
        plans = {"sequential": sequential} | ({"streamed": self.edited(sequential, streamed=["down", "o_proj"])}
                                              if self.streamed else {})
        plans |= {f"{name}+pdl={t}": self.edited(plan, pdl=t) for t in self.pdl for name, plan in plans.items()}
        if not self.fusions:
            return plans
        twins = {}  # each plan's fused twin right after it, so what does not fit in memory is the last pair
        for name, plan in plans.items():
            fused = sorted(set(plan[self.model]["fusions"]) | set(self.fusions))
            tiles = json.loads(json.dumps(plan[self.model]["tiles"]))
            for kind, key, value in self.fused_tiles:
                tiles.setdefault(kind, {})[key] = value
            twins |= {name: plan, f"{name}+fused": self.edited(plan, fusions=fused, tiles=tiles)}
        return twins

    def edited(self, plan, **fields):
        """`plan` with these fields of the compared model's block set."""
        from conjugate.plan import validate_plan

        raw = plan.to_dict()
        raw[self.model] |= fields
        return validate_plan(raw)


def table_tiles(device_name: str, workload, model: str) -> tuple[dict[str, dict], str]:
    """The tiles search/tiles.json lists for `model`'s shapes of `workload` on this GPU (the heuristic's
    lookup: its own table first, GEMMs at the nearest measured row count, attention exact, then its
    chip's other model's table), and the tables' sources; ({}, "") where no table serves the GPU."""
    from conjugate.agents.heuristic.tile_table import load_tile_tables, tiles_for

    tiles = tiles_for(device_name, load_tile_tables())
    if tiles is None:
        return {}, ""
    found = [(m, table) for who, m, table in tiles.found(workload.to_dict()) if who.value == model]
    sources = dict.fromkeys(f"{table.device} table ({table.source}, {table.date})" for _, table in found)
    return {m.kind: dict(m.tile) for m, _ in found}, "; ".join(sources)


def phase_ledger(compiled, graph, phase, model, copy_gbs: float, device) -> dict:
    """The ledger of one captured phase's replays: its launches' time per op kind against their bytes,
    and each kind's grid sizes (`programs`: a fused form's tile may change them)."""
    from conjugate.evaluate.ledger import Ledger, kernel_records

    ledger = Ledger.of(compiled, graph, kernel_records(phase.replay, device, replays=5), copy_gbs,
                       launches=compiled.phase_launches(model))
    grids: dict[str, set[int]] = {}
    for entry in ledger.launches:
        grids.setdefault(entry.kind, set()).add(compiled.launches[entry.launch].grid)
    data = ledger.to_dict()
    kinds = [k | {"programs": sorted(grids.get(k["kind"], ()))} for k in data["kinds"]]
    return {key: data[key] for key in ("round_us", "floor_us", "busy_us")} | {"kinds": kinds}


def _out_of_memory(e: RuntimeError) -> bool:
    """torch's OutOfMemoryError, or a CUDA out-of-memory error raised as a plain RuntimeError (graph
    instantiation, a module load)."""
    import torch

    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e)


def measure_phase(path: Path, copy_gbs: float, how: Comparison = Comparison()) -> dict:
    import torch

    from conjugate.compiler.round import compile_round
    from conjugate.evaluate.rounds import checked_run
    from conjugate.evaluate.timing import capture, time_replays
    from conjugate.paths import shipped_plan
    from conjugate.plan import load_plan
    from conjugate.roles import Model

    device = torch.device("cuda")
    case = round_case(path, device)
    model, label = Model(how.model), how.label
    order = case.graph.graph["order"][model]
    floor_ms = sum(case.graph.nodes[op]["op"].bytes for op in order) / (copy_gbs * 1e6)
    wl = case.workload
    row = {"workload": wl.name, "path": str(path), f"{label}_floor_ms": floor_ms,
           "rows": wl.target_batch * (wl.k + 1) if model == Model.TARGET else wl.draft_batch}
    tuned, source = table_tiles(torch.cuda.get_device_name(device), wl, how.model) if how.tuned else ({}, "")
    if how.tuned:
        row["table_tiles"] = {"source": source, "tiles": tuned}
    plans = how.plans(load_plan(shipped_plan("sequential")), tuned)
    compared = len(plans) > 1
    variants, phases, rounds = {}, {}, {}  # rounds: alive while their captured graphs replay over their buffers
    for name, plan in plans.items():  # every variant checked before any is timed
        try:
            rounds[name] = compiled = compile_round(plan, wl, case.draft, case.target, graph=case.graph)
            compiled.warmup()
            report = checked_run(compiled, case.inputs, case.check)
            variants[name] = {"check": report.to_dict(), "passes_ms": []}
            if report.ok:
                compiled.load(case.inputs)
                phases[name] = capture(compiled.phase(model), device)
            else:
                print(f"{wl.name} {name}: check failed {report.problems[:3]}", flush=True)
        except RuntimeError as e:  # the variants' buffers side by side: a row, not the end of the call
            if not _out_of_memory(e):
                raise
            rounds.pop(name, None)
            phases.pop(name, None)
            compiled = None
            variants[name] = variants.get(name, {}) | {"error": "out of GPU memory beside the variants before it",
                                                       "passes_ms": []}
            print(f"{wl.name} {name}: out of GPU memory, not timed", flush=True)
        if "error" in variants[name]:  # its buffers freed once the exception's frames are gone
            gc.collect()
            torch.cuda.empty_cache()
    for _ in range(how.passes if compared else 1):
        for name, phase in phases.items():
            variants[name]["passes_ms"].append(time_replays(phase.replay, how.replays, warmup=20).median_ms)
    if how.ledger:
        for name, phase in phases.items():
            variants[name]["ledger"] = phase_ledger(rounds[name], case.graph, phase, model, copy_gbs, device)
    for name, v in variants.items():
        if v["passes_ms"]:
            v[f"{label}_ms"] = ms = sorted(v["passes_ms"])[len(v["passes_ms"]) // 2]
            print(f"{wl.name} {name}: {label} {ms:.3f} ms, {ms / floor_ms:.2f}x its floor {floor_ms:.3f} ms",
                  flush=True)
    row["check"] = variants["sequential"].get("check")
    if "ledger" in variants["sequential"]:
        row["ledger"] = variants["sequential"]["ledger"]
    if f"{label}_ms" in variants["sequential"]:
        row[f"{label}_ms"] = variants["sequential"][f"{label}_ms"]
        row["ratio"] = row[f"{label}_ms"] / floor_ms
    if compared:
        row["variants"] = variants
    return row


def fused_tile(text: str) -> tuple[str, str, int]:
    """KIND.KEY=VALUE (a plan tile key and its integer value), for argparse."""
    import argparse

    try:
        where, value = text.split("=")
        kind, key = where.split(".")
        return kind, key, int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KIND.KEY=VALUE with an integer value, e.g. qkv.SPLIT_K=4")


def main() -> int:
    parser = make_parser(__doc__)
    parser.add_argument("workloads", nargs="*", type=Path, help="workloads whose verify phase is timed (a GPU)")
    parser.add_argument("--sweeps", nargs="*", type=Path, default=[], help="kernel_sweep.py JSONs to convert")
    parser.add_argument("--replays", type=int, default=100)
    parser.add_argument("--model", choices=("target", "draft"), default="target",
                        help="whose phase is timed: the target's verify pass or the draft's k steps")
    parser.add_argument("--streamed", action="store_true",
                        help="also the model's o_proj and down as the streamed kernel, timed interleaved")
    parser.add_argument("--passes", type=int, default=3, help="interleaved passes with --streamed or --pdl")
    parser.add_argument("--ledger", action="store_true", help="also each timed phase's time per op kind (profiled)")
    parser.add_argument("--fusions", nargs="+", default=[], metavar="FUSION",
                        help="also each plan with these fusions of the model's added (plan schema names)")
    parser.add_argument("--fused-tiles", nargs="+", default=[], metavar="KIND.KEY=VALUE", type=fused_tile,
                        help="with --fusions: set these tile keys in the fused twins (e.g. qkv.SPLIT_K=4)")
    parser.add_argument("--tuned", action="store_true",
                        help="also each plan with this GPU's tile table's tiles for the model's shapes (search/tiles.json)")
    parser.add_argument("--pdl", action="append", choices=("start", "end"), default=[],
                        help="also each plan with the model's launches programmatic dependent ones released "
                             "there, timed interleaved (repeatable)")
    args = parser.parse_args()
    if args.fused_tiles and not args.fusions:
        parser.error("--fused-tiles sets tiles of the fused twins: give --fusions too")
    how = Comparison(args.model, args.streamed, tuple(args.pdl), args.replays, args.passes, args.ledger,
                     tuple(args.fusions), tuple(args.fused_tiles), args.tuned)
    try:  # every plan variant valid before anything is measured
        from conjugate.errors import ConjugateError
        from conjugate.paths import shipped_plan
        from conjugate.plan import load_plan

        how.plans(load_plan(shipped_plan("sequential")))
    except ConjugateError as e:
        parser.error(f"--fusions / --fused-tiles: {e}")
    if not args.workloads and not args.sweeps:
        parser.error("nothing to do: give workloads to time, --sweeps to convert, or both")
    sweeps = []
    for path in args.sweeps:
        try:
            sweeps.append((path, json.loads(path.read_text())))
        except (OSError, ValueError) as e:
            parser.error(f"{path}: {failure(e)}")
    out = environment("verify_kernels") | {"sweeps": [{"path": str(p), "gpu": s.get("gpu"), "code": s.get("code"),
                                                          "command": s.get("command")} for p, s in sweeps]}
    try:
        out["shapes"] = [row for p, s in sweeps for row in shape_rows(s, str(p))]
    except (KeyError, TypeError) as e:
        parser.error(f"a sweep is not a kernel_sweep.py JSON ({failure(e)})")
    out["phases"] = []
    if args.workloads:
        import torch

        from conjugate.evaluate.timing import copy_bandwidth_gbs
        from conjugate.workload import load_workload

        for path in args.workloads:  # every file read before anything is measured
            try:
                load_workload(path)
            except ConjugateError as e:
                parser.error(str(e))
        require_gpu(parser, "timing a phase needs a GPU (--sweeps alone needs none)")

        out["copy_gbs"] = copy_gbs = copy_bandwidth_gbs(torch.device("cuda"))
        for path in args.workloads:
            out["phases"].append(measure_phase(path, copy_gbs, how))
            write_json(args.json, out)
            gc.collect()  # the workload's rounds and graphs, before the next one's
            torch.cuda.empty_cache()
    write_json(args.json, out)
    low = [r for r in out["shapes"] if r["bw_fraction"] < (0.80 if r["kind"] == "attention" else 0.85)]
    print(f"{len(out['shapes'])} shapes, {len(low)} under #49's share (GEMMs 85%, attention 80% of copy)")
    label = Comparison(args.model).label
    for r in out["phases"]:
        if f"{label}_ms" in r:
            ms = r[f"{label}_ms"]
            others = {name: v[f"{label}_ms"] for name, v in r.get("variants", {}).items()
                      if name != "sequential" and f"{label}_ms" in v}
            print(f"{r['workload']:<24} {label} {ms:7.3f} ms  floor {r[f'{label}_floor_ms']:7.3f}  {r['ratio']:.2f}x"
                  + "".join(f"  {name} {other:7.3f} ({other / ms:.3f})" for name, other in others.items()))
            timed = {"sequential": r} | r.get("variants", {})
            fastest = min((name for name in timed if "ledger" in timed[name]),
                          key=lambda name: timed[name][f"{label}_ms"], default=None)
            if fastest:
                print(f"    {fastest}, losing most: " + ", ".join(
                    f"{k['kind']} {k['us'] - k['floor_us']:.0f} us ({k['bandwidth_fraction']:.0%} of copy)"
                    for k in sorted(timed[fastest]["ledger"]["kinds"], key=lambda k: k["floor_us"] - k["us"])[:4]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
