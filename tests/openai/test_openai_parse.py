"""Chat/completion bodies -> requests (pure): every refusal is a 400 naming the parameter the client sent,
every accepted parameter lands in the GenerationRequest (or ParsedBody) that the host honours."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from hydra_node.api.errors import ApiError
from hydra_node.openai.parse import IGNORED, MAX_JSON_DEPTH, REFUSED, expand, parse_body

MSGS = [{"role": "user", "content": "hi"}]
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def chat(**kw) -> dict:
    return {"model": "m", "messages": MSGS, **kw}


def completion(**kw) -> dict:
    return {"model": "m", "prompt": "hi", **kw}


def parse(body, kind="chat"):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_body(raw, kind)


def refused(body, kind="chat") -> ApiError:
    with pytest.raises(ApiError) as e:
        parse(body, kind)
    assert e.value.status == 400 and e.value.body()["error"]["type"] == "invalid_request_error"
    return e.value


# ---- refusals, each naming its parameter -------------------------------------------------


@pytest.mark.parametrize(
    "body,param",
    [
        (chat(n=1.0), "n"),
        (chat(n=True), "n"),
        (chat(n=0), "n"),
        (chat(n=17), "n"),
        (chat(n="2"), "n"),
        (chat(max_completion_tokens=0), "max_completion_tokens"),
        (chat(max_completion_tokens=1.5), "max_completion_tokens"),
        (chat(max_completion_tokens=40000), "max_completion_tokens"),
        (chat(max_tokens=0), "max_tokens"),
        (chat(max_tokens=True), "max_tokens"),
        (chat(max_tokens=5, max_completion_tokens=6), "max_tokens"),
        (chat(foo=1), "foo"),
        (chat(top_k=1.5), "top_k"),
        (chat(modalities=["text", "audio"]), "modalities"),
        (chat(temperature="hot"), "temperature"),
        (chat(temperature=2.5), "temperature"),
        (chat(top_p=0), "top_p"),
        (chat(seed=1.5), "seed"),
        (chat(seed=True), "seed"),
        (chat(stop=[1]), "stop"),
        (chat(stop=["a", "b", "c", "d", "e"]), "stop"),
        (chat(stream="yes"), "stream"),
        (chat(stream_options={"include_usage": True}), "stream_options"),
        (chat(stream=True, stream_options={"x": True}), "stream_options.x"),
        (chat(stream=True, stream_options={"include_usage": 1}), "stream_options.include_usage"),
        (chat(presence_penalty=2.5), "presence_penalty"),
        (chat(frequency_penalty=-3), "frequency_penalty"),
        (chat(presence_penalty=True), "presence_penalty"),
        (chat(logit_bias=[1]), "logit_bias"),
        (chat(logit_bias={"x": 1}), "logit_bias"),
        (chat(logit_bias={"-1": 1}), "logit_bias"),
        (chat(logit_bias={"5": 101}), "logit_bias"),
        (chat(logit_bias={"5": True}), "logit_bias"),
        (chat(logprobs="yes"), "logprobs"),
        (chat(logprobs=True, top_logprobs=21), "top_logprobs"),
        (chat(top_logprobs=2), "top_logprobs"),
        (chat(logprobs=True, top_logprobs=1.0), "top_logprobs"),
        (chat(user=5), "user"),
        ({"messages": MSGS}, "model"),
        ({"model": "m"}, "messages"),
        (chat(messages=[]), "messages"),
        (chat(messages=["hi"]), "messages[0]"),
        (chat(messages=[{"role": "wizard", "content": "x"}]), "messages[0].role"),
        (chat(messages=[{"role": "function", "name": "f", "content": "x"}]), "messages[0].role"),
        (chat(messages=[{"role": "user", "content": "x", "name": "bob"}]), "messages[0].name"),
        (chat(messages=[{"role": "user", "content": None}]), "messages[0].content"),
        (
            chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
            "messages[0].content[0]",  # not a data: or http(s) URL (tests/openai/test_image_parts.py)
        ),
        (chat(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
        (chat(messages=[{"role": "tool", "content": "sunny"}]), "messages[0].tool_call_id"),
        (chat(messages=[{"role": "assistant", "content": "x", "refusal": "no"}]), "messages[0].refusal"),
        (chat(messages=[{"role": "assistant", "content": None, "audio": {"id": "a"}}]), "messages[0].audio"),
        (
            chat(messages=[{"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function"}]}]),
            "messages[0].tool_calls[0]",
        ),
        (chat(messages=[{"role": "user", "content": "\ud800"}]), "messages[0]"),
        (chat(tools=[{"type": "code_interpreter"}]), "tools[0].type"),
        (chat(tools={"type": "function"}), "tools"),
        (chat(tools=[{"type": "function", "function": {"name": "bad name!"}}]), "tools[0].function.name"),
        (chat(tools=[TOOL, TOOL]), "tools[1].function.name"),
        (
            chat(tools=[{"type": "function", "function": {"name": "f", "parameters": "{}"}}]),
            "tools[0].function.parameters",
        ),
        (chat(tools=[{"type": "function", "function": {"name": "f", "extra": 1}}]), "tools[0].function.extra"),
        (chat(tools=[{"type": "function", "function": {"name": "f", "strict": "yes"}}]), "tools[0].function.strict"),
        (chat(tools=[TOOL], tool_choice="sometimes"), "tool_choice"),
        (chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "other"}}), "tool_choice"),
        (chat(tool_choice="required"), "tool_choice"),
        (chat(tools=[TOOL], parallel_tool_calls="no"), "parallel_tool_calls"),
        (chat(response_format={"type": "xml"}), "response_format.type"),
        (chat(response_format="json"), "response_format.type"),
        (chat(response_format={"type": "text", "json_schema": {}}), "response_format.json_schema"),
        (chat(response_format={"type": "json_object", "strict": True}), "response_format.strict"),
        (chat(response_format={"type": "json_schema"}), "response_format.json_schema"),
        (
            chat(response_format={"type": "json_schema", "json_schema": {"schema": {}}}),
            "response_format.json_schema.name",
        ),
        (
            chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
            "response_format.json_schema.schema",
        ),
        (
            chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "extra": 1}}),
            "response_format.json_schema.extra",
        ),
    ],
)
def test_chat_refusals_name_the_parameter(body, param):
    assert refused(body).param == param


@pytest.mark.parametrize("key", sorted(REFUSED))
def test_known_unsupported_openai_parameters_are_refused(key):
    err = refused(chat(**{key: {"x": 1}}))
    assert err.param == key and err.code == "unsupported_parameter"


@pytest.mark.parametrize(
    "body,param",
    [
        (completion(suffix="end"), "suffix"),
        (completion(best_of=2), "best_of"),
        (completion(n=2, best_of=3), "best_of"),
        (completion(prompt=[1, 2], echo=True), "echo"),
        (completion(echo=True, logprobs=1), "echo"),
        (completion(logprobs=6), "logprobs"),
        (completion(logprobs=True), "logprobs"),
        (completion(logprobs=-1), "logprobs"),
        (completion(prompt=["a", 1]), "prompt"),
        (completion(prompt=[]), "prompt"),
        (completion(prompt=[[]]), "prompt"),
        (completion(prompt=[[1], "a"]), "prompt"),
        (completion(prompt=[-1]), "prompt"),
        (completion(prompt=5), "prompt"),
        (completion(echo="yes"), "echo"),
        (completion(tools=[TOOL]), "tools"),
        (completion(messages=MSGS), "messages"),
        (completion(response_format={"type": "json_object"}), "response_format"),
        (completion(max_completion_tokens=5), "max_completion_tokens"),
        (completion(prompt=["a"] * 5, n=16), "n"),
    ],
)
def test_completion_refusals_name_the_parameter(body, param):
    assert refused(body, "completion").param == param


def test_suffix_refusal_names_the_model_without_fim_tokens():
    err = refused(completion(suffix="x"), "completion")
    assert err.code == "unsupported_parameter" and "'m'" in err.message and "FIM" in err.message


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model":"m","messages":' + b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1) + b"}",
        b"[" * 200000 + b"]" * 200000,  # deeper than the C decoder's own recursion bound
        b'{"a":' * 100000 + b"1" + b"}" * 100000,
    ],
)
def test_deeply_nested_json_is_400(raw):
    err = refused(raw)
    assert err.code == "invalid_json" and "deeper" in err.message


def test_nesting_within_the_bound_is_accepted():
    deep = {"x": 1}
    for _ in range(MAX_JSON_DEPTH - 2):
        deep = {"x": deep}
    assert parse(chat(metadata=deep)).request.kind == "chat"


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
        max_leaves=8,
    ),
    st.sampled_from(
        [
            "model",
            "messages",
            "prompt",
            "n",
            "stop",
            "tools",
            "tool_choice",
            "response_format",
            "logit_bias",
            "logprobs",
            "top_logprobs",
            "stream_options",
            "echo",
            "max_tokens",
            "seed",
        ]
    ),
)
@settings(max_examples=300, deadline=None)
def test_any_value_of_any_parameter_is_a_request_or_a_400(value, key):
    for kind, base in (("chat", chat()), ("completion", completion())):
        try:
            parse({**base, key: value, "stream": key == "stream_options"}, kind)
        except ApiError as e:
            assert e.status == 400 and (e.param is None or isinstance(e.param, str))


# ---- accepted parameters and their effect on the request -----------------------------------


@pytest.mark.parametrize(
    "key,value",
    [
        ("metadata", {"a": "b"}),
        ("store", False),
        ("store", True),
        ("service_tier", "auto"),
        ("safety_identifier", "x"),
        ("user", "u"),
        ("modalities", ["text"]),
        ("audio", None),
        ("functions", None),
    ],
)
def test_harmless_parameters_are_accepted(key, value):
    assert key in IGNORED | {"user", "modalities"} or value is None
    assert parse(chat(**{key: value})).request.kind == "chat"


def test_sampling_parameters_reach_the_request():
    p = parse(
        chat(
            max_completion_tokens=7,
            temperature=0,
            top_p=0.5,
            stop="x",
            seed=3,
            presence_penalty=1.5,
            frequency_penalty=-0.5,
            logit_bias={"42": -100, "7": 2.5},
            logprobs=True,
            top_logprobs=3,
            n=2,
            stream=True,
            stream_options={"include_usage": True},
            user="alice",
        )
    )
    r = p.request
    assert (r.max_tokens, r.temperature, r.top_p, r.stop, r.seed) == (7, 0.0, 0.5, ("x",), 3)
    assert (r.presence_penalty, r.frequency_penalty, r.logit_bias) == (1.5, -0.5, ((42, -100.0), (7, 2.5)))
    assert (r.logprobs, r.top_logprobs, r.session) == (True, 3, "alice")
    assert (p.n, p.stream, p.include_usage) == (2, True, True)


def test_history_with_tool_calls_and_results():
    msgs = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "weather "}, {"type": "text", "text": "in Paris?"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    r = parse(chat(messages=msgs, tools=[TOOL], tool_choice="none")).request
    assert [m.role for m in r.messages] == ["system", "user", "assistant", "tool"]
    assert r.messages[1].content == "weather in Paris?"
    assert r.messages[2].tool_calls[0].name == "get_weather" and r.messages[2].content == ""
    assert r.messages[2].tool_calls[0].arguments == '{"city":"Paris"}'
    assert (r.messages[3].tool_call_id, r.messages[3].name, r.messages[3].content) == ("call_1", "get_weather", "sunny")
    assert r.tools[0].name == "get_weather" and json.loads(r.tools[0].parameters)["required"] == ["city"]
    assert r.tool_choice == "none" and r.grammar == ""  # none: the tools are shown, nothing is forced


def test_completion_prompt_forms_and_choice_order():
    p = parse(completion(prompt=["a", "b"], n=2, seed=10), "completion")
    reqs = expand(p)
    assert [(r.prompt, r.seed) for r in reqs] == [("a", 10), ("a", 11), ("b", 10), ("b", 11)]
    assert len({r.request_id for r in reqs}) == 4 and reqs[0].request_id == p.request.request_id
    assert parse(completion(prompt=[1, 2, 3]), "completion").request.prompt_tokens == (1, 2, 3)
    assert [r.prompt_tokens for r in parse(completion(prompt=[[1], [2, 3]]), "completion").requests] == [(1,), (2, 3)]
    assert expand(parse(completion(n=3), "completion"))[2].seed is None  # no seed: each host draws its own


def test_completion_logprobs_echo_and_best_of():
    p = parse(completion(logprobs=2, best_of=1), "completion")
    assert (p.completion_logprobs, p.request.logprobs, p.request.top_logprobs) == (2, True, 2)
    p0 = parse(completion(logprobs=0), "completion")
    assert (p0.completion_logprobs, p0.request.logprobs, p0.request.top_logprobs) == (0, True, 0)
    assert parse(completion(echo=True), "completion").echo
    assert parse(completion(n=2, best_of=2), "completion").n == 2
    assert parse(completion(suffix=None), "completion").request.prompt == "hi"


def test_session_header_body_keys():
    assert parse(chat(prompt_cache_key="k")).request.session == "k"
    assert parse(chat(session_id="s", user="u")).request.session == "s"


# ---- grammars: forced tools and structured output ------------------------------------------


def test_tool_choice_decides_the_grammar():
    from hydra_node.grammar.constraints import TOOL_CALL_TRIGGER

    auto = parse(chat(tools=[TOOL])).request
    assert auto.tool_choice == "auto" and auto.grammar and auto.grammar_triggers == (TOOL_CALL_TRIGGER,)
    required = parse(chat(tools=[TOOL], tool_choice="required")).request
    assert required.grammar and required.grammar_triggers == ()
    other = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
    named = parse(
        chat(
            tools=[TOOL, other],
            tool_choice={"type": "function", "function": {"name": "get_time"}},
            parallel_tool_calls=False,
        )
    ).request
    assert (named.tool_choice, named.tool_name, named.parallel_tool_calls) == ("function", "get_time", False)
    assert named.grammar and named.grammar != required.grammar
    assert parse(chat(tools=[TOOL], tool_choice="none")).request.grammar == ""
    assert parse(chat()).request.grammar == ""


def test_response_format_decides_the_grammar():
    assert parse(chat(response_format={"type": "text"})).request.grammar == ""
    assert parse(chat(response_format={"type": "json_object"})).request.grammar
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    r = parse(
        chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}})
    ).request
    assert r.grammar and r.grammar_triggers == ()


def test_unsupported_schema_is_400_naming_where():
    bad_schema = {"type": "object", "properties": {"x": {"not": {"type": "string"}}}}
    err = refused(chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": bad_schema}}))
    assert err.param.startswith("response_format.json_schema.schema")
    tool = {"type": "function", "function": {"name": "f", "parameters": bad_schema}}
    assert refused(chat(tools=[tool], tool_choice="required")).param.startswith("tools")


def test_response_format_with_active_tools_is_refused():
    rf = {"type": "json_object"}
    assert refused(chat(tools=[TOOL], response_format=rf)).param == "response_format"
    assert parse(chat(tools=[TOOL], tool_choice="none", response_format=rf)).request.grammar
