"""benchmarks/kernel_sweep.py's parts that need no GPU: the shapes it takes from workloads, the tile
the shipped plan gives each, the candidates it times, and its launches (under the interpreter)."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from conjugate.paths import EXAMPLES_DIR
from scripts import load_script, run_script  # tests/scripts.py

sweep = load_script("kernel_sweep")
H200_SMS = 132


def test_each_distinct_shape_once_with_its_workloads_and_the_shipped_tile():
    b8 = EXAMPLES_DIR / "llama-1b-8b-b8.toml"
    entries = sweep.distinct_shapes([b8, b8], ("draft", "target"), sweep.KINDS)
    assert len(entries) == 12 and all(e["workloads"] == ["llama-1b-8b-b8"] * 2 for e in entries)
    shapes = {(e["model"], e["shape"].kind): e for e in entries}
    gate_up = shapes[("target", "gate_up")]["shape"]
    assert (gate_up.rows, gate_up.n, gate_up.k, gate_up.epilogue, gate_up.weights) == (40, 14336, 4096, "silu_mul", 2)
    assert gate_up.bytes == 2 * 14336 * 4096 * 2
    down = shapes[("draft", "down")]
    assert (down["shape"].rows, down["shape"].n, down["shape"].k, down["shape"].epilogue) == (8, 2048, 8192, "residual")
    assert down["shipped"] == sweep.Tile(16, 64, 64, 8, 4, 3)  # plans/streams.json: its tile, the launch's settings
    verify = shapes[("target", "attn")]
    assert verify["shape"] == sweep.AttnShape(8, 5, 32, 8, 128, 1024)
    assert verify["shipped"] == sweep.AttnTile(64, 4, 4, 3)
    assert verify["shape"].rows == 32 and verify["shape"].bytes == 2 * 8 * 8 * 1029 * 128 * 2
    assert shapes[("draft", "attn")]["shape"] == sweep.AttnShape(8, 1, 32, 8, 64, 1024)
    mlp = shapes[("draft", "mlp")]  # the fused MLP at the gate_up shape, three weights streamed
    assert (mlp["shape"].rows, mlp["shape"].n, mlp["shape"].k) == (8, 8192, 2048)
    assert mlp["shape"].bytes == 3 * 8192 * 2048 * 2
    assert mlp["shipped"] == replace(shapes[("draft", "gate_up")]["shipped"], split_k=1)


def test_serving_sizes_add_each_distinct_shape_once_and_name_the_sizes_it_comes_from():
    b8 = EXAMPLES_DIR / "llama-1b-8b-b8.toml"
    serving = sweep.ServingSizes(batches=(16, 32), ks=(1, 3), contexts=(512, ))
    entries = sweep.distinct_shapes([b8], ("draft", "target"), ("gate_up", "attn"), serving)
    rows = {(e["model"], e["shape"].kind): set() for e in entries}
    for e in entries:
        rows[(e["model"], e["shape"].kind)].add(getattr(e["shape"], "rows"))
    assert rows[("target", "gate_up")] == {32, 64, 128}  # 16 x 2, 16 x 4 = 32 x 2, 32 x 4
    assert rows[("draft", "gate_up")] == {16, 32}
    shared = next(e for e in entries
                  if e["model"] == "target" and e["shape"].kind == "gate_up" and e["shape"].rows == 64)
    assert sorted(shared["workloads"]) == ["llama-1b-8b-b8 (B=16, k=3, context=512)",
                                           "llama-1b-8b-b8 (B=32, k=1, context=512)"]
    verify = {e["shape"] for e in entries if e["model"] == "target" and e["shape"].kind == "attn"}
    assert verify == {sweep.AttnShape(b, k + 1, 32, 8, 128, 512) for b in (16, 32) for k in (1, 3)}
    own = sweep.distinct_shapes([b8], ("target", ), ("gate_up", ), sweep.ServingSizes(ks=(4, )))
    assert own[0]["workloads"] == ["llama-1b-8b-b8"]  # its own sizes: its own name


def test_fused_mlp_candidates_never_split_k_and_are_told_against_the_separate_launches():
    shape = sweep.Shape(4, 3072, 1024, "mlp")
    tiles = sweep.candidates(shape, sweep.Tile(16, 32, 128, 1, 4, 3), H200_SMS, per_shape=40)
    assert len(tiles) > 20 and all(t.split_k == 1 for t in tiles)
    assert not sweep.fits(sweep.Tile(16, 32, 128, 2, 4, 3), shape, H200_SMS)

    def entry(kind, key, shipped, best):
        return {"kind": kind, "model": "draft", "shape": f"{kind} {key}", "shipped": {"us": shipped},
                "best": {"us": best}}
    shapes = [entry("gate_up", "4x3072x1024", 5.5, 4.6), entry("down", "4x1024x3072", 5.5, 4.4),
              entry("mlp", "4x3072x1024", 8.0, 6.0), entry("mlp", "8x4864x896", 9.0, 7.0)]
    sweep.separate_times(shapes)
    assert shapes[2]["separate"] == pytest.approx({"shipped_us": 11.0, "best_us": 9.0})
    assert "separate" not in shapes[3]  # its gate_up and down were not swept


def test_a_per_op_launch_setting_in_the_plan_wins_over_the_launch_default():
    plan = {"target": {"tiles": {"lm_head": {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 128, "SPLIT_K": 1,
                                             "num_stages": 2}}}, "cross": {"launch": {"num_warps": 4, "num_stages": 3}}}
    assert sweep.shipped_tile(plan, "target", "lm_head") == sweep.Tile(64, 128, 128, 1, 4, 2)


def test_the_candidates_are_the_shipped_tile_its_neighbours_then_a_sample_all_within_the_limits():
    shape = sweep.Shape(40, 4096, 4096, "o_proj")
    shipped = sweep.Tile(64, 64, 64, 4, 4, 3)
    tiles = sweep.candidates(shape, shipped, H200_SMS, per_shape=30)
    assert tiles[0] == shipped and len(tiles) == 31 and len(set(tiles)) == 31
    near = [t for t in sweep.neighbours(shipped) if sweep.fits(t, shape, H200_SMS)]
    assert tiles[1:1 + len(near)] == near and replace(shipped, split_k=8) in near
    for tile in tiles[1:]:
        assert sweep.fits(tile, shape, H200_SMS)
        assert H200_SMS // 2 <= tile.programs(shape) <= 16 * H200_SMS
        assert tile.shared_bytes(shape) <= sweep.SHARED_BYTES
        assert shape.k // (tile.split_k * tile.block_k) >= max(2, tile.stages - 1)
    assert tiles == sweep.candidates(shape, shipped, H200_SMS, per_shape=30)  # seeded: the same sample again
    assert tiles != sweep.candidates(shape, shipped, H200_SMS, per_shape=30, seed=1)


def test_past_128_rows_the_tall_compute_tiles_come_right_after_the_shipped_one():
    T = sweep.Tile
    down = sweep.Shape(512, 3072, 8192, "down")  # 4 row blocks of 128 by 24, 12 or 48 column blocks
    tall = sweep.compute_tiles(down, H200_SMS)
    assert tall == [T(128, 128, 64, 1, 8, 3), T(128, 128, 64, 2, 8, 3), T(128, 128, 64, 4, 8, 3),
                    T(128, 128, 64, 1, 8, 4), T(128, 128, 64, 2, 8, 4), T(128, 128, 64, 4, 8, 4),
                    T(128, 256, 64, 2, 8, 3), T(128, 256, 64, 4, 8, 3),  # unsplit: 48 programs, under half a wave
                    T(128, 64, 64, 1, 4, 4), T(128, 64, 64, 2, 4, 4), T(128, 64, 64, 4, 4, 4)]
    shipped = T(64, 64, 64, 2, 4, 3)
    assert sweep.candidates(down, shipped, H200_SMS, per_shape=len(tall))[1:] == tall
    # a shipped tile that is itself a compute tile comes once, first
    tiles = sweep.candidates(down, tall[0], H200_SMS, per_shape=30)
    assert tiles[0] == tall[0] and tiles.count(tall[0]) == 1 and tiles[1:len(tall)] == tall[1:]
    assert len(set(tiles)) == len(tiles)
    for rows in (129, 192):  # from the first row past 128
        assert sweep.compute_tiles(sweep.Shape(rows, 4096, 4096, "o_proj"), H200_SMS)
    gate_up = sweep.Shape(512, 13824, 5120, "gate_up")  # two accumulators: 128 x 256 would spill
    assert sweep.compute_tiles(gate_up, H200_SMS) and all(t.block_n <= 128 for t in sweep.compute_tiles(gate_up, H200_SMS))
    assert sweep.compute_tiles(sweep.Shape(128, 4096, 4096, "o_proj"), H200_SMS) == []  # 128 rows: the sample alone, as before
    assert sweep.compute_tiles(sweep.AttnShape(1, 5, 32, 8, 128, 512), H200_SMS) == []


def test_tiles_that_would_spill_or_starve_the_gpu_are_not_candidates():
    gate_up = sweep.Shape(40, 14336, 4096, "gate_up")
    assert not sweep.fits(sweep.Tile(64, 256, 64, 1, 4, 3), gate_up, H200_SMS)  # 2 x 64 x 256 accumulators, 4 warps
    assert not sweep.fits(sweep.Tile(64, 64, 512, 1, 4, 6), gate_up, H200_SMS)  # six stages of 512-deep tiles
    o_proj = sweep.Shape(8, 896, 896, "o_proj")
    assert not sweep.fits(sweep.Tile(16, 256, 64, 1, 4, 3), o_proj, H200_SMS)  # four programs
    assert not sweep.fits(sweep.Tile(16, 16, 512, 2, 4, 3), o_proj, H200_SMS)  # a split shorter than two K blocks
    assert sweep.block_ms(5) == (16,) and sweep.block_ms(40) == (64,) and sweep.block_ms(80) == (64, 128)


@pytest.mark.parametrize("shape, tile", [
    (sweep.Shape(2, 64, 128, "gate_up"), sweep.Tile(16, 32, 32, 2, 4, 2)),  # silu(x Wg^T) * (x Wu^T), split K
    (sweep.AttnShape(2, 3, 4, 2, 16, 37), sweep.AttnTile(16, 2, 4, 2)),  # GQA, three new tokens, split keys
    (sweep.Shape(3, 80, 48, "mlp"), sweep.Tile(16, 32, 16, 1, 4, 2)),  # the fused MLP, a partial ffn block
    (sweep.Shape(2, 64, 128, "down"), sweep.Tile(16, 32, 32, 2, 4, 2, tma=1)),  # weights through TMA (--tma)
])
def test_a_candidate_launch_computes_what_torch_does(tmp_path, shape, tile):
    """The launch the sweep times, built as it builds it (here under the interpreter), against the
    reference the sweep checks it with."""
    inputs = sweep.operands(shape, "cpu")
    launch, out = sweep.build(shape, tile, inputs, tmp_path)
    launch()
    assert float((out.float() - inputs["ref"]).norm() / inputs["ref"].norm()) < 1e-2
    assert sweep.tile_from(sweep.asdict(tile)) == tile and sweep.shape_from(sweep.asdict(shape)) == shape
    # written in the product's buffer type: the next GEMM's bf16 operand after attention and gate_up, else fp32
    operand = isinstance(shape, sweep.AttnShape) or shape.kind == "gate_up"
    assert out.dtype == (torch.bfloat16 if operand else torch.float32)


def test_attention_candidates_stay_within_32_waves_and_walk_at_least_two_key_blocks():
    shape = sweep.AttnShape(16, 1, 32, 8, 64, 1024)
    shipped = sweep.AttnTile(64, 8, 4, 3)
    tiles = sweep.candidates(shape, shipped, H200_SMS, per_shape=40)
    assert tiles[0] == shipped and len(set(tiles)) == 41
    for tile in tiles[1:]:
        assert tile.programs(shape) <= 32 * H200_SMS
        assert shape.keys // (tile.split_kv * tile.block_n) >= 2
    assert not sweep.fits(sweep.AttnTile(16, 64, 4, 3), sweep.AttnShape(64, 1, 32, 8, 64, 8192), H200_SMS)  # 65 waves
    assert not sweep.fits(sweep.AttnTile(256, 4, 4, 2), shape, H200_SMS)  # 1025 keys: one block of 256 a split


def test_attention_over_few_pairs_keeps_grids_under_half_a_wave():
    """One sequence's 8 KV heads: half a wave would leave only 16-key blocks at 512 keys, so the
    shipped tile's neighbours (32 programs and fewer, blocks of 32-64 keys) are candidates too."""
    shape = sweep.AttnShape(1, 5, 32, 8, 128, 512)
    shipped = sweep.AttnTile(64, 4, 4, 3)
    tiles = sweep.candidates(shape, shipped, H200_SMS, per_shape=12)
    near = [t for t in sweep.neighbours(shipped) if shape.keys // (t.split_kv * t.block_n) >= 2]
    assert near and set(near) <= set(tiles)
    assert any(t.block_n >= 32 and t.programs(shape) < H200_SMS // 2 for t in tiles[1:])
    assert all(shape.keys // (t.split_kv * t.block_n) >= 2 for t in tiles)


def test_the_launch_fit_recovers_a_fixed_time_and_a_rate_and_names_a_file_that_is_not_a_sweep(tmp_path):
    import json

    def shape(kind, mb, us):
        return {"kind": kind, "bytes": mb * 1e6, "shipped": {"us": us * 2}, "best": {"us": us}}
    # 4 us a launch plus 1 MB per 0.25 us (4 TB/s), against a copy bandwidth of 5000 GB/s: 80%
    shapes = [shape("o_proj", mb, 4.0 + 0.25 * mb) for mb in (20, 40, 80)] + [shape("attn", 30, 9.0)]
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"copy_gbs": 5000.0, "shapes": shapes + [shape("down", 50, 20.0)]}))
    fits = sweep.launch_fit(path)
    assert set(fits) == {"o_proj"}  # attention is no GEMM; one down size makes no line
    assert fits["o_proj"]["shapes"] == 3
    assert fits["o_proj"]["fixed_us"] == pytest.approx(4.0)
    assert fits["o_proj"]["rate_of_copy"] == pytest.approx(0.8)
    assert fits["o_proj"]["worst_residual_us"] == pytest.approx(0.0, abs=1e-9)
    assert sweep.launch_fit(path, "shipped")["o_proj"]["fixed_us"] == pytest.approx(8.0)
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(SystemExit, match=f"--fit {bad}: not a sweep this script wrote"):
        sweep.launch_fit(bad)


