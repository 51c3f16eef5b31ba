"""The mixture of agents' choices that need no generation: members, refusals, the reducer's request,
the all-failed error and the ``hydra_moa`` / ``x-hydra-moa`` shapes (docs/moa.md)."""

from __future__ import annotations

import json

import pytest

from hydra_node.api.chat import ChatOutcome
from hydra_node.moa.mixture import (
    MAX_CANDIDATE_CHARS,
    REDUCER_INSTRUCTION,
    MemberResult,
    MixtureOfAgents,
    MoaRun,
    _all_failed,
)
from hydra_node.moa.answers import moa_header, moa_info
from hydra_node.moa.arbiter import MemberAnswer, arbitrate
from hydra_node.moa.config import MoaSettings
from hydra_node.api.errors import ApiError
from hydra_node.grammar.toolcalls import ParsedToolCall
from hydra_node.inference import GenerationRequest
from hydra_node.routing.router import RouteTarget, Router


class Hosts:
    """A target source: (model, node, state) triples, as the node's runners and peers announce them."""

    def __init__(self, *entries):
        self.entries = entries

    def targets(self):
        return [RouteTarget(model=m, node_id=n, local=n == "self", open=None, state=s) for m, n, s in self.entries]


def moa(*entries, **settings) -> MixtureOfAgents:
    router = Router("self")
    router.add_source(Hosts(*entries))
    return MixtureOfAgents(router, MoaSettings(**settings))


def test_members_are_the_ready_models_sorted_and_capped():
    m = moa(
        ("b", "self", "ready"),
        ("a", "peer", "ready"),
        ("a", "self", "loading"),
        ("c", "peer", "loading"),
        ("d", "peer", "ready"),
        max_members=2,
    )
    assert m.members() == ["a", "b"] and m.listed()
    assert moa(("b", "self", "ready"), ("a", "p", "ready"), members=("b", "zz", "a")).members() == ["b", "a"]


def test_fewer_than_two_members_or_disabled_is_a_400_saying_why():
    one = moa(("a", "self", "ready"), ("b", "peer", "loading"))
    assert not one.listed()
    with pytest.raises(ApiError) as exc:
        one.check()
    assert exc.value.status == 400 and exc.value.code == "moa_unavailable" and "['a']" in exc.value.message
    off = moa(("a", "self", "ready"), ("b", "self", "ready"), enabled=False)
    with pytest.raises(ApiError, match="disabled") as exc:
        off.check()
    assert not off.listed() and exc.value.code == "moa_disabled"


def test_a_target_called_mesh_is_never_a_member():
    m = moa(("mesh", "self", "ready"), ("a", "self", "ready"), ("b", "peer", "ready"))
    assert m.listed() and m.members() == ["a", "b"]  # "mesh" is reserved: tests/moa/test_moa_members.py


def _run(*answers: tuple[str, str | None, float], failed: tuple[MemberResult, ...] = ()) -> MoaRun:
    results = (
        tuple(
            MemberResult(model, "ok", latency, ChatOutcome(content=text, usage={"completion_tokens": 3}))
            for model, text, latency in answers
        )
        + failed
    )
    verdict = arbitrate(
        MemberAnswer(r.model, r.outcome.content or "", latency_ms=r.latency_ms) for r in results if r.status == "ok"
    )
    return MoaRun(results, verdict, 9.0)


def test_the_reducer_gets_one_candidate_per_group_in_ranking_order():
    run = _run(("a", "Paris", 30.0), ("b", "Lyon", 10.0), ("c", "x" * (MAX_CANDIDATE_CHARS + 50), 20.0))
    m = moa(("a", "self", "ready"), ("b", "self", "ready"), reducer="a")
    assert m.reducer_model(run) == "a"
    req = GenerationRequest(model="mesh", kind="chat", messages=(("user", "Capital of France?"),), request_id="r1")
    red = m.reducer_request(req, run, "a")
    assert red.model == "a" and red.request_id == "r1-reducer" and red.messages[:-1] == req.messages
    last = red.messages[-1]
    assert last.role == "user" and last.content.startswith(REDUCER_INSTRUCTION)
    assert (
        last.content.index("<candidate 1>\nLyon")
        < last.content.index("<candidate 2>\nxxx")
        < last.content.index("<candidate 3>\nParis")
    )
    assert "x" * (MAX_CANDIDATE_CHARS + 1) not in last.content and " [...]" in last.content


