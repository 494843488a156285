"""Lab experiment (not product code): verify-phase decode attention streamed like chain.py, #49's shape.

Each of B rows brings T = k+1 new queries per query head; its keys and values are already in the
cache at positions [0, len_b), the new ones at the end. Query heads share a KV head in groups of G:

    out[b, t, h] = softmax(q[b, t, h] . K[b, h // G, :p+1]^T * scale) V[b, h // G, :p+1],  p = len_b - T + t

At these sizes the attention reads the cache once and does little else, so it is a streaming
problem, dealt like chain.py's GEMMs:

* a unit is (row b, KV head g, chunk c of CH keys). Units are dealt round-robin over one program per
  SM. A unit's T x G queries are one 64-row wgmma tile (rows past T*G idle, which costs MMA time, not
  bytes);
* a 1-warp loader TMA-loads every K and V tile of its units below len_b into a ring. It waits only
  for free slots;
* the compute warpgroup runs S = Q K^T (Q from registers), the causal and length mask, an online
  softmax in base 2, and O += P V (P from registers). It writes the unit's (m, l, O) and counts the
  unit in. The last unit of (b, g) to arrive merges the chunks and writes out.

    python lab/stream_chain/attention.py --json OUT.json   # Hopper GPU: check, time beside torch SDPA
    python lab/stream_chain/attention.py --offline         # no GPU: compile for sm_90a
    python -m pytest -q lab/stream_chain                   # CPU: dealing, masks and merge simulated
"""
from __future__ import annotations

import argparse
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

sys.path.insert(0, str(Path(__file__).parent))
from chain import (_slot, compile_for_sm90, graph_time_us, hopper_and_copy_rate, ring_barriers,  # noqa: E402
                   write_probe_result)

Q_ROWS = 64        # a unit's T x G queries, padded to one wgmma tile
KEYS_PER_TILE = 64
QROWS = gl.constexpr(Q_ROWS)
BLOCK_N = gl.constexpr(KEYS_PER_TILE)
LOG2E = gl.constexpr(1.4426950408889634)


@gluon.jit
def _unit(u, HKV, NCH):
    """Unit u's (row b, KV head g, chunk c)."""
    return u // (HKV * NCH), (u // NCH) % HKV, u % NCH


@gluon.jit
def _unit_tiles(lens_ptr, b, c, CH: gl.constexpr):
    """The K/V tiles of chunk c below row b's length (0 for a chunk past it)."""
    keys = gl.minimum(gl.maximum(gl.load(lens_ptr + b) - c * CH, 0), CH)
    return gl.cdiv(keys, BLOCK_N)


@gluon.jit
def load_partition(k_desc, v_desc, k_ring, v_ring, ready, empty, lens_ptr, units, HKV, NCH, CTX,
                   CH: gl.constexpr, STAGES: gl.constexpr):
    nbytes: gl.constexpr = k_desc.block_type.nbytes + v_desc.block_type.nbytes
    i = 0
    for u in range(gl.program_id(0), units, gl.num_programs(0)):
        b, g, c = _unit(u, HKV, NCH)
        row0 = (b * HKV + g) * CTX + c * CH
        for j in range(_unit_tiles(lens_ptr, b, c, CH)):
            s, phase = _slot(i, STAGES)
            mbarrier.wait(empty.index(s), phase ^ 1)
            mbarrier.expect(ready.index(s), nbytes)
            tma.async_copy_global_to_shared(k_desc, [row0 + j * BLOCK_N, 0], ready.index(s), k_ring.index(s))
            tma.async_copy_global_to_shared(v_desc, [row0 + j * BLOCK_N, 0], ready.index(s), v_ring.index(s))
            i += 1


