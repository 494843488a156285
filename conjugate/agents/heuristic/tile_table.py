"""GEMM tiles measured fastest on a GPU model, per decode shape, for the heuristic proposer.

search/tiles.json holds a table per GPU model (written by `benchmarks/kernel_sweep.py --tabulate`),
used when the evaluating GPU's name holds the table's `device` as whole words (as search/facts.toml).
A shape is a GEMM's (rows, N, K) or an attention's (batch, tokens, heads, KV heads, head dim,
context) as one launch of the `streams` plan runs it; a tile is the plan's tile keys with the
launch's `num_warps` and `num_stages`, timed alone from cold L2 against the tile the shipped plan
gives it. A table lists only tiles that beat the shipped one. A GEMM shape a table lacks takes the
tile of the nearest row count measured for the same N and K (within NEAREST_ROWS, 3/2), said so wherever
it is shown: a verify pass of 96 rows starts from the tile measured at 128. Where a GPU model's own
table lacks a shape, the table of a model of the same chip (SAME_CHIP) may give it (`tiles_for`), said
so too. A file that does not parse, or an entry with a missing or wrong field, is an error naming the
file and the field.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from conjugate.errors import ConjugateError
from conjugate.files import check_table, read_json, shown
from conjugate.models.spec import ModelSpec
from conjugate.paths import TILES_FILE
from conjugate.plan.tiles import tile_keys
from conjugate.roles import Model

SHAPE_FIELDS = {kind: ("rows", "n", "k") for kind in ("qkv", "o_proj", "gate_up", "down")} | {
    "attn": ("batch", "tokens", "heads", "kv_heads", "head_dim", "context")}  # the kinds a table may list
TILE_KEYS = {kind: ("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K", "num_warps", "num_stages") for kind in SHAPE_FIELDS} | {
    "attn": ("BLOCK_N", "SPLIT_KV", "num_warps", "num_stages")}


NEAREST_ROWS = (3, 2)  # a GEMM shape not in a table takes the tile of its nearest row count within 3/2 either way
# GPU models of one chip (the same SMs, shared memory and L2) whose tiles serve each other where a model's own
# table lacks a shape: the H100's best tiles ran on the H200 within 2% of its best, the H200's on the H100
# within 1% (fact tiles_transfer: benchmarks/kernel_sweep.py --transfer)
SAME_CHIP = (("H100", "H200"),)


@dataclass(frozen=True)
class MeasuredTile:
    kind: str
    shape: tuple[int, ...]  # SHAPE_FIELDS[kind], in order
    tile: dict[str, int]  # TILE_KEYS[kind] -> value
    us: float  # the tile alone, cold L2
    shipped_us: float  # the shipped plan's tile for the shape, in the same run
    asked_rows: int | None = None  # looked up for this row count, not measured at it (TileTable.tile_near)

    @property
    def gain(self) -> float:
        """How much faster than the shipped tile: 0.25 is 25% less time."""
        return 1.0 - self.us / self.shipped_us

    def describe(self) -> str:
        """"qkv (rows=40 n=6144 k=4096) alone 24.0 us with BLOCK_M=64 ..., 36.9 us with the shipped tile"."""
        shape = " ".join(f"{f}={v}" for f, v in zip(SHAPE_FIELDS[self.kind], self.shape))
        tile = " ".join(f"{k}={v}" for k, v in self.tile.items())
        near = f" (the nearest measured shape to rows={self.asked_rows})" if self.asked_rows is not None else ""
        return (f"{self.kind} ({shape}) alone {self.us:.1f} us with {tile}, "
                f"{self.shipped_us:.1f} us with the shipped tile{near}")


@dataclass(frozen=True)
class TileTable:
    device: str  # a part of the device name, e.g. "H200"
    date: str
    source: str  # where the measurements are
    tiles: tuple[MeasuredTile, ...]

    def tile_for(self, kind: str, shape: tuple[int, ...]) -> MeasuredTile | None:
        return next((t for t in self.tiles if (t.kind, t.shape) == (kind, tuple(shape))), None)

    def tile_near(self, kind: str, shape: tuple[int, ...]) -> MeasuredTile | None:
        """The tile measured for this shape; for a GEMM shape the table lacks, the one measured at the
        nearest row count (same N and K, within NEAREST_ROWS either way; the smaller count on a tie),
        marked with the rows it was asked for. Attention shapes: exact only."""
        exact = self.tile_for(kind, shape)
        if exact is not None or kind == "attn":
            return exact
        rows, n, k = shape
        near = [t for t in self.tiles if t.kind == kind and t.shape[1:] == (n, k)
                and max(t.shape[0], rows) * NEAREST_ROWS[1] <= NEAREST_ROWS[0] * min(t.shape[0], rows)]
        if not near:
            return None
        best = min(near, key=lambda t: (max(t.shape[0], rows) / min(t.shape[0], rows), t.shape[0]))
        return replace(best, asked_rows=rows)


def load_tile_tables(path: Path = TILES_FILE) -> tuple[TileTable, ...]:
    data = read_json(Path(path), ConjugateError, "tile table file")
    if not isinstance(data, dict) or set(data) - {"about", "tables"} or not isinstance(data.get("tables"), list):
        raise ConjugateError(f"{path}: expected an object with a list 'tables' (and an optional 'about')")
    return tuple(table_from_json(t, f"{path}: tables[{i}]") for i, t in enumerate(data["tables"]))


def table_from_json(table, where: str) -> TileTable:
    """One table of the file (or one about to be written), checked; `where` names it in errors."""
    check_table(table, where, ("device", "date", "source", "tiles"), ("device", "date", "source"))
    tiles = table.get("tiles")
    if not isinstance(tiles, list):
        raise ConjugateError(f"{where}: field 'tiles' should be a list, got {shown(tiles)}")
    return TileTable(table["device"], table["date"], table["source"],
                     tuple(_entry(t, f"{where}.tiles[{i}]") for i, t in enumerate(tiles)))


def _entry(entry, where: str) -> MeasuredTile:
    if not isinstance(entry, dict):
        raise ConjugateError(f"{where}: should be an object, got {shown(entry)}")
    kind = entry.get("kind")
    if kind not in SHAPE_FIELDS:
        raise ConjugateError(f"{where}: field 'kind' should be one of {', '.join(SHAPE_FIELDS)}, got {shown(kind)}")
    fields = ("kind", *SHAPE_FIELDS[kind], "tile", "us", "shipped_us")
    if unknown := set(entry) - set(fields):
        raise ConjugateError(f"{where}: unknown field {sorted(unknown)[0]!r}")
    for key in SHAPE_FIELDS[kind]:
        if type(entry.get(key)) is not int or entry[key] < 1:
            raise ConjugateError(f"{where}: field {key!r} should be a positive integer, got {shown(entry.get(key))}")
    for key in ("us", "shipped_us"):
        if type(entry.get(key)) not in (int, float) or not 0 < entry[key] < float("inf"):
            raise ConjugateError(f"{where}: field {key!r} should be a positive number of microseconds, "
                                 f"got {shown(entry.get(key))}")
    tile, keys = entry.get("tile"), TILE_KEYS[kind]
    if not isinstance(tile, dict) or set(tile) != set(keys):
        raise ConjugateError(f"{where}: field 'tile' should hold exactly {', '.join(keys)}, got {shown(tile)}")
    bounds = tile_keys(kind)
    for key in keys:
        (low, high), value, power = bounds[key], tile[key], key != "num_stages"
        if type(value) is not int or not low <= value <= high or (power and value & (value - 1)):
            raise ConjugateError(f"{where}: field 'tile.{key}' should be {'a power of two' if power else 'an integer'} "
                                 f"in [{low}, {high}], got {shown(value)}")
    return MeasuredTile(kind, tuple(entry[f] for f in SHAPE_FIELDS[kind]), {k: tile[k] for k in keys},
                        float(entry["us"]), float(entry["shipped_us"]))


def table_for(device: str, tables: tuple[TileTable, ...]) -> TileTable | None:
    """The first table whose `device` the device name holds as whole words, else None."""
    from conjugate.evaluate.measured import names_device

    return next((t for t in tables if device and names_device(t.device, device)), None)


@dataclass(frozen=True)
class MeasuredTiles:
    """The tiles a proposer may start from on one GPU: its model's own table, then the tables of the
    other models of its chip (SAME_CHIP) for the shapes its own lacks (exact or at a near row count)."""
    own: TileTable | None
    siblings: tuple[TileTable, ...] = ()

    def found(self, workload: dict) -> list[tuple[Model, MeasuredTile, TileTable]]:
        """Per model and kind of the workload (Workload.to_dict()), the first table's tile for its
        shape, with the table it came from. KeyError, TypeError or ValueError for a workload without
        the models' shapes."""
        tables = [t for t in (self.own, *self.siblings) if t is not None]
        out = []
        for model in (Model.DRAFT, Model.TARGET):
            for kind, shape in measured_shapes(workload, model).items():
                for table in tables:
                    if (found := table.tile_near(kind, shape)) is not None:
                        out.append((model, found, table))
                        break
        return out

    def is_own(self, table: TileTable) -> bool:
        return table is self.own


