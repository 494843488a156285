"""A CUDA stream whose kernels run on part of the GPU's SMs (plan `sm_limit`): a stream of a CUDA
green context holding that many SMs. Launches go to it as to any stream, captured into the round's
CUDA graph with it; the other model's stream keeps the whole GPU, so the SMs left over are its own.

Needs a PyTorch whose `torch.cuda.green_contexts.GreenContext` gives a stream of its own (`Stream()`),
built with CUDA 12.8+, and a driver that has green contexts; where any is missing the round does not
compile, and says why. On the H200 with torch 2.11 the limited rounds captured, checked correct and
ran (benchmarks/README.md, `sm_limit`).
"""
from __future__ import annotations

import importlib

import torch


class SmLimitUnavailable(RuntimeError):
    """This machine cannot limit a stream to part of the GPU."""


def limited_stream(device: torch.device, sms: int) -> tuple[object, torch.cuda.Stream]:
    """(green context, its stream) for `sms` SMs of `device`; keep the context as long as the stream."""
    available = torch.cuda.get_device_properties(device).multi_processor_count
    if sms >= available:
        raise SmLimitUnavailable(f"{sms} SMs: this GPU has {available}, so the limit leaves the other stream none")
    try:
        green_contexts = importlib.import_module("torch.cuda.green_contexts")
    except ImportError as e:
        raise SmLimitUnavailable(f"this PyTorch ({torch.__version__}) has no torch.cuda.green_contexts") from e
    if not getattr(green_contexts, "SUPPORTED", False):
        raise SmLimitUnavailable(f"this PyTorch ({torch.__version__}) was built without CUDA green contexts")
    try:
        context = green_contexts.GreenContext.create(num_sms=sms, device_id=device.index or 0)
        if not hasattr(context, "Stream"):  # earlier releases: only while the context is current, not in a graph
            raise SmLimitUnavailable(f"this PyTorch ({torch.__version__}) gives a green context no stream of its own")
        return context, context.Stream()
    except RuntimeError as e:  # an old driver, or a count the device cannot split off
        raise SmLimitUnavailable(f"{sms} SMs: {str(e).strip().splitlines()[0]}") from e
