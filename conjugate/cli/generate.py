"""`conjugate generate`: speculative decoding with a plan's compiled round, from the command line."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.progress import Progress as Bar, TextColumn
from rich.text import Text

from conjugate.cli.arguments import WORKLOAD_HELP, integer, workload_name_or_file
from conjugate.cli.console import out
from conjugate.errors import ConjugateError
from conjugate.files import check_output, shown, write_output
from conjugate.serving.decoder import CONVENTIONAL, MODES, GenerationError, SpeculativeDecoder, check_prompts
from conjugate.serving.generation import Progress, generate
from conjugate.serving.requests import RequestError, SamplingParams
from conjugate.serving.stop_ids import checkpoint_stop_ids
from conjugate.serving.tokens import Tokenizer

# flags that set (or override) a workload field: flag -> field(s)
_PAIR_FLAGS = {"draft": ("draft",), "target": ("target",), "k": ("k",), "dtype": ("dtype",),
               "batch": ("draft_batch", "target_batch"), "context": ("context",)}


MAX_NEW_TOKENS = 1 << 20  # past any KV capacity a workload may give (workload.LIMITS)


def add_command(sub) -> None:
    from conjugate.workload import LIMITS

    gen = sub.add_parser("generate", help="greedy speculative decoding with a plan's compiled round")
    gen.add_argument("workload", nargs="?", type=workload_name_or_file,
                     help=f"{WORKLOAD_HELP}: the checkpoint or preset pair, k, the largest batches and the KV "
                          "capacity (its context); or give --draft and --target")
    pair = gen.add_argument_group("the model pair without a workload file (or overriding its fields)")
    pair.add_argument("--draft", help="draft: a checkpoint directory or preset name")
    pair.add_argument("--target", help="target: a checkpoint directory or preset name")
    pair.add_argument("--k", type=integer(*LIMITS["k"]), help="draft tokens proposed per round (default: 4)")
    pair.add_argument("--batch", type=integer(1, LIMITS["draft_batch"][1]),
                      help="sequences per group (default: what the prompts need)")
    pair.add_argument("--context", type=integer(1, LIMITS["context"][1]),
                      help="KV capacity in tokens (default: what the prompts need)")
    pair.add_argument("--dtype", help="bf16 (default), fp16 or fp32")
    gen.add_argument("--plan", help="plan name (plans/) or JSON file, or conventional / conventional-streams for "
                                    "torch's own execution (default: the best plan of --db, else streams)")
    gen.add_argument("--variants", default="layers-sdpa/layers-sdpa", metavar="DRAFT/VERIFY",
                     help="with --plan conventional*: the variant of each model's step (default: "
                          "layers-sdpa/layers-sdpa; the evaluator's fastest per workload is named in its results' "
                          "conventional baseline, `variants`)")
    gen.add_argument("--db", help="a search database whose latest run's best plan to use")
    gen.add_argument("--mode", choices=MODES, default="pipelined",
                     help="simple: one group, draft then verify; pipelined (default): two groups alternate, every "
                          "round the co-located round")
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
    plan, variants = _plan(args)  # a bad plan or variant is refused before any model loads
    params = _sampling(args)
    fields, where = _workload_fields(args)
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
        interpreted = _interpreted(name)
        result = generate(decoder, prompts, args.max_new_tokens, params, stop_ids=stop_ids,
                          on_progress=lambda p: bar.update(task, description=_line(p, interpreted)))
    _summary(out, result, tokenizer)
    if args.json:
        write_output(args.json, json.dumps(result.to_dict() | {"workload": workload.name}, indent=1) + "\n")


def _sampling(args: argparse.Namespace) -> SamplingParams:
    try:
        return SamplingParams(args.temperature, args.top_p, args.top_k, args.seed)
    except RequestError as e:
        raise GenerationError(f"--{e.field.replace('_', '-')}: {e}") from None


def _workload_fields(args: argparse.Namespace) -> tuple[dict, Path]:
    """The workload's fields (from its file, flags overriding) and the path errors name."""
    from conjugate.workload import LIMITS, read_workload_fields

    if args.workload:
        fields, where = read_workload_fields(args.workload), Path(args.workload)
    elif args.draft and args.target:
        fields = {"name": f"{Path(args.draft).name}-{Path(args.target).name}", "k": 4, "dtype": "bf16"}
        where = Path.cwd() / "(command line)"  # checkpoint directories are relative to the current one
    else:
        raise GenerationError("no model pair: give a WORKLOAD file, or --draft and --target")
    for flag, keys in _PAIR_FLAGS.items():
        value = getattr(args, flag)
        if value is None:
            continue
        limits = LIMITS.get(keys[0])  # the numeric flags'
        if limits and not limits[0] <= value <= limits[1]:  # named as the flag: the file may say otherwise
            raise GenerationError(f"--{flag} {value}: must be in [{limits[0]}, {limits[1]}]")
        fields |= {key: _flag_value(flag, value) for key in keys}
    return fields, where


def _flag_value(flag: str, value):
    """A --draft, --target or --dtype value checked here, so that its error names the flag and not the
    workload file; a checkpoint directory is relative to the current directory, not to the file's."""
    from conjugate.models.presets import PRESETS
    from conjugate.models.weights import DTYPES

    if flag == "dtype" and value not in DTYPES:
        raise GenerationError(f"--dtype {shown(value)}: one of {', '.join(DTYPES)}")
    if flag in ("draft", "target") and value not in PRESETS:
        if not Path(value).is_dir():
            raise GenerationError(f"--{flag} {shown(value)}: neither a model preset nor a checkpoint directory "
                                  "(presets: conjugate models)")
        return str(Path(value).resolve())
    return value


def _plan(args: argparse.Namespace):
    """The plan (or conventional backend) to run, and the conventional variants."""
    from conjugate.evaluate.baselines.conventional import Variant
    from conjugate.paths import plan_path, shipped_plan
    from conjugate.plan import load_plan, validate_plan

    try:
        variants = tuple(Variant.parse(v) for v in args.variants.split("/"))
    except ValueError as e:
        raise GenerationError(f"--variants: {e}") from None
    if len(variants) != 2:
        raise GenerationError(f"--variants {args.variants!r}: expected DRAFT/VERIFY, e.g. layers-sdpa/whole-grouped")
    if args.plan in CONVENTIONAL:
        return args.plan, variants
    if args.plan:
        return load_plan(plan_path(args.plan)), variants
    if args.db:
        from conjugate.search.databases import open_store
        from conjugate.search.report import best_plan

        with open_store(args.db) as store:
            run = store.latest_run()
            if run is None:
                raise ConjugateError(f"{args.db}: no search run in this database")
            return validate_plan(best_plan(store, run), f"{args.db} run {run.id}"), variants
    return load_plan(shipped_plan("streams")), variants


def _interpreted(plan: str) -> bool:
    """Whether the rounds run under the Triton interpreter (no GPU): their times measure the
    interpreter, not the kernels. Torch's own execution (conventional) never does."""
    from conjugate.compiler.tile import INTERPRETING

    return INTERPRETING and plan not in CONVENTIONAL


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
    interpreted = _interpreted(result.plan)
    per_round = "" if interpreted else f", {result.round_ms:.3g} ms per round"
    out.print(f"{result.tokens} tokens in {result.rounds} rounds ({result.mode}, plan {result.plan!r}): "
              f"{_speed(result.tokens, result.seconds, interpreted)}{per_round}, acceptance "
              f"{result.acceptance:.0%} of {result.drafts_proposed} drafts, prefill {result.prefill_seconds:.1f} s")
