"""Persistent launches (plan `persist`): a model's launches of one layer or one decode step joined
into one launch whose parts run in sequence, a grid-wide barrier between them."""
from __future__ import annotations

from dataclasses import replace

import pytest

import conjugate  # noqa: F401  (selects the interpreter before triton is imported)
from conjugate.compiler import persist
from conjugate.compiler.codegen import persistent_source
from conjugate.errors import PlanError, ScheduleError
from conjugate.graph import build_graph
from conjugate.plan import load_plan, validate_plan
from conjugate.plan.expand import MAX_PERSISTENT_PARTS, check_dependencies, expand
from conjugate.roles import Model
from conjugate.workload import load_workload
from scripts import load_script  # tests/scripts.py
from test_round import ROOT, SMALL_TILES, _round

FUSED = ["attn_norm+qkv", "qkv+rope_kv", "mlp_norm+gate_up", "lm_head+argmax"]


def _streams(**fields) -> dict:
    plan = load_plan(ROOT / "plans" / "streams.json").to_dict()
    return plan | {"tiles": SMALL_TILES} | fields


def _persist(draft: str, target: str = "none", programs: int = 0) -> dict:
    return {"draft": {"span": draft, "programs": programs}, "target": {"span": target}}


def _layers(schedule, model: Model) -> list[tuple]:
    graph = build_graph(_round("llama").workload)
    return [tuple(sorted({(graph.nodes[o]["op"].step, graph.nodes[o]["op"].layer) for o in l.ops}))
            for l in schedule.launches if l.parts[0].model == model]


def test_layer_span_joins_each_layers_launches_and_nothing_across_layers():
    w = _round("llama").workload
    plain = expand(validate_plan(_streams()), w)
    joined = expand(validate_plan(_streams(persist=_persist("layer"))), w)
    assert [l.index for l in joined.launches] == list(range(len(joined.launches)))
    draft = [l for l in joined.launches if l.parts[0].model == Model.DRAFT]
    keys = _layers(joined, Model.DRAFT)
    assert all(len(keys[i]) == 1 for i, l in enumerate(draft) if l.persistent)  # one (step, layer) each
    layers = {key for key in _layers(plain, Model.DRAFT) for key in key}
    assert {keys[i][0] for i, l in enumerate(draft) if l.persistent} == {k for k in layers if k[1] is not None} | {
        (s, None) for s in range(w.k)}  # every layer, and each step's head (final norm, lm_head, argmax)
    assert not any(l.persistent for l in joined.launches if l.parts[0].model == Model.TARGET)
    first = next(l for l in joined.launches if l.persistent)
    assert first.part_launch == tuple((l.num_warps, l.num_stages) for l in plain.launches
                                      if l.ops[0] in first.ops)  # what a verdict times each part with
    assert sum(l.bytes for l in joined.launches) == sum(l.bytes for l in plain.launches)
    assert sorted(op for l in joined.launches for op in l.ops) == sorted(op for l in plain.launches for op in l.ops)


def test_step_span_joins_a_whole_decode_step():
    w = _round("llama").workload
    joined = expand(validate_plan(_streams(streams="one", persist=_persist("step", "step"))), w)
    draft = [l for l in joined.launches if l.parts[0].model == Model.DRAFT]
    target = [l for l in joined.launches if l.parts[0].model == Model.TARGET]
    assert len(draft) == w.k and all(l.persistent for l in draft)  # one launch per decode step
    assert len(target) == 1 and target[0].persistent


def test_a_step_of_a_real_model_is_too_many_parts_for_one_launch():
    """A persistent launch compiles every part inline: a real model's decode step (82 parts for
    llama-3.2-1b with the shipped fusions) is refused at expansion, naming the field, not left to
    compile for many minutes; its layers are not."""
    real = load_workload(ROOT / "examples" / "llama-1b-8b-b8.toml")
    plan = validate_plan(load_plan(ROOT / "benchmarks" / "variants" / "streams-persist-step.json").to_dict())
    with pytest.raises(ScheduleError) as caught:
        expand(plan, real)
    message = str(caught.value)
    assert message.startswith("$.persist.draft.span: 'step' joins 82 parts of this workload")
    assert f"at most {MAX_PERSISTENT_PARTS}" in message and "use span 'layer'" in message
    layered = validate_plan(plan.to_dict() | {"persist": _persist("layer")})
    assert max(len(l.parts) for l in expand(layered, real).launches) <= MAX_PERSISTENT_PARTS


