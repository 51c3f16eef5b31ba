"""The prompt cache's bookkeeping (pure): tiers LRU by bytes, the longest-prefix lookup, what is worth
saving; and the slot scheduler's side: the prefixes a plan gives up are listed for saving, and an
admission is planned from a tier hit when it beats every slot (docs/prompt-cache.md)."""

from __future__ import annotations

import pytest

from hydra_node.runtime.child.engine.prompt_store import LruBytes, PromptStore, TierHit, prompt_key
from hydra_node.runtime.child.engine.slots import SlotConfig, SlotScheduler


def test_a_tier_evicts_the_least_recently_used_by_bytes_and_refuses_what_cannot_fit():
    t: LruBytes[str] = LruBytes(100)
    assert t.put("a", (1,), 40, "A") == [] and t.put("b", (2,), 40, "B") == []
    t.touch("a")  # b is now the least recently used
    assert t.put("c", (3,), 40, "C") == [("b", "B")]
    assert t.keys() == ["a", "c"] and t.bytes == 80
    assert t.put("d", (4,), 101, "D") == [("d", "D")] and "d" not in t  # larger than the whole tier
    assert t.put("a", (1,), 61, "A2") == [("c", "C")] and t.bytes == 61  # a replaced, c out for room
    assert LruBytes(0).put("x", (1,), 1, 0) == [("x", 0)]  # 0 disables the tier
    with pytest.raises(ValueError):
        LruBytes(-1)


def test_lookup_finds_the_longest_common_prefix_and_only_when_it_beats_the_slots_by_min_tokens():
    s: PromptStore[str] = PromptStore(ram_bytes=1000, disk_bytes=1000, min_tokens=4)
    a = tuple(range(1, 21))  # 20 tokens
    s.ram.put(prompt_key(a), a, 10, "A")
    s.disk.put(prompt_key(a[:12]), a[:12], 10, 10)
    prompt = a[:15] + (99, 98)
    assert s.lookup(prompt, limit=len(prompt) - 1, better_than=0) == TierHit(prompt_key(a), "ram", 15, 20)
    assert s.lookup(prompt, limit=10, better_than=0).common == 10  # at most ``limit`` tokens used
    assert s.lookup(prompt, limit=16, better_than=12) is None  # a slot holds 12: a gain of 3 < 4
    assert s.lookup((7, 8, 9, 10, 11), limit=4, better_than=0) is None
    assert s.statistics().misses == 2
    s.restored(TierHit(prompt_key(a), "ram", 15, 20), True)
    st = s.statistics()
    assert (st.hits_ram, st.hits_disk, st.restored_tokens, st.ram_entries, st.disk_entries) == (1, 0, 15, 1, 1)


def test_a_state_is_worth_saving_only_when_long_losing_enough_and_not_covered_by_an_entry():
    s: PromptStore[str] = PromptStore(ram_bytes=1000, disk_bytes=0, min_tokens=4)
    long = tuple(range(1, 11))
    assert not s.worth_saving((1, 2, 3), 0)  # shorter than min_tokens
    assert not s.worth_saving(long, 8)  # the slot keeps 8 of its 10 tokens: 2 lost < 4
    assert s.worth_saving(long, 0)
    s.ram.put(prompt_key(long), long, 10, "L")
    assert not s.worth_saving(long[:6], 0)  # an entry already starts with them
    assert s.superseded(long + (11, 12), "ram") == [prompt_key(long)]  # a longer state serves its prompts
    assert s.superseded((1, 2, 9), "ram") == []
    assert not PromptStore(0, 0, 4).worth_saving(long, 0)  # both tiers off


def _finish(s: SlotScheduler, rid: int, prompt: list[int], out: list[int]) -> int:
    s.submit(rid, prompt, len(out))
    slot = -1
    for tok in out:
        plan = s.plan()
        slot = plan.admitted[0].slot if plan.admitted else slot
        s.commit(plan, {rid: tok})
    assert s.idle
    return slot


class _Tiers:
    def __init__(self, store: PromptStore) -> None:
        self.store = store

    def lookup(self, prompt, limit, better_than):
        return self.store.lookup(prompt, limit, better_than)


