"""Tile parameters per op family: which keys a plan may set, their bounds and their defaults."""
from __future__ import annotations

from conjugate.graph import GEMM_KINDS, KINDS

FAMILY_OF = {kind: "gemm" for kind in GEMM_KINDS} | {"attn": "attn"} | {
    kind: "elementwise" for kind in KINDS if kind not in GEMM_KINDS and kind != "attn"}

# key -> (low, high); every tile value is a power of two within its bounds.
TILE_BOUNDS: dict[str, dict[str, tuple[int, int]]] = {
    "gemm": {"BLOCK_M": (16, 256), "BLOCK_N": (16, 512), "BLOCK_K": (16, 512), "SPLIT_K": (1, 64)},
    "attn": {"BLOCK_N": (16, 512), "SPLIT_KV": (1, 64)},
    "elementwise": {"BLOCK": (16, 16384)},
}
LAUNCH_BOUNDS: dict[str, tuple[int, int]] = {"num_warps": (1, 16), "num_stages": (1, 8)}

DEFAULT_TILES: dict[str, dict[str, int]] = {
    "gemm": {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 1},
    "attn": {"BLOCK_N": 64, "SPLIT_KV": 1},
    "elementwise": {"BLOCK": 1024},
}
DEFAULT_LAUNCH: dict[str, int] = {"num_warps": 4, "num_stages": 2}


def is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def tile_keys(kind: str) -> dict[str, tuple[int, int]]:
    """Keys a tile config of this op kind accepts (launch parameters included) and their bounds."""
    return TILE_BOUNDS[FAMILY_OF[kind]] | LAUNCH_BOUNDS
