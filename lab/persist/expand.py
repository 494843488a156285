"""Expansion: plan + workload -> the explicit launch schedule the compiler lowers.

Each model's ops form a chain. Vertical fusions group consecutive ops into units; the alignment
strategy then places each draft unit either alone in a launch or as the draft part of a target
unit's launch:

    sequential    every draft unit alone, then every target unit alone
    proportional  draft units fall due at an even pace along the target chain; a due unit joins the
                  current target launch when `pairs` allows the two kinds, else runs alone before it
    greedy        each target launch takes the next draft unit when `pairs` allows; the rest of the
                  draft runs alone after the target

Overrides (in order, later ones win) select target units by a glob over op ids: `pair` forbids
or forces pairing, `with` pins a draft op's unit into that launch, and tiles, launch parameters,
interleave and operand layout apply to every launch holding a matching op.

`persist` then joins a model's consecutive launches of one decoder layer (span `layer`) or one
decode step (`step`) into one persistent launch: its parts run one after another, each over all
of the launch's programs, a grid-wide barrier between them, or (`order: tickets`) its tiles taken in
dependency order, each waiting for the part before (compiler/persist.py). Launches shared
with the other model are never joined, and with one stream only launches next to each other in the
schedule. Span `launch` joins nothing: each of the model's own launches becomes a tile loop, its
tiles taken in turn by a capped number of programs (`programs`), no barrier, so the other stream
finds SMs free. `pdl` marks each launch of a model (a tile loop too, never a launch with barriers)
to start while the kernel before it on its stream ends; an override's `pdl` sets the trigger or the
prefetch of the launches it matches (the draft's attention prefetching its keys and values while
the launch before it, released at its start, still runs). The finished schedule is checked against
every dependency of both models.
"""
from __future__ import annotations

import fnmatch
from dataclasses import asdict, dataclass, field, replace

import networkx as nx

from conjugate.errors import ScheduleError
from conjugate.graph import build_graph
from conjugate.plan.schema import AHEAD_WHAT, BARRIER_SPANS, PDL_AHEAD, Plan
from conjugate.plan.tiles import DEFAULT_TILES, FAMILY_OF, LAUNCH_BOUNDS
from conjugate.roles import Model
from conjugate.workload import Workload

# Parts one persistent launch may join. Its kernel holds every part inline: compiling for Hopper on
# the CPU (`python -m conjugate.compiler.offline`), llama-3.2-1b's decode step (82 parts) ran past 5
# minutes and qwen3-8b's verify step (291 parts) past 11 without finishing (on an H200 the latter held
# a search's evaluation for over 7 minutes: benchmarks/results/raw/searchers_qwen3_partial_2026-12-02/);
# a layer (2-8 parts) and a tiny model's step (12-27) compile in seconds.
MAX_PERSISTENT_PARTS = 32

MAIN_KINDS = ("qkv", "gate_up", "lm_head")  # the op a fused unit is named after


RESIDUAL_GEMMS = ("o_proj", "down")  # GEMMs that add into the residual stream (plan split_reduce)
NORM_KINDS = ("attn_norm", "mlp_norm", "final_norm")  # a fusion "<norm>+<gemm>" folds one into its GEMM


@dataclass(frozen=True)
class Part:
    """One model's share of a launch: an op, or a fused chain of consecutive ops."""

    model: Model
    ops: tuple[str, ...]
    kind: str  # the unit's main op kind; a fused norm+GEMM is a GEMM part
    fused: tuple[str, ...]  # kinds of every op in the chain
    tiles: dict[str, int]
    atomic_split: bool = False  # a residual GEMM's split-K partials added atomically (plan split_reduce)
    norm_stats: tuple[str, ...] = ()  # norm kinds of the model fused into the next GEMM, which read the row
    # statistics the residual GEMMs write (with atomic split sums, each tile's last split reads its
    # finished rows back for them)
    mlp_fused: bool = False  # the model's MLP is one launch (gate_up+down): with its norm fused too, the o_proj
    # before it copies its finished rows for it (compiler/mlp.py)


