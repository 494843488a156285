"""Tile-shape sweep of the GEMM and attention templates at decode shapes, each launch alone.

    python lab/experiments/tile_sweep.py [--json OUT.json]

Shapes are those of the Llama-3.2-1B -> Llama-3.1-8B round at B=8, k=4, context 1024 (draft rows
8, target rows 40). Each configuration is checked against torch before it is timed (a CUDA graph
of 20 launches, median of 5 replays). Prints the best configurations per shape.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from conjugate.cli.arguments import output_file  # noqa: E402
from conjugate.compiler.attention import attn_call  # noqa: E402
from conjugate.compiler.cache import KernelCache  # noqa: E402
from conjugate.compiler.gemm import gemm_call  # noqa: E402
from conjugate.compiler.round import CompiledLaunch  # noqa: E402
from conjugate.evaluate.timing import time_per_call  # noqa: E402

_KERNELS = tempfile.TemporaryDirectory(prefix="tile-sweep-")  # generated kernels, removed at exit

GEMMS = {  # name: (rows, N, K, epilogue)
    "t.qkv": (40, 6144, 4096, "store"), "t.o_proj": (40, 4096, 4096, "residual"),
    "t.gate_up": (40, 14336, 4096, "silu_mul"), "t.down": (40, 4096, 14336, "residual"),
    "d.qkv": (8, 3072, 2048, "store"), "d.o_proj": (8, 2048, 2048, "residual"),
    "d.gate_up": (8, 8192, 2048, "silu_mul"), "d.down": (8, 2048, 8192, "residual"),
}
ATTNS = {"t.attn": (8, 5, 32, 8, 128), "d.attn": (8, 1, 32, 8, 64)}  # batch, tokens, heads, kv heads, head dim


def time_call(run, reps: int = 20) -> float:
    """Microseconds per call, from a CUDA graph of `reps` back-to-back calls."""
    return time_per_call(run, torch.device("cuda"), calls=reps, replays=5)


def launch(call, num_warps: int, num_stages: int) -> CompiledLaunch:
    """The one-part launch of `call`, generated as a compiled round generates it."""
    return CompiledLaunch.alone(0, call, KernelCache(Path(_KERNELS.name)), num_warps=num_warps,
                                num_stages=num_stages)


def sweep_gemm(name, rows, n, k, epilogue) -> list[dict]:
    dev = "cuda"
    x = torch.randn(rows, k, device=dev)
    w = (torch.randn(n, k, device=dev) / k ** 0.5).bfloat16()
    w2 = (torch.randn(n, k, device=dev) / k ** 0.5).bfloat16() if epilogue == "silu_mul" else None
    ref = x.bfloat16().float() @ w.float().T
    if w2 is not None:
        ref = F.silu(ref) * (x.bfloat16().float() @ w2.float().T)
    nbytes = w.numel() * 2 * (2 if w2 is not None else 1)
    block_m = max(16, 1 << (rows - 1).bit_length())
    out = []
    for bn, bk, split, warps, stages in itertools.product((32, 64), (64, 128), (1, 2, 4, 8), (4,), (3,)):
        y = torch.zeros(rows, n, device=dev)
        call = gemm_call(x, w, y, rows=rows, epilogue=epilogue, w2=w2, block_m=block_m, block_n=bn, block_k=bk,
                         split_k=split)
        try:
            run = launch(call, warps, stages)
            run()
            torch.cuda.synchronize()
        except Exception as e:  # out of shared memory and the like: skip the configuration
            out.append({"shape": name, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": split, "warps": warps,
                        "stages": stages, "error": type(e).__name__})
            continue
        err = float((y - ref).norm() / ref.norm())
        us = time_call(run)
        out.append({"shape": name, "BLOCK_M": block_m, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": split, "warps": warps,
                    "stages": stages, "us": us, "gbs": nbytes / us / 1e3, "rel_err": err, "programs": call.programs})
    return out


def sweep_attention(name, batch, tokens, heads, kv_heads, head_dim, context=1024) -> list[dict]:
    dev = "cuda"
    s_max = context + tokens
    q = torch.randn(batch * tokens, heads * head_dim, device=dev)
    kc = torch.randn(batch, kv_heads, s_max, head_dim, device=dev).bfloat16()
    vc = torch.randn_like(kc)
    nbytes = 2 * kc.numel() * 2
    out = []
    for bn, split, warps in itertools.product((32, 64), (1, 2, 4, 8), (4,)):
        o = torch.zeros_like(q)
        lengths = torch.full((batch,), context, dtype=torch.int64, device=dev)
        call = attn_call(q, kc, vc, o, lengths, batch=batch, tokens=tokens, offset=0, num_heads=heads,
                         num_kv_heads=kv_heads, head_dim=head_dim, block_n=bn, split_kv=split)
        run = launch(call, warps, 2)
        run()
        us = time_call(run)
        out.append({"shape": name, "BLOCK_N": bn, "SPLIT_KV": split, "warps": warps, "us": us,
                    "gbs": nbytes / us / 1e3, "programs": call.programs})
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", type=output_file)
    args = parser.parse_args()
    results = {"gpu": torch.cuda.get_device_name(), "gemm": [], "attention": []}
    for name, shape in GEMMS.items():
        results["gemm"] += sweep_gemm(name, *shape)
        best = sorted((r for r in results["gemm"] if r["shape"] == name and "us" in r and r["rel_err"] < 1e-2),
                      key=lambda r: r["us"])[:3]
        for r in best:
            print(json.dumps(r), flush=True)
    for name, shape in ATTNS.items():
        results["attention"] += sweep_attention(name, *shape)
        for r in sorted((r for r in results["attention"] if r["shape"] == name), key=lambda r: r["us"])[:3]:
            print(json.dumps(r), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
