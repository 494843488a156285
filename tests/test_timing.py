"""GPU timing helpers that run on any device: how a timed call's L2 cache is emptied first."""
from __future__ import annotations

import pytest
import torch

from conjugate.evaluate.timing import FLUSHES, _flusher


def test_a_write_flush_overwrites_and_a_read_flush_only_reads_its_buffer():
    cpu = torch.device("cpu")
    assert FLUSHES == ("write", "read")
    write, read = _flusher(cpu, 1 << 16, "write"), _flusher(cpu, 1 << 16, "read")
    buffer = write.__self__  # the tensor zero_ is bound to
    buffer.fill_(2.0)
    write()
    assert buffer.numel() * 4 == 1 << 16 and float(buffer.abs().sum()) == 0.0
    scratch, sink = read.args[0], read.keywords["out"]
    scratch.fill_(1.0)
    read()
    assert scratch.numel() * 4 == 1 << 16 and float(scratch.sum()) == scratch.numel()  # untouched
    assert sink.shape == (1024,) and torch.equal(sink, torch.full((1024,), 16.0))  # 16 rows summed
    assert _flusher(cpu, 100, "read") is None  # nothing worth flushing


def test_an_unknown_flush_is_named():
    with pytest.raises(ValueError, match="flush 'erase': should be one of write, read"):
        _flusher(torch.device("cpu"), 1 << 16, "erase")


def test_a_flushed_call_is_timed_against_the_flushes_replayed_beside_it(monkeypatch):
    """The flushes' own time is taken off pair by pair: a flush that reads 5 us slow in the first
    pair and drifts afterwards leaves the call's time exact (it once was measured once and reused);
    the first pair only warms the graphs, and the median of the others is returned."""
    from conjugate.evaluate import timing

    calls, call_us = 10, 11.7
    captured, replays = [], []

    class Graph:
        def __init__(self, number):
            self.number = number

        def replay(self):
            replays.append(self.number)

    class Event:  # ms since a start is read from what ran between the two records
        def __init__(self, enable_timing=False):
            self.at = None

        def record(self):
            self.at = len(replays)

        def elapsed_time(self, end):
            graph, pair = replays[self.at], self.at // 2
            flush_us = 38.4 if pair == 0 else 33.4 + 0.3 * pair  # cold at first, then drifting
            call = call_us + (50.0 if pair == 0 else 0.1 * pair)  # the warm-up pair far off, the others apart
            return calls * (flush_us + (call if graph == 1 else 0.0)) / 1e3

    monkeypatch.setattr(timing, "capture", lambda fn, device, warmup=2: captured.append(fn) or Graph(len(captured)))
    monkeypatch.setattr(timing.torch.cuda, "Event", Event)
    monkeypatch.setattr(timing.torch.cuda, "synchronize", lambda *a: None)
    us = timing.time_per_call(lambda: None, torch.device("cpu"), calls=calls, replays=5, flush_bytes=1 << 16)
    assert us == pytest.approx(call_us + 0.3)  # the median of pairs 1-5 (+0.1 .. +0.5); with pair 0 kept, +0.35
    assert len(captured) == 2 and replays == [1, 2] * 6  # the timed graph, then the flushes', warm pair first
