"""Pure pieces of a stream's continuation (issue 26 item 1): skipping the text a resumed request's
client already has, and the ``tokens`` of a runner's delta frames reaching ``TextDelta``."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hydra_node.inference.events import MAX_DELTA_LOGPROBS
from hydra_node.inference.errors import POISONOUS_CODES
from hydra_node.runtime.child.channel import RunnerProtocolError, runner_event_from_wire
from hydra_node.runtime.child.textstream import TextAssembler, TextSkip
from hydra_node.runtime.runner.records import RunnerCrashed, RunnerKilled


def test_text_skip_drops_the_first_characters_across_pieces():
    skip = TextSkip(4)
    assert [skip(p) for p in ("ab", "", "cde", "fg")] == ["", "", "e", "fg"]
    assert TextSkip()("abc") == "abc" and TextSkip(1)("日本") == "本"  # characters, not bytes
    with pytest.raises(ValueError):
        TextSkip(-1)


@given(st.lists(st.text(max_size=6), max_size=8), st.integers(min_value=0, max_value=60))
def test_text_skip_is_the_suffix_of_the_whole_text(pieces, n):
    skip = TextSkip(n)
    assert "".join(skip(p) for p in pieces) == "".join(pieces)[n:]


@given(st.lists(st.sampled_from(["a", "b", ", ", "7", "日"]), max_size=12), st.integers(min_value=0, max_value=12))
def test_an_assembler_fed_again_from_the_start_and_skipped_gives_the_rest(pieces, cut):
    """What a resumed runner does: the same assembler output, less what the client already had."""
    stop = (", 7",)
    whole, asm = [], TextAssembler(stop)
    for p in pieces:
        whole.append(asm.feed(p.encode()))
    whole.append(asm.flush())
    cut = min(cut, len(pieces))
    first = TextAssembler(stop)
    had = "".join(first.feed(p.encode()) for p in pieces[:cut])  # delivered before the cut
    again, skip = TextAssembler(stop), TextSkip(len(had))
    rest = [skip(again.feed(p.encode())) for p in pieces] + [skip(again.flush())]
    assert had + "".join(rest) == "".join(whole)


def test_a_delta_frames_tokens_become_the_text_deltas_tokens():
    ev = runner_event_from_wire(
        {"op": "delta", "id": 1, "text": "ab", "tokens": [3, 4]}, queue_wait_ms=0, served_by="n"
    )
    assert ev.tokens == (3, 4)
    assert runner_event_from_wire({"op": "delta", "id": 1, "text": "x"}, queue_wait_ms=0, served_by="n").tokens == ()
    for bad in ([-1], ["1"], [2**31], 5, [True], [0] * (MAX_DELTA_LOGPROBS + 1)):
        with pytest.raises(RunnerProtocolError, match="tokens"):
            runner_event_from_wire({"op": "delta", "id": 1, "text": "", "tokens": bad}, queue_wait_ms=0, served_by="n")


def test_a_lost_head_is_not_poisonous_a_crash_is():
    killed, crashed = RunnerKilled("x"), RunnerCrashed("x")
    assert (killed.code, killed.status, killed.retryable, killed.poisonous) == ("runner_killed", 502, True, False)
    assert crashed.poisonous and "runner_killed" not in POISONOUS_CODES
