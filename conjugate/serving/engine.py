"""The serving engine: continuous batching over a decoder's compiled round(s).

    engine = Engine.build(workload, plan)              # or Engine(decoder)
    ticket = engine.submit(Request(prompt, max_tokens=64), on_event)
    engine.start()                                      # rounds on a thread of their own; or
    engine.run_until_idle()                             # on the caller's

Requests wait in a queue; each group's free slots are refilled from it (the new prompts prefilled
together, each into its slot at its own length: prefill.py) at the one point where the group has no
drafts in flight: after its accept step, before its next draft pass. So under load both groups of the pipelined round stay full.
A request ends when it emits a stop id, reaches `max_tokens` or is cancelled; its slot is freed then.

The host never waits for the round it has just queued: after each round the ids it emitted are
copied off the device without blocking and read one round later (on a GPU; at once on the CPU).
Each copy remembers which request held each slot when it was taken, so a slot refilled meanwhile
cannot hand one request's ids to another.
"""
from __future__ import annotations

import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import torch

from conjugate.errors import ConjugateError
from conjugate.serving.decoder import SpeculativeDecoder
from conjugate.serving.group import Group
from conjugate.serving.requests import (Event, Finished, Request, RequestError, SamplingParams, Tokens,
                                       check_request)

OnEvent = Callable[[Event], None]


class EngineClosed(ConjugateError):
    """A request submitted to an engine that has stopped (closed, or failed)."""


@dataclass(eq=False)
class Ticket:
    """One submitted request: where it stands, and how its client hears of it."""
    request: Request
    on_event: OnEvent
    seed: int
    emitted: int = 0
    rounds: int = 0
    done: bool = False
    cancelled: bool = False  # asked by the client; acted on by the engine's thread
    submitted: float = field(default_factory=time.perf_counter)

    def cancel(self) -> None:
        """End the request soon (thread-safe): it finishes as `cancelled` unless it ended already."""
        self.cancelled = True

    def _finish(self, reason: str, **stats) -> None:
        self.done = True
        self.on_event(Finished(reason, len(self.request.prompt), self.emitted, {"rounds": self.rounds} | stats))


@dataclass
class _Snapshot:
    """One accept step's fresh ids, on their way to the host."""
    group: int
    owners: list[Ticket | None]
    host: torch.Tensor  # pinned on a GPU
    event: torch.cuda.Event | None


