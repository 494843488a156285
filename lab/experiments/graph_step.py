"""Which first use of the GPU makes an already captured CUDA graph replay slower for the rest of the
process (lab/experiments/steadiness.py found a 4% step on a round of ~1,400 launches).

Each trigger runs in a fresh process: a chain of many small kernels is captured in one CUDA graph
and timed, the trigger runs once, and the same graph is timed again (twice).

    python lab/experiments/graph_step.py OUT.json [--nodes 1500] [--triggers NAME ...]

Triggers: `nothing`, `streams` (two new streams, a kernel on each), `graph` (a second one-kernel
graph captured on a new side stream), `graph-same-stream` (that graph captured on the stream the
chain was captured on), `cublas-graph` (a graph of one cuBLAS GEMM), `sdpa-graph` (a graph of one
masked SDPA call, torch's choice of backend; `sdpa-graph-<backend>`: cudnn, math, or flash without
the mask, which it does not take; the efficient backend takes no grouped KV heads), `rng-graph` (a
graph of one torch.rand call),
`alloc-graph-small`/`-large` (a graph that allocates and fills 4 KiB / 32 MiB), `sdpa-graph-expandable`
(`sdpa-graph` with the caching allocator's expandable segments); the math backend without grouped
heads or without the mask, and graphs of its parts alone: `bmm-graph`, `softmax-graph`,
`where-graph` (the bool mask made additive), `repeat-graph` (KV heads repeated);
`softmax-graph-preloaded`: its kernel run once before the chain was captured; the ops the
serving loop and the conventional round capture: `argmax-graph`, `sum-graph`, `where-tensor-graph`,
`where-same-shape-graph`, `cumprod-graph`, `index-put-graph`, `strided-copy-graph`, `add-out-graph`
(an out-of-place contiguous add), and softmax's parts: `convert-graph` (bf16 -> fp32),
`softmax-fp32-graph`; `h2d-copy-graph` (a memcpy node from pinned host memory); `softmax-eager`
(softmax run once outside any graph, after the chain's capture); `stack-limit` (the per-thread stack
raised to 32 KiB with cudaDeviceSetLimit, then one kernel launched); `two-kernel-graph` (a graph of
two in-place elementwise kernels, nothing allocated), `two-alloc-graph` (two kernels, each writing a
new tensor). `--env KEY=VALUE`
sets a variable in every child (e.g. CUDA_MODULE_LOADING=EAGER).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

OP_TRIGGERS = ("bmm-graph", "softmax-graph", "softmax-graph-preloaded", "where-graph", "repeat-graph", "argmax-graph",
               "sum-graph", "where-tensor-graph", "where-same-shape-graph", "cumprod-graph", "index-put-graph",
               "strided-copy-graph", "add-out-graph", "convert-graph", "softmax-fp32-graph", "h2d-copy-graph")
SDPA_BACKENDS = {"sdpa-graph-cudnn": "CUDNN_ATTENTION",
                 "sdpa-graph-math": "MATH", "sdpa-graph-flash-unmasked": "FLASH_ATTENTION",
                 "sdpa-graph-math-nogqa": "MATH", "sdpa-graph-math-unmasked": "MATH"}
TRIGGERS = ("nothing", "streams", "graph", "graph-same-stream", "cublas-graph", "sdpa-graph", "rng-graph",
            *SDPA_BACKENDS, "alloc-graph-small", "alloc-graph-large", "sdpa-graph-expandable", *OP_TRIGGERS,
            "softmax-eager", "stack-limit", "two-kernel-graph", "two-alloc-graph")


def _raise_stack_limit(size: int) -> None:
    """cudaDeviceSetLimit(cudaLimitStackSize, size) through the CUDA runtime torch has loaded."""
    import ctypes

    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            runtime = ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        raise RuntimeError("no CUDA runtime library found to set the stack limit")
    code = runtime.cudaDeviceSetLimit(ctypes.c_int(0), ctypes.c_size_t(size))  # 0: cudaLimitStackSize
    if code != 0:
        raise RuntimeError(f"cudaDeviceSetLimit failed with error {code}")


def _median_replay_us(graph, replays: int = 60) -> float:
    from conjugate.evaluate.timing import time_replays

    return time_replays(graph.replay, replays, warmup=5).median_ms * 1e3


def _captured(fn, stream):
    import torch

    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    return graph


def _op_part(trigger: str, scores):
    """The torch op (or two) of one op trigger, on tensors shaped like a round's, made for it alone."""
    import torch

    dev = scores.device
    if trigger.startswith("softmax-graph"):
        return lambda: scores.float().softmax(-1)
    if trigger == "softmax-fp32-graph":
        scores32 = scores.float()
        return lambda: scores32.softmax(-1)
    if trigger == "convert-graph":
        return lambda: scores.float()
    if trigger in ("bmm-graph", "repeat-graph"):
        kv = torch.randn(4 * 32, 1029, 128, dtype=torch.bfloat16, device=dev)
        if trigger == "bmm-graph":
            return lambda: torch.bmm(scores, kv)
        return lambda: kv.view(4, 32, 1029, 128)[:, :8].repeat_interleave(4, dim=1)
    if trigger == "where-graph":
        mask = torch.ones(4, 1, 5, 1029, dtype=torch.bool, device=dev)
        return lambda: torch.where(mask, 0.0, float("-inf"))
    if trigger in ("argmax-graph", "sum-graph", "strided-copy-graph"):
        logits = torch.randn(8, 32000, device=dev)
        if trigger == "strided-copy-graph":
            out = torch.zeros(8, 5, 32000, device=dev)
            return lambda: out[:, 2].copy_(logits)
        return (lambda: logits.argmax(-1)) if trigger == "argmax-graph" else (lambda: logits.sum())
    if trigger == "where-tensor-graph":
        active, counts = torch.ones(8, dtype=torch.bool, device=dev), torch.arange(8, device=dev)
        return lambda: torch.where(active, counts, 0)
    if trigger == "cumprod-graph":
        drafts = torch.zeros(8, 5, dtype=torch.long, device=dev)
        targets = torch.zeros(8, 6, dtype=torch.long, device=dev)
        return lambda: (drafts == targets[:, :5]).long().cumprod(1).sum(1)
    if trigger == "index-put-graph":
        cache, new = torch.zeros(8, 8, 1029, 128, device=dev), torch.randn(8, 1, 8, 128, device=dev)
        rows, positions = torch.arange(8, device=dev)[:, None], torch.full((8, 1), 7, device=dev)
        return lambda: cache.__setitem__((rows, slice(None), positions), new)
    a, b = torch.randn(1 << 18, device=dev), torch.randn(1 << 18, device=dev)
    if trigger == "where-same-shape-graph":
        return lambda: torch.where(a > 0, a, b)
    if trigger == "add-out-graph":
        return lambda: a + b
    if trigger == "h2d-copy-graph":
        pinned = torch.ones(4096).pin_memory() if dev.type == "cuda" else torch.ones(4096)
        return lambda: a[:4096].copy_(pinned, non_blocking=True)
    raise ValueError(f"not an op trigger: {trigger}")


