"""The baselines every plan is compared with, measured on the GPU in the evaluating process:

- `conventional`: each model run on its own by torch (conventional.py), each phase captured in a
  CUDA graph, the draft phase then the verify phase. Each phase runs the fastest correct of the
  profile's variants (`[timing] conventional`): every variant is built, checked and its phases timed
  alone once per workload and device; the choice is kept on disk beside the compiled kernels, so
  later processes build only the chosen one;
- `streams`: a draft phase graph and a verify phase graph replayed concurrently on two streams: the
  pair of correct variants fastest together, chosen with the phases (a variant that fills the GPU
  alone can overlap worse than one that leaves it room);
- `sequential`: this project's kernels, one model after the other (plans/sequential.json).

With `[timing] baselines_apart`, `conventional` and `streams` are measured in a process of their own
(apart.py: their CUDA graphs would slow every graph of this process).

Each is checked against the reference before it is timed. The evaluation session keeps them for
its workload; a caller asks for them again with `refresh_baselines`.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import torch

from conjugate.compiler.round import compile_round, default_cache_dir, device_name
from conjugate.errors import ConjugateError
from conjugate.evaluate.baselines.apart import measure_apart
from conjugate.evaluate.baselines import conventional, split_attention
from conjugate.evaluate.baselines.conventional import ConventionalRound, Variant, on_two_streams
from conjugate.evaluate.correctness import CheckReport
from conjugate.evaluate.evaluators import EvaluatorProfile, TimingSettings
from conjugate.evaluate.result import CARRIABLE_BASELINES, Baseline
from conjugate.evaluate.rounds import checked_run
from conjugate.evaluate.session import RoundSetup
from conjugate.evaluate.baselines.split_attention import adopt_cuts, kept_cuts
from conjugate.evaluate.timing import median_known_within, time_round
from conjugate.files import write_atomic
from conjugate.paths import shipped_plan
from conjugate.plan import load_plan
from conjugate.roles import Model
from conjugate.workload import Workload

PHASES = {Model.DRAFT: "draft", Model.TARGET: "verify"}


def carried_baselines(carried: dict, device: str, workload: Workload, wanted: tuple[str, ...]) -> dict[str, Baseline]:
    """The baselines an earlier process of the same search run measured, to take instead of building
    and timing them again: `carried` is {"device", "workload" (its dict), "from", "baselines": {name:
    Baseline as a dict}}; only `conventional` and `streams`, only measured correct, only for this
    workload on a GPU of the same name. Each keeps where it was first measured."""
    same = (json.dumps(carried.get("workload"), sort_keys=True, default=str)
            == json.dumps(workload.to_dict(), sort_keys=True, default=str))
    if carried.get("device") != device or not same:
        return {}
    out = {}
    for name in CARRIABLE_BASELINES:
        data = carried.get("baselines", {}).get(name)
        if name in wanted and isinstance(data, dict) and data.get("status") == "ok" and not data.get("modeled"):
            out[name] = replace(Baseline.from_dict(data),
                                carried=data.get("carried") or str(carried.get("from", "an earlier process")))
    return out


_STATE_GRAPHS: list = []  # the graph enter_torch_graph_state captured, kept for the life of the process


def enter_torch_graph_state(device: torch.device) -> None:
    """Leave this process as building the torch.compile baselines would: once a CUDA graph holding
    torch's `where` (or its softmax, SDPA, cumprod, index_put) has been captured, every graph of the
    process replays about 0.2 us a launch slower, for good (benchmarks/README.md, `steadiness.py`).
    A process that carries those baselines instead of building them captures such a graph, so its
    plans are timed nearer the state its baselines were measured in: the trigger `graph_step.py`
    measured, as it measured it (a round-shaped mask, the op run once before its capture, on a stream
    of its own). An earlier version (a 256-element mask captured cold) did not suffice: on the H200
    `sequential` still timed 1.5-3.2% faster in such processes than in those that built the
    baselines (benchmarks/README.md, `floor.py`). Once per process."""
    if _STATE_GRAPHS or device.type != "cuda":
        return
    mask = torch.ones(4, 1, 5, 1029, dtype=torch.bool, device=device)
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        torch.where(mask, 0.0, float("-inf"))
    with torch.cuda.graph(graph, stream=side):
        torch.where(mask, 0.0, float("-inf"))
    torch.cuda.current_stream(device).wait_stream(side)
    graph.replay()
    torch.cuda.synchronize(device)
    _STATE_GRAPHS.append(graph)


def measure_baselines(setup: RoundSetup, profile: EvaluatorProfile, cache_dir: Path | None) -> dict[str, Baseline]:
    """name -> Baseline for the profile's baselines (`[timing] baselines`), each checked, then timed."""
    wanted, out = profile.timing.baselines, {}
    if {"conventional", "streams"} & set(wanted) and profile.timing.baselines_apart:
        out |= measure_apart(setup.workload, profile, cache_dir)
    elif {"conventional", "streams"} & set(wanted):
        out |= measure_conventional(setup, profile.timing, cache_dir)
        torch.cuda.empty_cache()  # the baseline's compiled models and graphs are gone with it
    if "sequential" in wanted:
        out["sequential"] = _sequential(setup, profile.timing, cache_dir)
        torch.cuda.empty_cache()
    return out


