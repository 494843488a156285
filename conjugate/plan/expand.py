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

With `draft.form: step` the draft is one unit holding all its ops, launched alone before the target
(a Step launch, kernels/step); no draft op can then be pinned into a target launch.

A model's `streamed` kinds (o_proj, down) run as the streamed kernel (a Streamed launch,
kernels/streamed.py) wherever their launch holds the op alone, under the launch's `pdl` like any other;
a launch shared with the other model keeps the tile kernel.

`pdl` marks each launch of a model to start while the kernel before it on its stream ends; an
override's `pdl` sets the trigger of the launches it matches. The finished schedule is checked against
every dependency of both models; its warnings name overrides that match no op, `streamed` kinds no
launch runs streamed, and overrides setting tiles or launch parameters of streamed launches (which
take neither).
"""
from __future__ import annotations

import fnmatch
from dataclasses import asdict, dataclass, field

import networkx as nx

from conjugate.errors import ScheduleError
from conjugate.graph import build_graph
from conjugate.plan.blocks import Override
from conjugate.plan.launch import Launch, One, Packed, Part, Pdl, Split, Step, Streamed
from conjugate.plan.schema import Plan
from conjugate.plan.tiles import DEFAULT_TILES, FAMILY_OF, LAUNCH_BOUNDS
from conjugate.roles import Model
from conjugate.workload import Workload

MAIN_KINDS = ("qkv", "gate_up", "lm_head")  # the op a fused unit is named after
GEMM_KINDS = ("qkv", "o_proj", "gate_up", "down", "lm_head")


STEP = "step"  # the kind of a Step launch's part: the draft's whole phase
STEP_WARPS = 5  # the step kernel's warps: a compute warpgroup and a loader warp
RESIDUAL_GEMMS = ("o_proj", "down")  # GEMMs that add into the residual stream (plan split_reduce)
NORM_KINDS = ("attn_norm", "mlp_norm", "final_norm")  # a fusion "<norm>+<gemm>" folds one into its GEMM


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
        """Plain data; each launch's form says which it is (`"kind": "one" | "step" | "streamed" | "split" |
        "packed"`)."""
        data = asdict(self)
        for launch, out in zip(self.launches, data["launches"]):
            out["form"] = {"kind": type(launch.form).__name__.lower()} | out["form"]
        return data

    def summary(self) -> dict[str, int]:
        return {"launches": len(self.launches), "cross_model": sum(l.cross_model for l in self.launches),
                "bytes": sum(l.bytes for l in self.launches), "flops": sum(l.flops for l in self.launches)}


@dataclass(frozen=True)
class _Unit:
    model: Model
    ops: tuple[str, ...]
    kinds: tuple[str, ...]

    step: bool = False  # the draft's whole phase as one Step launch

    @property
    def kind(self) -> str:
        if self.step:
            return STEP
        return next((k for k in self.kinds if k in MAIN_KINDS), self.kinds[-1])


def _units(graph: nx.DiGraph, model: Model, fusions: tuple[str, ...]) -> list[_Unit]:
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
    for o in plan.cross.overrides:
        if o.pair is not None and _matches(o.match, target):
            allowed = o.pair
    if allowed is not None:
        return allowed
    partners = plan.cross.pairs.get(target.kind, ())
    return "*" in partners or draft.kind in partners


# A draft unit's slot is a sort key: 2j = alone just before target launch j, 2j + 1 = inside it.
def _align(plan: Plan, target: list[_Unit], draft: list[_Unit]) -> list[int]:
    n_t, n_d = len(target), len(draft)
    slots = [2 * n_t] * n_d  # default: alone after the target's last launch
    alignment = plan.cross.alignment
    if alignment == "sequential":
        return [-2] * n_d  # alone, before the whole target
    i = 0
    for j, t_unit in enumerate(target):
        due = (j + 1) * n_d // n_t if alignment == "proportional" else min(i + 1, n_d)
        while i < due:
            if _can_pair(plan, t_unit, draft[i]):
                slots[i], i = 2 * j + 1, i + 1
                break
            if alignment == "greedy":
                break
            slots[i], i = 2 * j, i + 1
    return slots


def _apply_pins(plan: Plan, target: list[_Unit], draft: list[_Unit], slots: list[int]) -> None:
    """Place pinned draft units (`with`) and keep the others in chain order around them."""
    unit_of = {op: i for i, u in enumerate(draft) for op in u.ops}
    pinned: dict[int, int] = {}
    for n, o in enumerate(plan.cross.overrides):
        if o.with_ is None:
            continue
        where = f"$.cross.overrides[{n}]"
        hits = [j for j, u in enumerate(target) if _matches(o.match, u)]
        if len(hits) != 1:
            raise ScheduleError(f"{where}.with: match {o.match!r} must select exactly one target launch, "
                                f"it selects {len(hits)}")
        if o.with_ not in unit_of:
            raise ScheduleError(f"{where}.with: {o.with_!r} is not a draft op of this workload")
        unit = unit_of[o.with_]
        if unit in pinned and pinned[unit] != 2 * hits[0] + 1:
            raise ScheduleError(f"{where}.with: {o.with_!r} is already pinned into another target launch")
        pinned[unit] = 2 * hits[0] + 1
    if len(set(pinned.values())) < len(pinned):
        raise ScheduleError("$.cross.overrides: two draft ops are pinned into the same target launch")
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
    settings = {"interleave": plan.cross.interleave, "operand_layout": plan.cross.operand_layout,
                "tiles": {model: {} for model in Model}}
    launch_overrides: dict[str, int] = {}
    for o in _matching(plan, units):
        settings["interleave"] = o.interleave or settings["interleave"]
        settings["operand_layout"] = o.operand_layout or settings["operand_layout"]
        launch_overrides |= o.launch
        for model in Model:
            for kind, cfg in o.tiles.get(model.value, {}).items():
                settings["tiles"][model][kind] = settings["tiles"][model].get(kind, {}) | cfg
    head = next((u for u in units if u.model == Model.TARGET), units[0])
    head_tiles = plan.model(head.model).tiles.get(head.kind, {}) | settings["tiles"][head.model].get(head.kind, {})
    settings["launch"] = (dict(plan.cross.launch) | {k: v for k, v in head_tiles.items() if k in LAUNCH_BOUNDS}
                          | launch_overrides)
    return settings


def _matching(plan: Plan, units: list[_Unit]) -> list[Override]:
    """The overrides that select a launch holding `units`, in order (later ones win)."""
    return [o for o in plan.cross.overrides if any(_matches(o.match, u) for u in units)]


def _part(plan: Plan, unit: _Unit, settings: dict) -> Part:
    block = plan.model(unit.model)
    tiles = dict(DEFAULT_TILES[FAMILY_OF[unit.kind]])
    tiles |= block.tiles.get(unit.kind, {})
    tiles |= settings["tiles"][unit.model].get(unit.kind, {})
    tiles = {k: v for k, v in tiles.items() if k not in LAUNCH_BOUNDS}
    fused_norms = tuple(sorted(f.split("+")[0] for f in block.fusions if f.split("+")[0] in NORM_KINDS))
    return Part(unit.model, unit.ops, unit.kind, unit.kinds, tiles,
                unit.kind in RESIDUAL_GEMMS and block.reduce == "atomic", fused_norms, "gate_up+down" in block.fusions)


def _launch(plan: Plan, graph: nx.DiGraph, index: int, units: list[_Unit]) -> Launch:
    ops = [graph.nodes[o]["op"] for u in units for o in u.ops]
    stream = "main" if plan.cross.streams == "one" else units[0].model.value
    if units[0].kind == STEP:
        part = Part(Model.DRAFT, units[0].ops, STEP, units[0].kinds, {})
        return Launch(index, Step(part), stream, STEP_WARPS, 1, Pdl.NONE, sum(o.bytes for o in ops),
                      sum(o.flops for o in ops))
    s = _launch_settings(plan, units)
    trigger = _launch_pdl(plan, units)
    form = _form(tuple(_part(plan, u, s) for u in units), s)
    if isinstance(form, One) and form.part.fused == (form.part.kind, ) \
            and form.part.kind in plan.model(form.part.model).streamed:
        form = Streamed(form.part)
    return Launch(index, form, stream, s["launch"]["num_warps"], s["launch"]["num_stages"], Pdl(trigger),
                  sum(o.bytes for o in ops), sum(o.flops for o in ops))


def _form(parts: tuple[Part, ...], settings: dict) -> One | Split | Packed:
    """One part alone; a target and a draft part split by the interleave; two GEMMs packed where the
    operand layout says so (other pairs have no weights to pack)."""
    if len(parts) == 1:
        return One(parts[0])
    pattern, ratio = settings["interleave"].pattern, tuple(settings["interleave"].ratio)
    packed = settings["operand_layout"] == "packed" and all(_is_gemm(p) for p in parts)
    return (Packed if packed else Split)(parts[0], parts[1], pattern, ratio)


def _is_gemm(part: Part) -> bool:
    """Whether a part lowers to a GEMM tile (the fused MLP, gate_up+down, does not)."""
    return part.kind in GEMM_KINDS and not (part.kind == "gate_up" and "down" in part.fused)


def _launch_pdl(plan: Plan, units: list[_Unit]) -> str:
    """The launch's trigger: the last matching override's `pdl`, else its models' (`_pdl`)."""
    chosen = [o.pdl for o in _matching(plan, units) if o.pdl is not None]
    return chosen[-1] if chosen else _pdl(plan, {u.model for u in units})


def _pdl(plan: Plan, models: set[Model]) -> str:
    """A launch's programmatic dependent launch trigger: its model's; a launch shared by both models
    only where both ask for it, released at the end where either says so."""
    chosen = [plan.model(m).pdl for m in sorted(models)]
    if "none" in chosen:
        return "none"
    return "end" if "end" in chosen else "start"


def check_dependencies(graph: nx.DiGraph, launches: tuple[Launch, ...]) -> None:
    """Every op exactly once, after everything it depends on (an earlier launch, or earlier in its own
    fused part). Raises ScheduleError naming both ops of
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
        if lb < la or (lb == la and pb == pa and cb < ca):
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


def _step_unit(graph: nx.DiGraph) -> _Unit:
    ops = tuple(graph.graph["order"][Model.DRAFT])
    return _Unit(Model.DRAFT, ops, tuple(graph.nodes[o]["op"].kind for o in ops), step=True)


def _expand(plan: Plan, workload: Workload, graph: nx.DiGraph) -> Schedule:
    target = _units(graph, Model.TARGET, plan.model(Model.TARGET).fusions)
    if plan.model(Model.DRAFT).form == STEP:
        pins = [n for n, o in enumerate(plan.cross.overrides) if o.with_ is not None]
        if pins:
            raise ScheduleError(f"$.cross.overrides[{pins[0]}].with: the draft runs as one step launch "
                                "(draft.form \"step\"), so none of its ops can be pinned into a target launch")
        draft = [_step_unit(graph)]
        slots = _align(plan, target, draft)
    else:
        draft = _units(graph, Model.DRAFT, plan.model(Model.DRAFT).fusions)
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
    launches = tuple(_launch(plan, graph, n, units) for n, units in enumerate(groups))
    check_dependencies(graph, launches)
    return Schedule(plan.hash, workload.name, plan.cross.streams, plan.cross.capture, launches,
                    _unmatched_overrides(plan, target + draft) + _streamed_unused(plan, launches)
                    + _set_on_streamed(plan, launches), _priority(plan), _sm_limits(plan))


def _priority(plan: Plan) -> str:
    """The model whose stream the GPU serves first ("none": neither)."""
    return next((m.value for m in Model if plan.model(m).stream.priority == "high"), "none")


def _sm_limits(plan: Plan) -> tuple[tuple[str, int], ...]:
    """(model, SMs its stream may use) for each model whose stream is limited."""
    return tuple((m.value, plan.model(m).stream.sms) for m in Model if plan.model(m).stream.sms)


def _streamed_unused(plan: Plan, launches: tuple[Launch, ...]) -> tuple[str, ...]:
    """A model's `streamed` kinds that no launch runs as the streamed kernel, and why."""
    out = []
    for model in Model:
        ran = {l.form.part.kind for l in launches if isinstance(l.form, Streamed) and l.form.part.model == model}
        for kind in plan.model(model).streamed:
            if kind not in ran:
                why = ("the draft runs as one step launch" if plan.model(model).form == STEP
                       else f"every {kind} is fused into another op or shares its launch with the other model")
                out.append(f"$.{model.value}.streamed: no {kind} runs as the streamed kernel ({why})")
    return tuple(out)


def _set_on_streamed(plan: Plan, launches: tuple[Launch, ...]) -> tuple[str, ...]:
    """Overrides setting tiles or launch parameters of streamed launches, which take neither."""
    out = []
    for n, o in enumerate(plan.cross.overrides):
        hit = [l.ops[0] for l in launches if isinstance(l.form, Streamed)
               and any(fnmatch.fnmatchcase(op, o.match) for op in l.ops)
               and (o.launch or o.tiles.get(l.form.part.model.value, {}).get(l.form.part.kind))]
        if hit:
            out.append(f"$.cross.overrides[{n}]: {o.match!r} sets tiles or launch parameters of {len(hit)} "
                       f"launch(es) run by the streamed kernel ({hit[0]}{', ...' if len(hit) > 1 else ''}), "
                       "which takes neither")
    return tuple(out)


def _unmatched_overrides(plan: Plan, units: list[_Unit]) -> tuple[str, ...]:
    return tuple(f"$.cross.overrides[{n}].match: {o.match!r} matches no op of this workload"
                 for n, o in enumerate(plan.cross.overrides) if not any(_matches(o.match, u) for u in units))
