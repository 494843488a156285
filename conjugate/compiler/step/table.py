"""The step form's task table: the draft's k decode steps as one list of tile tasks that a persistent
kernel (`device.py`) or the simulation (`simulate.py`) runs, built and checked on the host.

A step is, per layer: qkv (RMSNorm folded in, bias, Qwen3's q/k norm, RoPE, the KV write), attention
per (sequence, KV head), o_proj with the residual, gate_up with SiLU-mul (norm folded in), down with
the residual; then the final norm and lm_head with a per-tile argmax, reduced to the step's tokens
by the last tile in; the next step's embedding waits for them. With `tokens` T > 1 the table is one
verify pass instead: T tokens a sequence in one step, attending causally. Every op is cut into output tiles
and, where its tiles alone would leave programs idle, its K into slices:

    task = (op, step, layer, output tile, K slice)

A task waits on counters (acquire) before it reads anything another task wrote, adds its partial
product, and arrives at its tile's parts counter; the last slice in runs the epilogue and bumps the
tile's done counter (release). The norms need whole rows: their 1/rms scales the finished dot
products (x W'^T * rstd, the norm's weight folded into W'), so a slice may start as soon as the x
columns it reads are written, and only the epilogue waits for the whole row (`finish_waits`).

Tasks are numbered in stage order (op by op, layer by layer, step by step) and dealt to P programs,
each running its tasks in that order: an op instance's tasks go round the programs, or, where that
would leave the busiest program many more weight tiles than the rest (`_balance_pays`), its (tile, K
tile) units are cut into equal runs, one a program (`balanced_runs`; a tile's pieces then differ in
length). The checks (`check`) are what make such a table safe to launch: every waited counter has producers and its target is exactly their number; every
producer sits in an earlier stage than its waiter; each program's tasks are in stage order; every
output element is computed by exactly one tile and every K column by exactly one slice; and the P
programs fit the SMs at once. Under those, the earliest unfinished task can always run, so the
programs cannot deadlock; a wrong table is refused before launch, and the kernel's spins are bounded
besides.

Waits are per op instance (`coarsen`): a task waits once for everything of the op it reads. The
per-tile counters `build` makes first let a slice start on the columns it reads; on the GPU their
round trips cost more than the early start gains (lab/step_kernel), so the launch runs the coarse
table, and the per-tile one stays as the simulation's stricter test of the dependencies.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace

from conjugate.models.spec import ModelSpec

OPS = ("embed", "qkv", "attn", "o_proj", "gate_up", "down", "head")
# the op graph's kinds (graph.py) each table op computes: the norms folded into qkv, gate_up and lm_head,
# RoPE and the KV write in qkv's epilogue, the argmax in lm_head's
KIND_OPS = {"embed": "embed", "attn_norm": "qkv", "qkv": "qkv", "rope_kv": "qkv", "attn": "attn", "o_proj": "o_proj",
            "mlp_norm": "gate_up", "gate_up": "gate_up", "down": "down", "final_norm": "head", "lm_head": "head",
            "argmax": "head"}


@dataclass(frozen=True)
class Tiles:
    """Tile shapes (elements). `k`: K per weight tile (a ring slot's width); `rows`: weight rows per
    output tile of o_proj, down and lm_head; `half`: rows per half of a paired tile (qkv: the heads'
    first halves over their second halves, so RoPE's pairs meet in one tile; gate_up: gate over up)."""

    k: int = 64
    rows: int = 128
    half: int = 64


@dataclass(frozen=True)
class Task:
    index: int
    op: str
    step: int
    layer: int  # -1 for embed and head
    tile: int  # output tile (attn: b * kv_heads + kv_head)
    split: int  # K slice
    splits: int
    k_range: tuple[int, int]  # the K columns this task multiplies ((0, 0) for attn and embed)
    out: tuple[tuple[int, int], ...]  # output columns: one range, or (first halves, second halves)
    waits: tuple[tuple[str, int], ...]  # (counter, target) before it reads
    finish_waits: tuple[tuple[str, int], ...]  # before the last slice's epilogue (whole-row norms)
    parts: str | None  # arrival counter of the tile's slices (splits > 1)
    done: str  # bumped once the tile is finished
    stage: int = 0
    program: int = -1


@dataclass
class StepProgram:
    spec: ModelSpec
    batch: int
    steps: int
    programs: int
    tiles: Tiles
    splits: dict[str, int]
    tasks: list[Task] = field(default_factory=list)
    tokens: int = 1  # tokens a sequence in each step: 1 for decode steps, k + 1 for a verify pass

    @property
    def rows(self) -> int:
        """Activation rows of a step: sequence b's token t is row b * tokens + t."""
        return self.batch * self.tokens

    def of_program(self, p: int) -> list[Task]:
        return [t for t in self.tasks if t.program == p]

    def producers(self) -> dict[str, list[Task]]:
        """Counter -> the tasks that bump it once each (a `head_tiles` counter's last bump also
        bumps `token`: see simulate)."""
        out: dict[str, list[Task]] = defaultdict(list)
        for t in self.tasks:
            out[t.done].append(t)
        return out

    def loads(self, p: int) -> int:
        """Weight tiles (ring slots) program p's loader streams: what its compute partition consumes."""
        return sum((t.k_range[1] - t.k_range[0]) // self.tiles.k for t in self.of_program(p)
                   if t.op not in ("attn", "embed"))


class ProgramError(ValueError):
    """A task table that must not be launched, and why."""


def chunk_keys(n: int, chunk: int, chunks: int, block: int) -> tuple[int, int]:
    """Keys [lo, hi) of an attention task: chunk `chunk` of `chunks` of the n keys, in whole blocks."""
    size = -(-(-(-n // chunks)) // block) * block
    return min(chunk * size, n), min((chunk + 1) * size, n)


def _ranges(total: int, size: int) -> list[tuple[int, int]]:
    return [(lo, min(lo + size, total)) for lo in range(0, total, size)]


def _slices(total: int, splits: int, k: int) -> list[tuple[int, int]]:
    """K cut into `splits` slices of whole k-wide tiles, as even as they come."""
    tiles = -(-total // k)
    bounds = [s * tiles // splits * k for s in range(splits + 1)]
    return [(bounds[s], min(bounds[s + 1], total)) for s in range(splits)]


def _overlapping(ranges: list[tuple[int, int]], lo: int, hi: int) -> list[int]:
    return [i for i, (a, b) in enumerate(ranges) if a < hi and lo < b]


# The shortest K slice, in K tiles: a task's fixed cost (its waits, table reads and the parts counter's
# trip) wants work behind it; but where slices that long leave fewer than a third of the programs a
# task of the op, slices half as long pay. Measured on an H200 (lab/step_dealing/h200_slices.json, in
# one process, each table checked first): qwen25-05b-7b-b8, whose qkv and o_proj kept 20% and 16% of
# the programs busy at 4, 3.179 -> 3.101 ms with both at 2 (its table under this rule); slices of 2
# everywhere lost 2.2% on qwen3-06b-8b-b4 (o_proj 48% busy at 4), were even on llama-1b-8b-b8.
MIN_SLICE_K_TILES = 4
SHORT_SLICE_K_TILES = 2
SHORT_SLICE_BELOW = 1 / 3  # of the programs


def finest_split(tiles: int, k_total: int, k: int, programs: int, min_k_tiles: int | None = None) -> int:
    """The most K slices that keep tiles x slices within the programs and every slice at least
    min_k_tiles weight tiles long; by default MIN_SLICE_K_TILES, or SHORT_SLICE_K_TILES where that
    leaves fewer than SHORT_SLICE_BELOW of the programs a task of the op."""
    def split(shortest: int) -> int:
        return max(1, min(-(-k_total // k) // shortest, programs // max(1, tiles)))

    if min_k_tiles is not None:
        return split(min_k_tiles)
    long = split(MIN_SLICE_K_TILES)
    return split(SHORT_SLICE_K_TILES) if tiles * long < SHORT_SLICE_BELOW * programs else long


MIN_RUN_K_TILES = 2  # the shortest balanced run: a task's fixed cost (waits, staging, arrival) wants work behind it
# Balanced runs cut an op's tiles into more pieces (more partial adds and arrivals before a tile's
# epilogue), which cost more than the K tiles they even out unless they take many off the busiest
# program. Measured on an H100 (lab/step_dealing/h100.json, in one process against round-robin
# dealing): qwen2.5-1.5b's gate_up, 48 -> 26 K tiles, 10.6% faster; 1-13 K tiles fewer elsewhere
# (qwen3-0.6b, qwen2.5-0.5b, llama-3.2-1b) 0.7-5.7% slower. So they replace round-robin dealing only
# where they take at least this many K tiles, and this share, off the busiest program.
BALANCE_MIN_SAVED_K_TILES = 8
BALANCE_MIN_SAVED_SHARE = 0.25
# A task's fixed cost in K tiles streamed: on an H100 a task's work took 0.18 us and each 128 x 64 weight
# tile 0.75 us (a fit over the six examples' ledgers, benchmarks/results/draft_step_h100.json), and
# a task also polls its counter once (about 0.5-1 us even when it is met).
TASK_COST_K_TILES = 1


def balanced_runs(n_tiles: int, k_total: int, k: int, programs: int,
                  min_run: int | None = None) -> list[list[tuple[int, tuple[int, int]]]] | None:
    """An op's n_tiles x K weight tiles (k wide) cut into equal runs, one a program, as stream-K cuts a
    GEMM: the units (tile, K tile) tile by tile, run j the units [j U / n, (j + 1) U / n), split where it
    crosses from one output tile into the next. Each run is [(tile, (k_lo, k_hi)), ...]; None for an op
    without K. So 76 tiles of 14 K tiles on 132 programs take at most 9 K tiles a program, not 14."""
    if not k_total:
        return None
    kt = -(-k_total // k)
    units = n_tiles * kt
    n = min(programs, max(1, units // (min_run or MIN_RUN_K_TILES)))
    bounds = [j * units // n for j in range(n + 1)]
    runs = []
    for lo, hi in zip(bounds, bounds[1:]):
        run, u = [], lo
        while u < hi:
            tile = u // kt
            end = min(hi, (tile + 1) * kt)
            run.append((tile, ((u - tile * kt) * k, min((end - tile * kt) * k, k_total))))
            u = end
        runs.append(run)
    return runs


def _cost(widths: list[int], k: int) -> float:
    """A program's share of one op instance in K tiles streamed, a task counting TASK_COST_K_TILES more."""
    return sum(-(-w // k) + TASK_COST_K_TILES for w in widths)


def _round_robin_cost(tiles: list[tuple[int, list[tuple[int, int]]]], k: int, programs: int) -> float:
    """The most one program takes (`_cost`) when the tiles' slices go task after task round the programs."""
    widths = [hi - lo for _, ranges in tiles for lo, hi in ranges]
    return -(-len(widths) // programs) * _cost([max(widths)], k)


def _balance_pays(round_robin: float, balanced: float) -> bool:
    """Whether balanced runs take enough off the busiest program's share (`_cost`) to pay for their pieces."""
    saved = round_robin - balanced
    return saved >= BALANCE_MIN_SAVED_K_TILES and saved >= BALANCE_MIN_SAVED_SHARE * round_robin


def qkv_tiles(spec: ModelSpec, tiles: Tiles) -> list[tuple[str, int, int]]:
    """qkv's paired tiles: (segment q/k/v, first head, heads). A tile holds the first halves of its
    heads over their second halves, `half` rows each."""
    per_tile = max(1, 2 * tiles.half // spec.head_dim)
    if spec.head_dim > 2 * tiles.half or 2 * tiles.half % spec.head_dim:
        raise ProgramError(f"head_dim {spec.head_dim} does not pair into tiles of 2 x {tiles.half} rows")
    out = []
    for seg, heads in (("q", spec.num_heads), ("k", spec.num_kv_heads), ("v", spec.num_kv_heads)):
        out += [(seg, h, min(per_tile, heads - h)) for h in range(0, heads, per_tile)]
    return out


def build(spec: ModelSpec, batch: int, steps: int, programs: int, tiles: Tiles = Tiles(),
          splits: dict[str, int] | None = None, early_start: bool = True, tokens: int = 1) -> StepProgram:
    """The task table of `steps` decode steps of `spec` for `batch` sequences on `programs` programs,
    or with `tokens` T > 1 of one verify pass: each sequence's T tokens in one step, its queries
    attending causally (a pair's attention task holds all T x group query rows).
    `splits` (op -> K slices) defaults to the finest that fits the programs, and an op whose tiles and
    slices would leave the busiest program many more weight tiles than the rest is cut into balanced
    runs instead (`_balance_pays`);
    with `early_start` a normed op's slices wait only for the x columns they read (their epilogue for
    the whole row)."""
    if tokens < 1 or (tokens > 1 and steps != 1):
        raise ProgramError(f"{tokens} tokens a sequence in {steps} steps: a verify pass (tokens > 1) is one step")
    H, Q, F = spec.hidden_size, spec.q_size, spec.ffn_size
    pairs = qkv_tiles(spec, tiles)
    n_tiles = {"qkv": len(pairs), "o_proj": -(-H // tiles.rows), "gate_up": -(-F // tiles.half),
               "down": -(-H // tiles.rows), "head": -(-spec.vocab_size // tiles.rows)}
    k_total = {"qkv": H, "o_proj": Q, "gate_up": H, "down": F, "head": H}
    splits_given = set(splits or {})  # ops sliced as the caller says, never rebalanced
    splits = {op: finest_split(n_tiles[op], k_total[op], tiles.k, programs) for op in n_tiles} | (splits or {})
    splits.setdefault("attn", max(1, min(16, programs // (batch * spec.num_kv_heads))))
    prog = StepProgram(spec, batch, steps, programs, tiles, splits, tokens=tokens)
    x_tiles = _ranges(H, tiles.rows)  # how embed, o_proj and down write the residual stream
    h_tiles = _ranges(F, tiles.half)
    tasks: list[Task] = []
    pending: list[tuple] = []  # the op instance's tiles, until `deal` makes their tasks
    stage = cursor = 0  # cursor: the program the next dealt task goes to (mod P)

    def add(op, step, layer, tile, out, k_total_op, waits_of, finish, done):
        """One tile's tasks: a task per K slice, waits_of(k_lo, k_hi) naming what a slice reads."""
        n = splits.get(op, 1) if k_total_op or op == "attn" else 1
        if op == "attn":  # key chunks: chunk c of n (the keys are known at run time only: chunk_keys)
            ranges = [(c, n) for c in range(n)]
        else:
            ranges = _slices(k_total_op, n, tiles.k) if k_total_op else [(0, 0)]
        pending.append((op, step, layer, tile, out, waits_of, finish, done, ranges))

    def deal(k_total_op: int = 0) -> None:
        """The op instance's tasks gathered by `add`, onto programs: as sliced, task after task round the
        programs; or, where its tiles and slices would leave the busiest program many more weight tiles
        than the rest (`_balance_pays`), cut afresh into equal runs of K tiles, one run a program
        (`balanced_runs`)."""
        nonlocal cursor
        uniform = [(tile, ranges) for (_, _, _, tile, _, _, _, _, ranges) in pending]
        runs = None if pending[0][0] in splits_given else balanced_runs(len(pending), k_total_op, tiles.k, programs)
        if runs is None or not _balance_pays(_round_robin_cost(uniform, tiles.k, programs),
                                             max(_cost([hi - lo for _, (lo, hi) in run], tiles.k) for run in runs)):
            owner = {}
            for i, (_, ranges) in enumerate(uniform):
                for s in range(len(ranges)):
                    owner[(i, s)] = cursor % programs
                    cursor += 1
            cut = [ranges for _, ranges in uniform]
        else:
            cut, owner = [[] for _ in pending], {}
            for j, run in enumerate(runs):
                for i, k_range in run:
                    owner[(i, len(cut[i]))] = (cursor + j) % programs
                    cut[i].append(k_range)
            cursor += len(runs)
        for i, (op, step, layer, tile, out, waits_of, finish, done) in enumerate(p[:8] for p in pending):
            n = len(cut[i])
            for s, (lo, hi) in enumerate(cut[i]):
                waits = tuple(waits_of(lo, hi)) if early_start or not finish else tuple(finish)
                tasks.append(Task(len(tasks), op, step, layer, tile, s, n, (lo, hi), out, waits,
                                  tuple(finish) if early_start else (),
                                  f"parts/{op}/{step}/{layer}/{tile}" if n > 1 else None,
                                  done, stage, owner[(i, s)]))
        pending.clear()

    def x_waits(name, lo, hi):
        return [(f"{name}/{i}", 1) for i in _overlapping(x_tiles, lo, hi)]

    for step in range(steps):
        x_in = f"x/{step}/0"
        for i, out in enumerate(x_tiles):
            add("embed", step, -1, i, (out,), 0,
                lambda lo, hi: [(f"token/{step - 1}", 1)] if step else [], [], f"{x_in}/{i}")
        deal()
        stage += 1
        for layer in range(spec.num_layers):
            x_all = [(f"{x_in}/{i}", 1) for i in range(len(x_tiles))]
            q_cols = {}
            for i, (seg, head, count) in enumerate(pairs):
                base = {"q": 0, "k": Q, "v": Q + spec.kv_size}[seg] + head * spec.head_dim
                d2 = spec.head_dim // 2
                out = tuple((base + j * spec.head_dim + half * d2, base + j * spec.head_dim + (half + 1) * d2)
                            for half in (0, 1) for j in range(count))
                q_cols[i] = (seg, head, count)
                add("qkv", step, layer, i, out, H, lambda lo, hi, x_in=x_in: x_waits(x_in, lo, hi), x_all,
                    f"qkv/{step}/{layer}/{i}")
            deal(H)
            stage += 1
            group = spec.num_heads // spec.num_kv_heads

            def tile_of(seg, head):
                return next(i for i, (s, h, c) in q_cols.items() if s == seg and h <= head < h + c)

            for b in range(batch):
                for g in range(spec.num_kv_heads):
                    needs = sorted({tile_of("q", h) for h in range(g * group, (g + 1) * group)}
                                   | {tile_of("k", g), tile_of("v", g)})
                    cols = (g * group * spec.head_dim, (g + 1) * group * spec.head_dim)
                    add("attn", step, layer, b * spec.num_kv_heads + g, (cols,), 0,
                        lambda lo, hi, needs=needs, step=step, layer=layer: [(f"qkv/{step}/{layer}/{i}", 1)
                                                                             for i in needs],
                        [], f"attn/{step}/{layer}/{g}")
            deal()
            stage += 1
            head_cols = group * spec.head_dim  # o's columns one KV head's attention writes
            for i, out in enumerate(x_tiles):
                add("o_proj", step, layer, i, (out,), Q,
                    lambda lo, hi, step=step, layer=layer: [(f"attn/{step}/{layer}/{g}", batch)
                                                            for g in range(lo // head_cols, -(-hi // head_cols))],
                    [], f"xm/{step}/{layer}/{i}")
            deal(Q)
            stage += 1
            xm = f"xm/{step}/{layer}"
            xm_all = [(f"{xm}/{i}", 1) for i in range(len(x_tiles))]
            for i, out in enumerate(h_tiles):
                add("gate_up", step, layer, i, (out, (F + out[0], F + out[1])), H,
                    lambda lo, hi, xm=xm: x_waits(xm, lo, hi), xm_all, f"h/{step}/{layer}/{i}")
            deal(H)
            stage += 1
            x_next = f"x/{step}/{layer + 1}"
            for i, out in enumerate(x_tiles):
                add("down", step, layer, i, (out,), F,
                    lambda lo, hi, step=step, layer=layer: [(f"h/{step}/{layer}/{j}", 1)
                                                            for j in _overlapping(h_tiles, lo, hi)],
                    [], f"{x_next}/{i}")
            deal(F)
            stage += 1
            x_in = x_next
        x_all = [(f"{x_in}/{i}", 1) for i in range(len(x_tiles))]
        for i, out in enumerate(_ranges(spec.vocab_size, tiles.rows)):
            add("head", step, -1, i, (out,), H, lambda lo, hi, x_in=x_in: x_waits(x_in, lo, hi), x_all,
                f"head_tiles/{step}")
        deal(H)
        stage += 1
    prog.tasks = tasks
    return prog


def counter_targets(prog: StepProgram) -> dict[str, int]:
    """Every counter's final value: one bump per producer task (per tile: by its last slice); the
    token counter of a step is bumped once, by the head tile that finishes last."""
    counts: dict[str, set] = defaultdict(set)
    for t in prog.tasks:
        counts[t.done].add((t.op, t.layer, t.tile, t.step) if t.op != "attn" else t.tile)
    out = {name: len(v) for name, v in counts.items()}
    for step in range(prog.steps):
        out[f"token/{step}"] = 1
    return out


def _stage_of_counter(prog: StepProgram) -> dict[str, int]:
    stage = {}
    for t in prog.tasks:
        stage[t.done] = max(stage.get(t.done, -1), t.stage)
        if t.op == "head":
            stage[f"token/{t.step}"] = max(stage.get(f"token/{t.step}", -1), t.stage)
    return stage


def check(prog: StepProgram, sms: int) -> None:
    """Raises ProgramError naming the first task or counter that makes the table unsafe to launch."""
    if not 1 <= prog.programs <= sms:
        raise ProgramError(f"{prog.programs} programs: a persistent kernel needs 1 to {sms} (one an SM, all "
                           f"co-resident, or a wait may never end)")
    targets, stage = counter_targets(prog), _stage_of_counter(prog)
    for t in prog.tasks:
        for name, target in t.waits + t.finish_waits:
            if name not in targets:
                raise ProgramError(f"task {t.index} ({t.op}, step {t.step}, layer {t.layer}, tile {t.tile}) waits on "
                                   f"{name}, which no task bumps")
            if target != targets[name]:
                raise ProgramError(f"task {t.index} ({t.op}) waits for {name} >= {target}; its producers bring it "
                                   f"to {targets[name]}")
            if stage[name] >= t.stage:
                raise ProgramError(f"task {t.index} ({t.op}, stage {t.stage}) waits on {name}, bumped in stage "
                                   f"{stage[name]}: not an earlier stage, so the programs could deadlock")
    for p in range(prog.programs):
        stages = [t.stage for t in prog.of_program(p)]
        if stages != sorted(stages):
            raise ProgramError(f"program {p} runs its tasks out of stage order")
    _check_coverage(prog)


def _check_coverage(prog: StepProgram) -> None:
    """Each (op, step, layer) computes every output column once and multiplies every K column once per tile."""
    spec = prog.spec
    width = {"embed": spec.hidden_size, "qkv": spec.qkv_size, "o_proj": spec.hidden_size,
             "gate_up": 2 * spec.ffn_size, "down": spec.hidden_size, "head": spec.vocab_size}
    k_total = {"qkv": spec.hidden_size, "o_proj": spec.q_size, "gate_up": spec.hidden_size, "down": spec.ffn_size,
               "head": spec.hidden_size}
    groups: dict[tuple, list[Task]] = defaultdict(list)
    for t in prog.tasks:
        groups[(t.op, t.step, t.layer)].append(t)
    for (op, step, layer), ts in groups.items():
        where = f"{op} of step {step}, layer {layer}"
        if op == "attn":
            chunks = sorted((t.tile, t.k_range) for t in ts)
            n = ts[0].splits
            if chunks != [(pair, (c, n)) for pair in range(prog.batch * spec.num_kv_heads) for c in range(n)]:
                raise ProgramError(f"{where}: the (sequence, KV head) pairs are not each attended once, "
                                   f"in chunks 0..{n - 1}")
            continue
        cover = [0] * width[op]
        for t in ts:
            if t.split == 0:
                for lo, hi in t.out:
                    for c in range(lo, hi):
                        cover[c] += 1
        if any(c != 1 for c in cover):
            raise ProgramError(f"{where}: output column {next(i for i, c in enumerate(cover) if c != 1)} is "
                               f"computed {cover[next(i for i, c in enumerate(cover) if c != 1)]} times")
        if op == "embed":
            continue
        by_tile: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for t in ts:
            by_tile[t.tile].append(t.k_range)
        for tile, ranges in by_tile.items():
            ranges.sort()
            gaps = any(a[1] != b[0] for a, b in zip(ranges, ranges[1:]))
            if ranges[0][0] != 0 or ranges[-1][1] != k_total[op] or gaps:
                raise ProgramError(f"{where}, tile {tile}: its K slices {ranges} do not cover 0..{k_total[op]} once")


PER_TILE = ("x", "xm", "qkv", "h", "attn")  # counter kinds `build` keeps per tile


def _instance(name: str) -> str:
    """A tile's counter -> its op instance's: x/s/l/i -> x/s/l, attn/s/l/g -> attn/s/l."""
    return name.rsplit("/", 1)[0] if name.split("/", 1)[0] in PER_TILE else name


def coarsen(prog: StepProgram) -> StepProgram:
    """The same tasks with one done counter per op instance (step, layer) instead of one per tile: a
    task waits once for everything of the op it reads (no early start), at the target of all that
    op's tiles. On a GPU each wait is a round trip; the per-tile table's whole-row norm waits are 16
    or more of them in a row."""
    grouped = [replace(t, done=_instance(t.done)) for t in prog.tasks]
    coarse = replace(prog, tasks=grouped)
    targets = counter_targets(coarse)
    tasks = []
    for t in grouped:
        names = sorted({_instance(name) for name, _ in t.waits + t.finish_waits})
        tasks.append(replace(t, waits=tuple((n, targets[n]) for n in names), finish_waits=()))
    return replace(coarse, tasks=tasks)


def step_table(spec: ModelSpec, batch: int, steps: int, programs: int, tiles: Tiles = Tiles(),
               sms: int | None = None, tokens: int = 1) -> StepProgram:
    """The table a step launch runs on a GPU of `sms` SMs (None: no GPU, as many as the programs):
    built, coarsened to per-op-instance counters, and checked. Tables are kept per arguments: a
    search compiles the same one for many plans, and building one takes seconds at real sizes."""
    if programs < 1:
        raise ProgramError(f"{programs} programs: a step launch needs at least one")
    key = (spec, batch, steps, programs, tiles, sms, tokens)
    if key not in _TABLES:
        prog = coarsen(build(spec, batch, steps, programs, tiles, tokens=tokens))
        check(prog, programs if sms is None else sms)
        if len(_TABLES) >= 8:
            _TABLES.pop(next(iter(_TABLES)))
        _TABLES[key] = prog
    return _TABLES[key]


_TABLES: dict[tuple, StepProgram] = {}  # step_table's, newest last (read only once built)
