"""The continuation planner (hydra_node/routing/continuation.py), pure and property-tested: the
budget, the usage the client sees, which failures continue, and what the resuming request says
(``resume_tokens`` in order, ``resume_skip`` = characters delivered, the seed)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hydra_node.inference import Finished, GenerationError, GenerationRequest, ModelUnavailable, QueueFull, TextDelta
from hydra_node.inference.errors import POISONOUS_CODES, RemoteError
from hydra_node.routing.continuation import CONTINUABLE_CODES, Continuation, derived_seed

LOST = GenerationError("peer gone", code="peer_lost", status=502, retryable=True)


def req(max_tokens: int | None = 64, temperature: float = 0.0, seed: int | None = 7) -> GenerationRequest:
    return GenerationRequest(
        model="m", kind="completion", prompt="hi", max_tokens=max_tokens, temperature=temperature, seed=seed
    )


deltas = st.lists(
    st.tuples(st.text(max_size=6), st.lists(st.integers(0, 2**31 - 1), max_size=3)), min_size=0, max_size=12
)


@given(parts=st.lists(deltas, min_size=1, max_size=4), last=st.integers(0, 20), prompt=st.integers(1, 500))
def test_every_part_s_tokens_and_text_are_resumed_in_order_and_counted_once(parts, last, prompt):
    p = Continuation(req(max_tokens=None), max_continuations=len(parts))
    all_tokens: list[int] = []
    text = ""
    for i, part in enumerate(parts):
        p.start_part(f"h{i}")
        for t, toks in part:
            assert p.relayed(TextDelta(t, tokens=tuple(toks))) == TextDelta(t, tokens=tuple(toks))
            all_tokens += toks
            text += t
        sent_no_ids = bool(p._part_text and not p._part_tokens)
        p.failed_part()
        if sent_no_ids:
            assert not p.decide(LOST).continues  # a host that sends no token ids: never continued
            return
        assert p.decide(LOST).continues
        r = p.resume_request()
        assert r.resume_tokens == tuple(all_tokens) and r.resume_skip == len(text)
    p.start_part("end")
    fin = p.relayed(Finished("stop", prompt_tokens=prompt, completion_tokens=last, cached_tokens=prompt + 3))
    assert isinstance(fin, Finished)
    assert fin.prompt_tokens == prompt  # the prompt once
    assert fin.completion_tokens == len(all_tokens) + last  # every part's tokens
    assert fin.cached_tokens <= fin.prompt_tokens and fin.finish_reason == "stop"
    assert p.served_by_all == tuple(dict.fromkeys([f"h{i}" for i in range(len(parts))] + ["end"]))


@given(max_tokens=st.integers(1, 200), generated=st.integers(0, 250), cap=st.integers(0, 4))
def test_the_budget_is_what_is_left_and_the_continuations_are_bounded(max_tokens, generated, cap):
    p = Continuation(req(max_tokens=max_tokens), max_continuations=cap)
    p.start_part("a")
    p.relayed(TextDelta("x" * generated, tokens=tuple(range(generated))))
    p.failed_part()
    used = 0
    while p.decide(LOST).continues:
        r = p.resume_request()
        used += 1
        assert r.max_tokens == max_tokens - generated >= 1
        p.start_part(f"h{used}")
    assert used == (cap if generated < max_tokens else 0)


def test_more_tokens_than_a_request_may_resume_never_continue():
    p = Continuation(req(max_tokens=None))
    p.start_part("a")
    p.relayed(TextDelta("x", tokens=tuple(range(32769))))
    p.failed_part()
    assert not p.decide(LOST).continues


def test_without_a_budget_the_continuation_has_none_either():
    p = Continuation(req(max_tokens=None))
    p.start_part("a")
    p.relayed(TextDelta("ab", tokens=(1, 2)))
    assert p.resume_request().max_tokens is None


@pytest.mark.parametrize("code", sorted(CONTINUABLE_CODES))
def test_failures_another_host_can_absorb_continue(code):
    p = Continuation(req())
    p.start_part("a")
    p.relayed(TextDelta("a", tokens=(5,)))
    p.failed_part()
    assert p.decide(GenerationError("x", code=code, status=502)).continues


@pytest.mark.parametrize(
    "exc",
    [
        *(RemoteError("runner died", code=c, status=502, retryable=True) for c in sorted(POISONOUS_CODES)),
        GenerationError("bad grammar", code="invalid_grammar", status=400),
        GenerationError("4xx with a continuable code", code="peer_lost", status=409),
        GenerationError("too long", code="context_length_exceeded", status=400),
        GenerationError("internal", code="internal_error", status=500),
        QueueFull("m"),
    ],
)
def test_poisonous_client_and_unknown_failures_never_continue(exc):
    p = Continuation(req())
    p.start_part("a")
    p.relayed(TextDelta("a", tokens=(5,)))
    p.failed_part()
    assert not p.decide(exc).continues


def test_max_continuations_zero_disables():
    p = Continuation(req(), max_continuations=0)
    p.start_part("a")
    p.relayed(TextDelta("a", tokens=(5,)))
    p.failed_part()
    assert not p.decide(ModelUnavailable("gone")).continues


@given(seed=st.integers(0, 2**64 - 1), temp=st.floats(0.01, 2.0), at=st.integers(1, 30))
def test_a_sampled_continuation_gets_a_seed_derived_from_the_seed_and_the_position(seed, temp, at):
    p = Continuation(req(temperature=temp, seed=seed))
    p.start_part("a")
    p.relayed(TextDelta("a" * at, tokens=tuple(range(at))))
    r = p.resume_request()
    assert r.seed == derived_seed(seed, at) and 0 <= r.seed < 2**32
    assert r.temperature == temp


def test_greedy_keeps_its_seed_and_an_unseeded_request_stays_unseeded():
    for r0 in (req(temperature=0.0, seed=11), req(temperature=0.7, seed=None)):
        p = Continuation(r0)
        p.start_part("a")
        p.relayed(TextDelta("ab", tokens=(1, 2)))
        assert p.resume_request().seed == r0.seed


def test_the_resuming_request_keeps_everything_else_and_is_valid_on_the_wire():
    r0 = GenerationRequest(model="m", kind="chat", messages=(("user", "hi"),), max_tokens=10, stop=("END",))
    p = Continuation(r0)
    p.start_part("a")
    p.relayed(TextDelta("Hé", tokens=(3, 4, 5)))
    r = p.resume_request()
    assert GenerationRequest.from_wire(r.to_wire()) == r
    assert (r.messages, r.stop, r.resume_tokens, r.resume_skip, r.max_tokens) == (
        r0.messages,
        ("END",),
        (3, 4, 5),
        2,
        7,
    )


def test_a_plain_stream_s_finished_is_passed_through_untouched():
    p = Continuation(req())
    p.start_part("a")
    fin = Finished("length", prompt_tokens=3, completion_tokens=4, cached_tokens=9, served_by="a")
    assert p.relayed(fin) is fin and p.served_by_all == ("a",)


def test_max_continuations_is_a_scheduler_key_0_to_16():
    from hydra_node.routing.scheduler_config import SchedulerConfig, SchedulerConfigError

    assert SchedulerConfig().max_continuations == 2
    assert SchedulerConfig.from_mapping({"max_continuations": 0}).max_continuations == 0
    for bad in (-1, 17, 1.5, True, "2"):
        with pytest.raises(SchedulerConfigError, match="max_continuations"):
            SchedulerConfig.from_mapping({"max_continuations": bad})