class Engine:
    def __init__(self, decoder: SpeculativeDecoder, stop_ids: tuple[int, ...] = ()):
        self.decoder, self.workload, self.stop_ids = decoder, decoder.workload, tuple(stop_ids)
        self.k, self.context = decoder.k, decoder.workload.context
        width = self.context  # the most ids a request may emit
        self.groups = [Group.allocate(draft, target, decoder.slots, width, self.k)
                       for draft, target in decoder.group_buffers()]
        self.slots: list[list[Ticket | None]] = [[None] * decoder.slots for _ in self.groups]
        self.rounds = 0
        self._queue: deque[Ticket] = deque()
        self._lock = threading.Condition()
        self._pending: deque[_Snapshot] = deque()
        self._spare: list[tuple[torch.Tensor, torch.cuda.Event | None]] = []  # host buffers of read snapshots
        self._lag = 1 if decoder.device.type == "cuda" else 0
        self._thread: threading.Thread | None = None
        self._closing = False
        self.failure: str | None = None  # why the engine stopped, when a round failed
        self.drafts = [[0, 0] for _ in self.groups]  # per group: drafts proposed, accepted (as last read)
        self.on_read: Callable[[], None] | None = None  # called after each round's output is read
        self.finished = dict.fromkeys(("stop", "length", "cancelled", "error"), 0)  # requests, by reason
        decoder.prepare()
        for group in self.groups:  # the accept step's kernel compiled too: on empty slots it changes nothing
            group.settle()

    @classmethod
    def build(cls, workload, plan, mode: str = "pipelined", device: str | None = None, sampling: bool = True,
              **build) -> "Engine":
        """A decoder compiled for the workload (SpeculativeDecoder.build; able to sample unless
        `sampling` is False), serving the target checkpoint's end-of-sequence ids as stop ids."""
        from conjugate.serving.stop_ids import checkpoint_stop_ids

        decoder = SpeculativeDecoder.build(workload, plan, mode, device, sampling=sampling, **build)
        return cls(decoder, checkpoint_stop_ids(workload))

    # -- requests (any thread) ------------------------------------------------------------------------
    def check(self, request: Request) -> None:
        """Refuse what this engine can never serve, naming the request's field."""
        check_request(request.prompt, request.max_tokens, self.workload.draft.vocab_size, self.k, self.context)
        if not isinstance(request.sampling, SamplingParams):
            raise RequestError("sampling: expected SamplingParams", "sampling")
        if not request.sampling.greedy and not self.decoder.sampling:
            raise RequestError("this engine decodes greedily only (temperature 0)", "temperature")

    def submit(self, request: Request, on_event: OnEvent) -> Ticket:
        """Queue a request; `on_event` hears its Tokens and one Finished, on the engine's thread."""
        self.check(request)
        seed = request.sampling.seed if request.sampling.seed is not None else secrets.randbits(63)

        def heard(event: Event) -> None:
            if isinstance(event, Finished):
                with self._lock:
                    self.finished[event.reason] += 1
            on_event(event)

        ticket = Ticket(request, heard, seed)
        with self._lock:
            if self._closing or self.failure:
                raise EngineClosed(self.failure or "the engine is closed")
            self._queue.append(ticket)
            self._lock.notify()
        return ticket

    @property
    def busy(self) -> int:
        """Requests admitted and not yet finished."""
        return sum(t is not None for slots in self.slots for t in slots)

    @property
    def waiting(self) -> int:
        return len(self._queue)

    @property
    def drafts_proposed(self) -> int:
        return sum(d[0] for d in self.drafts)

    @property
    def drafts_accepted(self) -> int:
        return sum(d[1] for d in self.drafts)

    # -- the loop ----------------------------------------------------------------------------------
    def run_until_idle(self) -> None:
        """Run rounds on this thread until every submitted request has finished."""
        while self.step():
            pass

    def admit_waiting(self) -> None:
        """Fill every group's free slots from the queue now: before the first round, or while idle
        (no group may have drafts in flight)."""
        if self.busy and any(group.proposed for group in self.groups):
            raise RuntimeError("admit_waiting: a group has drafts in flight")
        for g in range(len(self.groups)):
            self._admit(g)

    def start(self) -> None:
        """Run rounds on a thread of the engine's own while there is work; idle otherwise."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="conjugate-engine", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop the thread; every unfinished request ends as cancelled."""
        with self._lock:
            self._closing = True
            self._lock.notify()
        if self._thread is not None:
            self._thread.join()
        self._end_all()

    def _serve(self) -> None:
        try:
            while True:
                with self._lock:
                    while not self._closing and not self._queue and not self.busy and not self._pending:
                        self._lock.wait()
                    if self._closing:
                        return
                self.step()
        except Exception as e:  # a failed round: no request can be served any more; say so to each
            self.failure = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            self._end_all("error", error=self.failure)

    def step(self) -> bool:
        """One round if any request waits or runs (else drain what is in flight); False when idle."""
        self._drop_cancelled()
        if not self.busy and not self._queue:
            while self._pending:
                self._read(self._pending.popleft())
            for group in self.groups:  # nothing in flight matters any more
                group.proposed = False
            return bool(self.busy or self._queue)
        pipelined = len(self.groups) == 2
        drafting = self.groups[self.rounds % 2] if pipelined else self.groups[0]
        self._admit(self.groups.index(drafting))
        verifying = self.groups[1 - self.rounds % 2] if pipelined else drafting
        self.decoder.run_round(self.rounds, drafting, verifying)
        self._copy(self.groups.index(verifying))
        self.rounds += 1
        while len(self._pending) > self._lag:
            self._read(self._pending.popleft())
        return True

    def _admit(self, g: int) -> None:
        """Fill group g's free slots from the queue (it has no drafts in flight now), their
        prompts prefilled together."""
        group, slots = self.groups[g], self.slots[g]
        admitted: dict[int, Ticket] = {}
        with self._lock:
            for row, owner in enumerate(slots):
                if owner is None and self._queue:
                    admitted[row] = self._queue.popleft()
        if not admitted:
            return
        group.admit({row: (list(t.request.prompt), t.request.max_tokens) for row, t in admitted.items()})
        for row, ticket in admitted.items():
            self.decoder.set_sampling(group, row, ticket.request.sampling, ticket.seed)
            slots[row] = ticket

    def _copy(self, g: int) -> None:
        """Start copying group g's fresh ids (and the acceptance counts) to the host."""
        group = self.groups[g]
        if not group.proposed and len(self.groups) == 2:
            return  # its verify pass ran on nothing: it has not drafted yet
        values = torch.cat([group.fresh.flatten(), group.accepted])
        cuda = values.device.type == "cuda"
        host, event = self._spare.pop() if self._spare else (
            torch.empty(values.shape, dtype=values.dtype, pin_memory=cuda), torch.cuda.Event() if cuda else None)
        host.copy_(values, non_blocking=cuda)
        if event is not None:
            event.record()
        self._pending.append(_Snapshot(g, list(self.slots[g]), host, event))

    def _read(self, snap: _Snapshot) -> None:
        """Hand each row's fresh ids to the request that held the row when they were emitted."""
        if snap.event is not None:
            snap.event.synchronize()
        k1 = self.k + 1
        values = snap.host.tolist()
        self._spare.append((snap.host, snap.event))  # pinned buffers are slow to allocate: reused
        self.drafts[snap.group] = values[-2:]
        for row, ticket in enumerate(snap.owners):
            if ticket is None or ticket.done:
                continue
            ticket.rounds += 1
            count = values[row * k1]
            ids = values[row * k1 + 1: row * k1 + 1 + count]
            self._deliver(snap.group, row, ticket, ids)
        if self.on_read:
            self.on_read()

    def _deliver(self, g: int, row: int, ticket: Ticket, ids: list[int]) -> None:
        """Emit ids up to a stop id or max_tokens; end the request there."""
        stops = ticket.request.stop_ids if ticket.request.stop_ids is not None else self.stop_ids
        room = ticket.request.max_tokens - ticket.emitted
        ids = ids[:room]
        end = next((i for i, t in enumerate(ids) if t in stops), None)
        if end is not None:
            ids = ids[:end + 1]
        if ids:
            ticket.emitted += len(ids)
            ticket.on_event(Tokens(tuple(ids)))
        if end is not None or ticket.emitted >= ticket.request.max_tokens:
            self._release(g, row)
            ticket._finish("stop" if end is not None else "length")

    def _release(self, g: int, row: int) -> None:
        if self.slots[g][row] is not None:
            self.groups[g].stop(row)
            self.slots[g][row] = None

    def _drop_cancelled(self) -> None:
        with self._lock:
            gone = [t for t in self._queue if t.cancelled]
            for ticket in gone:
                self._queue.remove(ticket)
        for ticket in gone:
            ticket._finish("cancelled")
        for g, slots in enumerate(self.slots):
            for row, ticket in enumerate(slots):
                if ticket is not None and ticket.cancelled and not ticket.done:
                    self._release(g, row)
                    ticket._finish("cancelled")

    def _end_all(self, reason: str = "cancelled", **stats) -> None:
        with self._lock:
            queued, self._queue = list(self._queue), deque()
        for ticket in queued + [t for slots in self.slots for t in slots if t is not None]:
            if not ticket.done:
                ticket._finish(reason, **stats)
        self.slots = [[None] * len(slots) for slots in self.slots]