def _timed(run, load_fresh, check: CheckReport, timing: TimingSettings, **extra) -> Baseline:
    if not check.ok:
        return Baseline("incorrect", error="; ".join(check.problems[:5]), **extra)
    measured = time_round(run, load_fresh, timing.replays, timing.warmup)
    return Baseline("ok", measured.median_ms, measured.p20_ms, measured.p80_ms, **extra)


@dataclass(frozen=True)
class VariantTrial:
    """One conventional variant built for both phases: correct or not, and each phase's graph timed alone."""
    variant: str
    correct: bool
    phase_ms: dict[str, float]  # "draft"/"verify" -> median ms (empty when incorrect)
    problem: str = ""
    built: bool = True  # False: torch could not build it for these shapes (problem says why)


class NoCorrectVariant(ConjugateError):
    """No conventional variant computed the reference round; says what each one did."""

    def __init__(self, trials: list[VariantTrial]):
        self.status = "incorrect" if any(t.built for t in trials) else "error"
        super().__init__("no conventional variant computed the reference round: "
                         + "; ".join(f"{t.variant}: {t.problem}" for t in trials))


def try_variant(setup: RoundSetup, variant: Variant, timing: TimingSettings,
                keep: dict[str, ConventionalRound] | None = None) -> VariantTrial:
    """A variant that torch cannot build for these shapes (a compile error) is a failed trial, not
    a failed evaluation: the other variants still compete. Running out of GPU memory or a CUDA
    error is not the variant's fault, so it ends the evaluation rather than rule the variant out.
    With `keep`, a correct variant's round (captured, timing inputs loaded) is kept there by name."""
    try:
        rnd = ConventionalRound(setup.workload, *setup.weights, variant, variant)
        rnd.capture()
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as error:  # torch.compile raises many kinds; the trial records which
        text = " ".join(str(error).split())
        if "CUDA error" in text:
            raise
        return VariantTrial(variant.name, False, {}, f"not built: {type(error).__name__}: {text[:300]}", built=False)
    check = _checked(rnd, setup)
    if not check.ok:
        return VariantTrial(variant.name, False, {}, "; ".join(check.problems[:3]))
    rnd.load(setup.timing_inputs)
    phase_ms = _phase_ms(rnd, timing)
    if keep is not None:
        keep[variant.name] = rnd
    return VariantTrial(variant.name, True, phase_ms)


def choose_variants(trials: list[VariantTrial]) -> dict[str, str] | None:
    """Per phase the fastest correct variant; None when no variant was correct."""
    correct = [t for t in trials if t.correct]
    if not correct:
        return None
    return {phase: min(correct, key=lambda t: t.phase_ms[phase]).variant for phase in PHASES.values()}


# Per phase, the fastest variants alone whose rounds stay alive to be paired on two streams. Three:
# on llama-1b-8b-b1 (H200) the fastest pair took the third-fastest verify variant alone
# (benchmarks/results/conventional_variants_h200.json, runs 12 and 22).
PAIR_CANDIDATES = 3


