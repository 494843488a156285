"""A Step launch compiled: the draft's k decode steps as one persistent launch of the step kernel.

    step = CompiledStep.build(index, bufs.draft, programs, stream)   # raises ValueError if it cannot run
    step()                                                            # reads and writes bufs.draft

It reads the draft's buffers the way the launches would (its last tokens, lengths and KV cache) and
writes its tokens and cache entries; it writes no logits (the argmax is taken in the kernel). On a
Hopper GPU it is the Gluon kernel (kernels/step/device.py) on `programs` SMs; on the CPU the same
task table runs in torch (simulate.py), so a step plan checks and generates there too.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from conjugate.compiler.buffers import ModelBuffers
from conjugate.compiler.feedback import Resources
from conjugate.kernels.step.columns import BATCH_PAD
from conjugate.plan.expand import STEP_WARPS
from conjugate.compiler.step.ledger import task_ledger
from conjugate.compiler.step.table import ProgramError, StepProgram, Tiles, qkv_tiles, step_table

def cpu_tiles(spec) -> Tiles:
    """The simulation's tiles: small (many tiles and slices even for the tiny models), a paired qkv
    tile holding whole heads."""
    return Tiles(k=16, rows=32, half=max(16, spec.head_dim // 2))



CPU_PROGRAMS = 8  # programs the simulation interleaves
HOPPER_SMS = 132  # programs of a step launch compiled offline (meta buffers): an H100's or H200's SMs


@dataclass(frozen=True)
class StepCall:
    """The one part of a step launch, as feedback and the ledger see parts."""
    programs: int
    label: str = "draft steps"


class CompiledStep:
    num_warps, num_stages, pdl = STEP_WARPS, 1, False

    def __init__(self, index: int, bufs: ModelBuffers, table: StepProgram, stream: str):
        self.index, self.bufs, self.table, self.stream = index, bufs, table, stream
        self.grid = table.programs
        self.parts = [StepCall(table.programs)]
        self.resources = Resources()
        spec = table.spec
        self._table_digest = hashlib.sha256(f"step:{spec}:{table.batch}:{table.steps}:{table.programs}:"
                                            f"{table.tiles}".encode()).hexdigest()[:16]
        self.digest = self._table_digest
        self.launch_options: dict = {}  # StepLaunch's tuning parameters where not its defaults (lab variants)
        self._launch = self._make_launch() if _gpu_shaped(bufs) else None  # meta buffers: compiled offline only

    @classmethod
    def build(cls, index: int, bufs: ModelBuffers, programs: int, stream: str, sms: int | None = None) -> "CompiledStep":
        """The step launch of the draft's buffers on `programs` programs (GPU: one an SM it may use,
        of the `sms` it has: all must be resident at once)."""
        spec, w = bufs.spec, bufs.prepared.weights
        gpu = _gpu_shaped(bufs)
        if bufs.cache.k.device.type == "cuda":
            major, minor = torch.cuda.get_device_capability(bufs.cache.k.device)
            if (major, minor) != (9, 0):
                raise ValueError(f"the step kernel needs a Hopper GPU (sm_90); this one is sm_{major}{minor}")
        if gpu:
            if w.dtype != torch.bfloat16:
                raise ValueError(f"the step kernel runs bf16 drafts; this draft is {w.dtype}")
            if bufs.batch > BATCH_PAD:
                raise ValueError(f"the step kernel runs 1 to {BATCH_PAD} draft sequences; this round has {bufs.batch}")
            tiles = Tiles()
            try:
                partial = [seg for seg, _, count in qkv_tiles(spec, tiles) if count * spec.head_dim != 2 * tiles.half]
            except ProgramError as e:
                raise ValueError(f"the step table: {e}") from e
            if partial:
                raise ValueError(f"the step kernel's qkv tiles hold {2 * tiles.half} rows of whole heads; the "
                                 f"draft's {partial[0]} heads ({spec.head_dim} dims) leave one part-filled")
        try:
            table = (step_table(spec, bufs.batch, bufs.steps, programs, Tiles(), sms or programs) if gpu else
                     step_table(spec, bufs.batch, bufs.steps, CPU_PROGRAMS, cpu_tiles(spec)))
        except ProgramError as e:
            raise ValueError(f"the step table: {e}") from e
        return cls(index, bufs, table, stream)

    def _make_launch(self, stamps: bool = False, cache: torch.Tensor | None = None):
        from conjugate.compiler.step.launch import StepLaunch  # Gluon: imported where a GPU runs it

        b = self.bufs
        return StepLaunch(self.table, b.prepared.step_weights(self.table),
                          stacked_cache(b) if cache is None else cache, stamps=stamps, **self.launch_options)

    def use_launch_options(self, **options) -> None:
        """Rebuild the launch with StepLaunch's tuning parameters (`attention_buffers`, `mma_depth`,
        `direct_epilogue`; the launch's defaults for those not given); the next warmup compiles it."""
        if self._launch is None:
            raise ValueError("launch options tune the GPU kernel: the CPU simulation has none")
        self.launch_options = dict(options)
        self._launch = self._make_launch()
        self.digest = (hashlib.sha256(f"{self._table_digest}:{sorted(options.items())}".encode()).hexdigest()[:16]
                       if options else self._table_digest)

    @property
    def launch(self):
        """The Gluon launch (kernels/step/launch.py's StepLaunch) on a GPU or meta buffers; None on the CPU."""
        return self._launch

    @property
    def record_name(self) -> str:
        """The kernel's name in the profiler's records."""
        return "step_kernel"

    @property
    def kernel_file(self) -> str:
        return "conjugate/kernels/step/device.py"

    def manifest(self, pdl: str = "none") -> dict:
        return {"launch": self.index, "kernel": self.kernel_file, "grid": self.grid, "stream": self.stream,
                "pdl_trigger": "none", "parts": [{"ops": "draft steps", "tile": "step_kernel",
                                                  "programs": self.grid}]}

    def __call__(self) -> None:
        if self._launch is None:
            return self._simulate()
        b, launch = self.bufs, self._launch
        launch.tokens_in[:b.batch].copy_(b.tokens_in)
        launch.lengths.copy_(b.lengths)
        launch.run()
        b.tokens_out.copy_(launch.tokens[:, :b.batch].T)

    def _simulate(self) -> None:
        from conjugate.compiler.step.simulate import simulate
        from conjugate.models.reference import KVCache

        b = self.bufs
        out = simulate(self.table, b.prepared.weights, b.tokens_in, KVCache(b.cache.k, b.cache.v), b.lengths)
        b.tokens_out.copy_(out.tokens)
        b.cache.k.copy_(out.cache.k)
        b.cache.v.copy_(out.cache.v)

    def warmup(self) -> None:
        """Compile (GPU) and record the compiler's resource report."""
        if self._launch is not None:
            compiled = self._launch.warmup()
            compiled._init_handles()
            self.resources = Resources(compiled.n_regs, compiled.n_spills, compiled.metadata.shared)

    def ledger(self) -> dict:
        """Per op, the waits and work of the last inputs' launch, from a stamped launch of its own on a
        copy of the cache (GPU; ledger.task_ledger, with its critical path)."""
        if self._launch is None:
            raise ValueError("the step launch's ledger reads the GPU's timer: run it on a GPU")
        stamped = self._make_launch(stamps=True, cache=stacked_cache(self.bufs).clone())
        stamped.tokens_in.copy_(self._launch.tokens_in)
        stamped.lengths.copy_(self._launch.lengths)
        stamped.run()
        torch.cuda.synchronize()
        return task_ledger(self.table, stamped.stamps, attention_streamed=stamped.kwargs["RING_KV"])

    def spins_ran_out(self) -> int:
        """Waits that hit their spin limit in the launches so far (GPU; a checked table never does)."""
        return int(self._launch.error.item()) if self._launch is not None else 0


def _gpu_shaped(bufs: ModelBuffers) -> bool:
    """The kernel's own table and launch: on a GPU, and on meta buffers (compiled offline)."""
    return bufs.cache.k.device.type in ("cuda", "meta")


def stacked_cache(bufs: ModelBuffers) -> torch.Tensor:
    """The draft's KV cache as the [2, L, B, KVH, S, D] tensor the kernel indexes: KVCache.empty
    allocates k and v as its two halves."""
    k, v = bufs.cache.k, bufs.cache.v
    base = k._base
    if base is None or base.shape[0] != 2 or v.data_ptr() != base[1].data_ptr() or k.data_ptr() != base.data_ptr():
        raise ValueError("the step kernel needs the KV cache's keys and values as halves of one tensor")
    return base
