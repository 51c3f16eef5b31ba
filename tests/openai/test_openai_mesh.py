"""The agent-grade chat/completions surface through the mesh (issue 13 item 6), with the real openai SDK.

Two real nodes: A hosts the bundled model, C hosts nothing and joined A. Every request goes to C's API
and must come back served by A (``x-hydra-served-by``): forced tool calls, json_schema output, logprobs,
logit_bias, n, token-id prompts and echo. The grammar-constrained answers through C equal the same
greedy request asked at A directly, and C's scheduler decides constrained requests like any other.
"""

from __future__ import annotations

import json

import llama_cpp
import openai
import pytest

from grammar_oracle import validate
from hydra_node.models import BUNDLED_MODEL_ID

MODEL = BUNDLED_MODEL_ID
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Get the current time in a time zone",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
FORCED = dict(
    model=MODEL,
    messages=ASK,
    tools=[WEATHER, TIME],
    temperature=0,
    max_tokens=40,
    tool_choice={"type": "function", "function": {"name": "get_weather"}},
)
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
STRUCTURED = dict(
    model=MODEL,
    messages=[{"role": "user", "content": "Invent a person."}],
    temperature=0,
    max_tokens=40,
    response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
)


@pytest.fixture(scope="module")
def mesh(shared_mesh):
    """The session's shared mesh (tests/conftest.py): A is its host, C its front."""
    a, c = shared_mesh.host, shared_mesh.front
    assert not c.status()["models"]  # C hosts nothing: every answer below comes through the mesh
    return {
        "a": a,
        "c": c,
        "a_id": shared_mesh.host_id,
        "via_c": openai.OpenAI(base_url=c.base_url, api_key="unused", max_retries=0, timeout=120),
        "at_a": openai.OpenAI(base_url=a.base_url, api_key="unused", max_retries=0, timeout=120),
    }


@pytest.fixture(scope="module")
def vocab(model_path):
    return llama_cpp.Llama(model_path=str(model_path), vocab_only=True, verbose=False)


def served_by_a(mesh, endpoint, **kw):
    """``endpoint.create(**kw)`` through C (endpoint: ``client.chat.completions`` or ``client.completions``
    of the C client), checked to be served by A; the parsed answer (a list of chunks when streamed).

    A whole answer names its host in ``x-hydra-served-by``. A stream has no such header today (see
    ``test_a_stream_names_its_host_in_a_header``): a chat stream names it as the finish chunk's
    ``system_fingerprint``, and for every stream C's scheduler logged A as the target it routed to."""
    raw = endpoint.with_raw_response.create(**kw)
    if not kw.get("stream"):
        assert raw.headers["x-hydra-served-by"] == mesh["a_id"]
        return raw.parse()
    chunks = list(raw.parse())
    finishes = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishes) == kw.get("n", 1)
    if "messages" in kw:
        assert all(c.system_fingerprint == mesh["a_id"] for c in finishes)
    decision = mesh["c"].status()["scheduler"]["recent_decisions"][0]
    assert decision["target"] == f"{mesh['a_id']}/{MODEL}"
    return chunks


def call_of(message) -> tuple[str, dict]:
    (call,) = message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    return call.function.name, json.loads(call.function.arguments)


# ---- grammar-constrained: tools and json_schema ---------------------------------------------------


def test_forced_tool_call_through_c_equals_the_host(mesh):
    r = served_by_a(mesh, mesh["via_c"].chat.completions, **FORCED)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    name, args = call_of(choice.message)
    assert name == "get_weather" and set(args) == {"city"} and isinstance(args["city"], str)
    assert call_of(mesh["at_a"].chat.completions.create(**FORCED).choices[0].message) == (name, args)

    chunks = served_by_a(mesh, mesh["via_c"].chat.completions, **FORCED, stream=True)
    deltas = [c.choices[0] for c in chunks if c.choices]
    head, *fragments = [tc for d in deltas for tc in d.delta.tool_calls or []]
    assert head.index == 0 and head.type == "function" and head.id.startswith("call_")
    assert head.function.name == "get_weather" and head.function.arguments == ""
    assert fragments and all(f.index == 0 and f.id is None and f.function.name is None for f in fragments)
    assert json.loads("".join(f.function.arguments for f in fragments)) == args
    assert deltas[-1].finish_reason == "tool_calls"


