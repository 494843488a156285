"""Ticket-ordered persistent launches (plan `persist.<model>.order: tickets`): a layer's or a step's
parts in one launch whose programs take tiles in dependency order, each tile waiting for the part
before it to be done."""
from __future__ import annotations

import json

import jsonschema
import pytest
import torch

import conjugate  # noqa: F401  (selects the interpreter before triton is imported)
from conjugate.compiler import persist
from conjugate.compiler.codegen import ticket_source
from conjugate.errors import PlanError
from conjugate.plan import validate_plan
from test_persist import FUSED, _streams
from test_round import FAMILIES, ROOT, _round


def _tickets(span: str = "layer", programs: int = 0, **more) -> dict:
    return {"draft": {"span": span, "order": "tickets", "programs": programs, **more}}


def _ticketed(compiled) -> list:
    return [l for l in compiled.launches if l.tickets]


@pytest.mark.parametrize("family,programs", zip(FAMILIES, [0, 1, 3]))
def test_ticket_ordered_layers_compute_the_reference_round(family, programs, tmp_path):
    """One program per tile (0), one program taking every ticket (1), or a few taking them in turn:
    the round equals the reference, and every counter, the ticket counter and the exit counter are
    zero again for the next launch."""
    plan = validate_plan(_streams(persist=_tickets(programs=programs), fusions={"draft": FUSED, "target": FUSED}))
    compiled, _ = _round(family).check(plan, tmp_path)
    ticketed = _ticketed(compiled)
    assert ticketed and all(len(l.parts) > 1 for l in ticketed)
    for launch in ticketed:
        tiles = sum(p.programs for p in launch.parts)
        assert launch.grid == (tiles if programs == 0 else min(programs, tiles))
        assert launch.sync.numel() == persist.ticket_words(len(launch.parts))
        assert int(launch.sync.abs().sum()) == 0
    assert not any(l.persistent for l in compiled.launches if l.stream == "target")


def test_a_ticket_ordered_step_with_preloading_gemms_computes_the_reference_round(tmp_path):
    """A whole decode step on one stream beside a target on barriers: GEMM tiles that preload wait on
    the part before's counter themselves (its word and tile count bound in the call)."""
    plan = validate_plan(_streams(streams="one", persist={"draft": {"span": "step", "order": "tickets",
                                                                     "preload": True},
                                                           "target": {"span": "layer"}}))
    compiled, _ = _round("llama").check(plan, tmp_path)
    launch = _ticketed(compiled)[0]
    waiting = [i for i, p in enumerate(launch.parts) if p.constexprs.get("WAIT") == 3]
    assert waiting and 0 not in waiting
    text = ticket_source(launch.parts).splitlines()
    for i in waiting:
        call = next(line for line in text if line.lstrip().startswith(f"gemm_tile(tile, p{i}_"))
        assert f"part_word(sync, {i - 1}), {launch.parts[i - 1].programs}" in call
    assert all(int(l.sync.abs().sum()) == 0 for l in compiled.launches if l.sync is not None)


