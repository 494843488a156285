"""Device buffers of a compiled round: prepared weights, activations, KV caches, tokens, logits.

Activations are rows (row r = sequence * tokens + token). The residual stream `x`, its row
statistics (`stats`, for norms fused into the next GEMM), the q/k/v projections and attention
queries are fp32; the GEMMs' other inputs (normed rows, attention
output, SiLU*mul output) are stored in the weights' type, which the GEMM rounds them to anyway. Each model has one set of
activation buffers, reused by every layer and step: its ops run in order, so nothing is
overwritten before it is read.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from conjugate.compiler.packed import pack_pair
from conjugate.compiler.sampling import SamplingRows
from conjugate.kernels.tile import STATS_CHUNK
from conjugate.models.reference import KVCache, RoundInputs, rope_cos_sin
from conjugate.models.weights import ModelWeights
from conjugate.roles import Model
from conjugate.workload import Workload


class PreparedWeights:
    """Compile-time re-layouts of one model's weights, made once and shared by every plan compiled
    against them: concatenated q/k/v, and norm weights folded into the following GEMM."""

    def __init__(self, weights: ModelWeights):
        self.weights = weights
        self._made: dict[tuple, torch.Tensor | None] = {}

    def _once(self, key: tuple, make):
        if key not in self._made:
            self._made[key] = make()
        return self._made[key]

    @staticmethod
    def _fold(w: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
        return (w.float() * norm.float()[None, :]).to(w.dtype)  # [N, K] * [K]

    def qkv(self, layer: int, folded: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        lw = self.weights.layers[layer]
        w = self._once(("qkv", layer), lambda: torch.cat([lw.wq, lw.wk, lw.wv]))  # [q + 2kv, H]
        bias = self._once(("qkv_bias", layer), lambda: torch.cat([lw.bq, lw.bk, lw.bv]) if lw.bq is not None else None)
        if folded:
            w = self._once(("qkv_folded", layer), lambda: self._fold(self.qkv(layer, False)[0], lw.attn_norm))
        return w, bias

    def gate_up(self, layer: int, folded: bool) -> tuple[torch.Tensor, torch.Tensor]:
        lw = self.weights.layers[layer]
        if not folded:
            return lw.w_gate, lw.w_up
        return (self._once(("gate_folded", layer), lambda: self._fold(lw.w_gate, lw.mlp_norm)),
                self._once(("up_folded", layer), lambda: self._fold(lw.w_up, lw.mlp_norm)))

    def gate_up_stacked(self, layer: int) -> torch.Tensor:
        """Gate and up projections as one [2 * F, H] weight (the conventional baseline's one GEMM)."""
        lw = self.weights.layers[layer]
        return self._once(("gate_up_stacked", layer), lambda: torch.cat([lw.w_gate, lw.w_up]))

    def step_weights(self, table) -> dict[str, torch.Tensor]:
        """The weights as the step kernel's loader streams them (compiler/step/layout.py), per tile shape."""
        from conjugate.compiler.step.layout import tile_weights
        return self._once(("step", table.tiles), lambda: tile_weights(self.weights, table))

    def lm_head(self, folded: bool) -> torch.Tensor:
        w = self.weights
        return self._once(("lm_folded",), lambda: self._fold(w.lm_head, w.final_norm)) if folded else w.lm_head


def kv_capacity(workload: Workload) -> int:
    """Positions each KV cache holds: a sequence of up to `context` tokens plus one round's k + 1."""
    return workload.context + workload.k + 1


def check_lengths(lengths: torch.Tensor, batch: int, longest: int) -> None:
    """Refuse lengths a round cannot serve (the kernels would write past the cache). One small
    host read: callers that must not synchronise check their lengths once, ahead."""
    if tuple(lengths.shape) != (batch,) or lengths.dtype != torch.int64:
        raise ValueError(f"lengths must be int64 [{batch}], got {lengths.dtype} {tuple(lengths.shape)}")
    low, high = int(lengths.min()), int(lengths.max())
    if low < 0 or high > longest:
        raise ValueError(f"sequence lengths {low}..{high} outside 0..{longest}: the KV cache holds {longest} "
                         "tokens before a round")


def padded_rows(rows: int) -> int:
    """Rows of a padded activation buffer: a power of two from 16 up to 128, past that a multiple of
    128, so that the streamed kernel's row blocks (its TMA boxes, wgmma's N: kernels/streamed.py) never
    reach past the buffer (a box partly outside it ran slower: lab/stream_chain, `owned_padded`)."""
    return -(-rows // 128) * 128 if rows > 128 else max(16, 1 << (rows - 1).bit_length())


@dataclass
class ModelBuffers:
    prepared: PreparedWeights
    batch: int
    tokens: int  # new tokens per sequence per pass: 1 (draft decode) or k + 1 (verify)
    steps: int  # passes per round: k (draft) or 1 (target)
    model: Model
    cache: KVCache  # [layers, batch, kv_heads, capacity, head_dim]
    lengths: torch.Tensor  # [batch] int64: each sequence's length before the round, read by the kernels
    tokens_in: torch.Tensor  # draft [Bd] last accepted token; target [Bt * (k + 1)] verify tokens
    tokens_out: torch.Tensor  # draft [Bd, k]; target [Bt * (k + 1)]
    logits: torch.Tensor  # draft [Bd, k, V]; target [Bt * (k + 1), V]
    cos: torch.Tensor  # [S_max, head_dim] fp32
    sin: torch.Tensor
    act: dict[str, torch.Tensor] = field(default_factory=dict)  # x, h, qkv, q, attn_out, mlp rows
    sampling: SamplingRows | None = None  # the draft's per-sequence sampling: its argmax op samples

    @property
    def spec(self):
        return self.prepared.weights.spec

    def padded(self, name: str) -> torch.Tensor:
        """Activation buffer `name` with the rows past `rows` that pad it (`padded_rows`; no result
        depends on them)."""
        view = self.act[name]
        return view if view._base is None else view._base

    @property
    def rows(self) -> int:
        return self.batch * self.tokens

    @property
    def is_draft(self) -> bool:
        return self.model == Model.DRAFT

    @classmethod
    def allocate(cls, prepared: PreparedWeights, batch: int, tokens: int, steps: int, capacity: int,
                 model: Model, sampling: bool = False) -> "ModelBuffers":
        w, is_draft = prepared.weights, model == Model.DRAFT
        spec, dev, rows = w.spec, w.device, batch * tokens
        cache = KVCache.empty(spec, batch, capacity, w.dtype, dev)
        cos, sin = rope_cos_sin(spec, torch.arange(capacity, device=dev))
        token_shape = (batch, steps) if is_draft else (rows,)
        logit_shape = (batch, steps, spec.vocab_size) if is_draft else (rows, spec.vocab_size)

        def f32(*shape):
            return torch.empty(shape, dtype=torch.float32, device=dev)

        def operand(*shape):  # GEMM inputs: the GEMM rounds them to the weights' type anyway
            return torch.empty(shape, dtype=w.dtype, device=dev)

        def padded_operand(rows: int, width: int):  # rows of a buffer padded for the streamed kernel
            return torch.zeros(padded_rows(rows), width, dtype=w.dtype, device=dev)[:rows]

        act = {"x": f32(rows, spec.hidden_size), "h": operand(rows, spec.hidden_size),
               "stats": f32(rows, -(-spec.hidden_size // STATS_CHUNK.value)),  # x's row statistics (gemm.py)
               "qkv": f32(rows, spec.qkv_size), "q": f32(rows, spec.q_size),
               "attn_out": padded_operand(rows, spec.q_size), "mlp": padded_operand(rows, spec.ffn_size)}
        return cls(prepared, batch, tokens, steps, model, cache, torch.zeros(batch, dtype=torch.int64, device=dev),
                   torch.zeros(batch if is_draft else rows, dtype=torch.int64, device=dev),
                   torch.zeros(token_shape, dtype=torch.int64, device=dev), f32(*logit_shape), cos, sin, act,
                   SamplingRows.allocate(batch, dev) if sampling else None)


@dataclass
class RoundBuffers:
    draft: ModelBuffers
    target: ModelBuffers
    _packed: dict = field(default_factory=dict)

    def packed(self, w_t: torch.Tensor, w_d: torch.Tensor, block_n: int):
        """The packed-layout buffer of a target and a draft weight (made once per pair and block)."""
        key = (w_t.data_ptr(), w_d.data_ptr(), tuple(w_t.shape), tuple(w_d.shape), block_n)
        if key not in self._packed:
            self._packed[key] = pack_pair(w_t, w_d, block_n)
        return self._packed[key]

    @classmethod
    def allocate(cls, workload: Workload, draft: PreparedWeights, target: PreparedWeights,
                 sampling: bool = False) -> "RoundBuffers":
        """`sampling`: the draft's buffers hold sampling rows (greedy until set)."""
        k, capacity = workload.k, kv_capacity(workload)
        return cls(ModelBuffers.allocate(draft, workload.draft_batch, 1, k, capacity, Model.DRAFT, sampling),
                   ModelBuffers.allocate(target, workload.target_batch, k + 1, 1, capacity, Model.TARGET))

    def model(self, model: Model) -> ModelBuffers:
        return self.draft if model == Model.DRAFT else self.target

    def load(self, inputs: RoundInputs) -> None:
        """Copy a round's inputs in: tokens, lengths and both caches."""
        for bufs, cache, lengths in ((self.draft, inputs.draft_cache, inputs.draft_lengths),
                                     (self.target, inputs.target_cache, inputs.target_lengths)):
            check_lengths(lengths, bufs.batch, bufs.cache.k.shape[3] - (bufs.steps + bufs.tokens - 1))
            bufs.cache.k.copy_(cache.k)
            bufs.cache.v.copy_(cache.v)
            bufs.lengths.copy_(lengths)
        self.draft.tokens_in.copy_(inputs.draft_last_tokens)
        self.target.tokens_in.copy_(inputs.verify_tokens.reshape(-1))

    def poison(self) -> None:
        """Fill every output with garbage, so a check can tell written from stale."""
        for bufs in (self.draft, self.target):
            bufs.tokens_out.fill_(-1)
            bufs.logits.fill_(float("nan"))
            for t in bufs.act.values():
                t.fill_(float("nan"))