@gluon.jit
def _load_queries(q_ptr, b, g, T, HQ, G, D: gl.constexpr, layout: gl.constexpr):
    """Q tile [64, D]: row r is query t = r // G of head g*G + r % G (rows past T*G are zero)."""
    r = gl.arange(0, QROWS, layout=gl.SliceLayout(1, layout))
    d = gl.arange(0, D, layout=gl.SliceLayout(0, layout))
    row = (b * T + r // G) * HQ + g * G + r % G
    return gl.load(q_ptr + row[:, None] * D + d[None, :], mask=(r < T * G)[:, None], other=0.0)


@gluon.jit
def _store_partial(ws_o, ws_ml, u, o, m, l, D: gl.constexpr):
    """The unit's unnormalized O and its running max and sum (base 2), fp32, for the merge."""
    r = gl.arange(0, QROWS, layout=gl.SliceLayout(1, o.type.layout))
    d = gl.arange(0, D, layout=gl.SliceLayout(0, o.type.layout))
    gl.store(ws_o + (u * QROWS + r)[:, None] * D + d[None, :], o)
    gl.store(ws_ml + (u * 2) * QROWS + r, m)
    gl.store(ws_ml + (u * 2 + 1) * QROWS + r, l)


@gluon.jit
def _merge(ws_o, ws_ml, out_ptr, b, g, u0, NCH, T, HQ, G, D: gl.constexpr):
    """out for (b, g) from its NCH chunks' partials: rescale each to the largest max, sum, divide."""
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
    r = gl.arange(0, QROWS, layout=gl.SliceLayout(1, layout))
    d = gl.arange(0, D, layout=gl.SliceLayout(0, layout))
    m_all = gl.full([QROWS], float("-inf"), gl.float32, layout=gl.SliceLayout(1, layout))
    for c in range(NCH):
        m_all = gl.maximum(m_all, gl.load(ws_ml + ((u0 + c) * 2) * QROWS + r, cache_modifier=".cg"))
    m_all = gl.where(m_all == float("-inf"), 0.0, m_all)
    acc = gl.zeros([QROWS, D], gl.float32, layout=layout)
    total = gl.zeros([QROWS], gl.float32, layout=gl.SliceLayout(1, layout))
    for c in range(NCH):
        u = u0 + c
        w = gl.exp2(gl.load(ws_ml + (u * 2) * QROWS + r, cache_modifier=".cg") - m_all)
        total += w * gl.load(ws_ml + (u * 2 + 1) * QROWS + r, cache_modifier=".cg")
        acc += w[:, None] * gl.load(ws_o + (u * QROWS + r)[:, None] * D + d[None, :], cache_modifier=".cg")
    out = acc / gl.where(total > 0, total, 1.0)[:, None]
    row = (b * T + r // G) * HQ + g * G + r % G
    gl.store(out_ptr + row[:, None] * D + d[None, :], out.to(gl.bfloat16), mask=(r < T * G)[:, None])


@gluon.jit
def compute_partition(k_ring, v_ring, ready, empty, q_ptr, out_ptr, lens_ptr, ws_o, ws_ml, count_ptr, units,
                      HKV, NCH, T, HQ, G, scale, D: gl.constexpr, CH: gl.constexpr, STAGES: gl.constexpr):
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    q_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    r = gl.arange(0, QROWS, layout=gl.SliceLayout(1, s_layout))
    key = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    qk_scale = scale * LOG2E
    i = 0
    for u in range(gl.program_id(0), units, gl.num_programs(0)):
        b, g, c = _unit(u, HKV, NCH)
        length = gl.load(lens_ptr + b)
        q = _load_queries(q_ptr, b, g, T, HQ, G, D, q_layout)
        last_key = length - T + r // G  # each query's own position: it sees keys up to it
        m = gl.full([QROWS], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
        l = gl.zeros([QROWS], gl.float32, layout=gl.SliceLayout(1, s_layout))
        o = gl.zeros([QROWS, D], gl.float32, layout=o_layout)
        for j in range(_unit_tiles(lens_ptr, b, c, CH)):
            s, phase = _slot(i, STAGES)
            mbarrier.wait(ready.index(s), phase)
            scores = warpgroup_mma(q, k_ring.index(s).permute((1, 0)),
                                   gl.zeros([QROWS, BLOCK_N], gl.float32, layout=s_layout))
            pos = c * CH + j * BLOCK_N + key
            seen = (pos[None, :] <= last_key[:, None]) & (r < T * G)[:, None]
            scores = gl.where(seen, scores * qk_scale, float("-inf"))
            m_new = gl.maximum(m, gl.max(scores, axis=1))
            m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
            p = gl.exp2(scores - m_safe[:, None])
            alpha = gl.exp2(m - m_safe)
            l = l * alpha + gl.sum(p, axis=1)
            o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
            o = warpgroup_mma(gl.convert_layout(p.to(gl.bfloat16), p_layout), v_ring.index(s), o)
            mbarrier.arrive(empty.index(s), count=1)
            m = m_new
            i += 1
        _store_partial(ws_o, ws_ml, u, o, gl.convert_layout(m, gl.SliceLayout(1, o_layout)),
                       gl.convert_layout(l, gl.SliceLayout(1, o_layout)), D)
        gl.thread_barrier()
        arrived = gl.atomic_add(count_ptr + b * HKV + g, 1, sem="acq_rel", scope="gpu")
        if arrived == NCH - 1:  # the last chunk of (b, g) in: merge and write out
            _merge(ws_o, ws_ml, out_ptr, b, g, u - c, NCH, T, HQ, G, D)


@gluon.jit
def verify_attention_kernel(k_desc, v_desc, q_ptr, out_ptr, lens_ptr, ws_o, ws_ml, count_ptr, units, HKV, NCH,
                            CTX, T, HQ, G, scale, CH: gl.constexpr, STAGES: gl.constexpr):
    """Persistent; the per-(b, g) counters start at zero."""
    D: gl.constexpr = k_desc.block_type.shape[1]
    k_ring = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, D], k_desc.layout)
    v_ring = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, D], v_desc.layout)
    ready, empty = ring_barriers(STAGES)
    gl.warp_specialize([
        (compute_partition, (k_ring, v_ring, ready, empty, q_ptr, out_ptr, lens_ptr, ws_o, ws_ml, count_ptr, units,
                             HKV, NCH, T, HQ, G, scale, D, CH, STAGES)),
        (load_partition, (k_desc, v_desc, k_ring, v_ring, ready, empty, lens_ptr, units, HKV, NCH, CTX, CH, STAGES)),
    ], [1], [40])


