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
from conjugate.serving.prefill import prefill
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
    def admit(self, requests: dict[int, tuple[list[int], int]]) -> None:
        """Start requests in slots (row -> (prompt, max_tokens)): every prompt id but the last into
        both caches (prefill.py: the rows batched, each at its own length), the last as the next
        draft step's input. Only while the group has no proposals in flight (after its accept step,
        before its next draft pass)."""
        if not requests:
            return
        device = self.produced.device
        rows = list(requests)
        prompts = {row: prompt[:-1] for row, (prompt, _) in requests.items()}
        for bufs in (self.draft, self.target):
            prefill(bufs.prepared.weights, bufs.cache, prompts)
        lengths = torch.tensor([len(prompts[r]) for r in rows], dtype=torch.int64)
        last = torch.tensor([requests[r][0][-1] for r in rows], dtype=torch.int64)
        limits = torch.tensor([requests[r][1] for r in rows], dtype=torch.int64)
        index = torch.tensor(rows, dtype=torch.int64)
        if device.type == "cuda":  # from pinned memory: the copies queue behind the round, the host goes on
            lengths, last, limits, index = (t.pin_memory().to(device, non_blocking=True)
                                            for t in (lengths, last, limits, index))
        for bufs in (self.draft, self.target):
            bufs.lengths[index] = lengths.to(bufs.lengths.dtype)
        self.draft.tokens_in[index] = last.to(self.draft.tokens_in.dtype)
        self.produced[index] = 0
        self.limit[index] = limits

    def stop(self, row: int) -> None:
        """Make slot `row` inactive from the next accept step on (its request ended or went away)."""
        self.limit[row] = 0