def test_a_slot_reused_for_another_prompt_lists_its_prefix_and_a_tier_hit_is_planned_as_a_restore():
    s = SlotScheduler(SlotConfig(n_slots=1, n_batch=64, n_ctx=64, min_shared_tokens=4))
    store: PromptStore[str] = PromptStore(1000, 0, min_tokens=4)
    s.tiers = _Tiers(store)
    a = list(range(1, 21))
    _finish(s, 1, a, [50, 51])
    assert s.take_dropped() == []  # nothing lost yet: the slot still caches A
    _finish(s, 2, list(range(100, 120)), [60])  # B takes the only slot: A's 21 cells are given up
    dropped = s.take_dropped()
    assert dropped == [(0, (*a, 50), 0)]
    store.ram.put(prompt_key(dropped[0][1]), dropped[0][1], 10, "A")  # what the engine saves

    s.submit(3, a, 4)  # A again: the tier holds 20 of its tokens, the slot none
    plan = s.plan()
    adm = plan.admitted[0]
    assert adm.restore == TierHit(prompt_key((*a, 50)), "ram", 19, 21) and adm.reused == 19
    assert plan.prefill[0].start == 19 and plan.prefill[0].length == 1  # only the last prompt token
    assert s.take_dropped() == [(0, (*range(100, 120),), 0)]  # B's cells make way (a restore drops all)
    assert s.statistics().prefix_reused_tokens == 19


def test_a_failed_restore_is_prefilled_from_the_start_and_a_short_gain_is_not_restored():
    s = SlotScheduler(SlotConfig(n_slots=1, n_batch=64, n_ctx=64, min_shared_tokens=4))
    store: PromptStore[str] = PromptStore(1000, 0, min_tokens=4)
    s.tiers = _Tiers(store)
    a = tuple(range(1, 21))
    store.ram.put(prompt_key(a), a, 10, "A")
    s.submit(1, list(a), 2)
    plan = s.plan()
    assert plan.admitted[0].restore is not None
    s.unrestore(1)  # the engine could not load it
    s.commit(plan.__class__(plan.admitted), {})  # that step's prefill chunk was dropped
    again = s.plan()
    assert again.prefill[0].start == 0 and again.prefill[0].length == 20

    t = SlotScheduler(SlotConfig(n_slots=1, n_batch=64, n_ctx=64, min_shared_tokens=4))
    t.tiers = _Tiers(store)
    _finish(t, 1, list(a[:18]) + [70, 71], [5])  # the slot itself caches 18 tokens of A
    t.submit(2, list(a), 2)
    assert t.plan().admitted[0].restore is None  # the tier would add 1 token: not worth it


def test_an_import_and_an_untrusted_cache_leave_nothing_to_save():
    s = SlotScheduler(SlotConfig(n_slots=2, n_batch=64, n_ctx=24, decode_reserve=1, max_cached=1))
    s.tiers = _Tiers(PromptStore(1000, 0, min_tokens=1))
    _finish(s, 1, list(range(1, 11)), [50])
    _finish(s, 2, list(range(100, 108)), [60])  # max_cached 1: the first slot's cache goes
    assert [d[1][0] for d in s.take_dropped()] == [1]
    s.adopt(list(range(200, 215)))  # evicts the other cache to make room: the import drops it at once
    assert s.take_dropped() == []
    s.forget_resident()
    assert s.take_dropped() == [] and s.held() == []


def test_the_prompt_cache_figures_cross_the_channel_and_reach_metrics():
    import dataclasses

    from hydra_node.admin.metrics import MetricsSources, NodeMetrics, RunnerSample
    from hydra_node.routing.router import RouterStatistics
    from hydra_node.runtime.child.channel import FrameDecoder, encode_frame, engine_stats_from_wire
    from hydra_node.runtime.child.stats import EngineStatistics

    st = EngineStatistics(
        n_slots=2, ctx_per_slot=512, steps=4, batch_last=1, batch_mean=1.0, active=0, waiting=0, free_slots=2,
        kv_used=0, kv_budget=512, prefill_tokens_per_s=1.0, decode_tokens_per_s=1.0, prefix_hits=1,
        prefix_misses=1, prefix_reused_tokens=9,
    )  # fmt: skip
    st = dataclasses.replace(
        st, prompt_cache_hits_ram=2, prompt_cache_hits_disk=1, prompt_cache_restored_tokens=3000,
        prompt_cache_disk_bytes=5 << 30, prompt_cache_disk_entries=7, prompt_cache_failures=1,
    )  # fmt: skip
    dec = FrameDecoder()
    dec.receive_data(encode_frame(st.to_wire()))
    assert engine_stats_from_wire(dec.next_message()) == st  # 5 GiB: a total, past 2**31
    sample = RunnerSample("m1", 0, 0, 0.0, 0, True, engine=st)
    text = (
        NodeMetrics(
            MetricsSources(http_requests=dict, runners=lambda: [sample], routing=lambda: RouterStatistics(0, 0))
        )
        .render()
        .decode()
    )
    assert 'hydra_prompt_cache_hits_total{model="m1",tier="disk"} 1.0' in text
    assert 'hydra_prompt_cache_restored_tokens_total{model="m1"} 3000.0' in text
    assert 'hydra_prompt_cache_bytes{model="m1",tier="disk"} 5.36870912e+09' in text
