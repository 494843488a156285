"""Runs a step program's task table with torch ops, programs interleaved in a seeded random order,
the way the persistent kernel would run it: a task starts only when its waits are met, adds its
slice's partial product into fp32 sums, and the tile's last slice runs the epilogue once its
finish_waits are met. Every activation buffer starts as NaN, so a read before its write shows up in
the tokens. A turn in which no program can move is a deadlock (raised, naming the blocked tasks).

The arithmetic is the reference's, reordered as the kernel orders it: the norms' weights folded into
the next weights and their 1/rms applied to the finished dot products, activations stored in the
weights' type between ops, K slices summed in fp32.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from conjugate.models.reference import KVCache, rope_cos_sin
from conjugate.models.weights import ModelWeights
from conjugate.compiler.step.table import StepProgram, Task, chunk_keys


class Deadlock(RuntimeError):
    """No program can move: the table's waits cannot all be met."""


@dataclass
class StepOutputs:
    tokens: torch.Tensor  # [B, steps * T]: each row's argmax (T: the table's tokens a sequence, 1 for decode)
    logits: torch.Tensor  # [B, steps * T, V] fp32
    cache: KVCache


class _Run:
    """The buffers of one simulated launch and the epilogue of every op."""

    def __init__(self, prog: StepProgram, w: ModelWeights, first_tokens, cache: KVCache, lengths):
        spec, B, T = prog.spec, prog.batch, prog.tokens
        self.prog, self.w, self.spec = prog, w, spec
        self.act = w.dtype
        self.lengths = lengths
        self.cache = cache.clone()
        self.first_tokens = first_tokens.reshape(B * T)  # [B] or [B, T] -> one a row
        self.counters: dict[str, int] = {}
        self.arrived: dict[str, int] = {}
        self.bufs: dict[str, torch.Tensor] = {}
        self.sums: dict[tuple, torch.Tensor] = {}
        self.ss: dict[str, torch.Tensor] = {}
        self.tokens = torch.full((B, prog.steps * T), -1, dtype=torch.int64)
        self.logits = torch.full((B, prog.steps * T, spec.vocab_size), float("nan"))
        self.tile_best: dict[int, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}
        self.attn_parts: dict[tuple, list] = {}
        # the norms' weights folded into the weights they precede: x_norm W^T = rstd * (x (W * n)^T)
        self.weights = {}
        for i, lw in enumerate(w.layers):
            wqkv = torch.cat([lw.wq, lw.wk, lw.wv]).float() * lw.attn_norm.float()[None, :]
            wgu = torch.cat([lw.w_gate, lw.w_up]).float() * lw.mlp_norm.float()[None, :]
            bias = torch.cat([lw.bq, lw.bk, lw.bv]).float() if lw.bq is not None else None
            self.weights[i] = {"qkv": wqkv, "qkv_bias": bias, "o_proj": lw.wo.float(), "gate_up": wgu,
                               "down": lw.w_down.float()}
        self.head = w.lm_head.float() * w.final_norm.float()[None, :]

    # --- buffers -----------------------------------------------------------------------------------
    def buf(self, name: str, width: int) -> torch.Tensor:
        if name not in self.bufs:
            self.bufs[name] = torch.full((self.prog.rows, width), float("nan"), dtype=self.act)
        return self.bufs[name]

    def sumsq(self, name: str) -> torch.Tensor:
        return self.ss.setdefault(name, torch.zeros(self.prog.rows))

    def positions(self, step: int) -> torch.Tensor:
        """Each row's position in its sequence at `step`: length + step + t for token t."""
        t = torch.arange(self.prog.tokens, device=self.lengths.device)
        return (self.lengths[:, None] + step + t[None, :]).reshape(-1)

    def rstd(self, name: str) -> torch.Tensor:
        return torch.rsqrt(self.sumsq(name) / self.spec.hidden_size + self.spec.rms_norm_eps)[:, None]

    def bump(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    def met(self, waits) -> bool:
        return all(self.counters.get(name, 0) >= target for name, target in waits)

    # --- what a task reads and multiplies ----------------------------------------------------------
    def source(self, t: Task) -> tuple[str, torch.Tensor]:
        """(the name of the rows' statistics, the activation rows) a GEMM task reads."""
        spec, s, layer = self.spec, t.step, t.layer
        H = spec.hidden_size
        if t.op == "qkv":
            name = f"x/{s}/{layer}"
        elif t.op == "gate_up":
            name = f"xm/{s}/{layer}"
        elif t.op == "head":
            name = f"x/{s}/{spec.num_layers}"
        elif t.op == "o_proj":
            return "", self.buf(f"o/{s}/{layer}", spec.q_size)
        else:
            return "", self.buf(f"h/{s}/{layer}", spec.ffn_size)
        return name, self.buf(name, H)

    def weight(self, t: Task) -> torch.Tensor:
        return self.head if t.op == "head" else self.weights[t.layer][t.op]

    def start(self, t: Task) -> bool:
        """Run a task's slice; True when it is its tile's last, so the epilogue is its to run."""
        if t.op == "embed":
            self.embed(t)
            return False
        if t.op == "attn":
            return self.attend(t)
        _, x = self.source(t)
        w = self.weight(t)
        lo, hi = t.k_range
        width = w.shape[0]
        sums = self.sums.setdefault((t.op, t.step, t.layer), torch.zeros(self.prog.rows, width))
        for a, b in t.out:
            sums[:, a:b] += x[:, lo:hi].float() @ w[a:b, lo:hi].T
        if t.parts is None:
            return True
        self.arrived[t.parts] = self.arrived.get(t.parts, 0) + 1
        return self.arrived[t.parts] == t.splits

    # --- epilogues ----------------------------------------------------------------------------------
    def finish(self, t: Task) -> None:
        if t.op == "attn":
            self.merge_attention(t)
            return
        spec, s, layer = self.spec, t.step, t.layer
        acc = self.sums[(t.op, s, layer)]
        if t.op == "qkv":
            self.qkv_epilogue(t, acc)
        elif t.op in ("o_proj", "down"):
            (a, b), = t.out
            src = f"x/{s}/{layer}" if t.op == "o_proj" else f"xm/{s}/{layer}"
            dst = f"xm/{s}/{layer}" if t.op == "o_proj" else f"x/{s}/{layer + 1}"
            new = (self.buf(src, spec.hidden_size)[:, a:b].float() + acc[:, a:b]).to(self.act)
            self.buf(dst, spec.hidden_size)[:, a:b] = new
            self.sumsq(dst).add_(new.float().square().sum(-1))
        elif t.op == "gate_up":
            (a, b), (c, d) = t.out
            rstd = self.rstd(f"xm/{s}/{layer}")
            g, u = acc[:, a:b] * rstd, acc[:, c:d] * rstd
            self.buf(f"h/{s}/{layer}", spec.ffn_size)[:, a:b] = (F.silu(g) * u).to(self.act)
        elif t.op == "head":
            self.head_epilogue(t, acc)
            return  # bumps its own counters
        self.bump(t.done)  # once a tile: a counter past its target would let a waiter in early

    def qkv_epilogue(self, t: Task, acc: torch.Tensor) -> None:
        spec, s, layer, D = self.spec, t.step, t.layer, self.spec.head_dim
        Q, KV = spec.q_size, spec.kv_size
        lw = self.w.layers[layer]
        out = acc * self.rstd(f"x/{s}/{layer}")
        bias = self.weights[layer]["qkv_bias"]
        positions = self.positions(s)
        cos, sin = rope_cos_sin(spec, positions)  # [rows, D]
        heads = sorted({(a // D) * D for a, _ in t.out})  # first column of each head in the tile
        for base in heads:
            v = out[:, base:base + D] + (bias[base:base + D] if bias is not None else 0.0)
            seg = "q" if base < Q else ("k" if base < Q + KV else "v")
            if seg != "v":
                if spec.qk_norm:
                    norm = lw.q_norm if seg == "q" else lw.k_norm
                    v = v * torch.rsqrt(v.square().mean(-1, keepdim=True) + spec.rms_norm_eps) * norm.float()
                v = v * cos + torch.cat([-v[:, D // 2:], v[:, :D // 2]], -1) * sin
            if seg == "q":
                self.buf(f"q/{s}/{layer}", Q)[:, base:base + D] = v.to(self.act)
                continue
            head = (base - Q - (0 if seg == "k" else KV)) // D
            cache = self.cache.k if seg == "k" else self.cache.v
            for r in range(self.prog.rows):
                cache[layer, r // self.prog.tokens, head, int(positions[r])] = v[r].to(cache.dtype)

    def head_epilogue(self, t: Task, acc: torch.Tensor) -> None:
        (a, b), = t.out
        s = t.step
        B, T = self.prog.batch, self.prog.tokens
        logits = acc[:, a:b] * self.rstd(f"x/{s}/{self.spec.num_layers}")
        self.logits[:, s * T:(s + 1) * T, a:b] = logits.view(B, T, -1)
        best, where = logits.max(-1)  # first index of the maximum: torch.argmax's rule
        self.tile_best.setdefault(s, {})[t.tile] = (best, where + a)
        self.bump(t.done)
        n_tiles = len({x.tile for x in self.prog.tasks if x.op == "head" and x.step == s})
        if self.counters[t.done] == n_tiles:  # the last tile in reduces every tile's best to the tokens
            tiles = [self.tile_best[s][i] for i in range(n_tiles)]  # in column order: ties go to the first
            vals = torch.stack([v for v, _ in tiles], -1)
            idx = torch.stack([i for _, i in tiles], -1)
            self.tokens[:, s * T:(s + 1) * T] = idx.gather(-1, vals.argmax(-1, keepdim=True)).view(B, T)
            self.bump(f"token/{s}")

    def embed(self, t: Task) -> None:
        s = t.step
        tokens = self.first_tokens if s == 0 else self.tokens[:, s - 1]  # a decode step's (T = 1) previous
        (a, b), = t.out
        name = f"x/{s}/0"
        rows = self.w.embed[tokens, a:b].to(self.act)
        self.buf(name, self.spec.hidden_size)[:, a:b] = rows
        self.sumsq(name).add_(rows.float().square().sum(-1))
        self.bump(t.done)

    def attend(self, t: Task) -> bool:
        """One key chunk of one (sequence, KV head): its partial (m, l, unnormalised acc) for each of its
        T tokens' query heads, token t seeing keys up to its own position; True when it is the pair's
        last chunk in, whose epilogue merges them."""
        spec, s, layer, D, T = self.spec, t.step, t.layer, self.spec.head_dim, self.prog.tokens
        b, g = divmod(t.tile, spec.num_kv_heads)
        group = spec.num_heads // spec.num_kv_heads
        n = int(self.lengths[b]) + s + T
        lo, hi = chunk_keys(n, t.k_range[0], t.k_range[1], self.prog.tiles.k)
        cols = slice(g * group * D, (g + 1) * group * D)
        q = self.buf(f"q/{s}/{layer}", spec.q_size)[b * T:(b + 1) * T, cols].float().reshape(T * group, D)
        keys = self.cache.k[layer, b, g, lo:hi].float()
        values = self.cache.v[layer, b, g, lo:hi].float()
        last = (n - T + torch.arange(T)).repeat_interleave(group)  # each query row's own position
        visible = torch.arange(lo, hi)[None, :] <= last[:, None]
        scores = ((q @ keys.T) / math.sqrt(D)).masked_fill(~visible, float("-inf"))  # [T * group, hi - lo]
        m = scores.amax(-1) if hi > lo else torch.full((T * group,), float("-inf"))
        p = torch.where(visible, (scores - m[:, None]).exp(), 0.0) if hi > lo else scores
        self.attn_parts.setdefault((s, layer, t.tile), []).append((m, p.sum(-1), p @ values))
        if t.parts is None:
            return True
        self.arrived[t.parts] = self.arrived.get(t.parts, 0) + 1
        return self.arrived[t.parts] == t.splits

    def merge_attention(self, t: Task) -> None:
        spec, s, layer, D, T = self.spec, t.step, t.layer, self.spec.head_dim, self.prog.tokens
        b, g = divmod(t.tile, spec.num_kv_heads)
        group = spec.num_heads // spec.num_kv_heads
        parts = self.attn_parts[(s, layer, t.tile)]
        top = torch.stack([m for m, _, _ in parts]).amax(0)
        scale = [torch.where(m > float("-inf"), (m - top).exp(), 0.0) for m, _, _ in parts]
        l = sum(w * l for w, (_, l, _) in zip(scale, parts))
        o = sum(w[:, None] * acc for w, (_, _, acc) in zip(scale, parts)) / l[:, None]
        out = self.buf(f"o/{s}/{layer}", spec.q_size)
        out[b * T:(b + 1) * T, g * group * D:(g + 1) * group * D] = o.reshape(T, group * D).to(self.act)
        self.bump(t.done)


def simulate(prog: StepProgram, w: ModelWeights, first_tokens: torch.Tensor, cache: KVCache, lengths: torch.Tensor,
             seed: int = 0) -> StepOutputs:
    """The table run to the end (Deadlock if it cannot be); the input cache is left untouched.
    first_tokens: [B] each sequence's last token (decode steps), or [B, T] the tokens a verify pass
    reads."""
    if first_tokens.numel() != prog.rows:
        raise ValueError(f"{tuple(first_tokens.shape)} first tokens for a table of {prog.batch} sequences x "
                         f"{prog.tokens} tokens")
    run = _Run(prog, w, first_tokens, cache, lengths)
    queues = [prog.of_program(p) for p in range(prog.programs)]
    position = [0] * prog.programs
    finishing = [False] * prog.programs  # the program's current task is its tile's last: epilogue pending
    rng = random.Random(seed)
    while True:
        ready = []
        for p, queue in enumerate(queues):
            if position[p] == len(queue):
                continue
            t = queue[position[p]]
            if run.met(t.finish_waits if finishing[p] else t.waits):
                ready.append(p)
        if not ready:
            blocked = [queues[p][position[p]] for p in range(prog.programs) if position[p] < len(queues[p])]
            if not blocked:
                break
            t = blocked[0]
            pending = t.finish_waits if finishing[t.program] else t.waits
            raise Deadlock(f"{len(blocked)} programs blocked, e.g. task {t.index} ({t.op}, step {t.step}, "
                           f"layer {t.layer}, tile {t.tile}) waiting on "
                           f"{[w for w in pending if run.counters.get(w[0], 0) < w[1]]}")
        p = rng.choice(ready)
        t = queues[p][position[p]]
        if finishing[p]:
            run.finish(t)
            finishing[p] = False
            position[p] += 1
        elif run.start(t):
            finishing[p] = True
        else:
            position[p] += 1
    return StepOutputs(run.tokens, run.logits, run.cache)
