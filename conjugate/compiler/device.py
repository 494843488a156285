"""What the compiler needs to know of the GPU: shared memory per program (a static check of a bound
part, made before Triton sees it, so a plan whose tiles cannot fit fails as data, CompileError, the
same way with or without a GPU at hand), how many programs of a kernel it holds at once, and streams
limited to part of its SMs (plan `sm_limit`).

A limited stream is a stream of a CUDA green context holding that many SMs. Launches go to it as to
any stream, captured into the round's CUDA graph with it; the other model's stream keeps the whole
GPU, so the SMs left over are its own. It needs a PyTorch whose
`torch.cuda.green_contexts.GreenContext` gives a stream of its own (`Stream()`), built with CUDA
12.8+, and a driver that has green contexts; where any is missing the round does not compile, and
says why.
"""
from __future__ import annotations

import importlib

import torch

from conjugate.compiler.gemm import GEMM_TILES, TWO_WEIGHT_TILES
from conjugate.compiler.tile import PartCall

HOPPER_SHARED_BYTES = 232448  # per program (227 KB opt-in), H100 and H200


def shared_memory_limit(device: torch.device) -> int:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return getattr(props, "shared_memory_per_block_optin", HOPPER_SHARED_BYTES)
    return HOPPER_SHARED_BYTES


def shared_memory_estimate(part: PartCall, num_stages: int) -> int:
    """Bytes of shared memory the part's pipelined operand tiles take (a lower bound of Triton's)."""
    c, a = part.constexprs, part.args
    if part.sig.fn in GEMM_TILES:
        x_tile = c["BLOCK_M"] * c["BLOCK_K"] * a["x_ptr"].element_size()
        # two weight tiles: gate and up, or (rope_kv) the two halves of a head
        weights = 2 if part.sig.fn in TWO_WEIGHT_TILES else 1
        block_n = c["HEAD_DIM"] // 2 if "HEAD_DIM" in c else c["BLOCK_N"]
        w_tiles = block_n * c["BLOCK_K"] * a["w_ptr"].element_size() * weights
        return num_stages * (x_tile + w_tiles)
    if part.sig.fn == "mlp_tile":  # its first loop's tiles: x, gate and up (the down loop's one tile is less)
        w_tiles = 2 * c["BLOCK_F"] * c["BLOCK_K"] * a["gate_ptr"].element_size()
        return num_stages * (c["BLOCK_M"] * c["BLOCK_K"] * a["x_ptr"].element_size() + w_tiles)
    if part.sig.fn == "attn_tile":
        kv_tiles = 2 * c["BLOCK_N"] * c["HEAD_DIM"] * a["k_ptr"].element_size()
        return max(2, num_stages) * kv_tiles + c["ROWS"] * c["HEAD_DIM"] * a["k_ptr"].element_size()  # q, cast
    return 0


def check_shared_memory(part: PartCall, num_stages: int, device: torch.device) -> None:
    """ValueError when the part's tiles cannot fit in one program's shared memory."""
    need, limit = shared_memory_estimate(part, num_stages), shared_memory_limit(device)
    if need > limit:
        raise ValueError(f"tiles need at least {need // 1024} KB of shared memory with num_stages={num_stages}; "
                         f"the GPU gives a program {limit // 1024} KB (smaller BLOCK_* or fewer stages)")


# Hopper (H100, H200) per multiprocessor: four sub-partitions, each with its own register file
SUBPARTITIONS = 4
SUBPARTITION_REGISTERS = 16384
SM_THREADS = 2048
SM_PROGRAMS = 32
SM_SHARED_BYTES = 233472  # 228 KB, 1 KB of it reserved per program
REGISTER_UNIT = 256  # registers are given to a warp in units of 256
SHARED_UNIT = 128  # and shared memory to a program in units of 128 bytes


def resident_programs(registers: int, shared_bytes: int, num_warps: int, sms: int) -> int:
    """How many programs of a kernel the GPU holds at once (occupancy by Hopper's limits, as CUDA's
    occupancy calculator counts: a warp's registers come from one sub-partition's file)."""
    per_warp = -(-max(registers, 1) * 32 // REGISTER_UNIT) * REGISTER_UNIT
    warps = SUBPARTITION_REGISTERS // per_warp * SUBPARTITIONS
    shared = -(-shared_bytes // SHARED_UNIT) * SHARED_UNIT + 1024
    per_sm = min(warps // num_warps, SM_THREADS // (32 * num_warps), SM_PROGRAMS, SM_SHARED_BYTES // shared)
    return max(per_sm, 0) * sms


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
