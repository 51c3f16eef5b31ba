"""The slot scheduler's side of KV export and import (pure): a free slot holding a prefix is found and
cut to it; an imported prefix is adopted by a free slot within the KV budget and then served by the
prompt cache like any cached prefix."""

from __future__ import annotations

import pytest

from hydra_node.runtime.child.engine.slots import Rejected, SlotConfig, SlotScheduler


def _run(s: SlotScheduler, rid: int, prompt: list[int], out: list[int]) -> None:
    s.submit(rid, prompt, len(out))
    for tok in out:
        s.commit(s.plan(), {rid: tok})
    assert s.idle


def test_holding_finds_a_free_slot_with_the_prefix_and_cuts_its_cache_to_it():
    s = SlotScheduler(SlotConfig(n_slots=2, n_batch=64, n_ctx=64))
    _run(s, 1, [1, 2, 3, 4], [7, 8, 9])
    slot = next(x for x in range(2) if s.resident(x))
    assert s.resident(slot) == (1, 2, 3, 4, 7, 8)  # prompt + generated tokens fed back
    assert s.holding([1, 2, 5]) == -1 and s.holding([]) == -1
    assert s.holding([1, 2, 3, 4]) == slot and s.resident(slot) == (1, 2, 3, 4)
    assert s.holding([1, 2, 3, 4, 7]) == -1  # cut: those cells are gone


def test_an_adopted_prefix_is_served_by_the_prompt_cache():
    s = SlotScheduler(SlotConfig(n_slots=2, n_batch=64, n_ctx=64))
    slot, evicted = s.adopt([5, 6, 7, 8])
    assert evicted == [] and s.resident(slot) == (5, 6, 7, 8) and s.statistics().kv_reserved == 4
    s.submit(1, [5, 6, 7, 8], 2)
    plan = s.plan()
    assert plan.admitted[0].slot == slot and plan.admitted[0].reused == 3  # the last token is evaluated
    assert plan.prefill[0].start == 3 and plan.prefill[0].length == 1
    assert s.statistics().prefix_hits == 1


def test_adopt_evicts_cached_prefixes_only_to_make_room_and_never_a_pending_eviction_of_itself():
    s = SlotScheduler(SlotConfig(n_slots=2, n_batch=64, n_ctx=20, decode_reserve=1))
    _run(s, 1, list(range(1, 11)), [50])  # slot A caches 10 tokens
    _run(s, 2, list(range(100, 106)), [60])  # slot B caches 6 tokens (a miss: other prefix)
    a = next(x for x in range(2) if len(s.resident(x)) == 10)
    slot, evicted = s.adopt(list(range(200, 208)))  # 8 cells: the oldest cache (A) makes room
    assert slot == a and evicted == [a] and s.resident(slot) == tuple(range(200, 208))
    assert s.statistics().kv_reserved == 8 + 6
    with pytest.raises(Rejected) as err:
        s.adopt(list(range(300, 320)))  # not below the context
    assert err.value.code == "context_length_exceeded"


def test_adopt_refuses_when_every_slot_is_busy_or_the_cache_is_off():
    s = SlotScheduler(SlotConfig(n_slots=1, n_batch=64, n_ctx=64))
    s.submit(1, [1, 2, 3], 5)
    s.plan()
    with pytest.raises(Rejected) as err:
        s.adopt([4, 5])
    assert (err.value.code, err.value.status) == ("no_free_slot", 503)
    for cfg in (
        SlotConfig(n_slots=1, n_batch=8, n_ctx=64, prompt_cache=False),
        SlotConfig(n_slots=1, n_batch=8, n_ctx=64, max_cached=0),
    ):
        with pytest.raises(Rejected) as err:
            SlotScheduler(cfg).adopt([4, 5])
        assert err.value.code == "prompt_cache_disabled"


def test_adopt_respects_max_cached_by_dropping_the_oldest_other_cache():
    s = SlotScheduler(SlotConfig(n_slots=2, n_batch=64, n_ctx=64, max_cached=1))
    _run(s, 1, [1, 2, 3], [9])
    held = next(x for x in range(2) if s.resident(x))
    slot, evicted = s.adopt([4, 5, 6])
    assert slot != held and evicted == [held] and s.resident(held) == ()
    s.forget(slot)
    assert s.resident(slot) == ()
