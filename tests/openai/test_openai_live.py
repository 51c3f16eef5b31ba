"""Every accepted chat/completions parameter shown to have its effect, on a live node with the bundled model,
driven by the official openai client (and raw HTTP where the client would hide the wire)."""

from __future__ import annotations

import json
import socket

import llama_cpp
import openai
import pytest

from harness import request
from hydra_node.models import BUNDLED_MODEL_ID
from waiting import poll_until

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
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def node(shared_node):
    """The session's shared node (tests/conftest.py)."""
    return shared_node


@pytest.fixture(scope="module")
def client(node):
    return openai.OpenAI(base_url=node.base_url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def vocab(model_path):
    return llama_cpp.Llama(model_path=str(model_path), vocab_only=True, verbose=False)


def post(node, path: str, body: dict) -> tuple[int, dict]:
    code, text = request("POST", node.api_port, path, body, timeout=120)
    return code, json.loads(text)


def sse_events(text: str) -> list[dict]:
    parts = [p for p in text.split("\n\n") if p]
    assert parts[-1] == "data: [DONE]"
    return [json.loads(p[6:]) for p in parts[:-1]]


# ---- tools -----------------------------------------------------------------------------


def _check_weather_call(call) -> None:
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    assert set(args) == {"city"} and isinstance(args["city"], str)


def test_tool_choice_required_gives_a_valid_call(client):
    r = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=60,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    _check_weather_call(choice.message.tool_calls[0])


def test_named_tool_choice_calls_that_function(client):
    r = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=60,
    )
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_time" and json.loads(call.function.arguments)["zone"] in ("UTC", "CET")


def stream_call(node, **kw) -> tuple[list[dict], list[dict]]:
    """A streamed forced get_weather call: (the choice deltas, the tool_calls entries in order)."""
    code, text = request(
        "POST",
        node.api_port,
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": ASK,
            "tools": [WEATHER],
            "tool_choice": "required",
            "parallel_tool_calls": False,
            "temperature": 0,
            "stream": True,
            **kw,
        },
        timeout=120,
    )
    assert code == 200
    deltas = [c["choices"][0] for c in sse_events(text)]
    return deltas, [tc for d in deltas for tc in d["delta"].get("tool_calls", [])]


def test_forced_tool_call_streams_like_openai(node):
    deltas, calls = stream_call(node, max_tokens=60)
    head, *fragments = calls
    assert head["index"] == 0 and head["type"] == "function" and head["id"].startswith("call_")
    assert head["function"] == {"name": "get_weather", "arguments": ""}
    assert fragments and all(set(f) == {"index", "function"} and f["index"] == 0 for f in fragments)
    args = "".join(f["function"]["arguments"] for f in fragments)
    assert set(json.loads(args)) == {"city"}
    # the arguments come as they are generated: several chunks, the first one sent before the
    # arguments were complete (it is not a JSON value on its own)
    assert len(fragments) > 1
    with pytest.raises(ValueError):
        json.loads(fragments[0]["function"]["arguments"])
    assert not any(d["delta"].get("content") for d in deltas)
    assert deltas[-1]["finish_reason"] == "tool_calls"
    # the whole answer has the same call (its arguments re-serialised compactly)
    code, whole = post(
        node,
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": ASK,
            "tools": [WEATHER],
            "tool_choice": "required",
            "parallel_tool_calls": False,
            "temperature": 0,
            "max_tokens": 60,
        },
    )
    assert code == 200
    (call,) = whole["choices"][0]["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == json.loads(args)


def test_a_streamed_call_cut_by_max_tokens_ends_with_length(client, node):
    n = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=60,
    ).usage.completion_tokens
    cut_inside = 0
    # Four cut points (each a grammar-constrained generation). The call's text ends in about 8 closing
    # tokens after the arguments: n - 11 and n - 9 cut inside them, n - 5 and n - 2 in the closing
    # text; at least one must cut inside the arguments.
    for max_tokens in sorted({max(1, n - 11), max(1, n - 9), max(1, n - 5), max(1, n - 2)}):
        deltas, calls = stream_call(node, max_tokens=max_tokens)
        finish = deltas[-1]["finish_reason"]
        content = "".join(d["delta"].get("content") or "" for d in deltas)
        if not calls:  # cut before the name was complete: what was generated, as text
            assert content.startswith("<tool_call>") and finish == "length"
            continue
        assert content == ""  # the call's text never comes again as content
        args = "".join(c["function"].get("arguments", "") for c in calls)
        try:
            json.loads(args)
        except ValueError:  # cut inside the arguments: what was generated, and "length"
            assert finish == "length"
            cut_inside += 1
        else:  # the arguments were complete (the cut fell in the closing text)
            assert finish == "tool_calls"
    assert cut_inside


