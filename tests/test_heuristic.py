"""The heuristic proposer: deterministic, valid and new edits, driven by the node's result.
Results here are built from the plan's expansion (no compile): feedback per launch with its parts
and program counts, and verdicts for chosen shared launches."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from conjugate.agents.base import EDIT_KINDS, NodeContext
from conjugate.agents.heuristic import HeuristicProposer
from conjugate.compiler.feedback import CompileFailure, LaunchFeedback, PartRef, Resources
from conjugate.errors import ScheduleError
from conjugate.evaluate.result import EvalResult, Metrics, Stage, Status, Verdict, VerdictKind
from conjugate.plan import Plan, apply_patch, expand, load_plan, patch_plan, validate_plan
from conjugate.workload import load_workload

ROOT = Path(__file__).resolve().parents[1]
TINY = load_workload(ROOT / "examples" / "tiny.toml")
PLANS = {name: load_plan(ROOT / "plans" / f"{name}.json") for name in ("sequential", "streams", "interleave")}


def _context(plan: Plan, result: EvalResult | None = None, tried: list | None = None,
             stats: dict | None = None, sms: int = 132) -> NodeContext:
    return NodeContext(plan=plan.to_dict(), plan_hash=plan.hash, workload={**TINY.to_dict(), "name": TINY.name},
                       evaluator="analytical", device="NVIDIA H200", sms=sms, result=result, tried=tried or [],
                       edit_stats=stats or {})


def _parts(plan: Plan, index: int, programs: int | None = None) -> tuple[PartRef, ...]:
    return tuple(PartRef.of(p, programs) for p in expand(plan, TINY).launches[index].parts)


def _result(plan: Plan, status: Status, stage: Stage, **fields) -> EvalResult:
    return EvalResult(plan.hash, TINY.name, "analytical", stage, status, True, **fields)


def _ok_result(plan: Plan, verdicts: dict[int, tuple[str, float]] | None = None, programs: int = 200) -> EvalResult:
    """An ok result: feedback for every launch, verdicts for the given shared launches."""
    launches = expand(plan, TINY).launches
    feedback = tuple(LaunchFeedback(l.index, f"k_{l.index}.py", tuple(PartRef.of(p, programs) for p in l.parts))
                     for l in launches)
    verdicts = tuple(Verdict(i, VerdictKind(v), 10.0, 10.0 * (1 + g / 100), g, feedback[i].parts, True)
                     for i, (v, g) in (verdicts or {}).items())
    metrics = Metrics(latency_ms=1.0, floor_ms=0.5, floor_ratio=2.0, bandwidth_gbs=100.0, launches=len(launches),
                      device="NVIDIA H200", sms=132)
    return _result(plan, Status.OK, Stage.TIMING, metrics=metrics, verdicts=verdicts, feedback=feedback)


def _shared(plan: Plan, target_kind: str):
    return next(l for l in expand(plan, TINY).launches if l.cross_model and l.parts[0].kind == target_kind)


def test_deterministic_for_a_seed_and_context():
    ctx = _context(PLANS["interleave"])
    first = HeuristicProposer(seed=1).propose(ctx, 6)
    assert first == HeuristicProposer(seed=1).propose(ctx, 6)
    others = [HeuristicProposer(seed=s).propose(ctx, 12) for s in range(2, 8)]
    assert any(o != HeuristicProposer(seed=1).propose(ctx, 12) for o in others)


@pytest.mark.parametrize("name", sorted(PLANS))
def test_proposals_apply_validate_and_are_new(name):
    plan = PLANS[name]
    proposer = HeuristicProposer(seed=0)
    first = proposer.propose(_context(plan), 4)
    tried = [{"patch": p.patch, "kind": p.kind, "status": "ok", "reward": 1.0} for p in first]
    props = proposer.propose(_context(plan, tried=tried), 6)
    assert len(props) == 6
    tried_hashes = {patch_plan(plan, t["patch"]).hash for t in tried}
    hashes = set()
    for p in props:
        new = validate_plan(apply_patch(plan.to_dict(), p.patch))  # plain RFC 6902 on the canonical plan
        assert new.hash != plan.hash and new.hash not in tried_hashes and new.hash not in hashes
        hashes.add(new.hash)
        assert p.kind in EDIT_KINDS and 0 < p.prior <= 1 and "\n" not in p.rationale and p.rationale
        assert all(op["op"] in ("add", "replace", "remove") for op in p.patch)


@pytest.mark.parametrize("n", [0, 1, 3, 6, 10])
def test_n_is_respected(n):
    for plan in PLANS.values():
        props = HeuristicProposer().propose(_context(plan, _ok_result(plan)), n)
        assert len(props) == n


def test_interference_leads_to_a_split_first():
    plan = PLANS["interleave"]
    launch = _shared(plan, "down")
    target, draft = launch.parts[0], launch.parts[1]
    result = _ok_result(plan, {launch.index: ("interference", -8.1)})
    props = HeuristicProposer().propose(_context(plan, result), 6)
    splits = [p for p in props[:3] if p.kind == "cross"]
    assert splits, [p.rationale for p in props]
    for p in splits:  # each one takes this draft kind out of the target op's launch
        after = expand(patch_plan(plan, p.patch), TINY).launches
        holder = next(l for l in after if target.ops[0] in l.ops)
        assert all(part.kind != draft.kind for part in holder.parts[1:])
    assert "interferes" in props[0].rationale and "-8.1%" in props[0].rationale


def test_repeated_interference_of_a_kind_pair_drops_the_pair():
    plan = PLANS["interleave"]
    shared = [l for l in expand(plan, TINY).launches if l.cross_model and l.parts[0].kind == "down"
              and l.parts[1].kind == "rope_kv"]
    assert len(shared) >= 2
    result = _ok_result(plan, {l.index: ("interference", -5.0 - l.index) for l in shared})
    first = HeuristicProposer().propose(_context(plan, result), 3)[0]
    assert first.kind == "cross" and f"{len(shared)} launches" in first.rationale
    assert "rope_kv" not in patch_plan(plan, first.patch)["cross"]["pairs"]["down"]


def test_gain_extends_pairing_to_similar_kinds():
    plan = PLANS["interleave"]
    launch = _shared(plan, "down")
    result = _ok_result(plan, {launch.index: ("gain", 12.0)})
    props = HeuristicProposer().propose(_context(plan, result), 6)
    assert props[0].kind == "cross" and "gains" in props[0].rationale
    assert any(op["path"].startswith("/cross/pairs/") for op in props[0].patch)


def test_idle_target_launches_get_draft_work():
    plan = PLANS["sequential"]
    props = HeuristicProposer().propose(_context(plan, _ok_result(plan, programs=40)), 6)
    assert props[0].kind == "cross" and "40 of 132 SMs" in props[0].rationale
    new = patch_plan(plan, props[0].patch)
    assert new["cross"]["alignment"] != "sequential" and any(l.cross_model for l in expand(new, TINY).launches)


def test_idle_means_fewer_programs_than_the_gpu_has_sms():
    plan, result = PLANS["sequential"], _ok_result(PLANS["sequential"], programs=200)
    assert not any("SMs" in p.rationale for p in HeuristicProposer().propose(_context(plan, result), 6))
    props = HeuristicProposer().propose(_context(plan, result, sms=264), 6)
    assert props[0].kind == "cross" and "200 of 264 SMs" in props[0].rationale


@pytest.mark.parametrize("status, reason", [
    ("compile_error", "tiles need at least 260 KB of shared memory with num_stages=3; the GPU gives a program 227 KB"),
    ("compile_error", "triton OutOfResources: out of resource: shared memory, Required: 262144"),
])
def test_shared_memory_error_leads_to_smaller_tiles(status, reason):
    plan = PLANS["interleave"]
    launch = _shared(plan, "gate_up")
    failure = CompileFailure(launch.index, 0, _parts(plan, launch.index), reason)
    result = _result(plan, Status(status), Stage.COMPILE, compile_failure=failure, error=failure.message)
    props = HeuristicProposer().propose(_context(plan, result), 6)
    first = props[0]
    assert first.kind == "tiles" and "target gate_up" in first.rationale
    before, after = plan["target"]["tiles"]["gate_up"], patch_plan(plan, first.patch)["target"]["tiles"]["gate_up"]
    assert any(after[k] < before.get(k, 99) for k in after)


def test_register_spills_lead_to_smaller_tiles():
    plan = PLANS["interleave"]
    result = _ok_result(plan)
    spilled = Resources(registers=255, spills=96, shared_bytes=65536)
    feedback = tuple(replace(f, resources=spilled) if f.parts[0].ops[0] == "t.l1.down" else f for f in result.feedback)
    assert feedback != result.feedback
    props = HeuristicProposer().propose(_context(plan, replace(result, feedback=feedback)), 6)
    assert props[0].kind == "tiles" and "spills 96 registers" in props[0].rationale
    assert patch_plan(plan, props[0].patch)["target"]["tiles"]["down"]["BLOCK_K"] == 64


def test_an_edit_named_by_many_launches_ranks_once():
    """Spills in every target down launch (one part each) name one repair per launch, all the same edit: the
    proposals, their order and priors, are those of a single spilling launch."""
    plan = PLANS["sequential"]
    result = _ok_result(plan)
    spilled = Resources(registers=255, spills=96, shared_bytes=65536)
    downs = [f.launch for f in result.feedback if f.parts[0].ops[0].startswith("t.") and f.parts[0].kind == "down"]
    assert len(downs) > 1

    def spilling(launches):
        feedback = tuple(replace(f, resources=spilled) if f.launch in launches else f for f in result.feedback)
        return HeuristicProposer().propose(_context(plan, replace(result, feedback=feedback)), 12)

    one, every = spilling(downs[:1]), spilling(downs)
    assert [(p.patch, p.prior) for p in every] == [(p.patch, p.prior) for p in one]
    assert len({str(p.patch) for p in every}) == len(every)


def test_incorrect_packed_round_goes_back_to_separate_operands():
    plan = patch_plan(PLANS["interleave"], [{"op": "replace", "path": "/cross/operand_layout", "value": "packed"}])
    result = _result(plan, Status.INCORRECT, Stage.CORRECTNESS, error="logits differ at d.s1.l0.qkv")
    props = HeuristicProposer().propose(_context(plan, result), 4)
    assert props[0].kind == "cross" and patch_plan(plan, props[0].patch)["cross"]["operand_layout"] == "separate"


def test_a_plan_error_naming_an_override_removes_it():
    plan = patch_plan(PLANS["interleave"], [{"op": "add", "path": "/cross/overrides/-",
                                             "value": {"match": "t.l0.qkv", "pair": False}}])
    errors = (f"$.cross.overrides[{len(plan['cross']['overrides']) - 1}].with: 'd.s9.l0.qkv' is not a draft op of this workload",)
    result = _result(plan, Status.INVALID, Stage.VALIDATE, plan_errors=errors, error=errors[0])
    first = HeuristicProposer().propose(_context(plan, result), 3)[0]
    last = len(plan["cross"]["overrides"]) - 1
    assert first.kind == "cross" and first.patch == [{"op": "remove", "path": f"/cross/overrides/{last}"}]


def test_edit_stats_reorder_kinds():
    plan = PLANS["interleave"]
    plain = [p.kind for p in HeuristicProposer().propose(_context(plan), 6)]
    stats = {"cross": {"n": 30, "mean_gain": 0.05}, "fusions": {"n": 30, "mean_gain": -0.04}}
    biased = HeuristicProposer().propose(_context(plan, stats=stats), 6)
    assert plain[0] != "pattern" and biased[0].kind == "cross"
    assert [p.kind for p in biased].index("cross") < plain.index("cross")
    assert "fusions" not in [p.kind for p in biased[:3]] and plain[0] == "fusions"
    assert biased[0].prior >= max(p.prior for p in biased[1:])


@pytest.mark.parametrize("name", sorted(PLANS))
def test_shipped_plans_give_at_least_n(name):
    plan = PLANS[name]
    for result in (None, _ok_result(plan)):
        assert len(HeuristicProposer().propose(_context(plan, result), 6)) >= 6


def test_most_proposals_expand():
    """Proposals validate by construction; expansion may still fail (the evaluator reports that
    as invalid), but for rule-level edits it rarely does."""
    total = expanded = 0
    for plan in PLANS.values():
        for seed in range(3):
            for p in HeuristicProposer(seed).propose(_context(plan, _ok_result(plan)), 10):
                total += 1
                try:
                    expand(patch_plan(plan, p.patch), TINY)
                    expanded += 1
                except ScheduleError:
                    pass
    assert expanded >= 0.8 * total


def test_an_invalid_node_plan_gives_nothing():
    ctx = NodeContext(plan={"schema": "nope"}, plan_hash="x", workload={}, evaluator="analytical", device="", sms=1)
    assert HeuristicProposer().propose(ctx, 3) == []


def test_a_two_stream_plan_keeps_its_streams_first():
    plan = PLANS["streams"]
    proposals = HeuristicProposer(seed=0).propose(_context(plan, _ok_result(plan)), 6)
    new_plans = [patch_plan(plan, p.patch) for p in proposals]
    assert all(p["cross"]["streams"] == "two" for p in new_plans[:4]), [p.rationale for p in proposals]
    # the families every best plan measured holds first (facts.toml), a tile move among the next
    assert {p.kind for p in proposals[:3]} == {"fusions", "reduce", "pdl"} and "tiles" in {p.kind for p in proposals[3:6]}
    assert any("verify stream" in p.rationale for p in proposals if p.kind == "tiles")
    # the one-stream sequential plan still goes for shared launches first
    first = HeuristicProposer(seed=0).propose(_context(PLANS["sequential"], _ok_result(PLANS["sequential"])), 1)[0]
    assert first.kind == "cross"


@pytest.mark.parametrize("start", range(6))
def test_tile_moves_that_add_programs_come_first_when_wanted(start):
    from conjugate.agents.heuristic.tiles import tile_moves

    plan = PLANS["streams"]
    moves = tile_moves(plan, "target", "down", "why", 0.5, True, start)
    adds = ["SPLIT_K 4 -> 8" in m.rationale or "BLOCK_N 64 -> 32" in m.rationale for m in moves]
    assert adds[0] and adds == sorted(adds, reverse=True)  # every move that adds programs before the rest
    assert [m.score for m in moves] == sorted((m.score for m in moves), reverse=True)
    assert len({m.rationale for m in moves}) == len(moves)


def test_a_launch_that_loses_to_two_streams_is_split():
    """Beating its parts back to back is not enough: a shared launch slower than its parts overlapped
    on two streams gets the override that keeps its draft part out."""
    plan = PLANS["interleave"]
    result = _ok_result(plan)
    launch = next(l for l in expand(plan, TINY).launches if l.cross_model)
    parts = result.feedback[launch.index].parts
    losing = Verdict.judge(launch.index, parts, 9.0, (6.0, 4.0), modeled=True, overlap_us=7.0)
    assert losing.verdict is VerdictKind.GAIN and losing.overlap_verdict is VerdictKind.INTERFERENCE
    proposals = HeuristicProposer().propose(_context(plan, replace(result, verdicts=(losing,))), 40)
    split = [p for p in proposals if "loses to them on two streams" in p.rationale]
    target = next(p for p in parts if p.model.value == "target")
    assert split and split[0].kind == "cross" and target.op in split[0].rationale
    assert patch_plan(plan, split[0].patch)["cross"]["overrides"][-1] == {"match": target.op, "pair": False}
    winning = Verdict.judge(launch.index, parts, 6.5, (6.0, 4.0), modeled=True, overlap_us=7.0)
    again = HeuristicProposer().propose(_context(plan, replace(result, verdicts=(winning,))), 40)
    assert not any("loses to them on two streams" in p.rationale for p in again)


def test_mixed_plans_pin_where_both_phases_meet_and_follow_their_verdicts():
    """From two streams: pin a draft op into the target launch at the same point of its phase;
    a pin whose launch beat its parts on two streams earns more of its pair, one that lost is undone."""
    from conjugate.agents.heuristic.cross import mixed_edits

    plan, workload = PLANS["streams"], TINY.to_dict()  # 3 target layers, 2 draft layers, k 3
    fresh = mixed_edits(plan, (), workload)
    assert fresh and all(c.kind == "cross" and c.score == 0.3 for c in fresh)
    assert fresh[0].patch == [{"op": "add", "path": "/cross/overrides/-", "value": {"match": "t.l1.o_proj",
                                                                            "with": "d.s1.l1.down"}}]
    for c in fresh:  # each a valid mixed plan
        assert any(l.cross_model for l in expand(patch_plan(plan, c.patch), TINY).launches)
    pinned = patch_plan(plan, fresh[0].patch)
    shared = next(l for l in expand(pinned, TINY).launches if l.cross_model)
    parts = tuple(PartRef.of(p, 8) for p in shared.parts)
    won = Verdict.judge(shared.index, parts, 9.0, (8.0, 4.0), modeled=True, overlap_us=10.0)
    more = mixed_edits(pinned, (won,), workload)
    assert [c.score for c in more[:2]] == [0.55, 0.55] and "beat two streams" in more[0].rationale
    assert all(c.patch[0]["value"]["with"] != "d.s1.l1.down" for c in more)  # not the op pinned already
    for c in more:  # every proposal schedules: no pin crosses one made already
        expand(patch_plan(pinned, c.patch), TINY)
    crossed = patch_plan(plan, [{"op": "add", "path": "/cross/overrides/-",
                                 "value": {"match": "t.l1.o_proj", "with": "d.s1.l1.attn"}}])
    for c in mixed_edits(crossed, (), workload):  # e.g. not t.l1.qkv <- d.s1.l1.down, after that attn
        expand(patch_plan(crossed, c.patch), TINY)
    lost = Verdict.judge(shared.index, parts, 9.0, (8.0, 4.0), modeled=True, overlap_us=8.5)
    undo = [c for c in mixed_edits(pinned, (lost,), workload) if c.patch[0]["op"] == "remove"]
    assert undo and patch_plan(pinned, undo[0].patch).hash == plan.hash and undo[0].score == 0.7
    assert mixed_edits(PLANS["interleave"], (), workload) == []  # one stream: nothing to mix


def test_fusions_a_model_lacks_are_offered_together_first():
    from conjugate.plan.schema import FUSIONS

    plan = PLANS["streams"]
    fusions = [p for p in HeuristicProposer().propose(_context(plan, _ok_result(plan)), 12) if p.kind == "fusions"]
    together = patch_plan(plan, fusions[0].patch)
    assert set(together["draft"]["fusions"]) == set(FUSIONS) - {"gate_up+down"}  # measured slower: alone
    assert together["target"]["fusions"] == plan["target"]["fusions"]
    assert fusions[0].prior > max(p.prior for p in fusions[1:])
    assert "3 launches fewer per layer and 1 per step" in fusions[0].rationale
    mlp = [p for p in HeuristicProposer().propose(_context(plan, _ok_result(plan)), 60)
           if p.patch == [{"op": "add", "path": "/draft/fusions/-", "value": "gate_up+down"}]]
    assert mlp and "slower" in mlp[0].rationale and mlp[0].prior < fusions[0].prior
    assert not any(len([op for op in p.patch if op["path"].startswith("/target/fusions")]) > 1 for p in fusions)
    # one fusion missing: only single edits
    almost = patch_plan(plan, [{"op": "replace", "path": "/draft/fusions", "value": list(FUSIONS[1:])}])
    props = HeuristicProposer().propose(_context(almost, _ok_result(almost)), 30)
    added = [len([op for op in p.patch if op["path"].startswith("/draft/fusions")]) for p in props if p.kind == "fusions"]
    assert added and max(added) == 1


def test_every_fusion_leaves_a_draft_layer_four_launches():
    """All of them at once but the fused MLP: norm+qkv+rope, attention, o_proj, norm+gate_up, down;
    with the MLP too the o_proj copies its rows for mlp_norm+gate_up+down: four."""
    from conjugate.agents.heuristic.fusions import fusion_edits

    plan = PLANS["streams"]
    together = patch_plan(plan, next(c for c in fusion_edits(plan) if "3 launches fewer per layer" in c.rationale).patch)

    def layer(p) -> list[str]:
        return [l.parts[0].kind for l in expand(p, TINY).launches if all(op.startswith("d.s0.l0.") for op in l.ops)]

    assert layer(together) == ["qkv", "attn", "o_proj", "gate_up", "down"]
    mlp = patch_plan(together, [{"op": "add", "path": "/draft/fusions/-", "value": "gate_up+down"}])
    assert layer(mlp) == ["qkv", "attn", "o_proj", "gate_up"]


def test_the_targets_norm_and_rope_fusions_are_offered_low_with_their_measurement():
    """Measured slower in the verify phase (facts: target_fusions_verify): each still offered, alone,
    below every fusion the draft has not measured slower, with the fact's sentence; the draft's same
    fusions rank as before."""
    from conjugate.agents.facts import sentence
    from conjugate.agents.heuristic.fusions import TARGET_SLOWER, fusion_edits

    edits = fusion_edits(PLANS["streams"])
    added = lambda model, f: next(c for c in edits  # noqa: E731
                                  if c.patch == [{"op": "add", "path": f"/{model}/fusions/-", "value": f}])
    for f in TARGET_SLOWER:
        target, draft = added("target", f), added("draft", f)
        assert target.score < draft.score and sentence("target_fusions_verify") in target.rationale
        assert "target_fusions_verify" not in draft.rationale and sentence("target_fusions_verify") not in draft.rationale
    together = max(edits, key=lambda c: len(c.patch))
    assert {op["path"] for op in together.patch} == {"/draft/fusions/-"}


def test_under_two_streams_idle_target_sms_rank_below_streams_and_fusions():
    """The draft's stream takes SMs a target launch leaves idle, so widening it comes later there."""
    plan = PLANS["streams"]
    props = HeuristicProposer().propose(_context(plan, _ok_result(plan, programs=40)), 14)
    firsts = [p.rationale for p in props[:4]]
    assert not any("of 132 SMs" in r for r in firsts), firsts
    assert any("of 132 SMs" in p.rationale for p in props)  # still offered, later
    assert {p.kind for p in props[:5]} >= {"fusions", "streams"}


