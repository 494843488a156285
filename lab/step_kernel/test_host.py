"""CPU checks of the step kernel's host side (host.py): the weights in the loader's tile order and the
table's records, against the contract the kernel reads them by (kernel.py).

    python -m pytest -q lab/step_kernel
"""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import host  # noqa: E402
import kernel  # noqa: E402
from program import Tiles, build, coarsen, qkv_tiles  # noqa: E402

from conjugate.models.presets import from_name  # noqa: E402
from conjugate.models.weights import random_weights  # noqa: E402

SMALL = Tiles(k=16, rows=32, half=16)


@pytest.mark.parametrize("name", ["tiny-llama-d", "tiny-qwen2-d", "tiny-qwen3-d"])
def test_qkv_rows_are_where_the_epilogue_reads_them(name):
    """Row r of qkv tile t is dim r % (D/2) of head head0 + r // (D/2) (first halves), row half + r the
    same head's dim D/2 + r % (D/2), each times the attention norm's weight; the bias in the same order."""
    w = random_weights(from_name(name), seed=1)
    spec, prog = w.spec, build(w.spec, 2, 1, 8, SMALL)
    laid = host.tile_weights(w, prog)
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
    laid = host.tile_weights(w, prog)
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
    enc = host.encode(prog)
    table, waits = enc["table"], enc["waits"].view(-1, 2)
    c = {name: int(getattr(kernel, name)) for name in dir(kernel) if name.startswith("C_")}
    n_gu, pairs = spec.ffn_size // SMALL.half, len(qkv_tiles(spec, SMALL))
    for t in prog.tasks:
        row = table[t.index]
        assert int(row[c["C_OP"]]) == kernel.OPS[t.op] and int(row[c["C_STEP"]]) == t.step
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
