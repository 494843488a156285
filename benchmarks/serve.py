"""`conjugate serve` under concurrent clients: output tokens per second, time to first token and
acceptance, per plan, number of clients and temperature.

    python benchmarks/serve.py [--workloads llama-1b-8b-b8] [--plans best conventional] [--modes pipelined simple]
                               [--clients 1 8 32] [--temperatures 0 0.8] [--requests 4] [--max-tokens 64]
                               [--json benchmarks/results/serve_h200.json] [--resume CUT.json]

A plan is `best` (the workload's searched plan, benchmarks/results/plans/<workload>.json), a shipped
plan's name, a plan file, or `conventional` (each model run by torch, the phases one after the
other). Each plan is served by a `conjugate serve` process of its own per `--modes` entry (default
pipelined: two groups, one drafting beside the other's verification; simple: one group, its draft
then its verification, each round), warmed up, then driven by each number of clients in turn: every client sends `--requests` streamed completions
one after another (a fixed mix: seeded random prompt ids of 16 to 256 tokens (fewer where the context is short), `--max-tokens` each,
the end-of-sequence ids ignored by a stop list of none, seeds fixed), through the official `openai`
client. Time to first token: from sending a request to its first streamed token ids; output tokens per
second: every completion token over the wall time of the whole mix. Acceptance: drafts accepted over
drafts proposed during the mix, from the server's `/v1/stats`. The examples' workloads are presets
of random weights: their draft rarely agrees with their target (acceptance near 0), so the figures
measure the round and the serving loop around it, not how well a real pair agrees.

`--resume` takes a run cut short (its `--json`, from the same GPU with the same `--requests` and
`--max-tokens`): its rows are kept, with that run's command, commit and date as `measured_by`, and
only the missing (workload, plan, mode, clients, temperature) are measured; a plan with nothing missing
starts no server.
"""
from __future__ import annotations

import asyncio
import json
import random
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from common import RESULTS, ROOT, command_line, environment, make_parser, positive, write_json

READY_S = 900  # compiling a plan's kernels and capturing its graphs takes minutes on a cold cache


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.loads(reply.read())


class Server:
    """A `conjugate serve` process, ready once it prints the URL it serves on."""

    def __init__(self, workload: str, plan: str, mode: str, log: Path):
        self.log = log.open("w")
        self.process = subprocess.Popen([sys.executable, "-m", "conjugate", "serve", workload, "--plan", plan,
                                         "--mode", mode, "--port", "0"], stdout=self.log, stderr=subprocess.STDOUT,
                                        cwd=ROOT)
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:  # --port 0: the port it took is in its "serving ... on URL" line
            if self.process.poll() is not None:
                raise RuntimeError(f"conjugate serve {workload} --plan {plan} exited {self.process.returncode}: "
                                   f"see {log}")
            found = re.search(r" on (http://127\.0\.0\.1:\d+)/v1$", log.read_text(), re.M)
            if found:
                self.url = found[1]
                self.model = get_json(self.url + "/v1/models")["data"][0]["id"]
                return
            time.sleep(1)
        self.close()
        raise RuntimeError(f"conjugate serve {workload} --plan {plan}: not ready after {READY_S} s; see {log}")

    def stats(self) -> dict:
        return get_json(self.url + "/v1/stats")

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


def request_mix(clients: int, per_client: int, vocab: int, longest: int, seed: int = 0) -> list[list[list[int]]]:
    """Per client, its prompts: seeded random ids of 16 to `longest` tokens."""
    rng = random.Random(seed)
    return [[[rng.randrange(vocab) for _ in range(rng.randint(min(16, longest), longest))] for _ in range(per_client)]
            for _ in range(clients)]


async def one_request(client, model: str, prompt: list[int], max_tokens: int, temperature: float,
                      seed: int) -> tuple[float, int]:
    """(seconds to the first streamed token, completion tokens) of one streamed completion."""
    sent, first = time.perf_counter(), None
    tokens = 0
    stream = await client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens,
                                             temperature=temperature, seed=seed, stream=True, stop=None,
                                             stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    async for chunk in stream:
        if first is None and chunk.choices and getattr(chunk.choices[0], "token_ids", None):
            first = time.perf_counter() - sent
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return (first if first is not None else time.perf_counter() - sent), tokens


async def drive(server: Server, mix, max_tokens: int, temperature: float) -> dict:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=3600)

    async def one_client(c: int, prompts):
        return [await one_request(client, server.model, p, max_tokens, temperature, seed=1000 * c + i)
                for i, p in enumerate(prompts)]

    before = server.stats()
    started = time.perf_counter()
    results = [r for per in await asyncio.gather(*(one_client(c, p) for c, p in enumerate(mix))) for r in per]
    wall = time.perf_counter() - started
    after = server.stats()
    await client.close()
    ttft = sorted(t for t, _ in results)
    proposed = after["drafts_proposed"] - before["drafts_proposed"]
    accepted = after["drafts_accepted"] - before["drafts_accepted"]
    return {"requests": len(results), "output_tokens": sum(n for _, n in results), "seconds": wall,
            "output_tokens_per_s": sum(n for _, n in results) / wall, "ttft_ms_median": statistics.median(ttft) * 1e3,
            "ttft_ms_p90": ttft[min(len(ttft) - 1, int(0.9 * len(ttft)))] * 1e3,
            "acceptance": accepted / proposed if proposed else 0.0}