def test_residual_gemms_that_split_k_are_offered_an_atomic_sum_and_back():
    plan = PLANS["streams"]  # its o_proj and down split K in both models
    props = HeuristicProposer().propose(_context(plan, _ok_result(plan)), 12)
    atomic = [p for p in props if p.patch[0]["path"] == "/draft/reduce"]
    assert atomic and atomic[0].kind == "reduce" and "8 split-K partials atomically" in atomic[0].rationale
    new = patch_plan(plan, atomic[0].patch)
    assert new["draft"]["reduce"] == "atomic"
    back = [p for p in HeuristicProposer().propose(_context(new, _ok_result(new)), 60)
            if p.patch[0]["path"] == "/draft/reduce"]
    assert back and patch_plan(new, back[0].patch).hash == plan.hash
    one_split = [{"op": "replace", "path": f"/{m}/tiles/{k}/SPLIT_K", "value": 1}
                 for m in ("draft", "target") for k in ("o_proj", "down")]
    unsplit = patch_plan(plan, one_split)
    offered = [p for p in HeuristicProposer().propose(_context(unsplit, _ok_result(unsplit)), 60)
               if any(op["path"].endswith("/reduce") for op in p.patch)]
    assert offered == []  # nothing to sum when no residual GEMM splits K


def test_a_packed_plan_switches_both_models_split_k_sums_together():
    plan = patch_plan(PLANS["interleave"], [{"op": "replace", "path": "/cross/operand_layout", "value": "packed"}])
    offered = [p for p in HeuristicProposer().propose(_context(plan, _ok_result(plan)), 60)
               if any(op["path"].endswith("/reduce") for op in p.patch)]
    made = patch_plan(plan, offered[0].patch)
    assert len(offered) == 1 and made["draft"]["reduce"] == made["target"]["reduce"] == "atomic"


