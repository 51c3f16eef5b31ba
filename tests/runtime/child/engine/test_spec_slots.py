"""The slot scheduler's speculation additions (pure): how many draft tokens fit, and kept drafts."""

from __future__ import annotations

from hydra_node.runtime.child.engine.slots import SlotConfig
from hydra_node.runtime.child.engine.spec_slots import SpeculativeSlots


def decoding(n_ctx=64, max_tokens=20, prompt=(1, 2, 3, 4), n_slots=2, decode_reserve=None):
    s = SpeculativeSlots(SlotConfig(n_slots=n_slots, n_batch=16, n_ctx=n_ctx, decode_reserve=decode_reserve))
    s.submit(7, prompt, max_tokens)
    plan = s.plan()  # admits and prefills the whole prompt
    s.commit(plan, {7: 100})  # the first sampled token
    return s


def test_draft_room_is_bounded_by_max_tokens_context_and_cells():
    s = decoding(max_tokens=5)
    assert s.draft_room(7) == 3  # 1 generated; a round of k emits k + 1 <= 4 more
    assert s.draft_room(99) == 0  # unknown
    s = decoding(n_ctx=8, max_tokens=20)  # prompt 4 + 1 generated: room for 8 - 4 - 1 - 1 = 2
    assert s.draft_room(7) == 2


def test_draft_room_never_takes_cells_another_sequence_holds():
    s = SpeculativeSlots(SlotConfig(n_slots=2, n_batch=16, n_ctx=24, decode_reserve=2))
    s.submit(1, tuple(range(1, 9)), 50)
    s.submit(2, tuple(range(20, 28)), 50)
    plan = s.plan()
    s.commit(plan, {1: 5, 2: 6})
    # reservations: 8 + 2 each = 20 of 24 cells; sequence 1 may use its own spare cell plus the 4 free
    assert s.draft_room(1) == 5  # (10 - (8 + 1)) own spare + (24 - 20) free
    s.plan()
    s.accept(1, [7, 8, 9])  # kept 3 drafts: its reservation grows, the pool shrinks
    assert s.statistics().kv_reserved <= 24


def test_accepted_drafts_count_as_generated_and_cached():
    s = decoding(max_tokens=10)
    plan = s.plan()
    s.accept(7, [101, 102])
    s.commit(plan, {7: 103})
    assert s.committed(7) == (1, 2, 3, 4, 100, 101, 102, 103)
    assert s.kv_by_slot()[s.slot_of(7)] == 7  # prompt 4 + 100, 101, 102 fed; 103 fed next step
    assert s.draft_room(7) == 10 - 4 - 1
