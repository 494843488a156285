"""lab/experiments/attention_compare.py: reads sweeps and bench files (plain or xz), pairs what both hold,
and names a file that is not what it should be."""
from __future__ import annotations

import json
import lzma

import pytest

from experiment_scripts import load_script  # lab/experiments/tests/experiment_scripts.py

compare = load_script("attention_compare")


def _sweep(path, times: dict[str, float]):
    shapes = [{"shape": s, "kind": "attn", "model": "draft", "shipped": {"us": us}} for s, us in times.items()]
    shapes.append({"shape": "qkv 4x4096x1024", "kind": "qkv", "model": "draft", "shipped": {"us": 1.0}})
    path.write_text(json.dumps({"gpu": "NVIDIA H200", "shapes": shapes}))
    return path


def _bench(path, latencies: dict[str, float], xz: bool = False):
    plans = [{"label": label, "result": {"status": "ok", "metrics": {"latency_ms": ms}}}
             for label, ms in latencies.items()]
    raw = json.dumps({"workload": "w", "plans": plans}).encode()
    path.write_bytes(lzma.compress(raw) if xz else raw)
    return path


def test_shipped_tiles_and_rounds_are_paired(tmp_path):
    before = _sweep(tmp_path / "a.json", {"attn B1": 10.0, "attn B8": 20.0, "attn gone": 5.0})
    after = _sweep(tmp_path / "b.json", {"attn B1": 8.0, "attn B8": 21.0})
    shapes = compare.kernels(before, after)
    assert [(s["shape"], s["ratio"]) for s in shapes] == [("draft attn B1", 0.8), ("draft attn B8", 1.05)]
    rows = compare.rounds([(_bench(tmp_path / "r0.json.xz", {"streams": 10.0, "best": 8.0}, xz=True),
                            _bench(tmp_path / "r1.json", {"streams": 9.0, "best": 8.0}))])
    assert [(r["plan"], r["ratio"]) for r in rows] == [("streams", 0.9), ("best", 1.0)]


def test_a_file_that_is_not_a_sweep_or_a_bench_is_named(tmp_path):
    bench = _bench(tmp_path / "bench.json", {"streams": 1.0})
    with pytest.raises(SystemExit, match="bench.json: not a kernel_sweep.py file"):
        compare.kernels(bench, bench)
    broken = tmp_path / "broken.json.xz"
    broken.write_bytes(b"not xz")
    with pytest.raises(SystemExit, match="broken.json.xz: cannot read a bench file"):
        compare.rounds([(broken, bench)])
    failed = tmp_path / "failed.json"
    failed.write_text(json.dumps({"workload": "w", "plans": [{"label": "streams", "result": {"status": "incorrect"}}]}))
    with pytest.raises(SystemExit, match="failed.json: plan streams: incorrect"):
        compare.rounds([(failed, bench)])
    errored = tmp_path / "errored.json"
    errored.write_text(json.dumps({"shapes": [{"shape": "attn B1", "kind": "attn", "model": "draft",
                                               "shipped": {"error": "out of resources"}}]}))
    with pytest.raises(SystemExit, match=r"errored.json: shapes\[0\].shipped.us \(out of resources\): no positive"):
        compare.kernels(errored, errored)
    other = _bench(tmp_path / "other.json", {"streams": 1.0})
    other.write_text(other.read_text().replace('"workload": "w"', '"workload": "v"'))
    with pytest.raises(SystemExit, match="other.json: workload 'v', not .*bench.json's 'w'"):
        compare.rounds([(bench, other)])
