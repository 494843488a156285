"""Per-row sampling parameters on the device (`SamplingRows`), read by the sampling kernels
(kernels/sampling.py): the draft's sample part in a round and the accept step (serving/settle.py).
A row of temperature 0 is greedy: its tokens are exactly the argmax's.

`launch_sample` runs a bound sample part (embed.sample_call) as a kernel of its own, outside a plan
(the conventional round's draft)."""
from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from conjugate.compiler.tile import PartCall
from conjugate.kernels.sampling import sample_tile

if TYPE_CHECKING:
    from conjugate.serving.requests import SamplingParams

SEED_LIMIT = 1 << 63  # seeds are int64 in [0, SEED_LIMIT)


@dataclass(frozen=True)
class SamplingRows:
    """One row per sequence of a batch: temperature f32, top_p f32, top_k i64 (0: off), seed i64."""
    temperature: torch.Tensor
    top_p: torch.Tensor
    top_k: torch.Tensor
    seed: torch.Tensor

    @classmethod
    def allocate(cls, batch: int, device: torch.device | str) -> "SamplingRows":
        """`batch` greedy rows."""
        if batch < 1:
            raise ValueError(f"sampling rows: batch must be at least 1, got {batch}")
        return cls(torch.zeros(batch, dtype=torch.float32, device=device),
                   torch.ones(batch, dtype=torch.float32, device=device),
                   torch.zeros(batch, dtype=torch.int64, device=device),
                   torch.zeros(batch, dtype=torch.int64, device=device))

    def __len__(self) -> int:
        return self.temperature.shape[0]

    @property
    def device(self) -> torch.device:
        return self.temperature.device

    def __getitem__(self, rows: slice) -> "SamplingRows":
        """Views of a run of rows (a group's first rows, say): writes reach this batch's rows."""
        if not isinstance(rows, slice) or rows.step not in (None, 1):
            raise ValueError("sampling rows: index with a slice of consecutive rows")
        return SamplingRows(self.temperature[rows], self.top_p[rows], self.top_k[rows], self.seed[rows])

    def set(self, row: int, params: "SamplingParams") -> None:
        """Row `row` samples as `params` says (a SamplingParams; seed None: a fresh random one)."""
        self._check_row(row)
        temperature, top_p, top_k, seed = _values(params)
        self.temperature[row] = temperature
        self.top_p[row] = top_p
        self.top_k[row] = top_k
        self.seed[row] = secrets.randbelow(SEED_LIMIT) if seed is None else seed

    def set_greedy(self, row: int) -> None:
        """Row `row` back to greedy decoding (temperature 0, no cuts)."""
        self._check_row(row)
        self.temperature[row], self.top_p[row], self.top_k[row], self.seed[row] = 0.0, 1.0, 0, 0

    def _check_row(self, row: int) -> None:
        if isinstance(row, bool) or not isinstance(row, int) or not 0 <= row < len(self):
            raise ValueError(f"sampling rows: row {row!r} outside 0..{len(self) - 1}")

    def check(self, batch: int, device: torch.device) -> None:
        """Refuse rows a kernel over `batch` sequences on `device` cannot read."""
        for name, t, dtype in (("temperature", self.temperature, torch.float32), ("top_p", self.top_p, torch.float32),
                               ("top_k", self.top_k, torch.int64), ("seed", self.seed, torch.int64)):
            if t.shape != (batch,) or t.dtype != dtype or t.stride(0) != 1 or t.device != device:
                raise ValueError(f"sampling {name}: expected a contiguous {dtype} [{batch}] on {device}, got "
                                 f"{t.dtype} {tuple(t.shape)} on {t.device}")


def _values(params) -> tuple[float, float, int, int | None]:
    """(temperature, top_p, top_k, seed) of a SamplingParams, each checked."""
    try:
        temperature, top_p, top_k, seed = params.temperature, params.top_p, params.top_k, params.seed
    except AttributeError:
        raise ValueError(f"sampling rows: expected SamplingParams, got {type(params).__name__}") from None
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"sampling rows: temperature {temperature!r} must be a finite number >= 0")
    if not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise ValueError(f"sampling rows: top_p {top_p!r} must lie in (0, 1]")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"sampling rows: top_k {top_k!r} must be an integer >= 0")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_LIMIT):
        raise ValueError(f"sampling rows: seed {seed!r} must be an integer in [0, 2**63)")
    return float(temperature), float(top_p), top_k, seed


@triton.jit
def _sample_kernel(logits_ptr, vocab, stride_logits, out_ptr, stride_out, lengths_ptr, step, temperature_ptr,
                   top_p_ptr, top_k_ptr, seed_ptr, BLOCK: tl.constexpr):
    sample_tile(tl.program_id(0), logits_ptr, vocab, stride_logits, out_ptr, stride_out, lengths_ptr, step,
                temperature_ptr, top_p_ptr, top_k_ptr, seed_ptr, BLOCK)


def launch_sample(call: PartCall, num_warps: int = 4) -> None:
    """Run a bound sample part (embed.sample_call) on its own, one program per row."""
    if call.sig.fn != sample_tile.fn.__name__:
        raise ValueError(f"launch_sample runs a sample part, not {call.sig.fn}")
    _sample_kernel[(call.programs,)](**call.args, **call.constexprs, num_warps=num_warps)
