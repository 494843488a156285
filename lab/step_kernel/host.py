"""Lab (#48): the host side of the step kernel (kernel.py): the task table as int32 arrays, the weights
in the loader's tile order, the buffers, and the launch.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "stream_chain"), str(HERE.parents[1])]
from chain import BK, SLOT_ROWS  # noqa: E402
from kernel import (C_COL0, C_DONE, C_FCNT, C_FOFF, C_HEAD0, C_KHI, C_KLO, C_LAYER, C_OP, C_PARTS, C_ROW0,  # noqa: E402
                    C_SEG, C_SPLITS, C_STEP, C_TILE, C_TOKEN, C_W1C, C_W1T, C_WCNT, C_WOFF, OPS, REC, step_kernel)
from program import StepProgram, Tiles, counter_targets  # noqa: E402

# --------------------------------------------------------------------------------------------------
# Host side: the table as int32 arrays, the weights in tile order, the buffers, the launch
# --------------------------------------------------------------------------------------------------

def encode(prog: StepProgram) -> dict[str, torch.Tensor]:
    """The table (one REC-wide int32 row a task), the waits ((counter, target) pairs), each program's
    task list and its bounds, and the number of counters. A GEMM tile of one slice still gets a parts
    counter: its epilogue reads the sums its own atomics wrote, behind the same acq_rel."""
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
        row = [0] * REC.value
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


def tile_weights(w, prog: StepProgram) -> dict[str, torch.Tensor]:
    """Every weight matrix as the loader reads it, bf16: qkv's rows in paired tiles (each tile's heads'
    first halves, then their second halves) and gate_up's (64 gate rows over the same 64 up rows), the
    RMSNorm weights folded into qkv, gate_up and lm_head; qkv's bias in the same order (fp32), the q/k
    norm weights, RoPE's inverse frequencies."""
    from conjugate.models.reference import rope_inv_freq
    from program import qkv_tiles

    spec, dev = prog.spec, w.device
    D, half = spec.head_dim, prog.tiles.half
    qkv, bias, gu = [], [], []
    starts = {"q": 0, "k": spec.q_size, "v": spec.q_size + spec.kv_size}
    for lw in w.layers:
        wqkv = torch.cat([lw.wq, lw.wk, lw.wv]).float() * lw.attn_norm.float()[None, :]
        b = torch.cat([lw.bq, lw.bk, lw.bv]).float() if lw.bq is not None else torch.zeros(spec.qkv_size, device=dev)
        for seg, head0, count in qkv_tiles(spec, prog.tiles):
            assert count * D == 2 * half, "a qkv tile must be full"
            heads = [starts[seg] + (head0 + j) * D for j in range(count)]
            halves = [range(part * D // 2, (part + 1) * D // 2) for part in (0, 1)]
            idx = torch.tensor([h + d for dims in halves for h in heads for d in dims],
                               device=dev)
            qkv.append(wqkv[idx])
            bias.append(b[idx])
        wgu = (torch.cat([lw.w_gate, lw.w_up]).float() * lw.mlp_norm.float()[None, :])
        F = spec.ffn_size
        for t in range(F // half):
            gu += [wgu[t * half:(t + 1) * half], wgu[F + t * half:F + (t + 1) * half]]
    ones = torch.ones(D, device=dev)
    qkn = torch.stack([torch.stack([(lw.q_norm if lw.q_norm is not None else ones).float(),
                                    (lw.k_norm if lw.k_norm is not None else ones).float()]) for lw in w.layers])
    bf16 = torch.bfloat16
    return {"qkv": torch.cat(qkv).to(bf16).contiguous(), "bias": torch.cat(bias).contiguous(),
            "o": torch.cat([lw.wo for lw in w.layers]).to(bf16).contiguous(),
            "gu": torch.cat(gu).to(bf16).contiguous(),
            "d": torch.cat([lw.w_down for lw in w.layers]).to(bf16).contiguous(),
            "head": (w.lm_head.float() * w.final_norm.float()[None, :]).to(bf16).contiguous(),
            "qkn": qkn.contiguous(), "inv_freq": rope_inv_freq(spec).float().to(dev).contiguous(),
            "embed": w.embed.to(bf16).contiguous()}


class StepLaunch:
    """One table's buffers and launch on the GPU. call(last_tokens, lengths, kv) runs the k steps:
    kv [2, L, B, KVH, S, D] bf16 is read and written in place; returns tokens [B, k] and the logits."""

    def __init__(self, prog: StepProgram, weights: dict, capacity: int, spin_limit: int = 1 << 20,
                 stamps: bool = False, attention: str = "cores", spin_sleep: int = 0):
        spec, dev, B, k = prog.spec, weights["qkv"].device, prog.batch, prog.steps
        assert B <= 16 and prog.tiles == Tiles(), "B <= 16, the kernel's tile shapes"
        self.prog, self.w, self.spec = prog, weights, spec
        enc = encode(prog)
        self.table, self.waits = enc["table"].to(dev), enc["waits"].to(dev)
        self.list, self.bounds = enc["list"].to(dev), enc["bounds"].to(dev)
        self.counters = torch.zeros(enc["counters"], dtype=torch.int32, device=dev)
        self.error = torch.zeros(1, dtype=torch.int32, device=dev)
        H, Q, F, V, L = spec.hidden_size, spec.q_size, spec.ffn_size, spec.vocab_size, spec.num_layers
        self.nq = weights["qkv"].shape[0] // (L * SLOT_ROWS)
        self.nth = -(-V // SLOT_ROWS)
        f32, bf16 = torch.float32, torch.bfloat16

        def buf(*shape, dtype=bf16):
            return torch.empty(*shape, dtype=dtype, device=dev)

        self.tokens_in = torch.zeros(BPAD_ROWS, dtype=torch.int32, device=dev)
        self.tokens = torch.zeros(k, BPAD_ROWS, dtype=torch.int32, device=dev)
        self.lengths = torch.zeros(B, dtype=torch.int32, device=dev)
        self.xs, self.xm = buf(k, L + 1, B, H), buf(k, L, B, H)
        self.ssx, self.ssm = buf(k, L + 1, B, dtype=f32), buf(k, L, B, dtype=f32)
        self.q, self.o, self.h = buf(k, L, B, Q), buf(k, L, B, Q), buf(k, L, B, F)
        self.sums = [buf(k, L, B, self.nq * SLOT_ROWS, dtype=f32), buf(k, L, B, H, dtype=f32),
                     buf(k, L, B, 2 * F, dtype=f32), buf(k, L, B, H, dtype=f32),
                     buf(k, B, self.nth * SLOT_ROWS, dtype=f32)]
        self.best_val = buf(k, self.nth, BPAD_ROWS, dtype=f32)
        self.best_idx = buf(k, self.nth, BPAD_ROWS, dtype=torch.int32)
        layout = gl.NVMMASharedLayout.get_default_for([SLOT_ROWS.value, BK.value], gl.bfloat16)
        self.descs = [TensorDescriptor.from_tensor(weights[n], [SLOT_ROWS.value, BK.value], layout)
                      for n in ("qkv", "o", "gu", "d", "head")]
        kt_max = max((t.k_range[1] - t.k_range[0]) // prog.tiles.k for t in prog.tasks if t.op != "attn")
        chunks = prog.splits["attn"]
        gp = max(4, triton.next_power_of_2(spec.num_heads // spec.num_kv_heads))  # the heads span the 4 warps
        pairs = k * L * B * spec.num_kv_heads * chunks
        self.part_ml, self.part_acc = buf(pairs, 2, gp, dtype=f32), buf(pairs, gp, spec.head_dim, dtype=f32)
        act_bytes = kt_max * BPAD_ROWS * BK.value * 2
        stages = min(12, (SMEM_BUDGET - act_bytes) // (SLOT_ROWS.value * BK.value * 2 + 16))
        assert stages >= 2, f"{kt_max} activation tiles leave no room for a ring"
        self.capacity = capacity
        self.kwargs = dict(H=H, Q=Q, F=F, V=V, D=spec.head_dim, G=spec.num_heads // spec.num_kv_heads,
                           KVH=spec.num_kv_heads, L=L, S=capacity, NQ=self.nq, NTH=self.nth, BATCH=B,
                           QK_NORM=spec.qk_norm, STAGES=stages, KT_MAX=kt_max, EPS=spec.rms_norm_eps,
                           QK_SCALE=1.4426950408889634 / spec.head_dim ** 0.5,
                           GP=gp, CHUNKS=chunks, STAMPS=stamps, ATTN_MMA=self.kv_buffers(attention, act_bytes, spec),
                           num_warps=4, maxnreg=168)
        self.stamps = torch.zeros(len(prog.tasks), 3, dtype=torch.int64, device=dev)  # start, waited, end (ns)
        self.spin_limit, self.spin_sleep = spin_limit, spin_sleep

    @staticmethod
    def kv_buffers(attention: str, act_bytes: int, spec) -> int:
        """0: attention on CUDA cores; 1 or 2: on tensor cores, with that many (key, value) block buffers
        in the activation buffer's shared memory (two where it holds them)."""
        if attention == "cores":
            return 0
        block = 2 * 64 * spec.head_dim * 2  # a key block and a value block, bf16
        if act_bytes < block:
            raise ValueError(f"tensor-core attention needs {block} bytes of the activation buffer, "
                             f"which has {act_bytes}")
        return 2 if act_bytes >= 2 * block else 1

    def args(self, kv):
        return (*self.descs, self.table, self.list, self.bounds, self.waits, self.counters, self.error, self.spin_limit,
                self.spin_sleep, self.prog.batch, self.tokens_in, self.tokens, self.lengths, self.w["embed"], self.xs,
                self.xm, self.ssx, self.ssm, self.q, self.o, self.h, kv, *self.sums, self.best_val, self.best_idx,
                self.w["bias"], self.w["qkn"], self.w["inv_freq"], self.part_ml, self.part_acc, self.stamps)

    def run(self, kv) -> None:
        """Zero the sums, statistics and counters, launch (graph-capturable: no host sync)."""
        for s in self.sums:
            s.zero_()
        self.ssx.zero_()
        self.ssm.zero_()
        self.counters.zero_()
        step_kernel[(self.prog.programs, )](*self.args(kv), **self.kwargs)


BPAD_ROWS = 16
SMEM_BUDGET = 220 * 1024