@dataclass(frozen=True)
class Launch:
    index: int
    parts: tuple[Part, ...]
    stream: str  # "main" in one-stream mode, else the model's name
    pattern: str
    ratio: tuple[int, int]  # [target, draft] program ratio of the "ratio" pattern
    operand_layout: str
    num_warps: int
    num_stages: int
    bytes: int
    flops: int
    # parts in sequence, a grid-wide barrier between them (plan `persist`); one part: a tile loop
    persistent: bool = False
    programs: int = 0  # a persistent launch's programs; 0: as many as the GPU holds at once
    prefetch: bool = False  # a persistent launch's programs prefetch the next part's weights before a barrier
    preload: bool = False  # its GEMM parts load their first weights into registers, then wait for the barrier
    tickets: bool = False  # its parts' tiles taken in dependency order, each waiting for the part before (persist.py)
    part_launch: tuple[tuple[int, int], ...] = ()  # a persistent launch's parts' own (num_warps, num_stages)
    # programmatic dependent launch (plan `pdl`): where the programs let the next launch start ("none": not
    # launched that way), and whether they prefetch their tile's weights before waiting
    pdl: str = "none"
    pdl_prefetch: bool = False
    pdl_preload: bool = False  # its GEMM tiles load their first weights into registers before the wait

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(op for part in self.parts for op in part.ops)

    @property
    def cross_model(self) -> bool:
        return len({p.model for p in self.parts}) > 1


@dataclass(frozen=True)
class Schedule:
    plan_hash: str
    workload: str
    streams: str
    capture: str
    launches: tuple[Launch, ...]
    warnings: tuple[str, ...] = field(default=())
    priority: str = "none"  # with two streams: the model whose stream the GPU serves first
    sm_limits: tuple[tuple[str, int], ...] = ()  # with two streams: (model, SMs its stream may use), plan `sm_limit`

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> dict[str, int]:
        return {"launches": len(self.launches), "cross_model": sum(l.cross_model for l in self.launches),
                "bytes": sum(l.bytes for l in self.launches), "flops": sum(l.flops for l in self.launches)}


@dataclass(frozen=True)
class _Unit:
    model: Model
    ops: tuple[str, ...]
    kinds: tuple[str, ...]

    @property
    def kind(self) -> str:
        return next((k for k in self.kinds if k in MAIN_KINDS), self.kinds[-1])


def _units(graph: nx.DiGraph, model: Model, fusions: list[str]) -> list[_Unit]:
    """Group the model's op chain into units by the enabled fusions (which may overlap: a chain
    final_norm -> lm_head -> argmax forms when both of its fusions are on)."""
    links = {tuple(f.split("+")) for f in fusions}
    units: list[list] = []
    for op_id in graph.graph["order"][model]:
        kind = graph.nodes[op_id]["op"].kind
        if units and (units[-1][-1][1], kind) in links:
            units[-1].append((op_id, kind))
        else:
            units.append([(op_id, kind)])
    return [_Unit(model, tuple(o for o, _ in u), tuple(k for _, k in u)) for u in units]


def _matches(pattern: str, unit: _Unit) -> bool:
    return any(fnmatch.fnmatchcase(op, pattern) for op in unit.ops)


def _can_pair(plan: Plan, target: _Unit, draft: _Unit) -> bool:
    allowed = None
    for o in plan["overrides"]:
        if "pair" in o and _matches(o["match"], target):
            allowed = o["pair"]
    if allowed is not None:
        return allowed
    partners = plan["pairs"].get(target.kind, [])
    return "*" in partners or draft.kind in partners


# A draft unit's slot is a sort key: 2j = alone just before target launch j, 2j + 1 = inside it.
def _align(plan: Plan, target: list[_Unit], draft: list[_Unit]) -> list[int]:
    n_t, n_d = len(target), len(draft)
    slots = [2 * n_t] * n_d  # default: alone after the target's last launch
    if plan["alignment"] == "sequential":
        return [-2] * n_d  # alone, before the whole target
    i = 0
    for j, t_unit in enumerate(target):
        due = (j + 1) * n_d // n_t if plan["alignment"] == "proportional" else min(i + 1, n_d)
        while i < due:
            if _can_pair(plan, t_unit, draft[i]):
                slots[i], i = 2 * j + 1, i + 1
                break
            if plan["alignment"] == "greedy":
                break
            slots[i], i = 2 * j, i + 1
    return slots