def test_no_edit_spends_an_evaluation_on_tiles_the_fused_mlp_does_not_read():
    """Under gate_up+down a model's down tile and its gate_up SPLIT_K are read by no launch: the
    proposals never change only those (each would measure the same kernels again)."""
    import random

    from conjugate.agents.heuristic import candidates, fresh_filter
    from conjugate.plan.schema import FUSIONS

    def read(plan) -> dict:  # the plan without the draft's unread tiles
        d = json.loads(json.dumps(plan.to_dict()))
        d["draft"]["tiles"].pop("down", None)
        d["draft"]["tiles"].get("gate_up", {}).pop("SPLIT_K", None)
        return d

    fused = patch_plan(PLANS["streams"], [{"op": "replace", "path": "/draft/fusions", "value": list(FUSIONS)}])
    found = candidates(fused, _ok_result(fused), 132, random.Random(0), {**TINY.to_dict(), "name": TINY.name})
    unread = [c for c in found if read(patch_plan(fused, c.patch)) == read(fused)]
    assert unread  # such edits are made (tile moves of the draft's down, among others)...
    fresh = fresh_filter(fused, [])
    assert not [c for c in found if fresh(c) and c in unread]  # ...and never proposed
    unfused = [p for p in HeuristicProposer().propose(_context(PLANS["streams"], _ok_result(PLANS["streams"])), 400)
               if any(op["path"].startswith("/draft/tiles/down") for op in p.patch)]
    assert unfused  # without the fusion, the draft's down tile is searched as before