def test_transfer_reads_one_gpus_best_tiles_as_another_gpus_sweep_timed_them(tmp_path, capsys):
    def tile(n, us):
        return {"plan_keys": {"BLOCK_M": 16, "BLOCK_N": n}, "us": us}

    def entry(name, shipped, best, tried):
        return {"shape": name, "model": "draft", "shipped": shipped, "best": best, "tried": tried}

    h100 = tmp_path / "h100.json"
    h100.write_text(json.dumps({"shapes": [entry("qkv 32x3072x2048", tile(64, 9.0), tile(32, 6.0), []),
                                           entry("down 32x2048x8192", tile(64, 9.0), tile(16, 8.0), []),
                                           entry("o_proj 32x2048x2048", tile(64, 5.0), tile(32, 4.0), [])]}))
    h200 = tmp_path / "h200.json"
    h200.write_text(json.dumps({"shapes": [
        entry("qkv 32x3072x2048", tile(64, 8.0), tile(128, 4.0), [tile(64, 8.0), tile(32, 5.0), tile(128, 4.0)]),
        entry("down 32x2048x8192", tile(64, 10.0), tile(64, 10.0), [tile(64, 10.0)])]}))  # H100's best not timed
    rows = sweep.transfer([h100], [h200])
    assert rows == [{"shape": "qkv 32x3072x2048", "model": "draft", "tile": {"BLOCK_M": 16, "BLOCK_N": 32},
                     "us": 5.0, "shipped_us": 8.0, "best_us": 4.0}]  # o_proj: not swept there
    sweep.print_transfer(rows)
    assert "1 shapes: transferred tiles 1.600x the shipped tile's speed, 1.250x the best tile's time" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--onto"):
        sweep.transfer([h100], [tmp_path / "missing.json"])


