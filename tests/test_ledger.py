"""The time ledger: kernel records matched to a round's launches and summed by op kind and stream."""
from __future__ import annotations

import json

import pytest

import conjugate  # noqa: F401  (selects the interpreter before triton is imported)
from conjugate.compiler.round import compile_round
from conjugate.evaluate.ledger import KernelRecord, Ledger, LedgerError, match_launches
from conjugate.evaluate.result import LedgerSummary
from conjugate.graph import build_graph
from conjugate.plan import load_plan, validate_plan
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


def test_kernels_started_early_count_from_the_end_of_the_one_before(compiled):
    """Programmatic dependent launch: each kernel starts 0.5 us before the one ahead of it on its
    stream ends and waits; the wait is the earlier kernel's time, not counted twice."""
    rnd, graph = compiled
    early = [KernelRecord(r.name, r.stream, r.start_us - 0.5 if r.start_us > 0 else r.start_us, r.end_us)
             for r in replay(rnd)]
    ledger = Ledger.of(rnd, graph, [early], copy_gbs=1000.0)
    assert [l.us for l in ledger.launches] == [pytest.approx(i + 1.0) for i in range(len(rnd.launches))]
    summary = ledger.condensed()
    assert summary.streams == pytest.approx({str(s): sum(l.index + 1 for l in rnd.launches if l.stream == s) / 1e3
                                             for s in {l.stream for l in rnd.launches}})
    busy = {s.stream: s.busy_us for s in ledger.streams}
    assert sum(summary.streams.values()) == pytest.approx(sum(busy.values()) / 1e3)


