"""What a stamped step launch's time went to, from its in-kernel stamps (columns.py's S_*): per op,
each program's waits and work (`task_ledger`), and the launch's critical path stage by stage
(`critical_path`, in the ledger as `critical`)."""
from __future__ import annotations

from collections import Counter, defaultdict

from conjugate.compiler.step.table import OPS, StepProgram, Task
from conjugate.kernels.step.columns import S_ARRIVED, S_END, S_ISSUED, S_MET, S_MULTIPLIED, S_STAGED, S_START


def _ready_us(prog: StepProgram, st) -> dict[str, float]:
    """Each counter's time of completion as the stamps see it: the last end among the tasks that bump
    it (a step's token counter: its last head task's)."""
    ready: dict[str, float] = {}
    for t in prog.tasks:
        end = float(st[t.index, S_END])
        names = (t.done, f"token/{t.step}") if t.op == "head" else (t.done,)
        for name in names:
            ready[name] = max(ready.get(name, end), end)
    return ready


def task_ledger(prog: StepProgram, stamps, attention_streamed: bool = False) -> dict:
    """Where a step launch's time went, from its in-kernel stamps (ns; columns.py's S_*): per op the
    mean per program of the time spent waiting on other programs' counters and of the time working,
    the launch's span, and what the programs spent between tasks (reading the table).

    Work is split in three (GEMMs and attention): `stage_us` (waits met to activations staged;
    attention's whole chunk, its keys and values staged and multiplied block by block; 0 where a
    GEMM stages its K a run at a time), `multiply_us` (to the product done: a GEMM's waits for its
    weight tiles and its wgmma, the partials' adds issued, and its staging where that is run by run;
    0 for attention) and `finish_us` (to its end), itself `arrive_us` (the parts counter's acq_rel
    trip, which first waits for the task's partial adds to land) and `epilogue_us` (the rest: the last
    piece's epilogue or attention's merge, and the done counter's release). A task whose epilogue
    ran on its accumulators (`direct_epilogue`) counts it in `multiply_us`: compare such variants by
    their span, not their finish. `lead_us` (GEMMs, and attention where the loader streams its
    history: `attention_streamed`, the launch's ring_kv) is the mean time a task's first weight tile
    (or history block) was issued by the loader before the task's waits were met: negative where the
    loader issued it later, the weights then streaming while the task waits for them.

    The wait of a task that waits on counters is split in two at the moment the counters' last
    producer task ended (its end is stamped after its epilogue and its counter's release):
    `producers_us`, the time before it (the producers' work, epilogues included: the chain and any
    imbalance), and `handoff_us`, the time after it (the rest of the counter's trip and the poll that
    sees it; a lower bound, since a poll may see the counter before the producer stamps its end).
    `wait_us` also counts the few tasks that wait on nothing (their stamping). %globaltimer ticks
    coarsely on some GPUs (about 1 us): the splits are means over thousands of tasks."""
    st = stamps.cpu().double() / 1e3  # us
    span = float(st[:, S_END].max() - st[:, S_START].min())
    ready = _ready_us(prog, st)
    out = {"span_us": span, "programs": prog.programs, "stages": len({t.stage for t in prog.tasks}), "ops": {}}
    for op in OPS:
        tasks = [t for t in prog.tasks if t.op == op]
        if not tasks:
            continue
        rows = st[[t.index for t in tasks]]
        before = after = 0.0
        for t, row in zip(tasks, rows.tolist()):
            start, met = row[S_START], row[S_MET]
            if t.waits:
                last = max(ready[name] for name, _ in t.waits)
                before += max(0.0, min(last, met) - start)
                after += max(0.0, met - max(last, start))
        def per_program(durations) -> float:
            return float(durations.sum()) / prog.programs

        entry = {"tasks": len(rows), "wait_us": per_program(rows[:, S_MET] - rows[:, S_START]),
                 "work_us": per_program(rows[:, S_END] - rows[:, S_MET]),
                 "producers_us": before / prog.programs, "handoff_us": after / prog.programs}
        if op != "embed":
            entry |= {"stage_us": per_program(rows[:, S_STAGED] - rows[:, S_MET]),
                      "multiply_us": per_program(rows[:, S_MULTIPLIED] - rows[:, S_STAGED]),
                      "finish_us": per_program(rows[:, S_END] - rows[:, S_MULTIPLIED]),
                      "arrive_us": per_program(rows[:, S_ARRIVED] - rows[:, S_MULTIPLIED]),
                      "epilogue_us": per_program(rows[:, S_END] - rows[:, S_ARRIVED])}
        if op != "embed" and (op != "attn" or attention_streamed):
            entry["lead_us"] = float((rows[:, S_MET] - rows[:, S_ISSUED]).mean())
        out["ops"][op] = entry
    out["between_tasks_us"] = span - sum(v["wait_us"] + v["work_us"] for v in out["ops"].values())
    out["critical"] = critical_path(prog, stamps)
    return out


def critical_path(prog: StepProgram, stamps) -> dict:
    """The launch's critical path, stage by stage, from its stamps (ns): a stage (an op instance every
    later op waits for) ends when its last task ends, and the time from the stage before's end to its
    own is charged to that last task's phases:

        busy      its program still on earlier tasks (or reading the table) after the stage before ended
        handoff   then until its waits were met (the counter's trip and the poll that sees it)
        stage, multiply, arrive, epilogue   its own work, as `task_ledger` splits it

    Per op, summed over its stages (us: the ops' `us` add up to the span), with `straggle_us`, how
    much later each stage's last task ended than its median task. `critical_programs` counts the
    programs that ran a stage's last task, and `top_program_share` is the share of the busiest of
    them: near 1 / programs the lateness is spread, near 1 one program holds the chain."""
    st = stamps.cpu().double() / 1e3  # us
    by_stage: dict[int, list[Task]] = defaultdict(list)
    for t in prog.tasks:
        by_stage[t.stage].append(t)
    before = float(st[:, S_START].min())  # the stage before's end
    ops: dict[str, dict] = {}
    owners: Counter = Counter()
    for stage in sorted(by_stage):
        tasks = by_stage[stage]
        ends = st[[t.index for t in tasks], S_END]
        last = tasks[int(ends.argmax())]
        owners[last.program] += 1
        points = [before]
        for col in (S_START, S_MET, S_STAGED, S_MULTIPLIED, S_ARRIVED, S_END):  # a stamp never before the last
            points.append(max(points[-1], float(st[last.index, col])))
        entry = ops.setdefault(last.op, dict.fromkeys(("stages", "us", *CRITICAL_PHASES, "straggle_us"), 0.0))
        entry["stages"] += 1
        entry["us"] += points[-1] - before
        for phase, a, b in zip(CRITICAL_PHASES, points, points[1:]):
            entry[phase] += b - a
        entry["straggle_us"] += float(ends.max() - ends.median())
        before = points[-1]
    for entry in ops.values():
        entry["stages"] = int(entry["stages"])
    return {"span_us": before - float(st[:, S_START].min()), "ops": ops, "critical_programs": len(owners),
            "top_program_share": max(owners.values()) / len(by_stage)}


def path_shares(ledger: dict) -> dict[str, float]:
    """Each op's share of the launch's critical path (`task_ledger`'s `critical`): how the round's
    ledger divides a step launch's time among the ops it runs. Empty for a path of no length."""
    ops = ledger["critical"]["ops"]
    span = sum(v["us"] for v in ops.values())
    return {op: v["us"] / span for op, v in ops.items()} if span > 0 else {}


CRITICAL_PHASES = ("busy_us", "handoff_us", "stage_us", "multiply_us", "arrive_us", "epilogue_us")
