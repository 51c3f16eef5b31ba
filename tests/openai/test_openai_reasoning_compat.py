"""Reasoning models and llama-server compatibility on the OpenAI surface (pure): request parsing
(reasoning_effort, chat_template_kwargs, reasoning_format, history reasoning_content, sampling
extensions, suffix, model left out, nulls of OpenAI's schema) and answer shapes (reasoning_content,
usage details, system_fingerprint, /tokenize and /infill bodies)."""

from __future__ import annotations

import json
import typing

import pytest

from hydra_node.api.chat import ChatDone, ChatOutcome, ContentDelta, ReasoningDelta, ToolCallDelta
from hydra_node.api.answer import format_event
from hydra_node.api.errors import ApiError
from hydra_node.grammar.toolcalls import ParsedToolCall
from hydra_node.inference import NO_CAPS, ModelCaps, TokenizeRequest, TokenizeResult
from hydra_node.openai.format import ChunkMaker, ChunkStream, chat_choice, completion_choice, openai_usage
from hydra_node.openai.llama_server import infill_completion_body, parse_tokenize, tokenize_body
from hydra_node.openai.parse import parse_body

MSGS = [{"role": "user", "content": "hi"}]
THINKER = ModelCaps(reasoning="think", thinks=True, switch=True)
NO_SWITCH = ModelCaps(reasoning="think", thinks=True)
FIM = ModelCaps(fim=True)


def caps_of(caps: ModelCaps):
    return lambda model: caps


def parse(body, kind="chat", caps=NO_CAPS, served=None):
    return parse_body(json.dumps(body).encode(), kind, served=served, caps=caps_of(caps))


def refused(body, kind="chat", caps=NO_CAPS, served=None) -> ApiError:
    with pytest.raises(ApiError) as e:
        parse(body, kind, caps, served)
    assert e.value.status == 400
    return e.value


def chat(**kw):
    return {"model": "qwen", "messages": MSGS, **kw}


# ---- reasoning controls ---------------------------------------------------------------------


def test_reasoning_effort_maps_to_the_switch_and_budget_on_a_reasoning_model():
    r = parse(chat(reasoning_effort="low"), caps=THINKER).request
    assert (r.thinking, r.thinking_budget, r.reasoning_effort) == (True, 1024, "low")
    off = parse(chat(reasoning_effort="none"), caps=THINKER).request
    assert off.thinking is False
    assert parse(chat(reasoning_effort="none"), caps=NO_SWITCH).request.thinking_budget == 0
    assert parse(chat(reasoning_effort=None), caps=ModelCaps()).request.thinking is None


def test_reasoning_effort_on_a_model_that_does_not_reason_names_the_model():
    err = refused(chat(reasoning_effort="high"))
    assert err.param == "reasoning_effort" and "'qwen'" in err.message and err.code == "unsupported_parameter"
    assert refused(chat(reasoning_effort="huge"), caps=THINKER).param == "reasoning_effort"


def test_chat_template_kwargs_enable_thinking_is_the_switch_and_other_kwargs_are_refused():
    assert parse(chat(chat_template_kwargs={"enable_thinking": False}), caps=THINKER).request.thinking is False
    assert parse(chat(chat_template_kwargs={"enable_thinking": True}), caps=THINKER).request.thinking is True
    assert refused(chat(chat_template_kwargs={"foo": 1}), caps=THINKER).param == "chat_template_kwargs.foo"
    err = refused(chat(chat_template_kwargs={"enable_thinking": "no"}), caps=THINKER)
    assert err.param == "chat_template_kwargs.enable_thinking"
    err = refused(chat(chat_template_kwargs={"enable_thinking": True}))  # not a reasoning model
    assert err.param == "chat_template_kwargs.enable_thinking" and "'qwen'" in err.message
    both = chat(reasoning_effort="none", chat_template_kwargs={"enable_thinking": True})
    assert refused(both, caps=THINKER).param == "chat_template_kwargs.enable_thinking"
    agree = parse(chat(reasoning_effort="high", chat_template_kwargs={"enable_thinking": True}), caps=THINKER)
    assert agree.request.thinking is True and agree.request.reasoning_effort == "high"


