"""The tool-call parser (hydra_node.grammar.toolcalls): blocks to calls, everything else to content,
the same whatever the chunking."""

from __future__ import annotations

import itertools
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydra_node.grammar.toolcalls import (
    ContentText,
    ParsedToolCall,
    ToolCallArguments,
    ToolCallParser,
    ToolCallStart,
    default_call_id,
)

NAMES = ("get_weather", "get_time")


def _ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def run(chunks, names=NAMES) -> tuple[list, ToolCallParser]:
    p = ToolCallParser(names, new_id=_ids())
    out = []
    for c in chunks:
        out += p.feed(c)
    return out + p.finish(), p


def content(items) -> str:
    return "".join(i.text for i in items if isinstance(i, ContentText))


def block(obj) -> str:
    return f"<tool_call>{json.dumps(obj, ensure_ascii=False)}</tool_call>"


def test_calls_and_content_come_out_in_order() -> None:
    text = (
        "Let me check.\n"
        + block({"name": "get_weather", "arguments": {"city": "Zürich", "n": [1, 2.5]}})
        + "\n"
        + block({"name": "get_time", "parameters": {}})
        + "\nDone."
    )
    items, p = run([text])
    assert items == [
        ContentText("Let me check.\n"),
        ParsedToolCall(0, "call_0", "get_weather", '{"city":"Zürich","n":[1,2.5]}'),
        ParsedToolCall(1, "call_1", "get_time", "{}"),
        ContentText("\nDone."),
    ]
    assert p.calls == [i for i in items if isinstance(i, ParsedToolCall)]
    p.calls.clear()  # a copy
    assert len(p.calls) == 2


def test_whitespace_between_and_around_calls_is_dropped_only_when_there_are_calls() -> None:
    call = block({"name": "get_time", "arguments": {}})
    items, _ = run(["\n  ", call, "\n\n", call, " \n"])
    assert [type(i) for i in items] == [ParsedToolCall, ParsedToolCall]
    items, _ = run(["\n  ", " \n"])
    assert items == [ContentText("\n   \n")]
    items, _ = run(["Hi ", call, " there "])
    assert content(items) == "Hi  there "


@pytest.mark.parametrize(
    "body",
    [
        '{"name": "get_time", "arguments": {}',  # bad JSON
        '{"name": "launch", "arguments": {}}',  # unknown function
        '{"name": "get_time", "arguments": "{}"}',  # arguments not an object
        '{"name": "get_time"}',  # no arguments
        '["get_time", {}]',
        '{"name": "get_time", "arguments": {"x": NaN}}',
        '{"name": "get_time", "arguments": {"x": "\\ud800"}}',  # a lone surrogate
        '',
    ],
)
def test_a_malformed_block_is_content_verbatim(body: str) -> None:
    text = f" before <tool_call>{body}</tool_call> after"
    items, p = run([text])
    assert items == [ContentText(text)] and p.calls == []
    items, p = run(["\n", f"<tool_call>{body}</tool_call>", "\n"])  # not whitespace between calls: kept
    assert content(items) == f"\n<tool_call>{body}</tool_call>\n" and p.calls == []


def test_a_restarted_call_is_parsed_from_the_last_open_tag() -> None:
    good = '{"name": "get_time", "arguments": {}}'
    items, p = run([f'<tool_call>{{"name": "get_t<tool_call>{good}</tool_call>'])
    assert items == [ContentText('<tool_call>{"name": "get_t'), ParsedToolCall(0, "call_0", "get_time", "{}")]


def test_an_unterminated_block_is_content_at_finish() -> None:
    p = ToolCallParser(NAMES)
    assert p.feed('ok <tool_call>{"name": "get_time", "arguments": {}}') == [ContentText("ok ")]
    assert p.finish() == [ContentText('<tool_call>{"name": "get_time", "arguments": {}}')]
    assert p.finish() == []
    with pytest.raises(RuntimeError):
        p.feed("more")


def test_a_partial_open_tag_is_held_back_until_the_next_chunk_decides() -> None:
    p = ToolCallParser(NAMES, new_id=_ids())
    assert p.feed("Hello <tool_c") == [ContentText("Hello ")]
    assert p.feed("ar") == [ContentText("<tool_car")]
    assert p.feed(" <") == [ContentText(" ")]
    assert p.feed('tool_call>{"name": "get_time", "arguments": {"a": 1}}</tool') == []
    assert p.feed("_call>") == [ParsedToolCall(0, "call_0", "get_time", '{"a":1}')]
    assert p.feed("<") == []
    assert p.finish() == [ContentText("<")]


def test_default_call_ids() -> None:
    ids = {default_call_id() for _ in range(50)}
    assert len(ids) == 50 and all(re.fullmatch(r"call_[A-Za-z0-9]{24}", i) for i in ids)
    _, p = run([block({"name": "get_time", "arguments": {}})])
    assert p.calls[0].id.startswith("call_")