def test_tool_choice_auto_answers_text_or_valid_calls(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], temperature=0, max_tokens=40)
    choice = r.choices[0]
    if choice.message.tool_calls:
        assert choice.finish_reason == "tool_calls"
        for call in choice.message.tool_calls:
            _check_weather_call(call)
    else:
        assert choice.message.content and choice.finish_reason in ("stop", "length")
        assert "<tool_call>" not in choice.message.content or choice.finish_reason == "length"


def test_tool_results_in_the_history_reach_the_model(client):
    history = ASK + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 31 degrees Celsius."},
    ]
    r = client.chat.completions.create(
        model=MODEL, messages=history, tools=[WEATHER], tool_choice="none", temperature=0, max_tokens=30
    )
    assert r.choices[0].message.content and not r.choices[0].message.tool_calls
    plain = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="none", temperature=0, max_tokens=30
    )
    assert r.usage.prompt_tokens > plain.usage.prompt_tokens  # the call and its result were rendered


# ---- structured output -------------------------------------------------------------------

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_json_schema_response_parses_and_validates(client):
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Invent a person."}],
        temperature=0,
        max_tokens=60,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
    )
    person = json.loads(r.choices[0].message.content)
    assert set(person) == {"name", "age"} and isinstance(person["name"], str) and len(person["name"]) <= 20
    assert type(person["age"]) is int


def test_json_object_response_parses(client):
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe a cat in JSON."}],
        temperature=0,
        max_tokens=48,
        response_format={"type": "json_object"},
    )
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:
        assert r.choices[0].message.content.lstrip().startswith("{")


# ---- logprobs ------------------------------------------------------------------------------


def test_chat_logprobs_shape(client):
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hello."}],
        temperature=0,
        max_tokens=6,
        logprobs=True,
        top_logprobs=3,
    )
    entries = r.choices[0].logprobs.content
    assert len(entries) == r.usage.completion_tokens
    assert "".join(e.token for e in entries) == r.choices[0].message.content
    for e in entries:
        assert e.logprob <= 0 and bytes(e.bytes) == e.token.encode() and len(e.top_logprobs) == 3
        assert e.top_logprobs[0].logprob >= e.top_logprobs[-1].logprob
        assert max(t.logprob for t in e.top_logprobs) == pytest.approx(e.logprob)  # greedy: the top one
    assert (
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
        .choices[0]
        .logprobs
        is None
    )


def test_streamed_chat_logprobs_come_with_each_chunk(client):
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Say hello."}],
            temperature=0,
            max_tokens=6,
            logprobs=True,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    entries = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert len(entries) == chunks[-1].usage.completion_tokens
    assert "".join(e.token for e in entries) == "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_completion_logprobs_legacy_shape(client):
    r = client.completions.create(model=MODEL, prompt="1, 2, 3,", temperature=0, max_tokens=5, logprobs=2)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text and len(lp.token_logprobs) == len(lp.tokens) == 5
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert all(
        len(alts) == 2 and max(alts.values()) == pytest.approx(tl)
        for alts, tl in zip(lp.top_logprobs, lp.token_logprobs)
    )


# ---- n, prompts, echo ------------------------------------------------------------------------


def test_n_choices_with_distinct_seeds(client):
    kw = dict(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell me a story."}],
        max_tokens=8,
        temperature=1.5,
        seed=11,
        n=3,
    )
    r = client.chat.completions.create(**kw)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert 3 <= r.usage.completion_tokens <= 3 * 8  # summed over the choices
    # seeds seed, seed+1, seed+2: the choices differ (batched logits vary in their last bits, so the
    # choices are not compared across requests)
    assert len({c.message.content for c in r.choices}) > 1