def _apply_pins(plan: Plan, target: list[_Unit], draft: list[_Unit], slots: list[int]) -> None:
    """Place pinned draft units (`with`) and keep the others in chain order around them."""
    unit_of = {op: i for i, u in enumerate(draft) for op in u.ops}
    pinned: dict[int, int] = {}
    for n, o in enumerate(plan["overrides"]):
        if "with" not in o:
            continue
        where = f"$.overrides[{n}]"
        hits = [j for j, u in enumerate(target) if _matches(o["match"], u)]
        if len(hits) != 1:
            raise ScheduleError(f"{where}.with: match {o['match']!r} must select exactly one target launch, "
                                f"it selects {len(hits)}")
        if o["with"] not in unit_of:
            raise ScheduleError(f"{where}.with: {o['with']!r} is not a draft op of this workload")
        unit = unit_of[o["with"]]
        if unit in pinned and pinned[unit] != 2 * hits[0] + 1:
            raise ScheduleError(f"{where}.with: {o['with']!r} is already pinned into another target launch")
        pinned[unit] = 2 * hits[0] + 1
    if len(set(pinned.values())) < len(pinned):
        raise ScheduleError("$.overrides: two draft ops are pinned into the same target launch")
    for i, slot in pinned.items():
        slots[i] = slot
    for i in range(len(slots)):
        if i in pinned:
            continue
        before = [pinned[p] for p in pinned if p < i]
        after = [pinned[p] for p in pinned if p > i]
        if before and slots[i] <= max(before):
            slots[i] = max(before) + 1  # alone, before the next target launch
        if after and slots[i] >= min(after):
            slots[i] = min(after) - 1  # alone, just before the pinned launch


def _launch_settings(plan: Plan, units: list[_Unit]) -> dict:
    """Interleave, layout, launch parameters and tile overrides of the launch holding `units`.
    Launch parameters: plan default < the head part's tile config < overrides (tiles, then launch)."""
    settings = {"interleave": plan["interleave"], "operand_layout": plan["operand_layout"],
                "tiles": {model: {} for model in Model}}
    launch_overrides: dict[str, int] = {}
    for o in plan["overrides"]:
        if not any(_matches(o["match"], u) for u in units):
            continue
        for key in ("interleave", "operand_layout"):
            settings[key] = o.get(key, settings[key])
        launch_overrides |= o.get("launch", {})
        for model in Model:
            for kind, cfg in o.get("tiles", {}).get(model, {}).items():
                settings["tiles"][model][kind] = settings["tiles"][model].get(kind, {}) | cfg
    head = next((u for u in units if u.model == Model.TARGET), units[0])
    head_tiles = plan["tiles"][head.model].get(head.kind, {}) | settings["tiles"][head.model].get(head.kind, {})
    settings["launch"] = plan["launch"] | {k: v for k, v in head_tiles.items() if k in LAUNCH_BOUNDS} | launch_overrides
    return settings


def _part(plan: Plan, unit: _Unit, settings: dict) -> Part:
    tiles = dict(DEFAULT_TILES[FAMILY_OF[unit.kind]])
    tiles |= plan["tiles"][unit.model].get(unit.kind, {})
    tiles |= settings["tiles"][unit.model].get(unit.kind, {})
    tiles = {k: v for k, v in tiles.items() if k not in LAUNCH_BOUNDS}
    model_atomic = plan["split_reduce"][unit.model.value] == "atomic"
    fused_norms = tuple(sorted(f.split("+")[0] for f in plan["fusions"][unit.model] if f.split("+")[0] in NORM_KINDS))
    return Part(unit.model, unit.ops, unit.kind, unit.kinds, tiles, unit.kind in RESIDUAL_GEMMS and model_atomic,
                fused_norms, "gate_up+down" in plan["fusions"][unit.model])


def _launch(plan: Plan, graph: nx.DiGraph, index: int, units: list[_Unit]) -> Launch:
    s = _launch_settings(plan, units)
    ops = [graph.nodes[o]["op"] for u in units for o in u.ops]
    stream = "main" if plan["streams"] == "one" else units[0].model.value
    trigger, ahead = _launch_pdl(plan, units)
    return Launch(index=index, parts=tuple(_part(plan, u, s) for u in units), stream=stream,
                  pattern=s["interleave"]["pattern"], ratio=tuple(s["interleave"]["ratio"]),
                  operand_layout=s["operand_layout"], num_warps=s["launch"]["num_warps"],
                  num_stages=s["launch"]["num_stages"], bytes=sum(o.bytes for o in ops),
                  flops=sum(o.flops for o in ops), pdl=trigger, pdl_prefetch=ahead["prefetch"],
                  pdl_preload=ahead["preload"])


