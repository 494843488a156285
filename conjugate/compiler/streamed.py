"""A Streamed launch compiled: one residual GEMM (o_proj or down) as the streamed kernel.

    launch = CompiledStreamed.build(index, part, op, bufs, stream, sms)  # ValueError if it cannot run
    launch()                                                              # x += a @ w^T, stats and copy as planned

On a Hopper GPU it is the Gluon kernel (kernels/streamed.py) over one program per SM at most, a
programmatic dependent launch where the plan's trigger says so; on the CPU the same arithmetic runs
in torch (fp32 products of the bf16 operands), so a plan with streamed launches checks and generates
there too.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from conjugate.compiler.buffers import ModelBuffers, padded_rows
from conjugate.compiler.feedback import Resources
from conjugate.compiler.lower import residual_writes
from conjugate.graph import Op
from conjugate.kernels.tile import STATS_CHUNK
from conjugate.plan.launch import Part, Pdl

KINDS = ("o_proj", "down")  # the residual GEMMs the streamed kernel runs
MAX_ROWS = 128  # the activation rows one tile's wgmma takes (its N)
SMEM_BYTES = 200 * 1024  # the ring's shared memory, within an H100's or H200's 227 KB a block
MAX_STAGES = 12


def ring_stages(rows: int, tile_rows: int = 64, tile_k: int = 64) -> int:
    """Ring slots that fit SMEM_BYTES: each a weight box and an activation box of `tile_k` bf16 columns."""
    return min(MAX_STAGES, SMEM_BYTES // ((tile_rows + padded_rows(rows)) * tile_k * 2))


def warps(rows: int) -> int:
    """Compute warps: two warpgroups over a's rows where they are 128, else one."""
    return 8 if padded_rows(rows) == 128 else 4


@dataclass(frozen=True)
class StreamedCall:
    """The one part of a streamed launch, as feedback, the ledger and the manifest see parts."""
    programs: int
    label: str


@dataclass(frozen=True)
class StreamedOperands:
    a: torch.Tensor  # [padded rows, K] bf16: the activations in their padded buffer (buffers.padded_rows)
    w: torch.Tensor  # [N, K]
    x: torch.Tensor  # [rows, N] fp32: the residual stream
    stats: torch.Tensor | None  # [rows, >= N / STATS_CHUNK] fp32: the finished rows' statistics
    copy: torch.Tensor | None  # [rows, N]: a copy of the finished rows


def _operands(part: Part, op: Op, bufs: ModelBuffers) -> StreamedOperands:
    """The buffers a lowered o_proj or down reads and writes (compiler/lower.py's choices)."""
    lw = bufs.prepared.weights.layers[op.layer]
    source, w = ("attn_out", lw.wo) if op.kind == "o_proj" else ("mlp", lw.w_down)
    stats_out, copy = residual_writes(op, part.norm_stats, part.mlp_fused, bufs.spec.num_layers)
    act = bufs.act
    return StreamedOperands(bufs.padded(source), w, act["x"], act["stats"] if stats_out else None,
                            act["h"] if copy else None)


