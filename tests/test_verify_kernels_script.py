"""benchmarks/verify_kernels.py without a GPU: kernel sweeps converted into #49's shape rows."""
from __future__ import annotations

import json
from pathlib import Path

from scripts import load_script, run_script

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "benchmarks" / "results" / "kernel_sweep_target_h200.json"


def test_each_shape_becomes_a_row_at_its_best_tile():
    sweep = json.loads(SWEEP.read_text())
    rows = load_script("verify_kernels").shape_rows(sweep, "s.json")
    assert len(rows) == len(sweep["shapes"])
    kinds = {r["kind"] for r in rows}
    assert kinds == {"gemm", "attention"}
    for row, shape in zip(rows, sweep["shapes"]):
        best = shape.get("best") or shape["shipped"]
        assert row["ms"] == best["us"] / 1e3 and row["bw_fraction"] == best["share_of_copy"]
        assert row["bytes"] == shape["bytes"] and row["tile"] == best["plan_keys"] and row["sweep"] == "s.json"
        if row["kind"] == "gemm":
            assert row["rows"] == shape["fields"]["rows"] and row["context"] is None
        else:
            assert row["rows"] == shape["fields"]["batch"] * shape["fields"]["tokens"]
            assert row["context"] == shape["fields"]["context"]
        # bw_fraction is bytes over time against the copy rate: the same measure for every row
        assert abs(row["bytes"] / (row["ms"] * 1e-3) / 1e9 / sweep["copy_gbs"] - row["bw_fraction"]) < 1e-6


def test_a_sweeps_same_bytes_read_rides_along_only_where_it_was_timed():
    sweep = json.loads(SWEEP.read_text())
    first, second = sweep["shapes"][0], sweep["shapes"][1]
    first["read"] = {"us": 5.0, "share_of_copy": 0.42}
    second["read"] = {"error": "too short to time beside the L2 flush"}
    rows = load_script("verify_kernels").shape_rows(sweep, "s.json")
    assert rows[0]["read_bw_fraction"] == 0.42
    assert all("read_bw_fraction" not in r for r in rows[1:])


def test_sweeps_alone_need_no_gpu_and_bad_input_is_one_line(tmp_path):
    out = tmp_path / "v.json"
    proc = run_script("verify_kernels", "--sweeps", SWEEP, "--json", out)
    assert proc.returncode == 0, proc.stderr
    written = json.loads(out.read_text())
    assert written["phases"] == [] and len(written["shapes"]) > 10 and written["sweeps"][0]["gpu"]
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    proc = run_script("verify_kernels", "--sweeps", bad, "--json", tmp_path / "w.json")
    assert proc.returncode == 2 and "not a kernel_sweep.py JSON" in proc.stderr
    assert run_script("verify_kernels", "--json", tmp_path / "w.json").returncode == 2  # nothing to do
    proc = run_script("verify_kernels", tmp_path / "missing.toml", "--json", tmp_path / "w.json")
    assert proc.returncode == 2 and "missing.toml" in proc.stderr and not (tmp_path / "w.json").exists()


def test_the_compared_plans_differ_only_where_named():
    """--streamed streams the compared model's residual GEMMs, --pdl sets its trigger; nothing else moves."""
    from conjugate.paths import shipped_plan
    from conjugate.plan import load_plan

    script = load_script("verify_kernels")
    sequential = load_plan(shipped_plan("sequential"))
    base = sequential.to_dict()
    assert base["target"]["streamed"] == [] == base["draft"]["streamed"] and base["target"]["pdl"] == "none"
    plans = script.Comparison("target", streamed=True, pdl=("start", "end")).plans(sequential)
    assert list(plans) == ["sequential", "streamed", "sequential+pdl=start", "streamed+pdl=start",
                           "sequential+pdl=end", "streamed+pdl=end"]
    assert plans["sequential"].to_dict() == base
    streamed = base | {"target": base["target"] | {"streamed": ["down", "o_proj"]}}
    assert plans["streamed"].to_dict() == streamed
    assert plans["streamed+pdl=end"].to_dict() == streamed | {"target": streamed["target"] | {"pdl": "end"}}
    draft = script.Comparison("draft", streamed=True).plans(sequential)
    assert list(draft) == ["sequential", "streamed"] and script.Comparison("draft").label == "draft"
    assert draft["streamed"].to_dict() == base | {"draft": base["draft"] | {"streamed": ["down", "o_proj"]}}


