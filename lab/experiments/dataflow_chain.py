"""A chain of dependent decode GEMMs as one dataflow kernel, against the same chain as launches.

    python lab/experiments/dataflow_chain.py [--dim 2048] [--rows 8] [--layers 32] [--split 2 4]
                                        [--streams 2 4] [--json OUT.json]

The chain x_{l+1} = x_l @ W_l^T (bf16 weights [dim, dim], fp32 rows) is what a small draft's decode
step is made of: short dependent GEMMs whose weights never depend on the step before. Timed from CUDA
graphs, each checked against torch first:
1. `launches`: one launch per GEMM, the GEMM template at the sweep's best tile for a draft o_proj
   (BLOCK_M 16, BLOCK_N 16, BLOCK_K 512, 4 warps, 5 stages), one after another;
   `launches pdl T [preload]`: the same as programmatic dependent launches released at T (start:
   right away, end: once its tiles are done), with `preload` each tile loading its first weights
   into registers before it waits for the launch before (the plan's `pdl.preload`);
2. `N streams`: the same launches dealt round-robin to N streams with nothing ordering them
   (garbage results): what overlapping neighbours could win (overlap_bound.py);
3. `dataflow`: one persistent launch of dim / 16 * split programs, each owning a [16, dim / split]
   block of every W_l. A program loads its block of W_{l+1} into registers *before* it waits for
   layer l's inputs, then multiplies, adds its partial into the next rows atomically and counts
   itself done on layer l's counter; the next layer's programs wait until the counter holds every
   program. Rows rotate through three buffers, each zeroed by its column owners two layers ahead,
   so no add meets a stale value. `prefetch 0` loads the block after the wait instead (the same
   kernel without the overlap). Every program must be resident at once (a grid the GPU cannot hold
   is skipped, by the kernel's registers); --warps tries each.
Each result is checked against the chain in fp32 first (TOLERANCE: every layer re-rounds the rows).
The floor: the chain's weight bytes at the measured copy bandwidth.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from conjugate.cli.arguments import output_file, positive  # noqa: E402
from conjugate.compiler.persist import give_up, resident_programs  # noqa: E402

BLOCK_N = 16  # output columns a program owns (tl.dot's smallest side)
BLOCK_M = 16  # rows padded to tl.dot's smallest side
LAUNCH_TILE = dict(block_m=16, block_n=16, block_k=512, split_k=1)  # kernel_sweep's best, draft o_proj 8x2048x2048
LAUNCH_WARPS, LAUNCH_STAGES = 4, 5
PDL_VARIANTS = (("start", False), ("end", False), ("start", True), ("end", True))  # trigger, preload
TOLERANCE = 5e-2  # relative error against fp32: a deep chain re-rounds its rows to bf16 every layer (launches: 1-2%)


@triton.jit
def _block(w_ptr, layer, n0, k0, DIM: tl.constexpr, BLOCK_N: tl.constexpr, SPAN: tl.constexpr):
    """[BLOCK_N, SPAN] of W_layer: rows n0.., columns k0.."""
    rows = n0 + tl.arange(0, BLOCK_N)
    cols = k0 + tl.arange(0, SPAN)
    return tl.load(w_ptr + layer.to(tl.int64) * DIM * DIM + rows[:, None] * DIM + cols[None, :])


@triton.jit
def chain_kernel(x_ptr, w_ptr, done_ptr, rows, layers, DIM: tl.constexpr, SPLIT: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr):
    """x_ptr: three [rows, DIM] fp32 buffers (the first holds x_0, the second zeros); w_ptr: [layers,
    DIM, DIM] bf16; done_ptr: int32 [layers] zeros. Program pid owns columns n0.. of every output and
    the K span k0.. of its split."""
    SPAN: tl.constexpr = DIM // SPLIT
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    n0 = (pid // SPLIT) * BLOCK_N
    k0 = (pid % SPLIT) * SPAN
    m = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    span = tl.arange(0, SPAN)
    row_ok = (m < rows)[:, None]
    w_next = _block(w_ptr, pid * 0, n0, k0, DIM, BLOCK_N, SPAN)  # layer 0's block (a tensor index)
    for layer in range(layers):
        w = w_next
        if PREFETCH:  # the next layer's block, before the wait: weights never depend on it
            w_next = _block(w_ptr, tl.minimum(layer + 1, layers - 1), n0, k0, DIM, BLOCK_N, SPAN)
        if layer > 0:  # every program has added its part of layer - 1: x_layer is whole
            seen = tl.atomic_add(done_ptr + layer - 1, 0, sem="acquire", scope="gpu")
            polls = 0
            while seen < programs:
                seen = tl.atomic_add(done_ptr + layer - 1, 0, sem="acquire", scope="gpu")
                polls += 1
                give_up(polls)  # a trap, not a hang, should a program never come
        if not PREFETCH:
            w = _block(w_ptr, layer + pid * 0, n0, k0, DIM, BLOCK_N, SPAN)
        if k0 == 0:  # the columns' owner zeroes them two layers ahead (read by no one any more)
            ahead = x_ptr + ((layer + 2) % 3) * rows * DIM
            tl.store(ahead + m[:, None] * DIM + n0 + cols[None, :], tl.zeros([BLOCK_M, BLOCK_N], tl.float32),
                     mask=row_ok)
        source = x_ptr + (layer % 3) * rows * DIM
        x = tl.load(source + m[:, None] * DIM + k0 + span[None, :], mask=row_ok, other=0.0)  # [BLOCK_M, SPAN]
        part = tl.dot(x.to(w.dtype), tl.trans(w))  # [BLOCK_M, BLOCK_N] fp32
        target = x_ptr + ((layer + 1) % 3) * rows * DIM
        tl.atomic_add(target + m[:, None] * DIM + n0 + cols[None, :], part, mask=row_ok, sem="relaxed")
        tl.debug_barrier()  # every thread's adds are issued before the release below
        tl.atomic_add(done_ptr + layer, 1, sem="release", scope="gpu")


def chain_inputs(dim: int, rows: int, layers: int, device: str, seed: int = 0):
    """x_0 [rows, dim] fp32 and W [layers, dim, dim] bf16 scaled to keep the rows' size."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(rows, dim, device=device, generator=gen)
    w = (torch.randn(layers, dim, dim, device=device, generator=gen) / dim ** 0.5).bfloat16()
    return x, w