def resumed_runs(path: Path, gpu: str | None, settings: dict) -> dict[tuple, dict]:
    """A cut-short run's rows by (workload, plan, mode, clients, temperature) (a row without a mode
    was served pipelined). Refused with one line when it is unreadable or comes from another GPU or
    other settings."""
    try:
        cut = json.loads(path.read_text())
        rows, their_settings = cut["runs"], cut["settings"]
        keys = [(r["workload"], r["plan"], r.get("mode", "pipelined"), r["clients"], float(r["temperature"]))
                for r in rows]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"serve.py: --resume: {path}: not a serve.py result ({type(e).__name__}: {e})")
    if cut.get("gpu") != gpu or their_settings != settings:
        raise SystemExit(f"serve.py: --resume: {path} was measured on {cut.get('gpu')} with {their_settings}; "
                         f"this run is {gpu} with {settings}")
    provenance = {key: cut.get(key) for key in ("command", "code", "date")}
    return {key: r | {"measured_by": r.get("measured_by", provenance)} for key, r in zip(keys, rows)}


def plan_argument(plan: str, workload: str) -> str:
    if plan == "best":
        return str(RESULTS / "plans" / f"{workload}.json")
    return plan


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__, full_doc=True)
    parser.add_argument("--workloads", nargs="+", default=["llama-1b-8b-b8"])
    parser.add_argument("--plans", nargs="+", default=["best", "conventional"])
    parser.add_argument("--modes", nargs="+", choices=("pipelined", "simple"), default=["pipelined"],
                        help="how each plan's server runs its rounds (conjugate serve --mode)")
    parser.add_argument("--clients", nargs="+", type=positive, default=[1, 8, 32])
    parser.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 0.8])
    parser.add_argument("--requests", type=positive, default=4, help="completions each client sends in turn")
    parser.add_argument("--max-tokens", type=positive, default=64)
    parser.add_argument("--logs", type=Path, default=Path("serve-logs"), help="each server's output goes here")
    parser.add_argument("--resume", type=Path, metavar="CUT.json",
                        help="a run cut short: keep its rows (same GPU and settings), measure the rest")
    args = parser.parse_args(argv)

    from conjugate.cli.arguments import workload_name_or_file
    from conjugate.errors import ConjugateError
    from conjugate.workload import load_workload

    workloads = {}
    for name in args.workloads:  # every one refused before any server starts
        try:
            workloads[name] = workload = load_workload(workload_name_or_file(name))
        except (ConjugateError, OSError) as e:
            parser.error(f"--workloads {name}: {e}")
        if workload.context + 1 - args.max_tokens - workload.k < 1:
            parser.error(f"--max-tokens {args.max_tokens}: past {name}'s context {workload.context}")
    settings = {"requests": args.requests, "max_tokens": args.max_tokens}
    out = {**environment("serve"), "command": command_line("serve", argv), "settings": settings, "runs": []}
    kept = resumed_runs(args.resume, out["gpu"], settings) if args.resume else {}
    args.logs.mkdir(parents=True, exist_ok=True)
    for name, workload in workloads.items():
        longest = min(256, workload.context + 1 - args.max_tokens - workload.k)
        for plan, mode in ((plan, mode) for plan in args.plans for mode in args.modes):
            cases = [(name, plan, mode, clients, float(t)) for t in args.temperatures for clients in args.clients]
            if all(case in kept for case in cases):  # nothing to measure: no server
                out["runs"] += [kept[case] for case in cases]
                write_json(args.json, out)
                continue
            server = Server(name, plan_argument(plan, name), mode, args.logs / f"{name}-{Path(plan).stem}-{mode}.log")
            try:
                warm = request_mix(2, 1, workload.draft.vocab_size, longest, seed=99)
                asyncio.run(drive(server, warm, args.max_tokens, 0.0))
                for case in cases:
                    if case in kept:
                        row = kept[case]
                    else:
                        clients, temperature = case[3], case[4]
                        mix = request_mix(clients, args.requests, workload.draft.vocab_size, longest)
                        measured = asyncio.run(drive(server, mix, args.max_tokens, temperature))
                        row = {"workload": name, "plan": plan, "mode": mode, "clients": clients,
                               "temperature": temperature, **measured}
                    print(json.dumps(row), flush=True)
                    out["runs"].append(row)
                    write_json(args.json, out)  # after every row: a run cut short keeps its rows
            finally:
                server.close()
    runs = out["runs"]
    _table(runs)
    return 0


def _table(runs: list[dict]) -> None:
    print(f"{'workload':24} {'plan':14} {'mode':10} {'clients':>7} {'T':>4} {'tok/s':>9} {'ttft p50':>9} "
          f"{'ttft p90':>9} {'accept':>6}")
    for r in runs:
        print(f"{r['workload']:24} {Path(r['plan']).stem:14} {r.get('mode', 'pipelined'):10} {r['clients']:7} "
              f"{r['temperature']:4} "
              f"{r['output_tokens_per_s']:9.1f} {r['ttft_ms_median']:9.1f} {r['ttft_ms_p90']:9.1f} {r['acceptance']:6.2f}")


if __name__ == "__main__":
    sys.exit(main())
