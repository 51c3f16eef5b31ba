"""The pure parts of per-sequence sampling: request fields, log-softmax and top alternatives,
lazy-grammar trigger words, the runner's logprobs frames, the speculative runner's refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hydra_node.inference import GenerationRequest, TextDelta, TokenLogprob
from hydra_node.runtime.child.engine.logprobs import MIN_LOGPROB, LogprobReporter, clamp, log_softmax, top_alternatives
from hydra_node.runtime.child.engine.sampler import SamplerParams, SamplingError
from hydra_node.runtime.child.channel import RunnerProtocolError, runner_event_from_wire
from hydra_node.runtime.child.textstream import Trigger, TriggerWatch
from hydra_node.runtime.child.engine.speculation import speculation_eligible


# ---- SamplerParams ----------------------------------------------------------------------------


def test_a_plain_request_asks_for_no_extra_link_of_the_chain():
    p = SamplerParams.from_request(GenerationRequest(model="m", kind="completion", prompt="x").to_wire())
    assert p == SamplerParams(temperature=0.8, top_p=0.95, seed=None)
    assert not p.penalised and not p.grammar and not p.logit_bias and not p.greedy


def test_every_sampling_field_of_the_request_reaches_the_params():
    req = GenerationRequest(
        model="m",
        kind="completion",
        prompt="x",
        temperature=0.0,
        seed=-1,
        grammar='root ::= "a"',
        grammar_triggers=("<a>",),
        presence_penalty=0.5,
        frequency_penalty=-1.5,
        logit_bias=((7, -100.0), (9, 3.0)),
    )
    p = SamplerParams.from_request(req.to_wire())
    assert (p.temperature, p.seed, p.grammar, p.grammar_triggers) == (0.0, 0xFFFFFFFF, 'root ::= "a"', ("<a>",))
    assert (p.presence_penalty, p.frequency_penalty, p.logit_bias) == (0.5, -1.5, ((7, -100.0), (9, 3.0)))
    assert p.greedy and p.penalised


@pytest.mark.parametrize(
    "field, value, code",
    [
        ("grammar", 5, "invalid_grammar"),
        ("grammar_triggers", ["<a>"], "invalid_grammar"),  # no grammar
        ("logit_bias", [[1, "x"]], "invalid_request_error"),
        ("logit_bias", [[-1, 1.0]], "invalid_request_error"),
        ("logit_bias", {"1": 1.0}, "invalid_request_error"),
        ("presence_penalty", float("nan"), "invalid_request_error"),
        ("frequency_penalty", "2", "invalid_request_error"),
        ("seed", 1.5, "invalid_request_error"),
    ],
)
def test_a_malformed_field_is_a_400_naming_it(field, value, code):
    with pytest.raises(SamplingError) as err:
        SamplerParams.from_request({"temperature": 0.0, field: value})
    assert err.value.code == code and err.value.status == 400
    frame = err.value.frame(3)
    assert (
        frame["op"] == "error"
        and frame["id"] == 3
        and frame["status"] == 400
        and field.split("_")[0] in frame["message"]
    )


# ---- logprobs ---------------------------------------------------------------------------------


def test_log_softmax_is_the_log_of_the_softmax():
    logits = np.array([1.0, 2.0, 3.0, -50.0], dtype=np.float32)
    lp = log_softmax(logits)
    ref = np.log(np.exp(logits.astype(np.float64)) / np.exp(logits.astype(np.float64)).sum())
    assert np.allclose(lp, ref) and math.isclose(np.exp(lp).sum(), 1.0)
    big = log_softmax(np.array([1000.0, 1000.0], dtype=np.float32))  # stable: no overflow
    assert np.allclose(big, [math.log(0.5)] * 2)


def test_top_alternatives_are_sorted_most_likely_first_ties_by_token_id():
    lp = log_softmax(np.array([0.0, 3.0, 1.0, 3.0, 2.0], dtype=np.float32))
    top = top_alternatives(lp, 3)
    assert [t for t, _ in top] == [1, 3, 4]
    assert top[0][1] == top[1][1] > top[2][1]
    assert top_alternatives(lp, 0) == [] and len(top_alternatives(lp, 99)) == 5


def test_a_reported_logprob_is_finite_and_never_above_zero():
    assert clamp(1e-9) == 0.0 and clamp(float("-inf")) == MIN_LOGPROB and clamp(-1.5) == -1.5
    rep = LogprobReporter(2, lambda t: (f"t{t}", f"t{t}".encode()))
    entry = rep.entry(np.array([0.0, 100.0, float("-inf")], dtype=np.float32), 2)
    assert entry[0:3] == ["t2", MIN_LOGPROB, b"t2"]
    assert [e[0] for e in entry[3]] == ["t1", "t0"] and entry[3][0][1] == 0.0
    assert TokenLogprob.from_wire(entry).top[1][0] == "t0"  # the wire shape TextDelta carries


# ---- trigger words ----------------------------------------------------------------------------


def test_a_trigger_word_inside_one_token_starts_at_its_offset():
    w = TriggerWatch(("<call>",))
    assert w.find(1, b"Sure") is None
    w.commit(1, b"Sure")
    assert w.find(2, b" <call>{") == Trigger("<call>", b"<call>{", ())


def test_a_trigger_word_across_tokens_names_the_tokens_from_where_it_starts():
    w = TriggerWatch(("<call>", "TOOL"))
    for tok, piece in ((1, b"x "), (2, b"<ca"), (3, b"l")):
        assert w.find(tok, piece) is None
        w.commit(tok, piece)
    assert w.find(4, b"l>") == Trigger("<call>", b"", (2, 3, 4))
    w2 = TriggerWatch(("<call>",))
    w2.commit(1, b"a<")
    assert w2.find(2, b"call>") == Trigger("<call>", b"<", (2,))


def test_the_earliest_word_wins_and_old_text_is_forgotten():
    w = TriggerWatch(("bb", "abb"))
    assert w.find(1, b"abb") == Trigger("abb", b"", (1,))
    w = TriggerWatch(("xyz",))
    for i in range(50):
        w.commit(i, b"ab")
    assert sum(len(p) for _, p in w._recent) < 6  # only what may still begin a word
    with pytest.raises(ValueError):
        TriggerWatch(("",))


# ---- the runner channel: logprobs in delta frames -----------------------------------------------

ENTRY = [" Paris", -0.25, b" Paris", [[" Paris", -0.25, b" Paris"], [" the", -2.5, b" the"]]]


def test_a_delta_frame_carries_its_logprobs_into_the_text_delta():
    ev = runner_event_from_wire(
        {"op": "delta", "id": 1, "text": " Paris", "logprobs": [ENTRY]}, queue_wait_ms=0.0, served_by="n"
    )
    assert isinstance(ev, TextDelta) and ev.text == " Paris"
    assert ev.logprobs == (
        TokenLogprob(" Paris", -0.25, b" Paris", ((" Paris", -0.25, b" Paris"), (" the", -2.5, b" the"))),
    )
    plain = runner_event_from_wire({"op": "delta", "id": 1, "text": "x"}, queue_wait_ms=0.0, served_by="n")
    assert plain.logprobs == ()


@pytest.mark.parametrize(
    "logprobs",
    [
        "nope",
        [[" a", 0.5, b" a", []]],
        [[" a", -0.5, " a", []]],
        [[" a", -0.5, b" a"]],
        [[" a", -0.5, b" a", [["b", -1.0, b"b"]] * 21]],
        [ENTRY] * 4097,
    ],
)
def test_a_malformed_logprobs_entry_is_the_runners_protocol_error(logprobs):
    with pytest.raises(RunnerProtocolError) as err:
        runner_event_from_wire(
            {"op": "delta", "id": 1, "text": "a", "logprobs": logprobs}, queue_wait_ms=0.0, served_by="n"
        )
    assert err.value.status == 502 and err.value.code == "bad_runner_message"


# ---- a runner with a draft serves everything; only plain greedy requests speculate ----------------


@pytest.mark.parametrize(
    "field, value",
    [
        ("grammar", 'root ::= "a"'),
        ("logit_bias", ((5, 1.0),)),
        ("presence_penalty", 0.5),
        ("frequency_penalty", -0.5),
        ("logprobs", True),
        ("temperature", 0.7),
    ],
)
def test_only_plain_greedy_requests_speculate(field, value):
    def eligible(req: GenerationRequest) -> bool:
        wire = req.to_wire()
        p = SamplerParams.from_request(wire)
        return speculation_eligible(wire, p.greedy, not (p.grammar or p.logit_bias or p.penalised))

    assert eligible(GenerationRequest(model="m", kind="completion", prompt="x", temperature=0.0))
    kw = {"temperature": 0.0, field: value}
    assert not eligible(GenerationRequest(model="m", kind="completion", prompt="x", **kw))
