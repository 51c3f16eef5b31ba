"""Image positions in the slot scheduler (pure): a prefill chunk is all text or all image positions,
a prompt must end with text, and the prompt cache compares placeholders by value (docs/vision.md)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from hydra_node.runtime.artifacts.kv_identity import prefix_sha256
from hydra_node.runtime.child.engine.media import is_media, placeholder_ids
from hydra_node.runtime.child.engine.prompt_store import PromptStore, prompt_key
from hydra_node.runtime.child.engine.slots import Finish, Rejected, SlotConfig, SlotScheduler, StepPlan
from hydra_node.runtime.child.engine.speculation import speculation_eligible

IMG_A = placeholder_ids("a" * 64, 6)
IMG_B = placeholder_ids("b" * 64, 6)


def run_step(s: SlotScheduler, plan: StepPlan, token: int = 7) -> list:
    sampled = {d.rid: token for d in plan.decode}
    sampled.update({c.rid: token for c in plan.prefill if c.last})
    return s.commit(plan, sampled)


def kinds(s: SlotScheduler, plan: StepPlan) -> list[tuple[int, int, int, bool]]:
    """(rid, start, length, is media) of every chunk, checking each is one kind of position."""
    out = []
    for c in plan.prefill:
        part = s.prompt_of(c.rid)[c.start : c.start + c.length]
        assert len({is_media(t) for t in part}) == 1, (c, part)
        out.append((c.rid, c.start, c.length, is_media(part[0])))
    return out


def test_a_chunk_is_cut_at_each_boundary_between_text_and_image():
    s = SlotScheduler(SlotConfig(n_slots=1, n_batch=16, n_ctx=128, prompt_cache=False))
    s.submit(1, [1, 2, 3, *IMG_A, 4, 5], 4)  # fits one batch, yet takes three chunks
    got = []
    while (p := s.plan()).prefill:
        got += kinds(s, p)
        run_step(s, p)
    assert got == [(1, 0, 3, False), (1, 3, 6, True), (1, 9, 2, False)]


def test_the_room_a_cut_leaves_goes_to_the_other_prefilling_sequences():
    s = SlotScheduler(SlotConfig(n_slots=2, n_batch=12, n_ctx=256, prompt_cache=False))
    s.submit(1, [1, 2, *IMG_A, 3], 4)
    s.submit(2, list(range(10, 40)), 4)  # a long text prompt beside it
    p = s.plan()
    assert kinds(s, p) == [(1, 0, 2, False), (2, 0, 10, False)]  # 1 stops at its image: 2 takes the rest
    assert p.n_tokens == 12
    run_step(s, p)
    p = s.plan()
    assert (1, 2, 6, True) in kinds(s, p) and p.n_tokens == 12  # the image run is a chunk of its own


def test_a_prompt_must_end_with_a_text_token():
    s = SlotScheduler(SlotConfig(n_slots=1, n_batch=8, n_ctx=64))
    with pytest.raises(Rejected) as e:
        s.submit(1, [1, 2, *IMG_A], 4)
    assert e.value.status == 400 and e.value.code == "invalid_request"
    assert "ends with an image position" in str(e.value)


def test_the_prompt_cache_reuses_a_prefix_through_the_same_image_only():
    s = SlotScheduler(SlotConfig(n_slots=1, n_batch=32, n_ctx=256))
    first = [1, 2, 3, *IMG_A, 4, 5, 6]
    s.submit(1, first, 1)
    while s.is_active(1) or not s.resident(0):
        run_step(s, s.plan())
    assert s.resident(0)[: len(first)] == tuple(first)
    s.submit(2, [*first, 8, 9], 1)  # the same chat, one more turn: the image is not evaluated again
    p = s.plan()
    assert p.admitted[0].reused == len(first) and kinds(s, p) == [(2, len(first), 2, False)]
    run_step(s, p)
    while not s.idle:
        run_step(s, s.plan())
    s.submit(3, [1, 2, 3, *IMG_B, 4, 5, 6], 1)  # another image at the same place
    p = s.plan()
    assert p.admitted[0].reused == 3  # up to the image only
    assert kinds(s, p)[0] == (3, 3, 6, True)


def test_a_prefix_ending_inside_an_image_resumes_with_the_rest_of_it():
    """A cached prefix may end mid-image (the cut it kept): the next chunk is the image's other rows."""
    s = SlotScheduler(SlotConfig(n_slots=1, n_batch=32, n_ctx=256))
    s.submit(1, [1, 2, *IMG_A[:3], 9], 1)  # prompts are lists of ids: a prefix through half an image
    while not s.idle:
        run_step(s, s.plan())
    s.submit(2, [1, 2, *IMG_A, 4], 1)
    p = s.plan()
    assert p.admitted[0].reused == 5
    assert kinds(s, p) == [(2, 5, 3, True)]