def tiles_for(device: str, tables: tuple[TileTable, ...]) -> MeasuredTiles | None:
    """The device's own table and its chip's other tables (SAME_CHIP), or None where there are none."""
    from conjugate.evaluate.measured import names_device

    own = table_for(device, tables)
    chip = next((group for group in SAME_CHIP if device and any(names_device(word, device) for word in group)), ())
    siblings = tuple(t for t in tables if t is not own and t.device in chip and not names_device(t.device, device))
    return MeasuredTiles(own, siblings) if own is not None or siblings else None


def measured_shapes(workload: dict, model: Model) -> dict[str, tuple[int, ...]]:
    """Kind -> the shape a tile table lists it by (SHAPE_FIELDS), for one model of a
    workload (Workload.to_dict()): GEMM rows per decode step or verify pass, attention at the
    workload's context."""
    spec = ModelSpec.from_dict(workload[model.value])
    draft = model is Model.DRAFT
    batch = workload["draft_batch"] if draft else workload["target_batch"]
    tokens = 1 if draft else workload["k"] + 1
    shapes = {kind: (batch * tokens, *spec.projection(kind)) for kind in SHAPE_FIELDS if kind != "attn"}
    return shapes | {"attn": (batch, tokens, spec.num_heads, spec.num_kv_heads, spec.head_dim, workload["context"])}