# ---- property: any chunking gives the same calls and content ----------------------------------
_args = st.dictionaries(
    st.text(max_size=4),
    st.one_of(st.integers(), st.text(max_size=5), st.booleans(), st.none(), st.lists(st.integers(), max_size=2)),
    max_size=3,
)
_call = st.builds(
    lambda n, a, key: ("call", n, a, key), st.sampled_from(NAMES), _args, st.sampled_from(["arguments", "parameters"])
)
_prose = st.text(alphabet="ab </_\n", min_size=1, max_size=12).filter(lambda t: "<" not in t and not t.isspace())
_bad = st.sampled_from(
    [
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
        "<tool_call>{</tool_call>",
        "</tool_call>",
        "<tool_call",
        "<tool_",
    ]
)
_ws = st.text(alphabet=" \n", max_size=3)
_parts = st.lists(st.one_of(_call, st.tuples(st.just("prose"), _prose), st.tuples(st.just("bad"), _bad)), max_size=6)


def _render(parts, seps) -> tuple[str, list[tuple[str, str]], str]:
    """The stream text, the calls it holds and the content the rules give, from the parts."""
    text, calls, segments, seg = "", [], [], ""
    for part, sep in zip(parts, seps):
        if part[0] == "call":
            _, name, args, key = part
            text += block({"name": name, key: args})
            calls.append((name, json.dumps(args, ensure_ascii=False, separators=(",", ":"))))
            segments.append(seg)
            seg = ""
        else:
            text += part[1]
            seg += part[1]
        text += sep
        seg += sep
    segments.append(seg)
    kept = [s for s in segments if not (calls and s.isspace())]
    return text, calls, "".join(kept)


def _split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)])]


@settings(max_examples=300, deadline=None)
@given(parts=_parts, seps=st.lists(_ws, min_size=6, max_size=6), cuts=st.lists(st.integers(0, 10**6), max_size=12))
def test_any_chunking_gives_the_calls_and_content_the_rules_say(parts, seps, cuts) -> None:
    text, calls, expected_content = _render(parts, seps)
    items, p = run(_split(text, cuts))
    assert [(c.name, c.arguments) for c in p.calls] == calls
    assert [c.index for c in p.calls] == list(range(len(calls)))
    assert content(items) == expected_content
    whole, _ = run([text])
    assert [i for i in items if isinstance(i, ParsedToolCall)] == [i for i in whole if isinstance(i, ParsedToolCall)]


_PIECES = [
    "<tool_call>",
    "</tool_call>",
    "<tool_c",
    "{",
    "}",
    '"name"',
    ":",
    '"get_time"',
    ",",
    '"arguments"',
    "{}",
    " ",
    "\n",
    "x",
    "<",
]


@settings(max_examples=300, deadline=None)
@given(
    text=st.lists(st.sampled_from(_PIECES), max_size=25).map("".join), cuts=st.lists(st.integers(0, 10**6), max_size=12)
)
def test_any_text_any_chunking_loses_nothing(text: str, cuts) -> None:
    items, p = run(_split(text, cuts))
    whole, pw = run([text])
    assert [(c.name, c.arguments) for c in p.calls] == [(c.name, c.arguments) for c in pw.calls]
    assert content(items) == content(whole)
    if not p.calls:
        assert content(items) == text  # nothing is ever lost


