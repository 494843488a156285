"""GPU timing: CUDA graphs captured on side streams, replays timed with CUDA events, and the
device's own copy bandwidth and bf16 matmul rate (for the floor).

    graph = capture(fn, device)            # fn's kernels, warmed up first, in one CUDA graph
    timing = time_replays(graph.replay, replays=200, warmup=20)

Every graph is captured on a side stream of its own: on the H200 two graphs captured on the default
capture stream hung when replayed concurrently.
"""
from __future__ import annotations

import statistics
from functools import partial
from dataclasses import asdict, dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float
    replays: int

    def to_dict(self) -> dict:
        return asdict(self)


def capture(fn: Callable[[], None], device: torch.device, warmup: int = 2) -> torch.cuda.CUDAGraph:
    """fn's work as a CUDA graph, captured on a side stream after `warmup` eager runs there."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warmup):  # compiles, autotunes and allocates outside the capture
            fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        fn()
    torch.cuda.current_stream(device).wait_stream(side)
    torch.cuda.synchronize(device)
    return graph


def time_replays(run: Callable[[], None], replays: int, warmup: int,
                 enough: Callable[[list[float]], bool] | None = None, block: int = 25) -> Timing:
    """Median and p20/p80 of up to `replays` timed calls of `run` (each bracketed by CUDA events on
    the current stream), after `warmup` untimed ones. With `enough`, the calls stop early once
    `enough(times so far)` holds, asked after every `block` calls."""
    for _ in range(warmup):
        run()
    ms: list[float] = []
    while len(ms) < replays:
        events = []
        for _ in range(min(block if enough else replays, replays - len(ms))):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            events.append((start, end))
        torch.cuda.synchronize()
        ms += [s.elapsed_time(e) for s, e in events]
        if enough and enough(ms):
            break
    return summarize(ms)


def summarize(ms: list[float]) -> Timing:
    ms = sorted(ms)
    deciles = statistics.quantiles(ms, n=10) if len(ms) > 1 else [ms[0]] * 9
    return Timing(statistics.median(ms), deciles[1], deciles[7], len(ms))


def median_known_within(percent: float, at_least: int = 50) -> Callable[[list[float]], bool]:
    """Whether `at_least` times pin their median to within `percent` of it: its standard error,
    1.25 sigma / sqrt(n) with sigma estimated from the p20-p80 range (1.68 sigma for a normal
    spread), under that share of the median."""
    def enough(ms: list[float]) -> bool:
        if len(ms) < max(at_least, 2):
            return False
        t = summarize(ms)
        sigma = (t.p80_ms - t.p20_ms) / 1.683
        return 1.2533 * sigma / len(ms) ** 0.5 <= percent / 100 * t.median_ms
    return enough


def time_round(run: Callable[[], None], load_fresh: Callable[[], None], replays: int, warmup: int,
               enough: Callable[[list[float]], bool] | None = None) -> Timing:
    """Load fresh random inputs, then time the round's replays (see time_replays for `enough`)."""
    load_fresh()
    torch.cuda.synchronize()
    return time_replays(run, replays, warmup, enough)


# How a timed call's L2 cache is emptied first: "write" overwrites a buffer twice the cache (which
# leaves the cache full of dirty lines the call's own misses then write back to memory), "read" reads
# one (leaving clean lines that are dropped for free).
FLUSHES = ("write", "read")


def time_per_call(fn: Callable[[], None], device: torch.device, calls: int = 10, replays: int = 5,
                  flush_bytes: int = 0, flush: str = "write") -> float:
    """Microseconds per call of fn, from a CUDA graph of `calls` back-to-back calls. With
    `flush_bytes`, a buffer that large is overwritten (or read: `flush`) before every call (evicting
    the L2 cache, as the rest of a round would), and the flushes' own time is taken off pair by pair:
    the graph of flushes alone is replayed right after each replay of the timed graph, and the
    median of the differences is returned. A flush timed once and reused drifts: on an H100 the
    first one of a process read 5 us (15%) over its steady 33.4 (lab/attention_combine/README.md)."""
    evict = _flusher(device, flush_bytes, flush)
    if evict is None:
        return _per_call_us(partial(_repeat, fn, calls), device, calls, replays)

    def calls_in_a_row() -> None:
        for _ in range(calls):
            evict()
            fn()

    timed, flushes = capture(calls_in_a_row, device, warmup=1), capture(partial(_repeat, evict, calls), device, warmup=1)
    pairs = [[_bracketed(graph.replay) for graph in (timed, flushes)] for _ in range(replays + 1)]
    torch.cuda.synchronize(device)  # queued back to back: no host gap inside a pair
    differences = [(with_calls.elapsed_time(end) - alone.elapsed_time(alone_end)) * 1e3 / calls
                   for (with_calls, end), (alone, alone_end) in pairs[1:]]  # the first pair warms both graphs
    return max(statistics.median(differences), 0.0)


