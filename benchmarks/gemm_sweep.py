"""The GEMM template's tiles at the example workloads' decode shapes, each launch alone from cold L2.

    python benchmarks/gemm_sweep.py examples/llama-1b-8b-b8.toml [...] [--kinds qkv o_proj gate_up down]
                                    [--models draft target] [--per-shape 64] [--prewarm 12] [--json OUT.json]

Per distinct shape (rows, N, K, epilogue) of the workloads' qkv, o_proj, gate_up and down GEMMs,
with the epilogues of the `streams` plan (store, residual, silu_mul, residual into fp32 rows; bf16
activation rows and weights, as compiler/buffers.py stores a GEMM's input): the tile `plans/streams.json` ships, with its launch settings, and up to --per-shape
candidates of `candidates()` (BLOCK_N x BLOCK_K x SPLIT_K x num_warps x num_stages, pruned to grids
that fill the GPU without running out of shared memory or registers; the shipped tile's one-knob
neighbours first, then a seeded sample of the rest). Each is checked against torch, then timed as
launch verdicts time a launch: ten calls in a CUDA graph, L2 overwritten before each and the
overwrite's own time subtracted (timing.time_per_call). Its weight bytes over that time against the
copy bandwidth say how near the byte floor the tile gets.

`--prewarm N` first compiles every candidate in N processes at once (Triton's warmup: nothing runs),
so the timing process loads them from Triton's cache. One process times everything: compare within
a run.

    python benchmarks/gemm_sweep.py --tabulate SWEEP.json [...] --device H200 [--table search/tiles.json]

measures nothing: it writes the tiles that beat the shipped one by at least MIN_GAIN into the GPU
model's table of search/tiles.json (the heuristic proposes them: conjugate/agents/tile_table.py),
replacing that model's earlier table.
"""
from __future__ import annotations

import argparse
import itertools
import json
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from conjugate.paths import shipped_plan  # noqa: E402
from conjugate.plan import load_plan  # noqa: E402
from conjugate.workload import Workload, load_workload  # noqa: E402

KINDS = ("qkv", "o_proj", "gate_up", "down")
EPILOGUE = {"qkv": "store", "o_proj": "residual", "gate_up": "silu_mul", "down": "residual"}
BLOCK_NS = (16, 32, 64, 128, 256)
BLOCK_KS = (64, 128, 256, 512)
SPLIT_KS = (1, 2, 4, 8, 16, 32)
WARPS = (4, 8)
STAGES = (2, 3, 4, 5, 6)
SHARED_BYTES = 200 << 10  # of the H200's 227 KB a program may use, leaving room for the epilogue
MAX_ACC_PER_THREAD = 128  # fp32 accumulator values per thread before registers spill
X_BYTES = 2  # a GEMM's input rows are stored in the weights' type (compiler/buffers.py)
W_BYTES = 2  # bf16 weights
CALLS = 10
MIN_GAIN = 0.03  # a tile goes into the table when it takes at least this much less time than the shipped one


@dataclass(frozen=True)
class Shape:
    rows: int
    n: int
    k: int
    kind: str

    @property
    def epilogue(self) -> str:
        return EPILOGUE[self.kind]

    @property
    def weights(self) -> int:
        """Weight matrices a tile streams: gate and up for silu_mul."""
        return 2 if self.kind == "gate_up" else 1

    @property
    def weight_bytes(self) -> int:
        return self.weights * self.n * self.k * W_BYTES

    def key(self) -> str:
        return f"{self.kind} {self.rows}x{self.n}x{self.k}"