def test_fused_twins_add_the_fusions_and_a_bad_name_is_one_line(tmp_path):
    from conjugate.paths import shipped_plan
    from conjugate.plan import load_plan

    script = load_script("verify_kernels")
    sequential = load_plan(shipped_plan("sequential"))
    plans = script.Comparison("target", streamed=True, fusions=("mlp_norm+gate_up", "attn_norm+qkv")).plans(sequential)
    assert list(plans) == ["sequential", "sequential+fused", "streamed", "streamed+fused"]
    fused = plans["streamed+fused"].to_dict()["target"]
    assert fused["fusions"] == ["attn_norm+qkv", "lm_head+argmax", "mlp_norm+gate_up"]
    assert fused["streamed"] == ["down", "o_proj"]
    proc = run_script("verify_kernels", "--fusions", "attn_norm+qkvx", "--sweeps", SWEEP, "--json", tmp_path / "v.json")
    assert proc.returncode == 2 and "--fusions" in proc.stderr and "attn_norm+qkvx" in proc.stderr
    assert not (tmp_path / "v.json").exists()


def test_fused_tiles_change_only_the_fused_twins_and_a_bad_one_is_one_line(tmp_path):
    from conjugate.paths import shipped_plan
    from conjugate.plan import load_plan

    script = load_script("verify_kernels")
    sequential = load_plan(shipped_plan("sequential"))
    plans = script.Comparison("target", fusions=("qkv+rope_kv",), fused_tiles=(("qkv", "SPLIT_K", 4),)).plans(sequential)
    tiles = {name: plan.to_dict()["target"]["tiles"] for name, plan in plans.items()}
    assert tiles["sequential+fused"]["qkv"]["SPLIT_K"] == 4
    assert tiles["sequential"] == sequential.to_dict()["target"]["tiles"]
    assert {k: v for k, v in tiles["sequential+fused"]["qkv"].items() if k != "SPLIT_K"} == \
        {k: v for k, v in tiles["sequential"]["qkv"].items() if k != "SPLIT_K"}
    for bad, says in ((["--fused-tiles", "qkv.SPLIT_K=four"], "KIND.KEY=VALUE"),
                      (["--fused-tiles", "qkv.SPLIT_K=4"], "--fusions"),
                      (["--fusions", "qkv+rope_kv", "--fused-tiles", "qkv.SPLITK=4"], "SPLITK")):
        proc = run_script("verify_kernels", *bad, "--sweeps", SWEEP, "--json", tmp_path / "v.json")
        assert proc.returncode == 2 and says in proc.stderr, (bad, proc.stderr)
        assert len(proc.stderr.strip().splitlines()[-1]) < 300
    assert not (tmp_path / "v.json").exists()


def test_tuned_twins_take_the_gpus_table_tiles_but_not_for_a_rope_fused_qkv(tmp_path, monkeypatch):
    import json

    from conjugate.agents.heuristic import tile_table
    from conjugate.paths import TILES_FILE, shipped_plan
    from conjugate.plan import load_plan
    from conjugate.workload import load_workload

    script = load_script("verify_kernels")
    sequential = load_plan(shipped_plan("sequential"))
    b32 = load_workload(ROOT / "examples" / "llama-1b-8b-b32.toml")
    found, source = script.table_tiles("NVIDIA H100 80GB HBM3", b32, "target")
    assert found and set(found) <= {"qkv", "o_proj", "gate_up", "down", "attn"} and source.startswith("H100 table")
    assert script.table_tiles("Tesla T4", b32, "target") == ({}, "")  # no table names it
    # an H200 table without the example's shapes: its chip's other model's tiles serve instead
    data = json.loads(TILES_FILE.read_text())
    for table in data["tables"]:
        if table["device"] == "H200":
            table["tiles"] = [t for t in table["tiles"] if t["kind"] == "attn" and t.get("batch") == 1][:1]
    assert any(t["device"] == "H200" for t in data["tables"])
    (tmp_path / "tiles.json").write_text(json.dumps(data))
    committed = tile_table.load_tile_tables
    monkeypatch.setattr(tile_table, "load_tile_tables", lambda path=tmp_path / "tiles.json": committed(path))
    on_h200, said = script.table_tiles("NVIDIA H200", b32, "target")
    assert on_h200 == found and said.startswith("H100 table")
    tiles = {"qkv": {"BLOCK_N": 128, "num_stages": 6}, "gate_up": {"num_stages": 5}, "down": {"SPLIT_K": 2}}
    how = script.Comparison("target", fusions=("qkv+rope_kv",), tuned=True)
    plans = how.plans(sequential, tiles)
    assert list(plans) == ["sequential", "sequential+tuned", "sequential+fused", "sequential+fused+tuned"]
    before = sequential.to_dict()["target"]["tiles"]
    for name in ("sequential+tuned", "sequential+fused+tuned"):
        after = plans[name].to_dict()["target"]["tiles"]
        for kind in ("gate_up", "down"):
            assert after[kind] == before[kind] | tiles[kind] != before[kind]
        assert after["o_proj"] == before["o_proj"] and after["attn"] == before["attn"]  # the table had none
    assert plans["sequential+tuned"].to_dict()["target"]["tiles"]["qkv"] == before["qkv"] | tiles["qkv"]
    assert plans["sequential+fused+tuned"].to_dict()["target"]["tiles"]["qkv"] == before["qkv"]  # plain projection's
    assert list(how.plans(sequential, {})) == ["sequential", "sequential+fused"]  # no table: no twins
    same = {kind: dict(before[kind]) for kind in tiles}
    assert list(how.plans(sequential, same)) == ["sequential", "sequential+fused"]  # the plan's own tiles: no twins
    chosen = script.Comparison("target", fusions=("mlp_norm+gate_up",), fused_tiles=(("gate_up", "num_stages", 3),),
                               tuned=True).plans(sequential, tiles)
    assert chosen["sequential+fused+tuned"].to_dict()["target"]["tiles"]["gate_up"]["num_stages"] == 3  # --fused-tiles'
    assert chosen["sequential+tuned"].to_dict()["target"]["tiles"]["gate_up"]["num_stages"] == 5