def test_launches_shared_across_models_are_never_joined():
    w = _round("llama").workload
    plan = validate_plan(_streams(streams="one", alignment="greedy", pairs={"qkv": ["*"], "gate_up": ["*"]},
                                  persist=_persist("layer", "layer")))
    schedule = expand(plan, w)
    assert any(l.cross_model for l in schedule.launches)
    assert not any(l.cross_model and l.persistent for l in schedule.launches)
    check_dependencies(build_graph(w), schedule.launches)


def test_persistent_source_runs_parts_in_order_with_a_barrier_between():
    from conjugate.compiler.lower import lower_part
    from conjugate.compiler.buffers import PreparedWeights, RoundBuffers

    rnd = _round("llama")
    w, graph = rnd.workload, build_graph(rnd.workload)
    schedule = expand(validate_plan(_streams(persist=_persist("layer"))), w)
    launch = next(l for l in schedule.launches if l.persistent)
    bufs = RoundBuffers.allocate(w, PreparedWeights(rnd.draft), PreparedWeights(rnd.target))
    parts = [lower_part(p, graph, bufs) for p in launch.parts]
    text = persistent_source(parts)
    loops = [i for i, line in enumerate(text.splitlines()) if line.startswith("    while tile < ")]
    barriers = [i for i, line in enumerate(text.splitlines()) if "grid_barrier(sync," in line]
    assert len(loops) == len(parts) and len(barriers) == len(parts) - 1
    assert all(a < b < c for a, b, c in zip(loops, barriers, loops[1:]))
    assert text.rstrip().endswith(f"grid_exit(sync, {len(parts) - 1}, programs, {persist.BARRIER_GROUPS})")
    with pytest.raises(ValueError, match="one part or more"):
        persistent_source([])
    assert "prefetch" not in text  # not asked for (and the interpreter has no L2 to prefetch into)
    ahead = persistent_source(parts, prefetch=frozenset(range(len(parts)))).splitlines()
    calls = [i for i, line in enumerate(ahead) if "_prefetch(tile, " in line]
    families = [p.sig.fn for p in parts[1:] if p.sig.fn in ("gemm_tile", "attn_tile")]
    assert len(calls) == len(families) > 0  # one loop per GEMM or attention part after the first
    only = persistent_source(parts, prefetch=frozenset({1})).splitlines()
    assert sum("_prefetch(tile, " in line for line in only) == (parts[1].sig.fn in ("gemm_tile", "attn_tile"))
    barriers = [i for i, line in enumerate(ahead) if "grid_barrier(sync," in line]
    for call in calls:  # each just ahead of the barrier that precedes its part
        after = min(b for b in barriers if b > call)
        assert all("_tile(tile, " not in line for line in ahead[call:after])


@pytest.mark.parametrize("family,draft,target,fusions,streams",  # each family once, each case twice
                         [("llama", "layer", "none", FUSED, "two"), ("qwen2", "step", "layer", [], "one"),
                          ("qwen3", "layer", "none", FUSED, "two"), ("qwen3", "step", "layer", [], "one")])
def test_persistent_rounds_compute_the_reference_round(family, draft, target, fusions, streams, tmp_path):
    plan = validate_plan(_streams(persist=_persist(draft, target), fusions={"draft": fusions, "target": fusions},
                                  streams=streams))
    compiled, _ = _round(family).check(plan, tmp_path)
    persistent = [l for l in compiled.launches if l.sync is not None]
    assert persistent and all(l.grid == 1 for l in persistent)  # the interpreter runs one program
    assert all(int(l.sync.abs().sum()) == 0 for l in persistent)  # counters reset for the next launch


