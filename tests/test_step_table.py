"""The step form's task table (compiler/step/table.py) on the CPU: tables built for every family,
checked, and run by the simulation against the reference draft phase; unsafe tables refused; a
missing wait caught; the records and weight layout the Gluon kernel reads (layout.py, kernels/step/columns.py, ring.py)."""
from collections import Counter, defaultdict
from dataclasses import replace

import pytest
import torch

from conjugate.compiler.step.launch import StepLaunch
from conjugate.compiler.step.ledger import CRITICAL_PHASES, critical_path, path_shares, task_ledger
from conjugate.compiler.step.layout import encode, tile_weights
from conjugate.compiler.step.simulate import Deadlock, simulate
from conjugate.compiler.step.table import (MIN_RUN_K_TILES, ProgramError, StepProgram, Tiles, _balance_pays,
                                          balanced_runs, build, check, coarsen, finest_split, qkv_tiles, step_table)
from conjugate.models.presets import from_name
from conjugate.models.reference import forward, make_round_inputs
from conjugate.kernels.step import columns as layout
from conjugate.models.weights import meta_weights, random_weights
from step_cases import SMALL, assert_simulates_reference, reference_phase, step_case  # tests/step_cases.py


@pytest.mark.parametrize("name", ["tiny-llama-d", "tiny-qwen2-d", "tiny-qwen3-d", "tiny-llama-t"])
@pytest.mark.parametrize("programs,early,coarse", [(7, True, False), (40, True, False), (40, False, False),
                                                   (40, True, True)])
def test_simulated_table_gives_the_reference_tokens(name, programs, early, coarse):
    w, inputs = step_case(name, batch=3)
    steps = 3
    prog = build(w.spec, 3, steps, programs, SMALL, early_start=early)
    if coarse:
        prog = coarsen(prog)
        assert all(len(t.waits) <= 1 and not t.finish_waits for t in prog.tasks if t.op != "o_proj")
    check(prog, sms=132)
    assert_simulates_reference(prog, w, inputs, steps)


@pytest.mark.parametrize("name", ["tiny-llama-t", "tiny-qwen2-d", "tiny-qwen3-d"])
@pytest.mark.parametrize("programs,tokens,coarse", [(7, 4, False), (40, 3, True)])
def test_a_verify_table_gives_the_reference_forward(name, programs, tokens, coarse):
    """One step of T tokens a sequence (a verify pass): logits, argmax and the T new cache rows of
    forward(), each token attending causally, at ragged lengths."""
    w, inputs = step_case(name, batch=3)
    verify = torch.randint(0, w.spec.vocab_size, (3, tokens), generator=torch.Generator().manual_seed(tokens))
    cache = inputs.draft_cache.clone()
    ref_logits = forward(w, verify, cache, inputs.draft_lengths)
    prog = build(w.spec, 3, 1, programs, SMALL, tokens=tokens)
    prog = coarsen(prog) if coarse else prog
    check(prog, sms=132)
    assert prog.rows == 3 * tokens
    out = simulate(prog, w, verify, inputs.draft_cache, inputs.draft_lengths, seed=tokens)
    torch.testing.assert_close(out.logits, ref_logits, rtol=1e-4, atol=1e-4)
    assert torch.equal(out.tokens, ref_logits.argmax(-1))
    torch.testing.assert_close(out.cache.k, cache.k, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.cache.v, cache.v, rtol=1e-4, atol=1e-4)


def test_a_verify_pass_is_one_step_and_reads_its_tokens():
    spec = from_name("tiny-llama-t")
    with pytest.raises(ProgramError, match="one step"):
        build(spec, 2, 2, 8, SMALL, tokens=3)
    w, inputs = step_case("tiny-llama-t", batch=2)
    with pytest.raises(ValueError, match="first tokens"):
        simulate(build(spec, 2, 1, 8, SMALL, tokens=3), w, inputs.draft_last_tokens, inputs.draft_cache,
                 inputs.draft_lengths)


def test_one_program_runs_the_whole_table_in_order():
    w, inputs = step_case("tiny-qwen3-d", batch=2)
    prog = build(w.spec, 2, 2, 1, SMALL)
    check(prog, sms=1)
    out = simulate(prog, w, inputs.draft_last_tokens, inputs.draft_cache, inputs.draft_lengths)
    assert torch.equal(out.tokens, reference_phase(w, inputs, 2)[0])