def _repeat(fn: Callable[[], None], times: int) -> None:
    for _ in range(times):
        fn()


def _bracketed(run: Callable[[], None]) -> tuple[torch.cuda.Event, torch.cuda.Event]:
    """run() between two timing events recorded on the current stream (read them after a synchronize)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    return start, end


def _flusher(device: torch.device, flush_bytes: int, flush: str) -> Callable[[], None] | None:
    """A call that empties the L2 cache by writing or reading `flush_bytes` (None below 4 KB)."""
    if flush not in FLUSHES:
        raise ValueError(f"flush {flush!r}: should be one of {', '.join(FLUSHES)}")
    if flush_bytes < 4096:
        return None
    scratch = torch.zeros(flush_bytes // 4096, 1024, dtype=torch.float32, device=device)
    if flush == "write":
        return scratch.zero_
    sink = torch.empty(1024, dtype=torch.float32, device=device)
    # reads it all; writes only the sum and the reduction's own staging (a fraction of a MB)
    return partial(torch.sum, scratch, dim=0, out=sink)


def _per_call_us(body: Callable[[], None], device: torch.device, calls: int, replays: int) -> float:
    graph = capture(body, device, warmup=1)
    return time_replays(graph.replay, replays, warmup=1).median_ms * 1e3 / calls


def concurrently(fns: list[Callable[[], None]], device: torch.device) -> Callable[[], None]:
    """A call that runs each of `fns` on a stream of its own, forked from and joined back to the
    current stream (inside a CUDA graph capture: parallel branches)."""
    streams = [torch.cuda.Stream(device) for _ in fns]

    def run() -> None:
        main = torch.cuda.current_stream(device)
        for stream, fn in zip(streams, fns):
            stream.wait_stream(main)
            with torch.cuda.stream(stream):
                fn()
        for stream in streams:
            main.wait_stream(stream)

    return run


def fork_join_us(device: torch.device, calls: int, flush_bytes: int = 0) -> float:
    """What `concurrently` itself adds per call in a CUDA graph (a fork to two streams and the join
    back): two one-element kernels on two streams against one alone, timed as time_per_call times."""
    a, b = torch.zeros(1, device=device), torch.zeros(1, device=device)
    timed = partial(time_per_call, device=device, calls=calls, flush_bytes=flush_bytes)
    alone = timed(lambda: a.add_(1))
    both = timed(concurrently([lambda: a.add_(1), lambda: b.add_(1)], device))
    return max(both - alone, 0.0)


def l2_flush_bytes(device: torch.device) -> int:
    """Twice the device's L2 cache: enough writing to evict what a launch left there."""
    return 2 * getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 << 20)


def copy_bandwidth_gbs(device: torch.device, nbytes: int = 2 << 30) -> float:
    """GB/s of a large device-to-device copy, read and write both counted."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    timing = time_replays(partial(dst.copy_, src), replays=15, warmup=3)
    return 2 * nbytes / (timing.median_ms * 1e-3) / 1e9


def matmul_tflops(device: torch.device, size: int = 8192) -> float:
    """Dense bf16 matmul rate in TFLOP/s."""
    a = torch.randn(size, size, dtype=torch.bfloat16, device=device)
    b = torch.randn(size, size, dtype=torch.bfloat16, device=device)
    timing = time_replays(lambda: a @ b, replays=10, warmup=3)
    return 2 * size ** 3 / (timing.median_ms * 1e-3) / 1e12
