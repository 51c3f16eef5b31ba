"""The slot scheduler: admission, chunked prefill, fairness, cancellation, KV accounting."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from hydra_node.runtime.child.engine.slots import Finish, Rejected, SlotConfig, SlotScheduler, StepPlan


def run_step(s: SlotScheduler, plan: StepPlan, token: int = 7) -> list:
    """What the engine does: every row with logits samples one token."""
    sampled = {d.rid: token for d in plan.decode}
    sampled.update({c.rid: token for c in plan.prefill if c.last})
    return s.commit(plan, sampled)


def test_config_refuses_more_slots_than_batch_rows():
    with pytest.raises(ValueError, match="n_batch"):
        SlotConfig(n_slots=8, n_batch=4, n_ctx=512)
    with pytest.raises(ValueError, match="n_slots"):
        SlotConfig(n_slots=0, n_batch=4, n_ctx=64)


def test_prompt_as_long_as_the_whole_context_is_rejected():
    s = SlotScheduler(SlotConfig(n_slots=2, n_batch=8, n_ctx=32))
    s.submit(1, list(range(31)), 4)  # longer than n_ctx / n_slots, shorter than n_ctx: taken
    with pytest.raises(Rejected) as e:
        s.submit(2, list(range(32)), 4)
    assert e.value.code == "context_length_exceeded" and e.value.status == 400
    assert "32 tokens (ctx_size" in str(e.value)


def test_long_prompt_is_chunked_and_decoders_keep_going():
    s = SlotScheduler(SlotConfig(n_slots=2, n_batch=8, n_ctx=200, prompt_cache=False))
    s.submit(1, [1, 2, 3], 50)
    p = s.plan()
    assert [c.length for c in p.prefill] == [3] and p.prefill[0].last
    run_step(s, p)
    s.submit(2, list(range(40)), 5)  # a long prompt arrives while 1 decodes
    lengths = []
    for _ in range(6):  # 40 prompt tokens, 7 rows of room per step: 7+7+7+7+7+5
        p = s.plan()
        assert [d.rid for d in p.decode] == [1]  # never stalled
        assert p.n_tokens <= 8
        lengths.append(p.prefill[0].length)
        assert p.prefill[0].last == (len(lengths) == 6)
        run_step(s, p)
    assert lengths == [7, 7, 7, 7, 7, 5]
    p = s.plan()
    assert {d.rid for d in p.decode} == {1, 2}


def test_max_tokens_and_context_end_finish_with_length():
    s = SlotScheduler(SlotConfig(n_slots=1, n_batch=4, n_ctx=6, prompt_cache=False))
    s.submit(1, [1, 2, 3, 4], 100)  # room for 2 tokens: 6 - 4
    assert run_step(s, s.plan()) == []
    assert run_step(s, s.plan()) == [(1, Finish.LENGTH)]
    assert s.idle


def test_cancelled_sequence_leaves_at_next_plan_and_frees_its_slot():
    s = SlotScheduler(SlotConfig(n_slots=1, n_batch=4, n_ctx=64))
    s.submit(1, [1, 2], 10)
    s.submit(2, [3, 4], 10)
    run_step(s, s.plan())
    assert s.cancel(1)
    p = s.plan()
    assert p.finished == ((1, Finish.CANCELLED),)
    assert [a.rid for a in p.admitted] == [2] and not any(d.rid == 1 for d in p.decode)
    assert not s.cancel(99)


def test_prompt_cache_reuses_the_common_prefix_of_a_released_slot():
    s = SlotScheduler(SlotConfig(n_slots=2, n_batch=16, n_ctx=128))
    s.submit(1, [5, 6, 7, 8], 2)
    run_step(s, s.plan(), token=9)
    assert run_step(s, s.plan(), token=10) == [(1, Finish.LENGTH)]
    slot = next(i for i in range(2) if s.resident(i))
    assert s.resident(slot) == (5, 6, 7, 8, 9)  # 10 was sampled but never fed
    s.submit(2, [5, 6, 7, 8, 9, 1], 2)
    p = s.plan()
    assert p.admitted[0].slot == slot and p.admitted[0].reused == 5
    assert p.prefill[0].start == 5 and p.prefill[0].length == 1
    s.submit(3, [5, 6], 2)  # identical to a prefix: one token is still evaluated
    s.finish(2)
    p = s.plan()
    assert p.admitted[0].reused == 1


def test_a_sequence_ended_by_its_first_sample_keeps_the_prompt_it_just_prefilled():
    # the engine finishes a sequence during the step (end of generation on its first token), before
    # the step's commit: the chunk that step prefilled is in the cells and must stay cached
    s = SlotScheduler(SlotConfig(n_slots=2, n_batch=4, n_ctx=128))
    s.submit(1, list(range(1, 11)), 5)
    plans = [s.plan()]
    run_step(s, plans[0])
    plans.append(s.plan())
    run_step(s, plans[1])
    last = s.plan()
    assert last.prefill[0].last and last.prefill[0].start == 8
    s.finish(1)  # in the step, as BatchEngine._finish_in_step: nothing of it was committed
    s.commit(last, {})
    slot = next(i for i in range(2) if s.resident(i))
    assert s.resident(slot) == tuple(range(1, 11))  # was (1..8): the last chunk's cells lost to the cache
    s.submit(2, list(range(1, 11)) + [42], 2)
    assert s.plan().admitted[0].reused == 10


def test_a_sequence_failed_before_its_decode_keeps_only_what_was_computed():
    s = SlotScheduler(SlotConfig(n_slots=1, n_batch=4, n_ctx=128))
    s.submit(1, list(range(1, 11)), 5)
    run_step(s, s.plan())
    plan = s.plan()
    s.finish(1, decoded=False)  # e.g. its image rows could not be had: this step decoded nothing of it
    s.commit(plan, {})
    assert s.resident(0) == (1, 2, 3, 4)


def test_waiting_queue_is_bounded():
    s = SlotScheduler(SlotConfig(n_slots=1, n_batch=4, n_ctx=64, max_waiting=1))
    s.submit(1, [1], 5)
    s.submit(2, [1], 5)
    with pytest.raises(Rejected) as e:
        s.submit(3, [1], 5)
    assert e.value.status == 429


ops = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.integers(1, 120), st.integers(1, 40)),
        st.tuples(st.just("cancel"), st.integers(0, 30)),
        st.tuples(st.just("stop"), st.integers(0, 30)),
        st.tuples(st.just("step"), st.just(0)),
    ),
    max_size=120,
)


@settings(max_examples=200, deadline=None)
@given(
    n_slots=st.integers(1, 8),
    extra=st.integers(0, 64),
    ctx=st.integers(2, 256),
    ops=ops,
    cache=st.booleans(),
    reserve=st.one_of(st.none(), st.integers(0, 16)),
)
def test_scheduler_invariants(n_slots, extra, ctx, ops, cache, reserve):
    cfg = SlotConfig(
        n_slots=n_slots, n_batch=n_slots + extra, n_ctx=ctx, max_waiting=4, prompt_cache=cache, decode_reserve=reserve
    )
    s = SlotScheduler(cfg)
    cells = [0] * n_slots  # what llama.cpp holds per sequence id, driven only by what the plans tell the engine
    rid = 0
    cancelled: set[int] = set()
    done: set[int] = set()
    for op in [*ops, *[("drain", 0)] * 10_000]:  # then step until idle: no deadlock, invariants all the way
        if op[0] == "drain" and s.idle:
            break
        if op[0] == "submit":
            rid += 1
            try:
                s.submit(rid, [(rid + i) % 50 for i in range(op[1])], op[2])
            except Rejected:
                done.add(rid)
        elif op[0] == "cancel":
            if s.cancel(op[1]):
                cancelled.add(op[1])
        elif op[0] == "stop" and s.is_active(op[1]):
            s.finish(op[1])
            done.add(op[1])
        else:
            before = {r: (seq.prefilled, seq.generated) for r, seq in s._active.items()}
            p = s.plan()
            for r, why in p.finished:
                if why is Finish.CANCELLED:
                    assert r in cancelled
                else:  # the cache ran out: only a sequence decoding past its reservation is cut
                    assert why is Finish.LENGTH and before[r][1] >= 1
                done.add(r)
            for slot in p.evicted:  # the engine: llama_memory_seq_rm(slot, 0, -1)
                assert slot not in {seq.slot for seq in s._active.values()} - {a.slot for a in p.admitted}
                cells[slot] = 0
            for a in p.admitted:  # the engine: llama_memory_seq_rm(slot, reused, -1)
                assert a.reused <= cells[a.slot]
                cells[a.slot] = a.reused
            rows = [d.rid for d in p.decode] + [c.rid for c in p.prefill]
            assert p.n_tokens <= cfg.n_batch  # the batch never overflows
            assert len(rows) == len(set(rows))
            assert not (set(rows) & (cancelled | done))  # finished sequences never reappear
            assert set(rows) == set(s._active)  # every admitted sequence makes progress this step
            slots = [d.slot for d in p.decode] + [c.slot for c in p.prefill]
            assert len(slots) == len(set(slots)) and all(0 <= x < n_slots for x in slots)
            for d in p.decode:  # appended right after the sequence's own cells: nothing is overwritten
                assert d.pos == cells[d.slot] < ctx
                cells[d.slot] += 1
            for c in p.prefill:
                assert c.start == cells[c.slot] and c.start + c.length <= ctx
                cells[c.slot] += c.length
            assert sum(cells) <= ctx  # llama_decode always finds room: the cache never over-commits
            for r, why in run_step(s, p):
                assert why is Finish.LENGTH
                done.add(r)
            for r, (pre, gen) in before.items():
                if r in s._active:
                    seq = s._active[r]
                    assert (seq.prefilled, seq.generated) > (pre, gen)
        st_ = s.statistics()
        assert st_.kv_used <= st_.kv_reserved <= st_.kv_total == ctx  # reservations never over-commit
        for seq in s._active.values():
            assert cells[seq.slot] == seq.kv_used <= seq.reserved
        for slot in range(n_slots):
            if slot not in s.kv_by_slot():
                assert len(s.resident(slot)) == cells[slot]  # a free slot's cells are accounted for
    assert s.idle


def test_a_prompt_longer_than_ctx_over_parallel_is_admitted_while_another_runs():
    s = SlotScheduler(SlotConfig(n_slots=4, n_batch=16, n_ctx=64, prompt_cache=False))
    s.submit(1, [1, 2], 30)
    run_step(s, s.plan())  # 1 decodes
    s.submit(2, list(range(40)), 4)  # 40 > 64 / 4 tokens
    p = s.plan()
    assert [a.rid for a in p.admitted] == [2] and [d.rid for d in p.decode] == [1]
    while s.is_active(2):
        run_step(s, p)
        p = s.plan()
    assert s.is_active(1)  # it never lost its place


def test_two_long_prompts_that_do_not_fit_together_run_one_after_the_other():
    s = SlotScheduler(SlotConfig(n_slots=2, n_batch=8, n_ctx=64, prompt_cache=False))
    s.submit(1, list(range(40)), 4)  # 40 prompt + 3 fed decode cells = 43 reserved
    s.submit(2, list(range(1, 41)), 4)
    s.submit(3, [5], 2)  # queued behind 2: FIFO, no overtaking
    p = s.plan()
    assert [a.rid for a in p.admitted] == [1]
    order = []
    while not s.idle:
        order += [a.rid for a in p.admitted]
        assert p.n_tokens <= 8 and s.statistics().kv_reserved <= 64
        if s.is_active(2):
            assert not s.is_active(1)
        run_step(s, p)
        p = s.plan()
    assert order == [1, 2, 3]


def test_a_full_cache_cuts_the_youngest_sequence_past_its_reservation():
    s = SlotScheduler(SlotConfig(n_slots=2, n_batch=8, n_ctx=32, decode_reserve=2, prompt_cache=False))
    s.submit(1, list(range(10)), 20)  # reserves 10 + 2; needs up to 10 + 19 cells
    s.submit(2, list(range(10)), 20)
    p = s.plan()
    cut = []
    while not s.idle:
        cut += [(r, why) for r, why in p.finished]
        assert s.statistics().kv_reserved <= 32
        run_step(s, p)
        p = s.plan()
    assert cut == [(2, Finish.LENGTH)]  # 2 was admitted last; 1 ran to max_tokens


def test_a_cached_prefix_is_evicted_only_when_a_reservation_needs_its_cells():
    s = SlotScheduler(SlotConfig(n_slots=3, n_batch=8, n_ctx=40, decode_reserve=1))
    s.submit(1, list(range(20)), 2)
    while not s.idle:
        run_step(s, s.plan())
    cached = next(i for i in range(3) if s.resident(i))
    s.submit(2, [9, 9], 2)  # fits beside the 21 cached cells
    p = s.plan()
    assert p.evicted == () and p.admitted[0].slot != cached
    run_step(s, p)
    s.submit(3, list(range(100, 120)), 2)  # 21 + 3 + 21 > 40: the cache must go
    p = s.plan()
    assert p.evicted == (cached,) and [a.rid for a in p.admitted] == [3]


def test_two_long_prompts_share_the_prefill_room_fairly():
    s = SlotScheduler(SlotConfig(n_slots=3, n_batch=9, n_ctx=600, prompt_cache=False))
    s.submit(1, [1], 50)
    run_step(s, s.plan())  # 1 is decoding now
    s.submit(2, list(range(100)), 5)
    s.submit(3, list(range(100)), 5)
    p = s.plan()
    assert [d.rid for d in p.decode] == [1]
    assert sorted(c.length for c in p.prefill) == [4, 4]  # 8 rows of room, split evenly
    run_step(s, p)
    p2 = s.plan()
    assert sum(c.length for c in p2.prefill) == 8


def _prefill(s: SlotScheduler) -> None:
    """Run steps until no sequence is prefilling."""
    for _ in range(100):
        p = s.plan()
        run_step(s, p)
        if not p.prefill:
            return


def test_a_prefix_held_by_a_generating_slot_is_copied_not_recomputed():
    """A shared system prompt: the second request copies the first's cells while the first still runs."""
    system = list(range(100, 180))  # 80 shared tokens
    s = SlotScheduler(SlotConfig(n_slots=2, n_batch=64, n_ctx=1024, min_shared_tokens=32))
    s.submit(1, system + [1, 2, 3], 50)
    _prefill(s)
    assert s.is_active(1)
    s.submit(2, system + [9, 9], 5)
    p = s.plan()
    (a,) = p.admitted
    assert a.copy_from == 0 and a.slot == 1 and a.reused == 80
    assert [(c.start, c.length) for c in p.prefill] == [(80, 2)]  # only the new tokens are evaluated
    st_ = s.statistics()
    assert st_.prefix_shared == 1 and st_.prefix_hits == 1 and st_.prefix_reused_tokens == 80


