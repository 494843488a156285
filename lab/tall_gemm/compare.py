"""tall_gemm (gemm.py) against cuBLAS and the product's template at its best tile, in one process.

On the GEMM shapes past 128 rows that a kernel sweep measured (default: the compute sweep's 72):

    python lab/tall_gemm/compare.py [--sweep benchmarks/results/compute_sweep_h100.json] [--limit 24] --json OUT.json

Per shape (gate and up stacked into one weight for cuBLAS and tall_gemm; the template runs the
product's own kind, its epilogue included): every launch checked against torch first (a failing one
is a row, not the end), then timed alone from a cold L2 as kernel_sweep.py times a tile
(timing.time_per_call, the flushes taken off pair by pair). The JSON holds each launch's time and its
time over cuBLAS's; the last lines print the geometric means. Lab code: nothing in `conjugate/`
imports it.
"""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(HERE))

from common import environment, make_parser, require_gpu, write_json  # noqa: E402

FORMS = (  # (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages, persistent): the Hopper matmul tiles
    (128, 128, 64, 8, 8, 3, True), (128, 128, 64, 8, 8, 4, True), (128, 256, 64, 8, 8, 3, True),
    (128, 128, 64, 8, 8, 4, False))
CALLS = 10
REL_ERR = 1e-2


def checked_us(call, out, ref, device, flush_bytes: int, fill: float = float("nan")) -> dict:
    """The launch checked against ref (relative Frobenius error) on an output filled with `fill` (NaN
    shows a tile never written; an epilogue adding into its output, the residual's, needs 0), then its
    time alone in us. A launch that fails or is wrong is a row with the reason."""
    import torch

    from conjugate.evaluate.timing import time_per_call

    out.fill_(fill)
    try:
        call()
        torch.cuda.synchronize(device)
    except Exception as error:  # out of shared memory and the like
        return {"error": f"{type(error).__name__}: {' '.join(str(error).split())[:200]}"}
    err = float((out.float() - ref).norm() / ref.norm())
    if not err <= REL_ERR:  # NaN fails too
        return {"error": f"wrong: relative error {err:.3g}"}
    return {"us": time_per_call(call, device, CALLS, flush_bytes=flush_bytes), "rel_err": err}


def compare_shape(entry: dict, kernels: Path, sms: int, device) -> dict:
    import torch

    import kernel_sweep as ks
    from conjugate.evaluate.timing import l2_flush_bytes
    from gemm import TallTile, launch

    shape, flush = ks.shape_from(entry["fields"] | {"kind": entry["kind"]}), l2_flush_bytes(device)
    inputs = ks.operands(shape)
    x, w = inputs["x"], torch.cat(inputs["ws"][:shape.weights])  # [rows, K], [weights * N, K]
    plain = torch.empty(shape.rows, w.shape[0], device=device)
    ref = x.float() @ w.float().T
    library = torch.empty(shape.rows, w.shape[0], device=device, dtype=x.dtype)  # torch.mm writes its inputs' type
    row = {"shape": entry["shape"], "bytes": shape.bytes,
           "cublas": checked_us(lambda: torch.mm(x, w.T, out=library), library, ref, device, flush)}
    tile = ks.tile_from({k: entry["best"][k] for k in ks.tile_fields(ks.Tile(1, 1, 1, 1, 1, 1))})
    template, out = ks.build(shape, tile, inputs, kernels)
    row["template"] = checked_us(template, out, inputs["ref"], device, flush, fill=0.0) | {
        "tile": entry["best"]["plan_keys"]}
    row["tall"] = []
    for values in FORMS:
        form = TallTile(*values)
        result = checked_us(launch(x, w, plain, form, sms), plain, ref, device, flush)
        row["tall"].append({"form": form.name(), "programs": form.programs(shape.rows, w.shape[0], sms)} | result)
    return row


def main() -> int:
    parser = make_parser(__doc__)
    parser.add_argument("--sweep", type=Path, default=ROOT / "benchmarks/results/compute_sweep_h100.json",
                        help="a kernel_sweep.py result: its GEMM shapes past 128 rows, each at its best tile")
    parser.add_argument("--limit", type=int, default=0, help="at most this many shapes (0: all)")
    args = parser.parse_args()
    try:
        entries = [e for e in json.loads(args.sweep.read_text())["shapes"]
                   if e["kind"] in ("qkv", "o_proj", "gate_up", "down") and e["fields"]["rows"] > 128 and e.get("best")]
    except (OSError, ValueError, KeyError, TypeError) as error:
        parser.error(f"--sweep {args.sweep}: not a kernel_sweep.py result ({type(error).__name__}: {error})")
    if not entries:
        parser.error(f"--sweep {args.sweep}: no GEMM shape past 128 rows")
    require_gpu(parser)
    import torch

    device = torch.device("cuda")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    out = {**environment("tall_gemm/compare"), "command": "python lab/tall_gemm/compare.py " + " ".join(sys.argv[1:]),
           "sweep": str(args.sweep), "shapes": []}
    with tempfile.TemporaryDirectory(prefix="tall-gemm-") as kernels:
        for entry in entries[:args.limit or None]:
            row = compare_shape(entry, Path(kernels), sms, device)
            out["shapes"].append(row)
            write_json(args.json, out)
            cublas = row["cublas"].get("us")
            best = min((t for t in row["tall"] if "us" in t), key=lambda t: t["us"], default=None)
            print(f"{row['shape']:28} cuBLAS {cublas or float('nan'):7.1f} us  template "
                  f"{row['template'].get('us', float('nan')):7.1f}  tall {best['us'] if best else float('nan'):7.1f}"
                  f" ({best['form'] if best else row['tall'][0].get('error')})", flush=True)
    timed = [r for r in out["shapes"] if "us" in r["cublas"] and "us" in r["template"]
             and any("us" in t for t in r["tall"])]
    if timed:
        def over(key) -> float:
            return statistics.geometric_mean(key(r) / r["cublas"]["us"] for r in timed)

        out["summary"] = {"shapes": len(timed), "template_over_cublas": over(lambda r: r["template"]["us"]),
                          "tall_over_cublas": over(lambda r: min(t["us"] for t in r["tall"] if "us" in t))}
        write_json(args.json, out)
        print(f"over cuBLAS's time, geometric mean of {len(timed)}: template {out['summary']['template_over_cublas']:.3f}x, "
              f"tall {out['summary']['tall_over_cublas']:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