@dataclass(frozen=True)
class Tile:
    block_m: int
    block_n: int
    block_k: int
    split_k: int
    warps: int
    stages: int

    def programs(self, shape: Shape) -> int:
        return -(-shape.rows // self.block_m) * -(-shape.n // self.block_n) * self.split_k

    def shared_bytes(self, shape: Shape) -> int:
        """The pipelined loads' buffers: each stage holds a weight tile per weight and an activation tile."""
        return self.stages * self.block_k * (self.block_n * shape.weights * W_BYTES + self.block_m * X_BYTES)

    def acc_per_thread(self, shape: Shape) -> float:
        return shape.weights * self.block_m * self.block_n / (self.warps * 32)


def block_ms(rows: int) -> tuple[int, ...]:
    """BLOCK_M candidates: the smallest power of two (at least 16) holding every row, at most 64;
    past 64 rows also 128 (one M block) beside 64 (two or more)."""
    one = max(16, 1 << (rows - 1).bit_length())
    return (one,) if one <= 64 else (64, 128)


def fits(tile: Tile, shape: Shape, sms: int) -> bool:
    """A tile worth timing: every split walks at least two K blocks (and one per stage in flight), the
    grid is at least half a wave and at most 16 waves, the buffers fit and the accumulators stay in
    registers."""
    k_blocks = shape.k // (tile.split_k * tile.block_k)
    return (k_blocks >= max(2, tile.stages - 1) and sms // 2 <= tile.programs(shape) <= 16 * sms
            and tile.block_n <= max(16, shape.n) and tile.shared_bytes(shape) <= SHARED_BYTES
            and tile.acc_per_thread(shape) <= MAX_ACC_PER_THREAD)


def neighbours(tile: Tile) -> list[Tile]:
    """The tiles one knob away from `tile` (the next value up or down of each knob's list)."""
    out = []
    for field, values in (("block_n", BLOCK_NS), ("block_k", BLOCK_KS), ("split_k", SPLIT_KS), ("warps", WARPS),
                          ("stages", STAGES)):
        here = getattr(tile, field)
        at = values.index(here) if here in values else None
        for step in (-1, 1):
            if at is not None and 0 <= at + step < len(values):
                out.append(Tile(**(asdict(tile) | {field: values[at + step]})))
    return out


def candidates(shape: Shape, shipped: Tile, sms: int, per_shape: int, seed: int = 0) -> list[Tile]:
    """The shipped tile first, then its neighbours that fit, then a seeded sample of every other tile
    that fits, `per_shape` in all besides the shipped one."""
    grid = [Tile(bm, bn, bk, s, w, st) for bm, bn, bk, s, w, st in
            itertools.product(block_ms(shape.rows), BLOCK_NS, BLOCK_KS, SPLIT_KS, WARPS, STAGES)]
    near = [t for t in neighbours(shipped) if fits(t, shape, sms)]
    rest = [t for t in grid if fits(t, shape, sms) and t != shipped and t not in near]
    random.Random(f"{seed} {shape.key()}").shuffle(rest)
    return [shipped] + (near + rest)[:per_shape]


def shapes_of(workload: Workload, models: tuple[str, ...], kinds: tuple[str, ...]) -> list[tuple[str, Shape]]:
    """(model, shape) of each GEMM kind of each model, rows as one decode step (draft) or the verify
    pass (target) has them."""
    out = []
    for model in models:
        spec = getattr(workload, model)
        rows = workload.draft_rows if model == "draft" else workload.target_rows
        out += [(model, Shape(rows, *spec.projection(kind), kind)) for kind in kinds]
    return out


def shipped_tile(plan: dict, model: str, kind: str) -> Tile:
    """The tile and launch settings `plan` gives `kind` in `model` (per-op num_warps/num_stages first)."""
    tiles, launch = plan["tiles"][model][kind], plan["launch"]
    return Tile(tiles["BLOCK_M"], tiles["BLOCK_N"], tiles["BLOCK_K"], tiles["SPLIT_K"],
                tiles.get("num_warps", launch["num_warps"]), tiles.get("num_stages", launch["num_stages"]))


def distinct_shapes(paths: list[Path], models: tuple[str, ...], kinds: tuple[str, ...]) -> list[dict]:
    """Each distinct shape once, with the workloads and model it comes from and the shipped tile."""
    plan = load_plan(shipped_plan("streams")).data
    seen: dict[Shape, dict] = {}
    for path in paths:
        workload = load_workload(path)
        for model, shape in shapes_of(workload, models, kinds):
            entry = seen.setdefault(shape, {"shape": shape, "model": model, "workloads": [],
                                            "shipped": shipped_tile(plan, model, shape.kind)})
            entry["workloads"].append(workload.name)
    return list(seen.values())


def tabulate(sweeps: list[Path], device: str, table_path: Path) -> dict:
    """The GPU model's table of `table_path` (search/tiles.json) made from `sweeps`' results: per
    shape its best tile, where it beats the shipped one by MIN_GAIN. -> the table written."""
    from conjugate.agents.tile_table import load_tile_tables, table_from_json
    from conjugate.errors import ConjugateError
    from conjugate.evaluate.measured import names_device
    from conjugate.files import write_atomic

    entries, dates = {}, []
    for path in sweeps:
        run = json.loads(path.read_text())
        if not names_device(device, run["gpu"]):
            raise SystemExit(f"--device {device}: {path} was measured on {run['gpu']}")
        dates.append(run["date"])
        for s in run["shapes"]:
            best, shipped = s["best"], s["shipped"]
            if best and "us" in shipped and best["us"] <= (1 - MIN_GAIN) * shipped["us"]:
                entries[(s["kind"], s["rows"], s["n"], s["k"])] = {
                    "kind": s["kind"], "rows": s["rows"], "n": s["n"], "k": s["k"],
                    "tile": {"BLOCK_M": best["block_m"], "BLOCK_N": best["block_n"], "BLOCK_K": best["block_k"],
                             "SPLIT_K": best["split_k"], "num_warps": best["warps"], "num_stages": best["stages"]},
                    "us": round(best["us"], 2), "shipped_us": round(shipped["us"], 2)}
    table = {"device": device, "date": max(dates), "source": ", ".join(p.name for p in sweeps),
             "tiles": [entries[key] for key in sorted(entries)]}
    try:
        table_from_json(table, f"{table_path}: the new {device} table")
        load_tile_tables(table_path)
    except ConjugateError as error:
        raise SystemExit(str(error))
    data = json.loads(table_path.read_text())
    data["tables"] = [t for t in data["tables"] if t["device"] != device] + [table]
    write_atomic(table_path, json.dumps(data, indent=1) + "\n")
    return table


# --- on the GPU ----------------------------------------------------------------------------------

def operands(shape: Shape, device: str = "cuda"):
    """Random activation rows and weights of `shape`, and torch's result for them."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(shape.rows, shape.k, device=device, generator=gen).bfloat16()
    ws = [(torch.randn(shape.n, shape.k, device=device, generator=gen) / shape.k ** 0.5).bfloat16()
          for _ in range(shape.weights)]
    ref = x.float() @ ws[0].float().T
    if shape.weights == 2:
        ref = F.silu(ref) * (x.float() @ ws[1].float().T)
    return x, ws, ref


def build(shape: Shape, tile: Tile, x, ws, kernels: Path):
    """The one-part launch of `tile` over fresh zeroed output rows: (launch, out)."""
    import torch

    from conjugate.compiler.codegen import KernelCache
    from conjugate.compiler.gemm import gemm_call
    from conjugate.compiler.round import CompiledLaunch

    out = torch.zeros(shape.rows, shape.n, device=x.device)
    call = gemm_call(x, ws[0], out, rows=shape.rows, epilogue=shape.epilogue, w2=ws[1] if shape.weights == 2 else None,
                     block_m=tile.block_m, block_n=tile.block_n, block_k=tile.block_k, split_k=tile.split_k)
    return CompiledLaunch.build(0, [call], KernelCache(kernels), num_warps=tile.warps, num_stages=tile.stages), out


def compile_only(job: Path) -> None:
    """A --prewarm process: compile (Triton's warmup, nothing launched) the tiles its job file lists."""
    request = json.loads(job.read_text())
    for item in request["items"]:
        shape = Shape(**item["shape"])
        x, ws, _ = operands(shape)
        for tile in item["tiles"]:
            try:
                build(shape, Tile(**tile), x, ws, Path(request["kernels"]))[0].warmup()
            except Exception:  # out of resources and the like: the timing process meets it and records it
                pass


def prewarm(entries: list[dict], tiles: dict[Shape, list[Tile]], processes: int, kernels: Path,
            limit_s: float = 400.0) -> float:
    """Every candidate compiled in `processes` processes at once; their seconds. None outlives it."""
    work = [(e["shape"], t) for e in entries for t in tiles[e["shape"]]]
    shares = [work[i::processes] for i in range(processes)]
    started, workers = time.perf_counter(), []
    with tempfile.TemporaryDirectory(prefix="gemm-sweep-jobs-") as jobs:
        for i, share in enumerate(s for s in shares if s):
            items: dict[Shape, list] = {}
            for shape, tile in share:
                items.setdefault(shape, []).append(asdict(tile))
            job = Path(jobs) / f"{i}.json"
            job.write_text(json.dumps({"kernels": str(kernels), "items": [{"shape": asdict(s), "tiles": t}
                                                                          for s, t in items.items()]}))
            workers.append(subprocess.Popen([sys.executable, __file__, "--compile-only", str(job)]))
        try:
            for worker in workers:
                worker.wait(timeout=max(1.0, limit_s - (time.perf_counter() - started)))
        except subprocess.TimeoutExpired:
            print(json.dumps({"prewarm": f"stopped after {limit_s:g} s"}), flush=True)
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.kill()
                    worker.wait()
    return time.perf_counter() - started


def time_tiles(shape: Shape, tiles: list[Tile], kernels: Path, copy_gbs: float, flush_us: float) -> list[dict]:
    """Each tile checked against torch, then timed alone from cold L2."""
    import torch

    from conjugate.evaluate.timing import l2_flush_bytes, time_per_call

    device = torch.device("cuda")
    x, ws, ref = operands(shape)
    rows = []
    for tile in tiles:
        row = asdict(tile) | {"programs": tile.programs(shape)}
        try:
            launch, out = build(shape, tile, x, ws, kernels)
            launch()
            torch.cuda.synchronize()
        except Exception as error:  # out of shared memory and the like: recorded, the sweep goes on
            rows.append(row | {"error": f"{type(error).__name__}: {' '.join(str(error).split())[:200]}"})
            continue
        rel_err = float((out - ref).norm() / ref.norm())
        if rel_err > 1e-2:
            rows.append(row | {"error": f"wrong: relative error {rel_err:.3g}"})
            continue
        us = time_per_call(launch, device, CALLS, flush_bytes=l2_flush_bytes(device), flush_us=flush_us)
        rows.append(row | {"us": us, "share_of_copy": shape.weight_bytes / (us * 1e-6) / (copy_gbs * 1e9)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="*", type=Path)
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--models", nargs="+", choices=("draft", "target"), default=["draft", "target"])
    parser.add_argument("--per-shape", type=int, default=64, help="candidates per shape besides the shipped tile")
    parser.add_argument("--prewarm", type=int, default=0, metavar="N", help="compile the candidates in N processes first")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--tabulate", nargs="+", type=Path, metavar="SWEEP.json",
                        help="measure nothing: write these sweeps' winning tiles into --table for --device")
    parser.add_argument("--device", help="with --tabulate: the GPU model's word, e.g. H200")
    parser.add_argument("--table", type=Path, default=None, help="with --tabulate (default: search/tiles.json)")
    parser.add_argument("--compile-only", type=Path, help=argparse.SUPPRESS)  # a --prewarm process
    args = parser.parse_args()
    if args.compile_only:
        return compile_only(args.compile_only)
    if args.tabulate:
        from conjugate.paths import TILES_FILE

        if not args.device:
            parser.error("--tabulate needs --device (the word of the GPU's name the table is for)")
        table = tabulate(args.tabulate, args.device, args.table or TILES_FILE)
        print(f"{len(table['tiles'])} tiles for {args.device} in {args.table or TILES_FILE}")
        return
    if not args.workloads:
        parser.error("name at least one workload file")
    import torch

    from conjugate.evaluate.timing import copy_bandwidth_gbs, flush_time_us, l2_flush_bytes

    device = torch.device("cuda")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    entries = distinct_shapes(args.workloads, tuple(args.models), tuple(args.kinds))
    tiles = {e["shape"]: candidates(e["shape"], e["shipped"], sms, args.per_shape) for e in entries}
    copy_gbs = copy_bandwidth_gbs(device)
    flush_us = flush_time_us(device, CALLS, l2_flush_bytes(device))
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "command": " ".join(sys.argv),
           "date": time.strftime("%Y-%m-%d"), "copy_gbs": copy_gbs, "shapes": []}
    with tempfile.TemporaryDirectory(prefix="gemm-sweep-") as kernels:
        if args.prewarm:
            out["prewarm_s"] = prewarm(entries, tiles, args.prewarm, Path(kernels))
        for e in entries:
            shape = e["shape"]
            rows = time_tiles(shape, tiles[shape], Path(kernels), copy_gbs, flush_us)
            timed = [r for r in rows if "us" in r]
            result = {"shape": shape.key(), "model": e["model"], "workloads": e["workloads"], **asdict(shape),
                      "weight_bytes": shape.weight_bytes, "shipped": rows[0],
                      "best": min(timed, key=lambda r: r["us"]) if timed else None, "tried": rows}
            out["shapes"].append(result)
            print(json.dumps({k: result[k] for k in ("shape", "model", "shipped", "best")}), flush=True)
            if args.json:
                args.json.write_text(json.dumps(out, indent=1) + "\n")
    print_table(out["shapes"])


def print_table(shapes: list[dict]) -> None:
    print(f"{'shape':28} {'model':6} {'MB':>6} {'shipped us':>10} {'share':>6} {'best us':>8} {'share':>6}  best tile")
    for s in shapes:
        shipped, best = s["shipped"], s["best"] or {}
        tile = "" if not best else "M{block_m} N{block_n} K{block_k} S{split_k} w{warps} st{stages}".format(**best)
        print(f"{s['shape']:28} {s['model']:6} {s['weight_bytes'] / 1e6:6.1f} {shipped.get('us', float('nan')):10.1f} "
              f"{shipped.get('share_of_copy', float('nan')):6.0%} {best.get('us', float('nan')):8.1f} "
              f"{best.get('share_of_copy', float('nan')):6.0%}  {tile}")


if __name__ == "__main__":
    main()