class CompiledStreamed:
    num_stages = 1

    def __init__(self, index: int, ops: StreamedOperands, rows: int, label: str, stream: str, sms: int, gpu: bool,
                 trigger: Pdl = Pdl.NONE):
        self.index, self.ops, self.rows, self.stream, self.trigger = index, ops, rows, stream, trigger
        self.pdl = trigger != Pdl.NONE  # launched as a programmatic dependent launch
        n = ops.w.shape[0]
        self.grid = min(sms, -(-n // 64))
        self.num_warps = warps(rows)
        self.parts = [StreamedCall(self.grid, label)]
        self.resources = Resources()
        self.digest = hashlib.sha256(f"streamed:{tuple(ops.w.shape)}:{rows}:{ops.stats is not None}:"
                                     f"{ops.copy is not None}:{trigger}".encode()).hexdigest()[:16]
        try:
            self._launch = _launch_args(ops, rows, self.grid, trigger) if gpu else None
        except (AssertionError, ValueError) as e:  # a descriptor the TMA cannot take (alignment, strides)
            raise ValueError(f"the streamed kernel's TMA descriptors: {e}") from e

    @classmethod
    def build(cls, index: int, part: Part, op: Op, bufs: ModelBuffers, stream: str, sms: int,
              trigger: Pdl = Pdl.NONE) -> "CompiledStreamed":
        """`part` (one o_proj or down) as a streamed launch on at most `sms` programs, `trigger` its
        programmatic dependent launch (round.launch_pdl: none on the CPU)."""
        if op.kind not in KINDS:
            raise ValueError(f"the streamed kernel runs {' and '.join(KINDS)}, not {op.kind}")
        if len(part.ops) != 1:
            raise ValueError(f"the streamed kernel runs one op alone, not the chain {'+'.join(part.ops)}")
        if bufs.rows > MAX_ROWS:
            raise ValueError(f"the streamed kernel takes up to {MAX_ROWS} activation rows; this pass has {bufs.rows}")
        ops = _operands(part, op, bufs)
        device = ops.w.device
        gpu = device.type in ("cuda", "meta")
        if device.type == "cuda" and torch.cuda.get_device_capability(device) != (9, 0):
            major, minor = torch.cuda.get_device_capability(device)
            raise ValueError(f"the streamed kernel needs a Hopper GPU (sm_90); this one is sm_{major}{minor}")
        if gpu and (ops.w.dtype != torch.bfloat16 or ops.a.dtype != torch.bfloat16):
            raise ValueError(f"the streamed kernel multiplies bf16; this model's weights are {ops.w.dtype}")
        if gpu and ops.w.shape[1] % 8:
            raise ValueError(f"the streamed kernel's weight rows must be 16-byte aligned; K={ops.w.shape[1]}")
        return cls(index, ops, bufs.rows, "+".join(part.ops), stream, sms, gpu, trigger)

    @property
    def record_name(self) -> str:
        """The kernel's name in the profiler's records."""
        return "streamed_residual_kernel"

    @property
    def kernel_file(self) -> str:
        return "conjugate/kernels/streamed.py"

    def manifest(self, pdl: str | None = None) -> dict:
        """Its entry in the round's manifest.json (`pdl`: the trigger as compiled, its own by default)."""
        return {"launch": self.index, "kernel": self.kernel_file, "grid": self.grid, "stream": self.stream,
                "pdl_trigger": pdl or str(self.trigger),
                "parts": [{"ops": self.parts[0].label, "tile": self.record_name, "programs": self.grid}]}

    def gluon_launch(self) -> tuple:
        """(kernel, args, kwargs) of the Gluon launch (GPU or meta buffers)."""
        if self._launch is None:
            raise ValueError("the streamed kernel runs on a GPU: the CPU emulates it in torch")
        from conjugate.kernels.streamed import streamed_residual_kernel  # Gluon: imported where it runs

        return (streamed_residual_kernel, *self._launch)

    def __call__(self) -> None:
        if self._launch is None:
            return self._emulate()
        kernel, args, kwargs = self.gluon_launch()
        kernel[(self.grid, )](*args, **kwargs)

    def _emulate(self) -> None:
        """The kernel's arithmetic in torch: fp32 products of the operands, added into the stream."""
        o, rows = self.ops, self.rows
        new = o.x[:rows] + o.a[:rows].float() @ o.w.float().T
        o.x[:rows] = new
        if o.stats is not None:
            n = new.shape[1]
            chunks = -(-n // STATS_CHUNK.value)
            padded = torch.nn.functional.pad(new, (0, chunks * STATS_CHUNK.value - n))
            o.stats[:rows, :chunks] = (padded * padded).view(rows, chunks, STATS_CHUNK.value).sum(-1)
        if o.copy is not None:
            o.copy[:rows] = new.to(o.copy.dtype)

    def warmup(self) -> None:
        """Compile (GPU) and record the compiler's resource report."""
        if self._launch is None:
            return
        kernel, args, kwargs = self.gluon_launch()
        compiled = kernel.warmup(*args, **kwargs, grid=(self.grid, ))
        compiled._init_handles()
        self.resources = Resources(compiled.n_regs, compiled.n_spills, compiled.metadata.shared)


def _launch_args(ops: StreamedOperands, rows: int, grid: int, trigger: Pdl) -> tuple[tuple, dict]:
    """The kernel's arguments: TMA descriptors over the weights and the padded activations."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from conjugate.kernels.streamed import TILE_K, TILE_ROWS

    mpad = padded_rows(rows)

    def descriptor(t: torch.Tensor, box_rows: int):
        return TensorDescriptor.from_tensor(t, [box_rows, TILE_K],
                                            gl.NVMMASharedLayout.get_default_for([box_rows, TILE_K], gl.bfloat16))

    n, k = ops.w.shape
    stats, copy = ops.stats, ops.copy
    args = (descriptor(ops.w, TILE_ROWS), descriptor(ops.a[:mpad], mpad), rows, n, k, ops.x, ops.x.stride(0),
            stats if stats is not None else ops.x, stats.stride(0) if stats is not None else 0,
            copy if copy is not None else ops.a, copy.stride(0) if copy is not None else 0)
    kwargs = dict(STAGES=ring_stages(rows), WARPS=warps(rows), STATS_OUT=stats is not None,
                  COPY_OUT=copy is not None, PDL=str(trigger), num_warps=warps(rows), maxnreg=168,
                  launch_pdl=trigger != Pdl.NONE)
    return args, kwargs
