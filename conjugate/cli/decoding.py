"""What `generate` and `serve` share: the model pair (a workload file, or --draft/--target, flags
overriding its fields), the plan or conventional backend to run, and the decoding mode."""
from __future__ import annotations

import argparse
from pathlib import Path

from conjugate.cli.arguments import WORKLOAD_HELP, integer, workload_name_or_file
from conjugate.errors import ConjugateError
from conjugate.files import shown
from conjugate.serving.decoder import CONVENTIONAL, MODES, GenerationError

# flags that set (or override) a workload field: flag -> field(s)
_PAIR_FLAGS = {"draft": ("draft",), "target": ("target",), "k": ("k",), "dtype": ("dtype",),
               "batch": ("draft_batch", "target_batch"), "context": ("context",)}


def add_decoding_arguments(parser: argparse.ArgumentParser, sized: str) -> None:
    """The pair, plan and mode options; `sized`: what sets the batch and KV capacity by default."""
    from conjugate.workload import LIMITS

    parser.add_argument("workload", nargs="?", type=workload_name_or_file,
                        help=f"{WORKLOAD_HELP}: the checkpoint or preset pair, k, the largest batches and the KV "
                             "capacity (its context); or give --draft and --target")
    pair = parser.add_argument_group("the model pair without a workload file (or overriding its fields)")
    pair.add_argument("--draft", help="draft: a checkpoint directory or preset name")
    pair.add_argument("--target", help="target: a checkpoint directory or preset name")
    pair.add_argument("--k", type=integer(*LIMITS["k"]), help="draft tokens proposed per round (default: 4)")
    pair.add_argument("--batch", type=integer(1, LIMITS["draft_batch"][1]),
                      help=f"sequences per group (default: {sized})")
    pair.add_argument("--context", type=integer(1, LIMITS["context"][1]),
                      help=f"KV capacity in tokens (default: {sized})")
    pair.add_argument("--dtype", help="bf16 (default), fp16 or fp32")
    parser.add_argument("--plan", help="plan name (plans/) or JSON file, or conventional / conventional-streams for "
                                       "torch's own execution (default: the best plan of --db, else streams)")
    parser.add_argument("--variants", default="layers-sdpa/layers-sdpa", metavar="DRAFT/VERIFY",
                        help="with --plan conventional*: the variant of each model's step (default: "
                             "layers-sdpa/layers-sdpa; the evaluator's fastest per workload is named in its results' "
                             "conventional baseline, `variants`)")
    parser.add_argument("--db", help="a search database whose latest run's best plan to use")
    parser.add_argument("--mode", choices=MODES, default="pipelined",
                        help="simple: one group, draft then verify; pipelined (default): two groups alternate, "
                             "every round the co-located round")


def workload_fields(args: argparse.Namespace) -> tuple[dict, Path]:
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


def chosen_plan(args: argparse.Namespace):
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


def interpreted(plan: str) -> bool:
    """Whether the rounds run under the Triton interpreter (no GPU): their times measure the
    interpreter, not the kernels. Torch's own execution (conventional) never does."""
    from conjugate.compiler.tile import INTERPRETING

    return INTERPRETING and plan not in CONVENTIONAL
