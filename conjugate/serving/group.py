"""A group: the sequences that advance together through a round, as device state.

Each of the group's `size` rows is a slot. A row holds one request from its admission (its prompt
prefilled into both models' caches at the row's own length) until it stops; a row whose produced
count has reached its limit is inactive: the round still computes it (shapes are fixed) but the
accept step emits nothing for it and leaves its lengths alone, so it can be refilled at any point
where the group has no proposals in flight. Nothing here waits for the device.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from conjugate.compiler.buffers import ModelBuffers
from conjugate.models.reference import forward
from conjugate.serving.settle import settle


@dataclass(eq=False)  # a group is itself: compared by identity
class Group:
    draft: ModelBuffers
    target: ModelBuffers
    k: int
    out: torch.Tensor  # [size, width] int64: every row's emitted ids since its admission
    produced: torch.Tensor  # [size] int64: ids emitted per row (a last round may pass the limit by < k)
    limit: torch.Tensor  # [size] int64: a row is active while produced < limit (0: an empty slot)
    accepted: torch.Tensor  # [2] int64: drafts proposed, drafts accepted (active rows, since allocation)
    fresh: torch.Tensor  # [size, k + 1] int64: per row, ids emitted by the last accept step, then those ids
    proposed: bool = False  # drafts were handed to the target: the next verify pass is real

    @classmethod
    def allocate(cls, draft: ModelBuffers, target: ModelBuffers, size: int, width: int, k: int) -> "Group":
        """`size` empty slots; `width`: the most ids a row may emit, plus the k a last round may add."""
        dev = draft.lengths.device
        zeros = lambda *shape: torch.zeros(*shape, dtype=torch.int64, device=dev)  # noqa: E731
        return cls(draft, target, k, zeros(size, width + k + 1), zeros(size), zeros(size), zeros(2),
                   zeros(size, k + 1))

    @property
    def size(self) -> int:
        return self.produced.shape[0]

    # -- the round ------------------------------------------------------------------------------------
    def propose(self) -> None:
        """Hand the draft's proposals to the target: verify [last, d_1..d_k]."""
        rows = self.target.tokens_in.view(self.target.batch, self.k + 1)[:self.size]
        rows[:, 0] = self.draft.tokens_in[:self.size]
        rows[:, 1:] = self.draft.tokens_out[:self.size]
        self.proposed = True

    def settle(self) -> None:
        """Accept what the target agreed with (greedy rows) or by speculative sampling (sampled rows):
        emitted ids appended, lengths and the next round's input advanced, `fresh` written (settle.py,
        one launch)."""
        k, n = self.k, self.size
        verify = self.target.tokens_in.view(self.target.batch, k + 1)[:n]
        target = self.target.tokens_out.view(self.target.batch, k + 1)[:n]
        sampled = {} if self.draft.sampling is None else dict(
            sampling=self.draft.sampling[:n], draft_logits=self.draft.logits[:n],
            target_logits=self.target.logits[:n * (k + 1)])
        settle(verify, target, self.draft.tokens_in[:n], self.draft.lengths[:n], self.target.lengths[:n], self.out,
               self.produced, self.limit, self.accepted, fresh=self.fresh, **sampled)

    # -- slots ----------------------------------------------------------------------------------------
    def admit(self, row: int, prompt: list[int], max_tokens: int) -> None:
        """Start a request in slot `row`: every prompt id but the last into both caches (prefill at
        the row's own length), the last as the next draft step's input. Only while the group has no
        proposals in flight (after its accept step, before its next draft pass)."""
        device = self.produced.device
        tokens = torch.tensor(prompt, dtype=torch.int64)
        if device.type == "cuda":  # from pinned memory: the copy queues behind the round, the host goes on
            tokens = tokens.pin_memory().to(device, non_blocking=True)
        for bufs in (self.draft, self.target):
            if len(prompt) > 1:
                forward(bufs.prepared.weights, tokens[None, :-1], bufs.cache.rows(row), 0)
            bufs.lengths[row] = len(prompt) - 1
        self.draft.tokens_in[row] = tokens[-1]
        self.produced[row] = 0
        self.limit[row] = max_tokens

    def stop(self, row: int) -> None:
        """Make slot `row` inactive from the next accept step on (its request ended or went away)."""
        self.limit[row] = 0