def one_process(trigger: str, nodes: int) -> dict:
    """The chain timed before the trigger and twice after it, in microseconds."""
    import torch
    import torch.nn.functional as F

    x = torch.zeros(1 << 18, device="cuda")
    scores = torch.randn(4 * 32, 5, 1029, dtype=torch.bfloat16, device="cuda")
    if trigger.endswith("preloaded"):
        scores.float().softmax(-1)
        torch.cuda.synchronize()
    chain_stream = torch.cuda.Stream()
    chain = _captured(lambda: [x.add_(1.0) for _ in range(nodes)], chain_stream)
    before = _median_replay_us(chain)
    kept = []  # what the trigger made stays alive while the chain is timed again
    if trigger == "streams":
        for _ in range(2):
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                x.mul_(1.0)
            kept.append(s)
        torch.cuda.synchronize()
    elif trigger in ("graph", "graph-same-stream"):
        stream = chain_stream if trigger == "graph-same-stream" else torch.cuda.Stream()
        kept.append(_captured(lambda: x.mul_(1.0), stream))
    elif trigger == "cublas-graph":
        a = torch.randn(40, 4096, dtype=torch.bfloat16, device="cuda")
        w = torch.randn(4096, 4096, dtype=torch.bfloat16, device="cuda")
        kept.append(_captured(lambda: F.linear(a, w), torch.cuda.Stream()))
    elif trigger.startswith("alloc-graph"):
        size = 1 << (12 if trigger.endswith("small") else 25)
        fill = lambda: torch.empty(size, dtype=torch.uint8, device="cuda").fill_(1)  # noqa: E731
        kept.append(_captured(fill, torch.cuda.Stream()))
    elif trigger in OP_TRIGGERS:
        kept.append(_captured(_op_part(trigger, scores), torch.cuda.Stream()))
    elif trigger == "two-kernel-graph":
        kept.append(_captured(lambda: (x.mul_(1.0), x.add_(0.0)), torch.cuda.Stream()))
    elif trigger == "two-alloc-graph":
        kept.append(_captured(lambda: (x * 1.0) + 0.0, torch.cuda.Stream()))
    elif trigger == "softmax-eager":
        scores.float().softmax(-1)
    elif trigger == "stack-limit":
        _raise_stack_limit(32 << 10)
        x.mul_(1.0)
    elif trigger == "rng-graph":
        kept.append(_captured(lambda: torch.rand(1024, device="cuda"), torch.cuda.Stream()))
    elif trigger.startswith("sdpa-graph"):  # -expandable: set in the child's environment
        from torch.nn.attention import SDPBackend, sdpa_kernel

        q = torch.randn(4, 32, 5, 128, dtype=torch.bfloat16, device="cuda")
        kv = torch.randn(4, 32 if trigger.endswith("nogqa") else 8, 1029, 128, dtype=torch.bfloat16, device="cuda")
        gqa = kv.shape[1] != q.shape[1]
        mask = None if trigger.endswith("unmasked") else torch.ones(4, 1, 5, 1029, dtype=torch.bool, device="cuda")
        forced = getattr(SDPBackend, SDPA_BACKENDS[trigger]) if trigger in SDPA_BACKENDS else None

        def attend():
            if forced is None:
                return F.scaled_dot_product_attention(q, kv, kv, attn_mask=mask, enable_gqa=gqa)
            with sdpa_kernel([forced]):
                return F.scaled_dot_product_attention(q, kv, kv, attn_mask=mask, enable_gqa=gqa)

        kept.append(_captured(attend, torch.cuda.Stream()))
    for graph in kept:
        if isinstance(graph, torch.cuda.CUDAGraph):
            graph.replay()
    torch.cuda.synchronize()
    after = [_median_replay_us(chain), _median_replay_us(chain)]
    return {"trigger": trigger, "nodes": nodes, "before_us": round(before, 1), "after_us": [round(a, 1) for a in after],
            "step_pct": round((statistics.median(after) - before) / before * 100, 2),
            "step_us_per_node": round((statistics.median(after) - before) / nodes, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--nodes", type=int, default=1500)
    parser.add_argument("--triggers", nargs="+", choices=TRIGGERS, default=list(TRIGGERS))
    parser.add_argument("--env", nargs="*", default=[], metavar="KEY=VALUE")
    parser.add_argument("--one", choices=TRIGGERS, help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_process(args.one, args.nodes)))
        return
    bad = [kv for kv in args.env if "=" not in kv or kv.startswith("=")]
    if bad:
        parser.error(f"--env {bad[0]!r}: expected KEY=VALUE")
    import torch

    if not torch.cuda.is_available():
        sys.exit("graph_step.py: needs an NVIDIA GPU (it times CUDA graphs)")
    header = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "env": args.env,
              "command": " ".join(sys.argv)}
    rows = []
    for trigger in args.triggers:
        rows.append(_child(trigger, args))
        print(json.dumps(rows[-1]), flush=True)
        args.out.write_text(json.dumps(header | {"rows": rows}, indent=1) + "\n")  # kept row by row


def _child(trigger: str, args) -> dict:
    """One trigger's row from a process of its own; a child that fails gives a row that says why."""
    env = os.environ | dict(kv.split("=", 1) for kv in args.env)
    if trigger.endswith("expandable"):
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    try:
        done = subprocess.run([sys.executable, __file__, str(args.out), "--nodes", str(args.nodes), "--one", trigger],
                              capture_output=True, text=True, env=env, timeout=300)
    except subprocess.TimeoutExpired:
        return {"trigger": trigger, "error": "ran past 300 s"}
    lines = (done.stdout if done.returncode == 0 else done.stderr).strip().splitlines()
    if done.returncode or not lines:
        last = lines[-1][:300] if lines else ""
        return {"trigger": trigger, "error": f"exited with status {done.returncode}: {last}"}
    return json.loads(lines[-1])

if __name__ == "__main__":
    main()
