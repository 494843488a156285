"""Lab (#48): the step kernel checked against the reference and timed, on a Hopper GPU; or compiled for
sm_90a without one.

    python lab/step_kernel/run.py --models M --batches B --steps K --json OUT.json   # check, time, ledger
    python lab/step_kernel/run.py --offline                                         # compile for sm_90a
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import triton

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "stream_chain"), str(HERE.parents[1])]
from chain import SLOT_ROWS, graph_time_us  # noqa: E402
from host import StepLaunch, tile_weights  # noqa: E402
from kernel import step_kernel  # noqa: E402
from program import StepProgram, build, check  # noqa: E402

def empty_weights(prog: StepProgram, device="cpu") -> dict[str, torch.Tensor]:
    """tile_weights' shapes, uninitialised (compiling reads only shapes, dtypes and alignment)."""
    spec = prog.spec
    L, H, F, V, D = spec.num_layers, spec.hidden_size, spec.ffn_size, spec.vocab_size, spec.head_dim
    from program import qkv_tiles
    nq = len(qkv_tiles(spec, prog.tiles))
    e = lambda *shape, dtype=torch.bfloat16: torch.empty(*shape, dtype=dtype, device=device)  # noqa: E731
    return {"qkv": e(L * nq * SLOT_ROWS, H), "bias": e(L * nq * SLOT_ROWS, dtype=torch.float32),
            "o": e(L * H, spec.q_size),
            "gu": e(L * 2 * F, H), "d": e(L * H, F), "head": e(V, H), "qkn": e(L, 2, D, dtype=torch.float32),
            "inv_freq": e(D // 2, dtype=torch.float32), "embed": e(V, H)}


def compile_offline(model: str, batch: int, steps: int, programs: int = 132, capacity: int = 1100,
                    attention: str = "cores"):
    from chain import compile_for_sm90
    from conjugate.models.presets import from_name

    spec = from_name(model)
    prog = build(spec, batch, steps, programs)
    check(prog, programs)
    launch = StepLaunch(prog, empty_weights(prog), capacity, attention=attention)
    kv = torch.empty(2, spec.num_layers, batch, spec.num_kv_heads, capacity, spec.head_dim, dtype=torch.bfloat16)
    return launch, compile_for_sm90(step_kernel, launch.args(kv), launch.kwargs)


def run_offline(args) -> int:
    import re
    print(f"triton {triton.__version__}: step_kernel for cuda:90 (sm_90a), no GPU")
    for model, attention in ((m, a) for m in args.models for a in args.attention):
        launch, compiled = compile_offline(model, args.batch, args.steps, attention=attention)
        ptx = compiled.asm["ptx"]
        found = {name: pattern in ptx for name, pattern in (
            ("wgmma", "wgmma.mma_async"), ("tma", "cp.async.bulk.tensor"), ("cp.async", "cp.async.cg"),
            ("mbarrier", "mbarrier.try_wait"), ("acquire", ".acquire"), ("release", ".release"))}
        sm = re.search(r"^\.target\s+(\S+)", ptx, re.M).group(1)
        print(f"{model} B={args.batch} steps={args.steps} attention {attention} "
              f"(kv buffers {launch.kwargs['ATTN_MMA']}): {len(launch.prog.tasks)} tasks, stages "
              f"{launch.kwargs['STAGES']}, act tiles {launch.kwargs['KT_MAX']}, shared {compiled.metadata.shared} B, "
              f"target {sm}, " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in found.items()), flush=True)
    return 0


# --------------------------------------------------------------------------------------------------
# On the GPU: check against the reference, then time
# --------------------------------------------------------------------------------------------------

def _inputs(spec, batch: int, context: int, steps: int, seed: int):
    """Random bf16 weights, last tokens, ragged lengths in [context/2, context], a cache of noise."""
    from conjugate.models.weights import random_weights

    w = random_weights(spec, seed=seed, dtype=torch.bfloat16, device="cuda")
    gen = torch.Generator(device="cpu").manual_seed(seed)
    last = torch.randint(0, spec.vocab_size, (batch, ), generator=gen).cuda()
    lengths = torch.randint(context // 2, context + 1, (batch, ), generator=gen).cuda()
    capacity = context + steps + 1
    kv = (torch.randn(2, spec.num_layers, batch, spec.num_kv_heads, capacity, spec.head_dim, generator=gen)
          .to(torch.bfloat16).cuda())
    return w, last, lengths, kv


def check_against_reference(launch: StepLaunch, w, last, lengths, kv) -> dict:
    """Runs the kernel once (sums and activations poisoned first), then the reference draft phase on
    the same inputs, teacher-forced with the kernel's tokens so every step compares like with like:
    each step's logits (relative to their largest), whether each chosen token is the reference's
    argmax or within 1% of its logit range of it, the caches' new positions, and the spins that ran out."""
    from conjugate.models.reference import KVCache, draft_phase

    spec, k = launch.spec, launch.prog.steps
    for buf in (launch.xs, launch.xm, launch.q, launch.o, launch.h):
        buf.fill_(float("nan"))
    kv_kernel = kv.clone()
    launch.tokens_in[:len(last)] = last.to(torch.int32)
    launch.lengths.copy_(lengths.to(torch.int32))
    launch.error.zero_()
    launch.run(kv_kernel)
    torch.cuda.synchronize()
    tokens = launch.tokens[:, :len(last)].T.long()  # [B, k]
    rstd = torch.rsqrt(launch.ssx[:, -1] / spec.hidden_size + spec.rms_norm_eps)  # [k, B]
    logits = (launch.sums[4][:, :, :spec.vocab_size] * rstd[:, :, None]).transpose(0, 1)  # [B, k, V]
    cache = KVCache(kv[0].clone(), kv[1].clone())
    ref_tokens, ref_logits = draft_phase(w, last, cache, lengths, k, forced=tokens)
    span = (ref_logits.amax(-1) - ref_logits.amin(-1))
    chosen = ref_logits.gather(-1, tokens[..., None])[..., 0]
    near = ((ref_logits.amax(-1) - chosen) <= 0.01 * span)
    err = ((logits - ref_logits).abs().amax() / ref_logits.abs().amax()).item()
    new = torch.zeros_like(kv, dtype=torch.bool)
    for b, n in enumerate(lengths.tolist()):
        new[:, :, b, :, n:n + k] = True
    cache_err = ((kv_kernel[new].float() - torch.stack([cache.k, cache.v])[new].float()).abs().max()
                 / torch.stack([cache.k, cache.v])[new].float().abs().max()).item()
    untouched = bool(torch.equal(kv_kernel[~new], kv[~new]))
    return {"logits_rel_err": err, "tokens_equal": int((tokens == ref_tokens).sum()), "tokens": tokens.numel(),
            "tokens_near": int(near.sum()), "cache_rel_err": cache_err, "cache_elsewhere_untouched": untouched,
            "waits_ran_out": int(launch.error.item())}


def ledger(prog: StepProgram, stamps: torch.Tensor) -> dict:
    """Where the launch's time went, from the in-kernel stamps (start, waits met, end of each task):
    per op, the mean per program of the time spent waiting on counters and of the time spent working
    (a GEMM's work includes waiting for its weight tiles: the streaming), and the launch's span. What a
    program spends outside its tasks (reading the table) is the rest."""
    st = stamps.cpu().double() / 1e3  # us
    t0 = st[:, 0].min()
    span = (st[:, 2].max() - t0).item()
    out = {"span_us": span, "programs": prog.programs, "ops": {}}
    for op in ("embed", "qkv", "attn", "o_proj", "gate_up", "down", "head"):
        idx = torch.tensor([t.index for t in prog.tasks if t.op == op])
        if len(idx) == 0:
            continue
        rows = st[idx]
        out["ops"][op] = {"tasks": len(idx), "wait_us": ((rows[:, 1] - rows[:, 0]).sum() / prog.programs).item(),
                          "work_us": ((rows[:, 2] - rows[:, 1]).sum() / prog.programs).item()}
    busy = sum(v["wait_us"] + v["work_us"] for v in out["ops"].values())
    out["between_tasks_us"] = span - busy
    return out


def floor_bytes(spec, batch: int, steps: int, lengths) -> int:
    """What the k steps must read: every weight once a step (embedding rows aside), the caches below
    each position."""
    L, H = spec.num_layers, spec.hidden_size
    per_layer = (spec.qkv_size * H + spec.q_size * H + 3 * spec.ffn_size * H) * 2
    weights = L * per_layer + spec.vocab_size * H * 2
    kv = sum(int(n) + s + 1 for n in lengths.tolist() for s in range(steps)) * L * spec.num_kv_heads * spec.head_dim * 4
    return steps * weights + kv


def run_gpu(args) -> int:
    from chain import hopper_and_copy_rate, write_probe_result
    from conjugate.evaluate.timing import copy_bandwidth_gbs
    from conjugate.models.presets import from_name
    from program import coarsen

    gpu = hopper_and_copy_rate()
    if gpu is None:
        return 2
    sms, _ = gpu
    bw = copy_bandwidth_gbs(torch.device("cuda")) * 1e9  # the project's floor rate (floor_h200.json's)
    print(f"copy (conjugate.evaluate.timing): {bw / 1e9:.0f} GB/s", flush=True)
    rows = []
    for model in args.models:
        spec = from_name(model)
        for batch in args.batches:
            for context in args.contexts:
                fine = build(spec, batch, args.steps, min(sms, args.programs or sms))
                tables = {"fine": fine, "whole": coarsen(fine), "mixed": coarsen(fine, kinds=("x", "xm", "h"))}
                w, last, lengths, kv = _inputs(spec, batch, context, args.steps, seed=0)
                weights = tile_weights(w, fine)
                floor_us = floor_bytes(spec, batch, args.steps, lengths) / bw * 1e6
                for name, attention, sleep in ((c, a, z) for c in args.counters for a in args.attention
                                               for z in args.spin_sleep):
                    prog = tables[name]
                    check(prog, sms)
                    launch = StepLaunch(prog, weights, kv.shape[4], attention=attention, spin_sleep=sleep)
                    result = check_against_reference(launch, w, last, lengths, kv)
                    ok = (result["logits_rel_err"] < 5e-2 and result["tokens_near"] == result["tokens"]
                          and result["cache_rel_err"] < 5e-2 and result["cache_elsewhere_untouched"]
                          and not result["waits_ran_out"])
                    row = dict(model=model, batch=batch, steps=args.steps, context=context, counters=name,
                               attention=attention, spin_sleep=sleep,
                               programs=prog.programs, stages=launch.kwargs["STAGES"], tasks=len(prog.tasks),
                               waits=sum(len(t.waits) + len(t.finish_waits) for t in prog.tasks), check=result,
                               passed=ok, floor_us=floor_us)
                    print(f"{model} B={batch} k={args.steps} ctx={context} {name} {attention} sleep {sleep}: "
                          f"{json.dumps(result)}",
                          flush=True)
                    if ok:
                        kv_run = kv.clone()
                        launch.error.zero_()
                        us = graph_time_us([lambda: launch.run(kv_run)])
                        row.update(step_kernel_us=us, of_floor=us / floor_us,
                                   waits_ran_out_timed=int(launch.error.item()))
                        print(f"  {us:.1f} us for {args.steps} steps, floor {floor_us:.1f} us: {us / floor_us:.2f}x",
                              flush=True)
                        stamped = StepLaunch(prog, weights, kv.shape[4], stamps=True, attention=attention,
                                             spin_sleep=sleep)
                        stamped.tokens_in.copy_(launch.tokens_in)
                        stamped.lengths.copy_(launch.lengths)
                        stamped.run(kv.clone())
                        torch.cuda.synchronize()
                        row["ledger"] = ledger(prog, stamped.stamps)
                        lg = row["ledger"]
                        print(f"  stamped: span {lg['span_us']:.0f} us; per program, wait / work us: "
                              + ", ".join(f"{op} {v['wait_us']:.0f}/{v['work_us']:.0f}" for op, v in lg["ops"].items())
                              + f"; between tasks {lg['between_tasks_us']:.0f}", flush=True)
                        del stamped
                    rows.append(row)
                    write_probe_result(args.json, sms, bw, rows=rows)
                    del launch
                del w, kv, weights
                torch.cuda.empty_cache()
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="The draft's k decode steps as one persistent Gluon kernel "
                                                 "running the step program's task table.")
    parser.add_argument("--json")
    parser.add_argument("--offline", action="store_true")
    parser.add_argument("--models", nargs="+", default=["llama-3.2-1b"])
    parser.add_argument("--batches", nargs="+", type=int, default=[8])
    parser.add_argument("--batch", type=int, default=8, help="--offline: the batch compiled for")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--contexts", nargs="+", type=int, default=[1024])
    parser.add_argument("--counters", nargs="+", default=["fine", "whole"], choices=["fine", "whole", "mixed"],
                        help="one counter a tile (fine), an op instance (whole), or an op instance but for qkv's "
                             "tiles and attention's KV heads (mixed)")
    parser.add_argument("--programs", type=int, default=None, help="default: one an SM")
    parser.add_argument("--spin-sleep", nargs="+", type=int, default=[0],
                        help="ns a spinning wait pauses between polls (0: none; written, not yet run on a GPU)")
    parser.add_argument("--attention", nargs="+", default=["cores"], choices=["cores", "mma"],
                        help="attention on CUDA cores, or on tensor cores (written, not yet run on a GPU)")
    args = parser.parse_args(argv)
    return run_offline(args) if args.offline else run_gpu(args)


if __name__ == "__main__":
    if "--offline" in sys.argv:
        os.environ.setdefault("TRITON_INTERPRET", "0")
    sys.exit(main())