def test_a_phase_ledger_is_the_phase_launches_time_per_kind(tmp_path, monkeypatch):
    """phase_ledger over a captured phase's records (here synthetic: each launch 2 us, back to back)."""
    import conjugate.evaluate.ledger as ledger_module
    from conjugate.compiler.round import compile_round
    from conjugate.evaluate.ledger import KernelRecord
    from conjugate.graph import build_graph
    from conjugate.plan import load_plan
    from conjugate.roles import Model
    from test_round import _round

    rnd = _round("llama")
    compiled = compile_round(load_plan(ROOT / "plans" / "sequential.json"), rnd.workload, rnd.draft, rnd.target,
                             cache_dir=tmp_path)
    phase = compiled.phase_launches(Model.TARGET)

    def records(run, device, replays=5, warmup=3):
        assert run == "replay" and replays == 5
        one = [KernelRecord(compiled.launches[i].record_name, 7, 2.0 * n, 2.0 * n + 2.0) for n, i in enumerate(phase)]
        return [one] * replays

    monkeypatch.setattr(ledger_module, "kernel_records", records)

    class Captured:
        replay = "replay"

    out = load_script("verify_kernels").phase_ledger(compiled, build_graph(rnd.workload), Captured, Model.TARGET,
                                                   1000.0, "cpu")
    assert set(out) == {"round_us", "floor_us", "busy_us", "kinds"}
    assert out["round_us"] == 2.0 * len(phase) and all(k["kind"].startswith("target ") for k in out["kinds"])
    assert sum(k["launches"] for k in out["kinds"]) == len(phase)
    assert sum(k["us"] for k in out["kinds"]) == out["round_us"]
    grids = {}
    for i in phase:
        grids.setdefault(" ".join(["target", compiled.schedule.launches[i].parts[0].kind]), set()).add(
            compiled.launches[i].grid)
    for k in out["kinds"]:  # each kind's grid sizes, as compiled
        assert k["programs"] and k["programs"] == sorted(grids[k["kind"]]), k
    fused = load_plan(ROOT / "plans" / "sequential.json").to_dict()
    fused["target"]["fusions"] = sorted(set(fused["target"]["fusions"]) | {"qkv+rope_kv"})
    from conjugate.plan import validate_plan
    rope = compile_round(validate_plan(fused), rnd.workload, rnd.draft, rnd.target, cache_dir=tmp_path)
    spec, tile = rnd.workload.target, fused["target"]["tiles"]["qkv"]
    qkv = next(launch for launch in rope.launches if launch.parts[0].sig.fn == "gemm_rope_kv_tile")
    rows = rnd.workload.target_batch * (rnd.workload.k + 1)
    assert qkv.grid == -(-rows // tile["BLOCK_M"]) * (spec.num_heads + 2 * spec.num_kv_heads) * tile["SPLIT_K"]