def test_splits_fill_the_programs_and_slices_cover_k():
    spec = from_name("llama-3.2-1b")
    given = {"qkv": 5, "o_proj": 4, "gate_up": 1, "down": 8, "head": 1}
    prog = build(spec, 8, 1, 132, splits=given)
    check(prog, sms=132)
    # qkv: 24 paired tiles (two 64-dim heads each) x 5 slices of 2048 = 120 tasks on 132 programs
    assert len(qkv_tiles(spec, Tiles())) == 24 and finest_split(24, 2048, 64, 132) == 5
    assert finest_split(16, 8192, 64, 132) == 8 and finest_split(256, 2048, 64, 132) == 1  # down, gate_up
    assert sum(t.op == "qkv" for t in prog.tasks) == 120 * spec.num_layers
    assert all(t.program == t.index % 132 for t in prog.tasks)  # slices as given go task after task round


def test_slices_are_cut_shorter_only_where_long_ones_leave_most_programs_idle():
    """Slices of at least 4 K tiles, or of 2 where 4 would give fewer than a third of the programs a
    task of the op (measured: lab/step_dealing/h200_slices.json)."""
    # qwen2.5-0.5b: qkv's 9 paired tiles and o_proj's 7 over 14 K tiles: 27 and 21 tasks at 4, so 2
    assert finest_split(9, 896, 64, 132, min_k_tiles=4) == 3 and finest_split(9, 896, 64, 132) == 7
    assert finest_split(7, 896, 64, 132) == 7
    prog = step_table(from_name("qwen2.5-0.5b"), 8, 1, 132, sms=132)
    assert (prog.splits["qkv"], prog.splits["o_proj"], prog.splits["down"]) == (7, 7, 18)
    # qwen3-0.6b's o_proj: 8 tiles x 8 slices keep 64 of 132 busy at 4: unchanged
    assert finest_split(8, 2048, 64, 132) == finest_split(8, 2048, 64, 132, min_k_tiles=4) == 8
    assert step_table(from_name("qwen3-0.6b"), 4, 1, 132, sms=132).splits["o_proj"] == 8
    assert finest_split(1, 128, 64, 132) == 1  # never below one slice
    # at the boundary: 11 tiles x 4 slices = 44 tasks, a third of 132, keep slices of 4; 33 take slices of 2
    assert finest_split(11, 1024, 64, 132) == 4 and finest_split(11, 768, 64, 132) == 6

def _k_tiles_per_program(prog, op):
    per = defaultdict(int)
    for t in prog.tasks:
        if t.op == op and t.step == 0 and t.layer in (0, -1):  # layer 0's op, or the step's head
            per[t.program] += (t.k_range[1] - t.k_range[0]) // prog.tiles.k
    return per


@pytest.mark.parametrize("name,op,uniform_most,most", [
    ("qwen2.5-1.5b", "gate_up", 48, 26),  # 140 tiles x 24 K tiles: 8 programs took two tiles
    ("qwen2.5-0.5b", "gate_up", 14, 14),  # 76 tiles x 14 K tiles: balanced runs (9) save too few to pay
    ("llama-3.2-1b", "head", 256, 256),  # 1002 tiles x 32 K tiles: balanced (243) save 13, under a quarter
])
def test_an_uneven_op_is_cut_into_balanced_runs_only_where_they_take_many_k_tiles_off(name, op, uniform_most,
                                                                                     most):
    spec = from_name(name)
    uniform = _k_tiles_per_program(build(spec, 4, 1, 132, splits={op: 3 if op == "qkv" else 1}), op)  # as dealt
    balanced = _k_tiles_per_program(prog := build(spec, 4, 1, 132), op)
    check(prog, sms=132)
    assert max(uniform.values()) == uniform_most and max(balanced.values()) == most
    assert sum(uniform.values()) == sum(balanced.values())  # the same weight tiles, each once
    if most == uniform_most:  # dealt round the programs as sliced
        return
    tile_parts = defaultdict(list)
    for t in prog.tasks:
        if t.op == op and t.step == 0 and t.layer in (0, -1):
            tile_parts[t.tile].append(t)
    assert any(len(ts) > 1 for ts in tile_parts.values())  # runs cross tiles: a tile in parts, each told how many
    assert all({t.splits for t in ts} == {len(ts)} and sorted(t.split for t in ts) == list(range(len(ts)))
               for ts in tile_parts.values())


