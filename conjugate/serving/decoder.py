"""A plan's compiled round(s) as the decoding loop runs them (the loop itself: engine.py).

    decoder = SpeculativeDecoder.build(workload, plan, mode="pipelined")
    engine = Engine(decoder)        # or generate(decoder, prompts, max_new_tokens): generation.py

Each round the draft proposes k tokens per sequence, the target verifies k + 1, and the accept step
(accept.py's rules, one launch: settle.py) keeps the agreeing prefix plus the target's next token; a
sequence's caches are rolled back by its length alone. Sequences advance in groups (group.py).

- `simple`: one group of sequences; the plan's kernels run as a draft phase, then a verify phase
  (the plan made sequential, each phase in a CUDA graph of its own on a GPU).
- `pipelined`: two groups alternate, so every round is the co-located round the plan optimises:
  the draft of one group beside the verification of the other. Two compiled rounds of the same
  plan share the weights; round 0 drafts group 0 and verifies group 1, round 1 the reverse, so
  each group's draft cache lives in one and its target cache in the other.

In place of a plan, `conventional` runs each model on its own by torch (the conventional baseline's
static steps, evaluate/baselines/conventional.py: simple or pipelined, the phases one after the other) and
`conventional-streams` runs the two groups' phases on two streams (pipelined only).

Between rounds only device-side tensor operations run (the engine reads each round's output one
round late, so nothing waits for the GPU).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable

import torch

from conjugate.compiler.buffers import ModelBuffers, PreparedWeights
from conjugate.compiler.round import CompiledRound, compile_round
from conjugate.errors import ConjugateError
from conjugate.evaluate.baselines.conventional import DEFAULT, ConventionalRound, Variant
from conjugate.plan import Plan, validate_plan
from conjugate.roles import Model
from conjugate.serving.group import Group
from conjugate.serving.requests import RequestError, SamplingParams, check_request
from conjugate.workload import Workload

MODES = ("simple", "pipelined")
CONVENTIONAL = ("conventional", "conventional-streams")  # torch backends usable in place of a plan


class GenerationError(ConjugateError):
    """Prompts or settings a decoder cannot serve."""


class SpeculativeDecoder:
    """A compiled round (two in pipelined mode) over both models' weights, and how a loop runs it."""

    def __init__(self, workload: Workload, plan_name: str, mode: str, rounds: list[CompiledRound | ConventionalRound],
                 sampling: bool = False):
        self.workload, self.plan_name, self.mode, self.rounds = workload, plan_name, mode, rounds
        self.device = rounds[0].device
        self.k = workload.k
        self.slots = min(workload.draft_batch, workload.target_batch)  # sequences per group
        self.sampling = sampling  # draws tokens at a temperature (else greedy only)
        self._steps: list[Callable[[], None]] = []  # a round's steps, each a CUDA graph on a GPU

    @classmethod
    def build(cls, workload: Workload, plan: Plan | str, mode: str = "pipelined", device: str | None = None,
              cache_dir: Path | None = None, variants: tuple[Variant, Variant] = (DEFAULT, DEFAULT),
              sampling: bool = False) -> "SpeculativeDecoder":
        """Load both models' weights and compile the plan's round(s) for this workload. `plan`: a plan,
        or one of CONVENTIONAL, whose draft and verify steps are built in `variants`. `sampling`: the
        rounds can draw tokens at a temperature (they write logits; each sequence's parameters are
        set as it is admitted), else they are greedy only (the lm_head's argmax epilogue allowed)."""
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
            rounds = [ConventionalRound(workload, draft, target, *variants, streams=plan == "conventional-streams",
                                        sampling=sampling) for _ in range(count)]
            return cls(workload, plan, mode, rounds, sampling)
        compiled = phase_plan(plan) if mode == "simple" else plan
        rounds = [compile_round(compiled, workload, draft, target, cache_dir=cache_dir, sampling=sampling)
                  for _ in range(count)]
        return cls(workload, plan.name, mode, rounds, sampling)

    @property
    def capacity(self) -> int:
        """Sequences decoded at once: a group's slots, two groups' when pipelined."""
        return self.slots * len(self.rounds)

    def group_buffers(self) -> list[tuple[ModelBuffers, ModelBuffers]]:
        """Each group's (draft, target) buffers."""
        if self.mode == "simple":
            bufs = self.rounds[0].bufs
            return [(bufs.draft, bufs.target)]
        r0, r1 = self.rounds[0].bufs, self.rounds[1].bufs
        return [(r0.draft, r1.target), (r1.draft, r0.target)]

    # -- the round -----------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Compile every kernel and capture the round's steps (once; later rounds replay them)."""
        if not self._steps:
            self._steps = self._captured_steps()

    def run_round(self, index: int, drafting: Group, verifying: Group) -> None:
        """Round `index` of the loop: in pipelined mode the draft of `drafting` beside the verification
        of `verifying` (the other group), then the latter's accept step; in simple mode (one group)
        the draft phase, then the verify phase and the accept step."""
        self.prepare()
        if self.mode == "simple":
            self._steps[0]()
            drafting.propose()
            self._steps[1]()
            drafting.settle()
            return
        self._steps[index % 2]()
        if verifying.proposed:
            verifying.settle()
        drafting.propose()

    def set_sampling(self, group: Group, row: int, params: SamplingParams, seed: int) -> None:
        """How slot `row` of `group` draws its tokens, its seed fixed (a greedy-only decoder has
        nothing to set)."""
        if self.sampling:
            group.draft.sampling.set(row, replace(params, seed=seed))

    def replay_round(self) -> None:
        """One round's kernels as the loop replays them, without the accept step (for timing it alone)."""
        self.prepare()
        for step in self._steps if self.mode == "simple" else self._steps[:1]:
            step()

    def synchronize(self) -> None:
        """Wait for the device (a GPU's queued work; nothing on the CPU)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

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
        return [_captured(step, self.device) for step in steps]


def check_prompts(workload: Workload, prompts: list[list[int]], max_new_tokens: int) -> None:
    """Refuse what a decoder of this workload cannot serve, before any work (any number of prompts:
    they take the slots in turn)."""
    if not prompts:
        raise GenerationError("no prompts")
    for i, prompt in enumerate(prompts):
        try:
            check_request(prompt, max_new_tokens, workload.draft.vocab_size, workload.k, workload.context)
        except RequestError as e:
            raise GenerationError(f"prompt {i}: {e}") from None


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
