"""`conjugate generate`: speculative decoding with a plan's compiled round, from the command line."""
from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.progress import Progress as Bar, TextColumn
from rich.text import Text

from conjugate.cli.arguments import integer
from conjugate.cli.console import out
from conjugate.cli.decoding import add_decoding_arguments, chosen_plan, interpreted, workload_fields
from conjugate.files import check_output, write_output
from conjugate.serving.decoder import CONVENTIONAL, GenerationError, SpeculativeDecoder, check_prompts
from conjugate.serving.generation import Progress, generate
from conjugate.serving.requests import RequestError, SamplingParams
from conjugate.serving.stop_ids import checkpoint_stop_ids
from conjugate.serving.tokens import Tokenizer

MAX_NEW_TOKENS = 1 << 20  # past any KV capacity a workload may give (workload.LIMITS)


def add_command(sub) -> None:
    gen = sub.add_parser("generate", help="greedy speculative decoding with a plan's compiled round")
    add_decoding_arguments(gen, sized="what the prompts need")
    gen.add_argument("--prompt", action="append", default=[], help="a prompt as text (the checkpoint's tokenizer; "
                                                                   "repeatable)")
    gen.add_argument("--prompt-ids", action="append", default=[], type=_ids, metavar="1,2,3",
                     help="a prompt as token ids (repeatable)")
    gen.add_argument("--max-new-tokens", type=integer(1, MAX_NEW_TOKENS), default=32,
                     help="tokens to generate per prompt (default: 32)")
    sampling = gen.add_argument_group("sampling (default: greedy, the target's own argmax tokens)")
    sampling.add_argument("--temperature", type=float, default=0.0,
                          help="draw tokens from the target's distribution at this temperature (0: greedy)")
    sampling.add_argument("--top-p", type=float, default=1.0, help="keep the likeliest tokens holding this much mass")
    sampling.add_argument("--top-k", type=int, default=0, help="keep this many likeliest tokens (0: all)")
    sampling.add_argument("--seed", type=int, help="fixes every draw (default: a random one per prompt)")
    gen.add_argument("--ignore-eos", action="store_true",
                     help="go on past the checkpoint's end-of-sequence ids (default: a sequence ends at one)")
    gen.add_argument("--json", help="also write the outputs and figures as JSON to this file")
    gen.set_defaults(func=lambda args: cmd_generate(args, out))


def _ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: token ids are integers separated by commas") from None
    return ids


def cmd_generate(args: argparse.Namespace, out: Console) -> None:
    from conjugate.paths import plan_path
    from conjugate.search.databases import database_file
    from conjugate.workload import workload_from_dict

    plan_file = plan_path(args.plan) if args.plan and args.plan not in CONVENTIONAL else None
    check_output("--json", args.json, [args.workload, plan_file, database_file(args.db)])
    plan, variants = chosen_plan(args)  # a bad plan or variant is refused before any model loads
    params = _sampling(args)
    fields, where = workload_fields(args)
    provisional = {"draft_batch": 1, "target_batch": 1, "context": 0} | fields  # until the prompts are known
    workload = workload_from_dict(provisional, where)
    workload.require_real_weights(where)  # before any model or tokenizer loads
    tokenizer = Tokenizer.of(workload, required=bool(args.prompt))  # also decodes the output, where there is one
    prompts = [tokenizer.encode(text) for text in args.prompt] + args.prompt_ids
    if not prompts:
        raise GenerationError("no prompts: give --prompt TEXT or --prompt-ids 1,2,3")
    if provisional != fields:  # sized for these prompts
        groups = 1 if args.mode == "simple" else 2
        batch = max(-(-len(prompts) // groups), 1)
        need = max(len(p) for p in prompts) - 1 + max(args.max_new_tokens, 1) + workload.k
        workload = workload_from_dict({"draft_batch": batch, "target_batch": batch, "context": need} | fields, where)
    check_prompts(workload, prompts, args.max_new_tokens)
    stop_ids = () if args.ignore_eos else checkpoint_stop_ids(workload)
    name = plan if isinstance(plan, str) else plan.name
    with out.status(Text(f"compiling {name!r} for {workload.name} ({args.mode})")):
        decoder = SpeculativeDecoder.build(workload, plan, args.mode, variants=variants, sampling=not params.greedy)
    with Bar(TextColumn("{task.description}", markup=False), console=out, transient=True) as bar:
        task = bar.add_task("prefill")
        slow = interpreted(name)
        result = generate(decoder, prompts, args.max_new_tokens, params, stop_ids=stop_ids,
                          on_progress=lambda p: bar.update(task, description=_line(p, slow)))
    _summary(out, result, tokenizer)
    if args.json:
        write_output(args.json, json.dumps(result.to_dict() | {"workload": workload.name}, indent=1) + "\n")


def _sampling(args: argparse.Namespace) -> SamplingParams:
    try:
        return SamplingParams(args.temperature, args.top_p, args.top_k, args.seed)
    except RequestError as e:
        raise GenerationError(f"--{e.field.replace('_', '-')}: {e}") from None


def _speed(tokens: int, seconds: float, interpreted: bool) -> str:
    """Tokens a second to three significant figures, or what the time is where it is no speed."""
    if interpreted:
        return f"{seconds:.1f} s under the Triton interpreter (no GPU: not a speed)"
    return f"{tokens / seconds:.3g} tokens/s" if seconds > 0 else "too fast to time"


def _line(p: Progress, interpreted: bool) -> str:
    accepted = p.drafts_accepted / p.drafts_proposed if p.drafts_proposed else 0.0
    return f"round {p.rounds}: {p.tokens} tokens, {_speed(p.tokens, p.seconds, interpreted)}, acceptance {accepted:.0%}"


def _summary(out: Console, result, tokenizer: Tokenizer | None) -> None:
    for i, generated in enumerate(result.outputs):
        shown = tokenizer.decode(generated) if tokenizer else ",".join(map(str, generated))
        out.print(f"[{i}] {shown}", markup=False)
    slow = interpreted(result.plan)
    per_round = "" if slow else f", {result.round_ms:.3g} ms per round"
    out.print(f"{result.tokens} tokens in {result.rounds} rounds ({result.mode}, plan {result.plan!r}): "
              f"{_speed(result.tokens, result.seconds, slow)}{per_round}, acceptance "
              f"{result.acceptance:.0%} of {result.drafts_proposed} drafts, prefill {result.prefill_seconds:.1f} s")
