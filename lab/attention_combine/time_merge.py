"""The product's split-KV attention against combine.py's lighter merge, side by side on one GPU.

    product   (conjugate/kernels/attention.py) fp32 unnormalised partials, merged split after split
    combine   (combine.py) partials normalised in bf16, every split weighed from one (m, l) tile first

For each case (the examples' verify and draft attention, llama-3.1-8b's verify at B=1 and contexts
1024-8192), equal lengths (all at the context), SPLIT_KV 2-32, BLOCK_N 64, 4 and 8 warps, 3 stages:
both kernels checked against torch's SDPA (relative error < 1e-2, output poisoned first), then timed
alone from cold L2 as lab/attention_dealing/compare.py times them (its inputs; a CUDA graph of 20
calls, L2 flushed before each, the flush's time subtracted). Bytes: K and V below each length.

    python lab/attention_combine/time_merge.py --json OUT.json      # a GPU; a table, then the JSON
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the checkout's conjugate
sys.path.insert(0, str(HERE))  # combine
sys.path.insert(0, str(HERE.parent / "attention_dealing"))  # its inputs

import compare as dealing  # noqa: E402  lab/attention_dealing/compare.py
from combine import combine_tile  # noqa: E402

from conjugate.compiler.attention import attn_call  # noqa: E402
from conjugate.compiler.cache import KernelCache  # noqa: E402
from conjugate.compiler.round import CompiledLaunch  # noqa: E402
from conjugate.compiler.tile import PartCall, TileSignature  # noqa: E402

CALLS = 20
KINDS = ("product", "combine")
# name, batch, tokens, heads, kv_heads, head_dim, context
CASES = [
    ("llama-8b verify", 1, 5, 32, 8, 128, 1024),
    ("llama-8b verify", 1, 5, 32, 8, 128, 2048),
    ("llama-8b verify", 1, 5, 32, 8, 128, 8192),
    ("qwen3-8b verify", 4, 6, 32, 8, 128, 1024),
    ("llama-8b verify", 8, 5, 32, 8, 128, 1024),
    ("llama-8b verify", 32, 4, 32, 8, 128, 1024),
    ("llama-1b draft", 8, 1, 32, 8, 64, 1024),
    ("qwen2.5-0.5b draft", 8, 1, 14, 2, 64, 1024),
]
SPLITS = (2, 4, 8, 16, 32)
WARPS = (4, 8)


def build(kind: str, data: dict, batch, tokens, heads, kv_heads, hd, split, cache: KernelCache, warps: int,
          device: str):
    out = torch.full((batch * tokens, heads * hd), float("nan"), device=device, dtype=torch.bfloat16)
    call = attn_call(data["q"], data["k"], data["v"], out, data["lengths"], batch=batch, tokens=tokens, offset=0,
                     num_heads=heads, num_kv_heads=kv_heads, head_dim=hd, block_n=64, split_kv=split)
    if kind == "combine":  # the same tensors, the partial rows in the caches' type
        crows = call.constexprs["CROWS"]
        part_o = torch.empty(batch * kv_heads, split, crows, hd, device=device, dtype=data["k"].dtype)
        call = PartCall(TileSignature.of(combine_tile), call.args | {"part_o_ptr": part_o},
                        call.constexprs | {"SPLITS_P2": 1 << (split - 1).bit_length()}, programs=call.programs,
                        label="combine", scratch=[part_o, *call.scratch[1:]])
    return CompiledLaunch.alone(0, call, cache, num_warps=warps, num_stages=3), out


def check(launch, out, data) -> float:
    launch()
    if out.is_cuda:
        torch.cuda.synchronize()
    return float((out.float() - data["ref"]).norm() / data["ref"].norm())


def main() -> int:
    from conjugate.evaluate.timing import copy_bandwidth_gbs, l2_flush_bytes, time_per_call

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--limit-s", type=float, default=420.0, help="stop starting cases after this long")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("timing needs a GPU (the CPU check: python -m pytest -q lab/attention_combine)")
    sys.path.insert(0, str(HERE.parents[1] / "benchmarks"))
    from common import environment

    device = torch.device("cuda")
    env = environment("lab/attention_combine/time_merge.py")
    copy_gbs = copy_bandwidth_gbs(device)
    flush_bytes = l2_flush_bytes(device)
    began, rows = time.monotonic(), []
    print(f"{torch.cuda.get_device_name()}, copy {copy_gbs:.0f} GB/s")
    print(f"{'case':20} {'B':>3} {'T':>2} {'ctx':>5} {'split':>5} {'warps':>5} {'product us':>11} {'combine us':>11} "
          f"{'ratio':>6} {'of copy':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        cache = KernelCache(Path(tmp))
        for name, batch, tokens, heads, kv_heads, hd, context in CASES:
            if time.monotonic() - began > args.limit_s:
                print(f"stopped before {name} B{batch} ctx {context}: --limit-s {args.limit_s:.0f}")
                break
            data = dealing.inputs(batch, tokens, heads, kv_heads, hd, context, ragged=False)
            floor_us = data["bytes"] / (copy_gbs * 1e3)
            for split in SPLITS:
                for warps in WARPS:
                    row = dict(case=name, batch=batch, tokens=tokens, heads=heads, kv_heads=kv_heads, head_dim=hd,
                               context=context, split_kv=split, warps=warps, bytes=data["bytes"], floor_us=floor_us)
                    for kind in KINDS:
                        launch, out = build(kind, data, batch, tokens, heads, kv_heads, hd, split, cache, warps, "cuda")
                        err = check(launch, out, data)
                        if not err < 1e-2:
                            row[kind] = {"error": f"wrong: relative error {err:.3g}"}
                            continue
                        us = time_per_call(launch, device, CALLS, flush_bytes=flush_bytes)
                        row[kind] = {"us": us, "rel_err": err, "share_of_copy": floor_us / us if us > 0 else None}
                    p, c = row["product"], row["combine"]
                    row["ratio"] = c["us"] / p["us"] if "us" in p and "us" in c and p["us"] > 0 else None
                    rows.append(row)
                    print(f"{name:20} {batch:3d} {tokens:2d} {context:5d} {split:5d} {warps:5d} "
                          f"{p.get('us', float('nan')):11.1f} {c.get('us', float('nan')):11.1f} "
                          f"{row['ratio'] or float('nan'):6.3f} {c.get('share_of_copy') or 0:8.2f}", flush=True)
            if args.json:
                args.json.write_text(json.dumps({**env, "copy_gbs": copy_gbs, "rows": rows}, indent=1) + "\n")
    best = {}
    for r in rows:  # each case's best of each kernel over its splits and warps
        key = (r["case"], r["batch"], r["context"])
        for kind in KINDS:
            if "us" in r[kind] and r[kind]["us"] < best.setdefault(key, {}).get(kind, (float("inf"),))[0]:
                best[key][kind] = (r[kind]["us"], r["split_kv"], r["warps"])
    print(f"\n{'case':20} {'B':>3} {'ctx':>5} {'product best (split, warps)':>28} {'combine best':>22} {'ratio':>6}")
    for (name, batch, context), got in best.items():
        if len(got) == 2:
            (pu, ps, pw), (cu, cs, cw) = got["product"], got["combine"]
            print(f"{name:20} {batch:3d} {context:5d} {pu:14.1f} ({ps:2d}, {pw}) {cu:14.1f} ({cs:2d}, {cw}) {cu / pu:6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