def pair_candidates(trials: list[VariantTrial]) -> set[str]:
    """The correct variants among the PAIR_CANDIDATES fastest alone in either phase."""
    correct = [t for t in trials if t.correct]
    return {t.variant for phase in PHASES.values()
            for t in sorted(correct, key=lambda t: t.phase_ms[phase])[:PAIR_CANDIDATES]}


def pair_on_two_streams(draft: ConventionalRound, verify: ConventionalRound, timing: TimingSettings) -> float:
    """Median ms of one round's draft phase graph and another's verify phase graph on two streams."""
    run = partial(on_two_streams, draft.device, draft.graphs[Model.DRAFT].replay, verify.graphs[Model.TARGET].replay)
    enough = median_known_within(timing.replays_within_pct) if timing.replays_within_pct > 0 else None
    return time_round(run, lambda: None, timing.replays, timing.warmup, enough).median_ms


def choose_streams_pair(rounds: dict[str, ConventionalRound],
                        timing: TimingSettings) -> tuple[dict[str, str], dict[str, float]]:
    """The (draft, verify) variants fastest on two streams, of every pair of the correct `rounds`:
    ({"streams_draft": .., "streams_verify": ..}, {"DRAFT/VERIFY": ms for every pair})."""
    pairs = {(d, v): pair_on_two_streams(rounds[d], rounds[v], timing) for d in rounds for v in rounds}
    draft, verify = min(pairs, key=pairs.get)
    return {"streams_draft": draft, "streams_verify": verify}, {f"{d}/{v}": ms for (d, v), ms in pairs.items()}


def try_all(setup: RoundSetup, timing: TimingSettings, on_trial=None) -> tuple[list[VariantTrial], dict | None,
                                                                                  dict[str, float]]:
    """Every variant of the profile tried; per phase the fastest correct; and, where the profile wants
    `streams`, the pair fastest on two streams among the PAIR_CANDIDATES fastest per phase (the
    other rounds are let go as the trials go). -> (trials, choice or None when none was correct,
    each pair's ms). `on_trial(trial)` is told of each trial as it ends."""
    trials, rounds = [], {}
    for name in timing.conventional:
        trials.append(try_variant(setup, Variant.parse(name), timing, rounds))
        for dropped in set(rounds) - pair_candidates(trials):
            del rounds[dropped]
        torch.cuda.empty_cache()
        if on_trial:
            on_trial(trials[-1])
    chosen = choose_variants(trials)
    if chosen is None:
        return trials, None, {}
    pair, pairs_ms = {"streams_draft": chosen["draft"], "streams_verify": chosen["verify"]}, {}
    if "streams" in timing.baselines:
        pair, pairs_ms = choose_streams_pair(rounds, timing)
    del rounds
    torch.cuda.empty_cache()
    return trials, chosen | pair, pairs_ms


def variants_code() -> str:
    """A digest of the code the variants are built from: a choice made with other code is made again."""
    sources = b"".join(Path(m.__file__).read_bytes() for m in (conventional, split_attention))
    return hashlib.sha256(sources).hexdigest()[:16]


def choice_file(workload: Workload, device: str, timing: TimingSettings, cache_dir: Path | None) -> Path:
    """Where the variant choice for this workload, device (its name), variant list and variants' code
    is kept."""
    body = json.dumps({"workload": workload.to_dict(), "device": device, "torch": torch.__version__,
                       "variants": timing.conventional, "code": variants_code()}, sort_keys=True, default=str)
    return (cache_dir or default_cache_dir()) / "conventional" / f"{hashlib.sha256(body.encode()).hexdigest()[:16]}.json"


CHOICE_KEYS = ("draft", "verify", "streams_draft", "streams_verify")