# ---- streamed calls (the request carried the tool-call grammar) ---------------------------------
# the grammar's whitespace between JSON tokens: none, one space, or a newline and up to 8 spaces
_gws = st.sampled_from(["", " ", "\n", "\n  ", "\n        "])
_json = st.recursive(
    st.one_of(
        st.integers(),
        st.text(alphabet='ab"\\}{]<>/ é\n', max_size=6),
        st.booleans(),
        st.none(),
        st.floats(allow_nan=False, allow_infinity=False),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(alphabet="xy}\"", max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)
_obj = st.dictionaries(st.text(alphabet="abc{<", max_size=4), _json, max_size=3)


@st.composite
def _streamed_block(draw) -> tuple[str, str, str]:
    """A block as the grammar lets the model write it: (text, name, the arguments text as written)."""
    name = draw(st.sampled_from(NAMES))
    indent = draw(st.sampled_from([None, 2]))
    args = json.dumps(
        draw(_obj),
        ensure_ascii=draw(st.booleans()),
        indent=indent,
        separators=draw(st.sampled_from([(",", ":"), (", ", ": ")])),
    )
    w = [draw(_gws) for _ in range(10)]
    text = (
        f'<tool_call>{w[0]}{{{w[1]}"name"{w[2]}:{w[3]}"{name}"{w[4]},{w[5]}"arguments"{w[6]}:{w[7]}{args}'
        f'{w[8]}}}{w[9]}</tool_call>'
    )
    return text, name, args


def run_streamed(chunks, constrained="whole"):
    p = ToolCallParser(NAMES, new_id=_ids(), constrained=constrained)
    out = []
    for c in chunks:
        out += p.feed(c)
    return out + p.finish(), p


def fragments(items, index: int) -> str:
    return "".join(i.text for i in items if isinstance(i, ToolCallArguments) and i.index == index)


@settings(max_examples=300, deadline=None)
@given(
    blocks=st.lists(_streamed_block(), min_size=1, max_size=3),
    prose=st.sampled_from(["", "Let me check. "]),
    cuts=st.lists(st.integers(0, 10**6), max_size=16),
)
def test_streamed_calls_any_chunking_gives_the_arguments_as_written(blocks, prose, cuts) -> None:
    text = prose + "".join(b[0] for b in blocks)
    items, p = run_streamed(_split(text, cuts), "lazy" if prose else "whole")
    assert content(items) == prose
    assert [(c.name, c.streamed, c.complete) for c in p.calls] == [(b[1], True, True) for b in blocks]
    for k, (_, name, args) in enumerate(blocks):
        assert fragments(items, k) == args  # exactly what the model wrote, nothing held back or added
        assert json.loads(p.calls[k].arguments) == json.loads(args)
        assert p.calls[k].arguments == json.dumps(json.loads(args), ensure_ascii=False, separators=(",", ":"))
        mine = [i for i in items if getattr(i, "index", None) == k and not isinstance(i, ContentText)]
        assert mine[0] == ToolCallStart(k, f"call_{k}", name) and mine[-1] == p.calls[k]
        assert all(isinstance(i, ToolCallArguments) for i in mine[1:-1])
    whole, _ = run_streamed([text], "lazy" if prose else "whole")
    assert [i for i in whole if isinstance(i, ParsedToolCall)] == p.calls


@settings(max_examples=300, deadline=None)
@given(block=_streamed_block(), cut=st.integers(0, 10**6), cuts=st.lists(st.integers(0, 10**6), max_size=8))
def test_a_streamed_call_cut_anywhere_loses_nothing_and_duplicates_nothing(block, cut, cuts) -> None:
    text, name, args = block
    head = text[: cut % (len(text) + 1)]
    items, p = run_streamed(_split(head, cuts))
    starts = [i for i in items if isinstance(i, ToolCallStart)]
    if not starts:  # cut before the name was complete: the text comes back as content
        assert content(items) == head and p.calls == []
        return
    assert content(items) == ""  # nothing streamed as arguments comes back as content
    (call,) = p.calls
    sent = fragments(items, 0)
    assert args.startswith(sent) and call.name == name and call.streamed
    assert call.complete == (sent == args)
    assert call.arguments == (
        json.dumps(json.loads(args), ensure_ascii=False, separators=(",", ":")) if call.complete else sent
    )


def test_streamed_fragments_come_as_they_are_fed() -> None:
    p = ToolCallParser(NAMES, new_id=_ids(), constrained="whole")
    assert p.feed('<tool_call>\n{"name": "get_wea') == []
    assert p.feed('ther", "argu') == [ToolCallStart(0, "call_0", "get_weather")]
    assert p.feed('ments": {"city": "Pa') == [ToolCallArguments(0, '{"city": "Pa')]
    assert p.feed('ris"}') == [ToolCallArguments(0, 'ris"}')]
    assert p.feed("}\n</tool_") == []
    assert p.feed("call>") == [ParsedToolCall(0, "call_0", "get_weather", '{"city":"Paris"}', streamed=True)]
    assert p.finish() == []


def test_only_blocks_the_grammar_constrains_stream() -> None:
    call = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    # whole: a block after text (a JSON string's content on /v1/responses) is read whole
    items, _ = run_streamed(["x " + call])
    assert [type(i) for i in items] == [ContentText, ParsedToolCall] and not items[1].streamed
    # lazy: the first block streams, and one directly after it; after text, whole again
    items, p = run_streamed(["Hi " + call + call + " so " + call], "lazy")
    assert [c.streamed for c in p.calls] == [True, True, False]
    # no grammar: never
    items, p = run_streamed([call], None)
    assert [type(i) for i in items] == [ParsedToolCall] and not p.calls[0].streamed


def test_a_block_off_the_shape_before_its_name_is_read_whole() -> None:
    items, p = run_streamed(['<tool_call>{"name": "nope", "arguments": {}}</tool_call>'])
    assert items == [ContentText('<tool_call>{"name": "nope", "arguments": {}}</tool_call>')] and not p.calls
    items, p = run_streamed(['<tool_call>{"parameters": {}, "name": "get_time"}</tool_call>'])
    assert p.calls == [ParsedToolCall(0, "call_0", "get_time", "{}")]  # not streamed: parsed whole