@pytest.mark.parametrize("value,error", [
    ({"draft": {"span": "block"}}, "$.persist.draft.span: \"block\" is not one of none, launch, layer, step"),
    ({"draft": {"span": "layer", "programs": 5000}}, "$.persist.draft.programs: 5000 is out of range [0, 1024]"),
    ({"draft": {"span": "layer", "programs": "all"}}, "$.persist.draft.programs: should be an integer"),
    ({"draft": "layer"}, "$.persist.draft: should be an object"),
    ({"draft": {"span": "layer", "prefetch": "yes"}}, "$.persist.draft.prefetch: should be a boolean"),
    ({"model": {}}, "$.persist.model: unknown key"),
])
def test_bad_persist_values_are_named(value, error):
    with pytest.raises(PlanError) as caught:
        validate_plan(_streams(persist=value))
    assert any(e.startswith(error) for e in caught.value.errors), caught.value.errors


def test_plans_without_persist_keep_their_hash():
    plain = validate_plan(_streams())
    spelled = validate_plan(_streams(persist=_persist("none")))
    assert plain.hash == spelled.hash
    assert validate_plan(_streams(persist=_persist("layer"))).hash != plain.hash


def test_the_heuristic_proposes_persistent_launches_as_valid_edits():
    from conjugate.agents.heuristic import persist_edits
    from conjugate.plan.patch import apply_patch

    plan = validate_plan(_streams())
    edits = persist_edits(plan, sms=132)
    applied = [validate_plan(apply_patch(plan.to_dict(), c.patch)) for c in edits]
    spans = {(p["persist"]["draft"]["span"], p["persist"]["target"]["span"]) for p in applied}
    assert spans == {("layer", "none"), ("step", "none"), ("none", "launch"), ("none", "layer"), ("none", "step")}
    best = max(edits, key=lambda c: c.score)
    assert best.patch[0]["path"] == "/persist/draft" and best.patch[0]["value"]["span"] == "layer"
    layered = applied[[c.patch[0]["value"]["span"] for c in edits].index("layer")]
    for c in persist_edits(layered, sms=132):  # never both models persistent on two streams
        validate_plan(apply_patch(layered.to_dict(), c.patch))
    grids = [c for c in persist_edits(layered, sms=132) if c.patch[0]["path"] == "/persist/draft/programs"]
    assert [c.patch[0]["value"] for c in grids] == [66, 132]
    half = validate_plan(apply_patch(layered.to_dict(), grids[0].patch))
    assert half["persist"]["draft"]["programs"] == 66
    back = [c.patch[0]["value"] for c in persist_edits(half, sms=132) if c.patch[0]["path"].endswith("/programs")]
    assert back == [0]  # as many as fit at once again
    load = next(c for c in persist_edits(layered, sms=132) if c.patch[0]["path"] == "/persist/draft/preload")
    loaded = validate_plan(apply_patch(layered.to_dict(), load.patch))
    assert load.patch[0]["value"] is True and loaded["persist"]["draft"]["preload"]
    for c in persist_edits(loaded, sms=132):  # leaving the barriers drops the preload too: every edit valid
        validate_plan(apply_patch(loaded.to_dict(), c.patch))
    assert any(c.patch[0]["path"] == "/persist/draft/preload" and c.patch[0]["value"] is False
               for c in persist_edits(loaded, sms=132))


def test_resident_programs_follow_registers_shared_memory_and_warps():
    from conjugate.compiler.persist import resident_programs

    assert resident_programs(32, 0, 4, 132) == 132 * 16  # 2048 threads / 128 a program
    assert resident_programs(128, 0, 4, 132) == 132 * 4  # 65536 registers / (128 x 128)
    assert resident_programs(100, 0, 4, 132) == resident_programs(104, 0, 4, 132)  # given in units of 8 a thread
    assert resident_programs(32, 100_000, 4, 132) == 132 * 2  # 228 KB of shared memory
    assert resident_programs(32, 0, 1, 132) == 132 * 32  # at most 32 programs an SM
    assert resident_programs(255, 240_000, 8, 132) == 0  # fits nowhere: never a grid
    # registers come per sub-partition (16384 each): CUDA's occupancy calculator's counts
    assert resident_programs(136, 0, 2, 1) == 6 and resident_programs(176, 0, 1, 1) == 8


