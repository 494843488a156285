"""CPU checks of the chain's schedule (the kernel itself needs a Hopper GPU: `chain.py --json`).

    python -m pytest -q lab/stream_chain/test_schedule.py
"""
import re
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import chain  # noqa: E402


@pytest.mark.parametrize("H, I, layers, programs, S1", [(256, 512, 3, 132, 4), (256, 512, 3, 132, 1),
                                                        (256, 512, 2, 5, None), (384, 768, 2, 7, 2)])
def test_simulated_schedule_matches_reference(H, I, layers, programs, S1):
    _assert_simulation_matches_reference(chain.plan_schedule(H, I, layers, programs, S1=S1), rows=3, seed=0)


def _assert_simulation_matches_reference(schedule, rows: int, seed: int) -> None:
    """The schedule simulated on random layers against the fp32 reference (2e-2, relative), no NaN."""
    torch.manual_seed(seed)
    w_gu, w_d = chain.weights(schedule.H, schedule.I, schedule.layers, "cpu")
    x0 = torch.randn(rows, schedule.H, dtype=torch.bfloat16)
    out = chain.simulate(schedule, x0, w_gu, w_d)
    ref = chain.reference(x0, w_gu, w_d, schedule.layers)
    assert not out.isnan().any()
    assert ((out.float() - ref).abs().max() / ref.abs().max()).item() < 2e-2


@pytest.mark.parametrize("model", list(chain.MODELS))
def test_every_program_loads_the_slots_it_consumes(model):
    H, I = chain.MODELS[model]
    schedule = chain.plan_schedule(H, I, 16, 132)
    assert schedule.programs <= 132 and schedule.shared_bytes() <= chain.SMEM_BUDGET
    for pid in range(schedule.programs):
        loaded, consumed = chain.weight_slots(schedule, pid)
        assert loaded == consumed > 0


def test_a_wait_with_no_producer_is_reported_as_deadlock(monkeypatch):
    schedule = chain.plan_schedule(256, 512, 2, 4)
    original = chain.program_tasks

    def one_wait_too_many(schedule, pid):
        yield from original(schedule, pid)
        yield ("wait", ("x", 1), 10 ** 6)

    monkeypatch.setattr(chain, "program_tasks", one_wait_too_many)
    w_gu, w_d = chain.weights(256, 512, 2, "cpu")
    with pytest.raises(RuntimeError, match="deadlock"):
        chain.simulate(schedule, torch.randn(2, 256, dtype=torch.bfloat16), w_gu, w_d)


def test_the_default_schedule_splits_small_projections_to_fill_the_sms():
    schedule = chain.plan_schedule(*chain.MODELS["qwen3-0.6b"], 16, 132)
    assert (schedule.S1, schedule.S2, schedule.programs) == (2, 16, 128)  # 48 h tiles alone would use 48 SMs


def test_schedules_that_cannot_run_are_refused():
    with pytest.raises(ValueError, match="must divide"):
        chain.plan_schedule(200, 512, 1, 132)
    with pytest.raises(ValueError, match="whole"):
        chain.plan_schedule(256, 512, 1, 132, S2=3)
    with pytest.raises(ValueError, match="whole"):
        chain.plan_schedule(256, 512, 1, 132, S1=3)
    with pytest.raises(ValueError, match="shared memory"):
        chain.plan_schedule(256, 512, 1, 132, stages=40)


@pytest.mark.parametrize("M, N, K, programs", [(3, 384, 256, 5), (16, 640, 512, 7), (8, 256, 192, 132)])
def test_stream_k_dealing_adds_every_step_once(M, N, K, programs):
    import gemm
    torch.manual_seed(0)
    x, w = torch.randn(M, K, dtype=torch.bfloat16), torch.randn(N, K, dtype=torch.bfloat16)
    ref = x.float() @ w.float().T
    assert torch.allclose(gemm.simulate(x, w, programs), ref, rtol=1e-4, atol=1e-3)


def test_stream_gemm_refuses_rows_and_widths_it_cannot_take():
    import gemm
    with pytest.raises(ValueError, match="rows"):
        gemm.padded_rows(129)
    assert [gemm.padded_rows(m) for m in (1, 16, 17, 96, 128)] == [16, 16, 32, 128, 128]


@pytest.mark.parametrize("B, T, HQ, HKV, D, CTX, programs", [(3, 4, 8, 2, 64, 256, 5), (2, 1, 4, 4, 64, 192, 132),
                                                           (2, 8, 16, 2, 128, 320, 7), (4, 2, 8, 8, 64, 512, 3)])
def test_attention_dealing_masks_and_merge_match_the_reference(B, T, HQ, HKV, D, CTX, programs):
    import attention
    shape = attention.Shape(B, T, HQ, HKV, D, CTX)
    shape.check()
    q, k, v, lens = attention.inputs(shape, "cpu", seed=B + T)
    lens[0] = T  # a row whose only keys are the new ones: one tile
    ref = attention.reference(q, k, v, lens)
    out = attention.simulate(shape, q, k, v, lens, programs)
    assert not out.isnan().any()  # every pair written
    assert ((out - ref).abs().max() / ref.abs().max()).item() < 2e-2


