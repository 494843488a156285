"""Static resource checks of a bound part, made before Triton sees it, so a plan whose tiles cannot
fit the GPU fails as data (CompileError) and the same way with or without a GPU at hand."""
from __future__ import annotations

import torch

from conjugate.compiler.gemm import EPILOGUES
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
    if part.sig.fn == "gemm_tile":
        x_tile = c["BLOCK_M"] * c["BLOCK_K"] * a["x_ptr"].element_size()
        # two weight tiles: gate and up, or (rope_kv) the two halves of a head
        weights = 2 if c["EPILOGUE"] in (EPILOGUES["silu_mul"], EPILOGUES["rope_kv"]) else 1
        w_tiles = c["BLOCK_N"] * c["BLOCK_K"] * a["w_ptr"].element_size() * weights
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
