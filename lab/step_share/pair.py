"""Both phases as persistent step launches side by side: the draft's k steps on a green context of
P SMs and the target's verify pass (lab/verify_step) on the other 132 - P, forked from one stream in
one CUDA graph; beside the two launches one after the other on every SM.

    python lab/step_share/pair.py examples/qwen3-06b-8b-b4.toml examples/llama-1b-8b-b1.toml \
        --draft-sms 40 64 88 --json OUT.json

Every variant is run once and checked before it is timed: the draft's tokens and new cache rows
against draft_phase(), the target's logits, argmax and new cache rows against forward()
(verify_step's check), and neither launch may have spent a wait's spins. The target's stream keeps
every SM (as a plan's `sm_limit` leaves the unlimited model), so its 132 - P programs take the SMs
the draft's P leave; a target program that lands on the draft's SMs first only delays the draft.

Lab code: nothing in `conjugate/` imports it.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "lab" / "verify_step"))

from common import environment, failure  # noqa: E402
from verify import TOL, check_step, token_ok  # noqa: E402

import torch  # noqa: E402

from conjugate.compiler.device import limited_stream  # noqa: E402
from conjugate.compiler.step.launch import StepLaunch  # noqa: E402
from conjugate.compiler.step.layout import tile_weights  # noqa: E402
from conjugate.compiler.step.table import step_table  # noqa: E402
from conjugate.evaluate.timing import capture, copy_bandwidth_gbs, time_replays  # noqa: E402
from conjugate.graph import build_graph  # noqa: E402
from conjugate.models.reference import draft_phase, forward, make_round_inputs  # noqa: E402
from conjugate.roles import Model  # noqa: E402
from conjugate.workload import load_workload  # noqa: E402


class Pair:
    """A draft step launch on `draft_programs` and a verify step launch on `target_programs`, loaded
    with one round's inputs (each on a copy of its cache). `tiled`: both models' weights as the
    loader streams them (tile_weights: the same for any program count)."""

    def __init__(self, wl, tiled: tuple[dict, dict], inputs, draft_programs: int, target_programs: int, sms: int):
        self.wl, self.inputs = wl, inputs
        dt = step_table(wl.draft, wl.draft_batch, wl.k, draft_programs, sms=sms)
        tt = step_table(wl.target, wl.target_batch, 1, target_programs, sms=sms, tokens=wl.k + 1)
        self.draft = StepLaunch(dt, tiled[0], inputs.draft_cache.k._base.clone())
        self.target = StepLaunch(tt, tiled[1], inputs.target_cache.k._base.clone(), logits=True)
        self.draft.tokens_in[:wl.draft_batch].copy_(inputs.draft_last_tokens)
        self.draft.lengths.copy_(inputs.draft_lengths)
        self.target.tokens_in[:tt.rows].copy_(inputs.verify_tokens.reshape(-1))
        self.target.lengths.copy_(inputs.target_lengths)
        self.kv0 = (self.draft.kv.clone(), self.target.kv.clone())

    def reset(self) -> None:
        """The caches as the round found them (a run writes its new rows)."""
        self.draft.kv.copy_(self.kv0[0])
        self.target.kv.copy_(self.kv0[1])


def check_draft(launch: StepLaunch, draft, inputs, steps: int) -> dict:
    """The launch's draft tokens and new cache rows against draft_phase() teacher-forced with those
    tokens (as the evaluator checks a round): a token may differ from the reference's argmax only at a
    near tie, and the cache rows stay within the evaluator's bf16 tolerance."""
    got = launch.tokens[:, :inputs.draft_last_tokens.shape[0]].T.long()
    cache = inputs.draft_cache.clone()
    ref_tokens, ref_logits = draft_phase(draft, inputs.draft_last_tokens, cache, inputs.draft_lengths, steps,
                                         forced=got)
    differ = (got != ref_tokens).nonzero().tolist()
    mismatches = [(b, s) for b, s in differ if not token_ok(int(got[b, s]), ref_logits[b, s])]
    new = torch.stack([torch.arange(int(n), int(n) + steps) for n in inputs.draft_lengths.cpu()])
    rows = lambda kv: torch.stack([kv[:, :, b, :, new[b]] for b in range(len(new))], 2)  # noqa: E731
    a, b = rows(launch.kv).double(), rows(torch.stack([cache.k, cache.v])).double()
    out = {"token_mismatches": len(mismatches), "near_ties": len(differ) - len(mismatches),
           "cache_rel": float((a - b).norm() / b.norm()), "spins_ran_out": int(launch.error.item())}
    out["ok"] = not out["token_mismatches"] and out["cache_rel"] < TOL.rel and not out["spins_ran_out"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="+", type=Path)
    parser.add_argument("--draft-sms", type=int, nargs="+", default=[40, 64, 88])
    parser.add_argument("--replays", type=int, default=100)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    device = torch.device("cuda")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    copy_gbs = copy_bandwidth_gbs(device)
    out = {**environment("pair"), "command": "python " + " ".join(sys.argv), "copy_gbs": copy_gbs, "rows": []}
    for path in args.workloads:
        wl = load_workload(path)
        draft, target = wl.weights(Model.DRAFT, device), wl.weights(Model.TARGET, device)
        inputs = make_round_inputs(draft, target, k=wl.k, draft_batch=wl.draft_batch, target_batch=wl.target_batch,
                                   context=wl.context, seed=wl.seed, ragged=True)
        graph = build_graph(wl)
        floor_ms = sum(graph.nodes[o]["op"].bytes for m in Model for o in graph.graph["order"][m]) / (copy_gbs * 1e6)
        ref_target_cache = inputs.target_cache.clone()
        ref_logits = forward(target, inputs.verify_tokens, ref_target_cache, inputs.target_lengths)
        ref_target_kv = torch.stack([ref_target_cache.k, ref_target_cache.v])
        tiled = (tile_weights(draft, step_table(wl.draft, wl.draft_batch, wl.k, sms, sms=sms)),
                 tile_weights(target, step_table(wl.target, wl.target_batch, 1, sms, sms=sms, tokens=wl.k + 1)))
        for p in [0, *args.draft_sms]:  # 0: one after the other, every SM each
            row: dict = {"workload": wl.name, "draft_sms": p or None, "round_floor_ms": floor_ms}
            try:
                pair = Pair(wl, tiled, inputs, p or sms, (sms - p) or sms, sms)
                if p:
                    context, draft_stream = limited_stream(device, p)
                    target_stream = torch.cuda.Stream(device)

                    def run(pair=pair, draft_stream=draft_stream, target_stream=target_stream) -> None:
                        main = torch.cuda.current_stream(device)
                        for s in (draft_stream, target_stream):
                            s.wait_stream(main)
                        with torch.cuda.stream(draft_stream):
                            pair.draft.run()
                        with torch.cuda.stream(target_stream):
                            pair.target.run()
                        for s in (draft_stream, target_stream):
                            main.wait_stream(s)
                else:
                    def run(pair=pair) -> None:
                        pair.draft.run()
                        pair.target.run()
                pair.reset()
                run()
                torch.cuda.synchronize()
                row["draft_check"] = check_draft(pair.draft, draft, inputs, wl.k)
                row["target_check"] = check_step(pair.target, ref_logits, ref_target_kv, inputs.target_lengths, wl.k + 1)
                if row["draft_check"]["ok"] and row["target_check"]["ok"]:
                    row["round_ms"] = time_replays(capture(run, device).replay, args.replays, 20).median_ms
            except Exception as e:  # a variant that fails is a row, not the end of the run
                row["error"] = failure(e)
            out["rows"].append(row)
            args.json.write_text(json.dumps(out, indent=1))
            print(json.dumps(row), flush=True)
            torch.cuda.empty_cache()
        del draft, target, inputs, tiled
        pair = None
        torch.cuda.empty_cache()
    print(f"\n{'workload':<24} {'draft SMs':>9} {'floor':>7} {'round':>7}")
    for r in out["rows"]:
        print(f"{r['workload']:<24} {str(r['draft_sms'] or 'all, then'):>9} {r['round_floor_ms']:7.3f} "
              f"{r.get('round_ms', float('nan')):7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
