"""`conjugate generate`: speculative decoding with a plan's compiled round, from the command line."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.progress import Progress as Bar, TextColumn

from conjugate.errors import ConjugateError
from conjugate.serving.decoder import MODES, GenerationError, Progress, SpeculativeDecoder, check_prompts
from conjugate.serving.tokens import Tokenizer


def add_command(sub, out: Console) -> None:
    gen = sub.add_parser("generate", help="greedy speculative decoding with a plan's compiled round")
    gen.add_argument("workload", help="workload TOML: the checkpoint or preset pair, k, the largest batches and the "
                                      "KV capacity (its context)")
    gen.add_argument("--plan", help="plan name (plans/) or JSON file (default: the best plan of --db, else streams)")
    gen.add_argument("--db", help="a search database whose latest run's best plan to use")
    gen.add_argument("--mode", choices=MODES, default="pipelined",
                     help="simple: one group, draft then verify; pipelined (default): two groups alternate, every "
                          "round the co-located round")
    gen.add_argument("--prompt", action="append", default=[], help="a prompt as text (the checkpoint's tokenizer; "
                                                                   "repeatable)")
    gen.add_argument("--prompt-ids", action="append", default=[], type=_ids, metavar="1,2,3",
                     help="a prompt as token ids (repeatable)")
    gen.add_argument("--max-new-tokens", type=int, default=32, help="tokens to generate per prompt (default: 32)")
    gen.add_argument("--json", help="also write the outputs and figures as JSON to this file")
    gen.set_defaults(func=lambda args: cmd_generate(args, out))


def _ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: token ids are integers separated by commas") from None
    return ids


def cmd_generate(args: argparse.Namespace, out: Console) -> None:
    from conjugate.workload import load_workload

    workload = load_workload(args.workload)
    tokenizer = Tokenizer.of(workload, required=bool(args.prompt))  # also decodes the output, where there is one
    prompts = [tokenizer.encode(text) for text in args.prompt] + args.prompt_ids
    if not prompts:
        raise GenerationError("no prompts: give --prompt TEXT or --prompt-ids 1,2,3")
    check_prompts(workload, args.mode, prompts, args.max_new_tokens)
    plan = _plan(args)
    with out.status(f"compiling {plan.name!r} for {workload.name} ({args.mode})"):
        decoder = SpeculativeDecoder.build(workload, plan, args.mode)
    with Bar(TextColumn("{task.description}"), console=out, transient=True) as bar:
        task = bar.add_task("prefill")
        result = decoder.generate(prompts, args.max_new_tokens, lambda p: bar.update(task, description=_line(p)))
    _summary(out, result, tokenizer)
    if args.json:
        Path(args.json).write_text(json.dumps(result.to_dict() | {"workload": workload.name}, indent=1) + "\n")


def _plan(args: argparse.Namespace):
    from conjugate.paths import shipped_plan
    from conjugate.plan import load_plan, validate_plan

    if args.plan:
        path = Path(args.plan)
        return load_plan(path if path.suffix == ".json" or path.exists() else shipped_plan(args.plan))
    if args.db:
        from conjugate.search.commands import open_store
        from conjugate.search.report import best_plan

        with open_store(args.db) as store:
            run = store.latest_run()
            if run is None:
                raise ConjugateError(f"{args.db}: no search run in this database")
            return validate_plan(best_plan(store, run), f"{args.db} run {run.id}")
    return load_plan(shipped_plan("streams"))


def _line(p: Progress) -> str:
    rate = p.tokens / p.seconds if p.seconds else 0.0
    accepted = p.drafts_accepted / p.drafts_proposed if p.drafts_proposed else 0.0
    return f"round {p.rounds}: {p.tokens} tokens, {rate:.1f} tokens/s, acceptance {accepted:.0%}"


def _summary(out: Console, result, tokenizer: Tokenizer | None) -> None:
    for i, generated in enumerate(result.outputs):
        shown = tokenizer.decode(generated) if tokenizer else ",".join(map(str, generated))
        out.print(f"[{i}] {shown}", markup=False)
    out.print(f"{result.tokens} tokens in {result.rounds} rounds ({result.mode}, plan {result.plan!r}): "
              f"{result.tokens_per_s:.1f} tokens/s, {result.round_ms:.2f} ms per round, acceptance "
              f"{result.acceptance:.0%} of {result.drafts_proposed} drafts, prefill {result.prefill_seconds:.1f} s")