def test_streamed_n_interleaves_choices_by_index(client):
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Count."}],
            max_tokens=6,
            temperature=0,
            n=2,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = {0: "", 1: ""}
    finished = set()
    for c in chunks:
        for ch in c.choices:
            text[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                finished.add(ch.index)
    assert finished == {0, 1} and text[0] == text[1] and text[0]  # greedy: the same answer twice
    usage = chunks[-1].usage  # one usage for every choice, summed
    assert usage.completion_tokens % 2 == 0 and usage.completion_tokens > 0


def test_completion_prompt_lists_token_prompts_and_echo(client, vocab):
    r = client.completions.create(model=MODEL, prompt=["1, 2, 3,", "a, b, c,"], max_tokens=4, temperature=0, n=2)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text == r.choices[1].text and r.choices[2].text == r.choices[3].text != r.choices[0].text
    tokens = vocab.tokenize(b"1, 2, 3,", add_bos=False)
    by_tokens = client.completions.create(model=MODEL, prompt=[tokens, tokens], max_tokens=4, temperature=0)
    assert len(by_tokens.choices) == 2 and by_tokens.choices[0].text == by_tokens.choices[1].text
    echoed = client.completions.create(model=MODEL, prompt="1, 2, 3,", max_tokens=4, temperature=0, echo=True)
    assert echoed.choices[0].text == "1, 2, 3," + r.choices[0].text


def test_streamed_completion_echo_comes_first(node):
    code, text = request(
        "POST",
        node.api_port,
        "/v1/completions",
        {"model": MODEL, "prompt": "1, 2, 3,", "max_tokens": 3, "temperature": 0, "echo": True, "stream": True},
    )
    assert code == 200 and sse_events(text)[0]["choices"][0]["text"] == "1, 2, 3,"


# ---- penalties and logit bias --------------------------------------------------------------


def test_logit_bias_bans_and_forces_tokens(client, vocab):
    kw = dict(model=MODEL, prompt="1, 2, 3,", max_tokens=3, temperature=0)
    plain = client.completions.create(**kw).choices[0].text
    first = vocab.tokenize(plain.encode(), add_bos=False)[0]
    banned = client.completions.create(**kw, logit_bias={str(first): -100}).choices[0].text
    assert vocab.tokenize(banned.encode(), add_bos=False)[0] != first
    (zebra,) = vocab.tokenize(b" zebra", add_bos=False)[:1]
    forced = client.completions.create(**kw, logit_bias={str(zebra): 100}).choices[0].text
    assert forced.startswith(" zebra")


def test_frequency_and_presence_penalties_change_repetition(client):
    kw = dict(model=MODEL, prompt="1, 1, 1, 1, 1, 1, 1, 1,", max_tokens=12, temperature=0)
    plain = client.completions.create(**kw).choices[0].text
    assert plain.count("1") >= 4  # greedy repeats the pattern
    penalised = client.completions.create(**kw, frequency_penalty=2.0).choices[0].text
    assert penalised.count("1") < plain.count("1"), (plain, penalised)
    # a flat presence penalty does not beat a near-certain token: shown where the model hesitates
    kw = dict(
        model=MODEL, prompt="The cat sat on the mat. The dog sat on the mat. The bird", max_tokens=16, temperature=0
    )
    plain = client.completions.create(**kw).choices[0].text
    penalised = client.completions.create(**kw, presence_penalty=2.0).choices[0].text
    assert penalised != plain and client.completions.create(**kw, presence_penalty=-2.0).choices[0].text != penalised


# ---- models, errors, clean-up ----------------------------------------------------------------


def test_models_retrieve(client, node):
    m = client.models.retrieve(MODEL)
    assert m.id == MODEL and m.object == "model" and node.status()["node_id"] in m.model_extra["hosts"]
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("no-such-model")
    assert e.value.body["code"] == "model_not_found"
    code, text = request("GET", node.api_port, "/v1/models/hf://org/repo/x.gguf")
    assert code == 404 and json.loads(text)["error"]["code"] == "model_not_found"
    code, _ = request("POST", node.api_port, f"/v1/models/{MODEL}")
    assert code == 405


def test_a_refused_parameter_reaches_the_client_as_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=ASK, max_completion_tokens=0)
    assert e.value.body["param"] == "max_completion_tokens"
    with pytest.raises(openai.BadRequestError) as e:  # the bundled model does not reason
        client.chat.completions.create(model=MODEL, messages=ASK, reasoning_effort="low")
    assert e.value.body["param"] == "reasoning_effort" and MODEL in e.value.body["message"]


def test_abandoned_n_stream_frees_every_generation(node):
    body = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Write a long story."}],
            "max_tokens": 400,
            "n": 3,
            "stream": True,
        }
    ).encode()
    with socket.create_connection(("127.0.0.1", node.api_port), timeout=60) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        data = b""
        while data.count(b'"content":"') < 6:  # every choice is generating
            data += s.recv(65536)
    poll_until(lambda: node.status()["inflight_requests"] == 0 or None, timeout_s=60, what="generations cancelled")
    assert request("GET", node.api_port, "/v1/models")[0] == 200
