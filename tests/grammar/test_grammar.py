"""JSON Schema / tool-call grammars (hydra_node.grammar.constraints): refusals, and llama.cpp's own
grammar engine as the judge of what they accept (the bundled model's vocabulary; live)."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grammar_oracle import GrammarOracle, validate
from hydra_node.grammar.constraints import (
    TOOL_CALL_TRIGGER,
    json_object_grammar,
    json_schema_grammar,
    tool_call_grammar,
)
from hydra_node.grammar.toolcalls import ToolCallParser
from hydra_node.inference import InvalidRequest, ToolSpec

P = "response_format.json_schema.schema"

PERSON = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "age"],
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": ["string", "null"], "format": "date"},
        "tags": {"type": "array", "items": {"enum": ["a", "b", 3]}, "maxItems": 3},
        "score": {"type": "number", "exclusiveMinimum": 0, "maximum": 10},
    },
}
TREE = {
    "$defs": {
        "node": {
            "type": "object",
            "required": ["v", "kids"],
            "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        }
    },
    "$ref": "#/$defs/node",
}
SCHEMAS = [
    PERSON,
    TREE,
    {},
    True,
    {"type": "boolean"},
    {"type": "null"},
    {"const": {"a": [1, "x"]}},
    {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"},
    {"type": "string", "format": "uuid"},
    {"type": "string", "format": "date-time"},
    {"type": "string", "format": "time"},
    {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "minItems": 2},
    {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 2},
    {"anyOf": [{"type": "integer", "maximum": -5}, {"type": "string", "maxLength": 2}]},
    {
        "oneOf": [
            {"type": "object", "properties": {"k": {"const": "a"}}, "required": ["k"]},
            {"type": "object", "properties": {"k": {"const": "b"}, "n": {"type": "integer"}}, "required": ["k"]},
        ]
    },
    {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {"properties": {"b": {"type": "boolean"}}},
        ]
    },
    {"type": "object", "additionalProperties": {"type": "integer"}},
    {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}},
    {"type": "object", "properties": {"o": {"type": "string"}, "r": {"type": "string"}}, "required": ["r"]},
    # llama.cpp's repetition limits: large bounds are capped below them, nested ones counted
    {"type": "string", "minLength": 999, "maxLength": 5000},
    {"$defs": {"a": {"type": "array", "items": {"$ref": "#/$defs/a"}, "maxItems": 5000}}, "$ref": "#/$defs/a"},
    {"type": "string", "pattern": "^((ab|c){0,600}x){1,3}$"},
    {"type": "string", "pattern": "^(ab){2,999}$"},
]
# schema, JSON texts it must accept, JSON texts it must refuse
CASES = [
    (
        PERSON,
        [
            '{"name": "Ann", "age": 150}',
            '{"name":"B","age":0,"email":null,"tags":["a",3],"score":0.05}',
            '{\n  "name": "\\u00e9\\"x",\n  "age": 7,\n  "email": "2024-02-01",\n  "score": 10\n}',
        ],
        [
            '{"name": "Ann", "age": 151}',
            '{"name": "", "age": 1}',
            '{"age": 1, "nam": "x"}',
            '{"name": "A"}',
            '{"name": "A", "age": 1, "x": 1}',
            '{"name": "A", "age": -1}',
            '{"name": "A", "age": 1, "score": 0}',
            '{"name": "A", "age": 1, "score": 10.5}',
            '{"name": "A", "age": 1, "tags": ["c"]}',
            '{"name": "A", "age": 1, "tags": ["a","a","a","a"]}',
            '{"name": "A\nB", "age": 1}',
            '{"name": "A", "age": 01}',
            '{"name": "A",    "age": 1}',
            '{"name": "A", "age": 1}\n\n\n',
        ],
    ),
    (TREE, ['{"v": 1, "kids": [{"v": -2, "kids": []}]}'], ['{"v": 1, "kids": [{"v": 2}]}', '{"v": 1.5, "kids": []}']),
    ({"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"}, ['"AB-123"'], ['"AB-12"', '"ab-123"', '"AB-1234"']),
    (
        {"type": "string", "pattern": "^(?<y>\\d)\\u00e9$"},
        ['"5é"'],
        ['"a\\u00e9"', '"5e"', '"5\\u00e9"'],
    ),  # (escapes are not generated)
    (
        {"type": "string", "format": "date-time"},
        ['"2024-01-31T23:59:00Z"', '"2024-01-31T00:00:00.5+02:00"'],
        ['"2024-13-01T00:00:00Z"', '"2024-01-01"'],
    ),
    (
        {"anyOf": [{"type": "integer", "maximum": -5}, {"type": "string", "maxLength": 2}]},
        ['-5', '-123', '"ab"'],
        ['-4', '5', '"abc"', 'null'],
    ),
    (
        {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "minItems": 2},
        ['[1, "x"]'],
        ['[1]', '["x", 1]', '[1, "x", 2]'],
    ),
    (
        {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}},
        ['{}', '{"y": 1}', '{"x": 1, "y": 2}'],
        ['{"y": 1, "x": 2}', '{"x": 1,}', '{,"y": 1}'],
    ),
    (
        {"type": "string", "format": "email"},
        ['"ann.b+x@mail.example.com"', '"a@b.cd"'],
        ['"ann@"', '"a b@c.de"', '"@x.com"', '"a@b"', '"a@-b.com"'],
    ),
    (
        {"type": "string", "format": "uri", "minLength": 1, "maxLength": 2083},  # pydantic's HttpUrl
        ['"https://example.com/a/b?q=1&r=%20"', '"ftp://x"'],
        ['"example.com"', '"http://exa mple.com"', '"http://"'],
    ),
    ({"type": "string", "format": "ipv4"}, ['"192.168.0.255"', '"0.0.0.0"'], ['"256.1.1.1"', '"1.2.3"', '"01.1.1.1"']),
    ({"type": "string", "format": "hostname"}, ['"a-b.example.org"'], ['"-a.org"', '"a..b"', '"a_b.org"']),
    ({"type": "integer", "format": "int32", "minimum": -5}, ['2147483647', '-5'], ['2147483648', '-6']),
    ({"type": "number", "format": "double"}, ['1.5e99'], ['1e100', '1e999']),
    (
        {"type": "number", "minimum": -2.5, "exclusiveMaximum": 3},
        ['-2', '0', '2.999', '3'.replace("3", "2")],
        ['-3', '3', '3.0', '1e2'],
    ),
]


def _refused(schema: object) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        json_schema_grammar(schema, param=P)
    assert info.value.param == P
    assert info.value.message.startswith(P + ": ")
    return info.value


def test_an_unsupported_keyword_is_named_with_its_pointer() -> None:
    exc = _refused({"type": "object", "properties": {"x": {"not": {"type": "string"}}}})
    assert exc.message == f"{P}: 'not' at #/properties/x is not supported"
    exc = _refused({"type": "object", "properties": {"a/b": {"type": "array", "items": {"uniqueItems": True}}}})
    assert exc.message == f"{P}: 'uniqueItems' at #/properties/a~1b/items is not supported"


@pytest.mark.parametrize(
    "schema, fragment",
    [
        ({"$ref": "https://example.com/s.json"}, "'$ref' to 'https://example.com/s.json'"),
        ({"$ref": "#/$defs/missing"}, "points to nothing"),
        ({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, "refers back to itself"),
        ({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}, "$ref": "#/$defs/a"}, "refers back"),
        ({"type": "string", "format": "ipv6"}, "'format' 'ipv6'"),
        ({"type": "string", "format": "uri", "maxLength": 100}, "'maxLength' below"),
        ({"type": "string", "format": "date", "minLength": 11}, "'minLength' above 10"),
        ({"type": "number", "format": "int32"}, "'format' 'int32' on type number"),
        ({"type": "integer", "format": "date"}, "'format' 'date' on type integer"),
        ({"type": "string", "pattern": "^(?=a)b$"}, "lookarounds"),
        ({"type": "string", "pattern": "(a)\\1"}, "'\\1' is not supported"),
        ({"type": "string", "pattern": "a^b"}, "'^' is only supported"),
        ({"type": "string", "pattern": "^a", "maxLength": 3}, "'pattern' together with 'maxLength'"),
        ({"type": "string", "pattern": "^((ab|c){0,999}x){1,3}$"}, "nested too deep for llama.cpp"),
        ({"type": "string", "pattern": "(.*.*.*.*.*.*.*.*)"}, "unbounded repetitions side by side"),
        ({"type": "string", "pattern": "^\\w*\\s*.*\\d+x?.+$"}, "unbounded repetitions side by side"),
        ({"type": "string", "pattern": "(a|b*)*"}, "can match the empty string"),
        ({"type": "string", "pattern": "(a?b?){2}"}, "can match the empty string"),
        ({"type": "string", "pattern": "((a|)b?)+"}, "can match the empty string"),
        ({"type": "string", "pattern": "((a{999}){999}){2}"}, "larger than 20000 grammar elements"),
        ({"type": "string", "pattern": "(a{100}){300}"}, "larger than 20000 grammar elements"),
        ({"type": "string", "pattern": "^(" + "|".join(["[a-z]"] * 65) + ")*$"}, "a repetition of 65 alternatives"),
        ({"type": "string", "pattern": "(" + "|".join(["(x|y)"] * 33) + "){2}"}, "a repetition of 66 alternatives"),
        (
            {"type": "string", "pattern": "((" + "|".join("abcdefghij") + ")z|(" + "|".join("k" * 56) + "))+"},
            "of 66 alt",
        ),
        ({"type": "string", "minimum": 3}, "'minimum' on type string"),
        ({"type": "integer", "multipleOf": 3}, "'multipleOf' at #"),
        ({"type": "object", "patternProperties": {}}, "'patternProperties'"),
        ({"if": {}, "then": {}}, "'if'"),
        ({"anyOf": [{"type": "string"}], "type": "string"}, "'anyOf' next to 'type'"),
        ({"$ref": "#", "type": "string"}, "'$ref' next to 'type'"),
        ({"allOf": [{"type": "string"}, {"maxLength": 3}]}, "'allOf' merging"),
        ({"type": "integer", "minimum": 5, "maximum": 4}, "no integer"),
        ({"type": "integer", "exclusiveMinimum": True}, "boolean 'exclusiveMinimum'"),
        ({"type": "array", "minItems": 5000}, "'minItems' above"),
        ({"type": "object", "required": ["x"], "additionalProperties": False}, "required property 'x'"),
        ({"enum": []}, "non-empty"),
        ({"type": "string", "enum": [1, 2]}, "no value of 'enum'"),
        ({"enum": ["a"], "maxLength": 3}, "'enum' next to 'maxLength'"),
        ({"type": "strnig"}, "'type' must be one of"),
        ({"type": "object", "properties": {"x": False}, "required": ["x"]}, "can never be satisfied"),
        ({"type": "object", "properties": {"x": 5}}, "must be an object or a boolean"),
        ([], "must be a JSON schema"),
    ],
)
def test_unsupported_or_unsatisfiable_schemas_are_refused(schema: object, fragment: str) -> None:
    assert fragment in _refused(schema).message


def test_a_refused_pattern_is_named_in_the_message() -> None:
    message = _refused({"type": "string", "pattern": "(.*.*.*.*.*.*.*.*)"}).message
    assert "pattern '(.*.*.*.*.*.*.*.*)'" in message and "at #/pattern" in message


# Repetitions of sub-patterns that match the empty string freeze llama.cpp's grammar engine (every
# copy can take every character): they are rewritten to one repetition that matches the same.
REWRITES = [
    ("^(x?){999}$", "^x{0,999}$"),
    ("((x?){30}){30}", "x{0,900}"),
    ("^(x?){9}$", "^x{0,9}$"),
    ("((x?){3}){3}", "x{0,9}"),
    ("(a*)*", "a*"),
    ("(|a)+", "a*"),
    ("^(?:(a?)?)*b$", "^a*b$"),
    ("(ab|){3}c", "(ab){0,3}c"),
    ("((a*){2}|)*", "a*"),
    ("(a{0,2}){0,3}b", "a{0,6}b"),
    ("(a*){0}b", "b"),
]


@pytest.mark.parametrize("pattern, same", REWRITES)
def test_repeated_nullable_sub_patterns_are_rewritten_to_one_repetition(pattern: str, same: str) -> None:
    g = json_schema_grammar({"type": "string", "pattern": pattern}, param=P)
    assert g == json_schema_grammar({"type": "string", "pattern": same}, param=P)
    if "{999}" in pattern or "{30}" in pattern:
        return  # Python's own regex engine backtracks for ever on these: the small ones stand in
    for n in range(12):  # the rewrite is exact: the same full matches
        for text in ("x" * n, "a" * n, "a" * n + "b", "ab" * (n % 5) + "c", "y", "x" * n + "y"):
            bare = (p.removeprefix("^").removesuffix("$") for p in (pattern, same))
            assert bool(re.fullmatch(next(bare), text)) == bool(re.fullmatch(next(bare), text)), (pattern, text)


def test_wide_alternations_are_refused_only_when_repeated() -> None:
    wide = "|".join(["[a-z]"] * 64)
    json_schema_grammar({"type": "string", "pattern": f"^({wide})*$"}, param=P)  # at the bound
    json_schema_grammar({"type": "string", "pattern": "^(" + "|".join(["[a-z]"] * 300) + ")$"}, param=P)  # once
    message = _refused({"type": "string", "pattern": f"^({wide}|x)+$"}).message
    assert "a repetition of 65 alternatives" in message and "character class" in message


def test_a_schema_whose_grammar_is_too_large_is_refused() -> None:
    assert "larger than" in _refused({"enum": ["x" * 1000 + str(i) for i in range(300)]}).message


def test_tool_call_grammar_refusals_name_the_parameter() -> None:
    tools = [
        ToolSpec("f", "", '{"type": "object"}'),
        ToolSpec("g", "", '{"type": "string"}'),
        ToolSpec("h", "", '{"type": "object", "properties": {"x": {"not": {}}}}'),
        ToolSpec("i", "", "{oops"),
    ]
    with pytest.raises(InvalidRequest) as info:
        tool_call_grammar(tools, name="nope", parallel=False)
    assert info.value.param == "tool_choice"
    for name, index, fragment in (
        ("g", 1, "must be an object schema"),
        ("h", 2, "'not' at #/properties/x"),
        ("i", 3, "not valid JSON"),
    ):
        with pytest.raises(InvalidRequest) as info:
            tool_call_grammar(tools, name=name, parallel=False)
        assert info.value.param == f"tools[{index}].function.parameters"
        assert fragment in info.value.message
    with pytest.raises(InvalidRequest):
        tool_call_grammar(tools, name=None, parallel=True)  # every offered tool is checked
    with pytest.raises(InvalidRequest):
        tool_call_grammar([], name=None, parallel=True)
    assert tool_call_grammar(tools, name="f", parallel=False).startswith("root ::= ")


# ---- llama.cpp as the judge (live: the bundled model's vocabulary) ---------------------------
@pytest.fixture(scope="module")
def oracle(model_path):
    o = GrammarOracle(model_path)
    yield o
    o.close()


WEATHER = ToolSpec(
    "get_weather",
    "Weather in a city",
    json.dumps(
        {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        }
    ),
)
CLOCK = ToolSpec("get_time", "", '{"type": "object", "properties": {}, "additionalProperties": false}')


def test_every_kind_of_grammar_is_accepted_by_llama_cpp(oracle) -> None:
    grammars = [
        json_object_grammar(),
        *(json_schema_grammar(s, param=P) for s in SCHEMAS),
        *(tool_call_grammar([WEATHER, CLOCK], name=n, parallel=p) for n in (None, "get_time") for p in (False, True)),
    ]
    for g in grammars:
        assert g.startswith("root ::= ")
        assert oracle.parses(g), g


@pytest.mark.parametrize("case", range(len(CASES)))
def test_schema_grammars_accept_valid_and_refuse_invalid_json(oracle, case: int) -> None:
    schema, good, bad = CASES[case]
    g = json_schema_grammar(schema, param=P)
    for text in good:
        assert validate(json.loads(text), schema), text  # the case itself is right
        assert oracle.accepts(g, text), text
    for text in bad:
        assert not oracle.accepts(g, text), text


def test_json_object_grammar(oracle) -> None:
    g = json_object_grammar()
    for text in ('{}', '{"a": [1, -2.5e3, "x", null, true, {"b": {}}]}'):
        assert oracle.accepts(g, text)
    for text in ('[]', '"x"', '{"a": NaN}', '{"a": 1', '{"a": "\t"}', '{"a": "\\ud800"}', '{"a" : 1}  '):
        assert not oracle.accepts(g, text), text


def test_tool_call_grammar_accepts_exactly_calls_of_the_offered_functions(oracle) -> None:
    one = tool_call_grammar([WEATHER, CLOCK], name=None, parallel=False)
    many = tool_call_grammar([WEATHER, CLOCK], name=None, parallel=True)
    forced = tool_call_grammar([WEATHER, CLOCK], name="get_time", parallel=True)
    w = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}</tool_call>'
    t = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    assert oracle.accepts(one, w) and oracle.accepts(one, t) and not oracle.accepts(one, w + "\n" + t)
    assert oracle.accepts(many, w + t + w) and not oracle.accepts(many, w + "\n" + t)  # back to back
    assert oracle.accepts(forced, t) and not oracle.accepts(forced, w)
    assert not oracle.accepts(forced, t + t)  # a named choice is exactly one call, parallel or not
    assert TOOL_CALL_TRIGGER == "<tool_call>" and not oracle.accepts(one, "Sure! " + w)
    for bad in (
        '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>',  # city is required
        '<tool_call>{"name": "get_weather", "arguments": {"city": "P", "unit": "K"}}</tool_call>',
        '<tool_call>{"name": "other", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "get_time", "arguments": {"x": 1}}</tool_call>',
        '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>\n',
    ):
        assert not oracle.accepts(many, bad), bad


_maybe_int = st.one_of(st.none(), st.integers(-(10**6), 10**6), st.integers(-(10**18), 10**18))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lo=_maybe_int,
    hi=_maybe_int,
    n=st.one_of(st.integers(-(10**6), 10**6), st.integers(-(10**17), 10**17)),
    data=st.data(),
)
def test_integer_ranges_are_exact(oracle, lo, hi, n, data) -> None:
    if lo is not None and hi is not None and lo > hi:
        lo, hi = hi, lo
    if data.draw(st.booleans()) and lo is not None:
        n = data.draw(st.integers(lo - 2, lo + 2))
    elif hi is not None:
        n = data.draw(st.one_of(st.just(n), st.integers(hi - 2, hi + 2)))
    schema = {
        "type": "integer",
        **({"minimum": lo} if lo is not None else {}),
        **({"maximum": hi} if hi is not None else {}),
    }
    inside = (lo is None or lo <= n) and (hi is None or n <= hi)
    accepted = oracle.accepts(json_schema_grammar(schema, param=P), str(n))
    assert inside or not accepted, (schema, n)  # sound: nothing out of range
    assert accepted or not inside or len(str(abs(n))) > 16, (schema, n)  # complete up to 16 digits


PATTERNS = [
    "^a(b|cd)*e?$",
    "[a-c]{2,3}x",
    "^(?:ab|a)+[^ab]$",
    "^\\d+(\\.\\d{1,2})?$",
    "^\\w*-\\s?$",
    "^[^a-z]{0,2}$",
    "x|y|",
    "^(a|)b.c$",
    "^[\\w.-]+@x\\.AZ$",
    "^\\D\\S\\W?$",
    "^(?P<y>\\d{2})[-/]\\d$",
    "^[^\\d\\s]{1,3}$",
    "^(?:a{2}|b{1,2}?)*c+?$",
    "^(a?){3}(|b)+(c*)*$",
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pattern=st.sampled_from(PATTERNS), text=st.text(alphabet="abcdexyAZ09.- _", max_size=7))
def test_patterns_generate_exactly_the_full_matches(oracle, pattern: str, text: str) -> None:
    g = json_schema_grammar({"type": "string", "pattern": pattern}, param=P)
    bare = pattern.removeprefix("^").removesuffix("$")
    assert oracle.accepts(g, json.dumps(text)) == bool(re.fullmatch(bare, text)), (pattern, text)


def test_patterns_write_json_escapes_for_literal_quotes_and_controls(oracle) -> None:
    g = json_schema_grammar({"type": "string", "pattern": '^a"\\\\\\n[^x]$'}, param=P)
    assert oracle.accepts(g, json.dumps('a"\\\nb'))
    assert not oracle.accepts(g, json.dumps('a"\\\n"'))  # a class never yields a raw '"'


# ---- the real model, greedy, constrained by the grammars -------------------------------------
@pytest.fixture(scope="module")
def llm(model_path):
    from llama_cpp import Llama

    model = Llama(model_path=str(model_path), n_ctx=2048, verbose=False, seed=1)
    yield model
    model.close()


def _complete(llm, prompt: str, gbnf: str, max_tokens: int = 200) -> str:
    from llama_cpp import LlamaGrammar

    chat = f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
    out = llm.create_completion(chat, grammar=LlamaGrammar.from_string(gbnf), temperature=0.0, max_tokens=max_tokens)
    assert out["choices"][0]["finish_reason"] == "stop", out
    return out["choices"][0]["text"]


@pytest.mark.parametrize(
    "schema",
    [
        PERSON,
        {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 9}, "minItems": 2, "maxItems": 4},
        {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"},
        {"type": "object"},
        {
            "type": "object",
            "required": ["email", "site", "born"],
            "properties": {
                "email": {"type": "string", "format": "email"},
                "site": {"type": "string", "format": "uri"},
                "born": {"type": "string", "format": "date"},
            },
        },
    ],
)
def test_the_model_generates_json_that_validates(llm, schema) -> None:
    if schema == {"type": "object"}:  # any object: a prompt the small model answers briefly
        gbnf, prompt = json_object_grammar(), 'What is 2+2? Answer as a JSON object with the key "answer".'
    else:
        gbnf, prompt = json_schema_grammar(schema, param=P), "Describe a person called Ann as JSON."
    text = _complete(llm, prompt, gbnf)
    assert validate(json.loads(text), schema), text


@pytest.mark.parametrize("name, parallel", [("get_weather", False), (None, True)])
def test_the_model_makes_a_tool_call_that_parses(llm, name, parallel) -> None:
    gbnf = tool_call_grammar([WEATHER, CLOCK], name=name, parallel=parallel)
    text = _complete(llm, "What is the weather in Paris? Call a tool.", gbnf)  # and it stops
    parser = ToolCallParser(["get_weather", "get_time"])
    items = parser.feed(text) + parser.finish()
    assert [type(i).__name__ for i in items] == ["ParsedToolCall"], text
    call = parser.calls[0]
    assert call.name == "get_weather"
    assert validate(json.loads(call.arguments), json.loads(WEATHER.parameters)), call.arguments


def test_pydantic_and_openai_strict_schemas_work(oracle) -> None:
    from typing import Literal, Optional, Union

    from openai.lib._pydantic import to_strict_json_schema
    from pydantic import BaseModel, Field

    class Cat(BaseModel):
        kind: Literal["cat"]
        lives: int = Field(ge=0, le=9)

    class Dog(BaseModel):
        kind: Literal["dog"]
        good: bool

    class Person(BaseModel):
        name: str = Field(max_length=20, description="the name")
        nick: Optional[str] = None
        friends: list["Person"] = []
        pet: Union[Cat, Dog] = Field(discriminator="kind")
        score: float = Field(gt=0, lt=1)

    ann = Person(
        name="Ann",
        nick=None,
        friends=[Person(name="Bo", pet=Dog(kind="dog", good=True), score=0.25)],
        pet=Cat(kind="cat", lives=9),
        score=0.5,
    )
    for schema in (Person.model_json_schema(), to_strict_json_schema(Person)):
        g = json_schema_grammar(schema, param=P)
        for text in (ann.model_dump_json(), ann.model_dump_json(indent=2)):
            assert validate(json.loads(text), schema)
            assert oracle.accepts(g, text), text
        bad = ann.model_copy(update={"pet": Cat.model_construct(kind="cat", lives=10)})
        assert not oracle.accepts(g, bad.model_dump_json())


# ---- property: random schemas of the subset, their instances and mutants ----------------------
_names = st.sampled_from(["a", "b", "c", "d"])
_leaf = st.one_of(
    st.builds(
        lambda lo, span: {
            "type": "integer",
            **({"minimum": lo} if lo is not None else {}),
            **({"maximum": lo + span} if lo is not None and span is not None else {}),
        },
        st.one_of(st.none(), st.integers(-50, 50)),
        st.one_of(st.none(), st.integers(0, 120)),
    ),
    st.builds(
        lambda lo, span: {"type": "string", "minLength": lo, "maxLength": lo + span},
        st.integers(0, 3),
        st.integers(0, 4),
    ),
    st.builds(
        lambda vals: {"enum": vals},
        st.lists(
            st.one_of(st.integers(-3, 3), st.sampled_from(["x", "y"]), st.booleans(), st.none()), min_size=1, max_size=3
        ),
    ),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.just({"type": "number"}),
)
_schemas = st.recursive(
    _leaf,
    lambda inner: st.one_of(
        st.builds(
            lambda props, req: {
                "type": "object",
                "properties": props,
                "required": [k for k in props if k in req],
                "additionalProperties": False,
            },
            st.dictionaries(_names, inner, max_size=3),
            st.sets(_names),
        ),
        st.builds(
            lambda item, lo, span: {"type": "array", "items": item, "minItems": lo, "maxItems": lo + span},
            inner,
            st.integers(0, 2),
            st.integers(0, 2),
        ),
        st.builds(lambda alts: {"anyOf": alts}, st.lists(inner, min_size=1, max_size=3)),
    ),
    max_leaves=6,
)


@st.composite
def _instance(draw, s):
    """A value of ``s`` in the form the grammar writes (declared property order, no extras)."""
    if "anyOf" in s:
        return draw(_instance(draw(st.sampled_from(s["anyOf"]))))
    if "enum" in s:
        return draw(st.sampled_from(s["enum"]))
    t = s["type"]
    if t == "integer":
        return draw(st.integers(s.get("minimum", -(10**6)), s.get("maximum", 10**6)))
    if t == "string":
        return draw(st.text(alphabet="abé\"\\\n ", min_size=s["minLength"], max_size=s["maxLength"]))
    if t == "number":
        return draw(st.floats(-1e6, 1e6).filter(lambda f: f == 0 or abs(f) > 1e-99))
    if t == "object":
        return {
            k: draw(_instance(sub)) for k, sub in s["properties"].items() if k in s["required"] or draw(st.booleans())
        }
    if t == "array":
        return [draw(_instance(s["items"])) for _ in range(draw(st.integers(s["minItems"], s["maxItems"])))]
    return {"boolean": draw(st.booleans()), "null": None}[t]


def _mutants(text: str) -> list[str]:
    out = [
        text[:-1],
        text + "0",
        text.replace("1", "9", 1),
        text.replace('"', "", 1),
        text.replace("]", ",1]", 1),
        text.replace("}", ',"z":1}', 1),
        text.replace("true", "1", 1),
        text.replace("null", "0", 1),
        text.replace('"a"', '"e"', 1),
        text.replace(", ", ",,", 1),
        text.replace("-", "", 1),
    ]
    return [m for m in dict.fromkeys(out) if m != text]


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(data=st.data(), schema=_schemas)
def test_random_schemas_accept_their_instances_and_only_valid_mutants(oracle, data, schema) -> None:
    g = json_schema_grammar(schema, param=P)
    value = data.draw(_instance(schema))
    text = json.dumps(value, ensure_ascii=False)
    assert validate(value, schema)
    assert oracle.accepts(g, text), (schema, text)  # complete on the form it writes
    for m in _mutants(text):
        if oracle.accepts(g, m):  # sound: whatever it accepts validates
            assert validate(json.loads(m), schema), (schema, m)
