"""Greedy speculative decoding with a plan's compiled round: the loop a server embeds.

    decoder = SpeculativeDecoder.build(workload, plan, mode="pipelined")
    result = decoder.generate([[1, 2, 3], [4, 5]], max_new_tokens=32)
    result.outputs   # per prompt: exactly the target model's own greedy continuation

Each prompt is prefilled (every token but its last) into both models' caches, then rounds run:
the draft proposes k tokens, the target verifies k + 1, and the accept step (accept.py's rules, one
launch: settle.py) keeps the agreeing prefix plus the target's next token; a sequence's caches are rolled back by its length alone.

- `simple`: one group of sequences; the plan's kernels run as a draft phase, then a verify phase
  (the plan made sequential, each phase in a CUDA graph of its own on a GPU).
- `pipelined`: two groups alternate, so every round is the co-located round the plan optimises:
  the draft of one group beside the verification of the other. Two compiled rounds of the same
  plan share the weights; round 0 drafts group 0 and verifies group 1, round 1 the reverse, so
  each group's draft cache lives in one and its target cache in the other.

In place of a plan, `conventional` runs each model on its own by torch (the conventional baseline's
static steps, evaluate/baselines/conventional.py: simple or pipelined, the phases one after the other) and
`conventional-streams` runs the two groups' phases on two streams (pipelined only).

Between rounds only device-side tensor operations run: nothing waits for the GPU but the progress
reading, which lags one round behind (the next round is already queued when it waits).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from conjugate.compiler.buffers import ModelBuffers, PreparedWeights
from conjugate.compiler.round import CompiledRound, compile_round
from conjugate.errors import ConjugateError
from conjugate.evaluate.baselines.conventional import DEFAULT, ConventionalRound, Variant
from conjugate.models.reference import forward
from conjugate.plan import Plan, validate_plan
from conjugate.roles import Model
from conjugate.serving.settle import settle, warm_settle
from conjugate.workload import Workload

MODES = ("simple", "pipelined")
CONVENTIONAL = ("conventional", "conventional-streams")  # torch backends usable in place of a plan


class GenerationError(ConjugateError):
    """Prompts or settings a decoder cannot serve."""


@dataclass(frozen=True)
class GenerationResult:
    mode: str
    plan: str
    prompts: list[list[int]]
    outputs: list[list[int]]  # per prompt, max_new_tokens generated ids
    rounds: int
    drafts_proposed: int
    drafts_accepted: int
    seconds: float  # the decoding loop, prefill excluded
    prefill_seconds: float
    round_ms: float  # the loop's time per round

    @property
    def tokens(self) -> int:
        return sum(len(o) for o in self.outputs)

    @property
    def acceptance(self) -> float:
        return self.drafts_accepted / self.drafts_proposed if self.drafts_proposed else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict:
        out = asdict(self)
        out["outputs"] = [{"prompt_ids": p, "generated_ids": o} for p, o in zip(self.prompts, self.outputs)]
        del out["prompts"]
        return out | {"tokens": self.tokens, "acceptance": self.acceptance, "tokens_per_s": self.tokens_per_s}


@dataclass(frozen=True)
class Progress:
    rounds: int
    tokens: int  # emitted so far, over every sequence (up to max_new_tokens each)
    drafts_proposed: int
    drafts_accepted: int
    seconds: float


@dataclass
class _Group:
    """Sequences that advance together: where their draft and target state lives, and what they produced."""
    draft: ModelBuffers
    target: ModelBuffers
    out: torch.Tensor  # [size, max_new + k + 1] emitted ids: room for a last round's k past max_new
    produced: torch.Tensor  # [size] int64
    limit: torch.Tensor  # [size] int64: max_new, or 0 for a padding row
    accepted: torch.Tensor  # [2] int64: drafts proposed, drafts accepted
    proposed: bool = False  # proposals were handed to the target: the next verify pass is real

    @classmethod
    def of(cls, draft: ModelBuffers, target: ModelBuffers, size: int, real: int, max_new: int,
           k: int) -> "_Group":
        """A group of `size` rows, the first `real` of them prompts to serve (the rest padding)."""
        dev = draft.lengths.device
        return cls(draft, target, torch.zeros(size, max_new + k + 1, dtype=torch.int64, device=dev),
                   torch.zeros(size, dtype=torch.int64, device=dev),
                   torch.tensor([max_new] * real + [0] * (size - real), device=dev),
                   torch.zeros(2, dtype=torch.int64, device=dev))

    @property
    def size(self) -> int:
        return self.produced.shape[0]

    def propose(self, k: int) -> None:
        """Hand the draft's proposals to the target: verify [last, d_1..d_k]."""
        rows = self.target.tokens_in.view(self.target.batch, k + 1)[:self.size]
        rows[:, 0] = self.draft.tokens_in[:self.size]
        rows[:, 1:] = self.draft.tokens_out[:self.size]

    def settle(self, k: int) -> None:
        """Accept what the target agreed with; advance lengths and the next round's input token (one
        launch: settle.py, the rules of accept.py)."""
        verify = self.target.tokens_in.view(self.target.batch, k + 1)[:self.size]
        target = self.target.tokens_out.view(self.target.batch, k + 1)[:self.size]
        settle(verify, target, self.draft.tokens_in[:self.size], self.draft.lengths[:self.size],
               self.target.lengths[:self.size], self.out, self.produced, self.limit, self.accepted)