def test_reasoning_format_none_inlines_and_others_split_or_are_refused():
    assert parse(chat(reasoning_format="none"), caps=THINKER).inline_reasoning
    for fmt in ("auto", "deepseek", None):
        assert not parse(chat(reasoning_format=fmt), caps=THINKER).inline_reasoning
    assert refused(chat(reasoning_format="deepseek-legacy"), caps=THINKER).param == "reasoning_format"


def test_history_reasoning_content_is_the_assistant_turns_reasoning():
    msgs = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "two and two"},
        {"role": "user", "content": "and 3+3?"},
    ]
    r = parse(chat(messages=msgs)).request
    assert r.messages[1].reasoning == "two and two" and r.messages[1].content == "4"
    bad = [{"role": "assistant", "content": "4", "reasoning_content": 5}]
    assert refused(chat(messages=bad)).param == "messages[0].reasoning_content"
    assert refused(chat(messages=[{"role": "user", "content": "x", "reasoning_content": "t"}])).param == (
        "messages[0].reasoning_content"
    )


def test_a_final_assistant_message_is_accepted_for_prefill():
    msgs = [{"role": "user", "content": "Write a haiku"}, {"role": "assistant", "content": "Autumn"}]
    r = parse(chat(messages=msgs)).request
    assert r.messages[-1].role == "assistant" and r.messages[-1].content == "Autumn"


# ---- llama-server sampling extensions, suffix, model left out --------------------------------


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_sampling_extensions_reach_the_request(kind):
    base = chat() if kind == "chat" else {"model": "m", "prompt": "hi"}
    r = parse({**base, "top_k": 5, "min_p": 0.1, "repeat_penalty": 1.3, "repeat_last_n": 32}, kind).request
    assert (r.top_k, r.min_p, r.repeat_penalty, r.repeat_last_n) == (5, 0.1, 1.3, 32)
    assert parse({**base, "top_k": -1}, kind).request.top_k == 0  # vLLM's "no cut"
    d = parse({**base, "top_k": None, "min_p": None, "repeat_penalty": None, "repeat_last_n": None}, kind).request
    assert (d.top_k, d.min_p, d.repeat_penalty, d.repeat_last_n) == (None, 0.0, 1.0, 64)


@pytest.mark.parametrize(
    "key,value",
    [
        ("top_k", 1.5),
        ("top_k", 5000),
        ("top_k", "40"),
        ("min_p", 2),
        ("min_p", "x"),
        ("repeat_penalty", 0),
        ("repeat_penalty", 50),
        ("repeat_last_n", -1),
        ("repeat_last_n", 0.5),
    ],
)
def test_sampling_extension_errors_name_the_parameter(key, value):
    assert refused(chat(**{key: value})).param == key


def test_completion_suffix_is_fill_in_the_middle_on_a_fim_model_only():
    body = {"model": "coder", "prompt": "def f(", "suffix": "    return x\n"}
    assert parse(body, "completion", caps=FIM).request.suffix == "    return x\n"
    err = refused(body, "completion")
    assert err.param == "suffix" and "'coder'" in err.message
    assert parse({**body, "suffix": None}, "completion").request.suffix == ""
    assert refused({**body, "suffix": 5}, "completion", caps=FIM).param == "suffix"
    assert refused({**body, "prompt": [1, 2]}, "completion", caps=FIM).param == "suffix"


def test_a_body_without_model_is_the_one_served_model_or_a_400_naming_them():
    assert parse({"messages": MSGS}, served=["solo"]).request.model == "solo"
    assert parse({"model": None, "prompt": "x"}, "completion", served=["solo"]).request.model == "solo"
    err = refused({"messages": MSGS}, served=["a", "b"])
    assert err.param == "model" and "a, b" in err.message
    assert "no model" in refused({"messages": MSGS}, served=[]).message
    assert refused({"messages": MSGS}).param == "model"  # no list of models: required


def test_completion_prompt_null_is_a_new_document():
    assert parse({"model": "m", "prompt": None}, "completion").request.prompt == ""
    assert parse({"model": "m"}, "completion").request.prompt == ""


def _chat_params() -> list[str]:
    from openai.types.chat import completion_create_params as p

    return sorted(typing.get_type_hints(p.CompletionCreateParamsBase, include_extras=False))