def test_forced_tool_call_logprobs_cover_the_call(mesh):
    r = served_by_a(mesh, mesh["via_c"].chat.completions, **FORCED, logprobs=True, top_logprobs=2)
    entries = r.choices[0].logprobs.content
    assert len(entries) == r.usage.completion_tokens  # the call's text included
    assert call_of(r.choices[0].message)[0] == "get_weather"
    assert all(e.logprob <= 0 and len(e.top_logprobs) == 2 for e in entries)


def test_json_schema_through_c_parses_validates_and_equals_the_host(mesh):
    r = served_by_a(mesh, mesh["via_c"].chat.completions, **STRUCTURED)
    content = r.choices[0].message.content
    person = json.loads(content)
    assert validate(person, PERSON) and set(person) == {"name", "age"} and type(person["age"]) is int
    assert mesh["at_a"].chat.completions.create(**STRUCTURED).choices[0].message.content == content

    chunks = served_by_a(mesh, mesh["via_c"].chat.completions, **STRUCTURED, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == content


# ---- logprobs --------------------------------------------------------------------------------------

LOGPROBS = dict(
    model=MODEL,
    messages=[{"role": "user", "content": "Say hello."}],
    temperature=0,
    max_tokens=6,
    logprobs=True,
    top_logprobs=2,
)


def check_entry(e) -> None:
    assert e.logprob <= 0 and bytes(e.bytes) == e.token.encode() and len(e.top_logprobs) == 2
    assert all(bytes(t.bytes) == t.token.encode() and t.logprob <= 0 for t in e.top_logprobs)
    assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob
    assert e.top_logprobs[0].logprob == pytest.approx(e.logprob)  # greedy: the chosen token is the top one


def test_logprobs_through_c_have_openai_shapes(mesh):
    r = served_by_a(mesh, mesh["via_c"].chat.completions, **LOGPROBS)
    entries = r.choices[0].logprobs.content
    assert len(entries) == r.usage.completion_tokens
    assert "".join(e.token for e in entries) == r.choices[0].message.content
    for e in entries:
        check_entry(e)
    direct = mesh["at_a"].chat.completions.create(**LOGPROBS).choices[0].logprobs.content
    assert [e.token for e in direct] == [e.token for e in entries]
    assert [e.logprob for e in direct] == pytest.approx([e.logprob for e in entries], abs=1e-3)

    chunks = served_by_a(
        mesh, mesh["via_c"].chat.completions, **LOGPROBS, stream=True, stream_options={"include_usage": True}
    )
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert len(streamed) == chunks[-1].usage.completion_tokens == len(entries)
    assert "".join(e.token for e in streamed) == "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    for e in streamed:
        check_entry(e)


def test_completion_logprobs_through_c(mesh):
    r = served_by_a(
        mesh, mesh["via_c"].completions, model=MODEL, prompt="1, 2, 3,", temperature=0, max_tokens=4, logprobs=2
    )
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text and len(lp.token_logprobs) == len(lp.tokens)
    assert len(lp.tokens) == r.usage.completion_tokens
    assert all(
        len(alts) == 2 and max(alts.values()) == pytest.approx(tl)
        for alts, tl in zip(lp.top_logprobs, lp.token_logprobs)
    )


# ---- logit_bias, n, token prompts, echo ---------------------------------------------------------


def test_logit_bias_through_c_bans_the_greedy_first_token(mesh, vocab):
    kw = dict(model=MODEL, prompt="1, 2, 3,", max_tokens=3, temperature=0)
    plain = served_by_a(mesh, mesh["via_c"].completions, **kw).choices[0].text
    first = vocab.tokenize(plain.encode(), add_bos=False)[0]
    banned = served_by_a(mesh, mesh["via_c"].completions, **kw, logit_bias={str(first): -100}).choices[0].text
    assert banned and vocab.tokenize(banned.encode(), add_bos=False)[0] != first


def test_n_through_c_gives_two_choices(mesh):
    r = served_by_a(
        mesh,
        mesh["via_c"].chat.completions,
        model=MODEL,
        messages=[{"role": "user", "content": "Count."}],
        max_tokens=5,
        temperature=0,
        n=2,
    )
    assert [c.index for c in r.choices] == [0, 1]
    assert r.choices[0].message.content and r.choices[0].message.content == r.choices[1].message.content  # greedy
    r = served_by_a(mesh, mesh["via_c"].chat.completions, **STRUCTURED, n=2)
    assert [c.index for c in r.choices] == [0, 1]
    assert all(validate(json.loads(c.message.content), PERSON) for c in r.choices)


def test_token_prompt_and_echo_through_c(mesh, vocab):
    kw = dict(model=MODEL, max_tokens=4, temperature=0)
    by_text = served_by_a(mesh, mesh["via_c"].completions, **kw, prompt="1, 2, 3,").choices[0].text
    tokens = vocab.tokenize(b"1, 2, 3,", add_bos=False)
    by_tokens = served_by_a(mesh, mesh["via_c"].completions, **kw, prompt=tokens)
    assert by_tokens.choices[0].text == by_text and by_tokens.usage.prompt_tokens >= len(tokens)
    echoed = served_by_a(mesh, mesh["via_c"].completions, **kw, prompt="1, 2, 3,", echo=True)
    assert echoed.choices[0].text == "1, 2, 3," + by_text
    chunks = served_by_a(mesh, mesh["via_c"].completions, **kw, prompt="1, 2, 3,", echo=True, stream=True)
    assert (
        chunks[0].choices[0].text == "1, 2, 3,"
        and "".join(c.choices[0].text for c in chunks if c.choices) == "1, 2, 3," + by_text
    )
    # echo of a token-id prompt is refused (docs/api.md), by C as by A: a 400 naming it, not a silent drop
    for client in (mesh["via_c"], mesh["at_a"]):
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(**kw, prompt=tokens, echo=True)
        assert e.value.body["param"] == "echo"


# ---- the scheduler ----------------------------------------------------------------------------------


def test_the_scheduler_decides_constrained_requests_like_any_other(mesh):
    c, target = mesh["c"], f"{mesh['a_id']}/{MODEL}"

    def counts() -> tuple[dict, dict]:
        st = c.status()
        return st["scheduler"], st["network_costs"]["counters"]

    before, tele_before = counts()
    served_by_a(mesh, mesh["via_c"].chat.completions, **STRUCTURED)  # json_schema: 1 generation
    served_by_a(mesh, mesh["via_c"].chat.completions, **FORCED, stream=True)  # forced call, streamed: 1
    served_by_a(mesh, mesh["via_c"].chat.completions, **STRUCTURED, n=2)  # 2 constrained generations
    served_by_a(mesh, mesh["via_c"].chat.completions, **{**STRUCTURED, "response_format": {"type": "text"}})  # plain
    generations = 5
    after = c.wait_status(lambda st: not st["scheduler"]["in_flight"], what="C's attempts ended")["scheduler"]
    tele_after = c.status()["network_costs"]["counters"]
    assert after["decisions"] - before["decisions"] == generations
    for key in ("no_target", "overrides", "shadow_disagreements"):
        assert after[key] == before[key], key
    assert tele_after["attempts"] - tele_before["attempts"] == generations
    assert tele_after["finished"] - tele_before["finished"] == generations
    assert tele_after["failures_blamed"] == tele_before["failures_blamed"]
    decisions = after["recent_decisions"][:generations]  # newest first
    for d in decisions:
        assert d["target"] == d["baseline"] == d["scheduled"] == target and not d["excluded"], d
        assert [s["target"] for s in d["scores"]] == [target]
    # the plain request (newest) and the constrained ones were decided by the same rule
    assert len({d["reason"].split(";")[0] for d in decisions}) == 1, [d["reason"] for d in decisions]


def test_a_stream_names_its_host_in_a_header(mesh):
    """The router knows the host before the first event is read, so streams name it in a header too."""
    raw = mesh["via_c"].chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2, temperature=0, stream=True
    )
    list(raw.parse())
    assert raw.headers.get("x-hydra-served-by") == mesh["a_id"]
    raw = mesh["via_c"].responses.with_raw_response.create(
        model=MODEL, input="Hi", max_output_tokens=2, temperature=0, stream=True
    )
    list(raw.parse())
    assert raw.headers.get("x-hydra-served-by") == mesh["a_id"]