def test_a_grid_larger_than_the_gpu_holds_at_once_is_refused(monkeypatch):
    from types import SimpleNamespace

    import torch

    from conjugate.compiler import round as rounds
    from conjugate.compiler.feedback import Resources
    from conjugate.errors import CompileError

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(multi_processor_count=132))
    schedule = expand(validate_plan(_streams(persist=_persist("layer", programs=600))), _round("llama").workload)
    planned = next(l for l in schedule.launches if l.persistent)
    tiles = [SimpleNamespace(programs=1000)]
    launch = SimpleNamespace(resources=Resources(128, 0, 0), num_warps=4, parts=tiles)
    with pytest.raises(CompileError, match="persist programs 600: the GPU holds 528 programs"):
        rounds.resident_grid(launch, planned, torch.device("cuda"))
    planned = replace(planned, programs=0)
    assert rounds.resident_grid(launch, planned, torch.device("cuda")) == 528
    launch.parts = [SimpleNamespace(programs=48)]
    assert rounds.resident_grid(launch, planned, torch.device("cuda")) == 48  # no more than its tiles
    loop = replace(planned, parts=planned.parts[:1], programs=600)  # a tile loop waits for no one: not refused
    launch.parts = tiles
    assert rounds.resident_grid(launch, loop, torch.device("cuda")) == 600


def test_a_persistent_launch_slower_than_its_parts_points_the_heuristic_back():
    """The H200's first persistent draft layer: 127.8 us against 84.7 us for its parts one by one."""
    from conjugate.agents.heuristic import persist_edits
    from conjugate.compiler.feedback import PartRef
    from conjugate.evaluate.result import Verdict

    plan = validate_plan(_streams(persist=_persist("layer")))
    parts = tuple(PartRef(Model.DRAFT, k, (f"d.s0.l0.{k}",), 64) for k in ("qkv", "attn", "o_proj", "gate_up", "down"))
    slow = Verdict.judge(1, parts, 127.8, (11.4, 14.4, 8.3, 32.9, 17.8), modeled=False)
    edits = persist_edits(plan, 132, (slow,))
    back = next(c for c in edits if c.patch[0]["path"] == "/persist/draft" and c.patch[0]["value"]["span"] == "none")
    assert back.score == max(c.score for c in edits)
    assert "persistent launch 1 took 127.8 us against 84.8 for its parts" in back.rationale
    gaining = Verdict.judge(1, parts, 70.0, (11.4, 14.4, 8.3, 32.9, 17.8), modeled=False)
    step = next(c for c in persist_edits(plan, 132, (gaining,)) if c.patch[0]["value"] == {
        "span": "step", "order": "grid", "programs": 0, "prefetch": True, "preload": False})
    assert step.score > 0.5 and "gained +17.5%" in step.rationale


def test_only_parts_that_fit_half_the_l2_cache_are_prefetched():
    """llama-3.2-1b at batch 8: qkv (12.6 MB), attention and o_proj are; gate_up (67 MB) and down
    (34 MB) would evict the part still running from a 50 MB L2."""
    import torch

    from conjugate.compiler.round import prefetched_parts
    from conjugate.workload import load_workload

    w = load_workload(ROOT / "examples" / "llama-1b-8b-b8.toml")
    schedule = expand(validate_plan(_streams(persist=_persist("layer"),
                                             fusions={"draft": FUSED, "target": []})), w)
    layer = next(l for l in schedule.launches if l.persistent and any(".l0." in op for op in l.ops))
    kinds = [p.kind for p in layer.parts]
    chosen = {kinds[i] for i in prefetched_parts(layer, build_graph(w), torch.device("cpu"))}
    assert chosen == {"qkv", "attn", "o_proj"}, kinds
    assert prefetched_parts(replace(layer, prefetch=False), build_graph(w), torch.device("cpu")) == frozenset()