@pytest.mark.parametrize("key", [k for k in _chat_params() if k not in ("model", "messages")])
def test_every_chat_parameter_of_openais_schema_may_be_null(key):
    """OpenAI's published chat params (the SDK's types): a param sent as null is never a 400."""
    assert parse(chat(**{key: None})).request.kind == "chat"


@pytest.mark.parametrize("key", ["moderation", "prompt_cache_options", "prompt_cache_retention"])
def test_unsupported_cache_and_moderation_params_are_refused_clearly_when_set(key):
    err = refused(chat(**{key: {"x": 1}}))
    assert err.param == key and err.code == "unsupported_parameter"


def test_every_completion_parameter_of_openais_schema_may_be_null():
    from openai.types import completion_create_params as p

    for key in typing.get_type_hints(p.CompletionCreateParamsBase):
        if key != "model":
            assert parse({"model": "m", "prompt": "x", key: None}, "completion").request.kind == "completion", key


# ---- answers ----------------------------------------------------------------------------------

USAGE = {
    "prompt_tokens": 5,
    "completion_tokens": 9,
    "total_tokens": 14,
    "prompt_tokens_details": {"cached_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 6},
}


def test_usage_has_openais_completion_tokens_details():
    from openai.types import CompletionUsage

    u = openai_usage(USAGE)
    assert u["completion_tokens_details"] == {
        "reasoning_tokens": 6,
        "accepted_prediction_tokens": 0,
        "rejected_prediction_tokens": 0,
        "audio_tokens": 0,
    }
    assert CompletionUsage.model_validate(u).completion_tokens_details.reasoning_tokens == 6


def test_message_reasoning_content_only_when_there_is_reasoning():
    with_thoughts = chat_choice(0, ChatOutcome(content="4", reasoning="two and two"), False)
    assert with_thoughts["message"]["reasoning_content"] == "two and two"
    assert with_thoughts["message"]["content"] == "4"
    assert "reasoning_content" not in chat_choice(0, ChatOutcome(content="4"), False)["message"]
    inline = chat_choice(0, ChatOutcome(content="4", reasoning="hmm"), False, ("<think>", "</think>"))
    assert inline["message"]["content"] == "<think>hmm</think>4" and "reasoning_content" not in inline["message"]


def test_a_completion_keeps_the_thoughts_in_its_text():
    c = completion_choice(0, ChatOutcome(content=" 4", reasoning="hmm"), None, None)
    assert c["text"] == "<think>hmm</think> 4"


def chunks(raw: bytes) -> list[dict]:
    return [json.loads(part[6:]) for part in raw.decode().split("\n\n") if part and part != "data: [DONE]"]


DONE_EV = ChatDone("stop", USAGE, "node-a")


def stream(fmt: ChunkStream, events) -> list[dict]:
    out = b"".join(fmt.start())
    for k, ev in events:
        out += b"".join(format_event(fmt, k, ev))
    out += b"".join(fmt.end())
    return chunks(out)


def test_streamed_reasoning_content_comes_before_content_per_choice():
    fmt = ChunkStream(ChunkMaker("c", "qwen", 0, chat=True), choices=2, include_usage=True)
    events = [
        (0, ReasoningDelta("thinking ")),
        (1, ReasoningDelta("other")),
        (0, ReasoningDelta("hard")),
        (0, ContentDelta("4")),
        (1, ContentDelta("5")),
        (0, DONE_EV),
        (1, DONE_EV),
    ]
    got = stream(fmt, events)
    deltas = [(c["choices"][0]["index"], c["choices"][0]["delta"]) for c in got if c["choices"]]
    thoughts = {k: "".join(d.get("reasoning_content", "") for i, d in deltas if i == k) for k in (0, 1)}
    content = {k: "".join(d.get("content") or "" for i, d in deltas if i == k) for k in (0, 1)}
    assert thoughts == {0: "thinking hard", 1: "other"} and content == {0: "4", 1: "5"}
    assert got[-1]["usage"]["completion_tokens_details"]["reasoning_tokens"] == 12


def test_streamed_reasoning_format_none_puts_tagged_thoughts_in_content():
    call = ParsedToolCall(0, "call_1", "f", "{}")
    fmt = ChunkStream(ChunkMaker("c", "qwen", 0, chat=True), inline_tags=lambda: ("<think>", "</think>"))
    got = stream(fmt, [(0, ReasoningDelta("a")), (0, ReasoningDelta("b")), (0, ToolCallDelta(call)), (0, DONE_EV)])
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in got)
    assert text == "<think>ab</think>"
    assert not any("reasoning_content" in c["choices"][0]["delta"] for c in got)
    assert any("tool_calls" in c["choices"][0]["delta"] for c in got)
    # a stream that ends inside the thoughts still closes them
    fmt = ChunkStream(ChunkMaker("c", "qwen", 0, chat=False), inline_tags=lambda: ("<think>", "</think>"))
    got = stream(fmt, [(0, ReasoningDelta("a")), (0, DONE_EV)])
    assert "".join(c["choices"][0]["text"] for c in got) == "<think>a</think>"


