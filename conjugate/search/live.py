"""The search's live view: evaluations done, the best speedup over each baseline so far, what is
being tried, failures. A rich live panel on a terminal, one line per event elsewhere (logs, CI).
Text that came from an agent or an evaluator is scrubbed of secrets (conjugate/secrets.py) before
it is cut short."""
from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from conjugate.evaluate.result import EvalResult
from conjugate.secrets import scrub
from conjugate.text import visible


@dataclass(frozen=True)
class Best:
    node: int
    result: EvalResult  # an ok one


class LiveView:
    def __init__(self, console: Console, budget: int, done: int = 0):
        self.console, self.budget, self.done = console, budget, done
        self.best: Best | None = None
        self.failures, self.now, self.recent = 0, "starting", []
        self._live = Live(self._render(), console=console, refresh_per_second=4) if console.is_terminal else None

    def __enter__(self) -> "LiveView":
        if self._live:
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live:
            self._live.__exit__(*exc)

    def event(self, kind: str, data: dict) -> None:
        if kind == "expand":
            self.now = f"expanding node {data['node']} (depth {data['depth']})"
        elif kind == "evaluate":
            self.now = f"evaluating node {data['node']} [{data['kind']}]: {visible(scrub(data['rationale']))[:90]}"
        elif kind == "result":
            self._result(data)
        elif kind == "rejected":
            self._say(f"rejected an edit of node {data['node']}: {visible(scrub(data['error']))[:120]}")
        elif kind == "skipped":
            why = visible(scrub(data['rationale']))[:100]
            self._say(f"skipped at node {data['node']}, it lost wherever it was made: {why}")
        if self._live:
            self._live.update(self._render())

    def _result(self, data: dict) -> None:
        r: EvalResult = data["result"]
        node = data["node"]
        if not data.get("settled", True):  # another process sharing the run counted it
            return
        self.done += 1
        if not r.ok:
            self.failures += 1
            why = visible(scrub(r.error))[:110]
            self._say(f"[{self.done}/{self.budget}] node {node}: {r.status} at {r.stage}: {why}")
            return
        if self.best is None or r.latency_ms < self.best.result.latency_ms:
            self.best = Best(node, r)
        speedups = ", ".join(f"{s:.3f}x vs {b}" for b, s in r.speedups.items())
        self._say(f"[{self.done}/{self.budget}] node {node}: {r.latency_ms:.3f} ms ({speedups})")

    def _say(self, line: str) -> None:
        self.recent = (self.recent + [line])[-6:]
        if not self._live:
            self.console.print(line, highlight=False, markup=False)

    def _render(self) -> Group:
        table = Table.grid(padding=(0, 2))
        table.add_row("evaluations", f"{self.done}/{self.budget}", "failures", str(self.failures))
        if self.best:
            best = self.best.result
            what = f"modeled for {best.metrics.device}" if best.modeled else f"measured on {best.metrics.device}"
            table.add_row("best", f"node {self.best.node}: {best.latency_ms:.3f} ms ({what})", "", "")
            for baseline, s in best.speedups.items():
                table.add_row("", f"{s:.3f}x vs {baseline}", "", "")
        return Group(table, Text(self.now, style="bold"), *(Text(line) for line in self.recent))