def test_ticket_source_deals_tickets_part_by_part_and_waits_for_the_part_before(tmp_path):
    plan = validate_plan(_streams(persist=_tickets()))
    compiled, _ = _round("llama").check(plan, tmp_path)
    parts = _ticketed(compiled)[0].parts
    text = ticket_source(parts, prefetch=frozenset(range(len(parts))))
    lines = text.splitlines()
    ends = [sum(p.programs for p in parts[:i + 1]) for i in range(len(parts))]
    assert "    while ticket" not in text and text.count("take_ticket(sync, ") == 1  # one ticket a program
    assert f"    if ticket < {ends[0]}:" in lines and "    else:" in lines
    for i in range(1, len(parts)):
        assert f"        tile = ticket - {ends[i - 1]}" in lines
        wait = f"        grid_wait(part_word(sync, {i - 1}), {parts[i - 1].programs})  # every tile of part {i - 1} is done"
        assert wait in lines
        prefetched = [j for j, line in enumerate(lines) if line.startswith("        ") and f"_prefetch(tile, p{i}_" in line]
        if parts[i].sig.fn in persist.PREFETCHES:
            assert len(prefetched) == 1 and prefetched[0] < lines.index(wait)  # asked for before the wait
    assert sum("part_done(sync, " in line for line in lines) == len(parts) - 1  # the last part counts no one
    looping = ticket_source(parts, one_each=False)
    assert f"    while ticket < {ends[-1]}:" in looping and looping.count("take_ticket(sync, ") == 2
    assert looping.rstrip().endswith(f"tickets_exit(sync, programs, {len(parts)})")
    with pytest.raises(ValueError, match="two parts or more"):
        ticket_source(parts[:1])
    with pytest.raises(ValueError, match="two parts or more"):
        persist.ticket_words(1)


