"""The draft's step table and the target's verify table as one persistent launch (pair_kernel.py):
the host side, and on a GPU a check and a timing beside the two step launches one after the other.

    python lab/cross_step/cross.py examples/qwen3-06b-8b-b4.toml examples/llama-1b-8b-b1.toml --json OUT.json
    python lab/cross_step/cross.py --offline qwen3-0.6b:4:5 qwen3-8b:4     # compile for sm_90a only

Each model gets its own StepLaunch (buffers, table, counters) built with half a program's shared
memory (a ring and activation tiles each); both tables have one program an SM. Lab code: nothing in
`conjugate/` imports it.
"""
from __future__ import annotations

import argparse
import json
import sys
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "lab" / "verify_step"))
sys.path.insert(0, str(ROOT / "lab" / "step_share"))

import torch  # noqa: E402

from conjugate.compiler.step import launch as launch_module  # noqa: E402
from conjugate.compiler.step.launch import StepLaunch  # noqa: E402
from conjugate.compiler.step.layout import tile_weights  # noqa: E402
from conjugate.compiler.step.table import step_table  # noqa: E402

from pair_kernel import pair_kernel  # noqa: E402

# Each model's share of a program's shared memory (its ring and activation tiles) and of that, its
# activation tiles at most: the draft's small K slices fit 32 KB at 16 rows; the target's are staged in
# runs; with the compiler's scratch they fit Hopper's 227 KB.
SHARES = {"draft": (32 * 1024 + 4 * 16400, 32 * 1024), "target": (124 * 1024, 48 * 1024)}  # rings of 4


@contextmanager
def budget(smem: int, act: int):
    """StepLaunch's shared-memory budgets, for one model's half of a pair."""
    saved = launch_module.SMEM_BUDGET, launch_module.ACT_BUDGET
    launch_module.SMEM_BUDGET, launch_module.ACT_BUDGET = smem, act
    try:
        yield
    finally:
        launch_module.SMEM_BUDGET, launch_module.ACT_BUDGET = saved


class PairLaunch:
    """Two StepLaunches (draft steps, target verify) run by one pair_kernel launch."""

    kernel = pair_kernel

    def __init__(self, draft_w, target_w, draft_kv, target_kv, batch: int, steps: int, target_batch: int,
                 programs: int, sms: int):
        dt = step_table(draft_w.spec, batch, steps, programs, sms=sms)
        tt = step_table(target_w.spec, target_batch, 1, programs, sms=sms, tokens=steps + 1)
        with budget(*SHARES["draft"]):
            # attention one block deep: the shares above were sized before the launch's default became two
            self.draft = StepLaunch(dt, tile_weights(draft_w, dt), draft_kv, attention_buffers=1)
        with budget(*SHARES["target"]):
            self.target = StepLaunch(tt, tile_weights(target_w, tt), target_kv, logits=True, attention_buffers=1)
        self.programs = programs
        options = {"num_warps", "maxnreg"}
        self.kwargs = {f"{m}_{k}": v for m, launch in (("d", self.draft), ("t", self.target))
                       for k, v in launch.kwargs.items() if k not in options} | {"num_warps": 4, "maxnreg": 168}

    def args(self) -> tuple:
        return (*self.draft.args(), *self.target.args())

    def run(self) -> None:
        for launch in (self.draft, self.target):
            launch.error.zero_()
            for s in launch.sums:
                s.zero_()
            launch.ssx.zero_()
            launch.ssm.zero_()
            launch.counters.zero_()
        pair_kernel[(self.programs,)](*self.args(), **self.kwargs)


