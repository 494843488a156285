"""Does programmatic dependent launch pay for a chain of decode GEMMs once each kernel pulls its
weights into L2 before it waits on the previous one? The question a `pdl` plan knob would hang on.

A chain of dependent weight-streaming GEMMs shaped like a small draft's MLP (x[8, H] -> [8, F] ->
[8, H], a fresh weight per step, so nothing stays in L2 between replays) and one shaped like its
o_proj ([8, H] -> [8, H]), each captured in one CUDA graph per mode and timed from its replays; every
mode's output is checked bit for bit against the plain chain first. Modes:

    plain            plain launches (what the compiler emits today)
    prefetch         plain launches, each program first prefetches its weight slab into L2
    pdl              launch_pdl; wait for the previous kernel, then let the next one launch
    pdl-early        launch_pdl; let the next kernel launch, then wait (the spike that lost 9%)
    pdl-prefetch     launch_pdl; prefetch the weights, wait, then let the next one launch
    pdl-prefetch-early  launch_pdl; prefetch, let the next one launch, then wait

`--streams 2` runs two such chains at once on two streams in the graph, as a `streams` plan does.

    python lab/experiments/pdl_chain.py OUT.json [--layers 16] [--hidden 2048] [--ffn 8192] [--rows 8] [--streams 1]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from functools import partial
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from conjugate.evaluate.timing import capture, concurrently, time_replays  # noqa: E402

MODES = ("plain", "prefetch", "pdl", "pdl-early", "pdl-prefetch", "pdl-prefetch-early")


@triton.jit
def _prefetch_l2(ptrs):
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def chain_gemm(x_ptr, w_ptr, y_ptr, M, N, K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr, PDL: tl.constexpr, EARLY: tl.constexpr):
    """y[M, N] = x[M, K] @ w[N, K]^T in bf16, fp32 accumulate; one program per BLOCK_N rows of w."""
    pid = tl.program_id(0)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    if PREFETCH:  # the weights do not depend on the previous kernel: start pulling them now
        lines = tl.arange(0, K // 64)  # one prefetch per 128-byte line (64 bf16)
        _prefetch_l2(w_ptr + offs_n[:, None] * K + lines[None, :] * 64)
    if PDL:
        if EARLY:
            gdc_launch_dependents()
        gdc_wait()  # x is the previous kernel's output
        if not EARLY:
            gdc_launch_dependents()
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_ptr + offs_m[:, None] * K + (k0 + offs_k)[None, :], mask=offs_m[:, None] < M, other=0.0)
        w = tl.load(w_ptr + offs_n[:, None] * K + (k0 + offs_k)[None, :])
        acc += tl.dot(x, tl.trans(w))
    tl.store(y_ptr + offs_m[:, None] * N + offs_n[None, :], acc.to(tl.bfloat16), mask=offs_m[:, None] < M)


def _flags(mode: str) -> dict:
    return {"PREFETCH": "prefetch" in mode, "PDL": mode.startswith("pdl"), "EARLY": mode.endswith("early")}


class Chain:
    """`layers` pairs of GEMMs (H -> F -> H) or, with `square`, of H -> H, over buffers of their own."""

    def __init__(self, layers: int, hidden: int, ffn: int, rows: int, square: bool, seed: int):
        g = torch.Generator(device="cuda").manual_seed(seed)
        shapes = [(hidden, hidden), (hidden, hidden)] if square else [(ffn, hidden), (hidden, ffn)]
        self.weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * k ** -0.5
                        for _ in range(layers) for n, k in shapes]
        self.x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16, generator=g)
        self.acts = [torch.empty(rows, w.shape[0], device="cuda", dtype=torch.bfloat16) for w in self.weights]
        self.rows = rows

    def run(self, mode: str) -> None:
        x = self.x
        for w, y in zip(self.weights, self.acts):
            n, k = w.shape
            block_n = max(16, n // 128)  # about one program per SM
            chain_gemm[(n // block_n,)](x, w, y, self.rows, n, k, BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=128,
                                        num_warps=4, launch_pdl=mode.startswith("pdl"), **_flags(mode))
            x = y

    def out(self) -> torch.Tensor:
        return self.acts[-1].clone()


def _graph(chains: list[Chain], mode: str) -> torch.cuda.CUDAGraph:
    """The chains, each on a stream of its own, in one CUDA graph (compiled and warmed up first)."""
    device = torch.device("cuda")
    return capture(concurrently([partial(c.run, mode) for c in chains], device), device, warmup=2)


def _median_us(graph: torch.cuda.CUDAGraph, replays: int = 100) -> float:
    return time_replays(graph.replay, replays, warmup=10).median_ms * 1e3


def measure(args, square: bool) -> dict:
    chains = [Chain(args.layers, args.hidden, args.ffn, args.rows, square, seed) for seed in range(args.streams)]
    graphs, outs = {}, {}
    for mode in MODES:
        graphs[mode] = _graph(chains, mode)
        for c in chains:  # a kernel that read its input too early, or wrote nothing, cannot pass
            for a in c.acts:
                a.fill_(float("nan"))
        graphs[mode].replay()
        torch.cuda.synchronize()
        outs[mode] = [c.out() for c in chains]
    same = {m: all(torch.equal(a, b) for a, b in zip(outs[m], outs["plain"])) for m in MODES}
    rounds = {m: [] for m in MODES}
    for _ in range(3):  # interleaved, so drift touches every mode alike
        for m in MODES:
            rounds[m].append(_median_us(graphs[m]))
    us = {m: statistics.median(v) for m, v in rounds.items()}
    kernels = len(chains[0].weights) * len(chains)
    return {"chain": "o_proj-like H->H" if square else "mlp-like H->F->H", "kernels": kernels,
            "bit_equal_to_plain": same, "us": {m: round(v, 1) for m, v in us.items()},
            "vs_plain": {m: round(us["plain"] / v, 3) for m, v in us.items()},
            "us_per_kernel": {m: round(v / kernels, 2) for m, v in us.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--ffn", type=int, default=8192)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--streams", type=int, default=1, choices=(1, 2))
    args = parser.parse_args()
    for name in ("hidden", "ffn"):
        size = getattr(args, name)
        if size < 2048 or size & (size - 1):
            parser.error(f"--{name} {size}: the kernel's blocks need a power of two of at least 2048")
    if not 1 <= args.rows <= 16:
        parser.error(f"--rows {args.rows}: one 16-row block, so 1 to 16")
    if not torch.cuda.is_available():
        sys.exit("pdl_chain.py: needs an NVIDIA GPU (programmatic dependent launch is sm_90+)")
    rows = [measure(args, square) for square in (False, True)]
    print(f"{'chain':18} {'mode':20} {'us':>9} {'vs plain':>9} {'us/kernel':>10} bit-equal")
    for r in rows:
        for m in MODES:
            print(f"{r['chain']:18} {m:20} {r['us'][m]:9.1f} {r['vs_plain'][m]:9.3f} {r['us_per_kernel'][m]:10.2f} "
                  f"{r['bit_equal_to_plain'][m]}")
    with open(args.out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                   "command": " ".join(sys.argv), "rows": rows}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