def test_a_phase_replayed_alone_has_the_ledger_of_its_launches(compiled):
    """The target's phase alone (CompiledRound.phase): its launches' records, its ops' bytes as the floor."""
    from conjugate.roles import Model

    rnd, graph = compiled
    phase = rnd.phase_launches(Model.TARGET)
    assert phase and len(phase) < len(rnd.launches)
    records = [r for r, launch in zip(replay(rnd), rnd.launches) if launch.index in phase]
    ledger = Ledger.of(rnd, graph, [records], copy_gbs=1000.0, launches=phase)
    assert [l.launch for l in ledger.launches] == phase and [l.us for l in ledger.launches] == [i + 1.0 for i in phase]
    assert {k.kind.split()[0] for k in ledger.kinds} == {"target"}
    target_bytes = sum(graph.nodes[op]["op"].bytes for op in graph.graph["order"][Model.TARGET])
    assert ledger.floor_us == pytest.approx(target_bytes / (1000.0 * 1e9) * 1e6)
    with pytest.raises(LedgerError, match="records for"):  # the whole round's launches, a phase's records
        Ledger.of(rnd, graph, [records], copy_gbs=1000.0)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_profile_without_a_gpu_is_one_line(capsys):
    from conjugate.cli import main

    assert main(["profile", str(ROOT / "examples" / "tiny.toml")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1 and "GPU" in err


# --- the condensed ledger: in every result, and what the agents read ---------------------------------

def test_the_condensed_ledger_lists_the_biggest_losses_first(compiled):
    rnd, graph = compiled
    ledger = Ledger.of(rnd, graph, [replay(rnd)], copy_gbs=1000.0)
    summary = ledger.condensed(top=4)
    assert len(summary.kinds) == 4 and not summary.modeled
    losses = [k.loss_ms for k in summary.kinds]
    assert losses == sorted(losses, reverse=True)
    assert losses[0] == pytest.approx(max(k.us - k.floor_us for k in ledger.kinds) / 1e3)
    assert summary.streams == pytest.approx({s: sum(l.index + 1 for l in rnd.launches if l.stream == s) / 1e3
                                             for s in {l.stream for l in rnd.launches}})
    assert LedgerSummary.from_dict(json.loads(json.dumps(summary.to_dict()))) == summary
    head, *rest = summary.lines(top=2)
    assert head.startswith(f"round {summary.round_ms:.3f} ms (measured; GPU idle") and len(rest) == 2
    assert summary.kinds[0].kind in rest[0] and "over its floor" in rest[0]


def test_modeled_results_carry_a_modeled_ledger(tmp_path):
    from conjugate.evaluate.pipeline import evaluate
    from conjugate.evaluate.evaluators import load_profile
    from conjugate.evaluate.result import EvalResult
    from conjugate.workload import load_workload

    workload = load_workload(ROOT / "examples" / "llama-1b-8b-b8.toml")  # shapes only: no weights made
    r = evaluate(load_plan(ROOT / "plans" / "streams.json"), workload, load_profile("analytical"), cache_dir=tmp_path)
    ledger = r.metrics.ledger
    assert r.ok and ledger.modeled and ledger.idle_ms == 0
    assert ledger.round_ms == pytest.approx(r.latency_ms) and ledger.floor_ms == pytest.approx(r.metrics.floor_ms)
    assert set(ledger.streams) == {"draft", "target"} and len(ledger.kinds) == 8
    assert all(k.ms >= k.floor_ms and 0 < k.bandwidth_fraction <= 1 for k in ledger.kinds)
    assert EvalResult.from_dict(json.loads(json.dumps(r.to_dict()))).metrics.ledger == ledger
    assert "(modeled)" in ledger.lines()[0] and "idle" not in ledger.lines()[0]


def test_the_measured_harness_condenses_the_rounds_kernel_records(compiled, monkeypatch):
    """MeasuredHarness.ledger on recorded kernels (a GPU's records stood in for): the condensed
    ledger, or None when the records do not match the launches (the round is still timed)."""
    from conjugate.evaluate import measured
    from conjugate.evaluate.evaluators import load_profile
    from conjugate.evaluate.session import EvaluationSession, RoundSetup

    rnd, graph = compiled
    session = EvaluationSession()
    monkeypatch.setattr(session, "device_rates", lambda device: {"copy_bandwidth_gbs": 1000.0})
    harness = measured.MeasuredHarness(load_profile("h200"), None, session)
    setup = RoundSetup(None, graph, ())
    asked = []
    monkeypatch.setattr(measured, "kernel_records",
                        lambda run, device, replays: asked.append(replays) or [replay(rnd) for _ in range(replays)])
    summary = harness.ledger(rnd, setup)
    assert asked == [3]  # the h200 profile's ledger_replays
    assert summary == Ledger.of(rnd, graph, [replay(rnd)], copy_gbs=1000.0).condensed()
    monkeypatch.setattr(measured, "kernel_records", lambda run, device, replays: [replay(rnd)[1:]])
    assert harness.ledger(rnd, setup) is None


def _context_with_ledger(plan, kinds):
    from conjugate.agents.base import NodeContext
    from conjugate.evaluate.result import EvalResult, KindLoss, Metrics, Stage, Status

    ledger = LedgerSummary(9.0, 6.0, 0.1, False, {"draft": 5.0, "target": 8.0},
                           tuple(KindLoss(kind, 64, ms, floor, floor / ms) for kind, ms, floor in kinds))
    metrics = Metrics(latency_ms=9.0, floor_ms=6.0, floor_ratio=1.5, bandwidth_gbs=3000.0, launches=400,
                      device="NVIDIA H200", sms=132, ledger=ledger)
    result = EvalResult("h", "w", "h200", Stage.TIMING, Status.OK, False, metrics=metrics)
    return NodeContext(plan=plan, plan_hash=load_plan_hash(plan), workload={}, evaluator="h200",
                       device="NVIDIA H200", sms=132, result=result, baselines={}, best=[], lessons=[],
                       edit_stats={}, tried=[], failures=[])


def load_plan_hash(plan) -> str:
    from conjugate.plan import validate_plan
    return validate_plan(plan).hash


def test_the_heuristic_aims_at_the_biggest_loss_first():
    """Tile moves for the kind losing most come first; an op losing time ranks the fusion that
    removes its launches above the other fusions, by the part of its loss those launches cost."""
    from conjugate.agents.heuristic import HeuristicProposer

    plan = json.loads((ROOT / "plans" / "streams.json").read_text())
    losses = [("draft down", 1.55, 0.52), ("target gate_up", 2.74, 1.77), ("draft attn_norm", 0.27, 0.001)]
    proposals = HeuristicProposer().propose(_context_with_ledger(plan, losses), 40)
    tiles = [p for p in proposals if p.kind == "tiles"]
    assert "draft down" in tiles[0].rationale and "the ledger" in tiles[0].rationale
    fusions = [p for p in proposals if p.kind == "fusions"]
    assert "attn_norm+qkv, " in fusions[0].rationale and "the ledger" in fusions[0].rationale  # all at once first
    single = [p for p in fusions if len(p.patch) == 1 and p.patch[0]["op"] == "add"]
    # the norm's loss goes whole with its launches; gate_up+down, which would absorb the down, was
    # measured slower and ranks low whatever the ledger says
    assert single[0].rationale.startswith("fuse attn_norm+qkv in the draft") and "the ledger" in single[0].rationale
    assert not any("the ledger" in p.rationale for p in single[1:])
    assert [p for p in single if "gate_up+down" in p.rationale] in ([], single[-1:])  # last if offered at all
    without = HeuristicProposer().propose(_context_with_ledger(plan, []), 40)
    assert not any("the ledger" in p.rationale for p in without)
    assert tiles[0].prior > max(p.prior for p in without if p.kind == "tiles")


def test_the_llm_prompt_carries_the_ledger():
    from conjugate.agents.llm.prompt import Prompts

    plan = json.loads((ROOT / "plans" / "streams.json").read_text())
    text = Prompts().expand_text(_context_with_ledger(plan, [("draft down", 1.55, 0.52)]), 3)
    section = text[text.index("## Where the round's time goes"):text.index("## Shared launches")]
    assert "round 9.000 ms (measured; GPU idle 0.100 ms) = 1.50x its floor 6.000 ms" in section
    assert "- draft down: 1.550 ms in 64 launches at 34% of copy bandwidth, 1.030 ms over its floor" in section
    assert '"ledger"' not in text[text.index("## This plan's scores"):text.index("## Where the round")]


def test_the_heuristic_serves_the_busier_stream_first():
    """With two streams, `priority` for the stream the ledger says is busier ranks first; without a
    ledger, the draft's; leaving two streams also clears the priority (the patch stays valid)."""
    from conjugate.agents.heuristic.streams import first_served, streams_edits
    from conjugate.plan import patch_plan, validate_plan

    plan = validate_plan(json.loads((ROOT / "plans" / "streams.json").read_text()))
    ledger = _context_with_ledger(plan.data, []).result.metrics.ledger  # target busy 8.0 ms, draft 5.0
    edits = sorted(streams_edits(plan, ledger), key=lambda c: -c.score)
    assert first_served(patch_plan(plan, edits[0].patch)) == "target"
    assert "busier (8.00 ms against 5.00)" in edits[0].rationale
    assert first_served(patch_plan(plan, sorted(streams_edits(plan), key=lambda c: -c.score)[0].patch)) == "draft"
    favoured = patch_plan(plan, edits[0].patch)
    back = [c for c in streams_edits(favoured, ledger) if c.patch[0]["path"] == "/cross/streams"]
    assert first_served(patch_plan(favoured, back[0].patch)) == "none"
    assert all(patch_plan(favoured, c.patch) for c in streams_edits(favoured, ledger))


def test_the_llm_prompt_shows_each_shared_launch_against_two_streams():
    from dataclasses import replace

    from conjugate.agents.llm.prompt import Prompts
    from conjugate.evaluate.result import Verdict

    plan = json.loads((ROOT / "plans" / "interleave.json").read_text())
    ctx = _context_with_ledger(plan, [])
    verdict = Verdict.judge(4, (), 9.0, (6.0, 4.0), modeled=False, overlap_us=7.0)
    text = Prompts().expand_text(replace(ctx, result=replace(ctx.result, verdicts=(verdict,))), 3)
    row = next(line for line in text.splitlines() if line.startswith('- {"launch":4'))
    assert '"verdict":"gain"' in row and '"overlap_us":7.0' in row and '"vs_overlap":"interference"' in row
    assert '"gain_vs_overlap_percent":-28.6' in row and "two-stream plan would make of them" in text


def _two_streamed_models(tmp_path):
    rnd = _round("llama")
    raw = load_plan(ROOT / "plans" / "streams.json").to_dict()
    for model in ("draft", "target"):
        raw[model]["streamed"] = ["down", "o_proj"]
    return compile_round(validate_plan(raw), rnd.workload, rnd.draft, rnd.target, cache_dir=tmp_path)


def _slow_draft_replay(compiled, stream_id) -> list[KernelRecord]:
    """Each stream's launches back to back, the draft's ten times slower; `stream_id(launch)` the
    record's stream id."""
    clock: dict[str, float] = {}
    records = []
    for launch in compiled.launches:
        begin = clock.get(launch.stream, 0.0)
        end = begin + (10.0 if launch.stream == "draft" else 1.0)
        records.append(KernelRecord(launch.record_name, stream_id(launch), begin, end))
        clock[launch.stream] = end
    return records


def test_a_kernel_launched_on_both_streams_is_matched_per_stream(tmp_path):
    """Both models' o_proj and down as the streamed kernel (one kernel name on two streams), the
    draft's stream ten times slower: its records arrive in a different order from the launches', and
    each still meets its own launch, also where a graph replay gives a stream's kernels several ids."""
    compiled = _two_streamed_models(tmp_path)
    streamed = [l for l in compiled.launches if l.record_name == "streamed_residual_kernel"]
    assert {l.stream for l in streamed} == {"draft", "target"}
    for stream_id in (lambda l: STREAM_IDS[l.stream], lambda l: STREAM_IDS[l.stream] * 10 + l.index % 3):
        records = _slow_draft_replay(compiled, stream_id)
        order = sorted(streamed, key=lambda l: records[l.index].start_us)
        assert [l.index for l in order] != [l.index for l in streamed], "the streams' records interleave"
        matched = match_launches(compiled, records)
        assert all(matched[l.index] is records[l.index] for l in compiled.launches)


def test_streams_the_records_cannot_tell_apart_are_matched_in_start_order(tmp_path):
    """Every record on one id (the streams indistinguishable): no error, start order decides."""
    compiled = _two_streamed_models(tmp_path)
    records = _slow_draft_replay(compiled, lambda l: 7)
    matched = match_launches(compiled, records)
    streamed = [l.index for l in compiled.launches if l.record_name == "streamed_residual_kernel"]
    in_start_order = sorted((records[i] for i in streamed), key=lambda r: r.start_us)
    assert [matched[i] for i in streamed] == in_start_order
    assert all(matched[l.index] is records[l.index] for l in compiled.launches if l.index not in streamed)


@pytest.fixture(scope="module")
def step_round(tmp_path_factory):
    rnd = _round("llama")
    plan = load_plan(ROOT / "plans" / "step.json")  # the draft's k steps as one step launch
    return compile_round(plan, rnd.workload, rnd.draft, rnd.target, cache_dir=tmp_path_factory.mktemp("k")), \
        build_graph(rnd.workload)


def test_a_step_launchs_time_is_divided_among_its_ops_by_its_critical_path(step_round):
    """The step launch is one kernel record; with its critical path's shares (step_shares on a GPU)
    the ledger lists `draft step <op>` kinds: the launch's time split by the shares, its bytes by the
    graph ops each table op computes (the norms with their GEMMs, RoPE with qkv, argmax with lm_head)."""
    from conjugate.compiler.step.compiled import CompiledStep

    rnd, graph = step_round
    index = next(i for i, l in enumerate(rnd.launches) if isinstance(l, CompiledStep))
    records = [KernelRecord(l.record_name, STREAM_IDS[l.stream], float(i), float(i + 1)) for i, l in
               enumerate(rnd.launches)]
    records[index] = KernelRecord(records[index].name, records[index].stream, float(index), index + 10.0)
    for r in records[index + 1:]:
        records[records.index(r)] = KernelRecord(r.name, r.stream, r.start_us + 9, r.end_us + 9)
    whole = Ledger.of(rnd, graph, [records], copy_gbs=1000.0)
    assert {k.kind: k.us for k in whole.kinds}["draft step"] == pytest.approx(10.0)
    shares = {"embed": 0.05, "qkv": 0.25, "attn": 0.2, "o_proj": 0.1, "gate_up": 0.2, "down": 0.1, "head": 0.1}
    split = Ledger.of(rnd, graph, [records], copy_gbs=1000.0, inside={index: shares})
    kinds = {k.kind: k for k in split.kinds}
    assert "draft step" not in kinds
    names = {"head": "lm_head"}
    for op, share in shares.items():
        k = kinds[f"draft step {names.get(op, op)}"]
        assert k.us == pytest.approx(10.0 * share) and k.launches == 1
    step_ops = [graph.nodes[o]["op"] for p in rnd.schedule.launches[index].parts for o in p.ops]
    assert kinds["draft step qkv"].bytes == sum(o.bytes for o in step_ops if o.kind in ("attn_norm", "qkv", "rope_kv"))
    assert kinds["draft step lm_head"].bytes == sum(o.bytes for o in step_ops
                                                    if o.kind in ("final_norm", "lm_head", "argmax"))
    assert sum(k.us for k in split.kinds) == pytest.approx(sum(k.us for k in whole.kinds))
    assert sum(k.bytes for k in split.kinds) == sum(k.bytes for k in whole.kinds)
    assert split.launches == whole.launches and split.round_us == whole.round_us  # only the kinds divide it
    assert Ledger.of(rnd, graph, [records], copy_gbs=1000.0, inside={index: {}}).kinds == whole.kinds


def test_the_measured_ledger_keeps_a_step_launch_whole_when_its_stamped_run_fails(step_round, monkeypatch):
    from conjugate.evaluate import measured
    from conjugate.evaluate.evaluators import load_profile
    from conjugate.evaluate.session import EvaluationSession, RoundSetup

    from conjugate.compiler.step.compiled import CompiledStep

    rnd, graph = step_round
    assert isinstance(rnd.launches[0], CompiledStep)  # the draft's phase first
    session = EvaluationSession()
    monkeypatch.setattr(session, "device_rates", lambda device: {"copy_bandwidth_gbs": 1000.0})
    harness = measured.MeasuredHarness(load_profile("h200"), None, session)
    records = [KernelRecord(l.record_name, STREAM_IDS[l.stream], 100.0 * i, 100.0 * i + (50 if i == 0 else 1))
               for i, l in enumerate(rnd.launches)]  # the step launch (the first) the longest by far
    monkeypatch.setattr(measured, "kernel_records", lambda run, device, replays: [records] * replays)
    shares = {"embed": 0.05, "qkv": 0.25, "attn": 0.2, "o_proj": 0.1, "gate_up": 0.2, "down": 0.1, "head": 0.1}
    monkeypatch.setattr(measured, "step_shares", lambda compiled: {0: shares})
    condensed = harness.ledger(rnd, RoundSetup(None, graph, ()))
    split = {k.kind for k in condensed.kinds}
    assert {"draft step qkv", "draft step attn"} <= split and "draft step" not in split
    whole = Ledger.of(rnd, graph, [records], copy_gbs=1000.0)
    assert len(whole.kinds) + 6 > 8 + 7  # more kinds than are listed
    assert len(condensed.kinds) == 8 + 7  # the step's seven kinds leave room for 8 others

    def fails(compiled):
        raise ValueError("the step launch's ledger reads the GPU's timer: run it on a GPU")
    monkeypatch.setattr(measured, "step_shares", fails)
    assert "draft step" in {k.kind for k in harness.ledger(rnd, RoundSetup(None, graph, ())).kinds}

    def unsplittable(run, device, replays):
        raise LedgerError("7 kernel records for 3 replays: cannot split them per replay")
    monkeypatch.setattr(measured, "kernel_records", unsplittable)
    assert harness.ledger(rnd, RoundSetup(None, graph, ())) is None  # the round is timed all the same