class SpeculativeDecoder:
    """A compiled round (two in pipelined mode) and the decoding loop around it."""

    def __init__(self, workload: Workload, plan_name: str, mode: str, rounds: list[CompiledRound | ConventionalRound]):
        self.workload, self.plan_name, self.mode, self.rounds = workload, plan_name, mode, rounds
        self.device = rounds[0].device
        self.k = workload.k
        self.slots = min(workload.draft_batch, workload.target_batch)  # sequences per group
        self._steps: list[Callable[[], None]] = []  # a round's steps, each a CUDA graph on a GPU

    @classmethod
    def build(cls, workload: Workload, plan: Plan | str, mode: str = "pipelined", device: str | None = None,
              cache_dir: Path | None = None, variants: tuple[Variant, Variant] = (DEFAULT, DEFAULT)
              ) -> "SpeculativeDecoder":
        """Load both models' weights and compile the plan's round(s) for this workload. `plan`: a plan,
        or one of CONVENTIONAL, whose draft and verify steps are built in `variants`."""
        if mode not in MODES:
            raise GenerationError(f"mode {mode!r}: expected one of {', '.join(MODES)}")
        if isinstance(plan, str) and plan not in CONVENTIONAL:
            raise GenerationError(f"backend {plan!r}: expected a plan or one of {', '.join(CONVENTIONAL)}")
        if plan == "conventional-streams" and mode == "simple":
            raise GenerationError("conventional-streams runs two groups' phases at once: it needs --mode pipelined")
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        draft = PreparedWeights(workload.weights(Model.DRAFT, device))
        target = PreparedWeights(workload.weights(Model.TARGET, device))
        count = 1 if mode == "simple" else 2
        if isinstance(plan, str):
            rounds = [ConventionalRound(workload, draft, target, *variants, streams=plan == "conventional-streams")
                      for _ in range(count)]
            return cls(workload, plan, mode, rounds)
        compiled = phase_plan(plan) if mode == "simple" else plan
        rounds = [compile_round(compiled, workload, draft, target, cache_dir=cache_dir) for _ in range(count)]
        return cls(workload, plan.name, mode, rounds)

    @property
    def capacity(self) -> int:
        """Prompts (in total) one generate call serves."""
        return capacity(self.workload, self.mode)

    # -- the loop ------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], max_new_tokens: int,
                 on_progress: Callable[[Progress], None] | None = None) -> GenerationResult:
        self.check(prompts, max_new_tokens)
        started = time.perf_counter()
        groups = self._prefill(prompts, max_new_tokens)
        if not self._steps:  # captured once: later calls and rounds replay the same graphs
            self._steps = self._captured_steps()
        self._sync()
        prefill_s, started = time.perf_counter() - started, time.perf_counter()
        rounds = self._loop(groups, max_new_tokens, on_progress, started)
        self._sync()
        seconds = time.perf_counter() - started
        outputs = [row[:max_new_tokens] for g in groups for row in g.out[:g.size].tolist()][:len(prompts)]
        proposed, accepted = (int(x) for x in sum(g.accepted for g in groups).tolist())
        return GenerationResult(self.mode, self.plan_name, [list(p) for p in prompts], outputs, rounds, proposed,
                                accepted, seconds, prefill_s, seconds / max(rounds, 1) * 1e3)

    def check(self, prompts: list[list[int]], max_new_tokens: int) -> None:
        check_prompts(self.workload, self.mode, prompts, max_new_tokens)

    def _buffers(self) -> list[tuple[ModelBuffers, ModelBuffers]]:
        """Each group's (draft, target) buffers."""
        if self.mode == "simple":
            bufs = self.rounds[0].bufs
            return [(bufs.draft, bufs.target)]
        r0, r1 = self.rounds[0].bufs, self.rounds[1].bufs
        return [(r0.draft, r1.target), (r1.draft, r0.target)]

    def _prefill(self, prompts: list[list[int]], max_new: int) -> list[_Group]:
        """Every prompt's tokens but its last into both caches; the last is the first round's input."""
        groups = []
        for g, (draft, target) in enumerate(self._buffers()):
            chunk = prompts[g * self.slots:(g + 1) * self.slots]
            group = _Group.of(draft, target, self.slots, len(chunk), max_new, self.k)
            for row in range(self.slots):
                self._prefill_row(group, row, chunk[row] if row < len(chunk) else prompts[0])  # padding: a copy
            groups.append(group)
        return groups

    def _prefill_row(self, group: _Group, row: int, prompt: list[int]) -> None:
        tokens = torch.tensor(prompt, dtype=torch.int64, device=self.device)
        for bufs in (group.draft, group.target):
            if len(prompt) > 1:
                forward(bufs.prepared.weights, tokens[None, :-1], bufs.cache.rows(row), 0)
            bufs.lengths[row] = len(prompt) - 1
        group.draft.tokens_in[row] = tokens[-1]

    def replay_round(self) -> None:
        """One round's kernels as the loop replays them, without the accept step (for timing it alone)."""
        for step in self._steps if self.mode == "simple" else self._steps[:1]:
            step()

    def _captured_steps(self) -> list[Callable[[], None]]:
        """The steps of a round, each a CUDA graph on a GPU (kernels compiled first)."""
        if self.mode == "simple":
            rnd = self.rounds[0]
            steps = [rnd.phase(Model.DRAFT), rnd.phase(Model.TARGET)]
        else:
            steps = [rnd.run_eager for rnd in self.rounds]
        if self.device.type == "cuda":
            for rnd in self.rounds:
                rnd.warmup()  # every kernel compiled before anything is captured
        warm_settle(self.k, self.device)  # the accept step's kernel too, before the loop is timed
        return [_captured(step, self.device) for step in steps]

    def _loop(self, groups: list[_Group], max_new: int, on_progress, started: float) -> int:
        counters = [_Counters(groups, self.device) for _ in range(2)]  # one being copied, one being read
        lag = 1 if self.device.type == "cuda" else 0  # a GPU reads the round before, the next one queued
        rounds = 0
        while True:
            self._round(groups, rounds)
            counters[rounds % 2].copy()
            rounds += 1
            if rounds > lag:
                done, progress = counters[(rounds - lag - 1) % 2].read(rounds - lag, started)
                if on_progress:
                    on_progress(progress)
                if done:
                    return rounds
            if rounds > 2 * max_new + 4:  # every two rounds emit a token per active sequence
                raise GenerationError(f"no progress after {rounds} rounds")

    def _round(self, groups: list[_Group], index: int) -> None:
        k = self.k
        if self.mode == "simple":
            group = groups[0]
            self._steps[0]()
            group.propose(k)
            self._steps[1]()
            group.settle(k)
            return
        drafting, verifying = groups[index % 2], groups[1 - index % 2]
        self._steps[index % 2]()
        if verifying.proposed:
            verifying.settle(k)
        drafting.propose(k)
        drafting.proposed = True

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def capacity(workload: Workload, mode: str) -> int:
    """Prompts (in total) one generate call serves: a group's worth, two groups when pipelined."""
    return min(workload.draft_batch, workload.target_batch) * (1 if mode == "simple" else 2)


