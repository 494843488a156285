"""Measured GEMM tiles (search/tiles.json): the file's checks, the heuristic's edits from them, and
benchmarks/kernel_sweep.py --tabulate, which writes them."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conjugate.agents.base import NodeContext
from conjugate.agents.heuristic import HeuristicProposer
from conjugate.agents.heuristic.tile_table import MeasuredTiles, TileTable, load_tile_tables, table_for, tiles_for
from conjugate.errors import ConjugateError
from conjugate.paths import EXAMPLES_DIR, shipped_plan
from conjugate.plan import load_plan, patch_plan
from conjugate.workload import load_workload

from scripts import run_script  # tests/scripts.py
from test_round import ROOT

B8 = load_workload(EXAMPLES_DIR / "llama-1b-8b-b8.toml")
QKV_TILE = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 128, "SPLIT_K": 4, "num_warps": 8, "num_stages": 4}
ATTN_ENTRY = {"kind": "attn", "batch": 8, "tokens": 1, "heads": 32, "kv_heads": 8, "head_dim": 64, "context": 1024,
              "tile": {"BLOCK_N": 32, "SPLIT_KV": 16, "num_warps": 2, "num_stages": 2}, "us": 9.0, "shipped_us": 14.6}


def _entry(**changes) -> dict:
    return {"kind": "qkv", "rows": 40, "n": 6144, "k": 4096, "tile": dict(QKV_TILE), "us": 24.0,
            "shipped_us": 36.9} | changes


def _file(tmp_path, tables: list) -> Path:
    path = tmp_path / "tiles.json"
    path.write_text(json.dumps({"about": "test", "tables": tables}))
    return path


def _table(*entries) -> dict:
    return {"device": "H200", "date": "2026-12-01", "source": "kernel_sweep_h200.json", "tiles": list(entries)}


def test_the_shipped_file_parses_and_a_table_matches_whole_words_of_the_device_name(tmp_path):
    assert isinstance(load_tile_tables(), tuple)  # search/tiles.json, as shipped
    tables = load_tile_tables(_file(tmp_path, [_table(_entry())]))
    assert table_for("NVIDIA H200", tables).tile_for("qkv", (40, 6144, 4096)).tile == QKV_TILE
    assert table_for("NVIDIA H20", tables) is None and table_for("", tables) is None
    assert table_for("NVIDIA H200", tables).tile_for("qkv", (8, 6144, 4096)) is None
    assert table_for("NVIDIA H200", tables).tile_for("attn", (8, 1, 32, 8, 64, 1024)) is None


def test_a_gemm_shape_not_in_the_table_takes_the_nearest_measured_rows_and_says_so(tmp_path):
    table = table_for("NVIDIA H200", load_tile_tables(_file(tmp_path, [_table(
        _entry(rows=32, us=30.0), _entry(rows=128, tile=QKV_TILE | {"BLOCK_M": 128}, us=40.0),
        _entry(kind="o_proj", rows=96, n=4096), ATTN_ENTRY)])))
    near = table.tile_near("qkv", (96, 6144, 4096))  # 128 is 1.33x away, 32 is 3x
    assert near.shape == (128, 6144, 4096) and near.tile["BLOCK_M"] == 128 and near.asked_rows == 96
    assert "nearest measured shape to rows=96" in near.describe()
    assert table.tile_near("qkv", (40, 6144, 4096)).shape == (32, 6144, 4096)  # 1.25x: the nearer one
    assert table.tile_near("qkv", (128, 6144, 4096)).asked_rows is None  # measured: no mark
    assert table.tile_near("qkv", (64, 6144, 4096)) is None  # 2x from either
    assert table.tile_near("qkv", (96, 4096, 4096)) is None  # other N: never
    assert table.tile_near("attn", (8, 1, 32, 8, 64, 2048)) is None  # attention: exact shapes only
    assert table.tile_near("attn", (8, 1, 32, 8, 64, 1024)) is not None


@pytest.mark.parametrize("tables, field", [
    ([_table(_entry(kind="norm"))], "tables[0].tiles[0]: field 'kind'"),
    ([_table(_entry(kind="attn"))], "tables[0].tiles[0]: unknown field 'k'"),
    ([_table(ATTN_ENTRY | {"tile": QKV_TILE})],
     "tables[0].tiles[0]: field 'tile' should hold exactly BLOCK_N, SPLIT_KV"),
    ([_table({k: v for k, v in ATTN_ENTRY.items() if k != "context"})], "tables[0].tiles[0]: field 'context'"),
    ([_table(_entry(rows=0))], "tables[0].tiles[0]: field 'rows'"),
    ([_table(_entry(us=float("nan")))], "tables[0].tiles[0]: field 'us'"),
    ([_table(_entry(shipped_us="36.9"))], "tables[0].tiles[0]: field 'shipped_us'"),
    ([_table(_entry(tile=QKV_TILE | {"BLOCK_N": 96}))],
     "tables[0].tiles[0]: field 'tile.BLOCK_N' should be a power of two"),
    ([_table(_entry(tile=QKV_TILE | {"num_stages": 9}))], "tables[0].tiles[0]: field 'tile.num_stages'"),
    ([_table(_entry(tile={"BLOCK_N": 64}))], "tables[0].tiles[0]: field 'tile' should hold exactly"),
    ([_table(_entry(extra=1))], "tables[0].tiles[0]: unknown field 'extra'"),
    ([_table(_entry()) | {"device": ""}], "tables[0]: field 'device'"),
    ([_table(_entry()) | {"tiles": {}}], "tables[0]: field 'tiles' should be a list"),
    (["H200"], "tables[0]: should be a table"),
])
def test_a_bad_table_is_an_error_naming_the_file_and_the_field(tmp_path, tables, field):
    path = _file(tmp_path, tables)
    with pytest.raises(ConjugateError) as error:
        load_tile_tables(path)
    assert str(error.value).startswith(f"{path}: {field}")


def test_a_file_that_is_not_a_table_file_is_an_error_naming_it(tmp_path):
    for text in ("{", "[]", '{"tables": [], "more": 1}'):
        path = tmp_path / "tiles.json"
        path.write_text(text)
        with pytest.raises(ConjugateError, match=str(path)):
            load_tile_tables(path)


def _context(plan, device: str = "NVIDIA H200") -> NodeContext:
    return NodeContext(plan=plan.to_dict(), plan_hash=plan.hash, workload=B8.to_dict(), evaluator="h200",
                       device=device, sms=132)


def test_the_heuristic_proposes_the_measured_tile_of_a_shape_first_and_not_once_the_plan_has_it(tmp_path):
    tables = load_tile_tables(_file(tmp_path, [_table(_entry())]))
    streams = load_plan(shipped_plan("streams"))
    first = HeuristicProposer(tile_tables=tables).propose(_context(streams), 3)[0]
    assert first.kind == "tiles" and "measured on this GPU" in first.rationale
    assert "target qkv (rows=40 n=6144 k=4096)" in first.rationale
    edited = patch_plan(streams, first.patch)
    assert edited["target"]["tiles"]["qkv"] == QKV_TILE
    assert edited["draft"]["tiles"] == streams["draft"]["tiles"]
    again = HeuristicProposer(tile_tables=tables).propose(_context(edited), 40)
    assert not any("measured on this GPU" in p.rationale for p in again)
    other_gpu = HeuristicProposer(tile_tables=tables).propose(_context(streams, "NVIDIA B300"), 40)
    assert not any("measured on this GPU" in p.rationale for p in other_gpu)


def test_the_heuristic_proposes_the_tile_of_the_nearest_measured_rows_for_an_unmeasured_shape(tmp_path):
    tables = load_tile_tables(_file(tmp_path, [_table(_entry(rows=48))]))  # the workload verifies 40 rows
    streams = load_plan(shipped_plan("streams"))
    first = HeuristicProposer(tile_tables=tables).propose(_context(streams), 3)[0]
    assert "target qkv (rows=48 n=6144 k=4096)" in first.rationale
    assert "nearest measured shape to rows=40" in first.rationale
    assert patch_plan(streams, first.patch)["target"]["tiles"]["qkv"] == QKV_TILE


def test_the_heuristic_proposes_a_measured_attention_tile_for_the_drafts_shape(tmp_path):
    tables = load_tile_tables(_file(tmp_path, [_table(ATTN_ENTRY)]))
    streams = load_plan(shipped_plan("streams"))
    first = HeuristicProposer(tile_tables=tables).propose(_context(streams), 3)[0]
    assert "draft attn (batch=8 tokens=1 heads=32 kv_heads=8 head_dim=64 context=1024)" in first.rationale
    assert patch_plan(streams, first.patch)["draft"]["tiles"]["attn"] == ATTN_ENTRY["tile"]


def _sweep(tmp_path, gpu: str = "NVIDIA H200") -> Path:
    def shape(kind, rows, n, k, shipped_us, best_us):
        return {"kind": kind, "fields": {"rows": rows, "n": n, "k": k}, "shipped": {"us": shipped_us},
                "best": {"plan_keys": QKV_TILE, "us": best_us}}
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"gpu": gpu, "date": "2026-12-02", "shapes": [
        shape("qkv", 40, 6144, 4096, 36.9, 24.0), shape("down", 40, 4096, 14336, 38.6, 38.0),
        shape("mlp", 40, 14336, 4096, 99.0, 80.0),  # the fused MLP: never a table's
        shape("o_proj", 384, 128, 128, 6.4, 0.1) | {"read": {"error": "too short to time beside the L2 flush"}},
        shape("o_proj", 40, 4096, 4096, 14.0, 12.0) | {"read": {"us": 11.0}}]}))
    return path


def _tabulate(*args, program: bool = False) -> subprocess.CompletedProcess:
    """kernel_sweep.py --tabulate, in this process (tests/scripts.py), or as a program."""
    if not program:
        return run_script("kernel_sweep", "--tabulate", *args)
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernel_sweep.py"), "--tabulate", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_tabulate_writes_the_tiles_that_beat_the_shipped_one_into_the_gpu_models_table(tmp_path):
    table = _file(tmp_path, [_table(_entry(rows=8)), _table(_entry()) | {"device": "B300"}])
    done = _tabulate(_sweep(tmp_path), "--device", "H200", "--table", table, program=True)
    assert done.returncode == 0, done.stderr
    tables = load_tile_tables(table)
    assert [t.device for t in tables] == ["B300", "H200"]  # the earlier H200 table replaced, the other kept
    h200 = table_for("NVIDIA H200", tables)
    # down gained 1.6%: under MIN_GAIN; no mlp; no shape too small to time (its read launch was not timed)
    assert [(t.kind, t.shape, t.us, t.shipped_us) for t in h200.tiles] == [
        ("o_proj", (40, 4096, 4096), 12.0, 14.0), ("qkv", (40, 6144, 4096), 24.0, 36.9)]
    assert h200.tiles[1].tile == QKV_TILE and h200.date == "2026-12-02" and h200.source == "sweep.json"


def test_tabulate_refuses_a_sweep_of_another_gpu_and_a_damaged_table(tmp_path):
    table = _file(tmp_path, [])
    done = _tabulate(_sweep(tmp_path, "NVIDIA B300"), "--device", "H200", "--table", table)
    assert done.returncode == 1 and "was measured on NVIDIA B300" in done.stderr
    table.write_text('{"tables": [1]}')
    done = _tabulate(_sweep(tmp_path), "--device", "H200", "--table", table)
    assert done.returncode == 1 and f"{table}: tables[0]: should be a table" in done.stderr
    assert table.read_text() == '{"tables": [1]}'  # nothing lost
    assert _tabulate(_sweep(tmp_path), "--table", table).returncode == 2  # no --device


def test_the_llm_prompt_shows_the_tiles_measured_for_the_workloads_shapes(tmp_path):
    from dataclasses import replace

    from conjugate.agents.llm.prompt import Prompts

    prompts = Prompts(tiles_file=_file(tmp_path, [_table(_entry(), ATTN_ENTRY)]))
    streams = load_plan(shipped_plan("streams"))
    text = prompts.expand_text(_context(streams), 3)
    assert "## Tiles measured fastest alone for this workload's shapes on this GPU model" in text
    assert ("- target qkv (rows=40 n=6144 k=4096) alone 24.0 us with BLOCK_M=64 BLOCK_N=128 BLOCK_K=128 SPLIT_K=4 "
            "num_warps=8 num_stages=4, 36.9 us with the shipped tile") in text
    assert "- draft attn (batch=8 tokens=1 heads=32 kv_heads=8 head_dim=64 context=1024)" in text
    assert "none recorded for NVIDIA B300" in prompts.expand_text(_context(streams, "NVIDIA B300"), 3)
    unknown = replace(_context(streams), workload={"name": "b8"})
    assert "none: this workload's shapes are not known here" in prompts.expand_text(unknown, 3)


def test_a_damaged_tile_file_stops_the_heuristic_before_a_search_starts_and_random_draws_measured_tiles(tmp_path):
    from conjugate.agents.search_baselines import RandomProposer

    bad = _file(tmp_path, [_table(_entry(us=-1))])
    with pytest.raises(ConjugateError, match=f"{bad}: tables\\[0\\].tiles\\[0\\]: field 'us'"):
        HeuristicProposer(tiles_file=bad)
    tables = load_tile_tables(_file(tmp_path, [_table(_entry())]))
    streams = load_plan(shipped_plan("streams"))
    drawn = RandomProposer(tile_tables=tables).propose(_context(streams), 400)
    assert any("measured on this GPU" in p.rationale for p in drawn)  # every edit the heuristic knows


def test_tabulate_names_a_file_that_is_not_a_sweep(tmp_path):
    table = _file(tmp_path, [])
    for text in ("{", '{"gpu": "NVIDIA H200"}', '{"gpu": "NVIDIA H200", "date": "x", "shapes": [{"kind": "qkv"}]}'):
        sweep = tmp_path / "sweep.json"
        sweep.write_text(text)
        done = _tabulate(sweep, "--device", "H200", "--table", table)
        assert done.returncode == 1 and f"--tabulate {sweep}: not a sweep this script wrote" in done.stderr
    assert load_tile_tables(table) == ()  # nothing written


def test_no_measured_qkv_tile_for_a_model_that_fuses_rope_into_its_qkv(tmp_path):
    tables = load_tile_tables(_file(tmp_path, [_table(_entry())]))
    streams = load_plan(shipped_plan("streams"))
    fused = patch_plan(streams, [{"op": "add", "path": "/target/fusions/-", "value": "qkv+rope_kv"}])
    proposals = HeuristicProposer(tile_tables=tables).propose(_context(fused), 40)
    assert not any("measured on this GPU" in p.rationale for p in proposals)
    draft_fused = patch_plan(streams, [{"op": "add", "path": "/draft/fusions/-", "value": "qkv+rope_kv"}])
    first = HeuristicProposer(tile_tables=tables).propose(_context(draft_fused), 3)[0]
    assert "measured on this GPU" in first.rationale and "target qkv" in first.rationale


def test_with_a_ledger_a_measured_tile_is_scored_by_what_it_saves_of_the_round(tmp_path):
    from conjugate.agents.heuristic.tiles import measured_tile_edits
    from conjugate.evaluate.result import KindLoss, LedgerSummary

    table = MeasuredTiles(load_tile_tables(_file(tmp_path, [_table(_entry())]))[0])
    streams = load_plan(shipped_plan("streams"))

    def ledger(*kinds):
        return LedgerSummary(round_ms=10.0, floor_ms=6.0, idle_ms=0.1, modeled=False,
                             streams={"draft": 8.0, "target": 7.0}, kinds=kinds)

    alone = measured_tile_edits(streams, B8.to_dict(), table)
    assert [round(c.score, 3) for c in alone] == [0.9]  # 0.6 + the gain alone (35%, at most 0.3)
    qkv = KindLoss("target qkv", launches=32, ms=0.6, floor_ms=0.4, bandwidth_fraction=0.6)
    weighed = measured_tile_edits(streams, B8.to_dict(), table, ledger(qkv))
    gain = 1 - 24.0 / 36.9
    assert [round(c.score, 4) for c in weighed] == [round(0.45 + 5 * 0.6 * gain / 10.0, 4)]
    assert "(the ledger: about 2.1% of the round)" in weighed[0].rationale
    unlisted = measured_tile_edits(streams, B8.to_dict(), table,
                                   ledger(KindLoss("draft attn", launches=64, ms=1.1, floor_ms=0.3,
                                                   bandwidth_fraction=0.2)))
    assert [c.score for c in unlisted] == [c.score for c in alone]


def test_a_shape_the_gpus_own_table_lacks_takes_the_tile_a_gpu_of_its_chip_measured_and_says_so(tmp_path):
    from conjugate.agents.facts import figure
    from conjugate.agents.heuristic.tiles import measured_tile_edits

    h100 = _table(_entry(us=30.0), _entry(kind="o_proj", rows=40, n=4096, tile=QKV_TILE | {"BLOCK_N": 64})) | {
        "device": "H100"}
    h200 = _table(_entry(kind="o_proj", rows=40, n=4096))  # the H200's own: o_proj only
    tables = load_tile_tables(_file(tmp_path, [h200, h100, _table(_entry()) | {"device": "A100"}]))
    on_h200 = tiles_for("NVIDIA H200", tables)
    assert on_h200.own.device == "H200" and [t.device for t in on_h200.siblings] == ["H100"]  # not the A100's
    assert [t.device for t in tiles_for("NVIDIA H100 80GB HBM3", tables).siblings] == ["H200"]
    assert tiles_for("NVIDIA A10", tables) is None
    found = {(m.value, t.kind): table.device for m, t, table in on_h200.found(B8.to_dict())}
    assert found == {("target", "qkv"): "H100", ("target", "o_proj"): "H200"}  # its own first, where it has one
    streams = load_plan(shipped_plan("streams"))
    edits = {c.patch[0]["path"]: c for c in measured_tile_edits(streams, B8.to_dict(), on_h200)}
    qkv, o_proj = edits["/target/tiles/qkv"], edits["/target/tiles/o_proj"]
    assert "measured on the H100, a GPU of this chip" in qkv.rationale and "measured on this GPU" in o_proj.rationale
    assert qkv.score == pytest.approx(0.6 + 1 - 30.0 / 36.9 * figure("tiles_transfer"))  # its gain there,
    assert qkv.score < 0.6 + 1 - 30.0 / 36.9  # less what tiles lose in transfer
    alone = tiles_for("NVIDIA H200", load_tile_tables(_file(tmp_path, [h100])))  # no table of its own
    assert alone.own is None and {t.kind for _, t, _ in alone.found(B8.to_dict())} == {"qkv", "o_proj"}


def test_the_llm_prompt_marks_the_tiles_a_gpu_of_the_chip_measured(tmp_path):
    from conjugate.agents.llm.prompt import Prompts

    prompts = Prompts(tiles_file=_file(tmp_path, [_table(_entry()) | {"device": "H100"}]))
    text = prompts.expand_text(_context(load_plan(shipped_plan("streams"))), 3)  # on an H200
    assert ("H100, 2026-12-01 (kernel_sweep_h200.json), a GPU of this chip: its tiles for the shapes this GPU's "
            "table lacks:") in text
    assert "- target qkv (rows=40 n=6144 k=4096) alone 24.0 us" in text and "shipped tile [H100]" in text