def test_a_fusion_wins_back_at_most_its_launches_fixed_cost():
    """Of a long GEMM's loss only its launches' starts go with a fusion (the target's down keeps its
    weights to stream); a norm's microsecond loss goes whole."""
    from conjugate.agents.facts import figure
    from conjugate.agents.heuristic.fusions import launch_part
    from conjugate.evaluate.result import KindLoss

    fixed_ms = figure("launch_fixed_ms")  # measured data (search/facts.toml), a few microseconds
    assert 0.001 <= fixed_ms <= 0.02
    assert launch_part(KindLoss("target down", 36, 1.80, 0.86, 0.48)) == pytest.approx(36 * fixed_ms / 0.94)
    assert launch_part(KindLoss("draft attn_norm", 140, 0.20, 0.001, 0.01)) == 1.0
    assert launch_part(KindLoss("draft qkv", 140, 0.20, 0.25, 1.2)) == 0.0  # under its floor: nothing to win


# -- the knob families' rules, each against the measurements it encodes (search/facts.toml)

def _ledger(draft_ms: float, target_ms: float):
    from conjugate.evaluate.result import LedgerSummary
    return LedgerSummary(10.0, 5.0, 0.0, False, {"draft": draft_ms, "target": target_ms}, ())


def _triggers(edits, model: str = "draft") -> dict[str, float]:
    return {c.patch[0]["value"]: c.score for c in edits if c.patch[0]["path"] == f"/{model}/pdl"}