def check_prompts(workload: Workload, mode: str, prompts: list[list[int]], max_new_tokens: int) -> None:
    """Refuse what a decoder of this workload and mode cannot serve, before any work."""
    if not prompts:
        raise GenerationError("no prompts")
    if len(prompts) > capacity(workload, mode):
        raise GenerationError(f"{len(prompts)} prompts: the {mode} round of {workload.name} serves at most "
                              f"{capacity(workload, mode)} (its batch sizes {workload.draft_batch}/"
                              f"{workload.target_batch})")
    if max_new_tokens < 1:
        raise GenerationError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    vocab = workload.draft.vocab_size
    for i, prompt in enumerate(prompts):
        if not prompt:
            raise GenerationError(f"prompt {i} is empty")
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise GenerationError(f"prompt {i}: token ids must lie in 0..{vocab - 1}")
        need = len(prompt) - 1 + max_new_tokens + workload.k
        if need > workload.context:
            raise GenerationError(f"prompt {i}: {len(prompt)} tokens + {max_new_tokens} new + k = {workload.k} "
                                  f"need a KV capacity of {need}; the workload's context is {workload.context}")


class _Counters:
    """Progress counters copied off the device without waiting; read once the copy has landed."""

    def __init__(self, groups: list[_Group], device: torch.device):
        self.groups, self.cuda = groups, device.type == "cuda"
        self.values = torch.zeros(2 * len(groups) + 2, dtype=torch.int64, pin_memory=self.cuda)
        self.event = torch.cuda.Event() if self.cuda else None

    def copy(self) -> None:
        now = torch.cat([torch.stack([(g.produced >= g.limit).all().long(), g.produced.clamp(max=g.limit).sum()])
                         for g in self.groups] + [sum(g.accepted for g in self.groups)])
        self.values.copy_(now, non_blocking=self.cuda)
        if self.event is not None:
            self.event.record()

    def read(self, rounds: int, started: float) -> tuple[bool, Progress]:
        if self.event is not None:
            self.event.synchronize()
        v = self.values.tolist()
        done = all(v[i] for i in range(0, len(v) - 2, 2))
        tokens = sum(v[i + 1] for i in range(0, len(v) - 2, 2))
        return done, Progress(rounds, tokens, v[-2], v[-1], time.perf_counter() - started)


def phase_plan(plan: Plan) -> Plan:
    """The plan with its kernels and tiles but every launch one model's (a draft phase, then a verify
    phase): what a round whose target verifies its own draft's proposals can run."""
    data = plan.to_dict()
    overrides = [{k: v for k, v in o.items() if k not in ("pair", "with")} for o in data["cross"]["overrides"]]
    data["cross"] |= {"alignment": "sequential", "streams": "one",
                      "overrides": [o for o in overrides if set(o) - {"match"}]}
    for model in Model:  # one stream: no stream of its own to favour or limit
        data[model.value]["stream"] = {"priority": "normal", "sms": 0}
    return validate_plan(data, f"{plan.name} (phases)")


def _captured(step: Callable[[], None], device: torch.device) -> Callable[[], None]:
    """The step replayed from a CUDA graph on a GPU; as it is elsewhere."""
    if device.type != "cuda":
        return step
    from conjugate.evaluate.timing import capture

    return capture(step, device).replay