def test_both_models_persistent_on_two_streams_is_refused():
    with pytest.raises(PlanError) as caught:
        validate_plan(_streams(persist=_persist("layer", "layer")))
    assert caught.value.errors[0].startswith("$.persist: both models persistent with barriers on two streams")
    one_stream = validate_plan(_streams(streams="one", persist=_persist("layer", "layer")))
    assert one_stream["persist"]["target"]["span"] == "layer"


def test_the_persist_layer_benchmark_builds_the_plans_it_compares():
    """benchmarks/persist_layer.py (GPU only): its plans differ from each other only where it says."""
    bench = load_script("persist_layer")
    separate, joined = bench.persist_plan(8, True, persist=False), bench.persist_plan(8, True)
    plain = bench.persist_plan(8, False)
    assert separate["persist"]["draft"]["span"] == "none" and joined["persist"]["draft"]["span"] == "layer"
    assert joined["persist"]["draft"]["prefetch"] and not plain["persist"]["draft"]["prefetch"]
    assert {k for k in joined.data if joined[k] != separate[k]} == {"name", "persist"}
    assert joined["launch"]["num_warps"] == 8
    w = _round("llama").workload
    assert any(l.persistent for l in expand(joined, w).launches)
    assert not any(l.persistent for l in expand(separate, w).launches)


def test_a_persistent_launchs_parts_each_fill_the_grid_alone():
    """Side by side, a shared launch's parts fill it together; in sequence, each part alone."""
    from conjugate.agents.heuristic_edits import fill_by_kind
    from conjugate.compiler.feedback import PartRef

    persistent = (PartRef(Model.TARGET, "qkv", ("t.l0.qkv",), 48), PartRef(Model.TARGET, "down", ("t.l0.down",), 256))
    shared = (PartRef(Model.TARGET, "o_proj", ("t.l0.o_proj",), 64), PartRef(Model.DRAFT, "qkv", ("d.s0.l0.qkv",), 40))
    assert fill_by_kind({0: persistent, 1: shared}) == {"qkv": 48, "down": 256, "o_proj": 104}


def test_a_pinned_draft_op_splits_its_layer_around_the_shared_launch(tmp_path):
    """A mixed plan (two streams, one draft op pinned into a target launch): the draft layer holding
    it is joined before and after the shared launch, the streams wait on each other around it, and
    the round still computes the reference (launches one by one, no graph)."""
    rnd = _round("llama")
    plan = validate_plan(_streams(persist=_persist("layer"), capture="none",
                                  overrides=[{"match": "t.l1.qkv", "with": "d.s1.l0.o_proj"}]))
    launches = expand(plan, rnd.workload).launches
    shared = next(l for l in launches if l.cross_model)
    before, after = (next(l for l in launches if l.persistent and op in l.ops)
                     for op in ("d.s1.l0.attn", "d.s1.l0.down"))
    assert before.index < shared.index < after.index and "d.s1.l0.o_proj" in shared.ops
    compiled, _ = rnd.check(plan, tmp_path)
    assert compiled.waits[shared.index] == (before.index,) and compiled.waits[after.index] == (shared.index,)


def test_each_prefetch_function_takes_its_tile_functions_arguments():
    """The generated kernel calls a part's prefetch function with the tile function's argument list."""
    import importlib

    from conjugate.compiler import attention, gemm, mlp
    from conjugate.compiler.persist import PREFETCHES
    from conjugate.compiler.tile import TileSignature

    tiles = {"gemm_tile": gemm.gemm_tile, "attn_tile": attention.attn_tile, "mlp_tile": mlp.mlp_tile}
    assert set(PREFETCHES) == set(tiles)
    for tile, (module, fn) in PREFETCHES.items():
        prefetch = getattr(importlib.import_module(module), fn)
        ours, theirs = TileSignature.of(prefetch), TileSignature.of(tiles[tile])
        assert (ours.args, ours.constexprs) == (theirs.args, theirs.constexprs), tile


