"""`conjugate generate` on the GPU: the time per round inside the decoding loop against the same
plan's round benchmarked alone, and tokens per second, in both modes.

    python benchmarks/generate_rounds.py [--workloads llama-1b-8b-b1 llama-1b-8b-b8]
                                         [--plans conventional conventional-streams streams PLAN.json]
                                         [--variants DRAFT/VERIFY] [--new 64] [--json benchmarks/results/generate_h200.json]

A plan is a shipped plan's name, a plan file, or `conventional` / `conventional-streams` (torch's
own execution of each model, its steps in `--variants`; the streams form in pipelined mode only).

For every workload two pairs are run: the workload's own (random weights: the draft rarely agrees
with the target) and its draft model drafting for itself (identical weights: every draft token is
accepted). The loop serves as many prompts as the mode's round holds (seeded random ids of different
lengths, so that every context ends within 32 tokens of the workload's, as in the benchmarked round). Its round time is the loop's wall time over its rounds (prefill
excluded, the accept step between rounds included). The benchmarked round is the one the loop
replays, timed alone from its CUDA graph on the workload's round inputs: the plan's round
(pipelined) or its draft phase plus its verify phase (simple).

Each plan runs in a process of its own (`--together` runs them all in one): once torch's
conventional graphs are captured, every CUDA graph of a process replays slower
(benchmarks/graph_step.py), and a server runs one backend, not the others beside it.
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from common import environment, make_parser, write_json

from conjugate.compiler.round import device_name  # noqa: E402
from conjugate.evaluate.rounds import round_inputs  # noqa: E402
from conjugate.evaluate.timing import time_replays  # noqa: E402
from conjugate.paths import EXAMPLES_DIR, shipped_plan  # noqa: E402
from conjugate.plan import load_plan  # noqa: E402
from conjugate.evaluate.baselines.conventional import Variant  # noqa: E402
from conjugate.serving import SpeculativeDecoder, generate  # noqa: E402
from conjugate.serving.decoder import CONVENTIONAL  # noqa: E402
from conjugate.workload import load_workload  # noqa: E402


def prompts(count: int, vocab: int, longest: int, seed: int = 0) -> list[list[int]]:
    """Seeded random prompts of different lengths, the longest `longest` tokens."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(longest - 32, longest + 1, (count,), generator=gen).tolist()
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]


def self_drafting(workload):
    """The workload with its draft model as the target too: every draft token is accepted."""
    return dataclasses.replace(workload, name=f"{workload.name}-self", target=workload.draft,
                               target_source=workload.draft_source)


def bench_round(decoder: SpeculativeDecoder, replays: int = 100) -> float:
    """The round the loop replays, timed alone on the workload's inputs (median ms)."""
    for rnd in decoder.rounds:
        rnd.load(round_inputs(decoder.workload, rnd.bufs.draft.prepared.weights, rnd.bufs.target.prepared.weights))
    return time_replays(decoder.replay_round, replays, warmup=10).median_ms


def run_case(workload, plan, mode: str, new: int, variants) -> dict:
    decoder = SpeculativeDecoder.build(workload, plan, mode, variants=variants)
    # contexts end near the workload's, as in the benchmarked round
    asked = prompts(decoder.capacity, workload.draft.vocab_size, workload.context - new - workload.k)
    generate(decoder, asked, 4)  # warm: kernels compiled, graphs captured
    result = generate(decoder, asked, new)
    bench_ms = bench_round(decoder)
    row = {"workload": workload.name, "mode": mode, "plan": decoder.plan_name, "round_ms_in_loop": result.round_ms,
           "round_ms_bench": bench_ms, "loop_over_bench": result.round_ms / bench_ms,
           "tokens_per_s": result.tokens_per_s, "acceptance": result.acceptance, "rounds": result.rounds,
           "tokens": result.tokens, "prompts": len(asked), "max_new_tokens": new}
    print(json.dumps(row), flush=True)
    del decoder
    torch.cuda.empty_cache()
    return row


def main() -> None:
    parser = make_parser(__doc__, json_help="write the rows here")
    parser.add_argument("--workloads", nargs="+", default=["llama-1b-8b-b1", "llama-1b-8b-b8"])
    parser.add_argument("--plans", nargs="+", default=["conventional", "conventional-streams", "streams"])
    parser.add_argument("--variants", default="layers-sdpa/layers-sdpa", help="the conventional steps' variants")
    parser.add_argument("--modes", nargs="+", default=["simple", "pipelined"])
    parser.add_argument("--new", type=int, default=64, help="tokens generated per prompt")
    parser.add_argument("--together", action="store_true", help="every plan in this one process")
    args = parser.parse_args()
    variants = tuple(Variant.parse(v) for v in args.variants.split("/"))
    rows = []
    for name in args.workloads:
        base = load_workload(EXAMPLES_DIR / f"{name}.toml")
        if not args.together and len(args.plans) > 1:
            for plan_name in args.plans:
                rows += _apart(name, plan_name, args)
                _write(args, rows)
            continue
        for workload in (base, self_drafting(base)):
            for plan_name in args.plans:
                plan = plan_name if plan_name in CONVENTIONAL else load_plan(
                    Path(plan_name) if plan_name.endswith(".json") else shipped_plan(plan_name))
                for mode in args.modes:
                    if plan == "conventional-streams" and mode == "simple":
                        continue  # one group's phases depend on each other: nothing to overlap
                    rows.append(run_case(workload, plan, mode, args.new, variants))
                    _write(args, rows)  # after every row: a run cut short keeps what it measured
    print(f"{'workload':26} {'mode':9} {'plan':20} {'loop ms':>8} {'bench ms':>8} {'ratio':>6} {'tok/s':>8} {'acc':>5}")
    for r in rows:
        print(f"{r['workload']:26} {r['mode']:9} {r['plan'][:20]:20} {r['round_ms_in_loop']:8.3f} {r['round_ms_bench']:8.3f} "
              f"{r['loop_over_bench']:6.3f} {r['tokens_per_s']:8.1f} {r['acceptance']:5.2f}")


def _write(args, rows: list[dict]) -> None:
    write_json(args.json, {**environment("generate_rounds", gpu=device_name(torch.device("cuda"))),
                           "variants": args.variants, "runs": rows})


def _apart(workload: str, plan: str, args) -> list[dict]:
    """One workload's rows for one plan, from a process of its own."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "rows.json"
        subprocess.run([sys.executable, __file__, "--workloads", workload, "--plans", plan, "--modes", *args.modes,
                        "--variants", args.variants, "--new", str(args.new), "--json", str(out), "--together"],
                       check=True)
        return json.loads(out.read_text())["runs"]


if __name__ == "__main__":
    main()
