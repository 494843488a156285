"""Why two harnesses time the product's attention apart: the same tiles through
benchmarks/kernel_sweep.py's timing (fp32 output, 10 calls a graph) and time_merge.py's (bf16
output, 20 calls), and each with the other's output type and call count, in one process.

    python lab/attention_combine/harness_gap.py --json OUT.json      # a GPU

llama-3.1-8b's verify attention at B=1 (five tokens, context 1024), BLOCK_N 64, 3 stages, 4 warps,
SPLIT_KV 4, 8 and 16: where the sweep gave 9.3 and 12.5 us (4, 8) and time_merge.py 7.2 and 6.7.
Every launch checked against SDPA first. Lab code: nothing in `conjugate/` imports it.

It ran at 1f2261c (`harness_gap_h100.json`). Since d201728 the sweep's column times as the sweep now
does (bf16 output, the flush taken off pair by pair), while the other columns keep the former timing
(`subtracting`: a flush measured once), so a rerun compares the two methods, not the two harnesses.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(HERE))

import kernel_sweep as ks  # noqa: E402
import time_merge as tm  # noqa: E402

from conjugate.compiler.attention import attn_call  # noqa: E402
from conjugate.compiler.cache import KernelCache  # noqa: E402
from conjugate.compiler.round import CompiledLaunch  # noqa: E402

SHAPE = ks.AttnShape(batch=1, tokens=5, heads=32, kv_heads=8, head_dim=128, context=1024)
SPLITS = (4, 8, 16)


def launch_of(inputs: dict, split: int, out_dtype: torch.dtype, cache: KernelCache):
    out = torch.full_like(inputs["q"], float("nan"), dtype=out_dtype)
    call = attn_call(inputs["q"], inputs["k"], inputs["v"], out, inputs["lengths"], batch=SHAPE.batch,
                     tokens=SHAPE.tokens, offset=0, num_heads=SHAPE.heads, num_kv_heads=SHAPE.kv_heads,
                     head_dim=SHAPE.head_dim, block_n=64, split_kv=split)
    return CompiledLaunch.alone(0, call, cache, num_warps=4, num_stages=3), out


def flush_time_us(device, calls: int, flush_bytes: int, flush: str = "write") -> float:
    """How timing.flush_time_us measured the flush before d201728: once, in a graph of `calls` flushes."""
    from conjugate.evaluate.timing import _flusher, _per_call_us

    evict = _flusher(device, flush_bytes, flush)

    def flushes() -> None:
        for _ in range(calls):
            evict()

    return _per_call_us(flushes, device, calls, 5)


def subtracting(fn, device, calls: int, flush_bytes: int, flush_us: float, flush: str = "write") -> float:
    """How timing.time_per_call timed before d201728: the graph of flushes and calls, less a flush
    time measured once and passed in (`flush_us`)."""
    from conjugate.evaluate.timing import _flusher, _per_call_us

    evict = _flusher(device, flush_bytes, flush)

    def calls_in_a_row() -> None:
        for _ in range(calls):
            evict()
            fn()

    return max(_per_call_us(calls_in_a_row, device, calls, 5) - flush_us, 0.0)


def main() -> int:
    from common import environment

    from conjugate.evaluate.timing import copy_bandwidth_gbs, l2_flush_bytes

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    device = torch.device("cuda")
    env = environment("lab/attention_combine/harness_gap.py")
    copy_gbs, flush_bytes = copy_bandwidth_gbs(device), l2_flush_bytes(device)
    flush = {calls: flush_time_us(device, calls, flush_bytes) for calls in (10, 20)}
    inputs = ks.operands(SHAPE)
    rows = []
    print(f"{'SPLIT_KV':>8} {'kernel_sweep us':>16} {'fp32 out, 10':>13} {'fp32, 20':>9} {'bf16, 10':>9} {'bf16, 20':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        cache = KernelCache(Path(tmp))
        for split in SPLITS:
            swept = ks.time_tiles(SHAPE, [ks.AttnTile(64, split, 4, 3)], Path(tmp), copy_gbs)[0]
            row = {"split_kv": split, "kernel_sweep": swept}
            for out_dtype in (torch.float32, torch.bfloat16):
                launch, out = launch_of(inputs, split, out_dtype, cache)
                err = tm.check(launch, out, inputs)
                for calls in (10, 20):
                    name = f"{'fp32' if out_dtype == torch.float32 else 'bf16'}_{calls}"
                    row[name] = {"rel_err": err} | ({"us": subtracting(launch, device, calls, flush_bytes, flush[calls])} if err < 1e-2 else
                                                    {"error": "wrong"})
            rows.append(row)
            print(f"{split:8d} {swept.get('us', float('nan')):16.1f} " + " ".join(
                f"{row[n].get('us', float('nan')):9.1f}" for n in ("fp32_10", "fp32_20", "bf16_10", "bf16_20")), flush=True)
    if args.json:
        args.json.write_text(json.dumps({**env, "copy_gbs": copy_gbs, "flush_us": flush, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