def test_the_persist_check_benchmark_names_where_two_rounds_differ(tmp_path):
    """benchmarks/persist_check.py (GPU only): its report of two rounds' outputs names the fields,
    the number of elements, the largest difference, and a cache's layers and positions."""
    bench = load_script("persist_check")
    _, out = _round("llama").check(validate_plan(_streams()), tmp_path)
    same = replace(out, draft_cache=type(out.draft_cache)(out.draft_cache.k.clone(), out.draft_cache.v.clone()))
    assert bench.differences(same, out) == {}
    same.draft_cache.k[1, 0, 0, 6, 3] += 0.5
    found = bench.differences(same, out)
    assert set(found) == {"draft_cache_k"}
    assert found["draft_cache_k"]["elements"] == 1 and found["draft_cache_k"]["max_abs"] == pytest.approx(0.5)
    assert found["draft_cache_k"]["layers"] == [1] and found["draft_cache_k"]["positions"] == [6]


@pytest.mark.parametrize("groups", [1, 8])
def test_flat_and_two_level_barriers_compute_the_reference_and_leave_their_words_zeroed(groups, monkeypatch, tmp_path):
    """The barrier's kind (persist.BARRIER_GROUPS) is in the generated kernel, its sync buffer sized to
    match (persist.sync_words: a 128-byte line per counter and flag), and the last program out zeroes it."""
    monkeypatch.setattr(persist, "BARRIER_GROUPS", groups)
    plan = validate_plan(_streams(persist=_persist("layer"), fusions={"draft": FUSED, "target": FUSED}))
    compiled, _ = _round("llama").check(plan, tmp_path)
    persistent = [l for l in compiled.launches if l.sync is not None]
    assert persistent
    for launch in persistent:
        barriers = len(launch.parts) - 1
        assert launch.sync.numel() == persist.sync_words(barriers, groups) == (barriers * (groups + 2) + 1) * 32
        assert int(launch.sync.abs().sum()) == 0
    text = persistent_source(persistent[0].parts)
    assert f"grid_barrier(sync, 0, programs, {groups})" in text
    assert f"grid_exit(sync, {len(persistent[0].parts) - 1}, programs, {groups})" in text


def test_the_barrier_cost_benchmarks_kernel_passes_its_barriers_and_resets_them():
    """benchmarks/barrier_cost.py (GPU only): its kernel of barriers alone, here on one program."""
    import torch

    bench = load_script("barrier_cost")
    for groups in (1, 4):
        sync = torch.zeros(persist.sync_words(3, groups), dtype=torch.int32)
        bench.barriers[(1,)](sync, 3, GROUPS=groups)
        assert sync.numel() == (3 * (groups + 2) + 1) * 32 and int(sync.abs().sum()) == 0



def test_span_launch_makes_each_of_a_models_own_launches_a_tile_loop():
    """Span `launch` joins nothing: each target launch of its own becomes a one-part persistent launch
    (a tile loop on the plan's grid, no barrier, no sync buffer); shared launches stay as they were."""
    rnd = _round("llama")
    base = load_plan(ROOT / "plans" / "interleave.json").to_dict() | {"tiles": SMALL_TILES}
    plain, looped = (expand(validate_plan(base | {"persist": _persist("none", span)}), rnd.workload)
                     for span in ("none", "launch"))
    assert len(plain.launches) == len(looped.launches)
    for a, b in zip(plain.launches, looped.launches):
        assert a.ops == b.ops and a.parts == b.parts
        own_target = not a.cross_model and a.parts[0].model == Model.TARGET
        assert b.persistent == own_target and not a.persistent
        if own_target:
            assert b.part_launch == ((a.num_warps, a.num_stages),) and not b.prefetch
    assert any(l.cross_model for l in looped.launches)  # interleave shares some: they are left alone
    source = persistent_source([_lowered_part(rnd)])
    assert "grid_barrier" not in source and "grid_exit" not in source and "sync" not in source
    assert "    while tile < " in source and "tile += programs" in source


def _lowered_part(rnd):
    from conjugate.compiler.buffers import PreparedWeights, RoundBuffers
    from conjugate.compiler.lower import lower_part

    w = rnd.workload
    schedule = expand(validate_plan(_streams(persist=_persist("none", "launch"))), w)
    bufs = RoundBuffers.allocate(w, PreparedWeights(rnd.draft), PreparedWeights(rnd.target))
    launch = next(l for l in schedule.launches if l.persistent)
    return lower_part(launch.parts[0], build_graph(w), bufs)


