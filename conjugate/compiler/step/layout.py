"""The step launch's host side of its data: the task table as int32 records the kernel reads
(kernels/step/columns.py), and the draft's weights in the order its loader streams them. Plain torch:
importable without a GPU."""
from __future__ import annotations

import torch

from conjugate.compiler.step.table import StepProgram, counter_targets, qkv_tiles
from conjugate.kernels.step.columns import (C_COL0, C_DONE, C_FCNT, C_FOFF, C_HEAD0, C_KHI, C_KLO, C_LAYER, C_OP, C_PARTS,
                                            C_ROW0, C_SEG, C_SPLITS, C_STEP, C_TILE, C_TOKEN, C_W1C, C_W1T, C_WCNT,
                                            C_WOFF, OPS, REC)
from conjugate.models.reference import rope_inv_freq


def encode(prog: StepProgram) -> dict[str, torch.Tensor]:
    """The table (one REC-wide int32 row a task), the waits ((counter, target) pairs), each program's
    task list and its bounds, and the number of counters. A GEMM tile of one slice still gets a parts
    counter: its epilogue reads the sums its own atomics wrote, behind the same acq_rel (unless the
    launch runs whole gate_up and lm_head tiles' epilogues on their accumulators: `direct_epilogue`)."""
    spec, tiles = prog.spec, prog.tiles
    names: dict[str, int] = {}

    def counter(name: str) -> int:
        return names.setdefault(name, len(names))

    for name in counter_targets(prog):
        counter(name)
    waits: list[int] = []
    rows = []
    n_gu = spec.ffn_size // tiles.half
    pairs_per_layer = -(-spec.qkv_size // (2 * tiles.half))
    for t in prog.tasks:
        row = [0] * REC
        row[C_OP], row[C_STEP], row[C_LAYER], row[C_TILE] = OPS[t.op], t.step, max(t.layer, 0), t.tile
        row[C_KLO], row[C_KHI], row[C_SPLITS] = t.k_range[0] // tiles.k, t.k_range[1] // tiles.k, t.splits
        assert t.op == "attn" or (t.k_range[0] % tiles.k == 0 and t.k_range[1] % tiles.k == 0), "K in whole tiles"
        row[C_PARTS] = counter(t.parts or f"parts1/{t.index}")
        row[C_DONE] = counter(t.done)
        row[C_WOFF], row[C_WCNT] = len(waits) // 2, len(t.waits)
        if t.waits:
            row[C_W1C], row[C_W1T] = counter(t.waits[0][0]), t.waits[0][1]
        waits += [v for name, target in t.waits for v in (counter(name), target)]
        row[C_FOFF], row[C_FCNT] = len(waits) // 2, len(t.finish_waits)
        waits += [v for name, target in t.finish_waits for v in (counter(name), target)]
        row[C_COL0] = t.out[0][0]
        if t.op == "attn":
            row[C_KLO], row[C_KHI] = t.k_range  # chunk, chunks
        if t.op == "qkv":
            row[C_ROW0] = (t.layer * pairs_per_layer + t.tile) * 2 * tiles.half  # tile_weights' order
            first = t.out[0][0]
            seg = 0 if first < spec.q_size else (1 if first < spec.q_size + spec.kv_size else 2)
            base = (0, spec.q_size, spec.q_size + spec.kv_size)[seg]
            row[C_SEG], row[C_HEAD0] = seg, (first - base) // spec.head_dim
        elif t.op == "attn":
            row[C_SEG], row[C_HEAD0] = divmod(t.tile, spec.num_kv_heads)
        elif t.op in ("o_proj", "down"):
            row[C_ROW0] = t.layer * spec.hidden_size + t.out[0][0]
        elif t.op == "gate_up":
            row[C_ROW0] = (t.layer * n_gu + t.tile) * 2 * tiles.half
        elif t.op == "head":
            row[C_ROW0] = t.out[0][0]
            row[C_TOKEN] = counter(f"token/{t.step}")
        rows.append(row)
    order = [t.index for p in range(prog.programs) for t in prog.of_program(p)]
    bounds = [0]
    for p in range(prog.programs):
        bounds.append(bounds[-1] + len(prog.of_program(p)))
    as_int = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    return {"table": as_int(rows), "waits": as_int(waits or [0, 0]), "list": as_int(order), "bounds": as_int(bounds),
            "counters": len(names)}


def qkv_rows(spec, tiles) -> torch.Tensor:
    """qkv's rows in the loader's order: per paired tile, its heads' first halves, then their second
    halves (the same order for every layer)."""
    D, half = spec.head_dim, tiles.half
    starts = {"q": 0, "k": spec.q_size, "v": spec.q_size + spec.kv_size}
    rows = []
    for seg, head0, count in qkv_tiles(spec, tiles):
        assert count * D == 2 * half, "a qkv tile must be full"
        heads = [starts[seg] + (head0 + j) * D for j in range(count)]
        rows += [h + d for part in (0, 1) for h in heads for d in range(part * D // 2, (part + 1) * D // 2)]
    return torch.tensor(rows)


def gate_up_rows(spec, tiles) -> torch.Tensor:
    """gate_up's rows in the loader's order: per tile, `half` gate rows over the same `half` up rows."""
    F, half = spec.ffn_size, tiles.half
    return torch.arange(F).view(-1, half).repeat_interleave(2, dim=0).view(-1, half) + \
        torch.tensor([0, F]).repeat(F // half)[:, None]


def tile_weights(w, prog: StepProgram) -> dict[str, torch.Tensor]:
    """Every weight matrix as the loader reads it, bf16: qkv's rows in paired tiles (each tile's heads'
    first halves, then their second halves) and gate_up's (`half` gate rows over the same up rows), the
    RMSNorm weights folded into qkv, gate_up and lm_head; qkv's bias in the same order (fp32), the q/k
    norm weights, RoPE's inverse frequencies."""
    spec, dev, bf16 = prog.spec, w.device, torch.bfloat16
    D = spec.head_dim
    qkv_order, gu_order = qkv_rows(spec, prog.tiles).to(dev), gate_up_rows(spec, prog.tiles).flatten().to(dev)
    qkv, bias, gu = [], [], []
    for lw in w.layers:
        wqkv = torch.cat([lw.wq, lw.wk, lw.wv]).float() * lw.attn_norm.float()[None, :]
        b = torch.cat([lw.bq, lw.bk, lw.bv]).float() if lw.bq is not None else torch.zeros(spec.qkv_size, device=dev)
        qkv.append(wqkv[qkv_order].to(bf16))
        bias.append(b[qkv_order])
        gu.append((torch.cat([lw.w_gate, lw.w_up]).float() * lw.mlp_norm.float()[None, :])[gu_order].to(bf16))
    ones = torch.ones(D, device=dev)
    qkn = torch.stack([torch.stack([(lw.q_norm if lw.q_norm is not None else ones).float(),
                                    (lw.k_norm if lw.k_norm is not None else ones).float()]) for lw in w.layers])
    return {"qkv": torch.cat(qkv).contiguous(), "bias": torch.cat(bias).contiguous(),
            "o": torch.cat([lw.wo for lw in w.layers]).to(bf16).contiguous(),
            "gu": torch.cat(gu).contiguous(),
            "d": torch.cat([lw.w_down for lw in w.layers]).to(bf16).contiguous(),
            "head": (w.lm_head.float() * w.final_norm.float()[None, :]).to(bf16).contiguous(),
            "qkn": qkn.contiguous(), "inv_freq": rope_inv_freq(spec).float().to(dev).contiguous(),
            "embed": w.embed.to(bf16).contiguous()}