def test_pdl_for_the_critical_stream_first_and_only_valid_edits():
    from conjugate.agents.heuristic.pdl import pdl_edits
    plan = PLANS["streams"]
    edits = pdl_edits(plan, _ledger(8.3, 6.0))
    applied = [patch_plan(plan, c.patch) for c in edits]
    assert {(p["draft"]["pdl"], p["target"]["pdl"]) for p in applied} == {
        ("end", "none"), ("start", "none"), ("none", "end"), ("none", "start")}
    best = max(edits, key=lambda c: c.score)
    assert best.patch[0]["path"] == "/draft/pdl" and best.kind == "pdl"
    assert _triggers(edits)["start"] > _triggers(edits)["end"]  # draft 1.38x as busy: as on qwen3
    balanced = _triggers(pdl_edits(plan, _ledger(7.04, 6.9)))
    assert balanced["end"] > balanced["start"]  # as on llama-1b-8b-b8
    assert max(pdl_edits(plan, _ledger(5.0, 9.0)), key=lambda c: c.score).score < best.score  # the draft leads
    on = applied[edits.index(best)]
    moves = pdl_edits(on, _ledger(8.3, 6.0))
    assert all(patch_plan(on, c.patch).hash != on.hash for c in moves)
    assert set(_triggers(moves)) == {"end", "none"}  # released at the start: moved to the end, or off


