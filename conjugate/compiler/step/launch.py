"""One step launch on a Hopper GPU: a checked task table's buffers and the Gluon kernel over them.

    launch = StepLaunch(table, tile_weights(weights, table), kv)   # kv: [2, L, B, KVH, S, D] bf16
    launch.tokens_in[:B] = last_tokens; launch.lengths.copy_(lengths)
    launch.run()                                                     # graph-capturable: no host sync
    tokens = launch.tokens[:, :B].T                                  # [B, k]; launch.error: spins that ran out
"""
from __future__ import annotations

import torch
import triton
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from conjugate.compiler.step.layout import encode
from conjugate.compiler.step.table import StepProgram, Tiles
from conjugate.kernels.step.columns import K_TILE, ROW_TILES, SLOT_ROWS, STAMP_COLS
from conjugate.kernels.step.device import step_kernel

SMEM_BUDGET = 220 * 1024  # shared memory a program may take: the ring and the activation tiles
ACT_BUDGET = 128 * 1024  # the activation tiles' share of it at most (the ring keeps 5 or more slots)
SPIN_LIMIT = 1 << 20  # polls of one wait before it counts an error (a checked table never gets there)
KEY_BLOCK = 64  # keys per attention block (the wgmma N of the scores)
MAX_KV_BUFFERS = 4  # attention's key/value pipeline depth at most
# Attention's depth by default: two block pairs (one loading while one is used), the activation tiles
# grown to hold them where the GEMMs' share would not. Measured on an H100 against one (the tiles as
# the GEMMs need them; lab/step_attention/h100.json): qwen3-0.6b's draft phase 4.3-4.9% faster,
# qwen2.5-0.5b's 0.6-0.8%, qwen2.5-1.5b's 0.3-1.0% slower; three and four lost their ring slots' worth.
KV_BUFFERS = 2
# K tiles whose wgmma a GEMM task keeps in flight: with 2 the next tile's is issued before the last's
# is done. Measured on an H100 against 1 (lab/step_variants/h100_mma_depth.json, one process, every
# variant checked first): the draft phase 0.7% faster on qwen3-06b-8b-b4, 1.4% on qwen25-05b-7b-b8,
# 0.5% on llama-1b-8b-b1 (the GEMMs' product time 2-14% shorter).
MMA_DEPTH = 2
# gate_up's and lm_head's epilogues straight from a whole tile's accumulators (a tile whose K is one
# task's) instead of through the fp32 sums and the parts counter, wherever the table allows it
# (`python lab/step_variants/variants.py ... --variants default direct_epilogue=1`, H200, checkout
# e0107a0 with 83e401c reverted, each variant checked first; lab/step_variants/h200_direct_epilogue.json):
# the draft phase 5.142 -> 5.100 ms on qwen3-06b-8b-b4, 3.730 -> 3.630 on llama-1b-8b-b1, 4.284 -> 4.100
# on llama-1b-8b-b8, 3.441 -> 3.180 on qwen25-05b-7b-b8 (every pass below every pass).
DIRECT_EPILOGUE = True
# Attention's history (every whole key block below a sequence's length at launch, which no task of the
# launch writes) streamed by the loader into the weight ring before the task's waits end, instead of
# read by the compute warpgroup after them (`lab/step_variants/variants.py ... --variants default ring_kv=1`,
# H100, checkout 5050a07 with lab/step_stages/ring_kv.patch, each variant checked first;
# lab/step_stages/h100_ring_kv.json): the draft phase 5.507 -> 5.262 ms on qwen3-06b-8b-b4, 3.326 -> 3.252
# on qwen25-05b-7b-b8, 7.293 -> 7.018 on qwen3-0.6b at B=1, k=7, context 2048, 5.004 -> 4.834 on llama-1b-8b-b8.
RING_KV = True
# StepLaunch's tuning options (the keyword arguments CompiledStep.use_launch_options passes on)
LAUNCH_OPTIONS = ("attention_buffers", "mma_depth", "direct_epilogue", "ring_kv")


