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