# --------------------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Shape:
    """One verify attention: B rows of T queries, HQ query heads over HKV KV heads of dim D, a cache
    of CTX positions, chunks of CH keys."""
    B: int
    T: int
    HQ: int
    HKV: int
    D: int
    CTX: int
    CH: int = 512

    def check(self) -> None:
        if self.HQ % self.HKV or self.T * (self.HQ // self.HKV) > Q_ROWS:
            raise ValueError(f"{self}: T x G must be at most {Q_ROWS} with G = HQ / HKV whole")
        if self.D not in (64, 128) or self.CH % KEYS_PER_TILE or self.CTX % KEYS_PER_TILE:
            raise ValueError(f"{self}: D must be 64 or 128, CH and CTX multiples of {KEYS_PER_TILE}")

    @property
    def chunks(self) -> int:
        return -(-self.CTX // self.CH)

    @property
    def units(self) -> int:
        return self.B * self.HKV * self.chunks

    @property
    def stages(self) -> int:
        return min(8, 192 * 1024 // (2 * KEYS_PER_TILE * self.D * 2))


class VerifyAttention:
    """Buffers and launch for one shape; call() zeroes the counters and runs the kernel."""

    def __init__(self, shape: Shape, q, k_cache, v_cache, lens, sms: int):
        shape.check()
        self.shape, dev = shape, q.device
        self.out = torch.empty_like(q)
        self.ws_o = torch.empty(shape.units, Q_ROWS, shape.D, device=dev, dtype=torch.float32)
        self.ws_ml = torch.empty(shape.units, 2, Q_ROWS, device=dev, dtype=torch.float32)
        self.counts = torch.zeros(shape.B * shape.HKV, device=dev, dtype=torch.int32)
        layout = gl.NVMMASharedLayout.get_default_for([KEYS_PER_TILE, shape.D], gl.bfloat16)
        k_desc = TensorDescriptor.from_tensor(k_cache.view(-1, shape.D), [KEYS_PER_TILE, shape.D], layout)
        v_desc = TensorDescriptor.from_tensor(v_cache.view(-1, shape.D), [KEYS_PER_TILE, shape.D], layout)
        self.grid = (min(sms, shape.units), )
        self.args = (k_desc, v_desc, q, self.out, lens, self.ws_o, self.ws_ml, self.counts, shape.units, shape.HKV,
                     shape.chunks, shape.CTX, shape.T, shape.HQ, shape.HQ // shape.HKV, 1 / math.sqrt(shape.D))
        self.kwargs = dict(CH=shape.CH, STAGES=shape.stages, num_warps=4, maxnreg=168)

    def __call__(self):
        self.counts.zero_()
        verify_attention_kernel[self.grid](*self.args, **self.kwargs)
        return self.out


def reference(q, k_cache, v_cache, lens):
    """fp32 attention of each row's T queries over its cache, causal among the new positions."""
    B, T, HQ, D = q.shape
    G = HQ // k_cache.shape[1]
    out = torch.empty(B, T, HQ, D)
    for b in range(B):
        n = int(lens[b])
        k = k_cache[b, :, :n].float().repeat_interleave(G, 0)  # [HQ, n, D]
        v = v_cache[b, :, :n].float().repeat_interleave(G, 0)
        scores = torch.einsum("thd,hnd->htn", q[b].float(), k) / math.sqrt(D)
        seen = torch.arange(n)[None, :] <= (n - T + torch.arange(T))[:, None]
        scores = scores.masked_fill(~seen[None], float("-inf"))
        out[b] = torch.einsum("htn,hnd->thd", scores.softmax(-1), v)
    return out


def simulate(shape: Shape, q, k_cache, v_cache, lens):
    """The kernel's units, tile masks, base-2 online softmax and merge in torch on the CPU."""
    B, T, HQ, D = q.shape
    G, scale = HQ // shape.HKV, 1 / math.sqrt(D) * 1.4426950408889634
    out = torch.zeros(B, T, HQ, D)
    r = torch.arange(Q_ROWS)
    valid = r < T * G
    for b in range(B):
        n = int(lens[b])
        for g in range(shape.HKV):
            heads = g * G + r % G
            qt = torch.zeros(Q_ROWS, D)
            qt[valid] = q[b, (r // G)[valid], heads[valid]].float()
            parts = []
            for c in range(shape.chunks):
                m, l, o = torch.full((Q_ROWS, ), float("-inf")), torch.zeros(Q_ROWS), torch.zeros(Q_ROWS, D)
                tiles = -(-min(max(n - c * shape.CH, 0), shape.CH) // KEYS_PER_TILE)
                for j in range(tiles):
                    pos = c * shape.CH + j * KEYS_PER_TILE + torch.arange(KEYS_PER_TILE)
                    kt = k_cache[b, g, pos.clamp(max=shape.CTX - 1)].float()
                    vt = v_cache[b, g, pos.clamp(max=shape.CTX - 1)].float()
                    seen = (pos[None, :] <= (n - T + r // G)[:, None]) & valid[:, None]
                    s = (qt @ kt.T * scale).masked_fill(~seen, float("-inf"))
                    m_new = torch.maximum(m, s.max(1).values)
                    m_safe = torch.where(m_new == float("-inf"), 0.0, m_new)
                    p = torch.exp2(s - m_safe[:, None])
                    alpha = torch.exp2(m - m_safe)
                    l, o, m = l * alpha + p.sum(1), o * alpha[:, None] + p.bfloat16().float() @ vt, m_new
                parts.append((m, l, o))
            m_all = torch.stack([p[0] for p in parts]).max(0).values
            m_all = torch.where(m_all == float("-inf"), 0.0, m_all)
            w = [torch.exp2(p[0] - m_all) for p in parts]
            total = sum(wc * p[1] for wc, p in zip(w, parts))
            acc = sum(wc[:, None] * p[2] for wc, p in zip(w, parts))
            res = acc / torch.where(total > 0, total, 1.0)[:, None]
            out[b, (r // G)[valid], heads[valid]] = res[valid]
    return out


def inputs(shape: Shape, dev, ragged: bool = True, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(shape.B, shape.T, shape.HQ, shape.D, generator=gen).to(dev, torch.bfloat16)
    k = torch.randn(shape.B, shape.HKV, shape.CTX, shape.D, generator=gen).to(dev, torch.bfloat16)
    v = torch.randn(shape.B, shape.HKV, shape.CTX, shape.D, generator=gen).to(dev, torch.bfloat16)
    low = shape.T if ragged else shape.CTX
    lens = torch.randint(low, shape.CTX + 1, (shape.B, ), generator=gen, dtype=torch.int32)
    if not ragged:
        lens.fill_(shape.CTX)
    return q, k, v, lens.to(dev)


# Llama-3.1-8B's target attention (32 query heads over 8 KV heads, dim 128) and Qwen2.5-0.5B's draft
# (14 over 2, dim 64), at #49's contexts and batches.
SHAPES = [Shape(B, T, 32, 8, 128, ctx) for B, T, ctx in ((1, 4, 512), (8, 4, 1024), (16, 4, 4096), (32, 4, 1024),
                                                           (64, 2, 512), (4, 8, 8192))] + [Shape(8, 4, 14, 2, 64, 1024)]


def run_gpu(args) -> int:
    gpu = hopper_and_copy_rate()
    if gpu is None:
        return 2
    sms, bw = gpu
    print(f"{'B':>3}{'T':>3}{'HQ/HKV':>8}{'D':>5}{'ctx':>6}{'err':>9}{'floor us':>10}{'ours us':>9}{'of copy':>8}"
          f"{'sdpa us':>9}{'of copy':>8}")
    rows = []
    for shape in SHAPES:
        q, k, v, lens = inputs(shape, "cuda")
        attn = VerifyAttention(shape, q, k, v, lens, sms)
        out = attn().float().cpu()
        ref = reference(q.cpu(), k.cpu(), v.cpu(), lens.cpu())
        err = ((out - ref).abs().max() / ref.abs().max()).item()
        if not err < 2e-2:
            raise SystemExit(f"{shape}: relative error {err}")
        kv_bytes = int(lens.sum()) * shape.HKV * shape.D * 2 * 2
        copies = max(1, -(-200_000_000 // (k.numel() * 4)))
        sets = [(q, k, v, lens)] + [inputs(shape, "cuda", seed=s) for s in range(1, copies)]
        ours = graph_time_us([VerifyAttention(shape, *s, sms) for s in sets])
        theirs = graph_time_us([lambda s=s: sdpa(shape, *s) for s in sets])
        floor = kv_bytes / bw * 1e6
        rows.append(dict(kind="attention", model=f"{shape.HQ}/{shape.HKV}x{shape.D}", op="verify", rows=shape.B * shape.T,
                         context=shape.CTX, shape=shape.__dict__, rel_err=err, bytes=kv_bytes, floor_us=floor, us=ours,
                         bw_fraction=floor / ours, sdpa_us=theirs, sdpa_bw_fraction=floor / theirs))
        print(f"{shape.B:>3}{shape.T:>3}{f'{shape.HQ}/{shape.HKV}':>8}{shape.D:>5}{shape.CTX:>6}{err:>9.1e}"
              f"{floor:>10.1f}{ours:>9.1f}{floor / ours:>8.2f}{theirs:>9.1f}{floor / theirs:>8.2f}", flush=True)
        write_probe_result(args.json, sms, bw, timing="cuda graph", shapes=rows)
        del sets
        torch.cuda.empty_cache()
    return 0


def sdpa(shape: Shape, q, k, v, lens):
    """torch's attention over the whole cache with a mask (lengths ragged: the mask holds them)."""
    pos = torch.arange(shape.CTX, device=q.device)
    last = lens[:, None] - shape.T + torch.arange(shape.T, device=q.device)[None, :]  # [B, T]
    mask = (pos[None, None, :] <= last[:, :, None])[:, None]  # [B, 1, T, CTX]
    return torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask,
                                                            enable_gqa=True)


def run_offline(args) -> int:
    print(f"triton {triton.__version__}: verify_attention_kernel for cuda:90 (sm_90a), no GPU")
    for shape in (SHAPES[0], SHAPES[-1]):
        q, k, v, lens = inputs(Shape(shape.B, shape.T, shape.HQ, shape.HKV, shape.D, 128, 64), "cpu")
        attn_args = VerifyAttention.__new__(VerifyAttention)
        VerifyAttention.__init__(attn_args, Shape(shape.B, shape.T, shape.HQ, shape.HKV, shape.D, 128, 64), q, k, v,
                                 lens, 132)
        compiled = compile_for_sm90(verify_attention_kernel, attn_args.args, attn_args.kwargs)
        ptx = compiled.asm["ptx"]
        mmas = sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx)))
        print(f"D={shape.D}: stages {shape.stages}, shared {compiled.metadata.shared} B, wgmma {mmas}, "
              f"TMA {'yes' if 'cp.async.bulk.tensor' in ptx else 'NO'}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Verify-phase decode attention streamed by a warp-specialized "
                                                 "persistent Gluon kernel, against torch SDPA.")
    parser.add_argument("--json")
    parser.add_argument("--offline", action="store_true")
    args = parser.parse_args(argv)
    return run_offline(args) if args.offline else run_gpu(args)


if __name__ == "__main__":
    if "--offline" in sys.argv:
        os.environ.setdefault("TRITON_INTERPRET", "0")
    sys.exit(main())