class StepLaunch:
    """The buffers of one table and its launch. Activations between ops are bf16, the GEMMs' partial
    sums and the norms' summed squares fp32; `stamps` (int64 [tasks, STAMP_COLS], ns; columns.py's
    S_*) are written with stamps=True. With logits=True the lm_head's epilogue leaves each step's
    fp32 logits in its sums (`logits()`). Tuning (defaults below): `attention_buffers` (key/value
    blocks in flight, 1-4), `mma_depth` (K tiles' wgmma in flight, 1-2), `direct_epilogue` (whole
    gate_up and lm_head tiles' epilogues on their accumulators; by default wherever the table is
    coarse, as step_table's are), `ring_kv` (attention's history through the loader's ring; by
    default wherever the heads have 64 or 128 dims and the cache's rows fit a TMA coordinate). On a
    coarse table the epilogues' inputs besides their sums load before the product or the pieces' count
    (the kernel's COARSE; measured against loading them after the count, `lab/step_stages/h100_early.json`:
    0.06-2.4% off the draft phase on seven H100 examples)."""

    kernel = step_kernel

    def __init__(self, prog: StepProgram, weights: dict, kv: torch.Tensor, stamps: bool = False,
                 spin_limit: int = SPIN_LIMIT, logits: bool = False, attention_buffers: int | None = None,
                 mma_depth: int = MMA_DEPTH, direct_epilogue: bool | None = None, ring_kv: bool | None = None):
        spec, dev, B, R, k = prog.spec, weights["qkv"].device, prog.batch, prog.rows, prog.steps
        group = spec.num_heads // spec.num_kv_heads
        if R > ROW_TILES[-1] or prog.tiles != Tiles():
            raise ValueError(f"the step kernel runs 1 to {ROW_TILES[-1]} rows a step at its own tile shapes")
        rpad = next(t for t in ROW_TILES if t >= R)
        cache = (2, spec.num_layers, B, spec.num_kv_heads, spec.head_dim)
        if kv.dim() != 6 or tuple(kv.shape[:4]) + (kv.shape[5],) != cache:
            raise ValueError(f"the KV cache is {tuple(kv.shape)}; the table needs (2, layers, sequences, KV heads, "
                             f"positions, head dim) = {cache[:4] + ('S',) + cache[4:]}")
        if group * prog.tokens > KEY_BLOCK:
            raise ValueError(f"{prog.tokens} tokens x {group} query heads a KV head exceed the attention tile's "
                             f"{KEY_BLOCK} rows")
        self.prog, self.w, self.spec, self.kv = prog, weights, spec, kv
        enc = encode(prog)
        self.table, self.waits = enc["table"].to(dev), enc["waits"].to(dev)
        self.list, self.bounds = enc["list"].to(dev), enc["bounds"].to(dev)
        self.counters = torch.zeros(enc["counters"], dtype=torch.int32, device=dev)
        self.error = torch.zeros(1, dtype=torch.int32, device=dev)
        H, Q, F, V, L = spec.hidden_size, spec.q_size, spec.ffn_size, spec.vocab_size, spec.num_layers
        nq = weights["qkv"].shape[0] // (L * SLOT_ROWS)
        nth = -(-V // SLOT_ROWS)
        f32, bf16 = torch.float32, torch.bfloat16

        def buf(*shape, dtype=bf16):
            return torch.empty(*shape, dtype=dtype, device=dev)

        self.tokens_in = torch.zeros(rpad, dtype=torch.int32, device=dev)
        self.tokens = torch.zeros(k, rpad, dtype=torch.int32, device=dev)
        self.lengths = torch.zeros(B, dtype=torch.int32, device=dev)
        self.xs, self.xm = buf(k, L + 1, R, H), buf(k, L, R, H)
        self.ssx, self.ssm = buf(k, L + 1, R, dtype=f32), buf(k, L, R, dtype=f32)
        self.q, self.o, self.h = buf(k, L, R, Q), buf(k, L, R, Q), buf(k, L, R, F)
        self.sums = [buf(k, L, R, nq * SLOT_ROWS, dtype=f32), buf(k, L, R, H, dtype=f32),
                     buf(k, L, R, 2 * F, dtype=f32), buf(k, L, R, H, dtype=f32),
                     buf(k, R, nth * SLOT_ROWS, dtype=f32)]
        self.best_val = buf(k, nth, rpad, dtype=f32)
        self.best_idx = buf(k, nth, rpad, dtype=torch.int32)
        layout = gl.NVMMASharedLayout.get_default_for([SLOT_ROWS, K_TILE], gl.bfloat16)
        self.descs = [TensorDescriptor.from_tensor(weights[n], [SLOT_ROWS, K_TILE], layout)
                      for n in ("qkv", "o", "gu", "d", "head")]
        heads_fit, cache_rows = spec.head_dim in (64, 128), kv.numel() // spec.head_dim
        if ring_kv is None:
            ring_kv = RING_KV and heads_fit and cache_rows < 2 ** 31
        elif ring_kv and not heads_fit:
            raise ValueError(f"attention's history goes through the ring for heads of 64 or 128 dims, not "
                             f"{spec.head_dim}")
        elif ring_kv and cache_rows >= 2 ** 31:
            raise ValueError(f"the KV cache's {cache_rows} rows exceed a TMA coordinate's 2^31")
        self.descs.append(TensorDescriptor.from_tensor(  # the cache as rows of one head's dims
            kv.view(-1, spec.head_dim), [KEY_BLOCK, spec.head_dim],
            gl.NVMMASharedLayout.get_default_for([KEY_BLOCK, spec.head_dim], gl.bfloat16)))
        kt_max = max((t.k_range[1] - t.k_range[0]) // prog.tiles.k for t in prog.tasks if t.op != "attn")
        chunks = prog.splits["attn"]
        gp = max(4, triton.next_power_of_2(group * prog.tokens))  # a pair's query rows; they span the 4 warps
        pairs = k * L * B * spec.num_kv_heads * chunks
        self.part_ml, self.part_acc = buf(pairs, 2, gp, dtype=f32), buf(pairs, gp, spec.head_dim, dtype=f32)
        act_tiles = activation_tiles(kt_max, rpad)
        attention_buffers = KV_BUFFERS if attention_buffers is None else attention_buffers
        if mma_depth not in (1, 2):
            raise ValueError(f"a GEMM keeps 1 or 2 K tiles' wgmma in flight, not {mma_depth}")
        # every input of an epilogue is complete once its task's waits are met (a direct epilogue runs, and
        # the epilogues' inputs load, before a last piece's finish waits)
        coarse = not any(t.finish_waits for t in prog.tasks)
        if direct_epilogue is None:
            direct_epilogue = DIRECT_EPILOGUE and coarse
        elif direct_epilogue and not coarse:
            raise ValueError("epilogues on the accumulators need a coarse table (step_table's): this one's tiles "
                             "wait for whole rows before their epilogues")
        act_tiles = max(act_tiles, attention_tiles(attention_buffers, spec.head_dim, rpad))
        chunk = 0 if act_tiles >= kt_max else act_tiles  # whole K slices, else runs as long as the tiles hold
        act_bytes = act_tiles * rpad * K_TILE * 2
        stages = min(12, (SMEM_BUDGET - act_bytes) // (SLOT_ROWS * K_TILE * 2 + 16))
        if stages < 2:
            raise ValueError(f"{act_tiles} activation tiles ({act_bytes} bytes) leave no shared memory for a ring")
        self.kwargs = dict(H=H, Q=Q, F=F, V=V, D=spec.head_dim, G=group,
                           KVH=spec.num_kv_heads, L=L, S=kv.shape[4], NQ=nq, NTH=nth, BATCH=B,
                           QK_NORM=spec.qk_norm, STAGES=stages, KT_MAX=act_tiles, EPS=spec.rms_norm_eps,
                           QK_SCALE=1.4426950408889634 / spec.head_dim ** 0.5, GP=gp, CHUNKS=chunks, STAMPS=stamps,
                           KV_BUFS=attention_buffers, TOKENS=prog.tokens, LOGITS=logits, RPAD=rpad, CHUNK=chunk,
                           MMA_DEPTH=mma_depth, DIRECT_EPILOGUE=bool(direct_epilogue), RING_KV=bool(ring_kv),
                           COARSE=coarse,
                           num_warps=4,
                           maxnreg=168)
        self.stamps = torch.zeros(len(prog.tasks), STAMP_COLS, dtype=torch.int64, device=dev)
        self.spin_limit = spin_limit

    def args(self) -> tuple:
        return (*self.descs, self.table, self.list, self.bounds, self.waits, self.counters, self.error, self.spin_limit,
                self.prog.rows, self.tokens_in, self.tokens, self.lengths, self.w["embed"], self.xs, self.xm,
                self.ssx, self.ssm, self.q, self.o, self.h, self.kv, *self.sums, self.best_val, self.best_idx,
                self.w["bias"], self.w["qkn"], self.w["inv_freq"], self.part_ml, self.part_acc, self.stamps)

    def logits(self) -> torch.Tensor:
        """[steps, rows, V] fp32: the last run's logits (a launch built with logits=True)."""
        if not self.kwargs["LOGITS"]:
            raise ValueError("this step launch keeps no logits (built without logits=True)")
        return self.sums[4][:, :, :self.spec.vocab_size]

    def run(self) -> None:
        """Zero the sums, statistics, counters and the error word, and launch one program per table
        program. The error word counts this launch's waits that ran out of spins."""
        self.error.zero_()
        for s in self.sums:
            s.zero_()
        self.ssx.zero_()
        self.ssm.zero_()
        self.counters.zero_()
        step_kernel[(self.prog.programs,)](*self.args(), **self.kwargs)

    def warmup(self):
        """Compile without running; returns Triton's compiled kernel (registers, spills, shared memory)."""
        return step_kernel.warmup(*self.args(), **self.kwargs, grid=(self.prog.programs,))


def activation_tiles(kt_max: int, rpad: int) -> int:
    """K tiles of activation rows a program stages at once: every task's whole K slice where that fits
    ACT_BUDGET, else as many as fit (the kernel then stages and multiplies a slice a run at a time)."""
    tile = rpad * K_TILE * 2
    return kt_max if kt_max * tile <= ACT_BUDGET else ACT_BUDGET // tile


def attention_tiles(buffers: int, head_dim: int, rpad: int) -> int:
    """Activation tiles whose shared memory holds `buffers` key/value block pairs (attention's
    pipeline, 1 to MAX_KV_BUFFERS deep, in the activation tiles while no GEMM uses them)."""
    if not 1 <= buffers <= MAX_KV_BUFFERS:
        raise ValueError(f"attention takes 1 to {MAX_KV_BUFFERS} key/value buffers, not {buffers}")
    block = 2 * KEY_BLOCK * head_dim * 2
    tile = rpad * K_TILE * 2
    return -(-buffers * block // tile)