def test_short_shared_prefixes_and_sharing_off_are_not_copied():
    for cfg in (dict(min_shared_tokens=64), dict(share_prefixes=False, min_shared_tokens=1)):
        s = SlotScheduler(SlotConfig(n_slots=2, n_batch=64, n_ctx=1024, **cfg))
        s.submit(1, list(range(40)) + [1], 50)
        _prefill(s)
        s.submit(2, list(range(40)) + [2], 5)
        (a,) = s.plan().admitted
        assert a.copy_from == -1 and a.reused == 0


def test_max_cached_drops_the_oldest_free_prefix_at_the_next_plan():
    s = SlotScheduler(SlotConfig(n_slots=3, n_batch=64, n_ctx=1024, max_cached=1))
    for rid in (1, 2):
        s.submit(rid, [rid] * 10, 1)
    run_step(s, s.plan())  # both prefill, sample one token and finish with "length"
    assert s.idle and sum(bool(s.resident(x)) for x in range(3)) == 1
    p = s.plan()  # the engine drops the older one's cells now
    assert len(p.evicted) == 1 and not s.resident(p.evicted[0]) and s.resident(1)


@settings(max_examples=60, deadline=None)
@given(
    prompts=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=40), min_size=1, max_size=8),
    min_shared=st.integers(1, 8),
)
def test_copies_only_name_active_slots_and_reuse_what_they_hold(prompts, min_shared):
    s = SlotScheduler(SlotConfig(n_slots=3, n_batch=16, n_ctx=512, min_shared_tokens=min_shared))
    for rid, prompt in enumerate(prompts):
        s.submit(rid, prompt, 3)
        p = s.plan()
        for a in p.admitted:
            if a.copy_from >= 0:
                holder = [r for r in range(rid) if s.is_active(r) and s._active[r].slot == a.copy_from]
                assert holder and a.copy_from != a.slot and a.reused >= min_shared
                assert tuple(s._active[holder[0]].cached()[: a.reused]) == tuple(s.prompt_of(a.rid)[: a.reused])
            assert a.reused < len(s.prompt_of(a.rid))
        for c in p.copies:  # a waiting sibling takes cells its source has computed by now
            holder = [r for r in range(rid + 1) if s.is_active(r) and s._active[r].slot == c.copy_from]
            held = s._active[holder[0]].cached() if holder else s.resident(c.copy_from)
            assert tuple(held[: c.reused]) == tuple(s.prompt_of(c.rid)[: c.reused]) and c.reused >= min_shared
        run_step(s, p)
    st_ = s.statistics()
    assert st_.kv_reserved <= st_.kv_total