def test_tma_twins_and_the_tiles_earlier_sweeps_found(tmp_path):
    """--tma: each GEMM tile beside its TMA twin where a TMA copy holds the tile; --tiles-from: the
    shipped tile, then each sweep's best for the shape."""
    shape = sweep.Shape(8, 2048, 2048, "o_proj")
    tiles = [sweep.Tile(16, 64, 128, 8, 4, 3), sweep.Tile(16, 32, 512, 1, 4, 4)]
    assert sweep.with_tma(shape, tiles) == [tiles[0], replace(tiles[0], tma=1), tiles[1]]
    assert sweep.with_tma(sweep.Shape(8, 2048, 2048, "mlp"), tiles) == tiles
    assert sweep.Tile(16, 64, 128, 8, 4, 3, tma=1).plan_keys()["TMA"] == 1
    found = tmp_path / "sweep.json"
    best = sweep.asdict(tiles[1]) | {"us": 4.6, "plan_keys": {}}
    found.write_text(json.dumps({"shapes": [{"shape": shape.key(), "best": best},
                                            {"shape": "qkv 8x3072x2048", "best": sweep.asdict(tiles[0])}]}))
    assert sweep.found_tiles([found], shape, tiles[0]) == tiles
    assert sweep.found_tiles([found], sweep.Shape(4, 64, 64, "down"), tiles[0]) == tiles[:1]


