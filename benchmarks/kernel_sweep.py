"""The GEMM and attention templates' tiles at the example workloads' decode shapes, each launch alone
from cold L2, against the tile the shipped plan gives it.

    python benchmarks/kernel_sweep.py examples/llama-1b-8b-b8.toml [...] [--kinds qkv o_proj gate_up down mlp attn]
                                      [--models draft target] [--per-shape 96] [--prewarm 14] [--json OUT.json]
                                      [--tiles-from SWEEP.json ...] [--tma] [--cublas] [--read]
                                      [--batches 16 32 64] [--ks 1 3 5 7] [--contexts 512 8192]

Per distinct shape of the workloads' qkv, o_proj, gate_up and down GEMMs (the epilogues of the `streams`
plan: store and residual into fp32 rows, silu_mul into bf16 ones; bf16 input rows and weights, as
compiler/buffers.py stores them) and of their attention (fp32 queries, bf16 caches at the workload's
context, bf16 output; the draft's first step and the verify pass): the tile `plans/streams.json` ships, with its
launch settings, and up to --per-shape candidates (GEMM: BLOCK_N x BLOCK_K x SPLIT_K x num_warps x
num_stages; attention: BLOCK_N x SPLIT_KV x num_warps x num_stages), pruned to grids that fill the GPU
(attention: any grid) without running out of shared memory or registers (`fits`): past 128 rows the
tall tiles a compute-bound matmul runs at first (`compute_tiles`, since 03a0dc4), then the shipped
tile's one-knob neighbours, then a seeded sample of the rest. Each launch is checked against torch, then
timed as launch verdicts time one: ten calls in a CUDA graph, L2 overwritten before each, the
overwrites' own time taken off replay by replay (timing.time_per_call). Its bytes (weights; K and V read) over that time
against the copy bandwidth say how near the byte floor the tile gets.

`--batches`, `--ks` and `--contexts` also take each workload's models at those serving sizes (every
combination; what is not given stays the workload's): the verify rows of B x (k + 1), the draft's B
rows, attention at each context. A shape is swept once however many sizes share it, and lists them.

Kind `mlp` is the fused MLP (plan fusion gate_up+down, compiler/mlp.py) at the gate_up shape: its
tiles are gate_up's keys (BLOCK_N the ffn columns a program owns, SPLIT_K 1), the shipped one
gate_up's. Where the same run swept that shape's gate_up and down, its entry also says what the two
separate launches take (`separate`: their shipped and their best times, summed). It is never
tabulated: search/tiles.json holds tiles of the separate kinds.

`--prewarm N` first compiles every candidate in N processes at once (Triton's warmup: nothing runs),
so the timing process loads them from Triton's cache. One process times everything: compare within
a run. `--tiles-from` times only the shipped tile and the best one earlier sweeps found per shape;
`--tma` times each GEMM tile beside its twin that loads weight tiles through TMA descriptors (tile key
TMA 1, at most 256 a side); `--cublas` also times each GEMM shape as one cuBLAS product of the same
bytes (`torch.mm`, gate and up stacked, no epilogue): what the library reaches; `--read` times each
shape as a launch reading its bytes, the fastest of torch's row sums and `stream_read` at four tiles
(a read without `reader` in a sweep's JSON is torch's row sums alone, which the GEMMs beat at 8-13 MB): the share of the copy
rate a launch of that size reaches alone (a few MB do not ramp to the rate). `--resume` keeps the shapes the --json file
holds from a run cut short on the same GPU model (its commands in `runs`) and sweeps the rest, so a
sweep of #49's serving sizes can span several calls.

    python benchmarks/kernel_sweep.py --tabulate SWEEP.json [...] --device H200 [--table search/tiles.json]

measures nothing: it writes the tiles that beat the shipped one by at least MIN_GAIN into the GPU
model's table of search/tiles.json (the heuristic proposes them: conjugate/agents/heuristic/tile_table.py),
replacing that model's earlier table.

    python benchmarks/kernel_sweep.py --fit SWEEP.json

measures nothing either: per GEMM kind, a straight line through its shapes' best times (time = a
fixed time per launch + bytes at a streaming rate), which says whether a kind loses to its streaming
speed or to each launch's start, ramp and tail.

    python benchmarks/kernel_sweep.py --transfer H100_SWEEP.json [...] --onto H200_SWEEP.json [...]

measures nothing either: per shape swept on both GPUs, the first GPU's best tile as the second GPU's
sweep timed it, against that sweep's shipped and best tiles: whether one GPU model's table serves
another (the heuristic offers a same-chip sibling's tiles where its own table lacks a shape).
"""
from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from common import environment, make_parser, positive, require_gpu, write_json

from conjugate.paths import shipped_plan  # noqa: E402
from conjugate.plan import load_plan  # noqa: E402
from conjugate.workload import Workload, load_workload  # noqa: E402

import triton  # noqa: E402  (after conjugate, which sets the interpreter on a machine without a GPU)
import triton.language as tl  # noqa: E402

