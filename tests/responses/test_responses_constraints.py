"""/v1/responses -> GenerationRequest (pure): tools and text formats become the chat API's grammars."""

from __future__ import annotations

import json

import pytest
from grammar_oracle import GrammarOracle

from hydra_node.grammar import constraints as grammar
from hydra_node.api.errors import ApiError
from hydra_node.responses.constraints import generation_request
from hydra_node.responses.request import parse_responses_body
from hydra_node.inference import ChatMessage, GenerationRequest

TOOL = {
    "type": "function",
    "name": "add",
    "description": "Add",
    "strict": True,
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
}
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def gen(**body) -> GenerationRequest:
    call = parse_responses_body(json.dumps({"model": "m", "input": "hi", **body}).encode(), lambda _id: None)
    return generation_request(call, "resp_1", "sess")


def refused(**body) -> ApiError:
    with pytest.raises(ApiError) as info:
        gen(**body)
    assert info.value.status == 400
    return info.value


def test_plain_request():
    req = gen(instructions="sys", temperature=0.2, top_p=0.5, max_output_tokens=7)
    assert req.kind == "chat" and req.model == "m" and req.request_id == "resp_1" and req.session == "sess"
    assert req.messages == (ChatMessage("system", "sys"), ChatMessage("user", "hi"))
    assert (req.temperature, req.top_p, req.max_tokens, req.grammar, req.tools) == (0.2, 0.5, 7, "", ())


def test_auto_tools_get_the_lazy_grammar():
    req = gen(tools=[TOOL])
    assert req.tool_choice == "auto" and [t.name for t in req.tools] == ["add"]
    assert req.grammar == grammar.tool_call_grammar(req.tools, name=None, parallel=True)
    assert req.grammar_triggers == (grammar.TOOL_CALL_TRIGGER,)


def test_required_and_named_tools_get_the_full_grammar():
    req = gen(tools=[TOOL], tool_choice="required", parallel_tool_calls=False)
    assert req.grammar == grammar.tool_call_grammar(req.tools, name=None, parallel=False)
    assert req.grammar_triggers == () and not req.parallel_tool_calls
    req = gen(tools=[TOOL], tool_choice={"type": "function", "name": "add"})
    assert (req.tool_choice, req.tool_name) == ("function", "add")
    assert req.grammar == grammar.tool_call_grammar(req.tools, name="add", parallel=True)


def test_tool_choice_none_shows_tools_without_a_grammar():
    req = gen(tools=[TOOL], tool_choice="none")
    assert req.tool_choice == "none" and req.tools and req.grammar == ""


def test_text_formats_get_json_grammars():
    assert gen(text={"format": {"type": "json_object"}}).grammar == grammar.json_object_grammar()
    req = gen(text={"format": {"type": "json_schema", "name": "out", "schema": SCHEMA, "strict": True}})
    assert req.grammar == grammar.json_schema_grammar(SCHEMA, param="text.format.schema")
    assert gen(text={"format": {"type": "json_object"}}, tools=[TOOL], tool_choice="none").grammar


def test_what_a_grammar_cannot_serve_is_refused_naming_it():
    err = refused(text={"format": {"type": "json_schema", "name": "o", "schema": {"not": {"type": "string"}}}})
    assert err.param == "text.format.schema"
    bad_tool = dict(TOOL, parameters={"type": "object", "properties": {"a": {"not": {}}}})
    err = refused(tools=[bad_tool], tool_choice="required")
    assert err.param == "tools[0].parameters" and "tools[0].parameters" in err.message


def test_json_format_with_auto_tools_is_calls_or_the_json():
    req = gen(tools=[TOOL], text={"format": {"type": "json_schema", "name": "out", "schema": SCHEMA}})
    assert req.grammar_triggers == () and req.grammar.startswith("root ::= ( ")
    # with a forced call the answer is a call: the tools grammar alone
    req = gen(tools=[TOOL], tool_choice="required", text={"format": {"type": "json_object"}})
    assert req.grammar == grammar.tool_call_grammar(req.tools, name=None, parallel=True)


@pytest.fixture(scope="module")
def oracle(model_path):
    o = GrammarOracle(model_path)
    yield o
    o.close()


def test_the_merged_grammar_in_llama_cpp(oracle):
    """llama.cpp's own grammar engine: a call or the schema's JSON, nothing else."""
    schema = dict(SCHEMA, properties={"n": {"type": "integer"}, "add": {"type": "string"}})
    g = gen(tools=[TOOL], text={"format": {"type": "json_schema", "name": "out", "schema": schema}}).grammar
    assert oracle.parses(g)
    assert oracle.accepts(g, '<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>')
    assert oracle.accepts(g, '{"n": 3, "add": "x"}') and oracle.accepts(g, '{"n": 3}')
    for text in (
        'Sure! {"n": 3}',
        '{"a": 2}',
        '<tool_call>{"name": "add", "arguments": {"n": 2}}</tool_call>',
        '{"n": "3"}',
    ):
        assert not oracle.accepts(g, text), text