def _launch_pdl(plan: Plan, units: list[_Unit]) -> tuple[str, dict[str, bool]]:
    """The launch's trigger and what it does ahead of its wait ({prefetch, preload}): each key from the
    last matching override's `pdl` that sets it, else its models' (`_pdl`); the models' prefetch and
    preload lapse where the trigger ends up 'none'. Checked once all overrides are folded in, naming
    the override that set the offending key."""
    models = {u.model.value for u in units}
    trigger, ahead = _pdl(plan, models)
    set_by: dict[str, int] = {}
    for n, o in enumerate(plan["overrides"]):
        if "pdl" in o and any(_matches(o["match"], u) for u in units):
            set_by |= {key: n for key in o["pdl"]}
    if "trigger" in set_by:
        trigger = plan["overrides"][set_by["trigger"]]["pdl"]["trigger"]
    for key in PDL_AHEAD:
        if key in set_by:
            ahead[key] = plan["overrides"][set_by[key]]["pdl"][key]
        elif trigger == "none":
            ahead[key] = False
    model = next(iter(models)) if len(models) == 1 else None  # a launch of both models is never joined
    span = plan["persist"][model]["span"] if model else "none"
    if "trigger" in set_by and trigger != "none" and span in BARRIER_SPANS:
        raise ScheduleError(f"$.overrides[{set_by['trigger']}].pdl.trigger: {trigger!r} on {model} launches, which "
                            f"$.persist.{model}.span {span!r} joins behind grid barriers that need every program "
                            f"resident: 'none' there")
    for key in PDL_AHEAD:
        if ahead[key] and trigger == "none":
            raise ScheduleError(f"$.overrides[{set_by[key]}].pdl.{key}: {AHEAD_WHAT[key]} ahead of the wait of a "
                                f"programmatic dependent launch, but the launches it matches end with trigger 'none'")
    return trigger, ahead


def _pdl(plan: Plan, models: set[str]) -> tuple[str, dict[str, bool]]:
    """A launch's programmatic dependent launch: its model's (plan `pdl`); a launch shared by both models
    only where both ask for it, released at the end where either says so, prefetching (preloading)
    where both do."""
    chosen = [plan["pdl"][m] for m in sorted(models)]
    if any(c["trigger"] == "none" for c in chosen):
        return "none", {key: False for key in PDL_AHEAD}
    return (("end" if any(c["trigger"] == "end" for c in chosen) else "start"),
            {key: all(c[key] for c in chosen) for key in PDL_AHEAD})


def _span_key(graph: nx.DiGraph, launch: Launch, span: str) -> tuple | None:
    """The layer (step, layer) or step (step,) a one-model launch belongs to; None when its ops
    straddle two."""
    ops = [graph.nodes[o]["op"] for o in launch.ops]
    keys = {(op.step, op.layer) if span == "layer" else (op.step,) for op in ops}
    return keys.pop() if len(keys) == 1 else None


def _persist(plan: Plan, graph: nx.DiGraph, launches: list[Launch]) -> tuple[Launch, ...]:
    """Join runs of a model's launches per the plan's `persist` (see the module doc); re-indexed."""
    runs: dict[int, list[Launch]] = {}  # first member's position -> the run
    loops: set[int] = set()  # launches of a model with span `launch`: tile loops
    open_run: dict[Model, tuple[tuple, list[Launch]] | None] = {m: None for m in Model}
    for launch in launches:
        model = launch.parts[0].model
        for m in Model:  # a launch of the other model breaks its run where both share one stream;
            # a launch shared by both breaks both models' runs
            shared_by_m = launch.cross_model and m in {p.model for p in launch.parts}
            if (m != model and plan["streams"] == "one") or shared_by_m:
                open_run[m] = None
        span = plan["persist"][model.value]["span"]
        if span == "launch" and not launch.cross_model:
            loops.add(launch.index)
        key = None if launch.cross_model or span in ("none", "launch") else _span_key(graph, launch, span)
        if key is None:
            open_run[model] = None
            continue
        current = open_run[model]
        if current is not None and current[0] == key:
            current[1].append(launch)
        else:
            open_run[model] = (key, [launch])
            runs[launch.index] = open_run[model][1]
    joined = {first: run for first, run in runs.items() if len(run) > 1}
    for run in joined.values():
        parts = sum(len(l.parts) for l in run)
        if parts > MAX_PERSISTENT_PARTS:
            model = run[0].parts[0].model.value
            span = plan["persist"][model]["span"]
            raise ScheduleError(f"$.persist.{model}.span: {span!r} joins {parts} parts of this workload into one "
                                f"persistent launch, at most {MAX_PERSISTENT_PARTS}: each part is compiled inline, "
                                f"and a kernel of that many takes many minutes to compile; use span 'layer'")
    members = {l.index for run in joined.values() for l in run}
    out = []
    for launch in launches:
        if launch.index in joined:
            launch = _joined(plan, joined[launch.index])
        elif launch.index in loops:
            launch = replace(_joined(plan, [launch]), prefetch=False)  # no barrier to prefetch ahead of
        elif launch.index in members:
            continue
        out.append(replace(launch, index=len(out)))
    return tuple(out)


