"""The time ledger: kernel records matched to a round's launches and summed by op kind and stream."""
from __future__ import annotations

import pytest

import conjugate  # noqa: F401  (selects the interpreter before triton is imported)
from conjugate.compiler.round import compile_round
from conjugate.evaluate.ledger import KernelRecord, Ledger, LedgerError, match_launches
from conjugate.graph import build_graph
from conjugate.plan import load_plan
from test_round import ROOT, _round

STREAM_IDS = {"main": 7, "draft": 8, "target": 9}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    rnd = _round("llama")
    plan = load_plan(ROOT / "plans" / "streams.json")
    return compile_round(plan, rnd.workload, rnd.draft, rnd.target, cache_dir=tmp_path_factory.mktemp("k")), \
        build_graph(rnd.workload)


def replay(compiled, scale: float = 1.0, start: float = 0.0) -> list[KernelRecord]:
    """Records as a GPU would give them: each stream's launches back to back, launch i taking (i + 1) us."""
    clock: dict[str, float] = {}
    out = []
    for launch in compiled.launches:
        begin = clock.get(launch.stream, start)
        end = begin + (launch.index + 1) * scale
        out.append(KernelRecord(f"k_{launch.digest}", STREAM_IDS[launch.stream], begin, end))
        clock[launch.stream] = end
    return out


def test_records_are_matched_to_launches_by_kernel_name_and_order(compiled):
    rnd, _ = compiled
    records = replay(rnd)
    matched = match_launches(rnd, list(reversed(records)))  # order of arrival does not matter
    assert all(matched[i].us == i + 1 for i in range(len(rnd.launches)))
    shared = [l for l in rnd.launches if sum(m.digest == l.digest for m in rnd.launches) > 1]
    assert shared, "layers share kernels: order decides"
    with pytest.raises(LedgerError, match="records for"):
        match_launches(rnd, records[1:])


def test_the_ledger_sums_time_bytes_and_idle(compiled):
    rnd, graph = compiled
    replays = [replay(rnd, scale) for scale in (1.0, 1.1, 0.9)]  # the median replay is the unscaled one
    ledger = Ledger.of(rnd, graph, replays, copy_gbs=1000.0)
    n = len(rnd.launches)
    assert [l.us for l in ledger.launches] == [pytest.approx(i + 1.0) for i in range(n)]
    assert sum(k.us for k in ledger.kinds) == pytest.approx(n * (n + 1) / 2)
    assert sum(k.bytes for k in ledger.kinds) == sum(graph.nodes[o]["op"].bytes for o in graph.nodes)
    per_stream = {}
    for l in rnd.launches:
        per_stream[STREAM_IDS[l.stream]] = per_stream.get(STREAM_IDS[l.stream], 0) + l.index + 1
    assert ledger.round_us == pytest.approx(max(per_stream.values()))
    assert {s.stream: s.busy_us for s in ledger.streams} == pytest.approx(per_stream)
    assert ledger.busy_us == pytest.approx(max(per_stream.values())) and ledger.idle_us == pytest.approx(0)
    assert ledger.floor_us == pytest.approx(sum(k.bytes for k in ledger.kinds) / (1000.0 * 1e9) * 1e6)
    kinds = {k.kind for k in ledger.kinds}
    assert "draft qkv" in kinds and "target attn" in kinds
    text = ledger.summary(top=3)
    assert text.startswith("round ") and len(text.splitlines()) == 4 and "of copy bandwidth" in text
    d = ledger.to_dict()
    assert d["idle_us"] == pytest.approx(0) and len(d["launches"]) == n


def test_gaps_between_kernels_are_idle_time(compiled):
    rnd, graph = compiled
    records = replay(rnd)
    late = [KernelRecord(r.name, r.stream, r.start_us + 100, r.end_us + 100) for r in records[-1:]]
    ledger = Ledger.of(rnd, graph, [records[:-1] + late], copy_gbs=1000.0)
    assert ledger.idle_us >= 100 - len(rnd.launches)  # the last kernel started 100 us late


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_profile_without_a_gpu_is_one_line(capsys):
    from conjugate.cli import main

    assert main(["profile", str(ROOT / "examples" / "tiny.toml")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1 and "GPU" in err