def test_tickets_need_joined_parts_and_keep_older_plans_hashes():
    plain = validate_plan(_streams(persist={"draft": {"span": "layer"}}))
    assert validate_plan(_streams(persist={"draft": {"span": "layer", "order": "grid"}})).hash == plain.hash
    ticketed = validate_plan(_streams(persist=_tickets()))
    assert ticketed.hash != plain.hash and ticketed["persist"]["draft"]["order"] == "tickets"
    for span in ("none", "launch"):
        with pytest.raises(PlanError) as caught:
            validate_plan(_streams(persist={"draft": {"span": span, "order": "tickets"}}))
        assert caught.value.errors == [f"$.persist.draft.order: 'tickets' orders the parts of a launch that joins "
                                       f"several, so it needs $.persist.draft.span 'layer' or 'step', not {span!r}"]
    with pytest.raises(PlanError) as caught:
        validate_plan(_streams(persist={"draft": {"span": "layer", "order": "dataflow"}}))
    assert caught.value.errors[0].startswith("$.persist.draft.order: ")
    assert caught.value.errors[0].endswith("is not one of grid, tickets")
    schema = json.loads((ROOT / "plans" / "plan.schema.json").read_text())  # what the LLM agents are shown
    jsonschema.validate(ticketed.to_dict(), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(_streams(persist={"draft": {"span": "layer", "order": "dataflow"}}), schema)


def test_tickets_lift_what_barriers_refuse():
    """No program waits for one that is not running: an SM limit and both models persistent on two
    streams are accepted with tickets, refused with grid barriers."""
    both = {"draft": {"span": "layer", "order": "tickets"}, "target": {"span": "layer"}}
    assert validate_plan(_streams(persist=both))["persist"]["target"]["order"] == "grid"
    with pytest.raises(PlanError, match=r"\$\.persist: both models persistent with barriers"):
        validate_plan(_streams(persist={"draft": {"span": "layer"}, "target": {"span": "layer"}}))
    limited = validate_plan(_streams(persist=_tickets(), sm_limit={"draft": 64, "target": 0}))
    assert limited["sm_limit"]["draft"] == 64
    with pytest.raises(PlanError, match=r"\$\.sm_limit\.draft: limits a model persistent with barriers"):
        validate_plan(_streams(persist={"draft": {"span": "layer"}}, sm_limit={"draft": 64, "target": 0}))


def test_two_ticket_ordered_models_on_two_streams_compute_the_reference_round(tmp_path):
    plan = validate_plan(_streams(persist={"draft": {"span": "layer", "order": "tickets"},
                                           "target": {"span": "layer", "order": "tickets", "programs": 2}}))
    compiled, _ = _round("qwen3").check(plan, tmp_path)
    streams = {l.stream for l in _ticketed(compiled)}
    assert streams == {"draft", "target"}
    assert all(int(l.sync.abs().sum()) == 0 for l in _ticketed(compiled))
    assert all(isinstance(l.sync, torch.Tensor) and l.sync.dtype == torch.int32 for l in _ticketed(compiled))


def test_the_heuristic_offers_ticket_order_last_and_every_edit_validates():
    """A draft of separate launches: a ticket-ordered layer among the edits, ranked below every other
    persist edit but the tile loops (both measured slower, the loops more); a persistent draft: the order toggled, back to barriers first; a
    ticket-ordered draft beside an SM limit or a target on barriers: every edit still valid."""
    from conjugate.agents.heuristic import TICKETS_MEASURED, persist_edits
    from conjugate.agents.heuristic_edits import sm_limit_edits
    from conjugate.plan.patch import apply_patch

    plan = validate_plan(_streams())
    edits = persist_edits(plan, sms=132)
    ticket = next(c for c in edits if c.patch[0]["path"] == "/persist/draft"
                  and c.patch[0]["value"].get("order") == "tickets")
    others = [c for c in edits if c is not ticket and c.patch[0]["value"].get("span") != "launch"]
    loops = [c for c in edits if c.patch[0]["value"].get("span") == "launch"]  # tile loops: measured worse still
    assert max(c.score for c in loops) < ticket.score < min(c.score for c in others)
    assert TICKETS_MEASURED in ticket.rationale
    ticketed = validate_plan(apply_patch(plan.to_dict(), ticket.patch))
    assert ticketed["persist"]["draft"] == {"span": "layer", "order": "tickets", "programs": 0, "prefetch": True,
                                            "preload": False}
    back = next(c for c in persist_edits(ticketed, sms=132) if c.patch[0]["path"] == "/persist/draft/order")
    assert back.patch[0]["value"] == "grid" and back.score > ticket.score
    layered = validate_plan(_streams(persist={"draft": {"span": "layer"}}))
    to_tickets = next(c for c in persist_edits(layered, sms=132) if c.patch[0]["path"] == "/persist/draft/order")
    assert to_tickets.patch[0]["value"] == "tickets"
    crowded = validate_plan(_streams(persist={"draft": {"span": "layer", "order": "tickets"},
                                              "target": {"span": "layer"}}, sm_limit={"draft": 64, "target": 0}))
    for candidate in persist_edits(crowded, sms=132) + sm_limit_edits(crowded, 132, None):
        validate_plan(apply_patch(crowded.to_dict(), candidate.patch))


def test_the_ticket_edit_on_a_plan_with_pdl_turns_the_drafts_pdl_off():
    """The shipped best plans release the draft's launches under `pdl`, which a launch of joined parts
    refuses: the edit takes the draft's pdl off with it, so it validates instead of being dropped."""
    from conjugate.agents.heuristic import persist_edits
    from conjugate.plan.patch import apply_patch

    plan = validate_plan(_streams(pdl={"draft": {"trigger": "end"}}))
    ticket = next(c for c in persist_edits(plan, sms=132) if c.patch[0]["path"] == "/persist/draft"
                  and c.patch[0]["value"].get("order") == "tickets")
    made = validate_plan(apply_patch(plan.to_dict(), ticket.patch))
    assert made["persist"]["draft"]["order"] == "tickets" and made["pdl"]["draft"]["trigger"] == "none"
    with pytest.raises(PlanError) as caught:
        validate_plan(_streams(persist=_tickets(), pdl={"draft": {"trigger": "end"}}))
    assert "a launch of joined parts waits for the kernel before it once" in caught.value.errors[0]


def test_plan_explain_names_ticket_ordered_launches(tmp_path):
    from test_search import TINY, cli

    path = tmp_path / "tickets.json"
    path.write_text(json.dumps(_streams(persist=_tickets(programs=6)) | {"name": "tickets"}))
    code, out, err = cli("plan", "explain", path, "--workload", TINY)
    assert code == 0, err
    assert "[tickets: 6 programs" in out  # the table wraps the rest of the cell
    assert "[persistent:" not in out
