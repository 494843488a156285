"""The step table's folded MLP block (table.build(folded_mlp=True)): each MLP block one op of whole-K
tasks that add h times down into down's sums, read by the next layer's qkv, the head and o_proj's
residual epilogue. Its simulation against the reference, its structure, its records and loads, and
its launch's options."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from conjugate.compiler.step.launch import StepLaunch
from conjugate.compiler.step.layout import encode, tile_weights
from conjugate.compiler.step.simulate import simulate
from conjugate.compiler.step.table import ProgramError, Tiles, build, check, coarsen, step_table
from conjugate.kernels.step import columns as layout
from conjugate.models.presets import from_name
from conjugate.models.weights import meta_weights
from step_cases import SMALL, assert_simulates_reference, reference_phase, step_case  # tests/step_cases.py

@pytest.mark.parametrize("name", ["tiny-llama-d", "tiny-qwen2-d", "tiny-qwen3-d", "tiny-llama-t"])
@pytest.mark.parametrize("programs,coarse", [(3, False), (7, True), (40, False), (40, True)])
def test_a_folded_table_gives_the_reference_tokens(name, programs, coarse):
    w, inputs = step_case(name, batch=3)
    prog = build(w.spec, 3, 3, programs, SMALL, folded_mlp=True)
    prog = coarsen(prog) if coarse else prog
    check(prog, sms=132)
    assert_simulates_reference(prog, w, inputs, 3)


def test_each_block_is_one_stage_of_whole_k_tasks_its_readers_wait_for():
    """One mlp op a layer in place of gate_up and down (a stage fewer each layer-step), a task per h
    tile with the whole of K; the next layer's qkv and the head wait for every one of the block's
    tasks, layer 0's qkv for the embedding as before."""
    spec = from_name("qwen3-0.6b")
    default, folded = step_table(spec, 4, 2, 132), step_table(spec, 4, 2, 132, folded_mlp=True)
    assert {t.op for t in folded.tasks} == {"embed", "qkv", "attn", "o_proj", "mlp", "head"}
    stages = lambda p: len({t.stage for t in p.tasks})  # noqa: E731
    assert stages(default) - stages(folded) == 2 * spec.num_layers
    mlp = [t for t in folded.tasks if t.op == "mlp" and t.step == 1 and t.layer == 3]
    assert len(mlp) == spec.ffn_size // 64 and all(t.k_range == (0, spec.hidden_size) and t.splits == 1 for t in mlp)
    assert all(t.waits == (("xm/1/3", 1024 // 128), ) for t in mlp)
    block = ("mlp/1/3", spec.ffn_size // 64)
    assert all(t.waits == (block, ) for t in folded.tasks if t.op == "qkv" and t.step == 1 and t.layer == 4)
    assert all(t.waits == (("x/1/0", 8), ) for t in folded.tasks if t.op == "qkv" and t.step == 1 and t.layer == 0)
    last = (f"mlp/1/{spec.num_layers - 1}", spec.ffn_size // 64)
    assert all(t.waits == (last, ) for t in folded.tasks if t.op == "head" and t.step == 1)
    assert folded.splits["mlp"] == 1 and "gate_up" not in folded.splits and "down" not in folded.splits


def test_a_block_cut_in_k_or_a_verify_pass_is_refused():
    spec = from_name("tiny-qwen2-d")
    with pytest.raises(ProgramError, match="whole K"):
        build(spec, 2, 1, 8, SMALL, splits={"mlp": 2}, folded_mlp=True)
    with pytest.raises(ProgramError, match="one token"):
        build(spec, 2, 1, 8, SMALL, tokens=3, folded_mlp=True)
    with pytest.raises(ProgramError, match="one K tile"):
        build(spec, 2, 1, 8, Tiles(k=16, rows=32, half=32), folded_mlp=True)


def test_a_read_before_the_block_is_in_is_caught():
    """Drop the waits of layer 1's qkv tasks: they stage x before every mlp task of layer 0 has added
    its products (the simulation's x is then NaN, as a half-finished sum on a GPU is wrong), and the
    tokens or logits leave the reference."""
    w, inputs = step_case("tiny-qwen2-d", batch=2)
    prog = coarsen(build(w.spec, 2, 2, 16, SMALL, folded_mlp=True))
    tasks = [replace(t, waits=()) if t.op == "qkv" and t.layer == 1 else t for t in prog.tasks]
    ref_tokens, ref_logits, _ = reference_phase(w, inputs, 2)
    wrong = 0
    for seed in range(4):
        out = simulate(replace(prog, tasks=tasks), w, inputs.draft_last_tokens, inputs.draft_cache,
                       inputs.draft_lengths, seed=seed)
        wrong += not torch.equal(out.tokens, ref_tokens) or not torch.allclose(out.logits, ref_logits, atol=1e-4)
    assert wrong > 0


def _slots_as_the_loader_streams(enc, p: int, hidden: int) -> int:
    """What kernels/step/ring.py's step_loader issues for program p: per task of its list, KHI - KLO
    K tiles for a GEMM, and an mlp task's hidden / SLOT_ROWS down tiles after them."""
    table, order, bounds = enc["table"], enc["list"].tolist(), enc["bounds"].tolist()
    slots = 0
    for task in order[bounds[p]:bounds[p + 1]]:
        row = table[task]
        op = int(row[layout.C_OP])
        if op not in (layout.OPS["embed"], layout.OPS["attn"]):
            slots += int(row[layout.C_KHI]) - int(row[layout.C_KLO])
        if op == layout.OPS["mlp"]:
            slots += hidden // layout.SLOT_ROWS
    return slots


def test_records_and_loads_of_a_folded_table():
    """An mlp task's record: op 7, whole K, gate_up's weight row; every program's loader streams the
    slots its compute partition consumes (gate_up's K tiles, then one tile of down per row tile)."""
    spec = from_name("qwen2.5-0.5b")
    prog = step_table(spec, 4, 1, 132, folded_mlp=True)
    enc = encode(prog)
    table = enc["table"]
    n_gu = spec.ffn_size // 64
    for t in prog.tasks:
        if t.op == "mlp":
            row = table[t.index]
            assert int(row[layout.C_OP]) == 7 and int(row[layout.C_KLO]) == 0
            assert int(row[layout.C_KHI]) == spec.hidden_size // 64
            assert int(row[layout.C_ROW0]) == (t.layer * n_gu + t.tile) * 128 and int(row[layout.C_TILE]) == t.tile
    for p in (0, 1, 77, 131):
        assert _slots_as_the_loader_streams(enc, p, spec.hidden_size) == prog.loads(p)
    assert sum(prog.loads(p) for p in range(132)) == sum(
        _slots_as_the_loader_streams(enc, p, spec.hidden_size) for p in range(132))
    mlp_slots = sum(1 for t in prog.tasks if t.op == "mlp") * (spec.hidden_size // 64 + spec.hidden_size // 128)
    default = step_table(spec, 4, 1, 132)
    gemm_slots = lambda p, ops: sum((t.k_range[1] - t.k_range[0]) // 64 for t in p.tasks if t.op in ops)  # noqa
    assert mlp_slots == gemm_slots(default, ("gate_up", "down"))  # the same weights, streamed once


def test_the_launch_compiles_the_folded_paths_only_for_a_folded_table():
    spec = from_name("qwen3-0.6b")
    kv = torch.empty(2, spec.num_layers, 4, spec.num_kv_heads, 80, spec.head_dim, dtype=torch.bfloat16,
                     device="meta")
    folded = step_table(spec, 4, 1, 132, folded_mlp=True)
    weights = tile_weights(meta_weights(spec, torch.bfloat16), folded)
    assert StepLaunch(folded, weights, kv).kwargs["FOLDED_MLP"]
    assert not StepLaunch(step_table(spec, 4, 1, 132), weights, kv).kwargs["FOLDED_MLP"]
    llama = from_name("llama-3.2-1b")  # K of 32 tiles at 64 rows: more than the activation tiles hold
    prog = step_table(llama, 40, 1, 132, folded_mlp=True)
    kv = torch.empty(2, llama.num_layers, 40, llama.num_kv_heads, 80, llama.head_dim, dtype=torch.bfloat16,
                     device="meta")
    with pytest.raises(ValueError, match="whole rows"):
        StepLaunch(prog, tile_weights(meta_weights(llama, torch.bfloat16), prog), kv)