@pytest.mark.parametrize("programs", [1, 4, 7, 132, 1000])
def test_attention_dealing_covers_every_tile_once_in_near_equal_ranges(programs):
    import attention
    lens, HKV = [64, 1, 700, 130, 4096, 65], 4
    tiles = [-(-n // attention.KEYS_PER_TILE) for n in lens]
    dealt = attention.deal(lens, HKV, programs)
    assert len(dealt) == min(programs, sum(tiles) * HKV)  # no program without work
    seen = sorted((b, g, j) for pieces in dealt for b, g, j0, j1 in pieces for j in range(j0, j1))
    assert seen == [(b, g, j) for b in range(len(lens)) for g in range(HKV) for j in range(tiles[b])]
    sizes = [sum(j1 - j0 for *_, j0, j1 in pieces) for pieces in dealt]
    assert max(sizes) - min(sizes) <= 1
    for pieces in dealt:  # only a range's ends can be part of a pair
        for b, g, j0, j1 in pieces[1:-1]:
            assert (j0, j1) == (0, tiles[b])


def test_attention_refuses_query_groups_larger_than_a_tile():
    import attention
    with pytest.raises(ValueError, match="T x G"):
        attention.Shape(1, 8, 32, 2, 128, 512).check()


@pytest.mark.parametrize("form", ["merged", "folded"])
@pytest.mark.parametrize("H, I, layers, programs", [(256, 512, 3, 132), (256, 512, 3, 3), (384, 768, 2, 5)])
def test_one_stage_blocks_simulated_match_reference(form, H, I, layers, programs):
    """One stage a block: each task's h tile times its columns of Wd, summed. merged: the layer's last
    task in finishes x_{l+1}; folded: each layer's tasks add the residual as they stage x (the first
    one keeping x_l) and program 0 finishes the output. Fewer programs than tasks included; every
    x_l starts as NaN, so a read before its write shows."""
    schedule = chain.plan_schedule(H, I, layers, programs, merged=form == "merged", folded=form == "folded")
    assert schedule.merged and schedule.folded == (form == "folded") and (schedule.S1, schedule.S2) == (1, 1)
    assert schedule.programs == min(programs, I // 64)
    _assert_simulation_matches_reference(schedule, rows=4, seed=1 if form == "merged" else 2)


def test_a_folded_layer_that_does_not_wait_for_the_one_before_is_caught(monkeypatch):
    """The simulation's check can fail: without the waits, a program that runs ahead stages x_l
    from partial sums (3 programs, 8 tasks a layer)."""
    schedule = chain.plan_schedule(256, 512, 3, 3, folded=True)
    original = chain.program_tasks

    def no_waits(schedule, pid):
        yield from (step for step in original(schedule, pid) if step[0] != "wait")

    monkeypatch.setattr(chain, "program_tasks", no_waits)
    torch.manual_seed(2)
    w_gu, w_d = chain.weights(256, 512, 3, "cpu")
    x0 = torch.randn(2, 256, dtype=torch.bfloat16)
    out = chain.simulate(schedule, x0, w_gu, w_d).float()
    ref = chain.reference(x0, w_gu, w_d, 3)
    assert out.isnan().any() or ((out - ref).abs().max() / ref.abs().max()).item() > 2e-2


@pytest.mark.parametrize("model", list(chain.MODELS))
def test_merged_programs_load_the_slots_they_consume(model):
    H, I = chain.MODELS[model]
    schedule = chain.plan_schedule(H, I, 16, 132, merged=True)
    assert schedule.shared_bytes() <= chain.SMEM_BUDGET and schedule.kt_max == H // 64
    for pid in range(schedule.programs):
        loaded, consumed = chain.weight_slots(schedule, pid)
        assert loaded == consumed == 16 * len(range(pid, I // 64, schedule.programs)) * (H // 64 + H // 128)


def test_a_merged_block_splits_neither_projection():
    with pytest.raises(ValueError, match="splits neither"):
        chain.plan_schedule(256, 512, 1, 132, S1=2, merged=True)


@pytest.mark.parametrize("form", ["staged", "merged", "folded"])
def test_every_form_compiles_for_hopper_without_local_memory(form):
    """Offline, no GPU: the kernel at the step kernel's current ring API, each form, for sm_90a (the
    folded form arrives with a release alone: it never needs the counter's answer)."""
    schedule = chain.plan_schedule(*chain.MODELS["qwen3-0.6b"], 2, 132, merged=form == "merged",
                                   folded=form == "folded")
    ptx = chain.compile_offline(schedule).asm["ptx"]
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx
    assert (".acq_rel" in ptx) == (form != "folded") and ".release" in ptx
    assert not re.search(r"\b(?:ld|st)\.local", ptx)