def test_siblings_wait_for_a_prefix_being_prefilled_then_copy_it():
    """n > 1 (or a burst of one system prompt): the prompt is evaluated once, the others copy it."""
    prompt = list(range(100, 260))  # 160 tokens
    s = SlotScheduler(SlotConfig(n_slots=3, n_batch=64, n_ctx=2048, min_shared_tokens=32))
    for rid in (1, 2, 3):
        s.submit(rid, prompt + [rid], 8)
    prefilled = {1: 0, 2: 0, 3: 0}
    copies = []
    for _ in range(20):
        p = s.plan()
        copies += list(p.copies)
        for c in p.prefill:
            prefilled[c.rid] += c.length
        run_step(s, p)
    assert prefilled == {1: 161, 2: 1, 3: 1}  # each sibling evaluates only its own last token
    assert {(c.rid, c.reused, c.copy_from) for c in copies} == {(2, 160, 0), (3, 160, 0)}
    st_ = s.statistics()
    assert (st_.prefix_hits, st_.prefix_misses, st_.prefix_shared, st_.prefix_reused_tokens) == (2, 1, 2, 320)


def test_a_sibling_whose_source_is_cancelled_prefills_itself():
    prompt = list(range(100, 260))
    s = SlotScheduler(SlotConfig(n_slots=2, n_batch=64, n_ctx=2048, min_shared_tokens=32))
    s.submit(1, prompt + [1], 8)
    s.submit(2, prompt + [2], 8)
    run_step(s, s.plan())  # 1 prefills 64 of 161; 2 waits
    s.cancel(1)
    prefilled, copies = 0, []
    for _ in range(10):
        p = s.plan()
        copies += list(p.copies)
        prefilled += sum(c.length for c in p.prefill if c.rid == 2)
        run_step(s, p)
    assert copies == [] and prefilled == 161 and s.statistics().prefix_misses == 2