@pytest.mark.parametrize("draft,target", [("launch", "launch"), ("layer", "launch"), ("none", "launch")])
def test_tile_loops_beside_persistent_or_plain_launches_compute_the_reference_round(draft, target, tmp_path):
    """On two streams a tile loop waits for no one, so either model may have one beside the other's
    persistent layers; the round is the reference round (one program under the interpreter)."""
    plan = validate_plan(_streams(persist={"draft": {"span": draft}, "target": {"span": target, "programs": 99}}))
    compiled, _ = _round("qwen3").check(plan, tmp_path)
    loops = [l for l in compiled.launches if l.persistent and len(l.parts) == 1]
    assert loops and all(l.sync is None and l.grid == 1 for l in loops)
    assert plan["persist"]["target"]["programs"] == 99


def test_a_tile_loops_grid_counts_in_the_analytical_model():
    """A tile loop on fewer programs than its tiles fills less of the GPU: modeled no faster than the launch."""
    from conjugate.evaluate.analytical import AnalyticalModel, PartCost
    from conjugate.evaluate.evaluators import load_profile

    model = AnalyticalModel(load_profile("analytical").model)
    part = PartCost("gemm", 8_000_000, 0, 512)
    w = _round("llama").workload
    loop = next(l for l in expand(validate_plan(_streams(persist=_persist("none", "launch"))), w).launches
                if l.persistent)
    capped = replace(loop, programs=16)
    assert model.estimate(capped, [part]).us > model.estimate(replace(loop, programs=0), [part]).us


def test_a_barrier_needs_at_least_one_group():
    with pytest.raises(ValueError, match="barrier groups 0: at least 1"):
        persist.sync_words(3, 0)


def test_target_tile_loops_take_the_slack_the_ledger_gives_the_target():
    """Where the draft's stream is the busier one, the target's tile loops run on the SMs in proportion
    to the two streams' busy times (the target has that much slack to give); otherwise on three quarters
    of the SMs. Ranked low either way: on the H200 they made the round slower (results/knobs_h200.json)."""
    from conjugate.agents.heuristic import persist_edits
    from conjugate.evaluate.result import LedgerSummary
    from conjugate.plan.patch import apply_patch

    plan = validate_plan(_streams())

    def loops(draft_ms: float, target_ms: float):
        ledger = LedgerSummary(9.0, 5.7, 0.2, False, {"draft": draft_ms, "target": target_ms}, ())
        return next(c for c in persist_edits(plan, 132, (), ledger) if c.patch[0]["value"].get("span") == "launch")

    critical = loops(8.3, 6.0)  # qwen3-06b-8b-b4's best plan on the H200
    assert critical.patch[0]["value"]["programs"] == round(132 * 6.0 / 8.3) == 95
    assert "target has 28% to spare" in critical.rationale
    others = [c for c in persist_edits(plan, 132) if c.patch[0]["value"].get("span") != "launch"]
    assert critical.score < min(c.score for c in others)  # measured slower: tried after every other span
    balanced = loops(7.04, 6.90)
    assert balanced.patch[0]["value"]["programs"] == 99 and balanced.score == critical.score
    for busier_target in (loops(5.0, 9.0), next(c for c in persist_edits(plan, 132)
                                                if c.patch[0]["value"].get("span") == "launch")):
        assert busier_target.patch[0]["value"]["programs"] == 99 and "spare" not in busier_target.rationale
    assert loops(9.0, 1.0).patch[0]["value"]["programs"] == 33  # a quarter at least
    looped = validate_plan(apply_patch(plan.to_dict(), critical.patch))
    ledger = LedgerSummary(9.0, 5.7, 0.2, False, {"draft": 8.3, "target": 5.0}, ())  # the loops' own ledger
    grids = [c.patch[0]["value"] for c in persist_edits(looped, 132, (), ledger)
             if c.patch[0]["path"] == "/persist/target/programs"]
    assert grids == [66, 80, 132]  # half, the slack the new ledger gives, all