def test_a_file_that_is_not_a_sweep_is_named(tmp_path):
    shipped = sweep.Tile(16, 64, 128, 8, 4, 3)
    for text in ("{", '{"shapes": [{"shape": "o_proj 8x2048x2048", "best": {"block_m": 16}}]}', "[]"):
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(SystemExit, match="bad.json: not a kernel_sweep.py --json result"):
            sweep.found_tiles([bad], sweep.Shape(8, 2048, 2048, "o_proj"), shipped)


def test_a_resumed_sweep_keeps_what_was_measured_on_the_same_gpu_only(tmp_path):
    assert sweep.resumed(tmp_path / "none.json", "NVIDIA H100 80GB HBM3") is None  # nothing yet: a fresh sweep
    cut = tmp_path / "cut.json"
    cut.write_text(json.dumps({"gpu": "NVIDIA H100 80GB HBM3", "command": "python benchmarks/kernel_sweep.py a",
                               "code": "abc", "date": "2026-12-06", "runs": [{"command": "earlier"}],
                               "shapes": [{"shape": "qkv 32x3072x2048", "model": "draft", "best": None}]}))
    prior = sweep.resumed(cut, "NVIDIA H100 80GB HBM3")
    assert prior["done"] == {("qkv 32x3072x2048", "draft")} and len(prior["shapes"]) == 1
    assert [r["command"] for r in prior["runs"]] == ["earlier", "python benchmarks/kernel_sweep.py a"]
    with pytest.raises(SystemExit, match="measured on NVIDIA H100 80GB HBM3, not on this NVIDIA H200"):
        sweep.resumed(cut, "NVIDIA H200")
    bad = tmp_path / "bad.json"
    bad.write_text("{\"shapes\": 3}")
    with pytest.raises(SystemExit, match="not a kernel_sweep.py --json result") as error:
        sweep.resumed(bad, "NVIDIA H200")
    assert "\n" not in str(error.value)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="with a GPU the sweep would run")
