"""The attention template's two ways of dealing keys to its split programs, side by side on one GPU.

    per pair   (conjugate/kernels/attention.py, the product's) each (b, kv_head) pair's keys cut into
               SPLIT_KV chunks of its own: with ragged lengths the longest sequence's programs run
               on after the others have finished
    shares     (shares.py, this experiment) the same B * KVH * SPLIT_KV programs, every pair's key
               tiles dealt in one equal contiguous share a program, pieces merged by the last one in

For every case (the examples' verify and draft attention shapes, and #49's serving sizes), at equal
lengths (all at the context) and ragged ones (uniform in [1, context], one seed), each split: both
kernels checked against torch's SDPA (relative error < 1e-2, output poisoned first), then timed alone
from cold L2 as `benchmarks/kernel_sweep.py` times tiles (CUDA graph of 20 calls, L2 flushed before
each, flush time subtracted). Bytes: K and V below each sequence's length.

    python lab/attention_dealing/compare.py --json OUT.json      # a GPU; a table, then the JSON
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout's conjugate
sys.path.insert(0, str(Path(__file__).resolve().parent))  # shares

from conjugate.compiler.attention import attn_call  # noqa: E402
from conjugate.compiler.cache import KernelCache  # noqa: E402
from conjugate.compiler.round import CompiledLaunch  # noqa: E402
from conjugate.compiler.tile import PartCall, TileSignature  # noqa: E402
from conjugate.evaluate.timing import copy_bandwidth_gbs, l2_flush_bytes, time_per_call  # noqa: E402
from shares import shares_tile  # noqa: E402

CALLS = 20
DEVICE = "cuda"  # "cpu" under the interpreter: the check only (lab/attention_dealing/README.md)
# name, batch, tokens, heads, kv_heads, head_dim, context
CASES = [
    ("llama-8b verify", 1, 5, 32, 8, 128, 1024),
    ("qwen3-8b verify", 4, 6, 32, 8, 128, 1024),
    ("llama-8b verify", 8, 5, 32, 8, 128, 1024),
    ("qwen2.5-7b verify", 8, 5, 28, 4, 128, 1024),
    ("llama-3b verify", 16, 4, 24, 8, 128, 4096),
    ("llama-8b verify", 32, 4, 32, 8, 128, 1024),
    ("llama-8b verify", 64, 2, 32, 8, 128, 512),
    ("llama-8b verify", 4, 8, 32, 8, 128, 8192),
    ("llama-1b draft", 8, 1, 32, 8, 64, 1024),
    ("qwen2.5-0.5b draft", 8, 1, 14, 2, 64, 1024),
    ("qwen3-0.6b draft", 4, 1, 16, 8, 128, 1024),
]
SPLITS = (2, 4, 8, 16)


def inputs(batch, tokens, heads, kv_heads, hd, context, ragged: bool, seed: int = 0) -> dict:
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    if ragged:
        lengths = torch.randint(1, context + 1, (batch,), generator=gen, device=DEVICE)
    else:
        lengths = torch.full((batch,), context, device=DEVICE)
    capacity = context + tokens
    q = torch.randn(batch * tokens, heads * hd, device=DEVICE, generator=gen)
    k = torch.randn(batch, kv_heads, capacity, hd, device=DEVICE, generator=gen).bfloat16()
    v = torch.randn(batch, kv_heads, capacity, hd, device=DEVICE, generator=gen).bfloat16()
    refs = []
    for b in range(batch):
        n = int(lengths[b])
        kb, vb = (c[b:b + 1, :, :n + tokens].float().repeat_interleave(heads // kv_heads, dim=1) for c in (k, v))
        visible = torch.arange(n + tokens, device=DEVICE)[None, :] <= (n + torch.arange(tokens, device=DEVICE))[:, None]
        qb = q[b * tokens:(b + 1) * tokens].view(1, tokens, heads, hd).transpose(1, 2)
        refs.append(F.scaled_dot_product_attention(qb, kb, vb, attn_mask=visible).transpose(1, 2).reshape(tokens, -1))
    kv_bytes = int((lengths + tokens).sum()) * kv_heads * hd * 2 * 2
    return {"q": q, "k": k, "v": v, "lengths": lengths.to(torch.int64), "ref": torch.cat(refs), "bytes": kv_bytes}


def build(kind: str, data: dict, batch, tokens, heads, kv_heads, hd, split, cache: KernelCache):
    out = torch.full((batch * tokens, heads * hd), float("nan"), device=DEVICE, dtype=torch.bfloat16)
    call = attn_call(data["q"], data["k"], data["v"], out, data["lengths"], batch=batch, tokens=tokens, offset=0,
                     num_heads=heads, num_kv_heads=kv_heads, head_dim=hd, block_n=64, split_kv=split)
    if kind == "shares":  # the same tensors bound to the lab tile: two scratch slots a program
        programs = batch * kv_heads * split
        crows = call.constexprs["CROWS"]
        part_o = torch.empty(2 * programs, crows, hd, device=DEVICE)
        part_ml = torch.empty(2 * programs, 2, crows, device=DEVICE)
        sig = TileSignature.of(shares_tile)
        args = call.args | {"part_o_ptr": part_o, "part_ml_ptr": part_ml, "batch": batch}
        constexprs = call.constexprs | {"BATCH_BLOCK": 1 << (batch - 1).bit_length(), "MERGE_UNROLL": min(split + 1, 16)}
        call = PartCall(sig, args, constexprs, programs=programs, label="shares",
                        scratch=[part_o, part_ml, call.args["counter_ptr"]])
    launch = CompiledLaunch.alone(0, call, cache, num_warps=4, num_stages=3)
    return launch, out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    device = torch.device("cuda")
    copy_gbs = copy_bandwidth_gbs(device)
    flush_bytes = l2_flush_bytes(device)
    rows = []
    print(f"{torch.cuda.get_device_name()}, copy {copy_gbs:.0f} GB/s")
    print(f"{'case':20} {'B':>3} {'T':>2} {'ctx':>5} {'lengths':8} {'split':>5} {'per pair us':>12} {'shares us':>10} "
          f"{'ratio':>6} {'of copy':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        cache = KernelCache(Path(tmp))
        for name, batch, tokens, heads, kv_heads, hd, context in CASES:
            for ragged in (False, True):
                data = inputs(batch, tokens, heads, kv_heads, hd, context, ragged)
                floor_us = data["bytes"] / (copy_gbs * 1e3)
                for split in SPLITS:
                    row = dict(case=name, batch=batch, tokens=tokens, heads=heads, kv_heads=kv_heads, head_dim=hd,
                               context=context, lengths="ragged" if ragged else "equal",
                               lengths_sum=int(data["lengths"].sum()), split_kv=split, bytes=data["bytes"],
                               floor_us=floor_us)
                    for kind in ("per pair", "shares"):
                        launch, out = build(kind, data, batch, tokens, heads, kv_heads, hd, split, cache)
                        launch()
                        torch.cuda.synchronize()
                        err = float((out.float() - data["ref"]).norm() / data["ref"].norm())
                        if not err < 1e-2:
                            print(f"FAILED {kind} {name} B{batch} split {split} {row['lengths']}: relative error {err}")
                            return 1
                        us = time_per_call(launch, device, CALLS, flush_bytes=flush_bytes)
                        row[kind.replace(" ", "_")] = {"us": us, "rel_err": err,
                                                        "share_of_copy": floor_us / us if us > 0 else None}
                    ratio = row["shares"]["us"] / row["per_pair"]["us"]
                    row["ratio"] = ratio
                    rows.append(row)
                    print(f"{name:20} {batch:3d} {tokens:2d} {context:5d} {row['lengths']:8} {split:5d} "
                          f"{row['per_pair']['us']:12.1f} {row['shares']['us']:10.1f} {ratio:6.3f} "
                          f"{row['shares']['share_of_copy'] or 0:8.2f}", flush=True)
    if args.json:
        from benchmarks.common import environment

        args.json.write_text(json.dumps({**environment("lab/attention_dealing/compare.py"), "copy_gbs": copy_gbs,
                                         "rows": rows}, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
