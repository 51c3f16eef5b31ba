"""A reasoning sequence's bookkeeping in the engine (engine/reasoning_track.py) and the runner
channel's reading of its frames (channel.py), without a model: token texts as the bundled
model's tokenizer cuts a thinking output, a stand-in tokenizer for the closing text."""

from __future__ import annotations

import pytest

from hydra_node.inference.reasoning import Phase, close_text
from hydra_node.runtime.child.channel import RunnerProtocolError, runner_event_from_wire
from hydra_node.runtime.child.chat_prompt import ReasoningStart
from hydra_node.runtime.child.engine.reasoning_track import ReasoningTrack, budget_of
from hydra_node.runtime.child.engine.sampler_errors import SamplingError

OPENED = ReasoningStart("think", "<|im_start|>assistant\n<think>\n")
MODEL_OPENS = ReasoningStart("think", "<|im_start|>assistant\n")
CLOSED = ReasoningStart("think", "<|im_start|>assistant\n<think>\n\n</think>\n\n")
CLOSE_IDS = {close_text("think", Phase.THINKING): [90, 91, 92], close_text("think", Phase.BEFORE): [80, 81]}
CLOSE_TEXT = {90: "\n</", 91: "think>", 92: "\n\n", 80: "<think>\n\n</think>", 81: "\n\n"}


def tokenize(text: str) -> list[int]:
    return CLOSE_IDS[text]


def drive(track: ReasoningTrack, model: list[str]) -> tuple[str, str, int]:
    """Run the track as the engine does: a forced token when there is one, else the model's next."""
    reasoning, answer, pieces, n = "", "", iter(model), 0
    while True:
        tok = track.forced()
        if tok is not None:
            r, a = track.feed(CLOSE_TEXT[tok], True)
        else:
            text = next(pieces, None)
            if text is None:
                break
            r, a = track.feed(text, False)
        reasoning, answer, n = reasoning + r, answer + a, n + 1
    r, a = track.flush()
    return reasoning + r, answer + a, n


def test_reasoning_tokens_are_the_model_tokens_inside_the_block():
    track = ReasoningTrack(OPENED, None, tokenize)
    reasoning, answer, _ = drive(track, ["Paris", " is", " the", " capital", ".\n", "</think>", "\n\n", "Paris", "."])
    assert (reasoning, answer, track.tokens) == ("Paris is the capital.", "Paris.", 6)  # its closing tag too


def test_a_spent_budget_closes_the_block_with_forced_tokens_not_counted_as_reasoning():
    track = ReasoningTrack(OPENED, 3, tokenize)
    reasoning, answer, n = drive(track, ["Let", " me", " think", "The", " answer"])
    assert (reasoning, answer) == ("Let me think", "The answer") and track.answering
    assert track.tokens == 3 and n == 3 + 3 + 2  # three thoughts, three forced, two answer tokens


def test_a_zero_budget_closes_at_once_or_writes_an_empty_block():
    track = ReasoningTrack(OPENED, 0, tokenize)
    assert drive(track, ["Paris"])[:2] == ("", "Paris") and track.tokens == 0
    track = ReasoningTrack(MODEL_OPENS, 0, tokenize)  # the model would open the block itself
    assert drive(track, ["Paris"])[:2] == ("", "Paris") and track.tokens == 0
    track = ReasoningTrack(CLOSED, 0, tokenize)  # already off: nothing forced
    assert track.forced() is None and drive(track, ["Paris"])[:2] == ("", "Paris")


def test_a_resumed_sequence_replays_its_forced_tokens_without_forcing_them_again():
    first = ReasoningTrack(OPENED, 2, tokenize)
    assert first.feed("a", False) == ("a", "") and first.feed(" b", False) == (" b", "")
    assert first.forced() == 90  # the earlier runner wrote one closing token, then failed
    again = ReasoningTrack(OPENED, 2, tokenize)
    for tok, text in ((1, "a"), (2, " b"), (90, "\n</")):
        again.replayed(tok, text)
    assert [again.forced(), again.forced(), again.forced()] == [91, 92, None]
    assert again.resumed([1, 2, 90]) == [1, 2, 90]  # no grammar waiting: the whole run


def test_the_budget_must_be_a_count():
    assert budget_of({}) is None and budget_of({"thinking_budget": 5}) == 5
    for bad in (-1, 1.5, "3", True):
        with pytest.raises(SamplingError, match="thinking_budget"):
            budget_of({"thinking_budget": bad})


def test_the_channel_reads_reasoning_strictly():
    ev = runner_event_from_wire({"op": "delta", "id": 1, "text": "", "reasoning": "hm"}, queue_wait_ms=0, served_by="n")
    assert ev.reasoning == "hm" and ev.text == ""
    done = {"op": "done", "id": 1, "finish_reason": "stop", "prompt_tokens": 3, "completion_tokens": 5}
    assert runner_event_from_wire(done, queue_wait_ms=0, served_by="n").reasoning_tokens == 0
    assert runner_event_from_wire({**done, "reasoning_tokens": 4}, queue_wait_ms=0, served_by="n").reasoning_tokens == 4
    for bad in (
        {"op": "delta", "id": 1, "text": "", "reasoning": 3},
        {**done, "reasoning_tokens": 6},
        {**done, "reasoning_tokens": -1},
        {**done, "reasoning_tokens": "2"},
    ):
        with pytest.raises(RunnerProtocolError):
            runner_event_from_wire(bad, queue_wait_ms=0, served_by="n")