@pytest.mark.parametrize("family,groups", [("llama", 1), ("qwen2", 8), ("qwen3", 1)])  # each family, each barrier
def test_gemm_parts_that_preload_wait_for_the_barrier_in_their_tiles_and_compute_the_reference(
        family, groups, monkeypatch, tmp_path):
    """persist.preload: after its tiles of a part a program arrives at the barrier, and each GEMM tile of
    the next part loads its first weight step, then waits for that barrier itself (WAIT_GRID, the
    barrier's word and target bound in the generated call); parts that cannot preload keep the whole
    barrier. The round equals the reference, every barrier word back to zero."""
    monkeypatch.setattr(persist, "BARRIER_GROUPS", groups)
    plan = validate_plan(_streams(persist={"draft": {"span": "layer", "preload": True}},
                                  fusions={"draft": FUSED, "target": FUSED}))
    compiled, _ = _round(family).check(plan, tmp_path)
    joined = [l for l in compiled.launches if l.sync is not None]
    assert joined and all(int(l.sync.abs().sum()) == 0 for l in joined)
    launch = joined[0]
    waiting = [i for i, p in enumerate(launch.parts) if p.constexprs.get("WAIT") == 3]
    assert waiting and 0 not in waiting and all(launch.parts[i].constexprs["PRELOAD_K"] >= 16 for i in waiting)
    text = persistent_source(launch.parts).splitlines()
    for i in waiting:  # arrive after the part before, the tiles bound to its barrier, no whole barrier there
        assert f"    grid_arrive(sync, {i - 1}, programs, {groups})" in text
        assert f"    grid_barrier(sync, {i - 1}, programs, {groups})" not in text
        call = next(line for line in text if line.startswith(f"        gemm_tile(tile, p{i}_"))
        assert f"barrier_word(sync, {i - 1}, {groups}), barrier_target(programs, {groups})" in call
    kept = [i for i in range(1, len(launch.parts)) if i not in waiting]
    assert kept and all(f"    grid_barrier(sync, {i - 1}, programs, {groups})" in text for i in kept)


def test_persist_preload_needs_barriers_and_keeps_older_plans_hashes():
    plain = validate_plan(_streams(persist=_persist("layer")))
    assert validate_plan(_streams(persist={"draft": {"span": "layer", "preload": False}})).hash == plain.hash
    loaded = validate_plan(_streams(persist={"draft": {"span": "layer", "preload": True}}))
    assert loaded.hash != plain.hash and loaded["persist"]["draft"]["preload"]
    for span in ("none", "launch"):
        with pytest.raises(PlanError) as caught:
            validate_plan(_streams(persist={"draft": {"span": span, "preload": True}}))
        assert caught.value.errors == [f"$.persist.draft.preload: loads a part's first weights before the grid "
                                       f"barrier ahead of it, so it needs $.persist.draft.span 'layer' or 'step', "
                                       f"not {span!r}"]
    with pytest.raises(PlanError, match=r"\$\.persist\.draft\.preload: should be a boolean"):
        validate_plan(_streams(persist={"draft": {"span": "layer", "preload": "yes"}}))
    launches = expand(loaded, _round("llama").workload).launches
    assert {l.preload for l in launches if l.persistent} == {True} and not any(l.preload for l in launches
                                                                               if not l.persistent)
    with pytest.raises(ValueError, match="first part has no barrier before it"):
        from conjugate.compiler.gemm import preload_before_barrier
        from conjugate.compiler.lower import lower_part
        from conjugate.compiler.buffers import PreparedWeights, RoundBuffers
        rnd = _round("llama")
        launch = next(l for l in launches if l.persistent)
        bufs = RoundBuffers.allocate(rnd.workload, PreparedWeights(rnd.draft), PreparedWeights(rnd.target))
        parts = [lower_part(p, build_graph(rnd.workload), bufs) for p in launch.parts]
        first = next(p for p in parts if p.sig.fn == "gemm_tile")
        assert preload_before_barrier(first, 4)
        persistent_source([first] + parts)