def offline(cases: list[str]) -> int:
    """Compile for sm_90a on meta buffers: DRAFT:BATCH:K TARGET:TARGET_BATCH pairs."""
    from types import SimpleNamespace

    from conjugate.compiler.offline import _Triton
    from conjugate.models.presets import from_name
    from conjugate.models.weights import meta_weights

    tools = _Triton(90)
    for d_case, t_case in zip(cases[::2], cases[1::2]):
        d_name, batch, steps = d_case.split(":")
        t_name, t_batch = t_case.split(":")
        batch, steps, t_batch = int(batch), int(steps), int(t_batch)
        dw, tw = meta_weights(from_name(d_name), torch.bfloat16), meta_weights(from_name(t_name), torch.bfloat16)

        def kv(spec, b):
            return torch.empty(2, spec.num_layers, b, spec.num_kv_heads, 1100, spec.head_dim, dtype=torch.bfloat16,
                               device="meta")
        pair = PairLaunch(dw, tw, kv(dw.spec, batch), kv(tw.spec, t_batch), batch, steps, t_batch, 132, 132)
        key, (source, options) = tools.bind_step(SimpleNamespace(launch=pair, digest=f"pair:{d_case}:{t_case}"))
        r = tools.compile(source, options)
        k = pair.kwargs
        print(f"{d_case} + {t_case}: registers {r.registers}, local {r.spills}, shared {r.shared_bytes}; "
              f"draft ring {k['d_STAGES']} act {k['d_KT_MAX']} x {k['d_RPAD']}; target ring {k['t_STAGES']} "
              f"act {k['t_KT_MAX']} x {k['t_RPAD']} (chunk {k['t_CHUNK']})", flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("items", nargs="+", help="workload TOMLs, or with --offline DRAFT:B:K TARGET:BT pairs")
    parser.add_argument("--offline", action="store_true")
    parser.add_argument("--replays", type=int, default=100)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.offline:
        return offline(args.items)
    return measure(args)


def measure(args) -> int:
    from common import environment, failure  # noqa: E402
    from pair import check_draft  # lab/step_share
    from verify import check_step  # lab/verify_step

    from conjugate.evaluate.timing import capture, copy_bandwidth_gbs, time_replays
    from conjugate.graph import build_graph
    from conjugate.models.reference import forward, make_round_inputs
    from conjugate.roles import Model
    from conjugate.workload import load_workload

    device = torch.device("cuda")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    copy_gbs = copy_bandwidth_gbs(device)
    out = {**environment("cross_step"), "command": "python " + " ".join(sys.argv), "copy_gbs": copy_gbs, "rows": []}
    for path in map(Path, args.items):
        wl = load_workload(path)
        draft, target = wl.weights(Model.DRAFT, device), wl.weights(Model.TARGET, device)
        inputs = make_round_inputs(draft, target, k=wl.k, draft_batch=wl.draft_batch, target_batch=wl.target_batch,
                                   context=wl.context, seed=wl.seed, ragged=True)
        graph = build_graph(wl)
        row: dict = {"workload": wl.name, "round_floor_ms": sum(graph.nodes[o]["op"].bytes for m in Model
                                                                 for o in graph.graph["order"][m]) / (copy_gbs * 1e6)}
        t_cache = inputs.target_cache.clone()
        ref_logits = forward(target, inputs.verify_tokens, t_cache, inputs.target_lengths)
        try:
            pair = PairLaunch(draft, target, inputs.draft_cache.k._base.clone(), inputs.target_cache.k._base.clone(),
                              wl.draft_batch, wl.k, wl.target_batch, sms, sms)
            pair.draft.tokens_in[:wl.draft_batch].copy_(inputs.draft_last_tokens)
            pair.draft.lengths.copy_(inputs.draft_lengths)
            pair.target.tokens_in[:pair.target.prog.rows].copy_(inputs.verify_tokens.reshape(-1))
            pair.target.lengths.copy_(inputs.target_lengths)
            pair.run()
            torch.cuda.synchronize()
            row["draft_check"] = check_draft(pair.draft, draft, inputs, wl.k)  # teacher-forced, near ties allowed
            row["target_check"] = check_step(pair.target, ref_logits, torch.stack([t_cache.k, t_cache.v]),
                                             inputs.target_lengths, wl.k + 1)
            if row["draft_check"]["ok"] and row["target_check"]["ok"]:
                row["pair_ms"] = time_replays(capture(pair.run, device).replay, args.replays, 20).median_ms
        except Exception as e:  # a workload that fails is a row, not the end of the run
            row["error"] = failure(e)
        out["rows"].append(row)
        if args.json:
            args.json.write_text(json.dumps(out, indent=1))
        print(json.dumps(row), flush=True)
        del draft, target, inputs
        pair = None
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
