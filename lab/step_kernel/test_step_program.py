"""CPU checks of the step program (#48): tables built for every family, checked, and simulated against
the reference draft phase; wrong tables refused; a missing wait caught.

    python -m pytest -q lab/step_kernel
"""
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import program  # noqa: E402
from program import ProgramError, Tiles, build, check  # noqa: E402
from simulate import Deadlock, simulate  # noqa: E402

from conjugate.models.presets import from_name  # noqa: E402
from conjugate.models.reference import draft_phase, make_round_inputs  # noqa: E402
from conjugate.models.weights import random_weights  # noqa: E402

SMALL = Tiles(k=16, rows=32, half=16)  # the tiny models' sizes: many tiles and slices


def _case(name: str, batch: int, ragged: bool = True, seed: int = 0):
    w = random_weights(from_name(name), seed=seed)
    inputs = make_round_inputs(w, w, k=3, draft_batch=batch, target_batch=1, context=12, seed=seed, ragged=ragged)
    return w, inputs


def _reference(w, inputs, steps):
    cache = inputs.draft_cache.clone()
    tokens, logits = draft_phase(w, inputs.draft_last_tokens, cache, inputs.draft_lengths, steps)
    return tokens, logits, cache


@pytest.mark.parametrize("name", ["tiny-llama-d", "tiny-qwen2-d", "tiny-qwen3-d", "tiny-llama-t"])
@pytest.mark.parametrize("programs,early,coarse", [(7, True, ""), (40, True, ""), (40, False, ""),
                                                   (40, True, "whole"), (40, True, "mixed")])
