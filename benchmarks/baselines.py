"""The conventional baseline's variants per phase, the baselines as the evaluator measures them, and
how steady a measurement is, on the six example workloads.

    python benchmarks/baselines.py [--workloads llama-1b-8b-b8 ...] [--variants whole-flex ...]
                                   [--json benchmarks/results/baselines_h200.json]
    python benchmarks/baselines.py --merge RUN.json [RUN.json ...] [--eval-times EVAL_TIME.json] --json OUT.json
    python benchmarks/baselines.py --resume CUT.json --json OUT.json

`--resume` finishes the workloads a run cut short by its time limit left partial: their trials (and
the pairs on two streams, when they were timed) are kept, as a later evaluation keeps the choice; the
pairs are timed if they were not; then steps 2 and 3.

`--prewarm N` first builds every variant in N processes at once (nothing timed; `--build-only`),
which fills torch's compile caches on disk, so the process that times them builds each from its
caches: on a fresh machine a whole-step variant takes 57-90 s to compile, one at a time.

Per workload, in one process (the evaluator's own setup: seeded random weights, the round checked
on one set of inputs and timed on another):
1. every conventional variant (evaluate/baselines/conventional.py) built for both phases, checked against the
   fp32 reference and each phase's CUDA graph timed alone; per phase the fastest correct one; every
   pair of correct variants timed on two streams, the fastest pair the `streams` baseline's;
2. `conventional` (the chosen variants, draft then verify) and `streams` (both on two streams), as
   the evaluator's baselines; then measured again after other work (the in-process spread), and
   once more in a process of their own on the same GPU, reading the kept choice as a later
   evaluation would (the spread across processes);
3. steadiness: the shipped `streams` plan timed in the sequence an evaluation meets (right after it
   is compiled, again at once, after the GPU idled, as a second compiled copy), with the SM clock
   read after each, to find where the spread between two measurements of one round comes from.
The probe columns are the torch.compile reference measured on this GPU model on 2026-11-30 (each
model's decode step compiled whole with static shapes, each phase in a CUDA graph; draft then
verify, and the two graphs on two streams).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from common import environment, make_parser, positive, require_gpu, write_json

from conjugate.compiler.buffers import PreparedWeights  # noqa: E402
from conjugate.compiler.round import compile_round, device_name  # noqa: E402
from conjugate.evaluate.baselines.measure import (VariantTrial, choice_file, choose_streams_pair, choose_variants,  # noqa: E402
                                          conventional_baselines, keep_choice, pair_candidates, try_all, try_variant)
from conjugate.evaluate.baselines.conventional import ConventionalRound, Variant  # noqa: E402
from conjugate.evaluate.baselines.apart import measure_apart  # noqa: E402
from conjugate.evaluate.measured import MeasuredHarness  # noqa: E402
from conjugate.evaluate.evaluators import load_profile  # noqa: E402
from conjugate.evaluate.rounds import checked_run  # noqa: E402
from conjugate.evaluate.session import EvaluationSession  # noqa: E402
from conjugate.evaluate.baselines.split_attention import chosen_cuts  # noqa: E402
from conjugate.evaluate.timing import time_round  # noqa: E402
from conjugate.paths import EXAMPLES_DIR, shipped_plan  # noqa: E402
from conjugate.plan import load_plan  # noqa: E402
from conjugate.roles import Model  # noqa: E402
from conjugate.workload import load_workload  # noqa: E402

WORKLOADS = ("llama-1b-8b-b1", "llama-1b-8b-b8", "qwen25-05b-7b-b8", "qwen3-06b-8b-b4", "qwen25-15b-14b-b4",
             "llama-1b-3b-b16-ctx4k")
PROBE_MS = {"llama-1b-8b-b8": (11.10, 9.68), "llama-1b-8b-b1": (10.02, 7.97), "qwen25-05b-7b-b8": (10.22, 8.14)}


def sm_clock_mhz() -> dict:
    """This GPU's SM clock, temperature and power as nvidia-smi reads them now ({} if it cannot)."""
    bus = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "pci_bus_id", None)
    try:
        text = subprocess.run(["nvidia-smi", "--query-gpu=pci.bus_id,clocks.sm,temperature.gpu,power.draw,clocks.mem",
                               "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    for line in text.strip().splitlines():
        row = [c.strip() for c in line.split(",")]
        if len(row) == 5 and (bus is None or int(row[0].split(":")[-2], 16) == bus):
            return {"sm_mhz": row[1], "temp_c": row[2], "power_w": row[3], "mem_mhz": row[4]}
    return {}


def timed(label: str, run, load, replays: int, warmup: int) -> dict:
    t = time_round(run, load, replays, warmup)
    return {"when": label, "median_ms": t.median_ms, "p20_ms": t.p20_ms, "p80_ms": t.p80_ms, **sm_clock_mhz()}


def spread_pct(values: list[float]) -> float:
    return (max(values) - min(values)) / min(values) * 100


def steadiness(setup, timing, cache_dir: Path) -> dict:
    """The shipped streams plan measured as an evaluation meets it, and after idling."""
    plan = load_plan(shipped_plan("streams"))
    w = setup.workload
    rows = []
    compiled = compile_round(plan, w, *setup.weights, cache_dir=cache_dir)
    compiled.load(setup.inputs)
    compiled.warmup()
    assert checked_run(compiled, setup.inputs, setup.check).ok
    compiled.prepare()
    load = lambda: compiled.load(setup.timing_inputs)  # noqa: E731
    rows.append(timed("after compile", compiled.run, load, timing.replays, timing.warmup))
    rows.append(timed("at once again", compiled.run, load, timing.replays, timing.warmup))
    time.sleep(5)
    rows.append(timed("after 5 s idle, 20 warm-up replays", compiled.run, load, timing.replays, timing.warmup))
    time.sleep(5)
    rows.append(timed("after 5 s idle, 400 warm-up replays", compiled.run, load, timing.replays, 400))
    second = compile_round(plan, w, *setup.weights, cache_dir=cache_dir)  # new buffers, same kernels
    second.load(setup.inputs)
    second.prepare()
    rows.append(timed("a second compiled copy", second.run, lambda: second.load(setup.timing_inputs),
                      timing.replays, timing.warmup))
    rows.append(timed("the first again", compiled.run, load, timing.replays, timing.warmup))
    # alternating blocks: drift shows up in both alike
    blocks = {"first": [], "second": []}
    for _ in range(8):
        for name, rnd in (("first", compiled), ("second", second)):
            blocks[name].append(time_round(rnd.run, lambda: None, 25, 5).median_ms)
    return {"sequence": rows, "spread_pct": spread_pct([r["median_ms"] for r in rows]),
            "alternating_blocks": blocks,
            "alternating_spread_pct": spread_pct([sorted(v)[len(v) // 2] for v in blocks.values()])}


def kept_trials(partial: dict) -> list[VariantTrial]:
    """A cut-short run's trials of one workload, as try_all made them."""
    return [VariantTrial(**{k: t[k] for k in ("variant", "correct", "phase_ms", "problem", "built")})
            for t in partial["trials"]]


def resumed_choice(setup, timing, partial: dict) -> tuple[list[VariantTrial], dict | None, dict[str, float]]:
    """try_all's answer from a cut-short run's trials; the pairs on two streams timed now if that run
    did not time them (the candidate variants built again)."""
    tried = kept_trials(partial)
    chosen = choose_variants(tried)
    if chosen is None:
        return tried, None, {}
    pairs_ms = partial.get("streams_pairs_ms")
    if not pairs_ms:
        rounds = {}
        for name in sorted(pair_candidates(tried)):
            try_variant(setup, Variant.parse(name), timing, rounds)
        _, pairs_ms = choose_streams_pair(rounds, timing)
        del rounds
        torch.cuda.empty_cache()
    draft, verify = min(pairs_ms, key=pairs_ms.get).split("/")
    return tried, chosen | {"streams_draft": draft, "streams_verify": verify}, pairs_ms


def bench_workload(name: str, profile, cache_dir: Path, save_partial=lambda row: None,
                   resume: dict | None = None) -> dict:
    """The workload's row; `save_partial(row)` is given what is measured so far after each trial (a run
    cut short by its time limit keeps its trials). `resume`: a cut-short run's partial row to finish."""
    w = load_workload(EXAMPLES_DIR / f"{name}.toml")
    session = EvaluationSession()
    harness = MeasuredHarness(profile, cache_dir, session)
    setup = harness.prepare(w)
    timing = profile.timing
    trials, clock = [], [time.perf_counter()]

    def told(trial) -> None:
        trials.append(vars(trial) | {"build_s": time.perf_counter() - clock[0]})
        clock[0] = time.perf_counter()
        print(json.dumps({"workload": name} | trials[-1]), flush=True)
        save_partial({"workload": name, "partial": True, "trials": trials})

    if resume:
        tried, chosen, pairs_ms = resumed_choice(setup, timing, resume)
        trials = resume["trials"]
    else:
        tried, chosen, pairs_ms = try_all(setup, timing, told)
    print(json.dumps({"workload": name, "streams_pairs_ms": pairs_ms}), flush=True)
    save_partial({"workload": name, "partial": True, "trials": trials, "streams_pairs_ms": pairs_ms})
    if chosen is None:
        raise SystemExit(f"{name}: no conventional variant computed the reference round: "
                         + "; ".join(f"{t['variant']}: {t['problem']}" for t in trials))
    keep_choice(choice_file(w, device_name(torch.device("cuda")), timing, cache_dir), chosen, name,
                [vars(t) for t in tried], pairs_ms)  # for the process of their own, below
    first = conventional_baselines(setup, timing, chosen)
    steady = steadiness(setup, timing, cache_dir)
    again = conventional_baselines(setup, timing, chosen)
    conv = [first["conventional"].latency_ms, again["conventional"].latency_ms]
    streams = [first["streams"].latency_ms, again["streams"].latency_ms]
    probe = PROBE_MS.get(name)
    row = {"workload": name, "conventional_ms": conv[0], "conventional_streams_ms": streams[0],
           "variants": {"draft": chosen["draft"], "verify": chosen["verify"]},
           "streams_variants": {"draft": chosen["streams_draft"], "verify": chosen["streams_verify"]},
           "streams_pairs_ms": pairs_ms, "split_chunks": chosen_cuts(),
           "phase_ms": first["conventional"].phase_ms, "conventional_again_ms": conv[1],
           "conventional_streams_again_ms": streams[1],
           "baseline_spread_pct": max(spread_pct(conv), spread_pct(streams)),
           "repeat_spread_pct": steady["spread_pct"], "probe_ms": probe, "trials": trials, "steadiness": steady,
           "checks": {k: b.status for k, b in first.items()}}
    if resume:
        row["resumed"] = "trials" + (" and pairs" if resume.get("streams_pairs_ms") else "") + " from a run cut short"
    del setup, harness, session
    torch.cuda.empty_cache()
    apart = measure_apart(w, profile, cache_dir)
    row["apart_ms"] = {k: b.latency_ms for k, b in apart.items()}
    row["apart_phase_ms"] = {k: b.phase_ms for k, b in apart.items()}
    row["apart_problems"] = {k: b.error for k, b in apart.items() if b.status != "ok"}
    if not row["apart_problems"]:
        row["process_spread_pct"] = max(spread_pct([conv[0], apart["conventional"].latency_ms]),
                                        spread_pct([streams[0], apart["streams"].latency_ms]))
    return row


def cut_short(path: Path, variants: tuple[str, ...]) -> tuple[dict[str, dict], str]:
    """The workloads of a cut-short run's JSON left partial after all their trials (every one of
    `variants` tried: a choice among fewer is not the one try_all makes), by name, and its command."""
    try:
        cut = json.loads(path.read_text())
        partial = {w["workload"]: w for w in cut["workloads"] if w.get("partial") and w.get("trials")}
        command = cut["command"]
        tried = {name: {t["variant"] for t in w["trials"]} for name, w in partial.items()}
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SystemExit(f"--resume {path}: not a baselines.py run's JSON ({type(error).__name__}: {error})")
    if not partial:
        raise SystemExit(f"--resume {path}: no workload there was cut short after its trials")
    for name, names in tried.items():
        if missing := [v for v in variants if v not in names]:
            raise SystemExit(f"--resume {path}: {name} was cut short before trying {', '.join(missing)}: "
                             f"measure it again instead")
    return partial, command


def pair_variants(partial: dict) -> set[str]:
    """The variants a resumed workload builds: the chosen ones and, where its pairs were not timed,
    every pair candidate."""
    tried = kept_trials(partial)
    chosen = choose_variants(tried) or {}
    pairs = partial.get("streams_pairs_ms")
    return set(chosen.values()) | (set(min(pairs, key=pairs.get).split("/")) if pairs else pair_candidates(tried))


def merged(paths: list[Path], eval_times: Path | None = None) -> dict:
    """Several runs' JSON as one (the rows in order; each run's command kept); partial rows left out.
    With `eval_times` (eval_time.py's runs, each with a "stage"), each row gains the median seconds
    per evaluation after and before (`eval_seconds_median`, `eval_seconds_before`)."""
    runs = [read_run(p, ("gpu", "torch", "date", "command", "workloads"), "--merge") for p in paths]
    gpus = {r["gpu"] for r in runs}
    if len(gpus) != 1:
        raise SystemExit(f"--merge: the runs were measured on different GPUs: {sorted(gpus)}")
    rows = [w for r in runs for w in r["workloads"] if not w.get("partial")]
    if eval_times:
        timed = read_run(eval_times, ("gpu", "runs"), "--eval-times")
        if timed.get("gpu") not in gpus:
            raise SystemExit(f"--eval-times {eval_times}: measured on {timed.get('gpu')}, the runs on {gpus.pop()}")
        rows = [row | {"eval_seconds_median": eval_median(timed["runs"], row["workload"], "after"),
                       "eval_seconds_before": eval_median(timed["runs"], row["workload"], "before")} for row in rows]
    return {"gpu": gpus.pop(), "torch": runs[0]["torch"], "date": max(r["date"] for r in runs),
            "commands": [r["command"] for r in runs], "workloads": rows}


def read_run(path: Path, keys: tuple[str, ...], flag: str) -> dict:
    """A results file's JSON object holding `keys`; a one-line exit naming the flag and file otherwise."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise SystemExit(f"{flag} {path}: {type(error).__name__}: {error}")
    if not isinstance(data, dict):
        raise SystemExit(f"{flag} {path}: not a file of this kind (it lacks an object)")
    if missing := [k for k in keys if k not in data]:
        raise SystemExit(f"{flag} {path}: not a file of this kind (it lacks {', '.join(missing)})")
    return data


def eval_median(runs: list[dict], workload: str, stage: str) -> float | None:
    """The median seconds per evaluation over every run of `workload` at `stage`, each run's first
    evaluation left out (it also prepared the workload); None when there is no such run."""
    seconds = [row["wall_s"] for r in runs if r["workload"] == workload and r["stage"] == stage
               for row in r["rows"][1:]]
    return round(statistics.median(seconds), 3) if seconds else None


def print_table(rows: list[dict]) -> None:
    print(f"{'workload':24} {'draft':14} {'verify':14} {'conv':>7} {'streams':>7} {'probe':>13} {'spread%':>7} "
          f"{'process%':>8}")
    for r in rows:
        probe = "/".join(f"{x:.2f}" for x in r["probe_ms"]) if r["probe_ms"] else "-"
        print(f"{r['workload']:24} {r['variants']['draft']:14} {r['variants']['verify']:14} {r['conventional_ms']:7.2f} "
              f"{r['conventional_streams_ms']:7.2f} {probe:>13} {r['repeat_spread_pct']:7.2f} "
              f"{r.get('process_spread_pct', float('nan')):8.2f}")


def build_only(name: str, variants: list[str]) -> None:
    """Build (compile and capture) each variant of workload `name` for both phases, timing nothing:
    what --prewarm runs in each of its processes."""
    w = load_workload(EXAMPLES_DIR / f"{name}.toml")
    device = torch.device("cuda")
    weights = [PreparedWeights(w.weights(model, device)) for model in (Model.DRAFT, Model.TARGET)]
    for variant in variants:
        started = time.perf_counter()
        try:
            ConventionalRound(w, *weights, Variant.parse(variant), Variant.parse(variant)).capture()
            said = f"built in {time.perf_counter() - started:.1f} s"
        except Exception as error:  # the timing process meets it again and records it as the trial's
            said = f"not built: {type(error).__name__}: {' '.join(str(error).split())[:200]}"
        print(json.dumps({"workload": name, "variant": variant, "prewarm": said}), flush=True)
        torch.cuda.empty_cache()


def prewarm_shares(variants: list[str], processes: int) -> list[list[str]]:
    """The variants dealt out to at most `processes` processes, whole-step variants (the slow ones to
    compile) spread first."""
    ordered = sorted(variants, key=lambda v: not v.startswith("whole"))
    shares = [ordered[i::processes] for i in range(max(1, min(processes, len(ordered))))]
    return [share for share in shares if share]


PREWARM_LIMIT_S = 300  # a prewarm that takes longer only warms less: the timing process builds the rest


def prewarm(name: str, variants: list[str], processes: int, run=subprocess.Popen) -> float:
    """Every variant of `name` built in `processes` processes at once; their seconds. A process that
    fails costs only its warm caches: the timing process builds what it left cold."""
    started = time.perf_counter()
    # the builds share the GPU: inductor's autotuning is left to the timing process, not cached from them
    env = os.environ | {"TORCHINDUCTOR_AUTOTUNE_LOCAL_CACHE": "0"}
    workers = [run([sys.executable, __file__, "--build-only", name, "--variants", *share], env=env)
               for share in prewarm_shares(variants, processes)]
    try:
        for worker in workers:
            left = max(1.0, PREWARM_LIMIT_S - (time.perf_counter() - started))
            if worker.wait(timeout=left) != 0:
                print(json.dumps({"workload": name, "prewarm": f"a process exited with {worker.returncode}"}),
                      flush=True)
    except subprocess.TimeoutExpired:
        print(json.dumps({"workload": name, "prewarm": f"stopped after {PREWARM_LIMIT_S} s"}), flush=True)
    finally:  # none outlives the prewarm: the timing process must have the GPU to itself
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    return time.perf_counter() - started


def main() -> None:
    parser = make_parser(__doc__, json_help="write the rows here (after every trial)")
    parser.add_argument("--workloads", nargs="+", help="default: the six examples (with --resume: the cut-short ones)")
    parser.add_argument("--variants", nargs="+", help="conventional variants to try (default: the profile's)")
    parser.add_argument("--merge", nargs="+", type=Path, metavar="RUN.json",
                        help="measure nothing: join these runs' JSON into --json")
    parser.add_argument("--eval-times", type=Path, metavar="EVAL_TIME.json",
                        help="with --merge: each workload's median seconds per evaluation from eval_time.py's runs")
    parser.add_argument("--resume", type=Path, metavar="CUT.json",
                        help="finish the partial workloads of a run cut short (their trials kept)")
    parser.add_argument("--prewarm", type=positive, default=0, metavar="N",
                        help="first build the variants in N processes at once, to fill the compile caches")
    parser.add_argument("--build-only", metavar="WORKLOAD", help=argparse.SUPPRESS)  # a --prewarm process
    args = parser.parse_args()
    if args.merge:
        out = merged(args.merge, args.eval_times)
        write_json(args.json, out)
        print_table(out["workloads"])
        return
    profile = load_profile("h200")
    if args.variants:
        profile = replace(profile, timing=replace(profile.timing, conventional=tuple(args.variants)))
    partial, resumed_from = cut_short(args.resume, profile.timing.conventional) if args.resume else ({}, None)
    if args.resume and args.workloads:
        raise SystemExit("--resume finishes the workloads its file left partial: --workloads does not apply")
    if args.resume and args.json and Path(args.json).resolve() == args.resume.resolve():
        raise SystemExit(f"--json {args.json}: the file --resume reads; write the finished rows elsewhere")
    if args.build_only:
        return build_only(args.build_only, args.variants or list(profile.timing.conventional))
    require_gpu(parser)
    cache_dir = Path(tempfile.mkdtemp(prefix="conjugate-baselines-"))
    out = {**environment("baselines", gpu=device_name(torch.device("cuda"))), "workloads": []}

    def save(rows: list[dict]) -> None:
        write_json(args.json, out | {"workloads": rows})

    if resumed_from:
        out["resumed_from"] = resumed_from
    for name in (list(partial) if args.resume else args.workloads or list(WORKLOADS)):
        if args.prewarm:
            variants = sorted(pair_variants(partial[name]) if name in partial else profile.timing.conventional)
            out.setdefault("prewarm_s", {})[name] = round(prewarm(name, variants, args.prewarm), 1)
        done = list(out["workloads"])
        out["workloads"].append(bench_workload(name, profile, cache_dir, lambda row: save(done + [row]),
                                               partial.get(name)))
        save(out["workloads"])
    print_table(out["workloads"])


if __name__ == "__main__":
    main()
