"""The mixture-of-agents arbiter's rules (hydra_node/moa/arbiter.py, docs/moa.md) as pure functions."""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hydra_node.moa.arbiter import MemberAnswer, answer_key, arbitrate, canonical_json, canonical_number, normalise_text
from hydra_node.moa.config import MoaConfigError, parse_moa_section


# ---- normalisation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,expected",
    [
        ("4", "4"),
        ("4.0", "4"),
        ("+4", "4"),
        ("04", "4"),
        ("-0.0", "0"),
        ("1,000.50", "1000.5"),
        ("2.5e3", "2500"),
        ("1e100", "1e+100"),
        ("0.000", "0"),
        ("1.00000000000000000000000000000001", "1.00000000000000000000000000000001"),
    ],
)
def test_numbers_have_one_canonical_form(text, expected):
    assert canonical_number(text) == expected


def test_huge_exponents_are_left_as_written():
    assert canonical_number("1e999999999") == "1e999999999"


@pytest.mark.parametrize(
    "a,b",
    [
        ("Paris", "paris."),
        ("  The answer is   4.", "the answer is four"),
        ("It's 4.0!", "its 4"),
        ("Ｐａｒｉｓ", "paris"),
        ("Twenty-one", "20 1"),
        ("-3", "-3.00"),
    ],
)
def test_equivalent_text_normalises_alike(a, b):
    assert normalise_text(a) == normalise_text(b)


@pytest.mark.parametrize("a,b", [("4", "5"), ("Paris", "Lyon"), ("-3", "3"), ("1.5", "15")])
def test_different_text_stays_different(a, b):
    assert normalise_text(a) != normalise_text(b)


def test_json_is_compared_by_canonical_form():
    assert (
        canonical_json('{"b": 1.0, "a": [2, 3.50]}')
        == canonical_json('```json\n{"a":[2,3.5],"b":1}\n```')
        == '{"a":[2,3.5],"b":1}'
    )
    assert canonical_json('{"name": "Ann"}') != canonical_json('{"name": "ann"}')  # strings stay exact
    assert canonical_json("4") is None and canonical_json("{not json") is None
    assert answer_key(MemberAnswer("a", '{"x": 1}')) == answer_key(MemberAnswer("b", '{ "x" : 1.0 }'))
    assert answer_key(MemberAnswer("a", '{"x": 1}')).startswith("json:")


def test_tool_calls_compare_by_name_and_canonical_arguments():
    one = MemberAnswer("a", "", (("get_weather", '{"city": "Paris", "days": 2}'),))
    same = MemberAnswer("b", "Let me check.", (("get_weather", '{"days":2.0,"city":"Paris"}'),))
    other_args = MemberAnswer("c", "", (("get_weather", '{"city": "Lyon", "days": 2}'),))
    other_name = MemberAnswer("d", "", (("get_time", '{"city": "Paris", "days": 2}'),))
    assert answer_key(one) == answer_key(same)  # text beside the calls is not compared
    assert len({answer_key(x) for x in (one, other_args, other_name)}) == 3
    both = (("f", "{}"), ("g", '{"x": 1}'))
    assert answer_key(MemberAnswer("a", "", both)) == answer_key(MemberAnswer("b", "", both[::-1]))
    assert answer_key(MemberAnswer("a", "", (("f", "{broken"),))) == answer_key(
        MemberAnswer("b", "", (("f", "{broken "),))
    )


# ---- verdicts ---------------------------------------------------------------------------------


def test_majority_wins_and_its_best_member_is_the_pick():
    v = arbitrate(
        [
            MemberAnswer("m1", "Five", latency_ms=10),
            MemberAnswer("m2", "4", latency_ms=30),
            MemberAnswer("m3", "four.", latency_ms=20),
        ]
    )
    assert v.majority and v.chosen == "m3" and v.groups[0].members == ("m3", "m2") and v.groups[1].members == ("m1",)
    assert v.group_of("m1") == 1 and v.group_of("nobody") is None


def test_ties_go_to_quality_then_latency_then_model_id():
    a, b = MemberAnswer("a", "x", quality=0.5, latency_ms=1), MemberAnswer("b", "y", quality=0.9, latency_ms=99)
    v = arbitrate([a, b])
    assert not v.majority and v.chosen == "b"
    assert arbitrate([MemberAnswer("a", "x", latency_ms=5), MemberAnswer("b", "y", latency_ms=4)]).chosen == "b"
    assert arbitrate([MemberAnswer("b", "x"), MemberAnswer("a", "y")]).chosen == "a"