def test_without_a_gpu_or_with_a_bad_workload_the_sweep_says_so_in_one_line(tmp_path):
    """On this CPU machine: a missing workload file is named first, then the GPU the timing needs."""
    out = tmp_path / "s.json"
    missing = run_script("kernel_sweep", tmp_path / "nope.toml", "--json", out)
    assert missing.returncode == 2 and "nope.toml" in missing.stderr.strip().splitlines()[-1]
    assert "Traceback" not in missing.stderr
    no_gpu = run_script("kernel_sweep", EXAMPLES_DIR / "llama-1b-8b-b1.toml", "--json", out)
    assert no_gpu.returncode == 2 and "needs a GPU" in no_gpu.stderr and "Traceback" not in no_gpu.stderr
    assert not out.exists()


def test_every_read_launch_reads_the_whole_buffer_once():
    """--read's launches (under the interpreter): torch's row sums and stream_read at each of its tiles
    add up to the buffer's sum, and each stream_read program sums exactly its own chunks."""
    src = torch.randn(sweep.READ_ROWS * 13, generator=torch.Generator().manual_seed(0)).bfloat16()  # ragged last chunk
    launches = sweep.readers(src, sms=1)
    assert set(launches) == {"row_sums"} | {f"stream_read {b}x{p}" for b, p in sweep.READERS}
    whole = float(src.float().sum())
    for name, (launch, total) in launches.items():
        launch()
        assert float(total()) == pytest.approx(whole, rel=1e-5, abs=1e-3), name
    sums = torch.empty(3)
    sweep.stream_read[(3,)](src, sums, src.numel(), BLOCK=1024)  # chunks 0, 3, 6, ... to program 0
    chunks = src.float().split(1024)
    expected = [sum(float(c.sum()) for c in chunks[p::3]) for p in range(3)]
    assert sums.tolist() == pytest.approx(expected, rel=1e-5, abs=1e-3)
