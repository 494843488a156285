"""What the suite scripts share: the checkout on sys.path, a parser whose --json path is checked before
any work, the record of where a result was measured, and checking a compiled round before timing it.

A script starts with `from common import ROOT, ...` (benchmarks/ is the script's own folder) and then
imports the package.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from conjugate.cli.arguments import output_file, positive  # noqa: E402,F401  (positive: for the scripts)

RESULTS = ROOT / "benchmarks" / "results"
SIX = ["llama-1b-8b-b1", "llama-1b-8b-b8", "qwen25-05b-7b-b8", "qwen3-06b-8b-b4", "llama-1b-3b-b16-ctx4k",
       "qwen25-15b-14b-b4"]  # the H200 configurations of examples/


def make_parser(doc: str, json_help: str = "write the result here (its folder is checked first)",
                full_doc: bool = False) -> argparse.ArgumentParser:
    """An argument parser with `--json`, a path refused before anything is measured when it cannot
    take the result. `full_doc` shows the whole docstring in --help (else its first line)."""
    if full_doc:
        parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    else:
        parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--json", type=output_file, help=json_help)
    return parser


def command_line(script: str, argv: list[str] | None = None) -> str:
    """The command as the README gives it: `python benchmarks/<script>.py ARGS`, or `python <script> ARGS`
    for a script given by its path (lab/<topic>/<name>.py)."""
    path = script if script.endswith(".py") else f"benchmarks/{script}.py"
    return " ".join(["python", path, *(sys.argv[1:] if argv is None else argv)])


def git_commit(checkout: Path = ROOT) -> str:
    """The checkout's short commit, `+changes` when tracked files differ from it; "unknown" outside a
    checkout (or for a folder inside another checkout)."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True).stdout.strip()
        except OSError:
            return ""
    top = git("rev-parse", "--show-toplevel")
    if not top or Path(top) != checkout.resolve():
        return "unknown"
    commit = git("rev-parse", "--short", "HEAD")
    return (commit + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")) or "unknown"


# names the commit measured where the checkout's own history cannot: on the device, git named the
# session's first commit "+changes" for a tree sent later (11b8ad2+changes for 00300f1)
CODE_VARIABLE = "CONJUGATE_CODE"


def code_commit() -> dict:
    """{"code": the commit measured}: $CONJUGATE_CODE where set (a commit's hex name, "+changes" after it
    for a tree that differs from it, as git_commit writes; the checkout's own reading kept beside it as
    "checkout_code"), else the checkout's (git_commit). SystemExit, one line, where the variable is not
    of that form (call it before measuring)."""
    named = os.environ.get(CODE_VARIABLE, "").strip()
    if not named:
        return {"code": git_commit()}
    if not re.fullmatch(r"[0-9a-f]{7,40}(\+changes)?", named):
        raise SystemExit(f"${CODE_VARIABLE}={named!r}: not a commit (7 to 40 hex digits as git rev-parse prints "
                         f"them, then +changes for a tree that differs)")
    return {"code": named, "checkout_code": git_commit()}


def environment(script: str, gpu: str | None = None) -> dict:
    """Where a result was measured: command, GPU (the first CUDA device's name unless given), versions,
    the code's commit (code_commit) and the date."""
    import torch

    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    if gpu is None and torch.cuda.is_available():
        gpu = torch.cuda.get_device_name()
    return {"command": command_line(script), "gpu": gpu, "torch": torch.__version__, "triton": triton_version,
            "python": platform.python_version(), **code_commit(), "date": time.strftime("%Y-%m-%d")}


def require_gpu(parser: argparse.ArgumentParser, what: str = "it measures on a GPU") -> None:
    """One line and status 2 (parser.error) where no CUDA device is there to measure on."""
    import torch

    if not torch.cuda.is_available():
        parser.error(f"{what}, and this machine has none (no CUDA device)")


def write_json(path: Path | None, out: dict) -> None:
    """Write `out` when a path was given (after every row, so a run cut short keeps what it measured)."""
    if path is not None:
        Path(path).write_text(json.dumps(out, indent=1, default=str) + "\n")


@dataclass
class RoundCase:
    """A workload on a device: both models' weights, one round's inputs (ragged lengths unless told
    otherwise), its op graph and the fp32 reference check of a compiled round."""

    workload: object
    draft: object
    target: object
    inputs: object
    graph: object
    check: object

    def draft_floor_ms(self, copy_gbs: float) -> float:
        """The draft phase's bytes at `copy_gbs`."""
        from conjugate.roles import Model

        order = self.graph.graph["order"][Model.DRAFT]
        return sum(self.graph.nodes[op]["op"].bytes for op in order) / (copy_gbs * 1e6)


def round_case(path: Path, device, ragged: bool = True) -> RoundCase:
    from conjugate.evaluate.correctness import ReferenceChecker
    from conjugate.graph import build_graph
    from conjugate.models.reference import make_round_inputs
    from conjugate.roles import Model
    from conjugate.workload import load_workload

    wl = load_workload(path)
    draft, target = wl.weights(Model.DRAFT, device), wl.weights(Model.TARGET, device)
    inputs = make_round_inputs(draft, target, k=wl.k, draft_batch=wl.draft_batch, target_batch=wl.target_batch,
                               context=wl.context, seed=wl.seed, ragged=ragged)
    return RoundCase(wl, draft, target, inputs, build_graph(wl), ReferenceChecker(draft, target, inputs, wl.dtype))


def failure(e: BaseException) -> str:
    """An exception as one line for a result row: its type and the last line of its message."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[-1] if text else ''}"


def check_then_time(compiled, inputs, check, replays: int, warmup: int = 10) -> dict:
    """Check one eager round and one CUDA-graph replay against the reference, then, only when both
    match, time `replays` replays: {"correct", "check", "eager_check_ok"} plus the timing's fields."""
    from conjugate.evaluate.rounds import checked_run
    from conjugate.evaluate.timing import time_replays

    eager = checked_run(compiled, inputs, check)
    compiled.prepare()  # a CUDA graph of the whole round when the plan says capture: graph
    replayed = checked_run(compiled, inputs, check, graph=True)
    row = {"correct": eager.ok and replayed.ok, "check": replayed.to_dict(), "eager_check_ok": eager.ok}
    if row["correct"]:
        row |= time_replays(compiled.run, replays, warmup=warmup).to_dict()
    return row


def checked_draft_phase(compiled, inputs, check, device) -> tuple[dict, object | None, object | None]:
    """Check a compiled round against the reference (its step launch, if any, also for spins that ran
    out); only when it passes, capture its draft phase as a CUDA graph. Returns (the check as a row,
    the graph or None, the round's CompiledStep or None). Keep `compiled` while the graph replays."""
    from conjugate.compiler.step.compiled import CompiledStep
    from conjugate.evaluate.rounds import checked_run
    from conjugate.evaluate.timing import capture
    from conjugate.roles import Model

    report = checked_run(compiled, inputs, check)
    step = next((l for l in compiled.launches if isinstance(l, CompiledStep)), None)
    row = {"ok": bool(report.ok), "problems": report.problems[:3], "spins_ran_out": step.spins_ran_out() if step else 0}
    if not row["ok"] or row["spins_ran_out"]:
        return row, None, step
    compiled.load(inputs)
    return row, capture(compiled.phase(Model.DRAFT), device), step


def time_interleaved(graphs: dict, replays: int, passes: int) -> dict[str, dict]:
    """Each variant's CUDA graph timed `passes` times, the variants taking turns (so drift falls on all
    alike): {variant: {"passes_ms": [median of `replays` replays, a pass], "ms": their median}}."""
    from conjugate.evaluate.timing import time_replays

    times: dict[str, list[float]] = {v: [] for v in graphs}
    for _ in range(passes):
        for variant, g in graphs.items():
            times[variant].append(time_replays(g.replay, replays, warmup=10).median_ms)
    return {v: {"passes_ms": ms, "ms": statistics.median(ms)} for v, ms in times.items()}