def test_no_reducer_with_a_majority_or_without_one_configured():
    agree = _run(("a", "4", 1.0), ("b", "four", 2.0), ("c", "5", 3.0))
    assert moa(reducer="a").reducer_model(agree) == ""
    assert moa().reducer_model(_run(("a", "4", 1.0), ("b", "5", 2.0))) == ""


def test_tool_calls_are_shown_to_the_reducer_as_calls():
    call = ParsedToolCall(index=0, id="call_1", name="get_weather", arguments='{"city":"Paris"}')
    run = MoaRun(
        (
            MemberResult("a", "ok", 1.0, ChatOutcome(content=None, tool_calls=[call])),
            MemberResult("b", "ok", 2.0, ChatOutcome(content="no")),
        ),
        arbitrate(
            [
                MemberAnswer("a", "", (("get_weather", '{"city":"Paris"}'),), latency_ms=1.0),
                MemberAnswer("b", "no", latency_ms=2.0),
            ]
        ),
        9.0,
    )
    req = GenerationRequest(model="mesh", kind="chat", messages=(("user", "Weather?"),))
    assert 'call get_weather({"city":"Paris"})' in moa(reducer="a").reducer_request(req, run, "a").messages[-1].content


def test_all_failed_is_a_503_naming_every_member_unless_all_refused_the_request():
    gone = MemberResult("a", "error", 5.0, error="host left", error_status=503)
    late = MemberResult("b", "deadline", 9000.0, error="no answer within the deadline of 9 s")
    exc = _all_failed((gone, late))
    assert (
        exc.status == 503
        and exc.code == "moa_no_answer"
        and "a: host left" in exc.message
        and "b: no answer" in exc.message
    )
    refused = tuple(MemberResult(m, "error", 1.0, error="prompt too long", error_status=400) for m in "ab")
    assert _all_failed(refused).status == 400
    assert _all_failed((refused[0], late)).status == 503


def test_info_and_header_say_who_answered_and_how():
    run = _run(
        ("a", "4", 1.0),
        ("b", "four", 2.0),
        failed=(MemberResult("c", "deadline", 9000.0, error="no answer within the deadline of 9 s"),),
    )
    info = moa_info(run, "")
    assert info["majority"] and info["chosen"] == info["answer_from"] == "a" and info["deadline_s"] == 9.0
    assert [(m["model"], m["status"], m["group"]) for m in info["members"]] == [
        ("a", "ok", 0),
        ("b", "ok", 0),
        ("c", "deadline", None),
    ]
    assert info["members"][2]["usage"] is None and info["reducer"] == {"model": None, "ran": False, "error": None}
    header = json.loads(moa_header(info))
    assert header["groups"] == [["a", "b"]] and header["reducer_ran"] is False and moa_header(info).isascii()
    failed = moa_info(run, "z", "model_unavailable: gone")
    assert failed["reducer"] == {"model": "z", "ran": False, "error": "model_unavailable: gone"}
    assert failed["answer_from"] == "a" and moa_info(run, "z")["answer_from"] == "z"


def test_the_config_file_takes_a_moa_section_and_refuses_unknown_keys():
    from hydra_node.config import ConfigError, parse_config_text

    cfg = parse_config_text('[moa]\nmembers = ["a", "b"]\nreducer = "a"\ndeadline_s = 5\n')
    assert cfg.moa == MoaSettings(members=("a", "b"), reducer="a", deadline_s=5.0)
    assert parse_config_text("").moa == MoaSettings()
    with pytest.raises(ConfigError, match=r"\[moa\]\.reduce: unknown key"):
        parse_config_text('[moa]\nreduce = "a"\n')