def reference(x, w):
    """The chain in fp32 over the bf16 weights, each layer's rows rounded to bf16 as the dot reads them."""
    for layer in range(w.shape[0]):
        x = x.bfloat16().float() @ w[layer].float().T
    return x


def dataflow(x0, w, split: int, prefetch: bool, warps: int = 4):
    """(run, result): the persistent chain over its own buffers; run() zeroes the counters and the
    first output buffer, copies x_0 in and launches; result() is the last layer's rows."""
    import torch

    layers, dim, rows = w.shape[0], w.shape[1], x0.shape[0]
    if dim % (BLOCK_N * split) or rows > BLOCK_M:
        raise ValueError(f"dim {dim} must divide into {BLOCK_N}-column blocks of {split} splits, rows <= {BLOCK_M}")
    bufs = torch.empty(3, rows, dim, dtype=torch.float32, device=x0.device)
    done = torch.zeros(layers, dtype=torch.int32, device=x0.device)
    grid = (dim // BLOCK_N * split,)
    options = dict(DIM=dim, SPLIT=split, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, PREFETCH=prefetch, num_warps=warps)
    if x0.is_cuda:  # every program resident at once, or one waits for a program that never starts
        kernel = chain_kernel.warmup(bufs, w, done, rows, layers, grid=grid, **options)
        kernel._init_handles()  # loads the module: the register count
        sms = torch.cuda.get_device_properties(x0.device).multi_processor_count
        fits = resident_programs(kernel.n_regs, kernel.metadata.shared, warps, sms)
        if grid[0] > fits:
            raise ValueError(f"{grid[0]} programs, {fits} resident at once ({kernel.n_regs} registers)")

    def run() -> None:
        done.zero_()
        bufs[0].copy_(x0)
        bufs[1].zero_()
        chain_kernel[grid](bufs, w, done, rows, layers, **options)

    return run, lambda: bufs[layers % 3]


def launches(x0, w, kernels: Path, tile: dict | None = None, trigger: str = "none", preload: bool = False):
    """(calls, result): one GEMM template launch per layer (rows ping-ponging between two buffers);
    `trigger`: each launch a programmatic dependent launch released there (start, end); `preload`:
    its tiles load their first weights before they wait (gemm.preload_before_wait)."""
    import torch

    from conjugate.compiler.codegen import KernelCache, Pdl
    from conjugate.compiler.gemm import gemm_call, preload_before_wait
    from conjugate.compiler.round import CompiledLaunch

    rows = x0.shape[0]
    bufs = [x0.clone(), torch.empty_like(x0)]
    cache = KernelCache(kernels)
    calls = []
    for layer in range(w.shape[0]):
        part = gemm_call(bufs[layer % 2], w[layer], bufs[(layer + 1) % 2], rows=rows, **(tile or LAUNCH_TILE))
        if preload and not preload_before_wait(part, LAUNCH_WARPS, trigger == "start"):
            raise ValueError(f"no preload fits the tile {tile or LAUNCH_TILE}")
        calls.append(CompiledLaunch.build(layer, [part], cache, num_warps=LAUNCH_WARPS, num_stages=LAUNCH_STAGES,
                                          pdl=Pdl(trigger, preload=preload)))

    def reset() -> None:
        bufs[0].copy_(x0)

    return [reset] + calls, lambda: bufs[w.shape[0] % 2]


def relative_error(got, want) -> float:
    return float((got.float() - want).norm() / want.norm())


def bench(dim: int, rows: int, layers: int, splits: list[int], streams: list[int], replays: int,
          warps: list[int], tile: dict | None = None) -> dict:
    import torch

    from conjugate.evaluate.timing import capture, concurrently, copy_bandwidth_gbs, time_replays

    device = torch.device("cuda")
    x0, w = chain_inputs(dim, rows, layers, "cuda")
    want = reference(x0, w)
    copy_gbs = copy_bandwidth_gbs(device)
    floor_us = w.numel() * w.element_size() / (copy_gbs * 1e9) * 1e6

    def timed(body) -> float:
        graph = capture(body, device, warmup=1)
        return time_replays(graph.replay, replays, warmup=3).median_ms * 1e3

    out = {"dim": dim, "rows": rows, "layers": layers, "copy_gbs": copy_gbs, "floor_us": floor_us,
           "launch_tile": tile or LAUNCH_TILE, "variants": []}
    with tempfile.TemporaryDirectory(prefix="dataflow-chain-") as kernels:
        calls, result = launches(x0, w, Path(kernels), tile)
        for call in calls:
            call()
        torch.cuda.synchronize()
        err = relative_error(result(), want)
        out["variants"].append({"variant": "launches", "error": err,
                                "us": timed(lambda: [c() for c in calls]) if err < TOLERANCE else None})
        for n in streams:  # garbage results: only the time counts
            body = concurrently([lambda share=calls[1:][j::n]: [c() for c in share] for j in range(n)], device)
            out["variants"].append({"variant": f"{n} streams", "error": None, "us": timed(body)})
        for trigger, preload in PDL_VARIANTS:
            name = f"launches pdl {trigger}" + (" preload" if preload else "")
            try:
                calls, result = launches(x0, w, Path(kernels), tile, trigger, preload)
            except ValueError as e:
                out["variants"].append({"variant": name, "error": None, "us": None, "skipped": str(e)})
                continue
            for call in calls:
                call()
            torch.cuda.synchronize()
            err = relative_error(result(), want)
            preloaded = calls[1].constexprs.get("P0_PRELOAD_K", 0)
            out["variants"].append({"variant": name, "error": err, "preload_k": preloaded,
                                    "us": timed(lambda: [c() for c in calls]) if err < TOLERANCE else None})
    for split, prefetch, n_warps in ((s, p, n) for s in splits for p in (True, False) for n in warps):
        name = f"dataflow split {split} prefetch {int(prefetch)} warps {n_warps}"
        try:
            run, result = dataflow(x0, w, split, prefetch, n_warps)
        except ValueError as e:
            out["variants"].append({"variant": name, "error": None, "us": None, "skipped": str(e)})
            continue
        run()
        torch.cuda.synchronize()
        err = relative_error(result(), want)
        row = {"variant": name, "error": err, "programs": dim // BLOCK_N * split}
        row["us"] = timed(run) if err < TOLERANCE else None
        out["variants"].append(row)
    for row in out["variants"]:
        row["floor_ratio"] = row["us"] / floor_us if row["us"] else None
        print(json.dumps(row), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=positive, default=2048)
    parser.add_argument("--rows", type=positive, default=8)
    parser.add_argument("--layers", type=positive, default=32)
    parser.add_argument("--split", nargs="+", type=positive, default=[2, 4])
    parser.add_argument("--streams", nargs="+", type=positive, default=[2, 4])
    parser.add_argument("--warps", nargs="+", type=positive, default=[4, 8], help="the dataflow kernel's")
    parser.add_argument("--launch-tile", nargs=3, type=positive, metavar=("BLOCK_N", "BLOCK_K", "SPLIT_K"),
                        help="the launches' tile (default: 16 512 1, BLOCK_M 16)")
    parser.add_argument("--replays", type=positive, default=50)
    parser.add_argument("--json", type=output_file)
    args = parser.parse_args()
    import torch

    tile = None if not args.launch_tile else dict(block_m=16, block_n=args.launch_tile[0],
                                                   block_k=args.launch_tile[1], split_k=args.launch_tile[2])
    out = bench(args.dim, args.rows, args.layers, args.split, args.streams, args.replays, args.warps, tile)
    out |= {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "command": " ".join(sys.argv)}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    print(f"floor {out['floor_us']:.1f} us ({args.layers} x {args.dim}x{args.dim} bf16, {args.rows} rows)")
    for row in out["variants"]:
        us = f"{row['us']:8.1f} us {row['floor_ratio']:5.2f}x" if row["us"] else ""
        why = row.get("skipped") or ("(failed its check)" if row["error"] is not None and not row["us"] else "")
        print(f"{row['variant']:36} {us if row['us'] else why}  error {row['error'] if row['error'] is not None else '-'}")


if __name__ == "__main__":
    main()