def _joined(plan: Plan, run: list[Launch]) -> Launch:
    first = run[0]
    persist = plan["persist"][first.parts[0].model.value]
    return replace(first, parts=tuple(p for l in run for p in l.parts), persistent=True, operand_layout="separate",
                   programs=persist["programs"], prefetch=persist["prefetch"],
                   preload=persist["preload"] and len(run) > 1,  # a tile loop has no barrier
                   tickets=persist["order"] == "tickets" and len(run) > 1,
                   pdl=first.pdl if len(run) == 1 else "none",  # barriers: never (the plan refuses both)
                   pdl_prefetch=first.pdl_prefetch and len(run) == 1,
                   pdl_preload=False,  # a persistent launch waits once, not in its tiles (codegen)
                   part_launch=tuple((l.num_warps, l.num_stages) for l in run for _ in l.parts),
                   num_warps=max(l.num_warps for l in run), num_stages=max(l.num_stages for l in run),
                   bytes=sum(l.bytes for l in run), flops=sum(l.flops for l in run))


def check_dependencies(graph: nx.DiGraph, launches: tuple[Launch, ...]) -> None:
    """Every op exactly once, after everything it depends on (earlier launch, earlier in its own
    fused part, or an earlier part of a persistent launch). Raises ScheduleError naming both ops of
    the first broken dependency."""
    where: dict[str, tuple[int, int, int]] = {}
    for launch in launches:
        for p, part in enumerate(launch.parts):
            for c, op in enumerate(part.ops):
                if op in where:
                    raise ScheduleError(f"op {op} is scheduled twice (launches {where[op][0]} and {launch.index})")
                where[op] = (launch.index, p, c)
    missing = [op for op in graph.nodes if op not in where]
    if missing:
        raise ScheduleError(f"{len(missing)} ops are never scheduled, first {missing[0]}")
    for before, after in graph.edges:
        (lb, pb, cb), (la, pa, ca) = where[before], where[after]
        if lb < la or (lb == la and pb == pa and cb < ca) or (lb == la and launches[la].persistent and pb < pa):
            continue
        raise ScheduleError(f"launch {la} runs {after} before its dependency {before}"
                            + (f" (launch {lb})" if lb != la else " (same launch, another part)"))


def expand(plan: Plan, workload: Workload, graph: nx.DiGraph | None = None) -> Schedule:
    """The plan's launch schedule on the workload; a ScheduleError names the plan's file when it has one."""
    try:
        return _expand(plan, workload, graph if graph is not None else build_graph(workload))
    except ScheduleError as e:
        if not plan.source or e.source:
            raise
        raise ScheduleError(e.errors[0], plan.source) from e


def _expand(plan: Plan, workload: Workload, graph: nx.DiGraph) -> Schedule:
    target = _units(graph, Model.TARGET, plan["fusions"][Model.TARGET])
    draft = _units(graph, Model.DRAFT, plan["fusions"][Model.DRAFT])
    slots = _align(plan, target, draft)
    _apply_pins(plan, target, draft, slots)
    groups: list[list[_Unit]] = []
    order = sorted(range(len(draft)), key=lambda i: (slots[i], i))
    pending = iter(order)
    next_draft = next(pending, None)
    for j in range(-1, len(target) + 1):
        while next_draft is not None and slots[next_draft] <= 2 * j:
            groups.append([draft[next_draft]])
            next_draft = next(pending, None)
        if 0 <= j < len(target):
            group = [target[j]]
            if next_draft is not None and slots[next_draft] == 2 * j + 1:
                group.append(draft[next_draft])
                next_draft = next(pending, None)
            groups.append(group)
    launches = _persist(plan, graph, [_launch(plan, graph, n, units) for n, units in enumerate(groups)])
    check_dependencies(graph, launches)
    return Schedule(plan.hash, workload.name, plan["streams"], plan["capture"], launches,
                    _unmatched_overrides(plan, target + draft), plan["priority"],
                    tuple((m, n) for m, n in plan["sm_limit"].items() if n))


def _unmatched_overrides(plan: Plan, units: list[_Unit]) -> tuple[str, ...]:
    return tuple(f"$.overrides[{n}].match: {o['match']!r} matches no op of this workload"
                 for n, o in enumerate(plan["overrides"]) if not any(_matches(o["match"], u) for u in units))