def test_one_answer_is_a_majority_of_the_answers():
    assert arbitrate([MemberAnswer("a", "x")]).majority


def test_bad_input_is_refused():
    with pytest.raises(ValueError):
        arbitrate([])
    with pytest.raises(ValueError):
        arbitrate([MemberAnswer("a", "x"), MemberAnswer("a", "y")])
    with pytest.raises(ValueError):
        MemberAnswer("a", "x", latency_ms=float("nan"))


# ---- properties -------------------------------------------------------------------------------

TEXTS = st.sampled_from(["4", "four", "4.0", "5", "Paris", "paris!", '{"a": 1}', '{"a":1.0}', "", "x y"])
CALLS = st.lists(
    st.tuples(st.sampled_from(["f", "g"]), st.sampled_from(['{"x": 1}', '{"x":1.0}', '{"x": 2}', "{}"])), max_size=2
).map(tuple)
ANSWER = st.builds(
    lambda content, calls, q, lat: (content, calls, q, lat),
    TEXTS,
    CALLS,
    st.sampled_from([0.5, 0.9, 1.0]),
    st.sampled_from([0.0, 10.0, 20.0]),
)


def _answers(raw) -> list[MemberAnswer]:
    return [MemberAnswer(f"model-{i}", c, calls, quality=q, latency_ms=lat) for i, (c, calls, q, lat) in enumerate(raw)]


@settings(max_examples=200, deadline=None)
@given(st.lists(ANSWER, min_size=1, max_size=7), st.randoms(use_true_random=False))
def test_the_order_of_answers_never_changes_the_verdict(raw, rnd):
    answers = _answers(raw)
    shuffled = answers[:]
    rnd.shuffle(shuffled)
    assert arbitrate(answers) == arbitrate(shuffled)


@settings(max_examples=200, deadline=None)
@given(st.lists(ANSWER, min_size=1, max_size=7), st.data())
def test_a_strict_majority_always_wins(raw, data):
    answers = _answers(raw)
    key = answer_key(answers[0])
    agreeing = [a for a in answers if answer_key(a) == key]
    if 2 * len(agreeing) <= len(answers):  # make it a majority: copy the first answer into others
        extra = data.draw(st.integers(len(answers) - 2 * len(agreeing) + 1, len(answers) + 3))
        answers += [
            MemberAnswer(f"copy-{i}", answers[0].content, answers[0].tool_calls, quality=0.1, latency_ms=1e6)
            for i in range(extra)
        ]
    v = arbitrate(answers)
    assert v.majority and answer_key(next(a for a in answers if a.model == v.chosen)) == key


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
@example(".00")  # digits after a dot: the number pattern skips them, the word pass must canonicalise them
@example("x.007 .5e3 ,010")
@example(".0\x1b")  # a number inside a word once the dot is gone: it must become its own token
@example("\u00df\u0301")  # case folding ß + accent leaves s + accent, which NFKC composes
@example("\u00df'\u0301")  # so does dropping an apostrophe between a letter and an accent
def test_normalising_any_text_is_total_and_idempotent_on_keys(text):
    first = normalise_text(text)
    assert normalise_text(first) == first
    answer_key(MemberAnswer("m", text))  # never raises


@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=5),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3),
        max_leaves=10,
    ).filter(lambda v: isinstance(v, (list, dict)))
)
def test_json_canonical_form_ignores_layout(value):
    assert canonical_json(json.dumps(value, indent=2)) == canonical_json(json.dumps(value, separators=(",", ":")))


# ---- [moa] config -----------------------------------------------------------------------------


def test_moa_section_parses_and_refuses_bad_keys():
    s = parse_moa_section({"members": ["a", "b"], "deadline_s": 5, "reducer": "a", "max_members": 3})
    assert (s.members, s.deadline_s, s.reducer, s.max_members, s.enabled) == (("a", "b"), 5.0, "a", 3, True)
    for bad, key in [
        ({"nope": 1}, "[moa].nope"),
        ({"max_members": 1}, "[moa].max_members"),
        ({"members": ["a", "a"]}, "[moa].members"),
        ({"members": ["mesh"]}, "[moa].members"),
        ({"deadline_s": 0}, "[moa].deadline_s"),
        ({"deadline_s": True}, "[moa].deadline_s"),
        ({"reducer": 3}, "[moa].reducer"),
        ({"enabled": "yes"}, "[moa].enabled"),
        ({"members": ["a", "b", "c"], "max_members": 2}, "[moa].members"),
    ]:
        with pytest.raises(MoaConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
            parse_moa_section(bad)