def test_prompt_keys_and_speculation_with_image_positions():
    text = (1, 2, 3)
    assert prompt_key(text) == prefix_sha256(text)  # disk tier names are unchanged
    with_image = (1, *IMG_A, 2)
    assert prompt_key(with_image) != prompt_key((1, *IMG_B, 2))  # no ValueError: a RAM tier key
    store: PromptStore[int] = PromptStore(1 << 20, 0, 2)
    store.ram.put(prompt_key(with_image), with_image, 10, 0)
    hit = store.lookup((*with_image, 5, 6), 8, 0)
    assert hit is not None and hit.common == len(with_image)
    assert speculation_eligible({}, True, True) and not speculation_eligible({}, True, True, media=True)


def _prompt(draw_runs: list[tuple[bool, int]], salt: int) -> list[int]:
    out: list[int] = []
    for k, (media, n) in enumerate(draw_runs):
        out += placeholder_ids(f"{salt % 3:064x}{k}", n) if media else [(salt + k + i) % 50 for i in range(n)]
    return out + [salt % 50]  # ends with text


runs = st.lists(st.tuples(st.booleans(), st.integers(1, 9)), min_size=0, max_size=5)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), runs, st.integers(1, 6)),
        st.tuples(st.just("cancel"), st.integers(1, 12), st.just(0)),
        st.tuples(st.just("stop"), st.integers(1, 12), st.just(0)),
        st.tuples(st.just("step"), st.just(()), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(n_slots=st.integers(1, 4), extra=st.integers(0, 12), ctx=st.integers(24, 160), ops=ops, cache=st.booleans())
def test_every_chunk_is_one_kind_and_every_prompt_completes(n_slots, extra, ctx, ops, cache):
    cfg = SlotConfig(n_slots=n_slots, n_batch=n_slots + extra, n_ctx=ctx, max_waiting=4, prompt_cache=cache)
    s = SlotScheduler(cfg)
    cells = [0] * n_slots
    rid, ended, accepted = 0, set(), set()
    for op in [*ops, *[("drain", (), 0)] * 5_000]:
        if op[0] == "drain" and s.idle:
            break
        if op[0] == "submit":
            rid += 1
            try:
                s.submit(rid, _prompt(op[1], rid), op[2])
                accepted.add(rid)
            except Rejected:
                pass
        elif op[0] == "cancel":
            s.cancel(op[1])
        elif op[0] == "stop" and s.is_active(op[1]):
            s.finish(op[1])
            ended.add(op[1])
        elif op[0] in ("step", "drain"):
            p = s.plan()
            ended |= {r for r, _ in p.finished}
            for slot in p.evicted:
                cells[slot] = 0
            for a in (*p.admitted, *p.copies):
                cells[a.slot] = a.reused
            assert p.n_tokens <= cfg.n_batch
            kinds(s, p)  # every chunk all text or all image positions
            for c in p.prefill:
                assert c.start == cells[c.slot]  # in order, nothing skipped
                cells[c.slot] += c.length
                if c.last:
                    assert not is_media(s.prompt_of(c.rid)[-1])  # the row with logits is text
            for d in p.decode:
                assert d.pos == cells[d.slot]
                cells[d.slot] += 1
            for r, why in run_step(s, p):
                assert why is Finish.LENGTH
                ended.add(r)
    assert s.idle and accepted <= ended  # every prompt ran to its end (or was cancelled or stopped)