def test_simulated_table_gives_the_reference_tokens(name, programs, early, coarse):
    w, inputs = _case(name, batch=3)
    steps = 3
    prog = build(w.spec, 3, steps, programs, SMALL, early_start=early)
    if coarse == "whole":
        prog = program.coarsen(prog)
        assert all(len(t.waits) <= 1 and not t.finish_waits for t in prog.tasks if t.op != "o_proj")
    elif coarse == "mixed":
        prog = program.coarsen(prog, kinds=("x", "xm", "h"))
        assert all(len(t.waits) <= 1 and not t.finish_waits for t in prog.tasks if t.op not in ("o_proj", "attn"))
    check(prog, sms=132)
    ref_tokens, ref_logits, ref_cache = _reference(w, inputs, steps)
    for seed in (0, 1):  # two interleavings of the programs
        out = simulate(prog, w, inputs.draft_last_tokens, inputs.draft_cache, inputs.draft_lengths, seed=seed)
        assert torch.equal(out.tokens, ref_tokens)
        torch.testing.assert_close(out.logits, ref_logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(out.cache.k, ref_cache.k, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(out.cache.v, ref_cache.v, rtol=1e-4, atol=1e-4)


def test_one_program_runs_the_whole_table_in_order():
    w, inputs = _case("tiny-qwen3-d", batch=2)
    prog = build(w.spec, 2, 2, 1, SMALL)
    check(prog, sms=1)
    out = simulate(prog, w, inputs.draft_last_tokens, inputs.draft_cache, inputs.draft_lengths)
    assert torch.equal(out.tokens, _reference(w, inputs, 2)[0])


def test_splits_fill_the_programs_and_slices_cover_k():
    spec = from_name("llama-3.2-1b")
    prog = build(spec, 8, 1, 132)
    check(prog, sms=132)
    # qkv: 24 paired tiles (two 64-dim heads each) x 5 slices of 2048 = 120 tasks on 132 programs
    assert len(program.qkv_tiles(spec, Tiles())) == 24 and prog.splits["qkv"] == 5
    assert prog.splits["down"] == 8 and prog.splits["gate_up"] == 1  # 16 tiles of 128 x 8; 256 h tiles
    assert all(t.program == t.index % 132 for t in prog.tasks)


def test_every_program_streams_about_the_same_weight_bytes():
    spec = from_name("llama-3.2-1b")
    prog = build(spec, 8, 1, 132)
    slots = [prog.loads(p) for p in range(132)]
    H, F, L = spec.hidden_size, spec.ffn_size, spec.num_layers
    weights = L * (spec.qkv_size * H + H * spec.q_size + 2 * F * H + H * F) + spec.vocab_size * H
    assert sum(slots) * 128 * 64 == weights  # every weight once a step, in 128 x 64 slots (all full here)
    assert max(slots) <= 1.3 * (sum(slots) / len(slots))


def _with(prog, index, **changes):
    tasks = list(prog.tasks)
    tasks[index] = replace(tasks[index], **changes)
    return replace(prog, tasks=tasks)


def test_check_refuses_unsafe_tables():
    spec = from_name("tiny-llama-d")
    prog = build(spec, 2, 2, 9, SMALL)
    check(prog, sms=9)
    with pytest.raises(ProgramError, match="programs"):
        check(prog, sms=8)  # not all co-resident
    attn = next(t.index for t in prog.tasks if t.op == "attn")
    with pytest.raises(ProgramError, match="no task bumps"):
        check(_with(prog, attn, waits=(("qkv/9/9/9", 1), )), sms=9)
    with pytest.raises(ProgramError, match="bring it to"):
        check(_with(prog, attn, waits=((prog.tasks[attn].waits[0][0], 2), )), sms=9)
    o_proj = next(t for t in prog.tasks if t.op == "o_proj")
    down_done = next(t.done for t in prog.tasks if t.op == "down" and t.step == o_proj.step and t.layer == o_proj.layer)
    with pytest.raises(ProgramError, match="deadlock"):
        check(_with(prog, o_proj.index, waits=((down_done, 1), )), sms=9)
    late = next(t for t in reversed(prog.tasks) if t.program == 0)  # program 0 would run its last task first
    with pytest.raises(ProgramError, match="stage order"):
        check(replace(prog, tasks=[late] + [t for t in prog.tasks if t is not late]), sms=9)
    qkv = next(t for t in prog.tasks if t.op == "qkv" and t.split == 0)
    with pytest.raises(ProgramError, match="computed"):
        check(_with(prog, qkv.index, out=qkv.out[:1]), sms=9)
    gate = next(t for t in prog.tasks if t.op == "down" and t.splits > 1)
    with pytest.raises(ProgramError, match="K slices"):
        check(_with(prog, gate.index, k_range=(gate.k_range[0], gate.k_range[1] - 16)), sms=9)


def test_a_missing_wait_is_caught_by_the_tokens():
    """Drop the waits of every attention task: the simulation reads q before qkv wrote it (NaN) or a
    stale cache, and the tokens or the logits leave the reference."""
    w, inputs = _case("tiny-llama-d", batch=2)
    prog = build(w.spec, 2, 2, 16, SMALL)
    tasks = [replace(t, waits=()) if t.op == "attn" else t for t in prog.tasks]
    out = simulate(replace(prog, tasks=tasks), w, inputs.draft_last_tokens, inputs.draft_cache, inputs.draft_lengths)
    ref_tokens, ref_logits, _ = _reference(w, inputs, 2)
    assert not torch.equal(out.tokens, ref_tokens) or not torch.allclose(out.logits, ref_logits, atol=1e-4)


def test_a_wait_nobody_meets_is_a_deadlock():
    w, inputs = _case("tiny-llama-d", batch=1)
    prog = build(w.spec, 1, 1, 4, SMALL)
    last = prog.tasks[-1]
    prog = _with(prog, last.index, waits=last.waits + (("token/0", 1), ))  # the head waits on its own result
    with pytest.raises(Deadlock, match="blocked"):
        simulate(prog, w, inputs.draft_last_tokens, inputs.draft_cache, inputs.draft_lengths)


def test_attention_in_key_chunks_merges_to_the_reference():
    """Contexts of 40-60 keys in chunks of 16-key blocks: four chunks a pair hold keys, the merge of
    their partials gives the reference (and a chunk past a short sequence's keys weighs nothing)."""
    w = random_weights(from_name("tiny-qwen2-d"), seed=3)
    inputs = make_round_inputs(w, w, k=2, draft_batch=2, target_batch=1, context=60, seed=3, ragged=True)
    prog = build(w.spec, 2, 2, 12, SMALL, splits={"attn": 5})
    check(prog, sms=12)
    assert {t.splits for t in prog.tasks if t.op == "attn"} == {5}
    out = simulate(prog, w, inputs.draft_last_tokens, inputs.draft_cache, inputs.draft_lengths, seed=2)
    ref_tokens, ref_logits, ref_cache = _reference(w, inputs, 2)
    assert torch.equal(out.tokens, ref_tokens)
    torch.testing.assert_close(out.logits, ref_logits, rtol=1e-4, atol=1e-4)
