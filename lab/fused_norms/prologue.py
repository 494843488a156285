"""The norm prologue's cost alone: a target GEMM's tile with and without its RMSNorm folded in.

    python lab/fused_norms/prologue.py --rows 5 24 40 128 --json OUT.json [--stats-order prologue]

Per llama-3.1-8b GEMM (qkv: a plain store; gate_up: SiLU(gate) * up) and row count, the `sequential`
plan's target tile (its num_warps and num_stages as the verify phase launches them) timed alone from
a cold L2 (kernel_sweep's timing) as

* `plain`: x already normalised, the GEMM the unfused verify phase launches after its norm launch;
* `stats_in`: the norm folded in, reading the row statistics the residual GEMM before left (one sum of
  squares a 16 columns, a slice a K step inside the main loop): what the fused verify phase runs;
* `pass`: the norm folded in without statistics (a pass over x's split first).

Each launch is checked against torch first (relative error under 1e-2). `--stats-order prologue`
reads the statistics as the product did before (STATS_BLOCK of them a step before the main loop;
`--stats-block N` sets that step, conjugate/kernels/tile.py's STATS_BLOCK, 64), `--stats-order early`
loads them before the main loop and sums them after it (stats_order.py): one process, one order. The norm weight is not folded
into w here (the product folds it at compile time; it changes no work). Lab code: nothing in
`conjugate/` imports it.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HIDDEN, INTERMEDIATE, QKV = 4096, 14336, 6144  # llama-3.1-8b
EPS = 1e-5
VARIANTS = ("plain", "stats_in", "pass")


def operands(op: str, rows: int, k: int, n: int, device: str) -> dict:
    """x (bf16 [rows, k]), its normalised copy, the weights, the row statistics and torch's result."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator(device=device).manual_seed(0)
    x = (3 * torch.randn(rows, k, device=device, generator=gen)).bfloat16()
    xf = x.float()
    normed = (xf * torch.rsqrt(xf.pow(2).mean(dim=1, keepdim=True) + EPS)).bfloat16()
    weights = [(torch.randn(n, k, device=device, generator=gen) / k ** 0.5).bfloat16()
               for _ in range(2 if op == "gate_up" else 1)]
    stats = xf.pow(2).view(rows, k // 16, 16).sum(dim=2).contiguous()  # what a residual GEMM leaves (STATS_CHUNK 16)
    ref = normed.float() @ weights[0].float().T
    if op == "gate_up":
        ref = F.silu(ref) * (normed.float() @ weights[1].float().T)
    return {"x": x, "normed": normed, "ws": weights, "stats": stats, "ref": ref}


def bind(variant: str, op: str, rows: int, data: dict, tile: dict):
    """The variant's PartCall and its output buffer."""
    import torch

    from conjugate.compiler.gemm import gemm_call

    w = data["ws"]
    out = torch.zeros(rows, w[0].shape[0], device=w[0].device)
    norm = {} if variant == "plain" else {"norm_eps": EPS} | (
        {"stats": data["stats"], "stats_in": True} if variant == "stats_in" else {})
    call = gemm_call(data["normed"] if variant == "plain" else data["x"], w[0], out, rows=rows,
                     epilogue="silu_mul" if op == "gate_up" else "store", w2=w[1] if op == "gate_up" else None,
                     block_m=tile["BLOCK_M"], block_n=tile["BLOCK_N"], block_k=tile["BLOCK_K"],
                     split_k=tile.get("SPLIT_K", 1), **norm)
    return call, out


def sequential_tiles() -> dict[str, dict]:
    return json.loads((ROOT / "plans" / "sequential.json").read_text())["target"]["tiles"]


def run_case(op: str, rows: int, k: int, n: int, device: str, kernels: Path, timed: bool):
    """Every variant of one (op, rows): checked, then (timed) its microseconds alone from a cold L2."""
    import torch

    from conjugate.compiler.cache import KernelCache
    from conjugate.compiler.round import CompiledLaunch
    from conjugate.evaluate.timing import l2_flush_bytes, time_per_call

    tile = sequential_tiles()[op]
    data = operands(op, rows, k, n, device)
    out = []
    for variant in VARIANTS:
        call, result = bind(variant, op, rows, data, tile)
        launch = CompiledLaunch.alone(0, call, KernelCache(kernels), num_warps=tile.get("num_warps", 4),
                                      num_stages=tile.get("num_stages", 2))
        launch()
        if device == "cuda":
            torch.cuda.synchronize()
        rel = float((result - data["ref"]).norm() / data["ref"].norm())
        row = {"op": op, "rows": rows, "variant": variant, "tile": tile, "rel_err": rel, "programs": launch.grid}
        if rel > 1e-2:
            row["error"] = f"wrong: relative error {rel:.3g}"
        elif timed:
            row["us"] = time_per_call(launch, torch.device(device), 10, flush_bytes=l2_flush_bytes(torch.device(device)))
        out.append(row)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[5, 24, 40, 128])
    parser.add_argument("--ops", nargs="+", choices=("qkv", "gate_up"), default=["qkv", "gate_up"])
    parser.add_argument("--stats-order", choices=("prologue", "early"),
                        help="the statistics summed before the main loop (prologue), or loaded first and summed last "
                             "(early); the product's order (in the loop) unless given")
    parser.add_argument("--stats-block", type=int, default=0,
                        help="the prologue order's step (STATS_BLOCK; 0: the package's)")
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    if args.stats_block and (args.stats_block < 16 or args.stats_block & (args.stats_block - 1)):
        parser.error("--stats-block: a power of two, at least 16")
    if args.stats_block and args.stats_order != "prologue":
        parser.error("--stats-block: the step of --stats-order prologue")
    import torch
    import triton.language as tl

    from conjugate.kernels import tile as tile_module

    if not torch.cuda.is_available():
        parser.error("timing needs a GPU (the CPU check: python -m pytest -q lab/fused_norms)")

    if args.stats_block:
        tile_module.STATS_BLOCK = tl.constexpr(args.stats_block)
    if args.stats_order:
        sys.path.insert(0, str(ROOT / "lab" / "fused_norms"))
        import stats_order

        stats_order.patch(args.stats_order)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from common import environment

    out = {**environment("prologue"), "command": "python " + " ".join(sys.argv),
           "stats_block": tile_module.STATS_BLOCK.value, "stats_order": args.stats_order or "product", "rows": []}
    with tempfile.TemporaryDirectory(prefix="prologue-") as kernels:
        for op in args.ops:
            n = INTERMEDIATE if op == "gate_up" else QKV
            for rows in args.rows:
                out["rows"] += run_case(op, rows, HIDDEN, n, "cuda", Path(kernels), True)
                args.json.write_text(json.dumps(out, indent=1))
    print(f"STATS_BLOCK {out['stats_block']}{', ' + args.stats_order if args.stats_order else ''}\n{'op':8} {'rows':>4} " + " ".join(f"{v:>9}" for v in VARIANTS))
    for op in args.ops:
        for rows in args.rows:
            got = {r["variant"]: r for r in out["rows"] if r["op"] == op and r["rows"] == rows}
            print(f"{op:8} {rows:4d} " + " ".join(
                f"{got[v]['us']:9.1f}" if "us" in got[v] else f"{'error':>9}" for v in VARIANTS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