def test_completions_carry_a_system_fingerprint_when_streamed():
    m = ChunkMaker("cmpl-1", "m", 0, chat=False)
    (fin,) = chunks(m.finish(0, "stop", "node-a"))
    assert fin["system_fingerprint"] == "node-a"


# ---- /tokenize, /detokenize, /infill ------------------------------------------------------------


def test_tokenize_bodies_and_answers():
    req = parse_tokenize(b'{"content": "hi there", "with_pieces": true}', "tokenize", ["solo"])
    assert (req.model, req.content, req.add_special, req.parse_special, req.with_pieces) == (
        "solo",
        "hi there",
        False,
        True,
        True,
    )
    res = TokenizeResult(tokens=(5, 6), pieces=("hi", b"\xe2\x82"))
    assert tokenize_body(req, res) == {"tokens": [{"id": 5, "piece": "hi"}, {"id": 6, "piece": [226, 130]}]}
    plain = TokenizeRequest("m", "tokenize", content="x")
    assert tokenize_body(plain, TokenizeResult(tokens=(1,))) == {"tokens": [1]}
    de = parse_tokenize(b'{"model": "m", "tokens": [1, 2]}', "detokenize", None)
    assert de.tokens == (1, 2) and tokenize_body(de, TokenizeResult(content="ab")) == {"content": "ab"}


@pytest.mark.parametrize(
    "raw,op,param",
    [
        (b'{"model": "m"}', "tokenize", "content"),
        (b'{"model": "m", "content": 5}', "tokenize", "content"),
        (b'{"model": "m", "content": "x", "add_special": "yes"}', "tokenize", "add_special"),
        (b'{"model": "m", "content": "x", "what": 1}', "tokenize", "what"),
        (b'{"model": "m", "tokens": [-1]}', "detokenize", "tokens"),
        (b'{"model": "m", "tokens": "12"}', "detokenize", "tokens"),
        (b'{"content": "x"}', "tokenize", "model"),
    ],
)
def test_tokenize_errors_name_the_field(raw, op, param):
    with pytest.raises(ApiError) as e:
        parse_tokenize(raw, op, ["a", "b"])
    assert e.value.status == 400 and e.value.param == param


def test_infill_body_is_a_fill_in_the_middle_completion():
    body = {"input_prefix": "def f(x):\n", "input_suffix": "\n    return y\n", "prompt": "    y", "n_predict": 16}
    out = infill_completion_body({**body, "input_extra": [], "cache_prompt": True, "top_k": 10}, "coder")
    assert out == {
        "model": "coder",
        "prompt": "def f(x):\n    y",
        "suffix": "\n    return y\n",
        "max_tokens": 16,
        "top_k": 10,
    }
    assert "max_tokens" not in infill_completion_body({**body, "n_predict": -1}, "coder")
    for extra, param in (
        ({"input_extra": [{"filename": "a.py", "text": "x"}]}, "input_extra"),
        ({"stream": True}, "stream"),
        ({"cache_prompt": False}, "cache_prompt"),
        ({"samplers": ["top_k"]}, "samplers"),
        ({"input_prefix": 5}, "input_prefix"),
    ):
        with pytest.raises(ApiError) as e:
            infill_completion_body({**body, **extra}, "coder")
        assert e.value.param == param