def test_with_fused_norms_the_release_at_the_end_comes_first():
    from conjugate.agents.heuristic.fusions import NORM_FUSIONS, fusion_edits
    from conjugate.agents.heuristic.pdl import pdl_edits
    wide = _ledger(8.3, 6.0)  # 1.38x: unfused, the start comes first (above)
    fused = patch_plan(PLANS["streams"], [{"op": "add", "path": "/draft/fusions/-", "value": f} for f in NORM_FUSIONS])
    assert _triggers(pdl_edits(fused, wide))["end"] > _triggers(pdl_edits(fused, wide))["start"]
    started = patch_plan(fused, [{"op": "replace", "path": "/draft/pdl", "value": "start"}])
    moves = sorted(pdl_edits(started, wide), key=lambda c: -c.score)
    assert moves[0].patch == [{"op": "replace", "path": "/draft/pdl", "value": "end"}]
    ended = patch_plan(started, moves[0].patch)
    assert _triggers(pdl_edits(ended, wide))["start"] < moves[0].score
    # every fusion at once on a plan released at the start: released at the end in the same edit
    unfused_start = patch_plan(PLANS["streams"], [{"op": "replace", "path": "/draft/pdl", "value": "start"}])
    together = max(fusion_edits(unfused_start), key=lambda c: len(c.patch))
    made = patch_plan(unfused_start, together.patch)
    assert made["draft"]["pdl"] == "end" and set(NORM_FUSIONS) <= set(made["draft"]["fusions"])
    plain = max(fusion_edits(PLANS["streams"]), key=lambda c: len(c.patch))
    assert not any(op["path"].startswith("/pdl") for op in plain.patch)  # no pdl: nothing to move