GEMM_KINDS = ("qkv", "o_proj", "gate_up", "down")
KINDS = GEMM_KINDS + ("mlp", "attn")
EPILOGUE = {"qkv": "store", "o_proj": "residual", "gate_up": "silu_mul", "down": "residual"}
TABLE_KINDS = GEMM_KINDS + ("attn",)  # the kinds --tabulate writes
BLOCK_NS = (16, 32, 64, 128, 256)
BLOCK_KS = (64, 128, 256, 512)
SPLIT_KS = (1, 2, 4, 8, 16, 32)
SPLIT_KVS = (1, 2, 4, 8, 16, 32, 64)
WARPS = (4, 8)
ATTN_WARPS = (2, 4, 8)
STAGES = (2, 3, 4, 5, 6)
ATTN_STAGES = (1, 2, 3, 4)
SHARED_BYTES = 200 << 10  # of the H200's 227 KB a program may use, leaving room for the epilogue
READ_SHARE_MAX = 1.2  # a launch reading cold bytes faster than this share of the copy rate was not timed
# stream_read's (BLOCK, programs an SM) tried by --read: a program has one BLOCK's loads in flight (the loop
# adds them before it asks for the next; no cp.async to pipeline), so an SM 32-64 KB, over the ~18 KB a
# Hopper's rate x latency asks; as many programs as fit an SM at once (BLOCK 8192: 48 registers a thread, five)
READERS = ((4096, 4), (4096, 8), (8192, 4), (16384, 2))
# Past 128 rows a GEMM's tensor-core work nears its bytes' time (the ridge: 263 rows on an H100), and the
# template at the sampled tiles ran 1.08-2.30x cuBLAS's time there (results/serving_reads_h100.json): every
# such shape also tries the tall tiles a Hopper matmul runs at, (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages)
# at each of COMPUTE_SPLITS that fits, beside the sample
COMPUTE_ROWS = 129
COMPUTE_TILES = ((128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 256, 64, 8, 3), (128, 64, 64, 4, 4))
COMPUTE_SPLITS = (1, 2, 4)
MAX_ACC_PER_THREAD = 128  # fp32 accumulator values per thread before registers spill
ELEMENT = 2  # bytes of a bf16 weight, input row or cache element
CALLS = 10
MIN_GAIN = 0.03  # a tile goes into the table when it takes at least this much less time than the shipped one


@dataclass(frozen=True)
class Shape:
    """A GEMM of `rows` input rows, N out features and K in features."""
    rows: int
    n: int
    k: int
    kind: str

    @property
    def epilogue(self) -> str:
        return EPILOGUE[self.kind]

    @property
    def weights(self) -> int:
        """Weight matrices a tile streams at once: gate and up for silu_mul and the fused MLP."""
        return 2 if self.kind in ("gate_up", "mlp") else 1

    @property
    def bytes(self) -> int:
        """The weights: the fused MLP's down too (n: the ffn size, k: the hidden size)."""
        return (3 if self.kind == "mlp" else self.weights) * self.n * self.k * ELEMENT

    def key(self) -> str:
        return f"{self.kind} {self.rows}x{self.n}x{self.k}"

    def fields(self) -> dict:
        return {"rows": self.rows, "n": self.n, "k": self.k}


