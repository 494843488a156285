"""Variants of one plan, each with one knob the searches have not measured as it is now, for one
`conjugate bench` call that times them beside the plan in one worker process:

    python lab/experiments/knob_variants.py PLAN.json OUTDIR [--name NAME]
    conjugate bench W.toml --evaluator benchmarks/profiles/h200_quick.toml --plan PLAN.json \\
        --plan OUTDIR/<name>-pdl-draft-end.json ...

Written as OUTDIR/<NAME>-<variant>.json (NAME: the plan's name unless given; the description kept):
    pdl-draft-end           the draft's launches programmatic dependent launches, released at the end
    pdl-draft-start         ... released right after each program's wait
    pdl-draft-end-prefetch  ... released at the end, each program asking L2 for its weights first
    pdl-both-end            both models' launches, released at the end
    draft-persist-layer     each draft layer one persistent launch (grid barriers between its parts, all
                            the programs that fit; the draft's pdl off, which barriers refuse)
    draft-persist-layer-preload  ... its GEMM parts loading their first weight step into registers
                            before the barrier ahead of them (persist.preload)
    pdl-draft-start-preload the draft's launches released right after each program's wait, their GEMM
                            tiles loading their first weights into registers before it (the
                            target's pdl as the plan has it)
    pdl-draft-end-preload   ... released at the end
    pdl-target-start-preload  the target's launches so (the draft's as the plan has it)
    pdl-both-start-preload  both models' launches so
    draft-tickets-layer     each draft layer one ticket-ordered launch (persist order `tickets`: one program
                            per tile, taken in dependency order, each waiting for the part before;
                            tiles ask L2 for their weights before they wait; the draft's pdl off)
    draft-tickets-layer-preload  ... its GEMM tiles loading their first weight step before the wait
    draft-tickets-layer-no-prefetch  ... without the L2 prefetch
    draft-tickets-layer-264 ... on 264 programs (two per SM of an H200) taking tickets in turn
    target-tickets-layer    each target layer one ticket-ordered launch (the target's pdl off)
    draft-tickets-layer-sms-48  draft-tickets-layer with the draft's stream on 48 SMs (its waiting tiles
                            never hold the other 84), the target's on every SM
    target-loops-99         the target's own launches tile loops on 99 programs (three quarters of
                            an H200's 132 SMs), the rest left to the draft's stream
    target-loops-66         ... on 66 programs (half of them): where the draft's stream is the
                            longer one, the target has time to spare
    draft-fusions           every fusion in the draft: with atomic split-K sums its fused norms now
                            read row statistics too (the residual tiles' last splits write them), and
                            mlp_norm+gate_up+down is one launch, reading the o_proj's copy of the rows
    draft-fusions-no-mlp    ... all but gate_up+down: the MLP as two launches, as before the fused MLP
    draft-mlp               the draft's MLP as one launch (gate_up+down) and its argmax fused, no other
    target-sms-120          the target's stream on 120 SMs (a CUDA green context): the draft's
                            kernels have the other 12 of an H200's 132 to themselves
    target-sms-112, -104    ... on 112 or 104 SMs
    draft-attn-early        per-launch `pdl` (overrides): each draft launch holding rope_kv releases
                            the next at its start, and the attention after it asks L2 for its keys
                            and values before its wait, then releases at the end (the rest as the plan has)
    draft-attn-prefetch     ... only the attention's prefetch, released at the end
    draft-oproj-early       the draft's attention releases at its start, the o_proj after it
                            prefetches its weights first (the attention leaves bandwidth to spare)
    target-attn-early       draft-attn-early for the target's launches
    phases-apart            the same launches on one stream, the draft's phase then the target's (no SM
                            limit or priority): each phase's time alone, for `conjugate profile` and
                            lab/experiments/phases.py
(A launch larger than PREFETCH_L2_SHARE of the L2 compiles without its prefetch, compiler/round.py's
launch_pdl, as the round's manifest records: on an H200 the 8B targets' o_proj (34 MB), so no
target-oproj variant, and the attention of a few workloads, e.g. llama-1b-8b-b8's target, 34 MB.)
A variant the plan cannot take (its own value already, a draft persistent with barriers for `pdl`,
a model persistent with barriers for its per-launch `pdl`) is skipped and named. Every file written validates.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from conjugate.errors import ConjugateError  # noqa: E402
from conjugate.plan import load_plan, validate_plan  # noqa: E402
from conjugate.plan.schema import BARRIER_SPANS, FUSIONS  # noqa: E402


def _pdl(draft: dict | None = None, target: dict | None = None) -> dict:
    off = {"trigger": "none", "prefetch": False}
    return {"pdl": {"draft": draft or off, "target": target or off}}


def _early(model: str) -> dict:
    """Per-launch `pdl` for one model ('d' or 't'): the launch holding rope_kv releases the attention at
    its start, which prefetches its keys and values into L2 while that launch runs."""
    return {"overrides": [{"match": f"{model}.*.rope_kv", "pdl": {"trigger": "start"}},
                          {"match": f"{model}.*.attn", "pdl": {"trigger": "end", "prefetch": True}}]}


def _draft_layer(preload: bool) -> dict:
    """Each draft layer one persistent launch on all the programs that fit (no `pdl` for the draft: its
    barriers need every program resident), its GEMM parts preloading their first weights or not."""
    return {"persist": {"draft": {"span": "layer", "programs": 0, "prefetch": True, "preload": preload}},
            "pdl": {"draft": {"trigger": "none", "prefetch": False}}}


def _tickets(model: str, preload: bool = False, prefetch: bool = True, programs: int = 0) -> dict:
    """Each of a model's layers one ticket-ordered launch (no `pdl` for that model: a launch joining parts
    waits for the kernel before once)."""
    return {"persist": {model: {"span": "layer", "order": "tickets", "programs": programs, "prefetch": prefetch,
                                "preload": preload}},
            "pdl": {model: {"trigger": "none", "prefetch": False}}}


END = {"trigger": "end", "prefetch": False}
PRELOAD_START = {"trigger": "start", "prefetch": False, "preload": True}
VARIANTS = {
    "pdl-draft-end": _pdl(END),
    "pdl-draft-start": _pdl({"trigger": "start", "prefetch": False}),
    "pdl-draft-end-prefetch": _pdl({"trigger": "end", "prefetch": True}),
    "pdl-both-end": _pdl(END, END),
    "pdl-draft-start-preload": {"pdl": {"draft": PRELOAD_START}},
    "pdl-draft-end-preload": {"pdl": {"draft": {"trigger": "end", "prefetch": False, "preload": True}}},
    "pdl-target-start-preload": {"pdl": {"target": PRELOAD_START}},
    "pdl-both-start-preload": _pdl(PRELOAD_START, PRELOAD_START),
    "draft-persist-layer": _draft_layer(False),
    "draft-persist-layer-preload": _draft_layer(True),
    "draft-tickets-layer": _tickets("draft"),
    "draft-tickets-layer-preload": _tickets("draft", preload=True),
    "draft-tickets-layer-no-prefetch": _tickets("draft", prefetch=False),
    "draft-tickets-layer-264": _tickets("draft", programs=264),
    "target-tickets-layer": _tickets("target"),
    "draft-tickets-layer-sms-48": _tickets("draft") | {"sm_limit": {"draft": 48, "target": 0}},
    "target-loops-99": {"persist": {"target": {"span": "launch", "programs": 99, "prefetch": True}}},
    "target-loops-66": {"persist": {"target": {"span": "launch", "programs": 66, "prefetch": True}}},
    "draft-fusions": {"fusions": {"draft": list(FUSIONS)}},
    "draft-fusions-no-mlp": {"fusions": {"draft": [f for f in FUSIONS if f != "gate_up+down"]}},
    "draft-mlp": {"fusions": {"draft": ["gate_up+down", "lm_head+argmax"]}},
    **{f"target-sms-{n}": {"sm_limit": {"target": n}} for n in (120, 112, 104)},
    "draft-attn-early": _early("d"),
    "draft-attn-prefetch": {"overrides": [{"match": "d.*.attn", "pdl": {"trigger": "end", "prefetch": True}}]},
    "draft-oproj-early": {"overrides": [{"match": "d.*.attn", "pdl": {"trigger": "start"}},
                                        {"match": "d.*.o_proj", "pdl": {"trigger": "end", "prefetch": True}}]},
    "target-attn-early": _early("t"),
    "phases-apart": {"streams": "one", "priority": "none", "sm_limit": {"draft": 0, "target": 0}},
}


def variants(plan_file: Path, name: str | None = None) -> tuple[dict[str, dict], dict[str, str]]:
    """(variant name -> plan dict named `<name>-<variant>`, skipped variant -> why) of the plan in `plan_file`."""
    base = load_plan(plan_file)
    made, skipped = {}, {}
    for variant, change in VARIANTS.items():
        raw = base.to_dict()
        for key, value in change.items():
            if key == "overrides":
                raw[key] = raw[key] + value
            else:
                raw[key] = raw[key] | value if isinstance(value, dict) else value
        model = {"d": "draft", "t": "target"}.get(change.get("overrides", [{}])[0].get("match", "")[:1])
        if model and raw["persist"][model]["span"] in BARRIER_SPANS:
            skipped[variant] = (f"$.persist.{model}.span {raw['persist'][model]['span']!r}: its launches are "
                                f"joined behind grid barriers, so they take no per-launch pdl")
            continue
        raw["name"] = f"{name or base.name}-{variant}"
        try:
            plan = validate_plan(raw)
        except ConjugateError as e:
            skipped[variant] = str(e).splitlines()[0]
            continue
        if plan.hash == base.hash:
            skipped[variant] = "the plan has it already"
            continue
        made[variant] = plan.to_dict()
    return made, skipped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plan", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--name", help="the variants' name before their suffix (default: the plan's)")
    args = parser.parse_args()
    made, skipped = variants(args.plan, args.name)
    args.out.mkdir(parents=True, exist_ok=True)
    for plan in made.values():
        path = args.out / f"{plan['name']}.json"
        path.write_text(json.dumps(plan, indent=1) + "\n")
        print(path)
    for variant, why in skipped.items():
        print(f"skipped {variant}: {why}", file=sys.stderr)


if __name__ == "__main__":
    try:
        main()
    except ConjugateError as e:  # bad input: one line, no traceback
        raise SystemExit(f"error: {e}") from None