def test_the_less_busy_stream_is_limited_and_then_the_limit_moves():
    import random

    from conjugate.agents.heuristic import candidates
    from conjugate.agents.heuristic.streams import sm_limit_edits
    plan = PLANS["streams"]
    limit = lambda edits: [c.patch[0]["value"] for c in edits]  # noqa: E731
    wide = sm_limit_edits(plan, 132, _ledger(8.3, 6.0))  # the draft's stream 1.38x as busy: deeper limits first
    assert limit(wide) == [104, 96, 112] and {c.patch[0]["path"] for c in wide} == {"/target/stream/sms"}
    assert wide[0].score > wide[1].score > wide[2].score and {c.kind for c in wide} == {"streams"}
    near = sm_limit_edits(plan, 132, _ledger(7.0, 6.0))  # 1.17x: a few SMs, scored lower
    assert limit(near) == [120, 112] and near[0].score < wide[0].score
    assert sm_limit_edits(plan, 132, _ledger(7.04, 6.90)) == []  # balanced: measured slower
    assert {c.patch[0]["path"] for c in sm_limit_edits(plan, 132, _ledger(5.0, 9.0))} == {"/draft/stream/sms"}
    assert limit(sm_limit_edits(plan, 132)) == [120, 112]  # no ledger: the target
    limited = patch_plan(plan, near[1].patch)
    assert sorted(limit(sm_limit_edits(limited, 132))) == [0, 104, 120]
    still_less_busy = dict(zip(limit(e := sm_limit_edits(limited, 132, _ledger(8.0, 6.5))), (c.score for c in e)))
    nearly = dict(zip(limit(e := sm_limit_edits(limited, 132, _ledger(6.8, 6.6))), (c.score for c in e)))
    assert still_less_busy[104] > nearly[104] > nearly[120]  # far from balance the next step ranks high
    now_busier = dict(zip(limit(e := sm_limit_edits(limited, 132, _ledger(6.0, 7.0))), (c.score for c in e)))
    assert now_busier[120] > now_busier[104]  # it yielded too much
    assert sm_limit_edits(PLANS["sequential"], 132) == []
    measured = EvalResult("h", "tiny", "h200", "timing", "ok", False, checks={"ok": True})
    assert "/target/stream/sms" in {c.patch[0]["path"] for c in candidates(plan, measured, 132, random.Random(0))}
    for unmeasured in (replace(measured, modeled=True), None):  # a model ignores the limit
        assert not [c for c in candidates(plan, unmeasured, 132, random.Random(0)) if "sm_limit" in c.patch[0]["path"]]


def test_every_candidate_is_filed_under_its_knob_family():
    import random

    from conjugate.agents.heuristic import candidates
    for name, plan in PLANS.items():
        for result in (None, _ok_result(plan, programs=40)):
            for c in candidates(plan, result, 132, random.Random(0), TINY.to_dict()):
                assert c.kind in EDIT_KINDS and c.kind != "other", (name, c)
                keys = {op["path"].split("/")[2] for op in c.patch}  # /draft/tiles/..., /cross/pairs/...
                family = {"tiles": {"tiles", "launch"}, "fusions": {"fusions", "pdl"}, "reduce": {"reduce"},
                          "pdl": {"pdl"}, "streams": {"streams", "stream"}, "form": {"form", "alignment", "overrides"},
                          "streamed": {"streamed"},
                          "cross": {"alignment", "pairs", "interleave", "overrides", "operand_layout", "streams"}}
                assert keys <= family[c.kind], (c.kind, keys)