@dataclass(frozen=True)
class AttnShape:
    """One layer's attention: `tokens` new tokens of `batch` sequences after `context` cached ones."""
    batch: int
    tokens: int
    heads: int
    kv_heads: int
    head_dim: int
    context: int
    kind: str = "attn"

    @property
    def rows(self) -> int:
        """A program's query rows: the query heads of one KV head times the tokens, at least 16."""
        return max(16, 1 << (self.heads // self.kv_heads * self.tokens - 1).bit_length())

    @property
    def keys(self) -> int:
        return self.context + self.tokens

    @property
    def bytes(self) -> int:
        """K and V of every sequence's keys."""
        return 2 * self.batch * self.kv_heads * self.keys * self.head_dim * ELEMENT

    def key(self) -> str:
        return f"attn B{self.batch} T{self.tokens} h{self.heads}/{self.kv_heads}x{self.head_dim} ctx{self.context}"

    def fields(self) -> dict:
        return {f: getattr(self, f) for f in ("batch", "tokens", "heads", "kv_heads", "head_dim", "context")}


@dataclass(frozen=True)
class Tile:
    """A GEMM tile with its launch settings."""
    block_m: int
    block_n: int
    block_k: int
    split_k: int
    warps: int
    stages: int
    tma: int = 0  # weight tiles through the tensor memory accelerator (tile key TMA)

    def programs(self, shape: Shape) -> int:
        return -(-shape.rows // self.block_m) * -(-shape.n // self.block_n) * self.split_k

    def shared_bytes(self, shape: Shape) -> int:
        """The pipelined loads' buffers: each stage holds a weight tile per weight and an input tile."""
        return self.stages * self.block_k * (self.block_n * shape.weights + self.block_m) * ELEMENT

    def acc_per_thread(self, shape: Shape) -> float:
        return shape.weights * self.block_m * self.block_n / (self.warps * 32)

    def plan_keys(self) -> dict[str, int]:
        return {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n, "BLOCK_K": self.block_k, "SPLIT_K": self.split_k,
                "num_warps": self.warps, "num_stages": self.stages} | ({"TMA": 1} if self.tma else {})


@dataclass(frozen=True)
class AttnTile:
    """An attention tile with its launch settings."""
    block_n: int
    split_kv: int
    warps: int
    stages: int

    def programs(self, shape: AttnShape) -> int:
        return shape.batch * shape.kv_heads * self.split_kv

    def shared_bytes(self, shape: AttnShape) -> int:
        """The pipelined loads' buffers: each stage holds a K and a V tile."""
        return max(1, self.stages - 1) * 2 * self.block_n * shape.head_dim * ELEMENT

    def acc_per_thread(self, shape: AttnShape) -> float:
        """Scores and the output accumulator, per thread."""
        return shape.rows * (self.block_n + shape.head_dim) / (self.warps * 32)

    def plan_keys(self) -> dict[str, int]:
        return {"BLOCK_N": self.block_n, "SPLIT_KV": self.split_kv, "num_warps": self.warps,
                "num_stages": self.stages}


def block_ms(rows: int) -> tuple[int, ...]:
    """BLOCK_M candidates: the smallest power of two (at least 16) holding every row, at most 64;
    past 64 rows also 128 (one M block) beside 64 (two or more)."""
    one = max(16, 1 << (rows - 1).bit_length())
    return (one,) if one <= 64 else (64, 128)


def fits(tile: Tile | AttnTile, shape: Shape | AttnShape, sms: int) -> bool:
    """A tile worth timing: the grid is at least half a wave (the fused MLP: a quarter; attention: any,
    one program a (sequence, KV head) pair or more) and at most 16 waves (attention: 32), the buffers
    fit, the accumulators stay in registers, and each program walks at least two blocks of its
    reduction (GEMM: K blocks, one per stage in flight; attention: keys). Over few pairs half a wave of
    attention programs leaves only 16-key blocks, and a smaller grid of larger blocks wins (llama-3.1-8b,
    one sequence, 512 keys: 32 programs 7.2 us, the best of 128 8.0 us; H100,
    results/attention_sweep_h100.json)."""
    if isinstance(tile, AttnTile):
        walked, waves = shape.keys // (tile.split_kv * tile.block_n), 32
        least = 1
    else:
        walked, waves = shape.k // (tile.split_k * tile.block_k), 16
        if walked < tile.stages - 1 or tile.block_n > max(16, shape.n) or (shape.kind == "mlp" and tile.split_k > 1):
            return False
        least = sms // 4 if shape.kind == "mlp" else sms // 2  # the fused MLP: larger ffn blocks, fewer atomics
    return (walked >= 2 and least <= tile.programs(shape) <= waves * sms
            and tile.shared_bytes(shape) <= SHARED_BYTES and tile.acc_per_thread(shape) <= MAX_ACC_PER_THREAD)


def knob_values(tile: Tile | AttnTile) -> tuple[tuple[str, tuple[int, ...]], ...]:
    if isinstance(tile, AttnTile):
        return ("block_n", BLOCK_NS), ("split_kv", SPLIT_KVS), ("warps", ATTN_WARPS), ("stages", ATTN_STAGES)
    return ("block_n", BLOCK_NS), ("block_k", BLOCK_KS), ("split_k", SPLIT_KS), ("warps", WARPS), ("stages", STAGES)


def neighbours(tile: Tile | AttnTile) -> list:
    """The tiles one knob away from `tile` (the next value up or down of each knob's list)."""
    out = []
    for field, values in knob_values(tile):
        here = getattr(tile, field)
        at = values.index(here) if here in values else None
        for step in (-1, 1):
            if at is not None and 0 <= at + step < len(values):
                out.append(type(tile)(**(asdict(tile) | {field: values[at + step]})))
    return out


def every_tile(shape: Shape | AttnShape) -> list:
    if isinstance(shape, AttnShape):
        return [AttnTile(*values) for values in itertools.product(BLOCK_NS, SPLIT_KVS, ATTN_WARPS, ATTN_STAGES)]
    return [Tile(*values) for values in itertools.product(block_ms(shape.rows), BLOCK_NS, BLOCK_KS, SPLIT_KS, WARPS,
                                                          STAGES)]


def compute_tiles(shape, sms: int) -> list[Tile]:
    """COMPUTE_TILES at each of COMPUTE_SPLITS that fits, for a GEMM of COMPUTE_ROWS rows or more (none below)."""
    if not isinstance(shape, Shape) or shape.rows < COMPUTE_ROWS:
        return []
    tiles = [Tile(m, n, k, split, warps, stages) for m, n, k, warps, stages in COMPUTE_TILES for split in COMPUTE_SPLITS]
    return [t for t in tiles if fits(t, shape, sms)]


def candidates(shape, shipped, sms: int, per_shape: int, seed: int = 0) -> list:
    """The shipped tile first, then (past 128 rows) the compute tiles, then its neighbours that fit, then
    a seeded sample of every other tile that fits, `per_shape` in all besides the shipped one."""
    near = [t for t in compute_tiles(shape, sms) if t != shipped]
    near += [t for t in neighbours(shipped) if fits(t, shape, sms) and t not in near]
    rest = [t for t in every_tile(shape) if fits(t, shape, sms) and t != shipped and t not in near]
    random.Random(f"{seed} {shape.key()}").shuffle(rest)
    return [shipped] + (near + rest)[:per_shape]


def found_tiles(sweeps: list[Path], shape, shipped) -> list:
    """The shipped tile, then the best tile each sweep found for `shape` (none where no sweep timed it)."""
    out = [shipped]
    for sweep in sweeps:
        try:
            entries = json.loads(sweep.read_text())["shapes"]
            found = [{f: e["best"][f] for f in tile_fields(shipped)} for e in entries
                     if e["shape"] == shape.key() and e.get("best")]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"{sweep}: not a kernel_sweep.py --json result ({type(e).__name__}: {e})") from None
        for fields in found:
            if (tile := type(shipped)(**fields)) not in out:
                out.append(tile)
    return out


def tile_fields(tile) -> tuple[str, ...]:
    return tuple(f for f in asdict(tile) if f != "tma")


def with_tma(shape, tiles: list) -> list:
    """Each GEMM tile beside its TMA twin, where a TMA copy holds its tile (at most 256 a side)."""
    if isinstance(shape, AttnShape) or shape.kind == "mlp":
        return tiles
    return [t for tile in tiles for t in (tile, replace(tile, tma=1)) if not t.tma or max(t.block_n, t.block_k) <= 256]


def shapes_of(workload: Workload, models: tuple[str, ...], kinds: tuple[str, ...]) -> list[tuple[str, object]]:
    """(model, shape) of each kind of each model: GEMM rows as one decode step (draft) or the verify
    pass (target) has them; attention at the workload's context."""
    out = []
    for model in models:
        spec = getattr(workload, model)
        draft = model == "draft"
        for kind in kinds:
            if kind == "attn":
                batch = workload.draft_batch if draft else workload.target_batch
                out.append((model, AttnShape(batch, 1 if draft else workload.k + 1, spec.num_heads, spec.num_kv_heads,
                                             spec.head_dim, workload.context)))
            else:
                rows = workload.draft_rows if draft else workload.target_rows
                out.append((model, Shape(rows, *spec.projection("gate_up" if kind == "mlp" else kind), kind)))
    return out


def shipped_tile(plan: dict, model: str, kind: str) -> Tile | AttnTile:
    """The tile and launch settings `plan` (a canonical conjugate.plan/2 dict) gives `kind` in `model`
    (per-op num_warps/num_stages first)."""
    if kind == "mlp":  # gate_up's tile, its SPLIT_K giving way to 1 (compiler/lower.py)
        return replace(shipped_tile(plan, model, "gate_up"), split_k=1)
    tiles, launch = plan[model]["tiles"][kind], plan["cross"]["launch"]
    warps, stages = tiles.get("num_warps", launch["num_warps"]), tiles.get("num_stages", launch["num_stages"])
    if kind == "attn":
        return AttnTile(tiles["BLOCK_N"], tiles["SPLIT_KV"], warps, stages)
    return Tile(tiles["BLOCK_M"], tiles["BLOCK_N"], tiles["BLOCK_K"], tiles["SPLIT_K"], warps, stages)


@dataclass(frozen=True)
class ServingSizes:
    """Batch sizes, k values and contexts at which to sweep each workload's shapes besides its own
    (empty: the workload's own value)."""
    batches: tuple[int, ...] = ()
    ks: tuple[int, ...] = ()
    contexts: tuple[int, ...] = ()

    def variants(self, workload: Workload) -> list[tuple[Workload, str]]:
        """The workload at every combination given, each with the label its shapes are listed under."""
        out = []
        for batch in self.batches or (None, ):
            for k in self.ks or (workload.k, ):
                for context in self.contexts or (workload.context, ):
                    sizes = {} if batch is None else {"draft_batch": batch, "target_batch": batch}
                    w = replace(workload, k=k, context=context, **sizes)
                    label = workload.name if w == workload else \
                        f"{workload.name} (B={w.target_batch}, k={w.k}, context={w.context})"
                    out.append((w, label))
        return out


def distinct_shapes(paths: list[Path], models: tuple[str, ...], kinds: tuple[str, ...],
                    serving: ServingSizes = ServingSizes()) -> list[dict]:
    """Each distinct shape once, with the workloads (and serving sizes) it comes from, its model and
    the shipped tile."""
    plan = load_plan(shipped_plan("streams")).data
    seen: dict[object, dict] = {}
    for path in paths:
        for workload, label in serving.variants(load_workload(path)):
            for model, shape in shapes_of(workload, models, kinds):
                entry = seen.setdefault(shape, {"shape": shape, "model": model, "workloads": [],
                                                "shipped": shipped_tile(plan, model, shape.kind)})
                entry["workloads"].append(label)
    return list(seen.values())


def tabulate(sweeps: list[Path], device: str, table_path: Path) -> dict:
    """The GPU model's table of `table_path` (search/tiles.json) made from `sweeps`' results: per
    shape its best tile, where it beats the shipped one by MIN_GAIN. A shape whose read launch (--read)
    was too short to time beside the L2 flush is left out: its tiles' times are that flush's noise.
    -> the table written."""
    from conjugate.agents.heuristic.tile_table import load_tile_tables, table_from_json
    from conjugate.errors import ConjugateError
    from conjugate.evaluate.measured import names_device
    from conjugate.files import write_atomic

    entries, dates = {}, []
    for path in sweeps:
        try:
            run = json.loads(path.read_text())
            if not names_device(device, run["gpu"]):
                raise SystemExit(f"--device {device}: {path} was measured on {run['gpu']}")
            dates.append(run["date"])
            for s in run["shapes"]:
                if s["kind"] not in TABLE_KINDS or "error" in (s.get("read") or {}):
                    continue
                best, shipped = s["best"], s["shipped"]
                if best and "us" in shipped and best["us"] <= (1 - MIN_GAIN) * shipped["us"]:
                    entries[(s["kind"], *s["fields"].values())] = {
                        "kind": s["kind"], **s["fields"], "tile": best["plan_keys"],
                        "us": round(best["us"], 2), "shipped_us": round(shipped["us"], 2)}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            raise SystemExit(f"--tabulate {path}: not a sweep this script wrote ({type(error).__name__}: {error})")
    table = {"device": device, "date": max(dates), "source": ", ".join(p.name for p in sweeps),
             "tiles": [entries[key] for key in sorted(entries, key=str)]}
    try:
        table_from_json(table, f"{table_path}: the new {device} table")
        load_tile_tables(table_path)
    except ConjugateError as error:
        raise SystemExit(str(error))
    data = json.loads(table_path.read_text())
    data["tables"] = [t for t in data["tables"] if t["device"] != device] + [table]
    write_atomic(table_path, json.dumps(data, indent=1) + "\n")
    return table


def transfer(sources: list[Path], onto: list[Path]) -> list[dict]:
    """Measure nothing: per shape and model swept in both, the `sources`' best tile as the `onto`
    sweeps timed it (among their candidates), beside their shipped and best tiles: whether one GPU
    model's tiles serve another. Shapes whose source tile the onto sweep did not time are left out.
    -> [{"shape", "model", "tile", "us", "shipped_us", "best_us"}] (the onto GPU's times)."""
    def shapes(paths: list[Path], flag: str) -> dict[tuple[str, str], dict]:
        out = {}
        for path in paths:
            try:
                out |= {(s["shape"], s["model"]): s for s in json.loads(path.read_text())["shapes"]}
            except (OSError, ValueError, KeyError, TypeError) as error:
                raise SystemExit(f"{flag} {path}: not a sweep this script wrote ({type(error).__name__}: {error})")
        return out

    rows = []
    there = shapes(onto, "--onto")
    for key, s in shapes(sources, "--transfer").items():
        o = there.get(key)
        if not (o and s.get("best") and o.get("best") and "us" in o["shipped"]):
            continue
        timed = [t for t in o["tried"] if "us" in t and t["plan_keys"] == s["best"]["plan_keys"]]
        if timed:
            rows.append({"shape": key[0], "model": key[1], "tile": s["best"]["plan_keys"], "us": timed[0]["us"],
                         "shipped_us": o["shipped"]["us"], "best_us": o["best"]["us"]})
    return rows


def launch_fit(sweep: Path, which: str = "best") -> dict[str, dict]:
    """Per GEMM kind of a sweep, a least-squares line time = fixed + bytes / rate through its shapes'
    `which` ("best" or "shipped") times: {kind: {"shapes", "fixed_us", "rate_of_copy", "worst_residual_us"}}
    (rate_of_copy: the rate over the sweep's copy bandwidth). What a launch loses beside streaming."""
    try:
        run = json.loads(sweep.read_text())
        points: dict[str, list[tuple[float, float]]] = {}
        for s in run["shapes"]:
            if s["kind"] in GEMM_KINDS and s[which] and "us" in s[which]:
                points.setdefault(s["kind"], []).append((s["bytes"] / 1e6, s[which]["us"]))
        copy_gbs = float(run["copy_gbs"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SystemExit(f"--fit {sweep}: not a sweep this script wrote ({type(error).__name__}: {error})")
    out = {}
    for kind, pts in points.items():
        if len({mb for mb, _ in pts}) < 2:
            continue  # a line needs two sizes
        mean_x, mean_y = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in pts) / sum((x - mean_x) ** 2 for x, _ in pts)
        fixed = mean_y - slope * mean_x  # us; slope: us per MB, so 1 / slope is TB/s
        out[kind] = {"shapes": len(pts), "fixed_us": fixed,
                     "rate_of_copy": (1e3 / slope) / copy_gbs if slope > 0 else float("inf"),
                     "worst_residual_us": max(abs(y - fixed - slope * x) for x, y in pts)}
    return out


# --- on the GPU ----------------------------------------------------------------------------------

def operands(shape, device: str = "cuda") -> dict:
    """Random inputs of `shape` and torch's result for them ("ref")."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*size):
        return torch.randn(*size, device=device, generator=gen)

    if isinstance(shape, AttnShape):
        b, t, h, kvh, hd = shape.batch, shape.tokens, shape.heads, shape.kv_heads, shape.head_dim
        capacity = shape.keys
        q = randn(b * t, h * hd)
        caches = [randn(b, kvh, capacity, hd).bfloat16() for _ in range(2)]
        k, v = (c.float().repeat_interleave(h // kvh, dim=1) for c in caches)  # [B, H, S, hd]
        positions = shape.context + torch.arange(t, device=device)  # token t sees keys 0 .. context + t
        visible = torch.arange(capacity, device=device)[None, :] <= positions[:, None]
        ref = F.scaled_dot_product_attention(q.view(b, t, h, hd).transpose(1, 2), k, v, attn_mask=visible)
        lengths = torch.full((b,), shape.context, dtype=torch.int64, device=device)
        return {"q": q, "k": caches[0], "v": caches[1], "lengths": lengths,
                "ref": ref.transpose(1, 2).reshape(b * t, h * hd)}
    x = randn(shape.rows, shape.k).bfloat16()
    ws = [(randn(shape.n, shape.k) / shape.k ** 0.5).bfloat16() for _ in range(shape.weights)]
    ref = x.float() @ ws[0].float().T
    if shape.weights == 2:
        ref = F.silu(ref) * (x.float() @ ws[1].float().T)
    if shape.kind == "mlp":  # the activations stored in bf16 between the two products, as the launches do
        ws.append((randn(shape.k, shape.n) / shape.n ** 0.5).bfloat16())
        ref = ref.bfloat16().float() @ ws[2].float().T
    return {"x": x, "ws": ws, "ref": ref}


def build(shape, tile, inputs: dict, kernels: Path):
    """The one-part launch of `tile` over fresh zeroed outputs: (launch, out)."""
    import torch

    from conjugate.compiler.attention import attn_call
    from conjugate.compiler.cache import KernelCache
    from conjugate.compiler.gemm import gemm_call
    from conjugate.compiler.mlp import mlp_call
    from conjugate.compiler.round import CompiledLaunch

    # the outputs in the product's buffer types (compiler/buffers.py): attention and gate_up write the next
    # GEMM's operand in the weights' type, the others fp32 rows (an fp32 attention output took 2.4-13.2 us
    # more at 4-16 splits on an H100: lab/attention_combine/README.md)
    if isinstance(shape, AttnShape):
        out = torch.zeros_like(inputs["q"], dtype=inputs["k"].dtype)
        call = attn_call(inputs["q"], inputs["k"], inputs["v"], out, inputs["lengths"], batch=shape.batch,
                         tokens=shape.tokens, offset=0, num_heads=shape.heads, num_kv_heads=shape.kv_heads,
                         head_dim=shape.head_dim, block_n=tile.block_n, split_kv=tile.split_kv)
    elif shape.kind == "mlp":
        x, ws = inputs["x"], inputs["ws"]
        out = torch.zeros(shape.rows, shape.k, device=x.device)
        call = mlp_call(x, *ws, out, rows=shape.rows, act_dtype=torch.bfloat16, block_m=tile.block_m,
                        block_f=tile.block_n, block_k=tile.block_k)
    else:
        x, ws = inputs["x"], inputs["ws"]
        out = torch.zeros(shape.rows, shape.n, device=x.device, dtype=ws[0].dtype if shape.kind == "gate_up" else None)
        call = gemm_call(x, ws[0], out, rows=shape.rows, epilogue=shape.epilogue,
                         w2=ws[1] if shape.weights == 2 else None, block_m=tile.block_m, block_n=tile.block_n,
                         block_k=tile.block_k, split_k=tile.split_k)  # TMA loads: lab/tma_gemm/
    return CompiledLaunch.alone(0, call, KernelCache(kernels), num_warps=tile.warps, num_stages=tile.stages), out


def shape_from(item: dict):
    return AttnShape(**item) if item.get("kind") == "attn" else Shape(**item)


def tile_from(item: dict):
    return AttnTile(**item) if "split_kv" in item else Tile(**item)


def compile_only(job: Path) -> None:
    """A --prewarm process: compile (Triton's warmup, nothing launched) the tiles its job file lists."""
    request = json.loads(job.read_text())
    for item in request["items"]:
        shape = shape_from(item["shape"])
        inputs = operands(shape)
        for tile in item["tiles"]:
            try:
                build(shape, tile_from(tile), inputs, Path(request["kernels"]))[0].warmup()
            except Exception:  # out of resources and the like: the timing process meets it and records it
                pass


def prewarm(entries: list[dict], tiles: dict, processes: int, kernels: Path, limit_s: float = 400.0) -> float:
    """Every candidate compiled in `processes` processes at once; their seconds. None outlives it."""
    work = [(e["shape"], t) for e in entries for t in tiles[e["shape"]]]
    shares = [work[i::processes] for i in range(processes)]
    started, workers = time.perf_counter(), []
    with tempfile.TemporaryDirectory(prefix="kernel-sweep-jobs-") as jobs:
        for i, share in enumerate(s for s in shares if s):
            items: dict[object, list] = {}
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


def time_tiles(shape, tiles: list, kernels: Path, copy_gbs: float) -> list[dict]:
    """Each tile checked against torch, then timed alone from cold L2."""
    import torch

    from conjugate.evaluate.timing import l2_flush_bytes, time_per_call

    device = torch.device("cuda")
    inputs = operands(shape)
    rows = []
    for tile in tiles:
        row = asdict(tile) | {"plan_keys": tile.plan_keys(), "programs": tile.programs(shape)}
        try:
            launch, out = build(shape, tile, inputs, kernels)
            launch()
            torch.cuda.synchronize()
        except Exception as error:  # out of shared memory and the like: recorded, the sweep goes on
            rows.append(row | {"error": f"{type(error).__name__}: {' '.join(str(error).split())[:200]}"})
            continue
        rel_err = float((out.float() - inputs["ref"]).norm() / inputs["ref"].norm())
        if rel_err > 1e-2:
            rows.append(row | {"error": f"wrong: relative error {rel_err:.3g}"})
            continue
        us = time_per_call(launch, device, CALLS, flush_bytes=l2_flush_bytes(device))
        if us <= 0.0:  # a launch shorter than the noise of the L2 flush timed beside it
            rows.append(row | {"error": "too short to time beside the L2 flush"})
            continue
        rows.append(row | {"us": us, "share_of_copy": shape.bytes / (us * 1e-6) / (copy_gbs * 1e9)})
    return rows


def time_cublas(shape: Shape, copy_gbs: float) -> dict:
    """The shape's weights as one cuBLAS product (gate and up stacked), checked, then timed as time_tiles
    times a tile: what the library reaches on the same bytes, without the epilogue."""
    import torch

    from conjugate.evaluate.timing import l2_flush_bytes, time_per_call

    device = torch.device("cuda")
    inputs = operands(shape)
    x, w = inputs["x"], torch.cat(inputs["ws"][:shape.weights])  # [rows, K], [weights * N, K]
    out = torch.empty(shape.rows, w.shape[0], dtype=x.dtype, device=device)

    def product() -> None:
        torch.mm(x, w.T, out=out)

    product()
    ref = x.float() @ w.float().T
    rel_err = float((out.float() - ref).norm() / ref.norm())
    if rel_err > 1e-2:
        return {"error": f"wrong: relative error {rel_err:.3g}"}
    us = time_per_call(product, device, CALLS, flush_bytes=l2_flush_bytes(device))
    return {"us": us, "share_of_copy": shape.bytes / (us * 1e-6) / (copy_gbs * 1e9)} if us > 0 else \
        {"error": "too short to time beside the L2 flush"}


@triton.jit
def stream_read(src_ptr, sums_ptr, n, BLOCK: tl.constexpr):
    """Program p adds up the BLOCK-element chunks p, p + P, p + 2P, ... of src (P programs) into
    sums[p]: every element read once, in wide loads, the way a weight stream reads its tiles."""
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(pid * BLOCK, n, tl.num_programs(0) * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(src_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(sums_ptr + pid, tl.sum(acc, axis=0))


READ_ROWS = 1024  # the row sums' rows: a read buffer holds a multiple of this many elements


def readers(src, sms: int) -> dict:
    """The launches `time_read` times, by name, each reading all of the 1-D `src` (READ_ROWS rows) once:
    torch's row sums and stream_read at each of READERS. -> {name: (launch, its sums' total)}."""
    import torch

    rows = READ_ROWS
    if src.numel() + sms * max(b * p for b, p in READERS) >= 1 << 31:  # stream_read's offsets are int32
        raise ValueError(f"--read: {src.numel()} elements is past stream_read's int32 offsets")
    as_rows = src.view(rows, -1)
    row_sums = torch.empty(rows, dtype=torch.float32, device=src.device)
    out = {"row_sums": (lambda: torch.sum(as_rows, dim=1, dtype=torch.float32, out=row_sums), row_sums.sum)}
    for block, per_sm in READERS:
        programs = max(1, min(sms * per_sm, triton.cdiv(src.numel(), block)))
        sums = torch.empty(programs, dtype=torch.float32, device=src.device)
        launch = (lambda b=block, g=programs, out_=sums: stream_read[(g,)](src, out_, src.numel(), BLOCK=b,
                                                                          num_warps=8))
        out[f"stream_read {block}x{per_sm}"] = (launch, sums.sum)
    return out


def time_read(nbytes: int, copy_gbs: float) -> dict:
    """A launch reading `nbytes` from cold L2, timed as time_tiles times a tile: the share of the
    copy rate a launch that reads as many bytes reaches alone, its start and ramp included, as the
    fastest of `readers` (each checked against the buffer's sum first). A copy would not do: below
    the L2's size its writes stay in the cache. What a kernel of the shape's size can reach at best."""
    import torch

    from conjugate.evaluate.timing import l2_flush_bytes, time_per_call

    device = torch.device("cuda")
    src = torch.empty(max(nbytes // (2 * READ_ROWS), 1) * READ_ROWS, dtype=torch.bfloat16, device=device).normal_()
    whole, scale = float(src.float().sum()), float(src.float().abs().sum())
    times, wrong = {}, {}
    for name, (launch, total) in readers(src, torch.cuda.get_device_properties(device).multi_processor_count).items():
        launch()
        if abs(float(total()) - whole) > 1e-4 * scale:  # a row of the result, not the end of the sweep
            wrong[name] = f"summed the buffer to {float(total())}, torch to {whole}"
            continue
        times[name] = time_per_call(launch, device, CALLS, flush_bytes=l2_flush_bytes(device))
    timed = {name: us for name, us in times.items() if us > 0}  # 0: nothing left once the flushes were taken off
    if not timed:
        return {"error": "too short to time beside the L2 flush", "readers_us": times, "wrong": wrong}
    best = min(timed, key=timed.get)  # the least of a few medians: a little low for the smallest buffers
    us = times[best]
    share = src.numel() * src.element_size() / (us * 1e-6) / (copy_gbs * 1e9)
    if share > READ_SHARE_MAX:  # a read is never faster than the copy rate: the flush's noise, not a time
        return {"error": f"too short to time beside the L2 flush ({us:.2f} us left of it)"}
    return {"us": us, "share_of_copy": share, "reader": best, "readers_us": times} | ({"wrong": wrong} if wrong else {})


def resumed(path: Path | None, gpu: str) -> dict | None:
    """The sweep a cut-short run left at `path` (--resume), or None where there is none yet; SystemExit
    with one line for a file that is not a sweep or was measured on another GPU model."""
    if path is None or not Path(path).exists():
        return None
    try:
        prior = json.loads(Path(path).read_text())
        shapes, where = prior["shapes"], prior["gpu"]
        done = {(e["shape"], e["model"]) for e in shapes}
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SystemExit(f"--resume {path}: not a kernel_sweep.py --json result ({type(error).__name__}: {error})")
    if where != gpu:
        raise SystemExit(f"--resume {path}: measured on {where}, not on this {gpu}: sweep into another file")
    return {"shapes": shapes, "done": done,
            "runs": prior.get("runs", []) + [{k: prior.get(k) for k in ("command", "code", "date")}]}


def main() -> None:
    parser = make_parser(__doc__)
    parser.add_argument("workloads", nargs="*", type=Path)
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--models", nargs="+", choices=("draft", "target"), default=["draft", "target"])
    parser.add_argument("--batches", nargs="+", type=positive, metavar="B",
                        help="also sweep each workload at these batch sizes (draft and target alike)")
    parser.add_argument("--ks", nargs="+", type=positive, metavar="K", help="... and these k")
    parser.add_argument("--contexts", nargs="+", type=positive, metavar="C", help="... and these contexts")
    parser.add_argument("--per-shape", type=positive, default=96, help="candidates per shape besides the shipped tile")
    parser.add_argument("--prewarm", type=positive, default=0, metavar="N",
                        help="compile the candidates in N processes first")
    parser.add_argument("--tiles-from", nargs="+", type=Path, metavar="SWEEP.json",
                        help="time only the shipped and best tiles these sweeps found for each shape")
    parser.add_argument("--cublas", action="store_true",
                        help="each GEMM shape also as one cuBLAS product (torch.mm, the same bytes, no epilogue)")
    parser.add_argument("--read", action="store_true",
                        help="each shape also as a launch reading its bytes: the share of the copy rate its size allows")
    parser.add_argument("--resume", action="store_true",
                        help="keep the shapes --json already holds (a run cut short, same GPU model) and sweep the rest")
    parser.add_argument("--tma", action="store_true",
                        help="each GEMM tile also with its weight tiles loaded through TMA (tile key TMA 1)")
    parser.add_argument("--tabulate", nargs="+", type=Path, metavar="SWEEP.json",
                        help="measure nothing: write these sweeps' winning tiles into --table for --device")
    parser.add_argument("--device", help="with --tabulate: the GPU model's word, e.g. H200")
    parser.add_argument("--table", type=Path, default=None, help="with --tabulate (default: search/tiles.json)")
    parser.add_argument("--fit", type=Path, metavar="SWEEP.json",
                        help="measure nothing: per GEMM kind, its best times as a fixed time per launch "
                             "plus a streaming rate")
    parser.add_argument("--transfer", nargs="+", type=Path, metavar="SWEEP.json",
                        help="measure nothing: these sweeps' best tiles as the --onto sweeps (another GPU) timed them")
    parser.add_argument("--onto", nargs="+", type=Path, metavar="SWEEP.json", help="with --transfer")
    parser.add_argument("--compile-only", type=Path, help=argparse.SUPPRESS)  # a --prewarm process
    args = parser.parse_args()
    if args.compile_only:
        return compile_only(args.compile_only)
    if args.fit:
        fits = launch_fit(args.fit)
        print(f"{'kind':8} {'shapes':>6} {'fixed us':>9} {'rate':>6} {'worst residual us':>18}")
        for kind, f in fits.items():
            print(f"{kind:8} {f['shapes']:6d} {f['fixed_us']:9.1f} {f['rate_of_copy']:6.0%} "
                  f"{f['worst_residual_us']:18.1f}")
        return
    if args.transfer:
        if not args.onto:
            parser.error("--transfer needs --onto (the other GPU's sweeps)")
        print_transfer(transfer(args.transfer, args.onto))
        return
    if args.tabulate:
        from conjugate.paths import TILES_FILE

        if not args.device:
            parser.error("--tabulate needs --device (the word of the GPU's name the table is for)")
        table = tabulate(args.tabulate, args.device, args.table or TILES_FILE)
        print(f"{len(table['tiles'])} tiles for {args.device} in {args.table or TILES_FILE}")
        return
    if not args.workloads:
        parser.error("name at least one workload file")
    if args.resume and args.json is None:
        parser.error("--resume keeps the shapes of the --json file: give it")
    import torch

    from conjugate.errors import ConjugateError
    from conjugate.evaluate.timing import copy_bandwidth_gbs, matmul_tflops

    device = torch.device("cuda")
    try:
        entries = distinct_shapes(args.workloads, tuple(args.models), tuple(args.kinds),
                                  ServingSizes(tuple(args.batches or ()), tuple(args.ks or ()), tuple(args.contexts or ())))
    except ConjugateError as error:
        parser.error(str(error))
    require_gpu(parser, "timing tiles needs a GPU (--tabulate and --fit need none)")  # after the workloads' errors
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    tiles = {e["shape"]: candidates(e["shape"], e["shipped"], sms, args.per_shape) for e in entries}
    if args.tiles_from:
        tiles = {e["shape"]: found_tiles(args.tiles_from, e["shape"], e["shipped"]) for e in entries}
    if args.tma:
        tiles = {shape: with_tma(shape, found) for shape, found in tiles.items()}
    prior = resumed(args.json, torch.cuda.get_device_name(device)) if args.resume else None
    if prior is not None:  # the shapes swept already stay as they were measured
        entries = [e for e in entries if (e["shape"].key(), e["model"]) not in prior["done"]]
    copy_gbs = copy_bandwidth_gbs(device)
    # the dense bf16 rate (cuBLAS, 8192 cubed): past the ridge a GEMM's floor is its FLOPs, not its bytes
    out = {**environment("kernel_sweep"), "copy_gbs": copy_gbs, "matmul_tflops": matmul_tflops(device), "shapes": []}
    if prior is not None:
        out |= {"shapes": prior["shapes"], "runs": prior["runs"]}
        print(f"resuming: {len(prior['done'])} shapes kept, {len(entries)} to sweep", flush=True)
    with tempfile.TemporaryDirectory(prefix="kernel-sweep-") as kernels:
        if args.prewarm:
            out["prewarm_s"] = prewarm(entries, tiles, args.prewarm, Path(kernels))
        for e in entries:
            shape = e["shape"]
            rows = time_tiles(shape, tiles[shape], Path(kernels), copy_gbs)
            timed = [r for r in rows if "us" in r]
            result = {"shape": shape.key(), "kind": shape.kind, "fields": shape.fields(), "model": e["model"],
                      "workloads": e["workloads"], "bytes": shape.bytes, "shipped": rows[0],
                      "best": min(timed, key=lambda r: r["us"]) if timed else None, "tried": rows}
            if args.cublas and isinstance(shape, Shape) and shape.kind != "mlp":
                result["cublas"] = time_cublas(shape, copy_gbs)
            if args.read:
                result["read"] = time_read(shape.bytes, copy_gbs)
            out["shapes"].append(result)
            print(json.dumps({k: result[k] for k in ("shape", "model", "shipped", "best")}), flush=True)
            write_json(args.json, out)
    separate_times(out["shapes"])
    write_json(args.json, out)
    print_table(out["shapes"])


def separate_times(shapes: list[dict]) -> None:
    """Each fused MLP shape's `separate`: what its gate_up and down, swept in the same run for the same
    model, took as two launches (shipped and best tiles, summed); absent where either was not swept."""
    timed = {(s["kind"], s["model"], s["shape"].split()[1]): s for s in shapes}
    for s in shapes:
        if s["kind"] != "mlp":
            continue
        rows, f, h = s["shape"].split()[1].split("x")
        parts = [timed.get(("gate_up", s["model"], f"{rows}x{f}x{h}")),
                 timed.get(("down", s["model"], f"{rows}x{h}x{f}"))]
        if all(p and p["best"] and "us" in p["shipped"] for p in parts):
            s["separate"] = {"shipped_us": sum(p["shipped"]["us"] for p in parts),
                             "best_us": sum(p["best"]["us"] for p in parts)}


def print_transfer(rows: list[dict]) -> None:
    """--transfer's table, and the geometric means a fact quotes."""
    print(f"{'shape':28} {'model':6} {'shipped us':>10} {'best us':>8} {'transferred us':>14}  tile")
    for r in rows:
        tile = " ".join(f"{k}={v}" for k, v in r["tile"].items())
        print(f"{r['shape']:28} {r['model']:6} {r['shipped_us']:10.1f} {r['best_us']:8.1f} {r['us']:14.1f}  {tile}")
    if rows:
        gain = statistics.geometric_mean([r["shipped_us"] / r["us"] for r in rows])
        short = statistics.geometric_mean([r["us"] / r["best_us"] for r in rows])
        print(f"{len(rows)} shapes: transferred tiles {gain:.3f}x the shipped tile's speed, {short:.3f}x the best tile's time")


def print_table(shapes: list[dict]) -> None:
    print(f"{'shape':40} {'model':6} {'MB':>6} {'shipped us':>10} {'share':>6} {'best us':>8} {'share':>6}  best tile")
    for s in shapes:
        shipped, best = s["shipped"], s["best"] or {}
        tile = " ".join(f"{k}={v}" for k, v in best.get("plan_keys", {}).items())
        if "separate" in s:
            tile += f"  (separate: {s['separate']['shipped_us']:.1f} shipped, {s['separate']['best_us']:.1f} best)"
        print(f"{s['shape']:40} {s['model']:6} {s['bytes'] / 1e6:6.1f} {shipped.get('us', float('nan')):10.1f} "
              f"{shipped.get('share_of_copy', float('nan')):6.0%} {best.get('us', float('nan')):8.1f} "
              f"{best.get('share_of_copy', float('nan')):6.0%}  {tile}")


if __name__ == "__main__":
    main()