def keep_choice(path: Path, chosen: dict[str, str], workload: str, trials: list[dict],
                streams_pairs_ms: dict[str, float]) -> None:
    """The choice kept at `path`, with the split cuts timed in this process (a later process adopts them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(chosen | {"workload": workload, "trials": trials, "streams_pairs_ms": streams_pairs_ms,
                                            "split_cuts": kept_cuts()}, indent=1) + "\n")


def chosen_variants(setup: RoundSetup, timing: TimingSettings, cache_dir: Path | None) -> dict[str, str]:
    """The variant each phase runs: read from an earlier choice for this workload and device, else
    chosen now from every variant of the profile (and kept). NoCorrectVariant when none was correct."""
    path = choice_file(setup.workload, device_name(setup.weights[1].weights.device), timing, cache_dir)
    try:
        kept = json.loads(path.read_text())
        chosen = {key: kept[key] for key in CHOICE_KEYS}
        if set(chosen.values()) <= set(timing.conventional):
            adopt_cuts(kept.get("split_cuts", []))
            return chosen
    except (OSError, ValueError, KeyError, TypeError):
        pass  # absent, unreadable, from before the streams pair was chosen or with bad cuts: choose again
    trials, chosen, pairs_ms = try_all(setup, timing)
    if chosen is None:
        raise NoCorrectVariant(trials)
    keep_choice(path, chosen, setup.workload.name, [vars(t) for t in trials], pairs_ms)
    return chosen


def _checked(rnd: ConventionalRound, setup: RoundSetup) -> CheckReport:
    rnd.load(setup.inputs)
    rnd.bufs.poison()
    rnd.run()
    torch.cuda.synchronize()
    return setup.check(rnd.outputs())


def measure_conventional(setup: RoundSetup, timing: TimingSettings, cache_dir: Path | None) -> dict[str, Baseline]:
    try:
        chosen = chosen_variants(setup, timing, cache_dir)
    except NoCorrectVariant as none:
        return {name: Baseline(none.status, error=str(none)) for name in ("conventional", "streams")
                if name in timing.baselines}
    return conventional_baselines(setup, timing, chosen)


def conventional_baselines(setup: RoundSetup, timing: TimingSettings, chosen: dict[str, str]) -> dict[str, Baseline]:
    """`conventional` and `streams` (those the profile wants): each phase in its chosen variant, and
    on two streams the chosen pair (`streams_draft`/`streams_verify`; the phases' own where absent)."""
    if not chosen:
        problem = "no conventional variant computed the reference round (" + ", ".join(timing.conventional) + ")"
        return {name: Baseline("incorrect", error=problem) for name in ("conventional", "streams")
                if name in timing.baselines}
    pairs = {"conventional": (chosen["draft"], chosen["verify"]),
             "streams": (chosen.get("streams_draft", chosen["draft"]), chosen.get("streams_verify", chosen["verify"]))}
    out, built = {}, {}
    for name, pair in pairs.items():
        if name not in timing.baselines:
            continue
        if pair not in built:
            built[pair] = _built_and_checked(setup, timing, *pair)
        rnd, check, phase_ms = built[pair]
        out[name] = _timed(rnd.run_streams if name == "streams" else rnd.run, partial(rnd.load, setup.timing_inputs),
                           check, timing, variants={"draft": pair[0], "verify": pair[1]}, phase_ms=phase_ms)
    return out


def _built_and_checked(setup: RoundSetup, timing: TimingSettings, draft: str, verify: str):
    """A conventional round in these variants, captured and checked: (round, check, phase ms)."""
    rnd = ConventionalRound(setup.workload, *setup.weights, Variant.parse(draft), Variant.parse(verify))
    rnd.capture()  # compiles both models (or finds them compiled), then captures each phase
    check = _checked(rnd, setup)
    rnd.load(setup.timing_inputs)
    return rnd, check, _phase_ms(rnd, timing) if check.ok else {}


def _phase_ms(rnd: ConventionalRound, timing: TimingSettings) -> dict[str, float]:
    """Each phase's CUDA graph timed alone: "draft"/"verify" -> median ms."""
    return {PHASES[m]: time_round(rnd.graphs[m].replay, lambda: None, timing.replays, timing.warmup).median_ms
            for m in Model}


def _sequential(setup: RoundSetup, timing: TimingSettings, cache_dir: Path | None) -> Baseline:
    compiled = compile_round(load_plan(shipped_plan("sequential")), setup.workload, *setup.weights,
                             cache_dir=cache_dir)
    compiled.prepare()
    check = checked_run(compiled, setup.inputs, setup.check, graph=True)
    return _timed(compiled.run, partial(compiled.load, setup.timing_inputs), check, timing)
