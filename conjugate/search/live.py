"""The search's live view: evaluations done, the best speedup over each baseline so far, what is
being tried, failures. A rich live panel on a terminal, one line per event elsewhere (logs, CI)."""
from __future__ import annotations

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text


class LiveView:
    def __init__(self, console: Console, budget: int, done: int = 0):
        self.console, self.budget, self.done = console, budget, done
        self.best: dict | None = None  # {"node", "latency_ms", "speedups", "modeled"}
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
            self.now = f"evaluating node {data['node']} [{data['kind']}]: {data['rationale'][:90]}"
        elif kind == "result":
            self._result(data)
        elif kind == "rejected":
            self._say(f"rejected an edit of node {data['node']}: {data['error'][:120]}")
        if self._live:
            self._live.update(self._render())

    def _result(self, data: dict) -> None:
        r, node = data["result"], data["node"]
        if not data.get("settled", True):  # another process sharing the run counted it
            return
        self.done += 1
        if r["status"] != "ok":
            self.failures += 1
            self._say(f"[{self.done}/{self.budget}] node {node}: {r['status']} at {r['stage']}: {r['error'][:110]}")
            return
        m = r["metrics"]
        if self.best is None or m["latency_ms"] < self.best["latency_ms"]:
            self.best = {"node": node, "latency_ms": m["latency_ms"], "speedups": m.get("speedups", {}),
                         "modeled": r["modeled"]}
        speedups = ", ".join(f"{s:.3f}x vs {b}" for b, s in m.get("speedups", {}).items())
        self._say(f"[{self.done}/{self.budget}] node {node}: {m['latency_ms']:.3f} ms ({speedups})")

    def _say(self, line: str) -> None:
        self.recent = (self.recent + [line])[-6:]
        if not self._live:
            self.console.print(escape(line), highlight=False)

    def _render(self) -> Group:
        table = Table.grid(padding=(0, 2))
        table.add_row("evaluations", f"{self.done}/{self.budget}", "failures", str(self.failures))
        if self.best:
            what = "modeled" if self.best["modeled"] else "measured"
            table.add_row("best", f"node {self.best['node']}: {self.best['latency_ms']:.3f} ms ({what})", "", "")
            for baseline, s in self.best["speedups"].items():
                table.add_row("", f"{s:.3f}x vs {baseline}", "", "")
        return Group(table, Text(self.now, style="bold"), *(Text(line) for line in self.recent))
