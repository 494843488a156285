"""Move memory (search/moves.py): moves keyed by their patch wherever they are made."""
import math

import pytest

from conjugate.search.moves import LOSS, MERGE_GAIN, WIN, MoveMemory, conflict, move_key

ATOMIC = [{"op": "replace", "path": "/split_reduce/draft", "value": "atomic"}]
TWO = [{"op": "replace", "path": "/tiles/draft/qkv/BLOCK_N", "value": 32},
       {"op": "replace", "path": "/priority", "value": "draft"}]


def test_a_move_is_the_same_whatever_the_order_of_its_operations():
    assert move_key(TWO) == move_key(TWO[::-1])
    assert move_key(TWO) != move_key(TWO[:1])
    assert move_key(ATOMIC) != move_key([{**ATOMIC[0], "value": "ordered"}])


def test_a_move_is_dropped_only_once_it_lost_clearly_in_enough_branches():
    memory = MoveMemory()
    assert not memory.lost_everywhere(ATOMIC, 2)
    memory.add(ATOMIC, -0.03)
    assert not memory.lost_everywhere(ATOMIC, 2)  # once is not enough
    memory.add(ATOMIC, -LOSS / 2)
    assert not memory.lost_everywhere(ATOMIC, 2)  # a loss within the measurements' spread
    memory.add(ATOMIC, -0.02)
    assert not memory.lost_everywhere(ATOMIC, 2)  # the small loss still counts against dropping it
    lost = MoveMemory()
    lost.add(ATOMIC, -0.03)
    lost.add(ATOMIC, -0.01)
    assert lost.lost_everywhere(ATOMIC, 2) and not lost.lost_everywhere(ATOMIC, 0) and not lost.lost_everywhere(TWO, 2)


def test_priors_follow_the_mean_gain_elsewhere_within_bounds():
    memory = MoveMemory()
    assert memory.prior(ATOMIC, 0.4) == 0.4 and memory.note(ATOMIC) == ""
    memory.add(ATOMIC, 0.02)
    assert memory.prior(ATOMIC, 0.4) == pytest.approx(0.4 * math.e)
    assert memory.note(ATOMIC) == " (elsewhere in this run: +2.0% over 1)"
    memory.add(ATOMIC, 0.5)
    assert memory.prior(ATOMIC, 0.4) == pytest.approx(1.6)  # at most 4x
    memory.add(TWO, -0.5)
    assert memory.prior(TWO, 0.4) == pytest.approx(0.1)  # at least a quarter


def test_winners_are_the_moves_that_gained_clearly_largest_first():
    memory = MoveMemory()
    memory.add(ATOMIC, 0.03, "launch", "atomic sums")
    memory.add(ATOMIC, 0.01, "launch", "atomic sums again")  # mean 2%
    memory.add(TWO, WIN / 2, "tiles", "two")  # within the spread: not carried
    third = [{"op": "replace", "path": "/priority", "value": "target"}]
    memory.add(third, 0.05, "streams", "target first")
    memory.add(third, -0.06, "streams", "target first")  # mean -0.5%
    fourth = [{"op": "replace", "path": "/streams", "value": "two"}]
    memory.add(fourth, 0.1, "streams", "two streams")
    winners = memory.winners()
    assert [(w.patch, w.kind, w.rationale) for w in winners] == [(fourth, "streams", "two streams"),
                                                                  (ATOMIC, "launch", "atomic sums")]
    assert winners[1].gain == pytest.approx(0.02)


def test_gainers_are_the_moves_that_gained_and_never_lost_clearly_largest_first():
    memory = MoveMemory()
    small = [{"op": "replace", "path": "/priority", "value": "draft"}]
    memory.add(small, 2 * MERGE_GAIN, "streams", "draft first")  # under WIN: not carried, but merged
    memory.add(ATOMIC, 0.03, "launch", "atomic sums")
    memory.add(TWO, MERGE_GAIN / 2, "tiles", "two")  # within the spread of no gain
    flip = [{"op": "replace", "path": "/streams", "value": "two"}]
    memory.add(flip, 0.05, "streams", "two streams")
    memory.add(flip, -2 * LOSS, "streams", "two streams")  # lost clearly once: not merged
    assert [(m.patch, m.gain) for m in memory.gainers()] == [(ATOMIC, 0.03), (small, 2 * MERGE_GAIN)]
    assert [m.patch for m in memory.winners()] == [ATOMIC, flip]


def test_patches_conflict_where_one_writes_inside_what_the_other_writes():
    pdl_start = [{"op": "replace", "path": "/pdl/draft", "value": {"trigger": "start", "prefetch": False}}]
    pdl_end = [{"op": "replace", "path": "/pdl/draft/trigger", "value": "end"}]
    fuse = [{"op": "add", "path": "/fusions/target/-", "value": "qkv+rope_kv"}]
    fuse_other = [{"op": "add", "path": "/fusions/target/-", "value": "attn_norm+qkv"}]
    no_fusions = [{"op": "replace", "path": "/fusions/target", "value": []}]
    assert conflict(pdl_start, pdl_end) and conflict(pdl_end, pdl_start)
    assert conflict(ATOMIC, ATOMIC) and conflict(TWO, [{"op": "remove", "path": "/priority"}])
    assert not conflict(fuse, fuse_other)  # appends to one list commute
    assert conflict(fuse, no_fusions) and conflict([{"op": "remove", "path": "/fusions/target/0"}], fuse)
    assert not conflict(ATOMIC, TWO) and not conflict(pdl_start, fuse)
    assert conflict([{"op": "replace", "path": "", "value": {}}], ATOMIC)  # the whole plan
    tile = [{"op": "replace", "path": "/tiles/draft/qkv/BLOCK_N", "value": 32}]
    assert conflict([{"op": "move", "from": "/tiles/draft/qkv", "path": "/tiles/draft/o_proj"}], tile)
    assert conflict([{"op": "copy", "from": "/tiles/draft/qkv", "path": "/tiles/draft/o_proj"}], tile)
    assert not conflict([{"op": "copy", "from": "/tiles/draft/down", "path": "/tiles/draft/o_proj"}], tile)
    escaped = [{"op": "replace", "path": "/pairs/a~1b", "value": 1}]  # the key "a/b"
    assert conflict(escaped, [{"op": "remove", "path": "/pairs/a~1b"}])
    assert not conflict(escaped, [{"op": "remove", "path": "/pairs/a"}])
    assert not conflict([{"op": "replace", "path": "/split_reduce/draft", "value": "atomic"}],
                        [{"op": "replace", "path": "/split_reduce/draftx", "value": 1}])  # a prefix, not a parent


def test_the_moves_of_a_merge_that_lost_join_no_later_merge():
    memory = MoveMemory()
    small = [{"op": "replace", "path": "/priority", "value": "draft"}]
    other = [{"op": "replace", "path": "/streams", "value": "two"}]
    for patch in (ATOMIC, small, other):
        memory.add(patch, 2 * WIN)
    merge = ATOMIC + small
    memory.add(merge, -LOSS / 2)
    memory.charge(merge, -LOSS / 2)  # within the spread: no charge
    assert len(memory.gainers()) == 3
    memory.charge(merge, -0.05)
    assert [m.patch for m in memory.gainers()] == [other]  # the merge's own moves out, the rest kept
    assert [m.patch for m in memory.winners()] == [ATOMIC, small, other]  # each may still be carried alone