def test_balanced_runs_pay_only_for_many_k_tiles_and_a_quarter_of_the_busiest_programs():
    assert _balance_pays(49, 28) and _balance_pays(32, 24)  # 21 K tiles (43%); 8 exactly, a quarter exactly
    assert not _balance_pays(15, 11)  # 4 K tiles: too few, whatever the share
    assert not _balance_pays(264, 252)  # 12 K tiles but 4.5%
    assert not _balance_pays(32, 24.5)  # 7.5 K tiles


@pytest.mark.parametrize("n_tiles,k_total,programs", [(76, 896, 132), (9, 896, 132), (3, 160, 5), (7, 64, 20)])
def test_balanced_runs_cover_every_weight_tile_once_in_near_equal_runs(n_tiles, k_total, programs):
    runs = balanced_runs(n_tiles, k_total, 64, programs)
    k_tiles = -(-k_total // 64)
    assert 1 <= len(runs) <= programs
    units = [(tile, k) for run in runs for tile, (lo, hi) in run for k in range(lo // 64, -(-hi // 64))]
    assert units == [(t, k) for t in range(n_tiles) for k in range(k_tiles)]  # in order, each once
    lengths = [sum(-(-(hi - lo) // 64) for _, (lo, hi) in run) for run in runs]
    assert max(lengths) - min(lengths) <= 1
    assert min(lengths) >= min(MIN_RUN_K_TILES, n_tiles * k_tiles)
    assert all(hi <= k_total for run in runs for _, (_, hi) in run)
    assert balanced_runs(n_tiles, 0, 64, programs) is None


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
    w, inputs = step_case("tiny-llama-d", batch=2)
    prog = build(w.spec, 2, 2, 16, SMALL)
    tasks = [replace(t, waits=()) if t.op == "attn" else t for t in prog.tasks]
    out = simulate(replace(prog, tasks=tasks), w, inputs.draft_last_tokens, inputs.draft_cache, inputs.draft_lengths)
    ref_tokens, ref_logits, _ = reference_phase(w, inputs, 2)
    assert not torch.equal(out.tokens, ref_tokens) or not torch.allclose(out.logits, ref_logits, atol=1e-4)


def test_a_wait_nobody_meets_is_a_deadlock():
    w, inputs = step_case("tiny-llama-d", batch=1)
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
    ref_tokens, ref_logits, ref_cache = reference_phase(w, inputs, 2)
    assert torch.equal(out.tokens, ref_tokens)
    torch.testing.assert_close(out.logits, ref_logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["tiny-llama-d", "tiny-qwen2-d", "tiny-qwen3-d"])
def test_qkv_rows_are_where_the_epilogue_reads_them(name):
    """Row r of qkv tile t is dim r % (D/2) of head head0 + r // (D/2) (first halves), row half + r the
    same head's dim D/2 + r % (D/2), each times the attention norm's weight; the bias in the same order."""
    w = random_weights(from_name(name), seed=1)
    spec, prog = w.spec, build(w.spec, 2, 1, 8, SMALL)
    laid = tile_weights(w, prog)
    half, d2 = SMALL.half, spec.head_dim // 2
    tiles = qkv_tiles(spec, SMALL)
    starts = {"q": 0, "k": spec.q_size, "v": spec.q_size + spec.kv_size}
    for layer, lw in enumerate(w.layers):
        wqkv = torch.cat([lw.wq, lw.wk, lw.wv]).float() * lw.attn_norm.float()[None, :]
        bias = torch.cat([lw.bq, lw.bk, lw.bv]).float() if lw.bq is not None else torch.zeros(spec.qkv_size)
        for t, (seg, head0, _) in enumerate(tiles):
            base = (layer * len(tiles) + t) * 2 * half
            for r in range(half):
                head, dim = head0 + r // d2, r % d2
                for part in (0, 1):
                    src = starts[seg] + head * spec.head_dim + part * d2 + dim
                    row = base + part * half + r
                    assert torch.equal(laid["qkv"][row], wqkv[src].to(torch.bfloat16))
                    assert laid["bias"][row] == bias[src]


def test_gate_up_tiles_hold_gate_rows_over_up_rows():
    w = random_weights(from_name("tiny-llama-d"), seed=2)
    spec, prog = w.spec, build(w.spec, 2, 1, 8, SMALL)
    laid = tile_weights(w, prog)
    half, F = SMALL.half, spec.ffn_size
    for layer, lw in enumerate(w.layers):
        wgu = torch.cat([lw.w_gate, lw.w_up]).float() * lw.mlp_norm.float()[None, :]
        for t in range(F // half):
            base = (layer * (F // half) + t) * 2 * half
            assert torch.equal(laid["gu"][base:base + half], wgu[t * half:(t + 1) * half].to(torch.bfloat16))
            assert torch.equal(laid["gu"][base + half:base + 2 * half],
                               wgu[F + t * half:F + (t + 1) * half].to(torch.bfloat16))


@pytest.mark.parametrize("coarse", [False, True])
def test_records_say_what_the_tasks_say(coarse):
    """Each record: the op's code, step, layer, K in tiles (attention: chunk and chunks), the first wait
    inline and again first in the list, the weight row where the task's rows start in the laid-out
    matrix, and one parts counter a GEMM tile of its own; every program's list in the table's order."""
    spec = from_name("tiny-qwen2-d")
    prog = build(spec, 3, 2, 10, SMALL)
    prog = coarsen(prog) if coarse else prog
    enc = encode(prog)
    table, waits = enc["table"], enc["waits"].view(-1, 2)
    c = {name: getattr(layout, name) for name in dir(layout) if name.startswith("C_")}
    n_gu, pairs = spec.ffn_size // SMALL.half, len(qkv_tiles(spec, SMALL))
    for t in prog.tasks:
        row = table[t.index]
        assert int(row[c["C_OP"]]) == layout.OPS[t.op] and int(row[c["C_STEP"]]) == t.step
        assert int(row[c["C_LAYER"]]) == max(t.layer, 0) and int(row[c["C_SPLITS"]]) == t.splits
        if t.op == "attn":
            assert (int(row[c["C_KLO"]]), int(row[c["C_KHI"]])) == t.k_range
            assert (int(row[c["C_SEG"]]), int(row[c["C_HEAD0"]])) == divmod(t.tile, spec.num_kv_heads)
        else:
            assert (int(row[c["C_KLO"]]) * SMALL.k, int(row[c["C_KHI"]]) * SMALL.k) == t.k_range
        offset, count = int(row[c["C_WOFF"]]), int(row[c["C_WCNT"]])
        assert count == len(t.waits)
        assert [target for _, target in waits[offset:offset + count].tolist()] == [target for _, target in t.waits]
        f_offset, f_count = int(row[c["C_FOFF"]]), int(row[c["C_FCNT"]])
        assert [target for _, target in waits[f_offset:f_offset + f_count].tolist()] == \
            [target for _, target in t.finish_waits]
        if t.waits:
            assert (int(row[c["C_W1C"]]), int(row[c["C_W1T"]])) == tuple(waits[offset].tolist())
            assert int(row[c["C_W1T"]]) == t.waits[0][1]
        else:
            assert int(row[c["C_W1T"]]) == 0
        expected_row0 = {"qkv": (t.layer * pairs + t.tile) * 2 * SMALL.half,
                         "gate_up": (t.layer * n_gu + t.tile) * 2 * SMALL.half,
                         "o_proj": t.layer * spec.hidden_size + t.out[0][0],
                         "down": t.layer * spec.hidden_size + t.out[0][0], "head": t.out[0][0]}.get(t.op)
        if expected_row0 is not None:
            assert int(row[c["C_ROW0"]]) == expected_row0
    parts = [int(table[t.index][c["C_PARTS"]]) for t in prog.tasks if t.splits == 1 and t.op != "embed"]
    assert len(parts) == len(set(parts)), "a one-slice tile shares its parts counter"
    order = enc["list"].tolist()
    bounds = enc["bounds"].tolist()
    for p in range(prog.programs):
        assert order[bounds[p]:bounds[p + 1]] == [t.index for t in prog.of_program(p)]


def test_the_kernel_reads_the_columns_the_host_writes():
    from conjugate.kernels.step import ring  # Gluon: imports on the CPU, runs only on Hopper

    for name in dir(layout):
        if name.startswith("C_"):
            assert getattr(ring, name).value == getattr(layout, name), name
    assert (ring.REC.value, ring.SLOT_ROWS.value, ring.BK.value, ring.HALF.value) == \
        (layout.REC, layout.SLOT_ROWS, layout.K_TILE, layout.HALF_ROWS)
    assert layout.BATCH_PAD in layout.ROW_TILES and all(t % 8 == 0 and t <= 256 for t in layout.ROW_TILES)  # wgmma N
    assert Tiles() == Tiles(k=layout.K_TILE, rows=layout.SLOT_ROWS, half=layout.HALF_ROWS)


def test_step_table_is_coarse_and_checked():
    spec = from_name("qwen3-0.6b")
    prog = step_table(spec, 2, 1, 132)
    assert all(len(t.waits) <= 1 and not t.finish_waits for t in prog.tasks if t.op != "o_proj")
    with pytest.raises(ProgramError, match="programs"):
        step_table(spec, 2, 1, 0)


def test_ledger_splits_each_task_into_wait_and_work():
    spec = from_name("tiny-llama-d")
    prog = step_table(spec, 2, 1, 4, SMALL)
    stamps = torch.zeros(len(prog.tasks), layout.STAMP_COLS, dtype=torch.int64)
    for t in prog.tasks:  # each task: 1 us of waiting from its start, then 2 us of work (on 4 programs):
        at = 10_000 * t.index  # 0.25 staging, 1.5 multiplying, 0.25 finishing (0.1 arriving); weights issued at its start
        stamps[t.index] = stamp(at, at + 1_000, at + 1_250, at + 2_750, at + 3_000, at, at + 2_850)
    out = task_ledger(prog, stamps)
    n = {op: sum(t.op == op for t in prog.tasks) for op in out["ops"]}
    for op, v in out["ops"].items():
        assert v["tasks"] == n[op]
        assert v["wait_us"] == pytest.approx(n[op] * 1.0 / 4) and v["work_us"] == pytest.approx(n[op] * 2.0 / 4)
        if op != "embed":
            assert (v["stage_us"], v["multiply_us"], v["finish_us"], v["arrive_us"], v["epilogue_us"]) == pytest.approx(
                (n[op] * 0.25 / 4, n[op] * 1.5 / 4, n[op] * 0.25 / 4, n[op] * 0.1 / 4, n[op] * 0.15 / 4))
        assert ("lead_us" in v) == (op not in ("embed", "attn")) and ("stage_us" in v) == (op != "embed")
    assert out["span_us"] == pytest.approx(10 * (len(prog.tasks) - 1) + 3)
    for t in prog.tasks:  # the loader issues every task's first tile 0.5 us after its waits are met
        stamps[t.index, layout.S_ISSUED] = 10_000 * t.index + 1_500
    assert all(v["lead_us"] == pytest.approx(-0.5) for v in task_ledger(prog, stamps)["ops"].values() if "lead_us" in v)
    streamed = task_ledger(prog, stamps, attention_streamed=True)["ops"]  # ring_kv: the loader stamps attention too
    assert streamed["attn"]["lead_us"] == pytest.approx(-0.5) and "lead_us" not in streamed["embed"]


def test_the_critical_path_charges_each_stage_to_its_last_task():
    """A stage (an op instance) ends with its last task; the time since the stage before ended is that
    task's: its program busy, the handoff, then its own phases. The ops' times add up to the span."""
    prog = step_table(from_name("tiny-qwen3-d"), 2, 2, 4, SMALL)
    stages = sorted({t.stage for t in prog.tasks})
    stamps = torch.zeros(len(prog.tasks), layout.STAMP_COLS, dtype=torch.int64)
    last = {}
    for t in prog.tasks:  # stage i runs from 10i us: every task met at +1, staged +1.5, multiplied +3, ends +6
        base = 10_000 * stages.index(t.stage)
        stamps[t.index] = stamp(base, base + 1_000, base + 1_500, base + 3_000, base + 6_000, base, base + 4_000)
        last[t.stage] = t
    for t in last.values():  # but one a stage starts 0.5 us late, arrives at +7 and ends the stage at +10
        base = 10_000 * stages.index(t.stage)
        stamps[t.index] = stamp(base + 500, base + 1_000, base + 1_500, base + 3_000, base + 10_000, base, base + 7_000)
    out = critical_path(prog, stamps)
    assert out["span_us"] == pytest.approx(10 * len(stages))
    assert sum(v["us"] for v in out["ops"].values()) == pytest.approx(out["span_us"])
    for op, v in out["ops"].items():
        n = sum(t.op == op for t in last.values())
        assert v["stages"] == n
        assert [v[p] / n for p in CRITICAL_PHASES] == pytest.approx([0.5, 0.5, 0.5, 1.5, 4.0, 3.0])
        alone = sum(sum(u.stage == t.stage for u in prog.tasks) == 1 for t in last.values() if t.op == op)
        assert v["straggle_us"] == pytest.approx(4.0 * (n - alone))  # 4 us past the median, unless alone
    owners = Counter(t.program for t in last.values())
    assert out["critical_programs"] == len(owners)
    assert out["top_program_share"] == pytest.approx(max(owners.values()) / len(stages))
    # a stage stamped out of order (its ends zero) leaves the path monotone and adding up to the span
    early = next(t for t in last.values() if t.op == "o_proj")
    stamps[[t.index for t in prog.tasks if t.stage == early.stage], layout.S_END] = 0
    shifted = critical_path(prog, stamps)
    assert shifted["span_us"] == pytest.approx(10 * len(stages))
    assert sum(v["us"] for v in shifted["ops"].values()) == pytest.approx(shifted["span_us"])
    assert all(v[p] >= 0 for v in shifted["ops"].values() for p in CRITICAL_PHASES)  # no phase runs backwards
    assert shifted["ops"]["o_proj"]["epilogue_us"] < out["ops"]["o_proj"]["epilogue_us"]  # its ends came early
    # the round's ledger divides the launch among its ops by their shares of the path
    shares = path_shares({"critical": out})
    assert sum(shares.values()) == pytest.approx(1.0)
    assert shares == pytest.approx({op: v["us"] / out["span_us"] for op, v in out["ops"].items()})
    assert path_shares({"critical": {"ops": {}}}) == {}


def stamp(start, met, staged, multiplied, end, issued, arrived=None):
    """One task's stamps (ns) in the kernel's column order (arrived: at the product's end unless given)."""
    row = [0] * layout.STAMP_COLS
    for col, value in ((layout.S_START, start), (layout.S_MET, met), (layout.S_STAGED, staged),
                       (layout.S_MULTIPLIED, multiplied), (layout.S_END, end), (layout.S_ISSUED, issued),
                       (layout.S_ARRIVED, multiplied if arrived is None else arrived)):
        row[col] = value
    return torch.tensor(row)


def test_ledger_splits_a_wait_at_its_last_producers_end():
    spec = from_name("tiny-llama-d")
    prog = step_table(spec, 2, 2, 4, SMALL)
    stamps = torch.zeros(len(prog.tasks), layout.STAMP_COLS, dtype=torch.int64)
    for t in prog.tasks:  # every task starts at 0; task i's waits are met at 10i + 1 us and it ends at 10i + 3
        met = 10_000 * t.index + 1_000
        stamps[t.index] = stamp(0, met, met, met, met + 2_000, 0)
    out = task_ledger(prog, stamps)
    attn_end = {}  # (step, layer) -> when its attention's last task ended, us
    for t in prog.tasks:
        if t.op == "attn":
            attn_end[t.step, t.layer] = max(attn_end.get((t.step, t.layer), 0), 10 * t.index + 3.0)
    o_proj = [t for t in prog.tasks if t.op == "o_proj"]  # each waits for its layer's attention, last
    assert out["ops"]["o_proj"]["producers_us"] == pytest.approx(sum(attn_end[t.step, t.layer] for t in o_proj) / 4)
    assert out["ops"]["o_proj"]["handoff_us"] == pytest.approx(
        sum(10 * t.index + 1.0 - attn_end[t.step, t.layer] for t in o_proj) / 4)
    for op, v in out["ops"].items():  # nothing starts late: every wait is producers then handoff
        waited = sum(10 * t.index + 1.0 for t in prog.tasks if t.op == op and t.waits) / 4
        assert v["producers_us"] + v["handoff_us"] == pytest.approx(waited)
    head0_end = max(10 * t.index + 3.0 for t in prog.tasks if t.op == "head" and t.step == 0)
    embeds1 = [t for t in prog.tasks if t.op == "embed" and t.step == 1]  # wait for step 0's token: its last head
    assert out["ops"]["embed"]["producers_us"] == pytest.approx(head0_end * len(embeds1) / 4)
    # a poll that sees the counter before its producer stamps its end: all producers, no handoff
    early = stamps.clone()
    for t in embeds1:
        early[t.index, layout.S_MET] = int(head0_end * 1000) - 500
    out_early = task_ledger(prog, early)
    assert out_early["ops"]["embed"]["handoff_us"] == 0
    assert out_early["ops"]["embed"]["producers_us"] == pytest.approx((head0_end - 0.5) * len(embeds1) / 4)
    # tasks that start after their producers ended wait only for the handoff
    later = stamps.clone()
    for t in prog.tasks:
        at = 10_000 * t.index
        later[t.index] = stamp(at, at + 1_000, at + 1_000, at + 1_000, at + 3_000, 0)
    out = task_ledger(prog, later)
    assert out["stages"] == 2 * (spec.num_layers * 5 + 2)  # a step: its embedding, 5 ops a layer, its head
    for op, v in out["ops"].items():
        assert v["producers_us"] == 0
        assert v["handoff_us"] == pytest.approx(sum(1.0 for t in prog.tasks if t.op == op and t.waits) / 4)


@pytest.mark.parametrize("name,batch,tokens,reason", [
    ("qwen3-0.6b", 65, 1, "1 to 64 rows"),  # 65 decode rows
    ("qwen3-8b", 11, 6, "1 to 64 rows"),  # a verify pass of 66 rows
    ("qwen2.5-0.5b", 1, 10, "exceed the attention tile"),  # 10 tokens x 7 query heads a KV head > 64
])
def test_a_launch_past_the_kernels_row_tile_is_refused_before_it_is_built(name, batch, tokens, reason):
    spec = from_name(name)
    prog = StepProgram(spec, batch, 1 if tokens > 1 else 2, 132, Tiles(), {}, tokens=tokens)  # refused before its tasks
    kv = torch.empty(2, spec.num_layers, batch, spec.num_kv_heads, 64, spec.head_dim, dtype=torch.bfloat16,
                     device="meta")
    with pytest.raises(ValueError, match=reason):
        StepLaunch(prog, {"qkv": kv}, kv)


def test_a_cache_of_other_sequences_than_the_tables_is_refused():
    spec = from_name("qwen3-0.6b")
    prog = StepProgram(spec, 4, 2, 132, Tiles(), {})  # refused before its tasks are read
    kv = torch.empty(2, spec.num_layers, 3, spec.num_kv_heads, 64, spec.head_dim, dtype=torch.bfloat16, device="meta")
    with pytest.raises(ValueError, match="KV cache"):
        StepLaunch(prog, {"qkv": kv}, kv)


def test_activation_tiles_hold_a_whole_k_slice_where_it_fits_else_runs_of_it():
    from conjugate.compiler.step.launch import ACT_BUDGET, activation_tiles

    assert activation_tiles(32, 16) == 32  # the drafts: every slice whole (64 KB)
    assert activation_tiles(64, 16) == 64 and 64 * 16 * 128 == ACT_BUDGET  # an 8B target's lm_head K at 16 rows
    assert activation_tiles(64, 32) == 32 and activation_tiles(64, 64) == 16  # staged in runs
    assert activation_tiles(8, 64) == 8


def test_a_deeper_attention_pipeline_takes_its_shared_memory_from_the_ring_and_depths_are_checked():
    """Attention's key/value buffers live in the activation tiles: asking for more grows the tiles to
    hold them (the GEMMs still stage whole K slices) and the ring keeps what is left; a depth outside
    the kernel's is refused."""
    spec = from_name("qwen3-0.6b")  # 128-dim heads: a 64-key block pair is 32 KB
    prog = step_table(spec, 4, 1, 132, Tiles(), 132)
    kv = torch.empty(2, spec.num_layers, 4, spec.num_kv_heads, 80, spec.head_dim, dtype=torch.bfloat16,
                     device="meta")
    weights = tile_weights(meta_weights(spec, torch.bfloat16), prog)
    launches = {n: StepLaunch(prog, weights, kv, attention_buffers=n).kwargs for n in (None, 1, 2, 3, 4)}
    tile = 16 * layout.K_TILE * 2  # an activation tile: 16 rows
    slot = layout.SLOT_ROWS * layout.K_TILE * 2
    assert launches[None] == launches[2]  # the default: the GEMMs' 16 tiles (32 KB) grown to hold two pairs
    for n in (1, 2, 3, 4):
        kw = launches[n]
        assert kw["KV_BUFS"] == n and kw["KT_MAX"] * tile >= n * 32 * 1024 and kw["CHUNK"] == 0
        assert kw["KT_MAX"] * tile + kw["STAGES"] * slot <= 220 * 1024
    assert [launches[n]["STAGES"] for n in (1, 2, 3, 4)] == [11, 9, 7, 5]
    for depth in (0, 5):
        with pytest.raises(ValueError, match="1 to 4"):
            StepLaunch(prog, weights, kv, attention_buffers=depth)
    assert launches[None]["MMA_DEPTH"] == 2 and StepLaunch(prog, weights, kv, mma_depth=1).kwargs["MMA_DEPTH"] == 1
    with pytest.raises(ValueError, match="1 or 2"):
        StepLaunch(prog, weights, kv, mma_depth=3)
    assert launches[None]["DIRECT_EPILOGUE"]  # on by default where the table is coarse (step_table's)
    assert not StepLaunch(prog, weights, kv, direct_epilogue=False).kwargs["DIRECT_EPILOGUE"]
    early = build(spec, 4, 1, 132)  # per-tile waits: epilogues wait for whole rows, which a direct one would not
    assert not StepLaunch(early, weights, kv).kwargs["DIRECT_EPILOGUE"]  # the default leaves such a table alone
    with pytest.raises(ValueError, match="coarse table"):
        StepLaunch(early, weights, kv, direct_epilogue=True)
    # epilogue inputs (the rows' squares, qkv's bias and positions) load before the count only where every
    # one is complete once a task's waits are met: not on a table whose epilogues wait for whole rows
    assert launches[None]["COARSE"] and not StepLaunch(early, weights, kv).kwargs["COARSE"]


def test_attention_history_goes_through_the_ring_for_64_and_128_dim_heads():
    """ring_kv (on by default where it can be) streams attention's history through the weight ring: a 64-dim head's
    key and value blocks share a 16 KB slot, a 128-dim head's take one each; the cache's descriptor
    reads 64-key blocks of a head's dims; other head sizes read their history themselves by default and
    are refused the option."""
    from conjugate.kernels.step.ring import KV_SLOTS

    assert (KV_SLOTS(64), KV_SLOTS(128)) == (1, 2)
    for name in ("qwen3-0.6b", "qwen2.5-0.5b"):
        spec = from_name(name)
        prog = step_table(spec, 4, 1, 132, Tiles(), 132)
        kv = torch.empty(2, spec.num_layers, 4, spec.num_kv_heads, 80, spec.head_dim, dtype=torch.bfloat16,
                         device="meta")
        weights = tile_weights(meta_weights(spec, torch.bfloat16), prog)
        default, plain = StepLaunch(prog, weights, kv), StepLaunch(prog, weights, kv, ring_kv=False)
        assert default.kwargs["RING_KV"] and not plain.kwargs["RING_KV"]
        assert {k: v for k, v in plain.kwargs.items() if k != "RING_KV"} == \
            {k: v for k, v in default.kwargs.items() if k != "RING_KV"}  # the same ring and tiles
        assert list(default.descs[-1].block_shape) == [64, spec.head_dim]
    spec = replace(from_name("qwen3-0.6b"), head_dim=32, num_heads=64, num_kv_heads=32)
    prog = step_table(spec, 4, 1, 132, Tiles(), 132)
    kv = torch.empty(2, spec.num_layers, 4, spec.num_kv_heads, 80, 32, dtype=torch.bfloat16, device="meta")
    weights = tile_weights(meta_weights(spec, torch.bfloat16), prog)
    assert not StepLaunch(prog, weights, kv).kwargs["RING_KV"]  # the default reads 32-dim heads' history itself
    with pytest.raises(ValueError, match="64 or 128 dims"):
        StepLaunch(prog, weights, kv, ring_kv=True)
